//! Each class's service health, read once per tick for the budget
//! (`budget`) and the auto controller (`auto`): the class's UDP sockets and
//! TCP listeners (sock_diag), the namespace's TCP listen and backlog drop
//! counters (/proc/net/netstat) and the per-CPU backlog drops (softnet_stat).
use anyhow::Result;

use crate::policy::config::Config;
use crate::signals::{
    kernel::parse_softnet, kernel::proc_counter, kernel::DiagSock, kernel::NsFile, kernel::SockDiag, kernel::SockStats,
    kernel::Softnet, kernel::TCP_LISTEN,
};

/// Every this many ticks (1 s) both address families are dumped again.
const REDISCOVER_TICKS: u64 = 100;
/// A socket queue over this share of the receive buffer at both edges of a
/// tick is a standing one (the same threshold as the knee controller's).
const QUEUE_STANDS: f64 = crate::policy::controller::QUEUE_LOW;
/// An accept queue over this share of the listen backlog at both edges of a tick stands.
const ACCEPT_STANDS: f64 = 0.125;
/// The TCP signals, /proc/net/netstat and the listeners' dump, are read every
/// this many ticks (40 ms): the kernel prints every MIB counter to make
/// netstat (the costliest read of a tick), and a SYN flood is answered by the
/// kernel's own SYN cookies (and the gate's) from its first packet, so the
/// SYN guard and the budget hear of TCP distress at most 30 ms later than at
/// every tick. Between reads the last values stand: a queue that stood at
/// two reads stands through the ticks between them.
pub const TCP_TICKS: u64 = 4;

/// A class's TCP listeners.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenStats {
    pub sockets: u32,
    /// Connections waiting to be accepted, and the backlog limit, summed.
    pub accept_queue: u64,
    pub backlog: u64,
}

/// The namespace's TCP counters that say a listener or a socket lost packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpExt {
    pub syncookies_sent: u64,
    pub listen_overflows: u64,
    pub listen_drops: u64,
    pub backlog_drop: u64,
}

/// The TcpExt counters the health reads.
const TCPEXT_NAMES: [&str; 4] = ["SyncookiesSent", "ListenOverflows", "ListenDrops", "TCPBacklogDrop"];

/// Parse the `TcpExt:` header and value lines of /proc/net/netstat.
pub fn parse_tcpext(text: &str) -> TcpExt {
    let get = |name: &str| proc_counter(text, "TcpExt:", name);
    TcpExt {
        syncookies_sent: get("SyncookiesSent"),
        listen_overflows: get("ListenOverflows"),
        listen_drops: get("ListenDrops"),
        backlog_drop: get("TCPBacklogDrop"),
    }
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
    /// By class id.
    pub classes: Vec<ClassHealth>,
    pub softnet: Softnet,
    pub tcp: TcpExt,
}

/// A queue over `share` of `of` at both ends of a tick (`a`, then `b`).
fn stands(a: u64, b: u64, of: u64, share: f64) -> bool {
    of > 0 && a as f64 > share * of as f64 && b as f64 > share * of as f64
}

/// Did a class's UDP sockets drop in the tick? Not a restarted service's:
/// its new socket starts its drop count again.
fn socket_dropped(p: &ClassHealth, n: &ClassHealth) -> bool {
    n.udp.sockets > 0 && n.udp.drops > p.udp.drops && p.udp.sockets == n.udp.sockets
}

/// Why a class's service is in distress between two ticks, if it is.
pub fn distress(prev: &Health, now: &Health, class: usize) -> Option<&'static str> {
    let (p, n) = (prev.classes.get(class)?, now.classes.get(class)?);
    if socket_dropped(p, n) {
        return Some("socket drops");
    }
    if n.udp.sockets > 0 && stands(p.udp.queued, n.udp.queued, n.udp.rcvbuf, QUEUE_STANDS) {
        return Some("socket queue");
    }
    if n.listen.sockets > 0 {
        if stands(p.listen.accept_queue, n.listen.accept_queue, n.listen.backlog, ACCEPT_STANDS) {
            return Some("accept queue");
        }
        if listen_lost(&prev.tcp, &now.tcp) {
            return Some("listen overflows");
        }
        let (a, b) = (prev.tcp, now.tcp);
        if b.backlog_drop > a.backlog_drop {
            return Some("tcp backlog drops");
        }
    }
    None
}

/// Is a class's service behind and losing: its UDP sockets dropped in the
/// tick while their queue stood over OVERLOAD_QUEUE of the buffer at both
/// ends? Socket drops alone are also a burst overflowing a short queue of a
/// service with CPU to spare, which a cut of admission would only starve.
pub fn behind(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    socket_dropped(p, n) && stands(p.udp.queued, n.udp.queued, n.udp.rcvbuf, crate::policy::controller::OVERLOAD_QUEUE)
}

