//! A service's backends: the local processes its processes connect to
//! (nginx to php-fpm over a unix socket, a proxy to its application server
//! on 127.0.0.1), whose CPU time is the service's own work. A class is busy
//! when its CPUs are full mostly with its service's own work
//! (`policy::late::busy`); without its backends, a PHP site under a flood
//! of real connections reads php-fpm's time as a neighbour's, and is
//! never busy.
//!
//! A backend is the holder of a listener a service's socket is connected
//! to: of a unix listener, the listener whose name the connection's other
//! end carries (an accepted unix socket carries its listener's name, the
//! end that connected has none, unless it bound one: then it is not
//! followed); of a TCP listener on loopback (127.0.0.0/8, ::1), the one on
//! the port the service's socket connected to, from a port in the
//! ephemeral range. The listener's holders are the backend's processes (a
//! php-fpm pool's master and workers all hold it), found once by a /proc
//! scan of every process's descriptors (`SocketOwners`: again only when a
//! new listener shows), not by the accepted end, which lives one request
//! where the backend's connections are per request (nginx's default
//! `fastcgi_pass`).
//!
//! Only connections the service made count: the processes that connected
//! *to* it (a local client, a load generator a local user runs) are not
//! its work, and counting them would let one local user make another's
//! service busy. A service's connections to a backend are seen only while
//! they are open, so a backend once seen stays one for BACKEND_KEEP.
//! Followed BACKEND_HOPS hops (php-fpm's own database counts too). Not
//! found: a backend on another local address than loopback (a container
//! bridge), or reached through a pipe or a shared memory queue.
//!
//! Cost, at most once every BACKENDS_EVERY (10 s) and only while some class is
//! judged busy or not (a TCP auto class): a unix_diag dump (every
//! listening or connected unix socket in the namespace), a TCP dump of the
//! loopback connections (the kernel filters by address) and one of the
//! listeners on their ports, and each service process's descriptors
//! (/proc/PID/fd).
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::signals::discover::{ephemeral_range, socket_inodes, SocketOwners};
use crate::signals::sock_diag::{SockDiag, UnixSock, TCP_ESTABLISHED, TCP_LISTEN};

/// Hops followed from a service's processes (service -> backend -> its backend ...).
pub const BACKEND_HOPS: usize = 3;
/// How often the connections are read at most: each read dumps the
/// namespace's unix sockets and loopback TCP connections (the TCP dump
/// walks the kernel's whole established table) and reads each service
/// process's descriptors. Read every second under the bench's
/// `conns-calm-v4`, it cost the light client 1.2 of its 500 requests/s
/// (498.5 and 498.8 against 499.6-499.8 read every 10 s, interleaved).
/// A backend is set up with its service, not per flood.
pub const BACKENDS_EVERY: Duration = Duration::from_secs(10);
/// How long a backend a service was seen connected to stays its backend:
/// its per-request connections are open only while it works, and a
/// quiet site's may be closed at several reads in a row.
pub const BACKEND_KEEP: Duration = Duration::from_secs(600);
/// How often a listener's holders are looked for again (a /proc scan): a
/// pool's workers come and go.
pub const HOLDERS_EVERY: Duration = Duration::from_secs(60);

/// A local connection: the inode of the socket that connected, and of the
/// listener it connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub client: u32,
    pub listener: u32,
}

/// The links among unix sockets: an unnamed connected socket whose peer
/// carries a name connected to the listener of that name.
pub fn unix_links(socks: &[UnixSock]) -> Vec<Link> {
    let listeners: HashMap<&[u8], u32> =
        socks.iter().filter(|s| s.state == TCP_LISTEN).filter_map(|s| Some((s.name.as_deref()?, s.inode))).collect();
    let names: HashMap<u32, &[u8]> = socks
        .iter()
        .filter(|s| s.state == TCP_ESTABLISHED)
        .filter_map(|s| Some((s.inode, s.name.as_deref()?)))
        .collect();
    socks
        .iter()
        .filter(|s| s.state == TCP_ESTABLISHED && s.name.is_none())
        .filter_map(|s| Some(Link { client: s.inode, listener: *listeners.get(names.get(&s.peer?)?)? }))
        .collect()
}

