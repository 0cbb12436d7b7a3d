//! A service's backends: the local processes its processes connected to
//! (nginx to php-fpm over a unix socket, a proxy to its application server
//! on 127.0.0.1), whose CPU time is the service's own work. A class is busy
//! when its CPUs are full mostly with its service's own work
//! (`policy::late::busy`); without its backends, a PHP site under a flood
//! of real connections reads php-fpm's time as a neighbour's, and is
//! never busy.
//!
//! Only connections the service made count: the processes that connected
//! *to* it (a local client, a load generator a local user runs) are not
//! its work, and counting them would let one local user make another's
//! service busy. A connection's direction:
//! - unix: the end a listener accepted carries the listener's name, the
//!   end that connected has none (unless it bound one: then it is not
//!   followed);
//! - TCP on loopback (127.0.0.0/8, ::1): the end whose local port is in the
//!   ephemeral range connected, the other was accepted.
//!
//! Followed BACKEND_HOPS hops (php-fpm's own database counts too). Not
//! found: a backend on another local address than loopback (a container
//! bridge), or reached through a pipe or a shared memory queue.
//!
//! Cost: one unix_diag dump (every connected unix socket on the host), a
//! TCP dump of loopback connections (the kernel filters by address) and a
//! /proc scan of every process's descriptors (`socket_holders`), at most
//! once every BACKENDS_EVERY, and only while some class is judged busy or
//! not (a TCP auto class).
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::signals::discover::{parse_port_range, socket_holders};
use crate::signals::sock_diag::{SockDiag, UnixSock, TCP_ESTABLISHED};

/// Hops followed from a service's processes (service -> backend -> its backend ...).
pub const BACKEND_HOPS: usize = 3;
/// How often the connections and their owners are read again: backends
/// are set up with the service, not per request (a pool of php-fpm
/// workers, a proxy's upstreams), and the /proc scan walks every process.
pub const BACKENDS_EVERY: Duration = Duration::from_secs(10);

/// A local connection: the inode of the socket that connected, and of the
/// one a listener accepted for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub client: u32,
    pub server: u32,
}

/// The links among connected unix sockets: an unnamed socket whose peer
/// has a name (the listener's) connected to that peer.
pub fn unix_links(socks: &[UnixSock]) -> Vec<Link> {
    let named: HashMap<u32, bool> = socks.iter().map(|s| (s.inode, s.named)).collect();
    socks
        .iter()
        .filter(|s| !s.named)
        .filter_map(|s| Some(Link { client: s.inode, server: s.peer.filter(|p| named.get(p) == Some(&true))? }))
        .collect()
}

/// One end of a TCP connection: local address and port, remote address
/// and port, inode.
pub type TcpEnd = (IpAddr, u16, IpAddr, u16, u32);

/// The links among TCP connections whose both ends are on this host: the
/// end whose local port is in `ephemeral` connected to the other (whose
/// port is not).
pub fn tcp_links(ends: &[TcpEnd], ephemeral: (u16, u16)) -> Vec<Link> {
    let by_addr: HashMap<(IpAddr, u16, IpAddr, u16), u32> =
        ends.iter().map(|&(la, lp, ra, rp, inode)| ((la, lp, ra, rp), inode)).collect();
    let eph = |p: u16| (ephemeral.0..=ephemeral.1).contains(&p);
    ends.iter()
        .filter(|&&(_, lp, _, rp, _)| eph(lp) && !eph(rp))
        .filter_map(|&(la, lp, ra, rp, inode)| Some(Link { client: inode, server: *by_addr.get(&(ra, rp, la, lp))? }))
        .collect()
}

