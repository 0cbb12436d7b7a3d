//! The Prometheus text of a snapshot: OpenMetrics for those who ask for it,
//! the 0.0.4 text format for the rest, and the 0.0.4 lint the tests use.
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::families::help;
use super::*;

/// Prometheus text exposition of a snapshot.
pub fn prometheus_text(s: &Snapshot) -> String {
    let mut reg = Registry::with_prefix("sluice");
    register_class_families(&mut reg, &s.classes);
    register_auto_families(&mut reg, &s.classes);
    // The kernel's counters are totals: each scrape builds a new registry and
    // counts them in once, so they are served as counters (the encoder adds _total).
    let (unclassified, flagged) = (Family::<Labels, U64Counter>::default(), Family::<Labels, U64Counter>::default());
    let g = &s.global;
    for (v, n) in [
        ("non_ip_pass", g.non_ip_pass),
        ("non_ip_drop", g.non_ip_drop),
        ("malformed_drop", g.malformed_drop),
        ("malformed_pass", g.malformed_pass),
    ] {
        unclassified.get_or_create(&vec![label("verdict", v)]).inc_by(n);
    }
    let flags = [
        ("depth_exceeded", g.depth_exceeded),
        ("fragment", g.fragments),
        ("observed_pass", g.observed_pass),
        ("stale_pass", g.stale_pass),
        ("odd_l3_drop", g.odd_l3_drop),
        ("host_reply", g.host_reply),
        ("host_icmp", g.host_icmp),
    ];
    for (f, n) in flags {
        flagged.get_or_create(&vec![label("flag", f)]).inc_by(n);
    }
    add(&mut reg, "unclassified_packets", unclassified);
    add(&mut reg, "flagged_packets", flagged);
    let unasked = ConstCounter::new(g.unasked_replies);
    add(&mut reg, "learner_unasked_replies", unasked);
    let cpu = ConstCounter::new(s.daemon_cpu_secs);
    add(&mut reg, "daemon_cpu_seconds", cpu);
    // No sample where it is not counted (missing, not 0).
    let softirq = Family::<Labels, F64Counter>::default();
    if let Some(t) = s.daemon_softirq_secs {
        softirq.get_or_create(&vec![]).inc_by(t);
    }
    add(&mut reg, "daemon_softirq_seconds", softirq);
    let start = F64Gauge::default();
    start.set(s.started_unix);
    add(&mut reg, "start_time_seconds", start);
    let attached = U64Gauge::default();
    attached.set(u64::from(s.attached));
    add(&mut reg, "gate_attached", attached);
    let inserts = ConstCounter::new(s.sources.inserts);
    add(&mut reg, "source_inserts", inserts);
    // No sample until the daemon's first scan of the map (5 s): missing, not 0.
    let evictions = Family::<Labels, U64Counter>::default();
    if let Some(e) = s.sources.evictions {
        evictions.get_or_create(&vec![label("map", "sources")]).inc_by(e);
    }
    add(&mut reg, "source_evictions", evictions);
    register_wakes(&mut reg, s);
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

/// How long the gate's wakes of a calm loop took to reach it: no sample
/// before the first wake (missing, not 0).
fn register_wakes(reg: &mut Registry, s: &Snapshot) {
    let wake = Family::<Labels, F64Gauge>::default();
    for (which, v) in [("last", s.wake_ms), ("longest", s.wake_max_ms)] {
        if let Some(ms) = v {
            wake.get_or_create(&vec![label("which", which)]).set(ms / 1e3);
        }
    }
    add(reg, "daemon_wake_seconds", wake);
}

/// Register `metric` as family `name`, with the help text of its one description (`families.rs`).
fn add(reg: &mut Registry, name: &'static str, metric: impl prometheus_client::registry::Metric) {
    reg.register(name, help(name), metric);
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
    let known_lost = Family::<Labels, U64Counter>::default();
    let (answering, cookies) = (Family::<Labels, U64Gauge>::default(), Family::<Labels, U64Counter>::default());
    let (direct, early) = (Family::<Labels, U64Counter>::default(), Family::<Labels, U64Counter>::default());
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
            ("dropped_room", t.dropped_room_pkts, t.dropped_room_bytes),
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
        if let Some(n) = c.known_lost_pkts {
            known_lost.get_or_create(&l).inc_by(n);
        }
        if let Some(g) = &c.syn_guard {
            answering.get_or_create(&l).set(u64::from(g.answering));
            direct.get_or_create(&l).inc_by(t.synack_direct);
            early.get_or_create(&l).inc_by(t.synack_early);
            for (result, n) in
                [("valid", t.cookies_valid), ("invalid", t.cookies_invalid), ("refused", t.cookies_refused)]
            {
                cookies.get_or_create(&vec![label("class", &c.name), label("result", result)]).inc_by(n);
            }
        }
    }
    add(reg, "syn_guard_answering", answering);
    add(reg, "syn_cookie_acks", cookies);
    add(reg, "syn_cookie_direct_packets", direct);
    add(reg, "syn_cookie_early_packets", early);
    add(reg, "class_packets", pkts);
    add(reg, "class_bytes", bytes);
    add(reg, "class_rate_limit_packets_per_second", limit);
    add(reg, "class_throttle_packets_per_second", throttle);
    add(reg, "class_distress_seconds", distress);
    add(reg, "class_dropped_with_room_packets", harm);
    add(reg, "class_known_lost_packets", known_lost);
    register_answer_delays(reg, classes);
    register_kernel_drops(reg, classes);
    register_source_families(reg, classes);
}

