//! Statistics the daemon serves. This file: the snapshot, plain data sent
//! as JSON over the Unix socket; `table.rs`: the table `sluice status`
//! prints; `metrics.rs`: the Prometheus text. Pure: no kernel here.
use serde::{Deserialize, Serialize};

pub use crate::base::fmt::human;
pub use crate::dataplane::gate::counters::{ClassRates, ClassTotals, GlobalTotals};
use crate::policy::config::{Config, Limit};
pub use crate::policy::syn_guard::SynGuardStatus;
pub use metrics::{prometheus_text, prometheus_text_004};
pub use table::{render_sources_class, render_table};

pub mod families;
mod metrics;
pub mod schema;
mod table;

/// Version of the snapshot JSON; bump on incompatible changes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// The auto controller's state for one class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AutoStatus {
    /// "capacity" or "pno".
    pub algo: String,
    /// "cruising", "probing", "backoff", "holding", "fallback", ... (controller::CtlState).
    pub state: String,
    /// Estimated capacity of this class's service (pkt/s).
    pub capacity_pps: f64,
    /// What this class's controller would admit while engaged (pkt/s).
    pub target_pps: f64,
    /// This class's current rate (pkt/s); None = unlimited (fallback).
    pub rate_pps: Option<f64>,
    /// The rule that engaged the controller ("loss-run", "surge",
    /// "excess", "steady-loss", "newcomers"); None while its service shows no distress.
    #[serde(default)]
    pub engaged_by: Option<String>,
    /// The share of its capacity estimate the class keeps under any budget throttle (0 to 1).
    pub min_share: f64,
    /// The class's UDP sockets found by sock_diag.
    pub sockets: u32,
    /// Bytes queued in the fullest of the class's sockets.
    pub queued_bytes: u64,
    /// The fullest socket's receive buffer, bytes.
    pub rcvbuf_bytes: u64,
    /// Seconds without signals (holding, then fallback).
    pub lost_secs: f64,
}

/// A TCP class judged on its answers' delay (`policy::late`): a class with
/// TCP ports, `rate = "auto"` and no UDP port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LateStatus {
    /// The last window's p90 answer delay, ms (None: no window judged yet).
    pub window_p90_ms: Option<f64>,
    /// The calm windows' p90, ms (None: not learned yet; until then the class is never engaged).
    pub calm_p90_ms: Option<f64>,
    /// The last window's p90 of its known clients' answers alone, ms (a
    /// flood that pipelines its requests is answered at once and can hide
    /// what they wait).
    #[serde(default)]
    pub known_window_p90_ms: Option<f64>,
    /// The calm windows' p90 of its known clients' answers, ms (None: not
    /// learned yet; once a window of theirs was in time against the
    /// class's calm, their windows are judged late against that).
    #[serde(default)]
    pub known_calm_p90_ms: Option<f64>,
    /// The last window of either was late (over 8 times its calm p90 and over 8 ms).
    pub late: bool,
    /// The last window of either was slow (over 3 times its calm p90 and
    /// over 2 ms; a late one is slow too): the class learns nobody meanwhile.
    #[serde(default)]
    pub slow: bool,
    /// Limited for its late answers, at this rate (pkt/s): its known clients
    /// go first, its unknown sources' tier is cut while the answers are late.
    /// None: not engaged (unlimited).
    pub rate_pps: Option<f64>,
    /// The share of its calm arrivals from known clients (None: too few
    /// sampled yet): under 0.1 (`fair::ROOM_KNOWN`) it has nobody to serve
    /// first, and late answers engage it only while its service is busy.
    #[serde(default)]
    pub known_share: Option<f64>,
    /// The CPUs its service ran on were busy at the daemon's last look (at
    /// least 0.9 of their time), at least 0.6 of that its own work (its
    /// processes' and its local backends' time, and those CPUs' softirq
    /// work; a neighbour's time left out): late answers are then its load's, and engage it with nobody known, each source held to its
    /// share of the service's work. False: seen idle (late answers then
    /// wait on something else, and nothing is cut for them); None: its
    /// threads were not read, or no reading was there to judge from
    /// (known clients then engage it as before).
    #[serde(default)]
    pub busy: Option<bool>,
    /// The reading `busy` was judged from: the share of their time the
    /// CPUs its service ran on were busy (None: not read).
    #[serde(default)]
    pub cpus_busy: Option<f64>,
    /// ... and the service's own share of that busy time (its processes'
    /// time and those CPUs' softirq work; None: not read).
    #[serde(default)]
    pub own_share: Option<f64>,
    /// Times late answers engaged the class since the daemon started (the
    /// rest of this object is its state now: a flood that came and went
    /// leaves it unlimited again). None: a daemon that did not count them.
    #[serde(default)]
    pub engagements: Option<u64>,
}