/// Do a class's TCP listeners show SYN pressure between two ticks: the
/// kernel sent SYN cookies or a listen queue overflowed or dropped (both
/// namespace-wide counters), or the class's accept queue stands?
pub fn syn_pressure(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    if n.listen.sockets == 0 {
        return false;
    }
    now.tcp.syncookies_sent > prev.tcp.syncookies_sent
        || listen_lost(&prev.tcp, &now.tcp)
        || stands(p.listen.accept_queue, n.listen.accept_queue, n.listen.backlog, ACCEPT_STANDS)
}

/// Did a listen queue of the namespace overflow or drop between two reads?
fn listen_lost(a: &TcpExt, b: &TcpExt) -> bool {
    b.listen_overflows > a.listen_overflows || b.listen_drops > a.listen_drops
}

/// True if the per-CPU backlogs dropped packets between two ticks.
pub fn path_distress(prev: &Health, now: &Health) -> bool {
    now.softnet.dropped > prev.softnet.dropped
}

/// Reads [`Health`] for one config's classes.
pub struct HealthReader {
    diag: SockDiag,
    /// By class id: the UDP and TCP port ranges of its rules.
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
            let missing = crate::signals::kernel::missing_counters(&f.read()?, "TcpExt:", &TCPEXT_NAMES);
            if !missing.is_empty() {
                crate::surface::log::warn(format_args!(
                    "this kernel's /proc/net/netstat has no TcpExt {}: TCP distress and SYN pressure are not seen through them",
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
            ticks: 0,
        })
    }

    /// The class ids whose services are read (those matching UDP or TCP ports).
    pub fn watched(&self) -> Vec<usize> {
        (0..self.udp.len()).filter(|&id| !self.udp[id].is_empty() || !self.tcp[id].is_empty()).collect()
    }

