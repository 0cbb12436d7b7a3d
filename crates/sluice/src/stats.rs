//! Statistics the daemon serves: the snapshot (JSON over the Unix socket),
//! Prometheus text, and the table `sluice status` prints. Pure: no kernel here.
use std::fmt::Write as _;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::bpf_intf::*;
use crate::config::{Config, Limit};
use crate::gate::{ClassCounters, GlobalCounters};

/// Version of the snapshot JSON; bump on incompatible changes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Packet and byte totals of one class, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassTotals {
    /// Packets classified into this class.
    pub seen_pkts: u64,
    pub seen_bytes: u64,
    /// Packets admitted (XDP_PASS).
    pub admitted_pkts: u64,
    pub admitted_bytes: u64,
    /// Packets dropped because the class's token bucket was empty.
    pub dropped_rate_pkts: u64,
    pub dropped_rate_bytes: u64,
    /// Packets dropped because the class is blocked.
    pub dropped_blocked_pkts: u64,
    pub dropped_blocked_bytes: u64,
    /// Packets dropped because their source was over its fair share.
    #[serde(default)]
    pub dropped_share_pkts: u64,
    #[serde(default)]
    pub dropped_share_bytes: u64,
    /// Packets from known sources, and source-epochs (a source's first
    /// packet in a 10 ms epoch), while the class is limited with source fairness on.
    #[serde(default)]
    pub known_pkts: u64,
    #[serde(default)]
    pub source_epochs: u64,
    /// Entries this class made in the per-source map.
    #[serde(default)]
    pub source_inserts: u64,
    /// Admitted packets sent to another CPU (cpu = "away", while a higher
    /// priority is in distress).
    #[serde(default)]
    pub away_pkts: u64,
    /// Packets of known sources over their own rate (taken as unknown).
    #[serde(default)]
    pub known_over_pkts: u64,
    /// TCP SYNs that reached the class, and those the gate answered itself
    /// with a cookie SYN-ACK (a verdict of their own: neither admitted nor
    /// dropped).
    #[serde(default)]
    pub syn_pkts: u64,
    #[serde(default)]
    pub synack_pkts: u64,
    #[serde(default)]
    pub synack_bytes: u64,
    /// ACKs to a guarded listener with a valid gate cookie (a connection
    /// completed from it), and with none (left to the kernel).
    #[serde(default)]
    pub cookies_valid: u64,
    #[serde(default)]
    pub cookies_invalid: u64,
    /// While the class's SYN guard answers: ACKs and RSTs of no connection
    /// (only the listener found, no valid cookie) the gate dropped.
    #[serde(default)]
    pub dropped_noconn_pkts: u64,
    #[serde(default)]
    pub dropped_noconn_bytes: u64,
}

impl From<ClassCounters> for ClassTotals {
    fn from(c: ClassCounters) -> Self {
        ClassTotals {
            seen_pkts: c[SLUICE_CS_SEEN_PKTS as usize],
            seen_bytes: c[SLUICE_CS_SEEN_BYTES as usize],
            admitted_pkts: c[SLUICE_CS_ADMIT_PKTS as usize],
            admitted_bytes: c[SLUICE_CS_ADMIT_BYTES as usize],
            dropped_rate_pkts: c[SLUICE_CS_DROP_RATE_PKTS as usize],
            dropped_rate_bytes: c[SLUICE_CS_DROP_RATE_BYTES as usize],
            dropped_blocked_pkts: c[SLUICE_CS_DROP_BLOCKED_PKTS as usize],
            dropped_blocked_bytes: c[SLUICE_CS_DROP_BLOCKED_BYTES as usize],
            dropped_share_pkts: c[SLUICE_CS_DROP_SHARE_PKTS as usize],
            dropped_share_bytes: c[SLUICE_CS_DROP_SHARE_BYTES as usize],
            known_pkts: c[SLUICE_CS_KNOWN_PKTS as usize],
            source_epochs: c[SLUICE_CS_SRC_ACTIVE as usize],
            source_inserts: c[SLUICE_CS_SRC_INSERTS as usize],
            away_pkts: c[SLUICE_CS_AWAY_PKTS as usize],
            known_over_pkts: c[SLUICE_CS_KNOWN_OVER_PKTS as usize],
            syn_pkts: c[SLUICE_CS_SYN_PKTS as usize],
            synack_pkts: c[SLUICE_CS_SYNACK_PKTS as usize],
            synack_bytes: c[SLUICE_CS_SYNACK_BYTES as usize],
            cookies_valid: c[SLUICE_CS_COOKIE_OK as usize],
            cookies_invalid: c[SLUICE_CS_COOKIE_BAD as usize],
            dropped_noconn_pkts: c[SLUICE_CS_DROP_NOCONN_PKTS as usize],
            dropped_noconn_bytes: c[SLUICE_CS_DROP_NOCONN_BYTES as usize],
        }
    }
}

impl ClassTotals {
    pub fn dropped_pkts(&self) -> u64 {
        self.dropped_rate_pkts + self.dropped_blocked_pkts + self.dropped_share_pkts + self.dropped_noconn_pkts
    }
}

/// Global counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GlobalTotals {
    /// Not IPv4/IPv6 (ARP, LLDP, ...): passed.
    pub non_ip_pass: u64,
    /// Malformed IP packets dropped (malformed = "drop").
    pub malformed_drop: u64,
    /// Malformed IP packets passed (malformed = "pass").
    pub malformed_pass: u64,
    /// Headers beyond the parse depth (sent to the default class).
    pub depth_exceeded: u64,
    /// Non-first fragments (classified without ports).
    pub fragments: u64,
    /// Observe mode: packets counted as dropped (by a class or as
    /// malformed) that the gate passed.
    #[serde(default)]
    pub observed_pass: u64,
    /// Replies the egress learner saw from a learning class's port to a peer
    /// that had asked the class nothing (not learned).
    #[serde(default)]
    pub unasked_replies: u64,
}