/// One class in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassSnapshot {
    /// The class's index in the config's list.
    pub id: usize,
    /// The gate's id of the class (its index in the gate's maps; it stays
    /// while the class exists, when `id` moves). None: no gate.
    #[serde(default)]
    pub gate_id: Option<u32>,
    /// The class's name (a discovered class: PROCESS/PROTO:PORT).
    pub name: String,
    /// 0 = highest.
    pub priority: u8,
    /// "unlimited", "blocked" or "RATE pps".
    pub limit: String,
    /// Packets/s limit, if the class has one.
    pub rate_pps: Option<u64>,
    /// The bucket's depth in packets, if the class has a rate.
    pub burst: Option<u64>,
    /// The class of packets no other class matches (one per config).
    pub is_default: bool,
    /// Rates over the last second.
    pub rates: ClassRates,
    /// Counters since the gate was loaded (a class keeps them through reloads).
    pub totals: ClassTotals,
    /// The controller's view, for `rate = "auto"` classes.
    #[serde(default)]
    pub auto: Option<AutoStatus>,
    /// Its answers' delay, for a TCP auto class (None: not such a class).
    #[serde(default)]
    pub late: Option<LateStatus>,
    /// For a class made by discovery: where its priority came from.
    #[serde(default)]
    pub discovered: Option<String>,
    /// The budget's throttle on the class (packets/s), while a service of
    /// higher priority is or was in distress; None = not throttled.
    #[serde(default)]
    pub throttle_pps: Option<f64>,
    /// Source fairness and learning, for a class that is limited or learns.
    #[serde(default)]
    pub sources: Option<crate::signals::source_tables::ClassSources>,
    /// Packets the kernel dropped after the gate admitted them, by stage and
    /// drop reason (since the daemon started; empty if the tracer could not load).
    #[serde(default)]
    pub kernel_drops: Vec<KernelDrop>,
    /// Packets of the class's known clients that the receive path dropped
    /// for want of room after the gate admitted them (a full socket buffer,
    /// the protocol's memory limit, a full per-CPU backlog), since the
    /// daemon started: the gate should have dropped a stranger's instead;
    /// its target is 0 (None: no tracer to count them).
    #[serde(default)]
    pub known_lost_pkts: Option<u64>,
    /// Seconds (in 10 ms ticks) the class's service showed distress since
    /// the daemon started (None: the class has no service the daemon reads).
    #[serde(default)]
    pub distress_secs: Option<f64>,
    /// Packets the gate dropped in stretches (0.5 s or more) of ticks where the class's service had room
    /// (its UDP sockets showed no distress, and an auto class admitted under
    /// 90% of its capacity estimate) and nothing but its own limit applied
    /// (no static rate, no budget throttle): loss sluice inflicted on a
    /// healthy service. None: the class has no UDP socket the daemon reads.
    #[serde(default)]
    pub dropped_with_room_pkts: Option<u64>,
    /// SYN cookies at the driver, for a class with TCP ports or
    /// `syn_cookies = "on"` (None: neither).
    #[serde(default)]
    pub syn_guard: Option<SynGuardStatus>,
    /// The share (0-1) of the busiest CPU its service ran on that receive
    /// work for lower classes took in the last window: the CPU signal
    /// (None: not measured: no tracer, or no busy thread of its service seen).
    #[serde(default)]
    pub rx_cpu_taken: Option<f64>,
    /// The largest `rx_cpu_taken` since the class list last changed.
    #[serde(default)]
    pub rx_cpu_taken_max: Option<f64>,
}