/// Each timed class's answer delays (bpf/gate/delay.h) as a histogram: the
/// gate's power-of-two buckets, in seconds. No sample for a class with no
/// answer timed.
fn register_answer_delays(reg: &mut Registry, classes: &[ClassSnapshot]) {
    use crate::policy::delay::{edge_secs, BUCKETS};
    let delays = Family::<Labels, ConstHistogram>::default();
    for c in classes.iter().filter(|c| c.totals.answer_delays.samples > 0) {
        let d = &c.totals.answer_delays;
        // The encoder sums the counts up, and writes f64::MAX as +Inf.
        let edge = |i: usize| if i + 1 < BUCKETS { edge_secs(i) } else { f64::MAX };
        let buckets = (0..BUCKETS).map(|i| (edge(i), d.buckets[i])).collect();
        *delays.get_or_create(&vec![label("class", &c.name)]).0.lock().unwrap_or_else(|e| e.into_inner()) =
            (d.sum_ns as f64 / 1e9, buckets);
    }
    add(reg, "answer_delay_seconds", delays);
}

/// A histogram whose buckets were counted elsewhere (the gate's): its sum
/// and each bucket's (upper edge, count), the last at f64::MAX (+Inf).
#[derive(Debug, Default)]
struct ConstHistogram(std::sync::Mutex<(f64, Vec<(f64, u64)>)>);

impl prometheus_client::metrics::TypedMetric for ConstHistogram {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, buckets) = &*self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = buckets.iter().map(|b| b.1).sum();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(*sum, count, buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}

/// Each class's packets the kernel dropped after the gate.
fn register_kernel_drops(reg: &mut Registry, classes: &[ClassSnapshot]) {
    let kernel = Family::<Labels, U64Counter>::default();
    for c in classes {
        for d in &c.kernel_drops {
            let l = vec![label("class", &c.name), label("stage", &d.stage), label("reason", &d.reason)];
            kernel.get_or_create(&l).inc_by(d.packets);
        }
    }
    add(reg, "kernel_dropped_packets", kernel);
}

/// Source fairness of the classes that count sources or learn.
fn register_source_families(reg: &mut Registry, classes: &[ClassSnapshot]) {
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
    add(reg, "class_sources_active", active);
    add(reg, "class_sources_known", known);
    add(reg, "class_source_quota_packets", quota);
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
    add(reg, "auto_rate_packets_per_second", pps);
    add(reg, "auto_socket_queued_bytes", queue);
    add(reg, "auto_signals_lost_seconds", lost);
    add(reg, "auto_state", state);
}

/// The same metrics in the Prometheus text format 0.0.4, for scrapers that
/// do not ask for OpenMetrics (curl, promtool, older Prometheus): there a
/// counter family is named with its `_total` suffix, there is no `# UNIT`
/// line and no `# EOF`.
pub fn prometheus_text_004(s: &Snapshot) -> String {
    openmetrics_to_004(&prometheus_text(s))
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
