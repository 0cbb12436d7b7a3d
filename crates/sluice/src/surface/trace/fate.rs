//! Where a class's packets went: the pure half of tracing (no root needed).
//!
//! Takes the counts `bpf/trace.bpf.c` kept (packets in at each stage, drops
//! by kernel drop reason, latency sums and histograms of sampled packets)
//! plus the gate's verdicts, and makes the report: per class, a ledger that
//! closes (every packet the gate admitted is queued to a socket or dropped at
//! a named stage for a named reason, the rest is shown as unaccounted), and
//! per interval the latency as p50/p99 and mean +- 95% interval.
use serde::{Deserialize, Serialize};

use crate::bpf_intf::SLUICE_SQ_SHIFT;
use crate::dataplane::trace::LatencySums;

/// The stages a packet passes after the gate, in order (`enum sluice_stage`),
/// plus the two where only drops are seen: the per-CPU backlog (between
/// driver and stack) and the transport (between stack and socket queue).
pub const STAGES: [&str; 4] = ["driver", "stack", "queued", "read"];

/// Intervals timed on sampled packets (`enum sluice_interval`).
pub const INTERVALS: [&str; 3] = ["driver->stack", "stack->queued", "queued->read"];

/// The stage a kernel drop reason belongs to (the reason as the kernel names
/// it, without the SKB_DROP_REASON_ prefix).
pub fn stage_of(reason: &str) -> &'static str {
    const SOCKET: [&str; 5] = ["SOCKET_RCVBUFF", "SOCKET_BACKLOG", "SOCKET_FILTER", "PROTO_MEM", "TCP_ZEROWINDOW"];
    const READ: [&str; 2] = ["SOCKET_CLOSE", "QUEUE_PURGE"];
    const DRIVER: [&str; 9] =
        ["XDP", "FULL_RING", "DEV_HDR", "DEV_READY", "NOMEM", "HDR_TRUNC", "PKT_TOO_SMALL", "LOCAL_MAC", "PFMEMALLOC"];
    if SOCKET.contains(&reason) {
        "socket"
    } else if READ.contains(&reason) {
        "read"
    } else if reason == "CPU_BACKLOG" {
        "backlog"
    } else if DRIVER.contains(&reason) || reason.starts_with("TC_") || reason.starts_with("MAC_") {
        "driver"
    } else if reason == "NO_SOCKET" || reason == "UDP_CSUM" || reason.starts_with("TCP_") {
        "transport"
    } else if reason.starts_with("IP") || reason.starts_with("FRAG") || reason.starts_with("NETFILTER") {
        "ip"
    } else {
        "stack"
    }
}

pub use crate::surface::stats::KernelDrop as Drop;

impl Drop {
    /// `packets` dropped for `reason`, at the reason's stage (`stage_of`).
    pub fn new(reason: String, packets: u64) -> Drop {
        Drop { stage: stage_of(&reason).to_string(), reason, packets }
    }
}

/// The gate's verdicts on a class while the trace ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GateCounts {
    pub admitted: u64,
    pub dropped: u64,
    /// SYNs the gate answered itself with a cookie SYN-ACK (neither
    /// admitted nor dropped), and the ACKs it checked for a gate cookie.
    #[serde(default)]
    pub syn_answered: u64,
    #[serde(default)]
    pub cookies_valid: u64,
    #[serde(default)]
    pub cookies_invalid: u64,
    /// Part of `dropped`: ACKs and RSTs of no connection while the SYN guard answered.
    #[serde(default)]
    pub dropped_noconn: u64,
}

impl GateCounts {
    /// What the gate did between two reads of a class's counters.
    pub fn between(
        before: &crate::dataplane::gate::counters::ClassTotals,
        after: &crate::dataplane::gate::counters::ClassTotals,
    ) -> GateCounts {
        GateCounts {
            admitted: after.admitted_pkts.saturating_sub(before.admitted_pkts),
            dropped: after.dropped_pkts().saturating_sub(before.dropped_pkts()),
            syn_answered: after.synack_pkts.saturating_sub(before.synack_pkts),
            cookies_valid: after.cookies_valid.saturating_sub(before.cookies_valid),
            cookies_invalid: after.cookies_invalid.saturating_sub(before.cookies_invalid),
            dropped_noconn: after.dropped_noconn_pkts.saturating_sub(before.dropped_noconn_pkts),
        }
    }

    fn any_syn(&self) -> bool {
        self.syn_answered + self.cookies_valid + self.cookies_invalid + self.dropped_noconn > 0
    }
}