/// Drops of one class at one kernel stage for one reason (made by `crate::dataplane::trace`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KernelDrop {
    /// The receive stage the kernel dropped at (driver, stack, socket).
    pub stage: String,
    /// The kernel's drop reason (NO_SOCKET, SOCKET_RCVBUFF, CPU_BACKLOG, ...).
    pub reason: String,
    /// Packets dropped there for that reason.
    pub packets: u64,
}

/// What `sluice status` shows: the daemon's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Snapshot {
    /// The snapshot's schema version (1).
    pub version: u32,
    /// The interface the gate is attached to.
    pub interface: String,
    /// Its interface index.
    pub ifindex: u32,
    /// "native" or "generic".
    pub xdp_mode: String,
    /// The gate's BPF program id (as bpftool shows it).
    pub prog_id: u32,
    /// The daemon's process id.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_secs: f64,
    /// When the gate was attached (Unix time, seconds).
    #[serde(default)]
    pub started_unix: f64,
    /// The config file in force; None: flags and discovery only.
    pub config_file: Option<String>,
    /// Reloads applied since the start (SIGHUP, or a change discovery found).
    pub reloads: u64,
    /// The error of the last refused reload, if the last reload failed.
    pub last_reload_error: Option<String>,
    /// Every class, in the config's order.
    pub classes: Vec<ClassSnapshot>,
    pub global: GlobalTotals,
    /// CPU time the daemon used since its start (user + system, seconds).
    #[serde(default)]
    pub daemon_cpu_secs: f64,
    /// The daemon's share of one CPU since the previous statistics refresh (100 ms earlier), %.
    #[serde(default)]
    pub daemon_cpu_pct: f64,
    /// Of daemon_cpu_secs, the softirq work that ran while one of its threads
    /// was on the CPU (this kernel charges it to the thread), s; None: not
    /// counted (no tracer, or the daemon in a PID namespace of its own). Counted while the tracer's
    /// softirq pair is attached: while lower classes send over 1000
    /// packets/s beside a running service, or a throttle stands (a flood),
    /// and 5 s after; in calm it is not, and adds nothing.
    #[serde(default)]
    pub daemon_softirq_secs: Option<f64>,
    /// The softirq part's share over the last second, % of one CPU (None: not counted).
    #[serde(default)]
    pub daemon_softirq_pct: Option<f64>,
    /// The daemon's resident memory (VmRSS), bytes; None if it could not be read.
    /// The gate's maps are kernel memory, not in it (see `sources`).
    #[serde(default)]
    pub daemon_rss_bytes: Option<u64>,
    /// The control loop's tick now (ms): 10 while something needs control,
    /// longer while all is calm (None: an older daemon).
    #[serde(default)]
    pub tick_ms: Option<f64>,
    /// Times the gate woke a calm loop (a class's arrivals jumped).
    #[serde(default)]
    pub wakes: u64,
    /// How long the last of those wakes took from the gate's call (in the
    /// packet path) to the loop, and the longest so far, ms (None: no wake yet).
    #[serde(default)]
    pub wake_ms: Option<f64>,
    /// The longest of those wakes so far, ms (None: no wake yet).
    #[serde(default)]
    pub wake_max_ms: Option<f64>,
    /// The gate's clock (CLOCK_MONOTONIC ns) at the last of those wakes: a
    /// bench subtracts a flood's start from it (None: no wake yet).
    #[serde(default)]
    pub wake_gate_ns: Option<u64>,
    /// Ticks the control loop ran since the start.
    #[serde(default)]
    pub ticks: u64,
    /// Whether the daemon adds a class for each listening service.
    #[serde(default)]
    pub discover: bool,
    /// The highest priority whose service is in distress, and why (the budget).
    #[serde(default)]
    pub distress: Option<String>,
    /// The last distress the budget saw, and how many seconds ago (None:
    /// none since the start).
    #[serde(default)]
    pub last_distress: Option<(String, f64)>,
    /// Whether the daemon reads the receive work per CPU (its tracer
    /// loaded): the CPU signal and the backlog drops; false: queues only.
    #[serde(default)]
    pub rx_measured: bool,
    /// How long the services' signals have been unreadable in a row, and
    /// the last error (None: the last read worked).
    #[serde(default)]
    pub signals_unreadable: Option<(f64, String)>,
    /// The per-source map and the known sources.
    #[serde(default)]
    pub sources: crate::signals::source_tables::SourcesMap,
    /// The reuseport groups sluice steers, and their readers.
    #[serde(default)]
    pub readers: Vec<crate::dataplane::steer::GroupStatus>,
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
        let g = &self.global;
        classes + g.non_ip_pass + g.non_ip_drop + g.malformed_drop + g.malformed_pass
    }
}

