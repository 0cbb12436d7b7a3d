//! Each class's service health, read once per tick for the budget
//! (`budget`), the SYN guard and the auto controller (`auto`): the class's
//! UDP sockets and TCP listeners (sock_diag), and the receive path's work on
//! each CPU (the daemon's tracer, `RxWork`). This module reads; what the
//! readings say (distress, behind, SYN pressure) is `policy::distress`'s.
//!
//! Every signal that can throttle a class is its own sockets' or the kernel's
//! receive work for the gate's interface, never a namespace-wide counter: any
//! local user can make a listener of their own overflow (ListenOverflows,
//! ListenDrops), a socket of their own drop (TCPBacklogDrop, RcvbufErrors) or
//! a backlog of their own overflow (softnet_stat), and that must not read as
//! the distress of a service they do not own. The one namespace counter read
//! here, TcpExt SyncookiesSent, only says when to count the classes' own
//! request sockets.
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::policy::config::Config;
use crate::policy::distress::{ListenStats, Reading, UdpReading};
use crate::signals::{
    procfs::parse_softnet, procfs::proc_counter, procfs::NsFile, procfs::Softnet, sock_diag::DiagSock,
    sock_diag::SockDiag, sock_diag::SockKey, sock_diag::SockStats, sock_diag::TCP_LISTEN, sock_diag::TCP_SYN_RECV,
};

/// Every this many ticks (1 s) both address families are dumped again.
const REDISCOVER_TICKS: u64 = 100;
/// The TCP signals, /proc/net/netstat and the listeners' dump, are read every
/// this many ticks (40 ms): the kernel prints every MIB counter to make
/// netstat (the costliest read of a tick), and a SYN flood is answered by the
/// kernel's own SYN cookies (and the gate's) from its first packet, so the
/// SYN guard and the budget hear of TCP distress at most 30 ms later than at
/// every tick. Between reads the last values stand: a queue that stood at
/// two reads stands through the ticks between them.
pub const TCP_TICKS: u64 = 4;
/// While the daemon is calm and no packet of a UDP class reached the gate,
/// the classes' UDP sockets are read again only every this many ticks (5 s at
/// the calm tick), if nothing was queued at the last read: a socket's queue
/// and drops grow only with arrivals, so the reads between would see the same
/// or less. Traffic that does not pass the gate (loopback, another interface)
/// is then seen up to this late; the gate can do nothing about it anyway.
pub const UDP_CARRY_TICKS: u32 = 10;

/// The namespace's TCP counter that says some listener sent SYN cookies
/// (whose: the classes' request sockets say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpExt {
    pub syncookies_sent: u64,
}

/// The TcpExt counters the health reads.
const TCPEXT_NAMES: [&str; 1] = ["SyncookiesSent"];

/// Parse the `TcpExt:` header and value lines of /proc/net/netstat.
pub fn parse_tcpext(text: &str) -> TcpExt {
    TcpExt { syncookies_sent: proc_counter(text, "TcpExt:", "SyncookiesSent") }
}

/// The receive path's work, from the daemon's tracer (kernel tracepoints,
/// counted only for the gate's interface or as kernel time on each CPU).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RxWork {
    /// Time in NET_RX softirq so far, ns, by CPU number.
    pub softirq_ns: Vec<u64>,
    /// The gate's interface's packets dropped at the per-CPU backlogs so far.
    pub backlog_drops: u64,
    /// Packets each CPU's stack took in so far, by CPU number: all, and
    /// those that came in on the gate's interface (the rest, loopback's or
    /// another interface's, is work the gate cannot relieve).
    pub stack_pkts: Vec<u64>,
    pub iface_pkts: Vec<u64>,
}

/// One class's service at one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassHealth {
    pub udp: SockStats,
    pub listen: ListenStats,
}

/// Everything read at one tick.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// By class index.
    pub classes: Vec<ClassHealth>,
    /// The host's per-CPU backlog counters (all interfaces): the auto
    /// controller reads their time squeezes as a hint of a congested
    /// receive path; never distress, and their drops are not read (the
    /// tracer's `rx` has the gate's interface's own).
    pub softnet: Softnet,
    pub tcp: TcpExt,
    /// None: the daemon has no tracer (an older kernel; said in the log).
    pub rx: Option<RxWork>,
}