/// The processes `service`'s processes reach through `links` in up to
/// BACKEND_HOPS hops (none of `service` itself), by `owners` (socket inode
/// -> the pids holding it).
pub fn backends_of(service: &[u32], owners: &HashMap<u32, Vec<u32>>, links: &[Link]) -> Vec<u32> {
    let mut sockets: HashMap<u32, Vec<u32>> = HashMap::new();
    for (inode, pids) in owners {
        for p in pids {
            sockets.entry(*p).or_default().push(*inode);
        }
    }
    let servers: HashMap<u32, u32> = links.iter().map(|l| (l.client, l.server)).collect();
    let mut seen: HashSet<u32> = service.iter().copied().collect();
    let (mut found, mut frontier) = (vec![], service.to_vec());
    for _ in 0..BACKEND_HOPS {
        let mut next = vec![];
        for pid in &frontier {
            for inode in sockets.get(pid).into_iter().flatten() {
                let Some(server) = servers.get(inode) else { continue };
                for p in owners.get(server).into_iter().flatten() {
                    if seen.insert(*p) {
                        next.push(*p);
                    }
                }
            }
        }
        found.extend_from_slice(&next);
        frontier = next;
    }
    found.sort_unstable();
    found
}

/// The reader, kept by the service-CPU look: the links and owners of its
/// last read (at most BACKENDS_EVERY old).
#[derive(Default)]
pub struct Backends {
    diag: Option<SockDiag>,
    read_at: Option<Instant>,
    owners: HashMap<u32, Vec<u32>>,
    links: Vec<Link>,
}

impl Backends {
    /// Each service's (by its processes) backends, from connections read
    /// at most BACKENDS_EVERY ago (read now if older). An unreadable
    /// dump leaves what was read before.
    pub fn of(&mut self, services: &[Vec<u32>]) -> Vec<Vec<u32>> {
        if services.iter().all(Vec::is_empty) {
            return vec![vec![]; services.len()];
        }
        if self.read_at.is_none_or(|t| t.elapsed() >= BACKENDS_EVERY) {
            self.read_at = Some(Instant::now());
            if let Ok(links) = self.read_links() {
                self.links = links;
                self.owners = if self.links.is_empty() { HashMap::new() } else { owners() };
            }
        }
        services.iter().map(|pids| backends_of(pids, &self.owners, &self.links)).collect()
    }

    fn read_links(&mut self) -> Result<Vec<Link>> {
        if self.diag.is_none() {
            self.diag = Some(SockDiag::open(None)?);
        }
        let diag = self.diag.as_mut().expect("opened above");
        let mut unix = vec![];
        diag.dump_unix(&mut |s| unix.push(*s))?;
        let mut ends = vec![];
        let loopback = [
            (libc::AF_INET as u8, (IpAddr::from([127, 0, 0, 0]), 8)),
            (libc::AF_INET6 as u8, (IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 128)),
        ];
        for (family, net) in loopback {
            diag.dump_to(family, 1 << TCP_ESTABLISHED, &[net], &mut |s| {
                ends.push((s.src, s.sport, s.dst, s.dport, s.inode))
            })?;
        }
        let ephemeral =
            parse_port_range(&std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default());
        let mut links = unix_links(&unix);
        links.extend(tcp_links(&ends, ephemeral));
        Ok(links)
    }
}