/// One end of a TCP connection: local address and port, remote address
/// and port, inode.
pub type TcpEnd = (IpAddr, u16, IpAddr, u16, u32);

/// The links of TCP connections on this host: an end whose local port is
/// in `ephemeral` connected to the listener (address, port, inode; the
/// address unspecified for the wildcard) on its remote port, if that port
/// is not in `ephemeral`.
pub fn tcp_links(ends: &[TcpEnd], listeners: &[(IpAddr, u16, u32)], ephemeral: (u16, u16)) -> Vec<Link> {
    let eph = |p: u16| (ephemeral.0..=ephemeral.1).contains(&p);
    let listener = |addr: IpAddr, port: u16| {
        let on = |(a, p, _): &&(IpAddr, u16, u32)| *p == port && (*a == addr || a.is_unspecified());
        // The one bound to the address, else a wildcard one.
        let mut found: Vec<_> = listeners.iter().filter(on).collect();
        found.sort_by_key(|(a, _, _)| a.is_unspecified());
        found.first().map(|(_, _, inode)| *inode)
    };
    ends.iter()
        .filter(|&&(_, lp, _, rp, _)| eph(lp) && !eph(rp))
        .filter_map(|&(_, _, ra, rp, inode)| Some(Link { client: inode, listener: listener(ra, rp)? }))
        .collect()
}

/// The processes `service`'s processes reach in up to BACKEND_HOPS hops
/// (none of `service` itself), `next` giving a process's backends.
pub fn reach(service: &[u32], next: &mut dyn FnMut(u32) -> Vec<u32>) -> Vec<u32> {
    let mut seen: BTreeSet<u32> = service.iter().copied().collect();
    let (mut found, mut frontier) = (vec![], service.to_vec());
    for _ in 0..BACKEND_HOPS {
        let mut hop = vec![];
        for pid in &frontier {
            hop.extend(next(*pid).into_iter().filter(|p| seen.insert(*p)));
        }
        found.extend_from_slice(&hop);
        frontier = hop;
    }
    found.sort_unstable();
    found
}

/// The reader, kept by the service-CPU look: the listeners each process
/// was seen connected to, and when.
#[derive(Default)]
pub struct Backends {
    diag: Option<SockDiag>,
    read_at: Option<Instant>,
    /// Listener inode -> its holders, from a /proc scan redone for a new
    /// listener, and every HOLDERS_EVERY.
    owners: SocketOwners,
    scanned_at: Option<Instant>,
    /// Process -> listener inode -> when it was last seen connected to it.
    seen: HashMap<u32, HashMap<u32, Instant>>,
}

impl Backends {
    /// Each service's (by its processes) backends: the holders of the
    /// listeners its processes (and their backends, BACKEND_HOPS deep)
    /// were seen connected to within BACKEND_KEEP. The connections are
    /// read again if the last read is BACKENDS_EVERY old; an unreadable
    /// dump leaves what was seen before.
    pub fn of(&mut self, services: &[Vec<u32>]) -> Vec<Vec<u32>> {
        if services.iter().all(Vec::is_empty) {
            return vec![vec![]; services.len()];
        }
        if self.read_at.is_none_or(|t| t.elapsed() >= BACKENDS_EVERY) {
            self.read_at = Some(Instant::now());
            if let Ok(links) = self.read_links() {
                self.note(services, &links);
            }
            self.seen.retain(|_, l| {
                l.retain(|_, at| at.elapsed() < BACKEND_KEEP);
                !l.is_empty()
            });
        }
        let (seen, owners) = (&self.seen, &self.owners.owners);
        let mut next = |pid: u32| -> Vec<u32> {
            let listeners = seen.get(&pid).into_iter().flat_map(HashMap::keys);
            listeners.flat_map(|l| owners.get(l).cloned().unwrap_or_default()).collect()
        };
        services.iter().map(|pids| reach(pids, &mut next)).collect()
    }