impl From<GlobalCounters> for GlobalTotals {
    fn from(g: GlobalCounters) -> Self {
        GlobalTotals {
            non_ip_pass: g[SLUICE_GS_NON_IP_PASS as usize],
            malformed_drop: g[SLUICE_GS_MALFORMED_DROP as usize],
            malformed_pass: g[SLUICE_GS_MALFORMED_PASS as usize],
            depth_exceeded: g[SLUICE_GS_DEPTH_EXCEEDED as usize],
            fragments: g[SLUICE_GS_FRAGMENTS as usize],
            observed_pass: g[SLUICE_GS_OBSERVED_PASS as usize],
            unasked_replies: g[SLUICE_GS_UNASKED as usize],
        }
    }
}

/// Per-second rates of a class over the last second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassRates {
    pub seen_pps: f64,
    pub admitted_pps: f64,
    pub dropped_pps: f64,
    #[serde(default)]
    pub known_pps: f64,
    #[serde(default)]
    pub share_dropped_pps: f64,
    /// Source-epochs per second (divide by 100 for sources per epoch).
    #[serde(default)]
    pub source_epochs_ps: f64,
}

impl ClassRates {
    /// Rates between two totals taken `secs` apart.
    pub fn between(old: &ClassTotals, new: &ClassTotals, secs: f64) -> ClassRates {
        if secs <= 0.0 {
            return ClassRates::default();
        }
        let r = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        ClassRates {
            seen_pps: r(old.seen_pkts, new.seen_pkts),
            admitted_pps: r(old.admitted_pkts, new.admitted_pkts),
            dropped_pps: r(old.dropped_pkts(), new.dropped_pkts()),
            known_pps: r(old.known_pkts, new.known_pkts),
            share_dropped_pps: r(old.dropped_share_pkts, new.dropped_share_pkts),
            source_epochs_ps: r(old.source_epochs, new.source_epochs),
        }
    }
}

/// One class in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSnapshot {
    pub id: usize,
    pub name: String,
    /// 0 = highest.
    pub priority: u8,
    /// "unlimited", "blocked" or "RATE pps".
    pub limit: String,
    /// Packets/s limit, if the class has one.
    pub rate_pps: Option<u64>,
    pub burst: Option<u64>,
    pub is_default: bool,
    pub rates: ClassRates,
    pub totals: ClassTotals,
    /// The controller's view, for `rate = "auto"` classes.
    #[serde(default)]
    pub auto: Option<AutoStatus>,
    /// For a class made by discovery: where its priority came from.
    #[serde(default)]
    pub discovered: Option<String>,
    /// The budget's throttle on the class (packets/s), while a service of
    /// higher priority is or was in distress; None = not throttled.
    #[serde(default)]
    pub throttle_pps: Option<f64>,
    /// Source fairness and learning, for a class that is limited or learns.
    #[serde(default)]
    pub sources: Option<crate::sources::ClassSources>,
    /// Packets the kernel dropped after the gate admitted them, by stage and
    /// drop reason (since the daemon started; empty if the tracer could not load).
    #[serde(default)]
    pub kernel_drops: Vec<crate::trace::fate::Drop>,
    /// Seconds (in 10 ms ticks) the class's service showed distress since
    /// the daemon started (None: the class has no service the daemon reads).
    #[serde(default)]
    pub distress_secs: Option<f64>,
    /// Packets the gate dropped in ticks where the class's service had room
    /// (its UDP sockets showed no distress) and nothing but its own limit
    /// applied (no static rate, no budget throttle): loss sluice inflicted
    /// on a healthy service. None: the class has no UDP socket the daemon reads.
    #[serde(default)]
    pub dropped_with_room_pkts: Option<u64>,
    /// SYN cookies at the driver, for a class with TCP ports or
    /// `syn_cookies = "on"` (None: neither).
    #[serde(default)]
    pub syn_guard: Option<SynGuardStatus>,
}

/// A class's SYN guard (`crate::syn_guard`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SynGuardStatus {
    /// "auto", "on" or "off".
    pub policy: String,
    /// The gate answers the class's SYNs now.
    pub answering: bool,
    /// The kernel can complete connections from gate cookies (Linux 6.9's
    /// bpf_sk_assign_tcp_reqsk); false: the kernel answers every SYN.
    pub available: bool,
}

/// The auto controller's state for one class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoStatus {
    /// "knee" or "pno".
    pub algo: String,
    /// "tracking", "probing", "backoff", "holding", "fallback", ... (controller::CtlState).
    pub state: String,
    /// Estimated capacity of this class's service (pkt/s).
    pub capacity_pps: f64,
    /// What this class's controller would admit while engaged (pkt/s).
    pub target_pps: f64,
    /// This class's current rate (pkt/s); None = unlimited (fallback).
    pub rate_pps: Option<f64>,
    pub min_share: f64,
    /// The class's sockets found by sock_diag, and the bytes queued in them.
    pub sockets: u32,
    pub queued_bytes: u64,
    pub rcvbuf_bytes: u64,
    /// Seconds without signals (holding, then fallback).
    pub lost_secs: f64,
}