/// Socket inode -> the pids holding it (a /proc scan).
fn owners() -> HashMap<u32, Vec<u32>> {
    socket_holders()
        .into_iter()
        .map(|(inode, mut v)| {
            v.dedup_by_key(|(pid, _)| *pid);
            (inode, v.into_iter().map(|(pid, _)| pid).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(inode: u32, peer: u32, named: bool) -> UnixSock {
        UnixSock { inode, peer: Some(peer), named }
    }

    /// nginx (pid 10) connected to php-fpm's socket (php-fpm, pid 20, its
    /// accepted end named as its listener), and php-fpm to a database on
    /// 127.0.0.1:3306 (pid 30); a local client (pid 40) connected to
    /// nginx's own unix socket: php-fpm and the database are nginx's
    /// backends, the client is not.
    #[test]
    fn a_services_backends_are_the_processes_it_connected_to_not_those_that_connected_to_it() {
        let mut links = unix_links(&[unix(1, 2, false), unix(2, 1, true), unix(5, 6, false), unix(6, 5, true)]);
        let (lo, eph) = (IpAddr::from([127, 0, 0, 1]), (32768, 60999));
        links.extend(tcp_links(&[(lo, 40000, lo, 3306, 3), (lo, 3306, lo, 40000, 4)], eph));
        assert_eq!(
            links,
            [Link { client: 1, server: 2 }, Link { client: 5, server: 6 }, Link { client: 3, server: 4 }]
        );
        // Who holds each socket: nginx 1 and 6, php-fpm 2 and 3, the database 4, the client 5.
        let owners: HashMap<u32, Vec<u32>> =
            [(1, vec![10]), (6, vec![10]), (2, vec![20]), (3, vec![20]), (4, vec![30]), (5, vec![40])].into();
        assert_eq!(backends_of(&[10], &owners, &links), [20, 30]);
        assert_eq!(backends_of(&[20], &owners, &links), [30], "php-fpm's own backend");
        assert_eq!(backends_of(&[40], &owners, &links), [10, 20, 30], "the client's are nginx's and on");
        assert!(backends_of(&[30], &owners, &links).is_empty(), "the database connected to nobody");
    }

    /// Both ends bound (a named client) or both unnamed (a socketpair):
    /// no direction, no link; a TCP connection between two ephemeral
    /// ports, or two fixed ones, likewise.
    #[test]
    fn a_connection_with_no_direction_is_not_followed() {
        assert!(unix_links(&[unix(1, 2, true), unix(2, 1, true), unix(3, 4, false), unix(4, 3, false)]).is_empty());
        let lo = IpAddr::from([127, 0, 0, 1]);
        let ends = [(lo, 40000, lo, 50000, 1), (lo, 50000, lo, 40000, 2), (lo, 80, lo, 443, 3), (lo, 443, lo, 80, 4)];
        assert!(tcp_links(&ends, (32768, 60999)).is_empty());
    }

    /// The reader finds a real backend: this process connects to a unix
    /// listener, and to a TCP one on 127.0.0.1 (on a port out of the
    /// ephemeral range), and a child process (`sh`) holds the accepted
    /// end of one of them at a time.
    #[test]
    fn the_reader_finds_a_child_that_holds_the_accepted_end_of_a_connection() {
        let (unix, _unix_client) = unix_pair();
        assert!(holding(unix).contains(&0), "unix: the child holding the accepted end");
        let (tcp, _tcp_client) = tcp_pair();
        assert!(holding(tcp).contains(&0), "TCP: the child holding the accepted end");
    }

    /// A unix connection from this process: the accepted end, the client end.
    fn unix_pair() -> (std::os::fd::OwnedFd, std::os::unix::net::UnixStream) {
        let path = std::env::temp_dir().join(format!("sluice-backends-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let _ = std::fs::remove_file(&path);
        (accepted.into(), client)
    }

    /// A TCP connection on loopback from this process to a port out of
    /// the ephemeral range: the accepted end, the client end.
    fn tcp_pair() -> (std::os::fd::OwnedFd, std::net::TcpStream) {
        let (lo, _) =
            parse_port_range(&std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default());
        let listener = (lo.saturating_sub(500).max(1)..lo)
            .find_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .expect("a free port under the ephemeral range");
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (accepted.into(), client)
    }

    /// The backends read for this process while a child holds `end` (the
    /// child's pid reads as 0 in them).
    fn holding(end: std::os::fd::OwnedFd) -> Vec<u32> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = end.as_raw_fd();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 30"]);
        // SAFETY: dup2 in the child before exec: the socket as fd 3, kept over exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(end);
        let found = Backends::default().of(&[vec![std::process::id()], vec![]]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found[1].is_empty(), "a service with no process has no backend");
        // Contains, not equals: this process may hold other connections
        // of its own (a name service's socket).
        found[0].iter().map(|&p| if p == child.id() { 0 } else { p }).collect()
    }
}