impl ClassHealth {
    /// What the policy's rules (`policy::distress`) read of it.
    pub fn reading(&self) -> Reading {
        let u = &self.udp;
        let udp =
            UdpReading { sockets: u.sockets, drops: u.drops, full_queued: u.full_queued, full_rcvbuf: u.full_rcvbuf };
        Reading { udp, listen: self.listen }
    }
}

impl Health {
    /// The gate's interface's packets dropped at the per-CPU backlogs so
    /// far, as the tracer counts them (None: no tracer; the host-wide
    /// softnet_stat is never read for it: any local user can overflow a
    /// backlog).
    pub fn backlog_drops(&self) -> Option<u64> {
        self.rx.as_ref().map(|r| r.backlog_drops)
    }
}

/// Reads [`Health`] for one config's classes.
pub struct HealthReader {
    diag: SockDiag,
    /// By class index: the UDP and TCP port ranges of its rules.
    udp: Vec<Vec<(u16, u16)>>,
    tcp: Vec<Vec<(u16, u16)>>,
    udp_families: Families,
    tcp_families: Families,
    netstat: Option<NsFile>,
    /// /proc/net/softnet_stat, kept open (read every tick).
    softnet: NsFile,
    /// TcpExt and the classes' listeners as last read (every TCP_TICKS).
    last_tcp: TcpExt,
    last_listen: Vec<ListenStats>,
    /// The classes' UDP sockets as last read, and how many reads since carried it.
    last_udp: Option<Vec<SockStats>>,
    udp_carried: u32,
    ticks: u64,
}

impl HealthReader {
    /// For `cfg`'s classes, in namespace `ns` (None: the current one).
    pub fn new(cfg: &Config, ns: Option<&str>) -> Result<HealthReader> {
        let udp: Vec<_> = cfg.classes.iter().map(|c| c.udp_ports()).collect();
        let tcp: Vec<_> = cfg.classes.iter().map(|c| c.tcp_ports()).collect();
        let netstat = if tcp.iter().any(|t| !t.is_empty()) {
            let mut f = match ns {
                Some(ns) => NsFile::open(ns, "netstat")?,
                None => NsFile::open_here("netstat")?,
            };
            let missing = crate::signals::procfs::missing_counters(&f.read()?, "TcpExt:", &TCPEXT_NAMES);
            if !missing.is_empty() {
                crate::base::log::warn(format_args!(
                    "this kernel's /proc/net/netstat has no TcpExt {}: a SYN flood that fills a listener's SYN queue is seen only once it drops",
                    missing.join(", ")
                ));
            }
            Some(f)
        } else {
            None
        };
        Ok(HealthReader {
            diag: SockDiag::open(ns)?,
            udp_families: Families::new(&udp),
            tcp_families: Families::new(&tcp),
            udp,
            tcp,
            netstat,
            softnet: NsFile::open_here("softnet_stat")?,
            last_tcp: TcpExt::default(),
            last_listen: vec![],
            last_udp: None,
            udp_carried: 0,
            ticks: 0,
        })
    }

    /// The class indexes whose services are read (those matching UDP or TCP ports).
    pub fn watched(&self) -> Vec<usize> {
        (0..self.udp.len()).filter(|&id| !self.udp[id].is_empty() || !self.tcp[id].is_empty()).collect()
    }