/// What `sluice status` shows: the daemon's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub interface: String,
    pub ifindex: u32,
    /// "native" or "generic".
    pub xdp_mode: String,
    pub prog_id: u32,
    pub pid: u32,
    pub uptime_secs: f64,
    /// When the gate was attached (Unix time, seconds).
    #[serde(default)]
    pub started_unix: f64,
    pub config_file: Option<String>,
    pub reloads: u64,
    /// The error of the last refused reload, if the last reload failed.
    pub last_reload_error: Option<String>,
    pub classes: Vec<ClassSnapshot>,
    pub global: GlobalTotals,
    /// CPU time the daemon used (user + system, seconds) and its share of
    /// one CPU since the previous statistics refresh (100 ms earlier).
    #[serde(default)]
    pub daemon_cpu_secs: f64,
    #[serde(default)]
    pub daemon_cpu_pct: f64,
    /// The daemon's resident memory (VmRSS), bytes; None if it could not be read.
    /// The gate's maps are kernel memory, not in it (see `sources`).
    #[serde(default)]
    pub daemon_rss_bytes: Option<u64>,
    /// Whether the daemon adds a class for each listening service.
    #[serde(default)]
    pub discover: bool,
    /// The highest priority whose service is in distress, and why (the budget).
    #[serde(default)]
    pub distress: Option<String>,
    /// How long the services' signals have been unreadable in a row, and
    /// the last error (None: the last read worked).
    #[serde(default)]
    pub signals_unreadable: Option<(f64, String)>,
    /// The per-source map and the known sources.
    #[serde(default)]
    pub sources: crate::sources::SourcesMap,
    /// The reuseport groups sluice steers, and their readers.
    #[serde(default)]
    pub readers: Vec<crate::steer::GroupStatus>,
    /// CPU protection in force now (`cpu = "away"`): what went where; None: nothing.
    #[serde(default)]
    pub cpu_away: Option<String>,
    /// The daemon's program is the one attached to the interface (checked at
    /// every statistics refresh: a link detached by hand or an interface
    /// re-created leaves the service unprotected while the daemon runs).
    #[serde(default = "yes")]
    pub attached: bool,
    /// Observe mode: the gate drops nothing; its drop counters say what
    /// enforcing would have dropped.
    #[serde(default)]
    pub observe: bool,
}

fn yes() -> bool {
    true
}

impl Snapshot {
    /// Sum of every verdict counter: each packet the gate ran on lands in exactly one.
    pub fn verdict_total(&self) -> u64 {
        let classes: u64 = self.classes.iter().map(|c| c.totals.admitted_pkts + c.totals.dropped_pkts()).sum();
        classes + self.global.non_ip_pass + self.global.malformed_drop + self.global.malformed_pass
    }
}

/// This process's resident memory (VmRSS in /proc/self/status), bytes.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The class part of a snapshot from a config (totals and rates zero).
pub fn class_snapshots(cfg: &Config) -> Vec<ClassSnapshot> {
    cfg.classes
        .iter()
        .enumerate()
        .map(|(id, c)| {
            let (limit, rate_pps, burst) = match c.limit {
                Limit::Unlimited => ("unlimited".to_string(), None, None),
                Limit::Blocked => ("blocked".to_string(), None, None),
                Limit::Rate { pps, burst } => (format!("{} pps", human(pps as f64)), Some(pps), Some(burst)),
                Limit::Auto(a) => (format!("auto ({})", a.algo.name()), None, None),
            };
            ClassSnapshot {
                id,
                name: c.name.clone(),
                priority: c.priority,
                limit,
                rate_pps,
                burst,
                is_default: id == cfg.default_class,
                rates: ClassRates::default(),
                totals: ClassTotals::default(),
                auto: None,
                discovered: c.discovered.clone(),
                throttle_pps: None,
                sources: None,
                kernel_drops: Vec::new(),
                distress_secs: None,
                dropped_with_room_pkts: None,
                syn_guard: None,
            }
        })
        .collect()
}

/// 1234567 -> "1.23M".
pub fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The table `sluice status` prints.
pub fn render_table(s: &Snapshot) -> String {
    let mut o = String::new();
    let up = s.uptime_secs as u64;
    let _ = writeln!(
        o,
        "sluice on {} (ifindex {}, {} XDP, prog id {}), pid {}, up {}h{:02}m{:02}s, reloads {}",
        s.interface,
        s.ifindex,
        s.xdp_mode,
        s.prog_id,
        s.pid,
        up / 3600,
        up / 60 % 60,
        up % 60,
        s.reloads
    );
    if !s.attached {
        let _ = writeln!(
            o,
            "GATE DETACHED: program {} is no longer attached to {} (link detached or interface re-created): nothing is protected; restart sluice",
            s.prog_id, s.interface
        );
    }
    if let Some(e) = &s.last_reload_error {
        let _ = writeln!(o, "LAST RELOAD REFUSED (old config still active): {e}");
    }
    if s.observe {
        let _ = writeln!(
            o,
            "OBSERVE MODE: nothing is dropped; the DROP figures are what enforcing would have dropped ({} packets passed so far)",
            s.global.observed_pass
        );
    }
    let _ = writeln!(
        o,
        "{:<24} {:>4} {:>14} {:>10} {:>10} {:>10} {:>14} {:>14} {:>14}",
        "CLASS", "PRIO", "LIMIT", "SEEN/s", "ADMIT/s", "DROP/s", "SEEN", "ADMITTED", "DROPPED"
    );
    for c in &s.classes {
        let name = if c.is_default { format!("{}*", c.name) } else { c.name.clone() };
        let _ = writeln!(
            o,
            "{:<24} {:>4} {:>14} {:>10} {:>10} {:>10} {:>14} {:>14} {:>14}",
            name,
            c.priority,
            c.limit,
            human(c.rates.seen_pps),
            human(c.rates.admitted_pps),
            human(c.rates.dropped_pps),
            c.totals.seen_pkts,
            c.totals.admitted_pkts,
            c.totals.dropped_pkts()
        );
    }
    if s.classes.iter().any(|c| c.auto.is_some()) {
        let _ = writeln!(
            o,
            "{:<24} {:>5} {:>9} {:>10} {:>10} {:>10} {:>5} {:>7} {:>12}",
            "AUTO CLASS", "ALGO", "STATE", "CAPACITY", "TARGET", "RATE", "SOCKS", "QUEUE", "SIGNALS LOST"
        );
        for c in &s.classes {
            let Some(a) = &c.auto else { continue };
            let _ = writeln!(
                o,
                "{:<24} {:>5} {:>9} {:>10} {:>10} {:>10} {:>5} {:>6}% {:>11.1}s",
                c.name,
                a.algo,
                a.state,
                human(a.capacity_pps),
                human(a.target_pps),
                a.rate_pps.map_or("unlimited".into(), human),
                a.sockets,
                (100 * a.queued_bytes).checked_div(a.rcvbuf_bytes).unwrap_or(0),
                a.lost_secs
            );
        }
    }
    for c in s.classes.iter().filter(|c| c.dropped_with_room_pkts.is_some_and(|n| n > 0)) {
        let _ = writeln!(
            o,
            "SELF-INFLICTED: the gate dropped {} packets of {} while its service had room (no distress)",
            c.dropped_with_room_pkts.unwrap_or(0),
            c.name
        );
    }
    render_no_signal(&mut o, &s.classes);
    render_syn_guards(&mut o, &s.classes);
    render_budget(&mut o, s);
    crate::sources::render_status(&mut o, s);
    crate::steer::render_status(&mut o, &s.readers);
    render_kernel_drops(&mut o, &s.classes);
    let rss = s.daemon_rss_bytes.map_or("not read".into(), |b| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64));
    let _ = writeln!(
        o,
        "daemon CPU {:.1}% of one CPU ({:.1} s in total), resident memory {rss}",
        s.daemon_cpu_pct, s.daemon_cpu_secs
    );
    let g = &s.global;
    let _ = writeln!(
        o,
        "(* = default class)  non-IP passed {}  malformed dropped {}  malformed passed {}  depth exceeded {}  fragments {}",
        g.non_ip_pass, g.malformed_drop, g.malformed_pass, g.depth_exceeded, g.fragments
    );
    o
}