/// Packets in at each stage (`STAGES`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StageCounts {
    pub driver: u64,
    pub stack: u64,
    pub queued: u64,
    /// Datagrams (TCP: reads) the application took, counted by its socket's port.
    pub read: u64,
}

impl StageCounts {
    pub fn from_array(a: [u64; 4]) -> StageCounts {
        StageCounts { driver: a[0], stack: a[1], queued: a[2], read: a[3] }
    }
}

/// Where the packets that entered after the gate went.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// What entered: the gate's admitted count, or (no gate) the driver stage's.
    pub applied: u64,
    /// Reached a socket's receive queue.
    pub queued: u64,
    /// Dropped by the kernel after the gate (every reason).
    pub dropped: u64,
    /// applied - queued - dropped: neither seen queued nor seen dropped
    /// (negative: more seen than entered, e.g. packets already in flight
    /// when the trace started).
    pub unaccounted: i64,
    /// unaccounted / applied, percent; None when nothing entered.
    pub unaccounted_pct: Option<f64>,
}

impl Ledger {
    pub fn close(applied: u64, queued: u64, dropped: u64) -> Ledger {
        let unaccounted = applied as i64 - queued as i64 - dropped as i64;
        let unaccounted_pct = (applied > 0).then(|| 100.0 * unaccounted as f64 / applied as f64);
        Ledger { applied, queued, dropped, unaccounted, unaccounted_pct }
    }
}

/// One interval's latency over the sampled packets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub name: String,
    pub samples: u64,
    pub mean_ns: Option<f64>,
    /// Half-width of the 95% confidence interval of the mean (1.96 s / sqrt(n)).
    pub ci95_ns: Option<f64>,
    /// From the log2 histogram, interpolated within the bucket.
    pub p50_ns: Option<f64>,
    pub p99_ns: Option<f64>,
    /// Samples per log2 bucket: bucket b counts durations in [2^b, 2^(b+1)) ns.
    pub hist: Vec<u64>,
}

impl Interval {
    pub fn of(name: &str, s: &LatencySums) -> Interval {
        let n = s.count as f64;
        let mean = (s.count > 0).then(|| s.sum_ns as f64 / n);
        let unit = (1u64 << SLUICE_SQ_SHIFT) as f64;
        let ci95 = mean.filter(|_| s.count > 1).map(|m| {
            let mean_sq = s.sum_sq as f64 * unit * unit / n;
            let var = (mean_sq - m * m).max(0.0) * n / (n - 1.0);
            1.96 * var.sqrt() / n.sqrt()
        });
        Interval {
            name: name.to_string(),
            samples: s.count,
            mean_ns: mean,
            ci95_ns: ci95,
            p50_ns: hist_percentile(&s.hist, 0.50),
            p99_ns: hist_percentile(&s.hist, 0.99),
            hist: s.hist.clone(),
        }
    }
}

/// The p-th quantile (0..1) of a log2 histogram (bucket b = [2^b, 2^(b+1)) ns,
/// bucket 0 = [0, 2)), interpolated linearly inside its bucket; None if empty.
pub fn hist_percentile(hist: &[u64], p: f64) -> Option<f64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = p * total as f64;
    let mut below = 0u64;
    for (b, &n) in hist.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lo = if b == 0 { 0.0 } else { (1u64 << b) as f64 };
            let hi = (1u64 << (b + 1)) as f64;
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lo + within * (hi - lo));
        }
        below += n;
    }
    None
}

/// One class's fate over the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassFate {
    /// The gate's id of the class (its index in the config, without a gate).
    pub id: usize,
    pub name: String,
    /// The gate's verdicts; None when no sluice gate is attached to the interface.
    pub gate: Option<GateCounts>,
    pub stages: StageCounts,
    /// Kernel drops after the gate, largest first.
    pub drops: Vec<Drop>,
    pub ledger: Ledger,
    pub latency: Vec<Interval>,
}

impl ClassFate {
    pub fn new(
        id: usize,
        name: String,
        gate: Option<GateCounts>,
        stages: StageCounts,
        mut drops: Vec<Drop>,
    ) -> ClassFate {
        drops.sort_by(|a, b| b.packets.cmp(&a.packets).then_with(|| a.reason.cmp(&b.reason)));
        let dropped = drops.iter().map(|d| d.packets).sum();
        let applied = gate.map_or(stages.driver, |g| g.admitted);
        let ledger = Ledger::close(applied, stages.queued, dropped);
        ClassFate { id, name, gate, stages, drops, ledger, latency: Vec::new() }
    }