    /// The class indexes with UDP ports.
    pub fn udp_classes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.udp.len()).filter(|&id| !self.udp[id].is_empty())
    }

    /// Read this tick's health. `udp_quiet`: the daemon is calm and no
    /// packet of a UDP class reached the gate since the last read; the last
    /// UDP read may then stand for this one (see UDP_CARRY_TICKS).
    pub fn read(&mut self, udp_quiet: bool) -> Result<Health> {
        let mut h = Health { classes: vec![ClassHealth::default(); self.udp.len()], ..Default::default() };
        if self.udp.iter().any(|u| !u.is_empty()) {
            match self.last_udp.as_ref().filter(|l| self.carries_udp(l, udp_quiet)) {
                Some(last) => {
                    h.classes.iter_mut().zip(last).for_each(|(c, u)| c.udp = *u);
                    self.udp_carried += 1;
                }
                None => {
                    self.read_udp(&mut h)?;
                    self.last_udp = Some(h.classes.iter().map(|c| c.udp).collect());
                    self.udp_carried = 0;
                }
            }
        }
        if self.ticks.is_multiple_of(TCP_TICKS) {
            self.read_tcp_signals(&mut h)?;
        } else {
            h.tcp = self.last_tcp;
            h.classes.iter_mut().zip(&self.last_listen).for_each(|(c, l)| c.listen = *l);
        }
        h.softnet = parse_softnet(&self.softnet.read()?);
        self.ticks += 1;
        Ok(h)
    }

    /// May the last UDP read `last` stand for this tick's?
    fn carries_udp(&self, last: &[SockStats], udp_quiet: bool) -> bool {
        udp_quiet && self.udp_carried + 1 < UDP_CARRY_TICKS && last.iter().all(|u| u.full_queued == 0)
    }

    /// The classes' UDP sockets.
    fn read_udp(&mut self, h: &mut Health) -> Result<()> {
        let (udp, classes) = (&self.udp, &mut h.classes);
        self.udp_families.dump(&mut self.diag, self.ticks, (libc::IPPROTO_UDP as u8, u32::MAX), &mut |s| {
            let (Some(c), Some(mem)) = (class_of(udp, s.sport), s.mem) else { return false };
            let u = &mut classes[c].udp;
            *u = u.add(&SockStats::of_socket(mem));
            true
        })
    }

    /// The TCP signals of this tick: the netstat counter, the listeners,
    /// and their request sockets when the namespace sent SYN cookies.
    fn read_tcp_signals(&mut self, h: &mut Health) -> Result<()> {
        if let Some(f) = &mut self.netstat {
            h.tcp = parse_tcpext(&f.read()?);
        }
        if self.tcp.iter().any(|t| !t.is_empty()) {
            self.read_tcp(h)?;
            if h.tcp.syncookies_sent > self.last_tcp.syncookies_sent {
                self.read_syn_queues(h)?;
            }
        }
        self.last_tcp = h.tcp;
        self.last_listen = h.classes.iter().map(|c| c.listen).collect();
        Ok(())
    }

    /// The classes' TCP listeners (the listening hash only: a short walk).
    fn read_tcp(&mut self, h: &mut Health) -> Result<()> {
        let (tcp, classes) = (&self.tcp, &mut h.classes);
        self.tcp_families.dump(&mut self.diag, self.ticks, (libc::IPPROTO_TCP as u8, 1 << TCP_LISTEN), &mut |s| {
            let Some(c) = class_of(tcp, s.sport) else { return false };
            let l = &mut classes[c].listen;
            l.sockets += 1;
            l.accept_queue += u64::from(s.rqueue);
            l.backlog += u64::from(s.wqueue);
            l.drops += s.mem.map_or(0, |m| SockStats::of_socket(m).drops);
            true
        })
    }

    /// Count the request sockets of the classes' listeners (a walk of the
    /// established hash, so only when some listener sent SYN cookies).
    fn read_syn_queues(&mut self, h: &mut Health) -> Result<()> {
        let (tcp, classes) = (&self.tcp, &mut h.classes);
        for c in classes.iter_mut().filter(|c| c.listen.sockets > 0) {
            c.listen.syn_queue = Some(0);
        }
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            let ports = &self.tcp_families.ports;
            self.diag.dump_ports(family, libc::IPPROTO_TCP as u8, 1 << TCP_SYN_RECV, ports, &mut |s| {
                if let Some(q) = class_of(tcp, s.sport).and_then(|c| classes[c].listen.syn_queue.as_mut()) {
                    *q += 1;
                }
            })?;
        }
        Ok(())
    }
}