/// Classes whose SYNs the gate answers or answered (SYN cookies at the
/// driver), and one line if this kernel cannot complete connections from
/// gate cookies while some class has TCP ports.
fn render_syn_guards(o: &mut String, classes: &[ClassSnapshot]) {
    let guarded: Vec<(&ClassSnapshot, &SynGuardStatus)> =
        classes.iter().filter_map(|c| c.syn_guard.as_ref().map(|g| (c, g))).collect();
    if guarded.iter().any(|(_, g)| !g.available) {
        let _ = writeln!(
            o,
            "SYN COOKIES: unavailable (the kernel lacks bpf_sk_assign_tcp_reqsk, Linux 6.9): the kernel answers every SYN"
        );
        return;
    }
    for (c, g) in guarded.iter().filter(|(c, g)| g.answering || c.totals.synack_pkts > 0) {
        let t = &c.totals;
        let now = if g.answering { "answers its SYNs now" } else { "answered SYNs earlier" };
        let _ = writeln!(
            o,
            "SYN COOKIES: the gate {now} for {} (syn_cookies = {}): SYN-ACKs sent {}, valid cookies back {}, ACKs without one {}, \
             ACKs and RSTs of no connection dropped {}",
            c.name, g.policy, t.synack_pkts, t.cookies_valid, t.cookies_invalid, t.dropped_noconn_pkts
        );
    }
}

/// Auto classes with no socket of their own to read (the service stopped,
/// is restarting, or its sockets could not be dumped): what their rate is
/// then. A class is never limited for lack of a signal unless it already was.
fn render_no_signal(o: &mut String, classes: &[ClassSnapshot]) {
    for c in classes {
        let Some(a) = c.auto.as_ref().filter(|a| a.sockets == 0) else { continue };
        let rate = a.rate_pps.map_or("unlimited".into(), |r| format!("{}/s", human(r)));
        let what = match a.state.as_str() {
            "holding" => format!("its last rate ({rate}) is held for auto.hold, then its fallback applies"),
            "fallback" => format!("its fallback applies ({rate})"),
            _ => format!("not limited on what it cannot see ({rate})"),
        };
        let _ = writeln!(
            o,
            "NO SIGNAL: {} has no socket to read for {:.1} s (its service stopped or is restarting, or its sockets could not be read): {what}",
            c.name, a.lost_secs
        );
    }
}

/// Where the kernel dropped what the gate admitted (since start).
fn render_kernel_drops(o: &mut String, classes: &[ClassSnapshot]) {
    if classes.iter().all(|c| c.kernel_drops.is_empty()) {
        return;
    }
    let _ = writeln!(o, "{:<24} {:<10} {:<24} {:>12}", "DROPPED AFTER THE GATE", "STAGE", "REASON", "PACKETS");
    for c in classes {
        for d in &c.kernel_drops {
            let _ = writeln!(o, "{:<24} {:<10} {:<24} {:>12}", c.name, d.stage, d.reason, d.packets);
        }
    }
}

/// The budget's throttles and the discovered classes' priorities.
fn render_budget(o: &mut String, s: &Snapshot) {
    if let Some((secs, e)) = &s.signals_unreadable {
        let what = if *secs >= crate::tick::STALE_TICKS as f64 * crate::controller::TICK.as_secs_f64() {
            "stale: throttles released, auto classes unlimited until they can be read"
        } else {
            "the last limits are kept for now"
        };
        _ = writeln!(o, "SIGNALS UNREADABLE for {secs:.1} s ({e}): {what}");
    }
    match &s.distress {
        Some(d) => _ = writeln!(o, "budget: a service is in distress ({d}); classes below it are throttled"),
        None => _ = writeln!(o, "budget: no service in distress"),
    }
    for c in s.classes.iter().filter(|c| c.throttle_pps.is_some()) {
        _ = writeln!(o, "  {} throttled to {}/s", c.name, human(c.throttle_pps.unwrap_or(0.0)));
    }
    if let Some(a) = &s.cpu_away {
        _ = writeln!(o, "cpu away: {a}");
    }
    if !s.discover {
        _ = writeln!(o, "discovery off (discover = false or --no-discover)");
    } else if s.classes.iter().all(|c| c.discovered.is_none()) {
        _ = writeln!(o, "discovery on: no listening service without a configured class was found");
    }
    for c in s.classes.iter() {
        if let Some(why) = &c.discovered {
            _ = writeln!(o, "  discovered {}: {why}", c.name);
        }
    }
}

