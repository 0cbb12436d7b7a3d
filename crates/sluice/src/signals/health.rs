//! Each class's service health, read once per tick for the budget
//! (`budget`), the SYN guard and the auto controller (`auto`): the class's
//! UDP sockets and TCP listeners (sock_diag), and the receive path's work on
//! each CPU (the daemon's tracer, `RxWork`).
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
use crate::policy::queue::{drops_grew, stands, ACCEPT_STANDS, OVERLOAD_QUEUE, QUEUE_LOW};
use crate::signals::{
    kernel::parse_softnet, kernel::proc_counter, kernel::DiagSock, kernel::NsFile, kernel::SockDiag, kernel::SockKey,
    kernel::SockStats, kernel::Softnet, kernel::TCP_LISTEN, kernel::TCP_SYN_RECV,
};

/// Every this many ticks (1 s) both address families are dumped again.
const REDISCOVER_TICKS: u64 = 100;
/// A class's listeners under SYN pressure hold at least this share of their
/// backlog in request sockets: the kernel sends cookies at the whole
/// backlog, and a spoofed flood's requests stay for the SYN-ACK retries
/// (about a minute), so a flooded listener sits there.
const SYN_QUEUE_FULL: f64 = 0.5;
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

/// A class's TCP listeners, summed over its listening sockets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenStats {
    pub sockets: u32,
    /// Connections waiting to be accepted, and the backlog limit.
    pub accept_queue: u64,
    pub backlog: u64,
    /// SYNs and handshakes the listeners dropped (sk_drops: the kernel's
    /// tcp_listendrop, a full accept queue), since they were created.
    pub drops: u64,
    /// Request sockets (half-open connections) of the listeners, read only
    /// when the namespace sent SYN cookies since the last read (None: not
    /// read). The kernel sends cookies once a listener holds its backlog of them.
    pub syn_queue: Option<u64>,
}

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
    /// By class id.
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

/// Did a class's UDP sockets drop in the tick? Not a restarted service's:
/// its new socket starts its drop count again.
fn socket_dropped(p: &ClassHealth, n: &ClassHealth) -> bool {
    drops_grew((p.udp.sockets, p.udp.drops), (n.udp.sockets, n.udp.drops))
}

/// Why a class's service is in distress between two ticks, if it is.
pub fn distress(prev: &Health, now: &Health, class: usize) -> Option<&'static str> {
    let (p, n) = (prev.classes.get(class)?, now.classes.get(class)?);
    if socket_dropped(p, n) {
        return Some("socket drops");
    }
    if n.udp.sockets > 0 && stands(p.udp.full_queued, n.udp.full_queued, n.udp.full_rcvbuf, QUEUE_LOW) {
        return Some("socket queue");
    }
    if n.listen.sockets > 0 {
        if stands(p.listen.accept_queue, n.listen.accept_queue, n.listen.backlog, ACCEPT_STANDS) {
            return Some("accept queue");
        }
        if listen_dropped(p, n) {
            return Some("listen drops");
        }
    }
    None
}

/// Did a class's listeners drop a SYN or a handshake in the tick? Not a
/// restarted service's: its new listener starts its drop count again.
fn listen_dropped(p: &ClassHealth, n: &ClassHealth) -> bool {
    drops_grew((p.listen.sockets, p.listen.drops), (n.listen.sockets, n.listen.drops))
}

/// Did a class's UDP sockets drop between two ticks (not a restarted
/// service's new socket)?
pub fn dropped(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    socket_dropped(p, n)
}

/// Is a class's service behind and losing: its UDP sockets dropped in the
/// tick while their queue stood over OVERLOAD_QUEUE of the buffer at both
/// ends? Socket drops alone are also a burst overflowing a short queue of a
/// service with CPU to spare, which a cut of admission would only starve.
pub fn behind(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    socket_dropped(p, n) && queue_stands(prev, now, class)
}

/// Did a class's fullest UDP socket's queue stand over OVERLOAD_QUEUE of its
/// buffer at both ends of the tick?
pub fn queue_stands(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    stands(p.udp.full_queued, n.udp.full_queued, n.udp.full_rcvbuf, OVERLOAD_QUEUE)
}

/// Do a class's own TCP listeners show SYN pressure between two ticks: they
/// hold at least SYN_QUEUE_FULL of their backlog in request sockets (read
/// when the namespace sent SYN cookies), dropped SYNs or handshakes, or
/// their accept queue stands?
pub fn syn_pressure(prev: &Health, now: &Health, class: usize) -> bool {
    let (Some(p), Some(n)) = (prev.classes.get(class), now.classes.get(class)) else { return false };
    if n.listen.sockets == 0 {
        return false;
    }
    let syn_full = n.listen.syn_queue.is_some_and(|q| q > 0 && q as f64 >= SYN_QUEUE_FULL * n.listen.backlog as f64);
    syn_full
        || listen_dropped(p, n)
        || stands(p.listen.accept_queue, n.listen.accept_queue, n.listen.backlog, ACCEPT_STANDS)
}