/// The first class whose ports hold `port`, in `ports` (by class index; first
/// match wins, as in the gate).
pub fn class_of(ports: &[Vec<(u16, u16)>], port: u16) -> Option<usize> {
    ports.iter().position(|r| r.iter().any(|&(lo, hi)| (lo..=hi).contains(&port)))
}

/// Every class's port ranges as one sorted list, overlapping and adjacent ranges joined.
fn merged(per_class: &[Vec<(u16, u16)>]) -> Vec<(u16, u16)> {
    let mut all: Vec<(u16, u16)> = per_class.iter().flatten().copied().collect();
    all.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(all.len());
    for (lo, hi) in all {
        match out.last_mut() {
            Some(last) if u32::from(lo) <= u32::from(last.1) + 1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// How a protocol's class sockets are read at each tick. A dump walks every
/// slot of the protocol's hash table (16,384 for UDP on a 24 GiB host),
/// whether or not a socket is in it, so:
/// - only the address families the sockets were found in are dumped,
///   except every REDISCOVER_TICKS (or while none was found), when both
///   are dumped again: one family fewer is half the cost;
/// - when that dump found few sockets (ALONE_PER_DUMP) and each alone on
///   its address and port, they are read one by one instead (a lookup
///   each), for at most ALONE_FOR, then both families are dumped again. A
///   socket that is gone or replaced ends the reads alone until then.
struct Families {
    found: Vec<u8>,
    /// Every class's ranges of the protocol, merged.
    ports: Vec<(u16, u16)>,
    /// The sockets to read one by one (empty: dump), and until when.
    alone: Vec<SockKey>,
    alone_until: Option<Instant>,
}

/// At most this many sockets a family are read alone. `sluice bench tick`
/// (2026-11-27): a dump of both families 33.7 us, four sockets read alone
/// 11.8 us (2.9 us each); so a dump costs about six sockets' reads, and
/// four leaves a margin for a host whose lookups cost more.
pub const ALONE_PER_DUMP: usize = 4;
/// Sockets read alone are dumped again after this long: a socket added
/// beside them (another address, another member of a SO_REUSEPORT group)
/// is seen by then.
const ALONE_FOR: Duration = Duration::from_secs(1);

impl Families {
    /// For the classes' port ranges of one protocol.
    fn new(per_class: &[Vec<(u16, u16)>]) -> Families {
        Families { found: vec![], ports: merged(per_class), alone: vec![], alone_until: None }
    }

    /// Read the sockets of a protocol in a set of states whose port is one
    /// of the classes' (filtered in the kernel; none: no read); `each`
    /// says whether a socket was one of ours.
    fn dump(
        &mut self,
        diag: &mut SockDiag,
        tick: u64,
        (proto, states): (u8, u32),
        each: &mut dyn FnMut(&DiagSock) -> bool,
    ) -> Result<()> {
        if self.ports.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if self.alone_until.is_some_and(|t| now < t) {
            if diag.read_each(&self.alone, &mut |s| _ = each(s))? {
                return Ok(());
            }
            self.alone_until = None; // one gone or replaced: dumps until the next rediscovery
        }
        let expired = self.alone_until.take().is_some();
        let rediscover = tick.is_multiple_of(REDISCOVER_TICKS) || self.found.is_empty() || expired;
        let all = vec![libc::AF_INET as u8, libc::AF_INET6 as u8];
        let families = if rediscover { all } else { self.found.clone() };
        let (mut found, mut ours) = (vec![], vec![]);
        for f in families {
            let mut any = false;
            diag.dump_ports(f, proto, states, &self.ports, &mut |s| {
                if each(s) {
                    any = true;
                    if rediscover {
                        ours.push(s.key(proto)); // kept only from a rediscovery
                    }
                }
            })?;
            if any {
                found.push(f);
            }
        }
        if rediscover {
            if alone_pays(&ours, found.len()) {
                (self.alone, self.alone_until) = (ours, Some(now + ALONE_FOR));
            }
            self.found = found;
        }
        Ok(())
    }

    /// Are the sockets read one by one now (for tests)?
    #[cfg(test)]
    fn reads_alone(&self) -> bool {
        self.alone_until.is_some()
    }
}

/// Is reading `socks` one by one cheaper than dumping `families` families,
/// and sure to find each: no two on one address and port (the lookup of a
/// SO_REUSEPORT group's address finds one of its sockets, chosen by hash)?
fn alone_pays(socks: &[SockKey], families: usize) -> bool {
    let shared = socks
        .iter()
        .enumerate()
        .any(|(i, a)| socks[..i].iter().any(|b| (a.family, a.src, a.sport) == (b.family, b.src, b.sport)));
    !socks.is_empty() && socks.len() <= ALONE_PER_DUMP * families && !shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_ports_are_merged_into_one_sorted_list() {
        let per_class = vec![vec![(53, 53), (8000, 8100)], vec![], vec![(54, 60), (8050, 9000)], vec![(1, 1)]];
        assert_eq!(merged(&per_class), [(1, 1), (53, 60), (8000, 9000)]);
        assert_eq!(merged(&[vec![(0, 65535)], vec![(65535, 65535)]]), [(0, 65535)]);
        assert!(merged(&[]).is_empty());
    }

    #[test]
    fn tcpext_counters_are_found_by_name() {
        let text = "TcpExt: ListenOverflows SyncookiesSent\nTcpExt: 2 1\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(parse_tcpext(text), TcpExt { syncookies_sent: 1 });
        assert_eq!(parse_tcpext("garbage"), TcpExt::default());
    }

    /// The reading is the class's own sockets', the fullest one's queue;
    /// the path's drops the tracer's, never the host's softnet_stat.
    #[test]
    fn a_reading_is_the_class_sockets_and_the_path_the_tracers() {
        let udp = SockStats { sockets: 2, queued: 9, rcvbuf: 20, drops: 4, full_queued: 7, full_rcvbuf: 10 };
        let listen = ListenStats { sockets: 1, accept_queue: 3, backlog: 128, drops: 1, syn_queue: Some(5) };
        let r = ClassHealth { udp, listen }.reading();
        assert_eq!(r.udp, UdpReading { sockets: 2, drops: 4, full_queued: 7, full_rcvbuf: 10 });
        assert_eq!(r.listen, listen);
        let rx = Some(RxWork { backlog_drops: 6, ..RxWork::default() });
        let softnet = Softnet { dropped: 1_000, ..Default::default() };
        assert_eq!(Health { rx, softnet, ..Default::default() }.backlog_drops(), Some(6));
        assert_eq!(Health { softnet, ..Default::default() }.backlog_drops(), None, "no tracer: no count");
    }

    /// A real listener's accept queue is seen by the reader.
    #[test]
    fn the_reader_sees_a_listeners_accept_queue() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("web:rate=auto,match=tcp:{port}")]).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        let before = r.read(false).unwrap().classes[0].listen;
        assert_eq!((before.sockets, before.accept_queue, before.drops), (1, 0, 0));
        assert!(before.backlog > 0);
        let _c: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
        // The listeners are dumped every TCP_TICKS: the ticks between carry the last read.
        for _ in 1..TCP_TICKS {
            assert_eq!(r.read(false).unwrap().classes[0].listen, before, "carried between reads");
        }
        let after = r.read(false).unwrap().classes[0].listen;
        assert_eq!(after.accept_queue, 3, "{after:?}");
    }

    /// A listener with backlog 0 that never accepts drops the handshakes
    /// past its one queued connection: the reader counts them as its own.
    #[test]
    fn the_reader_counts_a_listeners_own_drops() {
        use socket2::{Domain, Socket, Type};
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        l.listen(0).unwrap();
        let l = std::net::TcpListener::from(l);
        let port = l.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("web:match=tcp:{port}")]).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        let before = r.read(false).unwrap().classes[0].listen;
        let mut held = vec![];
        for _ in 0..8 {
            let c = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            c.set_nonblocking(true).unwrap();
            let _ = c.connect(&l.local_addr().unwrap().into());
            held.push(c);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        for _ in 1..TCP_TICKS {
            r.read(false).unwrap();
        }
        let after = r.read(false).unwrap().classes[0].listen;
        assert!(after.drops > before.drops, "{before:?} -> {after:?}");
    }

    /// A class's few sockets, each alone on its port, are read one by one
    /// after the first dump and show the same queue; a socket closed and
    /// its port bound again is read by dump until the next rediscovery; a
    /// SO_REUSEPORT pair is always dumped (a lookup finds one of the two).
    #[test]
    fn the_reader_reads_a_few_sockets_alone_and_a_reuseport_group_by_dump() {
        use socket2::{Domain, Socket, Type};
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (uport, tcp) = (udp.local_addr().unwrap().port(), std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let tport = tcp.local_addr().unwrap().port();
        let pair: Vec<Socket> = (0..2)
            .map(|_| {
                let s = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
                s.set_reuse_port(true).unwrap();
                s
            })
            .collect();
        pair[0].bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        let rport = pair[0].local_addr().unwrap().as_socket().unwrap().port();
        pair[1].bind(&std::net::SocketAddr::from(([127, 0, 0, 1], rport)).into()).unwrap();
        let flags =
            [format!("dns:match=udp:{uport}"), format!("web:match=tcp:{tport}"), format!("pair:match=udp:{rport}")];
        let cfg = crate::policy::config::from_flags(&flags).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        let first = r.read(false).unwrap();
        assert_eq!(
            (first.classes[0].udp.sockets, first.classes[1].listen.sockets, first.classes[2].udp.sockets),
            (1, 1, 2)
        );
        assert!(r.tcp_families.reads_alone(), "one listener: read alone");
        assert!(!r.udp_families.reads_alone(), "the reuseport pair keeps the UDP sockets dumped");

        let flags = [format!("dns:match=udp:{uport}"), format!("web:match=tcp:{tport}")];
        let cfg = crate::policy::config::from_flags(&flags).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        r.read(false).unwrap();
        assert!(r.udp_families.reads_alone() && r.tcp_families.reads_alone());
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..10 {
            tx.send_to(&[0; 100], ("127.0.0.1", uport)).unwrap();
        }
        let queued = r.read(false).unwrap().classes[0].udp;
        assert!(r.udp_families.reads_alone());
        assert!(queued.sockets == 1 && queued.queued >= 1000, "read alone: {queued:?}");
        // The socket closed and its port bound again: a dump finds the new one.
        drop(udp);
        let again = std::net::UdpSocket::bind(("127.0.0.1", uport)).unwrap();
        let after = r.read(false).unwrap().classes[0].udp;
        assert_eq!((after.sockets, after.queued), (1, 0), "the new socket, by dump: {after:?}");
        assert!(!r.udp_families.reads_alone(), "dumps until the next rediscovery");
        assert!(r.tcp_families.reads_alone(), "the listener is read alone still");
        drop(again);
    }

    /// While quiet, an empty socket's last read stands for UDP_CARRY_TICKS - 1
    /// reads, then it is read again; a queue at the last read, or a read that
    /// is not quiet, is always read.
    #[test]
    fn a_quiet_empty_sockets_last_read_stands_a_bounded_number_of_reads() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("dns:match=udp:{port}")]).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        let udp = |r: &mut HealthReader, quiet| r.read(quiet).unwrap().classes[0].udp;
        let first = udp(&mut r, true);
        assert_eq!((first.sockets, first.queued), (1, 0), "the first read is a read, quiet or not");
        let send = || {
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap().send_to(&[0; 100], ("127.0.0.1", port)).unwrap();
        };
        send();
        for i in 1..UDP_CARRY_TICKS {
            assert_eq!(udp(&mut r, true), first, "read {i} is carried");
        }
        let read = udp(&mut r, true);
        assert!(read.queued > 0, "the {UDP_CARRY_TICKS}th is read: {read:?}");
        let mut buf = [0; 200];
        sock.recv(&mut buf).unwrap();
        assert_eq!(udp(&mut r, true).queued, 0, "a queue at the last read: read again, quiet or not");
        send();
        assert_eq!(udp(&mut r, true).queued, 0, "empty at the last read, quiet: carried");
        assert!(udp(&mut r, false).queued > 0, "not quiet: read");
    }
}