    /// Note, for each process of `services` and of their backends, the
    /// listeners `links` says the sockets it holds now are connected to.
    fn note(&mut self, services: &[Vec<u32>], links: &[Link]) {
        if self.scanned_at.is_none_or(|t| t.elapsed() >= HOLDERS_EVERY) {
            (self.owners, self.scanned_at) = (SocketOwners::default(), Some(Instant::now()));
        }
        self.owners.follow(&links.iter().map(|l| l.listener).collect::<Vec<_>>());
        let (now, owners, seen) = (Instant::now(), &self.owners.owners, &mut self.seen);
        let listener_of: HashMap<u32, u32> = links.iter().map(|l| (l.client, l.listener)).collect();
        let mut next = |pid: u32| -> Vec<u32> {
            let listeners: Vec<u32> = socket_inodes(pid).iter().filter_map(|i| listener_of.get(i).copied()).collect();
            for l in &listeners {
                seen.entry(pid).or_default().insert(*l, now);
            }
            listeners.iter().flat_map(|l| owners.get(l).cloned().unwrap_or_default()).collect()
        };
        for pids in services {
            reach(pids, &mut next);
        }
    }

    fn read_links(&mut self) -> Result<Vec<Link>> {
        if self.diag.is_none() {
            self.diag = Some(SockDiag::open(None)?);
        }
        let diag = self.diag.as_mut().expect("opened above");
        let mut unix = vec![];
        diag.dump_unix(&mut |s| unix.push(s.clone()))?;
        let mut links = unix_links(&unix);
        let (mut ends, mut listeners) = (vec![], vec![]);
        let loopback = [
            (libc::AF_INET as u8, (IpAddr::from([127, 0, 0, 0]), 8)),
            (libc::AF_INET6 as u8, (IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 128)),
        ];
        for (family, net) in loopback {
            diag.dump_to(family, 1 << TCP_ESTABLISHED, &[net], &mut |s| {
                ends.push((s.src, s.sport, s.dst, s.dport, s.inode))
            })?;
        }
        let ports: BTreeSet<u16> = ends.iter().map(|e| e.3).collect();
        if !ports.is_empty() {
            let ranges: Vec<(u16, u16)> = ports.iter().map(|&p| (p, p)).collect();
            for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                diag.dump_ports(family, libc::IPPROTO_TCP as u8, 1 << TCP_LISTEN, &ranges, &mut |s| {
                    listeners.push((s.src, s.sport, s.inode))
                })?;
            }
            links.extend(tcp_links(&ends, &listeners, ephemeral_range()));
        }
        Ok(links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(inode: u32, state: u8, peer: Option<u32>, name: Option<&[u8]>) -> UnixSock {
        UnixSock { inode, state, peer, name: name.map(<[u8]>::to_vec) }
    }

    /// nginx (pid 10) connected to php-fpm's listener (held by its master
    /// 20 and worker 21; the accepted end carries the listener's name), and
    /// php-fpm's worker to a database on 127.0.0.1:3306 (pid 30); a local
    /// client (pid 40) connected to nginx's own unix listener: php-fpm and
    /// the database are nginx's backends, the client is not.
    #[test]
    fn a_services_backends_are_the_processes_it_connected_to_not_those_that_connected_to_it() {
        let (l, e) = (TCP_LISTEN, TCP_ESTABLISHED);
        let fpm: &[u8] = b"/run/php/fpm.sock\0";
        let web: &[u8] = b"/run/nginx.sock\0";
        let socks = [
            unix(100, l, None, Some(fpm)),
            unix(1, e, Some(2), None),
            unix(2, e, Some(1), Some(fpm)),
            unix(101, l, None, Some(web)),
            unix(5, e, Some(6), None),
            unix(6, e, Some(5), Some(web)),
        ];
        let mut links = unix_links(&socks);
        let (lo, any, eph) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([0, 0, 0, 0]), (32768, 60999));
        let ends = [(lo, 40000, lo, 3306, 3), (lo, 3306, lo, 40000, 4)];
        links.extend(tcp_links(&ends, &[(any, 3306, 102), (lo, 8080, 103)], eph));
        let want =
            [Link { client: 1, listener: 100 }, Link { client: 5, listener: 101 }, Link { client: 3, listener: 102 }];
        assert_eq!(links, want);
        // Who holds each socket: nginx 1 and 101, php-fpm's master 100, its
        // worker 100 and 3, the database 102, the client 5.
        let sockets: HashMap<u32, Vec<u32>> =
            [(10, vec![1, 101]), (20, vec![100]), (21, vec![100, 3]), (30, vec![102]), (40, vec![5])].into();
        let holders: HashMap<u32, Vec<u32>> = [(100, vec![20, 21]), (101, vec![10]), (102, vec![30])].into();
        let listener_of: HashMap<u32, u32> = links.iter().map(|l| (l.client, l.listener)).collect();
        let of = |pids: &[u32]| {
            reach(pids, &mut |p| {
                let listeners = sockets[&p].iter().filter_map(|i| listener_of.get(i));
                listeners.flat_map(|l| holders[l].clone()).collect()
            })
        };
        assert_eq!(of(&[10]), [20, 21, 30]);
        assert_eq!(of(&[21]), [30], "php-fpm's worker's own backend");
        assert_eq!(of(&[40]), [10, 20, 21, 30], "the client's are nginx's and on");
        assert!(of(&[30]).is_empty(), "the database connected to nobody");
    }