/// True if the gate's interface lost packets at the per-CPU backlogs
/// between two ticks (no tracer: never; the host-wide softnet_stat counter
/// is not read for this, as any local user can overflow a backlog).
pub fn path_distress(prev: &Health, now: &Health) -> bool {
    match (&prev.rx, &now.rx) {
        (Some(a), Some(b)) => b.backlog_drops > a.backlog_drops,
        _ => false,
    }
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
            let missing = crate::signals::kernel::missing_counters(&f.read()?, "TcpExt:", &TCPEXT_NAMES);
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

    /// The class ids whose services are read (those matching UDP or TCP ports).
    pub fn watched(&self) -> Vec<usize> {
        (0..self.udp.len()).filter(|&id| !self.udp[id].is_empty() || !self.tcp[id].is_empty()).collect()
    }

    /// The class ids with UDP ports.
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

/// The first class whose ports hold `port`, in `ports` (by class id; first
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

    fn health(udp: SockStats, listen: ListenStats, tcp: TcpExt) -> Health {
        Health { classes: vec![ClassHealth { udp, listen }], tcp, ..Default::default() }
    }

    /// One UDP socket with a 160,000-byte buffer.
    fn sock(queued: u64, drops: u64) -> SockStats {
        SockStats { sockets: 1, queued, rcvbuf: 160_000, drops, full_queued: queued, full_rcvbuf: 160_000 }
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

    /// One listener with a backlog of 128.
    fn listener(accept_queue: u64, drops: u64, syn_queue: Option<u64>) -> ListenStats {
        ListenStats { sockets: 1, accept_queue, backlog: 128, drops, syn_queue }
    }

    #[test]
    fn tcp_distress_comes_from_the_class_listeners_own_queue_and_drops() {
        let (s, t) = (SockStats::default(), TcpExt::default());
        let d = |a: ListenStats, b: ListenStats| distress(&health(s, a, t), &health(s, b, t), 0);
        assert_eq!(d(listener(0, 0, None), listener(0, 0, None)), None);
        assert_eq!(d(listener(20, 0, None), listener(30, 0, None)), Some("accept queue"));
        assert_eq!(d(listener(0, 7, None), listener(0, 9, None)), Some("listen drops"));
        // A restarted listener starts its drop count again: not a drop.
        assert_eq!(d(listener(0, 7, None), ListenStats { sockets: 2, ..listener(0, 9, None) }), None);
        // The namespace's counters say nothing of this class: another
        // listener's overflows (SYN cookies sent anywhere) are not its distress.
        let cookies = TcpExt { syncookies_sent: 1_000 };
        assert_eq!(distress(&health(s, listener(0, 0, None), t), &health(s, listener(0, 0, None), cookies), 0), None);
        assert_eq!(distress(&health(s, ListenStats::default(), t), &health(s, ListenStats::default(), t), 0), None);
    }

    #[test]
    fn syn_pressure_is_the_class_listeners_own_syn_queue_drops_or_accept_queue() {
        let (s, t) = (SockStats::default(), TcpExt::default());
        let p = |a: ListenStats, b: ListenStats| syn_pressure(&health(s, a, t), &health(s, b, t), 0);
        assert!(!p(listener(0, 0, None), listener(0, 0, None)));
        assert!(p(listener(0, 0, None), listener(0, 0, Some(64))), "half the backlog in request sockets");
        assert!(!p(listener(0, 0, None), listener(0, 0, Some(63))), "under half the backlog");
        assert!(!p(listener(0, 0, None), listener(0, 0, Some(0))), "cookies were sent for another listener");
        assert!(p(listener(0, 1, None), listener(0, 2, None)), "its listener dropped");
        assert!(p(listener(20, 0, None), listener(30, 0, None)), "its accept queue stands");
        // Cookies sent in the namespace with no request socket of this class: not its pressure.
        let cookies = TcpExt { syncookies_sent: 1_000 };
        assert!(!syn_pressure(&health(s, listener(0, 0, None), t), &health(s, listener(0, 0, Some(0)), cookies), 0));
    }

    #[test]
    fn path_distress_is_the_interfaces_own_backlog_drops_and_needs_the_tracer() {
        let h = |rx: Option<RxWork>| Health { rx, ..Default::default() };
        let rx = |drops| Some(RxWork { softirq_ns: vec![0, 0], backlog_drops: drops, ..RxWork::default() });
        assert!(path_distress(&h(rx(5)), &h(rx(6))));
        assert!(!path_distress(&h(rx(5)), &h(rx(5))));
        assert!(!path_distress(&h(None), &h(None)), "no tracer: no path signal");
        // The host's softnet_stat (any interface, any local user) is not read for it.
        let softnet = |d| Health { softnet: Softnet { dropped: d, ..Default::default() }, ..h(rx(5)) };
        assert!(!path_distress(&softnet(0), &softnet(1_000)));
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