/// This process's resident memory (VmRSS), bytes.
pub fn rss_bytes() -> Option<u64> {
    // statm's second field, resident pages (VmRSS): one short line, where
    // /proc/self/status renders some fifty (read every second by the daemon).
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
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
                gate_id: None,
                name: c.name.clone(),
                priority: c.priority,
                limit,
                rate_pps,
                burst,
                is_default: id == cfg.default_class,
                rates: ClassRates::default(),
                totals: ClassTotals::default(),
                auto: None,
                late: None,
                discovered: c.discovered.clone(),
                throttle_pps: None,
                rx_cpu_taken: None,
                rx_cpu_taken_max: None,
                sources: None,
                kernel_drops: Vec::new(),
                known_lost_pkts: None,
                distress_secs: None,
                dropped_with_room_pkts: None,
                syn_guard: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resident memory from statm's pages is /proc/self/status's VmRSS
    /// (read a moment apart: within a factor of 1.5, where a wrong page size
    /// or unit is off by 4 or 1,024).
    #[test]
    fn resident_memory_from_statm_matches_vmrss() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: f64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let ratio = rss_bytes().expect("statm reads") as f64 / (kb * 1024.0);
        assert!((1.0 / 1.5..1.5).contains(&ratio), "statm / VmRSS = {ratio}");
    }

    fn snap() -> Snapshot {
        let cfg = crate::policy::config::from_flags(&["dns:priority=0,rate=1k,match=udp:53".into()]).unwrap();
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
            daemon_softirq_secs: None,
            daemon_softirq_pct: None,
            discover: true,
            distress: None,
            last_distress: None,
            rx_measured: true,
            signals_unreadable: None,
            tick_ms: Some(10.0),
            wakes: 0,
            wake_ms: None,
            wake_max_ms: None,
            wake_gate_ns: None,
            ticks: 0,
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
        s.classes[0].sources = Some(crate::signals::source_tables::ClassSources {
            learning: false,
            quota: Some(12),
            plen4: 24,
            plen6: 48,
            active_per_epoch: 300.0,
            known: Some(3),
            known_held: Some(17),
            known_part: Some(29_491),
            tracked: Some(900),
            top: vec![crate::signals::source_tables::TopSource {
                prefix: "192.0.2.0/24".into(),
                drops: 40,
                pkts: 30,
                epoch: 9,
            }],
            ..Default::default()
        });
        s.sources = crate::signals::source_tables::SourcesMap {
            capacity: 1024,
            entries: Some(900),
            evictions: Some(7),
            ..Default::default()
        };
        let t = render_table(&s);
        assert!(t.contains("SOURCES") && t.contains("/24 /48") && t.contains("900 of 1024 entries, 7 evicted"), "{t}");
        assert!(t.contains("HELD/PART") && t.contains("17/29491"), "the known part's fill: {t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_class_source_quota_packets{class=\"dns\"} 12"), "{m}");
        assert!(m.contains("verdict=\"dropped_share\"} 40"), "{m}");
        assert!(m.contains("sluice_source_evictions_total{map=\"sources\"} 7"), "{m}");
        let c = render_sources_class(&s, "dns").unwrap();
        assert!(
            c.contains("quota 12 per 10 ms epoch (paced), counted at /24 /48") && c.contains("192.0.2.0/24"),
            "{c}"
        );
        assert!(render_sources_class(&s, "nope").unwrap_err().contains("no class named"));
        let d = render_sources_class(&s, "default").unwrap();
        assert!(d.contains("no source state"), "{d}");
        // Before the first scan: said once, not in each figure's place.
        s.sources.entries = None;
        let t = render_table(&s);
        assert!(t.contains("sources map: 1024 entries, not scanned yet\n"), "{t}");
        assert_eq!(t.matches("not scanned yet").count(), 1, "{t}");
    }

    #[test]
    fn status_shows_discovered_classes_and_the_budget() {
        let mut s = snap();
        s.classes[0].discovered = Some("nsd pid 7 has nice 0: priority 20+0 = 20".into());
        s.classes[1].throttle_pps = Some(1500.0);
        s.distress = Some("priority 20: socket queue".into());
        let t = render_table(&s);
        assert!(t.contains("DROP/s") && t.contains("DROP TOTAL"), "the columns say rate or total: {t}");
        assert!(t.contains("discovered dns: nsd pid 7 has nice 0"), "{t}");
        assert!(t.contains("in distress (priority 20: socket queue)"), "{t}");
        assert!(t.contains("default throttled to 1500/s"), "{t}");
        s.discover = false;
        assert!(render_table(&s).contains("discovery off"));
    }

    #[test]
    fn status_says_which_signal_fired_and_when_receive_work_is_not_measured() {
        let mut s = snap();
        s.distress = Some("priority 0: receive work on its CPUs".into());
        s.classes[0].rx_cpu_taken = Some(0.42);
        s.classes[1].rx_cpu_taken = Some(0.001);
        let t = render_table(&s);
        assert!(t.contains("in distress (priority 0: receive work on its CPUs)"), "{t}");
        assert!(t.contains("dns: receive work for lower classes took 42% of its busiest CPU"), "{t}");
        assert!(!t.contains("default: receive work"), "under 1% is not shown: {t}");
        assert!(!t.contains("not measured"), "{t}");
        s.rx_measured = false;
        assert!(render_table(&s).contains("receive work per CPU: not measured (no tracer)"));
        s.distress = None;
        s.last_distress = Some(("priority 0: receive work on its CPUs".into(), 2.5));
        let t = render_table(&s);
        assert!(
            t.contains("no service in distress now (last: priority 0: receive work on its CPUs, 2.5 s ago)"),
            "{t}"
        );
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
            algo: "capacity".into(),
            state: "cruising".into(),
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
        let line = t.lines().find(|l| l.starts_with("dns ") && l.contains("capacity")).expect(&t);
        for want in ["cruising", "91.0k", "90.5k", "24%"] {
            assert!(line.contains(want), "{want} missing in {line}");
        }
        assert!(t.contains("daemon CPU 0.4%"));
        let p = prometheus_text(&s);
        assert!(p.contains(r#"sluice_auto_rate_packets_per_second{class="dns",kind="capacity"} 91000"#), "{p}");
        assert!(p.contains(r#"sluice_auto_state{class="dns",algo="capacity",state="cruising"} 1"#), "{p}");
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
            algo: "capacity".into(),
            state: state.into(),
            sockets,
            rate_pps,
            lost_secs: 1.5,
            ..Default::default()
        };
        s.classes[0].auto = Some(auto("cruising", 1, None));
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
        let g = SynGuardStatus {
            policy: "auto".into(),
            answering: false,
            available: true,
            why_unavailable: None,
            stray_ns: None,
        };
        s.classes[0].syn_guard = Some(g.clone());
        assert!(!render_table(&s).contains("SYN COOKIES"), "never answered: no line");
        s.classes[0].syn_guard = Some(SynGuardStatus { answering: true, ..g.clone() });
        (s.classes[0].totals.synack_pkts, s.classes[0].totals.cookies_valid) = (900, 12);
        let t = render_table(&s);
        assert!(t.contains("SYN COOKIES: the gate answers its SYNs now for dns (syn_cookies = auto); totals since start: SYN-ACKs sent 900, valid cookies back 12"), "{t}");
        let m = prometheus_text(&s);
        assert!(m.contains("sluice_syn_guard_answering{class=\"dns\"} 1"), "{m}");
        assert!(m.contains("sluice_syn_cookie_acks_total{class=\"dns\",result=\"valid\"} 12"), "{m}");
        assert!(m.contains("sluice_class_packets_total{class=\"dns\",verdict=\"syn_cookie\"} 900"), "{m}");
        assert!(!t.contains("without a socket lookup"), "none sent so: no words for it");
        assert!(m.contains("sluice_syn_cookie_direct_packets_total{class=\"dns\"} 0"), "{m}");
        s.classes[0].totals.synack_direct = 850;
        assert!(render_table(&s).contains("dropped 0; 850 of the SYN-ACKs sent without a socket lookup"));
        assert!(prometheus_text(&s).contains("sluice_syn_cookie_direct_packets_total{class=\"dns\"} 850"));
        s.classes[0].totals.synack_early = 40;
        assert!(render_table(&s).contains("without a socket lookup; 40 sent before the guard engaged"));
        assert!(prometheus_text(&s).contains("sluice_syn_cookie_early_packets_total{class=\"dns\"} 40"));
        s.classes[0].totals.cookies_refused = 3;
        assert!(render_table(&s).contains("valid cookies back 12, valid cookies the kernel refused 3,"));
        let why = "net.ipv4.tcp_syncookies = 0 here";
        s.classes[0].syn_guard =
            Some(SynGuardStatus { available: false, answering: false, why_unavailable: Some(why.into()), ..g });
        let t = render_table(&s);
        assert!(t.contains("SYN COOKIES: unavailable (net.ipv4.tcp_syncookies = 0 here)"), "{t}");
    }

    /// The answer delays: a table line per timed class with its window's
    /// quantiles (each a bucket's upper edge), and a histogram in /metrics
    /// whose buckets are the gate's, cumulative, in seconds.
    #[test]
    fn answer_delays_are_shown_as_quantiles_and_served_as_a_histogram() {
        let mut s = snap();
        assert!(!render_table(&s).contains("ANSWERED IN"), "nothing timed: no section");
        assert!(!prometheus_text(&s).contains("sluice_answer_delay_seconds_bucket"), "no sample, not zeros");
        let d = &mut s.classes[0].totals.answer_delays;
        (d.samples, d.sum_ns, d.buckets[0], d.buckets[6], d.buckets[15]) = (100, 60_000_000, 90, 9, 1);
        s.classes[0].rates = ClassRates {
            answers_ps: 100.0,
            answer_p50_ms: Some(0.032768),
            answer_p99_ms: Some(2.097152),
            ..Default::default()
        };
        let t = render_table(&s);
        assert!(t.contains("ANSWERED IN"), "{t}");
        let line = t.lines().find(|l| l.starts_with("dns ") && l.contains("under")).expect("a line for dns");
        assert!(line.contains("under 0.03 ms") && line.contains("under 2 ms"), "{line}");
        s.classes[0].rates.answer_p99_ms = Some(crate::policy::delay::edge_ms(15));
        s.classes[0].rates.answer_p50_ms = None;
        let t = render_table(&s);
        let line = t.lines().find(|l| l.starts_with("dns ") && l.contains("over")).expect("a line for dns");
        assert!(line.contains("over 537 ms") && line.contains(" - "), "none in the window: '-', not 0: {line}");
        let m = prometheus_text_004(&s);
        assert!(m.contains("# TYPE sluice_answer_delay_seconds histogram"), "{m}");
        assert!(m.contains("sluice_answer_delay_seconds_bucket{le=\"0.000032768\",class=\"dns\"} 90"), "{m}");
        assert!(
            m.contains("sluice_answer_delay_seconds_bucket{le=\"0.002097152\",class=\"dns\"} 99"),
            "cumulative: {m}"
        );
        assert!(m.contains("sluice_answer_delay_seconds_bucket{le=\"+Inf\",class=\"dns\"} 100"), "{m}");
        assert!(m.contains("sluice_answer_delay_seconds_sum{class=\"dns\"} 0.06"), "{m}");
        assert!(m.contains("sluice_answer_delay_seconds_count{class=\"dns\"} 100"), "{m}");
    }

    /// A TCP class judged on its answers: a line only while its answers are
    /// late or it is limited for them, saying which and why.
    #[test]
    fn late_answers_say_why_a_tcp_class_is_limited() {
        let mut s = snap();
        s.classes[0].late =
            Some(LateStatus { window_p90_ms: Some(1.048576), calm_p90_ms: Some(0.524288), ..Default::default() });
        assert!(!render_table(&s).contains("LATE ANSWERS"), "in time and unlimited: no line");
        let late = LateStatus {
            window_p90_ms: Some(1.048576),
            calm_p90_ms: Some(0.524288),
            known_window_p90_ms: Some(268.435456),
            known_calm_p90_ms: Some(0.524288),
            late: true,
            slow: true,
            rate_pps: Some(1800.0),
            known_share: Some(0.35),
            busy: None,
            cpus_busy: None,
            own_share: None,
            engagements: Some(1),
        };
        s.classes[0].late = Some(late.clone());
        let t = render_table(&s);
        let line = t.lines().find(|l| l.starts_with("LATE ANSWERS: dns")).expect("a line for dns");
        assert!(line.contains(": p90 under 1 ms (calm: under 0.52 ms)"), "{line}");
        assert!(line.contains("known clients' p90 under 268 ms (calm: under 0.52 ms)"), "{line}");
        assert!(line.contains("limited at 1800/s"), "{line}");
        assert!(line.contains("tier is cut"), "{line}");
        s.classes[0].late = Some(LateStatus { rate_pps: None, ..late.clone() });
        let t = render_table(&s);
        assert!(t.contains("not limited yet: 2 late windows in a row engage it"), "{t}");
        s.classes[0].late = Some(LateStatus { rate_pps: None, known_share: Some(0.04), ..late.clone() });
        let t = render_table(&s);
        assert!(t.contains("too few known clients to serve first (4% of its calm arrivals, under 10%)"), "{t}");
        s.classes[0].late = Some(LateStatus { rate_pps: None, known_share: None, ..late.clone() });
        let t = render_table(&s);
        assert!(
            t.contains(
                "no known client to serve first (none answered while calm), and its service's load was not read"
            ),
            "{t}"
        );
        // Nobody known, its service busy: late answers engage it, each source to its share.
        let alone = LateStatus { known_share: None, busy: Some(true), ..late.clone() };
        s.classes[0].late = Some(LateStatus { rate_pps: None, ..alone.clone() });
        assert!(render_table(&s).contains("not limited yet: 2 late windows in a row engage it"));
        s.classes[0].late = Some(alone.clone());
        let t = render_table(&s);
        assert!(t.contains("limited at 1800/s, nobody known, each source to its share of the work"), "{t}");
        assert!(t.contains("tier is cut"), "{t}");
        s.classes[0].late = Some(LateStatus { busy: Some(false), ..alone });
        let t = render_table(&s);
        assert!(t.contains("not cut: its service is idle (late for something else"), "{t}");
        // Known clients, but the service idle: late for something else.
        let idle = LateStatus {
            rate_pps: None,
            busy: Some(false),
            cpus_busy: Some(0.31),
            own_share: Some(0.95),
            ..late.clone()
        };
        s.classes[0].late = Some(idle.clone());
        let t = render_table(&s);
        assert!(t.contains("not limited: its service is idle (its CPUs 31% busy; late for something else"), "{t}");
        // Its CPUs full, mostly of a neighbour's work: not its load.
        s.classes[0].late = Some(LateStatus { cpus_busy: Some(0.99), own_share: Some(0.25), ..idle });
        let t = render_table(&s);
        assert!(t.contains("not limited: its CPUs are full (99% busy), 25% of that its own work"), "{t}");
        // Slow, not late: a line saying the class learns nobody meanwhile.
        s.classes[0].late = Some(LateStatus { rate_pps: None, late: false, ..late });
        let t = render_table(&s);
        assert!(t.contains("slower than usual, not late: learning no client meanwhile"), "{t}");
    }

    /// Regression: _total families were served as gauges, and two counters had no help
    /// text for the 0.0.4 parser (their HELP named the family without _total). The
    /// families' kinds are checked against promtool's rules on a running daemon's
    /// text in `tests/integration.rs` (the rules live in the test kit).
    #[test]
    fn the_004_text_follows_prometheus_conventions() {
        let text = prometheus_text_004(&snap());
        assert!(text.contains("# TYPE sluice_class_packets_total counter"), "{text}");
        assert!(text.contains("# TYPE sluice_daemon_cpu_seconds_total counter"), "{text}");
        assert!(text.contains("# TYPE sluice_start_time_seconds gauge"), "{text}");
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
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