    /// Whether anything of this class was seen at all.
    pub fn is_empty(&self) -> bool {
        let g = self.gate.unwrap_or_default();
        g.admitted + g.dropped + g.syn_answered + self.stages.driver + self.stages.queued + self.stages.read == 0
            && self.drops.is_empty()
    }
}

/// What `sluice trace` prints (and `--json` serialises).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    pub interface: String,
    pub duration_secs: f64,
    /// Where the gate's verdicts came from ("daemon pid N"), or None: no gate.
    pub gate: Option<String>,
    /// One sampled packet in this many at the driver stage when the trace
    /// ended (it follows the rate, second by second); 0: no latency.
    pub sample_every: u32,
    pub classes: Vec<ClassFate>,
    /// Drops of packets the tracer could not class (not IP, or unreadable headers).
    pub unclassified_drops: Vec<Drop>,
    /// What limits the figures (for example: the daemon's classes changed during the trace).
    #[serde(default)]
    pub notes: Vec<String>,
}

pub const REPORT_VERSION: u32 = 1;

fn ns(v: Option<f64>) -> String {
    crate::base::fmt::missing_or(v, |x| {
        if x >= 1e6 {
            format!("{:.2} ms", x / 1e6)
        } else if x >= 1e3 {
            format!("{:.1} us", x / 1e3)
        } else {
            format!("{x:.0} ns")
        }
    })
}