    /// Both ends named (a client that bound a name) or both unnamed (a
    /// socketpair): no direction, no link; a TCP connection between two
    /// ephemeral ports, or two fixed ones, or to a port nobody listens on,
    /// likewise.
    #[test]
    fn a_connection_with_no_direction_or_listener_is_not_followed() {
        let (l, e) = (TCP_LISTEN, TCP_ESTABLISHED);
        let (a, b): (&[u8], &[u8]) = (b"a\0", b"b\0");
        let socks = [
            unix(100, l, None, Some(a)),
            unix(1, e, Some(2), Some(b)),
            unix(2, e, Some(1), Some(a)),
            unix(3, e, Some(4), None),
            unix(4, e, Some(3), None),
        ];
        assert!(unix_links(&socks).is_empty());
        let lo = IpAddr::from([127, 0, 0, 1]);
        let ends = [(lo, 40000, lo, 50000, 1), (lo, 80, lo, 443, 3), (lo, 40001, lo, 9000, 5)];
        let listeners = [(lo, 50000, 100), (lo, 443, 101)];
        assert!(tcp_links(&ends, &listeners, (32768, 60999)).is_empty());
    }

    /// The reader finds a real backend: this process connects to a unix
    /// listener, and to a TCP one on 127.0.0.1 (on a port out of the
    /// ephemeral range), each then held by a child process (`sh`) alone;
    /// the connection is closed before the second read, and the backend
    /// kept.
    #[test]
    fn the_reader_finds_the_holder_of_a_listener_this_process_connected_to() {
        for (listener, client) in [unix_pair(), tcp_pair()] {
            let (child, mut r) = (Holder::of(listener), Backends::default());
            let found = r.of(&[vec![std::process::id()], vec![]]);
            assert!(found[1].is_empty(), "a service with no process has no backend");
            // Contains, not equals: this process may hold other connections
            // of its own (a name service's socket).
            assert!(found[0].contains(&child.0.id()), "the listener's holder: {found:?}");
            drop(client);
            r.read_at = None;
            assert!(r.of(&[vec![std::process::id()]])[0].contains(&child.0.id()), "kept once the connection closed");
        }
    }

    /// A unix listener, and a connection to it (both ends; an end not yet
    /// accepted has no inode for its peer to name).
    fn unix_pair() -> (std::os::fd::OwnedFd, Box<dyn std::any::Any>) {
        let (listener, client, accepted) = sluice_testkit::neighbour::unix_connection("backends");
        (listener.into(), Box::new((client, accepted)))
    }

    /// A TCP listener on loopback, on a port out of the ephemeral range,
    /// and a connection to it.
    fn tcp_pair() -> (std::os::fd::OwnedFd, Box<dyn std::any::Any>) {
        let (lo, _) = ephemeral_range();
        let listener = (lo.saturating_sub(500).max(1)..lo)
            .find_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .expect("a free port under the ephemeral range");
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let accepted = listener.accept().unwrap().0;
        (listener.into(), Box::new((client, accepted)))
    }

    /// A child process (`sh`) holding a socket as its descriptor 3 (this
    /// process's copy closed), killed on drop.
    struct Holder(std::process::Child);

    impl Holder {
        fn of(socket: std::os::fd::OwnedFd) -> Holder {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "sleep 30"]);
            sluice_testkit::neighbour::pass_as_fd3(&mut cmd, &socket);
            let child = cmd.spawn().unwrap();
            drop(socket);
            Holder(child)
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