/// Prometheus text exposition of a snapshot.
pub fn prometheus_text(s: &Snapshot) -> String {
    let mut reg = Registry::with_prefix("sluice");
    register_class_families(&mut reg, &s.classes);
    register_auto_families(&mut reg, &s.classes);
    // The kernel's counters are totals: each scrape builds a new registry and
    // counts them in once, so they are served as counters (the encoder adds _total).
    let (unclassified, flagged) = (Family::<Labels, U64Counter>::default(), Family::<Labels, U64Counter>::default());
    let g = &s.global;
    for (v, n) in
        [("non_ip_pass", g.non_ip_pass), ("malformed_drop", g.malformed_drop), ("malformed_pass", g.malformed_pass)]
    {
        unclassified.get_or_create(&vec![label("verdict", v)]).inc_by(n);
    }
    for (f, n) in [("depth_exceeded", g.depth_exceeded), ("fragment", g.fragments), ("observed_pass", g.observed_pass)]
    {
        flagged.get_or_create(&vec![label("flag", f)]).inc_by(n);
    }
    reg.register(
        "unclassified_packets",
        "Packets the gate passed or dropped outside the classes (non-IP, malformed)",
        unclassified,
    );
    let what = "Packets the gate noted (headers past its parse depth, IP fragments, passed in observe mode); \
                also counted in their class or as unclassified";
    reg.register("flagged_packets", what, flagged);
    let unasked = ConstCounter::new(g.unasked_replies);
    let what = "Replies from a learning class's port to a peer that had asked the class nothing (not learned)";
    reg.register("learner_unasked_replies", what, unasked);
    let cpu = ConstCounter::new(s.daemon_cpu_secs);
    reg.register("daemon_cpu_seconds", "CPU time used by the daemon (user + system)", cpu);
    let start = F64Gauge::default();
    start.set(s.started_unix);
    reg.register("start_time_seconds", "When the gate was attached (Unix time)", start);
    let attached = U64Gauge::default();
    attached.set(u64::from(s.attached));
    reg.register("gate_attached", "1 while the daemon's program is attached to the interface, else 0", attached);
    let inserts = ConstCounter::new(s.sources.inserts);
    reg.register("source_inserts", "Entries made in the per-source map (every class)", inserts);
    // No sample until the daemon's first scan of the map (5 s): missing, not 0.
    let evictions = Family::<Labels, U64Counter>::default();
    if let Some(e) = s.sources.evictions {
        evictions.get_or_create(&vec![label("map", "sources")]).inc_by(e);
    }
    reg.register("source_evictions", "Entries evicted from the full per-source map (at the last scan)", evictions);
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

type Labels = Vec<(String, String)>;
type U64Counter = Counter<u64, std::sync::atomic::AtomicU64>;
type U64Gauge = Gauge<u64, std::sync::atomic::AtomicU64>;
type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type F64Counter = Counter<f64, std::sync::atomic::AtomicU64>;

fn label(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// Packets and bytes per class and verdict, and the limit of limited classes.
fn register_class_families(reg: &mut Registry, classes: &[ClassSnapshot]) {
    let pkts = Family::<Labels, U64Counter>::default();
    let bytes = Family::<Labels, U64Counter>::default();
    let limit = Family::<Labels, U64Gauge>::default();
    let (throttle, distress) = (Family::<Labels, F64Gauge>::default(), Family::<Labels, F64Counter>::default());
    let harm = Family::<Labels, U64Counter>::default();
    let (answering, cookies) = (Family::<Labels, U64Gauge>::default(), Family::<Labels, U64Counter>::default());
    for c in classes {
        let t = &c.totals;
        // Every classified packet gets exactly one verdict: the sum over verdicts is what the class saw.
        for (verdict, p, b) in [
            ("admitted", t.admitted_pkts, t.admitted_bytes),
            ("dropped_rate", t.dropped_rate_pkts, t.dropped_rate_bytes),
            ("dropped_blocked", t.dropped_blocked_pkts, t.dropped_blocked_bytes),
            ("dropped_share", t.dropped_share_pkts, t.dropped_share_bytes),
            ("syn_cookie", t.synack_pkts, t.synack_bytes),
            ("dropped_noconn", t.dropped_noconn_pkts, t.dropped_noconn_bytes),
        ] {
            let l = vec![label("class", &c.name), label("verdict", verdict)];
            pkts.get_or_create(&l).inc_by(p);
            bytes.get_or_create(&l).inc_by(b);
        }
        let l = vec![label("class", &c.name)];
        if let Some(r) = c.rate_pps {
            limit.get_or_create(&l).set(r);
        }
        if let Some(t) = c.throttle_pps {
            throttle.get_or_create(&l).set(t);
        }
        if let Some(d) = c.distress_secs {
            distress.get_or_create(&l).inc_by(d);
        }
        if let Some(n) = c.dropped_with_room_pkts {
            harm.get_or_create(&l).inc_by(n);
        }
        if let Some(g) = &c.syn_guard {
            answering.get_or_create(&l).set(u64::from(g.answering));
            for (result, n) in [("valid", t.cookies_valid), ("invalid", t.cookies_invalid)] {
                cookies.get_or_create(&vec![label("class", &c.name), label("result", result)]).inc_by(n);
            }
        }
    }
    let what = "1 while the gate answers the class's TCP SYNs with its own cookies (SYN cookies at the driver), else 0";
    reg.register("syn_guard_answering", what, answering);
    let what = "ACKs to a guarded class's listener: with a valid gate cookie (the connection completed) or without";
    reg.register("syn_cookie_acks", what, cookies);
    reg.register("class_packets", "Packets per class and verdict (their sum is every packet of the class)", pkts);
    reg.register("class_bytes", "Bytes per class and verdict", bytes);
    reg.register("class_rate_limit_packets_per_second", "Configured packets/s limit of limited classes", limit);
    let what = "The budget's throttle on the class while a service of higher priority is or was in distress";
    reg.register("class_throttle_packets_per_second", what, throttle);
    let what = "Time the class's service showed distress (socket drops or queue, accept queue, listen overflows)";
    reg.register("class_distress_seconds", what, distress);
    let what =
        "Packets the gate dropped while the class's service had room (no distress) and only sluice's own limit applied";
    reg.register("class_dropped_with_room_packets", what, harm);
    let kernel = Family::<Labels, U64Counter>::default();
    for c in classes {
        for d in &c.kernel_drops {
            let l = vec![label("class", &c.name), label("stage", &d.stage), label("reason", &d.reason)];
            kernel.get_or_create(&l).inc_by(d.packets);
        }
    }
    let what =
        "Packets of a class the kernel dropped after the gate admitted them, by receive stage and kernel drop reason";
    reg.register("kernel_dropped_packets", what, kernel);
    let (active, known, quota) = (
        Family::<Labels, F64Gauge>::default(),
        Family::<Labels, F64Gauge>::default(),
        Family::<Labels, U64Gauge>::default(),
    );
    for c in classes {
        let Some(x) = &c.sources else { continue };
        let l = vec![label("class", &c.name)];
        active.get_or_create(&l).set(x.active_per_epoch);
        if let Some(k) = x.known {
            known.get_or_create(&l).set(k as f64);
        }
        if let Some(q) = x.quota {
            quota.get_or_create(&l).set(q as u64);
        }
    }
    reg.register("class_sources_active", "Distinct unknown sources per 10 ms epoch (mean over a second)", active);
    reg.register("class_sources_known", "Known sources of the class (clients it answered while healthy)", known);
    reg.register(
        "class_source_quota_packets",
        "One unknown source's share, packets per 10 ms epoch, paced by the gate (limited classes)",
        quota,
    );
}

/// The controller's view of each auto class.
fn register_auto_families(reg: &mut Registry, classes: &[ClassSnapshot]) {
    let (pps, queue, lost, state) = (
        Family::<Labels, F64Gauge>::default(),
        Family::<Labels, F64Gauge>::default(),
        Family::<Labels, F64Gauge>::default(),
        Family::<Labels, F64Gauge>::default(),
    );
    for c in classes {
        let Some(a) = &c.auto else { continue };
        let class = || vec![label("class", &c.name)];
        let kind = |k: &str| vec![label("class", &c.name), label("kind", k)];
        pps.get_or_create(&kind("capacity")).set(a.capacity_pps);
        pps.get_or_create(&kind("target")).set(a.target_pps);
        pps.get_or_create(&kind("rate")).set(a.rate_pps.unwrap_or(f64::INFINITY));
        queue.get_or_create(&class()).set(a.queued_bytes as f64);
        lost.get_or_create(&class()).set(a.lost_secs);
        state.get_or_create(&vec![label("class", &c.name), label("algo", &a.algo), label("state", &a.state)]).set(1.0);
    }
    let what = "Auto classes: capacity estimate, controller target (all auto classes) and the class's current rate";
    reg.register("auto_rate_packets_per_second", what, pps);
    reg.register("auto_socket_queued_bytes", "Auto classes: bytes queued in the class's sockets", queue);
    reg.register("auto_signals_lost_seconds", "Auto classes: seconds without signals (holding, then fallback)", lost);
    reg.register("auto_state", "Auto classes: the controller's state (value 1 on the current state)", state);
}

/// The same metrics in the Prometheus text format 0.0.4, for scrapers that
/// do not ask for OpenMetrics (curl, promtool, older Prometheus): there a
/// counter family is named with its `_total` suffix, there is no `# UNIT`
/// line and no `# EOF`.
pub fn prometheus_text_004(s: &Snapshot) -> String {
    openmetrics_to_004(&prometheus_text(s))
}

/// Check a text-format 0.0.4 exposition against the rules `promtool check
/// metrics` enforces that apply here: every family has HELP and TYPE; a
/// counter's name ends in `_total` and a gauge's does not; every sample
/// belongs to the family declared before it. Returns the families
/// (name, type) or the first broken rule.
pub fn lint_004(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut families: Vec<(String, String)> = vec![];
    let mut helped: Vec<String> = vec![];
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            if help.trim().is_empty() {
                return Err(format!("{name}: no help text"));
            }
            helped.push(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(format!("bad TYPE line: {line}"))?;
            if !helped.iter().any(|h| h == name) {
                return Err(format!("{name}: no help text"));
            }
            match (kind, name.ends_with("_total")) {
                ("counter", false) => return Err(format!("{name}: a counter's name must end in _total")),
                ("gauge", true) => {
                    return Err(format!("{name}: a gauge must not end in _total (it reads as a counter)"))
                }
                _ => {}
            }
            families.push((name.to_string(), kind.to_string()));
        } else if line.starts_with('#') {
            return Err(format!("unexpected comment line: {line}"));
        } else {
            let sample = line.split(['{', ' ']).next().unwrap_or("");
            match families.last() {
                Some((name, _)) if name == sample => {}
                _ => return Err(format!("{sample}: a sample outside its family (no HELP/TYPE before it)")),
            }
        }
    }
    Ok(families)
}

fn openmetrics_to_004(om: &str) -> String {
    let counters: Vec<&str> = om.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(&name).then(|| format!("{tag}{name}_total {tail}"))
        });
        out += renamed.as_deref().unwrap_or(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        let cfg = crate::config::from_flags(&["dns:priority=0,rate=1k,match=udp:53".into()]).unwrap();
        let mut classes = class_snapshots(&cfg);
        classes[0].totals = ClassTotals { seen_pkts: 10, admitted_pkts: 7, dropped_rate_pkts: 3, ..Default::default() };
        classes[1].totals.seen_pkts = 5;
        classes[1].totals.admitted_pkts = 5;
        Snapshot {
            version: SNAPSHOT_VERSION,
            interface: "veth0".into(),
            ifindex: 3,
            xdp_mode: "native".into(),
            prog_id: 42,
            pid: 1,
            uptime_secs: 3661.0,
            started_unix: 1.7e9,
            config_file: None,
            reloads: 0,
            last_reload_error: None,
            classes,
            global: GlobalTotals { non_ip_pass: 2, malformed_drop: 1, ..Default::default() },
            daemon_cpu_secs: 1.5,
            daemon_cpu_pct: 0.4,
            daemon_rss_bytes: None,
            discover: true,
            distress: None,
            signals_unreadable: None,
            sources: Default::default(),
            readers: vec![],
            cpu_away: None,
            attached: true,
            observe: false,
        }
    }

    #[test]
    fn status_metrics_and_the_sources_table_show_source_fairness() {
        let mut s = snap();
        s.classes[0].totals.dropped_share_pkts = 40;
        s.classes[0].sources = Some(crate::sources::ClassSources {
            learning: false,
            quota: Some(12),
            plen4: 24,
            plen6: 48,
            active_per_epoch: 300.0,
            known: Some(3),
            tracked: Some(900),
            top: vec![crate::sources::TopSource { prefix: "192.0.2.0/24".into(), drops: 40, pkts: 30, epoch: 9 }],
            ..Default::default()
        });
        s.sources =
            crate::sources::SourcesMap { capacity: 1024, entries: Some(900), evictions: Some(7), ..Default::default() };
        let t = render_table(&s);
        assert!(t.contains("SOURCES") && t.contains("/24 /48") && t.contains("900 of 1024 entries, 7 evicted"), "{t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_class_source_quota_packets{class=\"dns\"} 12"), "{m}");
        assert!(m.contains("verdict=\"dropped_share\"} 40"), "{m}");
        assert!(m.contains("sluice_source_evictions_total{map=\"sources\"} 7"), "{m}");
        let c = crate::sources::render_class(&s, "dns").unwrap();
        assert!(
            c.contains("quota 12 per 10 ms epoch (paced), counted at /24 /48") && c.contains("192.0.2.0/24"),
            "{c}"
        );
        assert!(crate::sources::render_class(&s, "nope").unwrap_err().contains("no class named"));
        let d = crate::sources::render_class(&s, "default").unwrap();
        assert!(d.contains("no source state"), "{d}");
    }

    #[test]
    fn status_shows_discovered_classes_and_the_budget() {
        let mut s = snap();
        s.classes[0].discovered = Some("nsd pid 7 has nice 0: priority 20+0 = 20".into());
        s.classes[1].throttle_pps = Some(1500.0);
        s.distress = Some("priority 20: socket queue".into());
        let t = render_table(&s);
        assert!(t.contains("discovered dns: nsd pid 7 has nice 0"), "{t}");
        assert!(t.contains("in distress (priority 20: socket queue)"), "{t}");
        assert!(t.contains("default throttled to 1500/s"), "{t}");
        s.discover = false;
        assert!(render_table(&s).contains("discovery off"));
    }

    #[test]
    fn unreadable_signals_are_shown_and_said_stale_after_a_second() {
        let mut s = snap();
        assert!(!render_table(&s).contains("SIGNALS UNREADABLE"), "nothing while they are read");
        s.signals_unreadable = Some((0.3, "sock_diag: EPERM".into()));
        let t = render_table(&s);
        assert!(t.contains("SIGNALS UNREADABLE for 0.3 s (sock_diag: EPERM): the last limits are kept for now"), "{t}");
        s.signals_unreadable = Some((4.0, "sock_diag: EPERM".into()));
        assert!(render_table(&s).contains("stale: throttles released, auto classes unlimited"), "{}", render_table(&s));
    }

    #[test]
    fn auto_classes_show_the_controllers_view() {
        let mut s = snap();
        s.classes[0].auto = Some(AutoStatus {
            algo: "knee".into(),
            state: "tracking".into(),
            capacity_pps: 91_000.0,
            target_pps: 90_500.0,
            rate_pps: Some(90_500.0),
            sockets: 1,
            queued_bytes: 53_000,
            rcvbuf_bytes: 212_992,
            ..Default::default()
        });
        let t = render_table(&s);
        assert!(t.contains("AUTO CLASS"), "{t}");
        let line = t.lines().find(|l| l.starts_with("dns ") && l.contains("knee")).expect(&t);
        for want in ["tracking", "91.0k", "90.5k", "24%"] {
            assert!(line.contains(want), "{want} missing in {line}");
        }
        assert!(t.contains("daemon CPU 0.4%"));
        let p = prometheus_text(&s);
        assert!(p.contains(r#"sluice_auto_rate_packets_per_second{class="dns",kind="capacity"} 91000"#), "{p}");
        assert!(p.contains(r#"sluice_auto_state{class="dns",algo="knee",state="tracking"} 1"#), "{p}");
        // A snapshot of an older daemon (no auto fields) still parses.
        let mut v = serde_json::to_value(snap()).unwrap();
        v.as_object_mut().unwrap().remove("daemon_cpu_secs");
        v["classes"][0].as_object_mut().unwrap().remove("auto");
        assert!(serde_json::from_value::<Snapshot>(v).is_ok());
    }

    /// Bad input (issue 21): a class whose sockets cannot be read gets a
    /// line saying so and what its rate is, and a class with sockets none.
    #[test]
    fn a_class_with_no_socket_to_read_says_so_and_what_its_rate_is() {
        let mut s = snap();
        let auto = |state: &str, sockets, rate_pps| AutoStatus {
            algo: "knee".into(),
            state: state.into(),
            sockets,
            rate_pps,
            lost_secs: 1.5,
            ..Default::default()
        };
        s.classes[0].auto = Some(auto("tracking", 1, None));
        assert!(!render_table(&s).contains("NO SIGNAL"), "{}", render_table(&s));
        s.classes[0].auto = Some(auto("holding", 0, Some(12_000.0)));
        let t = render_table(&s);
        let line = t.lines().find(|l| l.starts_with("NO SIGNAL: dns")).expect(&t);
        assert!(line.contains("for 1.5 s") && line.contains("its last rate (12.0k/s) is held"), "{line}");
        s.classes[0].auto = Some(auto("fallback", 0, None));
        let t = render_table(&s);
        assert!(t.contains("its fallback applies (unlimited)"), "{t}");
        s.classes[0].auto = Some(auto("starting", 0, None));
        assert!(render_table(&s).contains("not limited on what it cannot see (unlimited)"));
    }

    #[test]
    fn json_round_trip_and_verdict_total() {
        let s = snap();
        let back: Snapshot = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(s.verdict_total(), 7 + 3 + 5 + 2 + 1);
    }

    #[test]
    fn table_and_metrics_show_classes() {
        let s = snap();
        let t = render_table(&s);
        assert!(t.contains("up 1h01m01s"), "{t}");
        assert!(t.contains("default*"), "{t}");
        assert!(t.contains("1000 pps"), "{t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_class_packets_total{class=\"dns\",verdict=\"dropped_rate\"} 3"), "{m}");
        assert!(m.contains("# TYPE sluice_class_packets counter"), "a _total family is a counter: {m}");
        assert!(m.contains("sluice_class_rate_limit_packets_per_second{class=\"dns\"} 1000"), "{m}");
        assert!(m.contains("sluice_start_time_seconds 1700000000.0"), "the start, not now - uptime: {m}");
        assert!(m.contains("sluice_unclassified_packets_total{verdict=\"malformed_drop\"} 1"), "{m}");
    }

    /// Do no harm (issue 21): drops while the service had room are said in
    /// status and served; observe mode is said at the top.
    #[test]
    fn self_inflicted_drops_and_observe_mode_are_shown() {
        let mut s = snap();
        assert!(!render_table(&s).contains("SELF-INFLICTED") && !render_table(&s).contains("OBSERVE"));
        s.classes[0].dropped_with_room_pkts = Some(5);
        (s.observe, s.global.observed_pass) = (true, 7);
        let t = render_table(&s);
        assert!(t.contains("SELF-INFLICTED: the gate dropped 5 packets of dns while its service had room"), "{t}");
        assert!(t.contains("OBSERVE MODE") && t.contains("7 packets passed so far"), "{t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_class_dropped_with_room_packets_total{class=\"dns\"} 5"), "{m}");
        assert!(m.contains("sluice_flagged_packets_total{flag=\"observed_pass\"} 7"), "{m}");
    }

    #[test]
    fn a_guarded_class_says_what_its_syn_cookies_did() {
        let mut s = snap();
        let g = SynGuardStatus { policy: "auto".into(), answering: false, available: true };
        s.classes[0].syn_guard = Some(g.clone());
        assert!(!render_table(&s).contains("SYN COOKIES"), "never answered: no line");
        s.classes[0].syn_guard = Some(SynGuardStatus { answering: true, ..g.clone() });
        (s.classes[0].totals.synack_pkts, s.classes[0].totals.cookies_valid) = (900, 12);
        let t = render_table(&s);
        assert!(t.contains("SYN COOKIES: the gate answers its SYNs now for dns (syn_cookies = auto): SYN-ACKs sent 900, valid cookies back 12"), "{t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_syn_guard_answering{class=\"dns\"} 1"), "{m}");
        assert!(m.contains("sluice_syn_cookie_acks_total{class=\"dns\",result=\"valid\"} 12"), "{m}");
        assert!(m.contains("sluice_class_packets_total{class=\"dns\",verdict=\"syn_cookie\"} 900"), "{m}");
        s.classes[0].syn_guard = Some(SynGuardStatus { available: false, ..g });
        assert!(render_table(&s).contains("SYN COOKIES: unavailable"));
    }

    /// Regression: _total families were served as gauges, and two counters had no help
    /// text for the 0.0.4 parser (their HELP named the family without _total).
    #[test]
    fn the_004_text_follows_prometheus_conventions() {
        let text = prometheus_text_004(&snap());
        let families = lint_004(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let kind = |n: &str| families.iter().find(|f| f.0 == n).map(|f| f.1.as_str());
        assert_eq!(kind("sluice_class_packets_total"), Some("counter"));
        assert_eq!(kind("sluice_daemon_cpu_seconds_total"), Some("counter"));
        assert_eq!(kind("sluice_start_time_seconds"), Some("gauge"));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        // The rules catch what they are for.
        assert!(lint_004("# HELP a_total x\n# TYPE a_total gauge\na_total 1\n").is_err());
        assert!(lint_004("# HELP a x\n# TYPE a counter\na_total 1\n").is_err());
        assert!(lint_004("# TYPE a gauge\na 1\n").is_err());
        assert!(lint_004("# HELP a x\n# TYPE a gauge\nb 1\n").is_err());
    }

    #[test]
    fn rates() {
        let a = ClassTotals { seen_pkts: 100, admitted_pkts: 50, dropped_rate_pkts: 50, ..Default::default() };
        let b = ClassTotals { seen_pkts: 300, admitted_pkts: 100, dropped_rate_pkts: 200, ..Default::default() };
        let r = ClassRates::between(&a, &b, 2.0);
        assert_eq!((r.seen_pps, r.admitted_pps, r.dropped_pps), (100.0, 25.0, 75.0));
        assert_eq!(human(1_234_567.0), "1.23M");
    }
}