    /// Read this tick's health.
    pub fn read(&mut self) -> Result<Health> {
        let mut h = Health { classes: vec![ClassHealth::default(); self.udp.len()], ..Default::default() };
        if self.udp.iter().any(|u| !u.is_empty()) {
            self.read_udp(&mut h)?;
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

    /// The first class whose ports hold `port`, in `ports` (first match wins, as in the gate).
    fn class_of(ports: &[Vec<(u16, u16)>], port: u16) -> Option<usize> {
        ports.iter().position(|r| r.iter().any(|&(lo, hi)| (lo..=hi).contains(&port)))
    }

    /// The classes' UDP sockets.
    fn read_udp(&mut self, h: &mut Health) -> Result<()> {
        let (udp, classes) = (&self.udp, &mut h.classes);
        self.udp_families.dump(&mut self.diag, self.ticks, (libc::IPPROTO_UDP as u8, u32::MAX), &mut |s| {
            let (Some(c), Some(mem)) = (Self::class_of(udp, s.sport), s.mem) else { return false };
            let u = &mut classes[c].udp;
            *u = u.add(&SockStats::of_socket(mem));
            true
        })
    }

    /// The TCP signals of this tick: the listeners and the netstat counters.
    fn read_tcp_signals(&mut self, h: &mut Health) -> Result<()> {
        if self.tcp.iter().any(|t| !t.is_empty()) {
            self.read_tcp(h)?;
        }
        if let Some(f) = &mut self.netstat {
            h.tcp = parse_tcpext(&f.read()?);
        }
        self.last_tcp = h.tcp;
        self.last_listen = h.classes.iter().map(|c| c.listen).collect();
        Ok(())
    }

    /// The classes' TCP listeners (the listening hash only: a short walk).
    fn read_tcp(&mut self, h: &mut Health) -> Result<()> {
        let (tcp, classes) = (&self.tcp, &mut h.classes);
        self.tcp_families.dump(&mut self.diag, self.ticks, (libc::IPPROTO_TCP as u8, 1 << TCP_LISTEN), &mut |s| {
            let Some(c) = Self::class_of(tcp, s.sport) else { return false };
            let l = &mut classes[c].listen;
            l.sockets += 1;
            l.accept_queue += u64::from(s.rqueue);
            l.backlog += u64::from(s.wqueue);
            true
        })
    }
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

/// The address families a protocol's class sockets were found in: each tick
/// dumps only those, except every REDISCOVER_TICKS (or while none was found),
/// when both are dumped again (a dump walks a hash table of its own: one
/// family fewer is half the cost).
struct Families {
    found: Vec<u8>,
    /// Every class's ranges of the protocol, merged.
    ports: Vec<(u16, u16)>,
}

impl Families {
    /// For the classes' port ranges of one protocol.
    fn new(per_class: &[Vec<(u16, u16)>]) -> Families {
        Families { found: vec![], ports: merged(per_class) }
    }

    /// Dump the sockets of a protocol in a set of states whose port is one
    /// of the classes' (filtered in the kernel; none: no dump); `each` says
    /// whether a socket was one of ours.
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
        let rediscover = tick.is_multiple_of(REDISCOVER_TICKS) || self.found.is_empty();
        let all = vec![libc::AF_INET as u8, libc::AF_INET6 as u8];
        let families = if rediscover { all } else { self.found.clone() };
        let mut found = vec![];
        for f in families {
            let mut any = false;
            diag.dump_ports(f, proto, states, &self.ports, &mut |s| any |= each(s))?;
            if any {
                found.push(f);
            }
        }
        if rediscover {
            self.found = found;
        }
        Ok(())
    }
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
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPBacklogDrop\nTcpExt: 1 2 3 4\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(
            parse_tcpext(text),
            TcpExt { syncookies_sent: 1, listen_overflows: 2, listen_drops: 3, backlog_drop: 4 }
        );
        assert_eq!(parse_tcpext("garbage"), TcpExt::default());
    }

    fn health(udp: SockStats, listen: ListenStats, tcp: TcpExt) -> Health {
        Health { classes: vec![ClassHealth { udp, listen }], tcp, ..Default::default() }
    }

    /// One UDP socket with a 160,000-byte buffer.
    fn sock(queued: u64, drops: u64) -> SockStats {
        SockStats { sockets: 1, queued, rcvbuf: 160_000, drops }
    }

    /// Two ticks of one class's UDP sockets, no listener.
    fn udp_ticks(a: SockStats, b: SockStats) -> (Health, Health) {
        let (none, t) = (ListenStats::default(), TcpExt::default());
        (health(a, none, t), health(b, none, t))
    }

    #[test]
    fn a_standing_queue_or_drops_are_distress_a_passing_queue_is_not() {
        let d = |a: SockStats, b: SockStats| {
            let (p, n) = udp_ticks(a, b);
            distress(&p, &n, 0)
        };
        assert_eq!(d(sock(0, 0), sock(50_000, 0)), None, "a queue at one edge only is passing");
        assert_eq!(d(sock(20_000, 0), sock(50_000, 0)), Some("socket queue"));
        assert_eq!(d(sock(0, 5), sock(0, 6)), Some("socket drops"));
        // A restarted service's socket starts its drop count again: not a drop.
        assert_eq!(d(sock(0, 5), SockStats { sockets: 2, ..sock(0, 6) }), None);
        assert_eq!(distress(&Health::default(), &udp_ticks(sock(0, 0), sock(0, 0)).1, 0), None, "no previous tick");
    }

    /// What cuts the unknown sources' tier: drops with the queue standing
    /// over half the buffer, not a burst overflowing a short queue.
    #[test]
    fn behind_is_drops_with_a_queue_over_half_the_buffer_at_both_ends() {
        let b = |a: SockStats, c: SockStats| {
            let (p, n) = udp_ticks(a, c);
            behind(&p, &n, 0)
        };
        assert!(b(sock(90_000, 5), sock(100_000, 6)));
        assert!(!b(sock(10_000, 5), sock(10_000, 6)), "a burst's drops over a short queue: not behind");
        assert!(!b(sock(90_000, 5), sock(100_000, 5)), "a full queue without drops: not behind");
        assert!(!b(sock(0, 5), sock(100_000, 6)), "the queue at one end only");
        assert!(!b(sock(90_000, 5), SockStats { sockets: 2, ..sock(100_000, 6) }), "a restarted service");
    }

    #[test]
    fn tcp_distress_comes_from_the_accept_queue_and_the_namespace_counters() {
        let l = |q| ListenStats { sockets: 1, accept_queue: q, backlog: 128 };
        let s = SockStats::default();
        let t0 = TcpExt::default();
        assert_eq!(distress(&health(s, l(0), t0), &health(s, l(0), t0), 0), None);
        assert_eq!(distress(&health(s, l(20), t0), &health(s, l(30), t0), 0), Some("accept queue"));
        let t1 = TcpExt { listen_overflows: 1, ..t0 };
        assert_eq!(distress(&health(s, l(0), t0), &health(s, l(0), t1), 0), Some("listen overflows"));
        let t2 = TcpExt { backlog_drop: 1, ..t0 };
        assert_eq!(distress(&health(s, l(0), t0), &health(s, l(0), t2), 0), Some("tcp backlog drops"));
        // A class without listeners does not take the namespace's TCP drops as its own.
        assert_eq!(distress(&health(s, ListenStats::default(), t0), &health(s, ListenStats::default(), t1), 0), None);
    }

    /// A real listener's accept queue is seen by the reader.
    #[test]
    fn the_reader_sees_a_listeners_accept_queue() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("web:rate=auto,match=tcp:{port}")]).unwrap();
        let mut r = HealthReader::new(&cfg, None).unwrap();
        let before = r.read().unwrap().classes[0].listen;
        assert_eq!((before.sockets, before.accept_queue), (1, 0));
        assert!(before.backlog > 0);
        let _c: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
        // The listeners are dumped every TCP_TICKS: the ticks between carry the last read.
        for _ in 1..TCP_TICKS {
            assert_eq!(r.read().unwrap().classes[0].listen, before, "carried between reads");
        }
        let after = r.read().unwrap().classes[0].listen;
        assert_eq!(after.accept_queue, 3, "{after:?}");
    }
}