/// The human-readable report.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "trace of {} for {:.1} s; gate: {}; latency: {}\n",
        r.interface,
        r.duration_secs,
        r.gate.as_deref().unwrap_or("none attached (ledger starts at the driver)"),
        if r.sample_every == 0 {
            "off".to_string()
        } else {
            format!("sampled (1 packet in {} at the end)", r.sample_every)
        }
    );
    for c in &r.classes {
        out += &format!("\nclass {}\n", c.name);
        if let Some(g) = c.gate {
            out += &format!("  gate      admitted {:>10}   dropped {:>10}\n", g.admitted, g.dropped);
            if g.any_syn() {
                out += &format!(
                    "  syn       answered {:>10}   cookies valid {} / invalid {}   no-connection dropped {}\n",
                    g.syn_answered, g.cookies_valid, g.cookies_invalid, g.dropped_noconn
                );
            }
        }
        let s = &c.stages;
        out += &format!(
            "  in        driver {:>10}   stack {:>10}   queued {:>10}   read {:>10}\n",
            s.driver, s.stack, s.queued, s.read
        );
        for d in &c.drops {
            out += &format!("  dropped   {:<10} {:<22} {:>10}\n", d.stage, d.reason, d.packets);
        }
        let l = &c.ledger;
        out += &format!(
            "  ledger    applied {} = queued {} + dropped {} + unaccounted {} ({})\n",
            l.applied,
            l.queued,
            l.dropped,
            l.unaccounted,
            crate::base::fmt::missing_or(l.unaccounted_pct, |p| format!("{p:.2}%"))
        );
        for i in c.latency.iter().filter(|i| i.samples > 0) {
            out += &format!(
                "  latency   {:<14} p50 {:>9}  p99 {:>9}  mean {:>9} +- {:<9} ({} samples)\n",
                i.name,
                ns(i.p50_ns),
                ns(i.p99_ns),
                ns(i.mean_ns),
                ns(i.ci95_ns),
                i.samples
            );
        }
    }
    for d in &r.unclassified_drops {
        out += &format!("\nunclassified dropped {:<10} {:<22} {:>10}\n", d.stage, d.reason, d.packets);
    }
    for n in &r.notes {
        out += &format!("\nnote: {n}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_land_in_their_stage() {
        assert_eq!(stage_of("SOCKET_RCVBUFF"), "socket");
        assert_eq!(stage_of("NO_SOCKET"), "transport");
        assert_eq!(stage_of("CPU_BACKLOG"), "backlog");
        assert_eq!(stage_of("IP_INHDR"), "ip");
        assert_eq!(stage_of("TCP_CSUM"), "transport");
        assert_eq!(stage_of("SOCKET_CLOSE"), "read");
        assert_eq!(stage_of("NOT_SPECIFIED"), "stack");
    }

    #[test]
    fn the_ledger_shows_what_is_missing_and_missing_as_missing() {
        let l = Ledger::close(1000, 900, 90);
        assert_eq!(l.unaccounted, 10);
        assert!((l.unaccounted_pct.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(Ledger::close(0, 0, 0).unaccounted_pct, None);
        assert_eq!(Ledger::close(10, 12, 0).unaccounted, -2);
    }

    #[test]
    fn a_class_without_a_gate_starts_its_ledger_at_the_driver() {
        let stages = StageCounts::from_array([100, 100, 60, 50]);
        let drops = vec![
            Drop { stage: "transport".into(), reason: "NO_SOCKET".into(), packets: 10 },
            Drop { stage: "socket".into(), reason: "SOCKET_RCVBUFF".into(), packets: 30 },
        ];
        let c = ClassFate::new(0, "a".into(), None, stages, drops);
        assert_eq!(c.ledger.applied, 100);
        assert_eq!(c.ledger.unaccounted, 0);
        assert_eq!(c.drops[0].reason, "SOCKET_RCVBUFF", "largest first");
        let gated = ClassFate::new(
            0,
            "a".into(),
            Some(GateCounts { admitted: 110, dropped: 5, ..GateCounts::default() }),
            stages,
            vec![],
        );
        assert_eq!(gated.ledger.applied, 110);
        assert_eq!(gated.ledger.unaccounted, 50);
    }

    #[test]
    fn the_gates_syn_answers_are_counted_and_shown_only_when_there_are_some() {
        use crate::dataplane::gate::counters::ClassTotals;
        let before = ClassTotals { synack_pkts: 100, cookies_valid: 3, dropped_rate_pkts: 7, ..ClassTotals::default() };
        let after = ClassTotals {
            admitted_pkts: 40,
            synack_pkts: 1100,
            cookies_valid: 13,
            cookies_invalid: 2,
            dropped_rate_pkts: 7,
            dropped_noconn_pkts: 50,
            ..ClassTotals::default()
        };
        let g = GateCounts::between(&before, &after);
        let want = GateCounts {
            admitted: 40,
            dropped: 50,
            syn_answered: 1000,
            cookies_valid: 10,
            cookies_invalid: 2,
            dropped_noconn: 50,
        };
        assert_eq!(g, want);
        let stages = StageCounts::from_array([40, 40, 40, 40]);
        let report = |g| Report {
            version: REPORT_VERSION,
            interface: "eth0".into(),
            duration_secs: 1.0,
            gate: Some("daemon pid 1".into()),
            sample_every: 0,
            classes: vec![ClassFate::new(0, "nginx/tcp:80".into(), Some(g), stages, vec![])],
            unclassified_drops: vec![],
            notes: vec![],
        };
        let text = render(&report(g));
        assert!(
            text.contains("answered       1000   cookies valid 10 / invalid 2   no-connection dropped 50"),
            "{text}"
        );
        let calm = render(&report(GateCounts { admitted: 40, ..GateCounts::default() }));
        assert!(!calm.contains("syn "), "{calm}");
        // A class the gate only answered for is not left out as empty.
        let only_syn = GateCounts { syn_answered: 1, ..GateCounts::default() };
        assert!(!ClassFate::new(0, "a".into(), Some(only_syn), StageCounts::default(), vec![]).is_empty());
    }

    #[test]
    fn percentiles_interpolate_within_log2_buckets() {
        let mut h = vec![0u64; 32];
        h[10] = 100; // [1024, 2048)
        assert_eq!(hist_percentile(&h, 0.5), Some(1536.0));
        assert_eq!(hist_percentile(&h, 0.99), Some(1024.0 + 0.99 * 1024.0));
        h[20] = 1; // one slow sample moves p99 only slightly, stays in bucket 10
        assert!(hist_percentile(&h, 0.99).unwrap() < 2048.0);
        assert_eq!(hist_percentile(&[0; 32], 0.5), None);
    }

    #[test]
    fn mean_and_interval_come_from_the_sums() {
        // Samples 800 and 1200 ns: mean 1000, sample sd 282.8, ci = 1.96 * sd / sqrt(2).
        let q = |d: u64| (d >> SLUICE_SQ_SHIFT) * (d >> SLUICE_SQ_SHIFT);
        let mut s = LatencySums::empty();
        s.count = 2;
        s.sum_ns = 2000;
        s.sum_sq = q(800) + q(1200);
        let i = Interval::of("x", &s);
        assert_eq!(i.mean_ns, Some(1000.0));
        let want = 1.96 * 80000f64.sqrt() / 2f64.sqrt();
        assert!((i.ci95_ns.unwrap() - want).abs() < 1.0, "{:?} vs {want}", i.ci95_ns);
        let one = LatencySums { count: 1, sum_ns: 5, sum_sq: 0, hist: vec![0; 32] };
        assert_eq!(Interval::of("x", &one).ci95_ns, None, "no interval from one sample");
        assert_eq!(Interval::of("x", &LatencySums::empty()).mean_ns, None);
    }
}
