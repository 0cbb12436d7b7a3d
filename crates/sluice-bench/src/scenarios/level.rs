//! One load level's measurement: counters read at both edges of a window
//! (`WindowEdge`), and what they give (`LevelResult`): applied and delivered
//! rates, the legitimate probe, the victim's CPU by two meters, and the
//! ledger of where every applied packet went.
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::load::gen::{mono_ns, StreamCount};
use crate::scenarios::scenario::ConfigKind;
use crate::testbed::measure::{dev_tx_dropped, softnet, udp_counters, CpuSample, UdpCounters};
use crate::testbed::rig::Rig;
use crate::testbed::victim::{VictimModel, IF_A};
use sluice::surface::stats::ClassTotals;
use sluice_testkit::summary::{coefficient_of_variation, percentile};

/// Counters read at one edge of a measurement window.
#[derive(Debug, Clone)]
pub(crate) struct WindowEdge {
    t_ns: u64,
    /// How long reading the edge's counters took (ns): `nft` is a process
    /// of its own, which a victim in livelock can hold for tens of ms.
    read_ns: u64,
    gen: Vec<StreamCount>,
    ring_drops: u64,
    classes: Vec<ClassTotals>,
    gate_global: sluice::surface::stats::GlobalTotals,
    udp: UdpCounters,
    softnet_drops: u64,
    nft_drops: u64,
    cpu: CpuSample,
    /// The kernel's drops after the gate by reason name; None without the tracer.
    kernel: Option<BTreeMap<String, u64>>,
    /// Bytes of the victim's outbound flow received in A.
    outbound_bytes: u64,
}

/// Where the packets of a window went; all counts are packets in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Frames the generator sent.
    pub applied: u64,
    /// Refused by the victim veth's full ring (the generator side's TX drops).
    pub ring_drops: u64,
    /// Dropped by the victim's XDP gate (all classes, all reasons).
    pub xdp_drops: u64,
    /// Dropped by nftables (the `nft` configuration).
    pub nft_drops: u64,
    /// Dropped at the per-CPU backlog (softnet_stat).
    pub backlog_drops: u64,
    /// Dropped at a full socket receive buffer (RcvbufErrors).
    pub socket_drops: u64,
    /// Datagrams the application took (InDatagrams).
    pub delivered: u64,
    /// applied minus every count above: packets in flight at the window's
    /// edges, or lost somewhere not counted (tolerance: 1% of applied, plus
    /// `edge_skew`).
    pub unaccounted: i64,
    /// Packets the generator sent, at the window's rate, while the
    /// counters of its two edges were read: each edge reads them one after
    /// another, so this many may be counted at one stage and not another.
    #[serde(default)]
    pub edge_skew: u64,
    /// The same packets by the tracer (`sluice trace`'s drop counter): the
    /// kernel's drops after the gate by stage and reason, and applied minus
    /// ring, XDP, nft, these and delivered. Empty/None without the tracer.
    #[serde(default)]
    pub kernel_drops: Vec<sluice::surface::trace::fate::Drop>,
    #[serde(default)]
    pub traced_unaccounted: Option<i64>,
}

impl LevelResult {
    /// Do the idle-thread and /proc/stat CPU figures agree within CPU_METERS_BOUND?
    pub fn cpu_meters_agree(&self) -> bool {
        (self.cpu_busy - self.cpu_busy_procstat).abs() <= CPU_METERS_BOUND
    }
}

impl Ledger {
    /// Where the packets went between two edges of a window.
    fn between(s0: &WindowEdge, s1: &WindowEdge) -> Ledger {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        let class_drops: u64 =
            s0.classes.iter().zip(&s1.classes).map(|(a, b)| d(a.dropped_pkts(), b.dropped_pkts())).sum();
        let mut l = Ledger {
            applied: s0.gen.iter().zip(&s1.gen).map(|(a, b)| d(a.sent, b.sent)).sum(),
            ring_drops: d(s0.ring_drops, s1.ring_drops),
            xdp_drops: class_drops
                + d(s0.gate_global.malformed_drop, s1.gate_global.malformed_drop)
                + d(s0.gate_global.non_ip_drop, s1.gate_global.non_ip_drop),
            nft_drops: d(s0.nft_drops, s1.nft_drops),
            backlog_drops: d(s0.softnet_drops, s1.softnet_drops),
            socket_drops: d(s0.udp.rcvbuf_errors, s1.udp.rcvbuf_errors),
            delivered: d(s0.udp.in_datagrams, s1.udp.in_datagrams),
            unaccounted: 0,
            edge_skew: 0,
            kernel_drops: Vec::new(),
            traced_unaccounted: None,
        };
        l.unaccounted = l.applied as i64
            - (l.ring_drops + l.xdp_drops + l.nft_drops + l.backlog_drops + l.socket_drops + l.delivered) as i64;
        let secs = s1.t_ns.saturating_sub(s0.t_ns) as f64 / 1e9;
        if secs > 0.0 {
            let reading = (s0.read_ns + s1.read_ns) as f64 / 1e9;
            l.edge_skew = (l.applied as f64 / secs * reading).round() as u64;
        }
        if let (Some(k0), Some(k1)) = (&s0.kernel, &s1.kernel) {
            l.kernel_drops = k1
                .iter()
                .map(|(reason, &n)| (reason, n.saturating_sub(k0.get(reason).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .map(|(reason, packets)| sluice::surface::trace::fate::Drop::new(reason.clone(), packets))
                .collect();
            let kernel: u64 = l.kernel_drops.iter().map(|d| d.packets).sum();
            l.traced_unaccounted =
                Some(l.applied as i64 - (l.ring_drops + l.xdp_drops + l.nft_drops + kernel + l.delivered) as i64);
        }
        l
    }

    /// Packets dropped after the gate at `stage`, by the tracer.
    pub fn kernel_at(&self, stage: &str) -> u64 {
        self.kernel_drops.iter().filter(|d| d.stage == stage).map(|d| d.packets).sum()
    }

    /// The columns in order, for the CSV and the report's table.
    pub const COLUMNS: [&'static str; 8] = [
        "applied",
        "ring_drops",
        "xdp_drops",
        "nft_drops",
        "backlog_drops",
        "socket_drops",
        "delivered",
        "unaccounted",
    ];

    pub fn values(&self) -> [i64; 8] {
        [
            self.applied as i64,
            self.ring_drops as i64,
            self.xdp_drops as i64,
            self.nft_drops as i64,
            self.backlog_drops as i64,
            self.socket_drops as i64,
            self.delivered as i64,
            self.unaccounted,
        ]
    }
}

/// Two CPU meters that differ by more than this (busy fraction, absolute)
/// mark a level. Measured on a CPU loaded to a known share
/// (tests/cpu_meter.rs), the meters agree within a few points; /proc/stat
/// counts in 4 ms ticks (0.13 points of a 3 s window) and charges interrupt
/// and softirq time to whatever runs, which the idle thread sees as short
/// gaps. Ten points leaves room for that and still flags the 35-point gaps
/// seen in the recorded fixture.
pub const CPU_METERS_BOUND: f64 = 0.10;

/// Round-trip times of the legitimate probe, microseconds; None (null in
/// results.json) when no reply came back in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rtt {
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub max_us: Option<f64>,
}

impl Rtt {
    /// From sorted round-trip times.
    pub fn of(sorted: &[f64]) -> Rtt {
        Rtt {
            p50_us: percentile(sorted, 0.5),
            p90_us: percentile(sorted, 0.9),
            p99_us: percentile(sorted, 0.99),
            max_us: sorted.last().copied(),
        }
    }
}

/// One measurement: one model, configuration, level and repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelResult {
    pub model: VictimModel,
    pub config: ConfigKind,
    /// The level as a multiple of the calibrated peak.
    pub multiple: f64,
    pub repeat: u32,
    pub secs: f64,
    /// Applied load: asked, counted by the generator, seen by the victim's XDP (packets/s).
    pub asked_pps: f64,
    pub sent_pps: f64,
    pub xdp_seen_pps: f64,
    /// False when the generator fell short of the asked rate by more than 2%.
    pub valid: bool,
    /// Datagrams/s the service took (delivered throughput).
    pub delivered_pps: f64,
    /// Legitimate probe: requests sent and replies received in the window.
    pub legit_sent: u64,
    pub legit_replies: u64,
    pub legit_replies_pps: f64,
    pub legit_loss: f64,
    pub rtt: Rtt,
    /// Victim CPU busy fraction by the idle-thread method, and by /proc/stat.
    pub cpu_busy: f64,
    pub cpu_busy_procstat: f64,
    /// Victim CPU ns per delivered datagram; None when nothing was delivered.
    pub ns_per_delivered: Option<f64>,
    pub ledger: Ledger,
    /// Auto configurations: the coefficient of variation of the admitted rate
    /// over the window's 10 ms ticks, and the controller's CPU (% of one CPU).
    #[serde(default)]
    pub admitted_cv: Option<f64>,
    #[serde(default)]
    pub ctl_cpu_pct: Option<f64>,
    /// The NAPI study's side measurements: the victim's steady outbound flow (10
    /// Mb/s asked) as received, Mb/s; ping from A to the victim: replies
    /// lost and mean round trip (None: no reply).
    #[serde(default)]
    pub outbound_mbps: Option<f64>,
    #[serde(default)]
    pub ping_loss: Option<f64>,
    #[serde(default)]
    pub ping_avg_us: Option<f64>,
}

impl Rig {
    fn window_edge(&self) -> Result<WindowEdge> {
        if let Some(e) = &self.control.lock().unwrap().failed {
            bail!("the control tick (per-CPU split, auto controller) failed: {e}");
        }
        // Every counter one after another, downstream first (nftables, the
        // service, the stack, the gate, the ring, the generator): within a
        // millisecond, but `nft`, a process, can take tens of ms beside a
        // victim in livelock (the ledger's `edge_skew`).
        let start = mono_ns();
        let nft_drops = self.nft_drops()?;
        let mut p = self.procs.lock().unwrap();
        let udp = udp_counters(&p.snmp.read()?, &p.snmp6.read()?);
        let softnet_drops = softnet()?.dropped;
        let (classes, gate_global) = {
            let g = self.victim_gate.lock().unwrap();
            let classes = (0..self.n_classes)
                .map(|i| g.class_counters(i).map(ClassTotals::from))
                .collect::<Result<Vec<_>, _>>()?;
            (classes, g.global_counters()?.into())
        };
        let kernel = self.kernel_drops()?;
        let ring_drops = dev_tx_dropped(&p.dev.read()?, IF_A);
        let gen = self.gen.counts()?;
        let t_ns = mono_ns();
        Ok(WindowEdge {
            t_ns,
            read_ns: t_ns.saturating_sub(start),
            gen,
            ring_drops,
            classes,
            gate_global,
            udp,
            softnet_drops,
            nft_drops,
            cpu: self.meter.sample(self.tb.victim_cpu)?,
            kernel,
            outbound_bytes: self.outbound.bytes(),
        })
    }

    /// The tracer's drop counts (all classes) by reason name.
    fn kernel_drops(&self) -> Result<Option<BTreeMap<String, u64>>> {
        let Some(t) = &self.tracer else { return Ok(None) };
        let mut by_reason = BTreeMap::new();
        for ((_, reason), n) in t.drop_counts()? {
            *by_reason.entry(t.reason_name(reason)).or_default() += n;
        }
        Ok(Some(by_reason))
    }

    /// Measure one level: warm up, then count over `duration`.
    pub fn measure(&mut self, config: ConfigKind, multiple: f64, level_pps: f64, repeat: u32) -> Result<LevelResult> {
        let streams = self.load_streams(level_pps)?;
        let w = self.run_window()?;
        let (s0, s1) = (&w.start, &w.end);
        let secs = (s1.t_ns - s0.t_ns) as f64 / 1e9;
        let d = |a: u64, b: u64| b.saturating_sub(a);
        let asked: f64 = streams.iter().map(|(s, _)| s.rate).sum();
        let ledger = Ledger::between(s0, s1);
        let seen: u64 = s0.classes.iter().zip(&s1.classes).map(|(a, b)| d(a.seen_pkts, b.seen_pkts)).sum::<u64>()
            + d(s0.gate_global.non_ip_pass, s1.gate_global.non_ip_pass)
            + d(s0.gate_global.non_ip_drop, s1.gate_global.non_ip_drop)
            + d(s0.gate_global.malformed_drop, s1.gate_global.malformed_drop);
        let legit_idx = streams.iter().position(|(_, legit)| *legit);
        let probe = self.probe(legit_idx, s0, s1);
        // The idle-thread meter, or /proc/stat where it is paused (auto-idle).
        let busy = self.meter.busy_between(&s0.cpu, &s1.cpu);
        let (cpu_busy, cpu_busy_procstat) = (busy.idle_thread.unwrap_or(busy.procstat), busy.procstat);
        let delivered_pps = ledger.delivered as f64 / secs;
        let sent_pps = ledger.applied as f64 / secs;
        let (admitted_cv, ctl_cpu_pct) = w.controller(secs);
        let outbound_mbps = Some(d(s0.outbound_bytes, s1.outbound_bytes) as f64 * 8.0 / secs / 1e6);
        let ping_loss = w.ping.filter(|p| p.sent > 0).map(|p| 1.0 - p.received as f64 / p.sent as f64);
        Ok(LevelResult {
            model: self.tb.model,
            config,
            multiple,
            repeat,
            secs,
            asked_pps: asked,
            sent_pps,
            xdp_seen_pps: seen as f64 / secs,
            valid: sent_pps >= 0.98 * asked,
            delivered_pps,
            legit_sent: probe.sent,
            legit_replies: probe.replies,
            legit_replies_pps: probe.replies as f64 / secs,
            legit_loss: probe.loss(),
            rtt: probe.rtt,
            cpu_busy,
            cpu_busy_procstat,
            ns_per_delivered: (delivered_pps > 0.0).then(|| cpu_busy * 1e9 / delivered_pps),
            ledger,
            admitted_cv,
            ctl_cpu_pct,
            outbound_mbps,
            ping_loss,
            ping_avg_us: w.ping.and_then(|p| p.avg_us),
        })
    }

    /// Send the loaded streams for warm-up + window, and read the counters at
    /// the window's edges.
    fn run_window(&mut self) -> Result<Window> {
        let (warmup, duration) = (self.scenario.warmup, self.scenario.duration);
        let done = self.send_for(Duration::from_secs_f64(warmup + duration + 0.3));
        std::thread::sleep(Duration::from_secs_f64(warmup + 0.02));
        if let Some(r) = &self.replies {
            r.take();
        }
        let ping = crate::testbed::outbound::Ping::start(&self.tb.net.a, &self.tb.net.ip_b.to_string(), duration);
        let start = self.window_edge()?;
        let auto_start = self.auto_progress();
        std::thread::sleep(Duration::from_secs_f64(duration));
        let end = self.window_edge()?;
        let auto_end = self.auto_progress();
        // The controller's ticks of the window (it goes on ticking after it).
        let trace = self.auto_trace();
        let (_, gen_secs) = done.recv().context("generator")??;
        if gen_secs < warmup + duration {
            bail!("the generator stopped after {gen_secs:.2} s, before the window ended");
        }
        // Let the replies of the window's last requests come back.
        std::thread::sleep(Duration::from_millis(200));
        // A ping that could not start or printed no summary is a missing figure, not an error.
        let ping = ping.and_then(|p| p.finish()).ok();
        Ok(Window { start, end, auto_start, auto_end, trace, ping })
    }

    /// The legitimate probe: requests sent in the window, and their replies.
    fn probe(&self, legit_idx: Option<usize>, s0: &WindowEdge, s1: &WindowEdge) -> Probe {
        let (Some(i), Some(rx)) = (legit_idx, &self.replies) else {
            return Probe { sent: 0, replies: 0, rtt: Rtt::default() };
        };
        let mut rtts: Vec<f64> = rx
            .take()
            .into_iter()
            .filter(|r| r.sent_ns >= s0.t_ns && r.sent_ns < s1.t_ns)
            .map(|r| r.recv_ns.saturating_sub(r.sent_ns) as f64 / 1e3)
            .collect();
        rtts.sort_by(f64::total_cmp);
        Probe { sent: s1.gen[i].sent.saturating_sub(s0.gen[i].sent), replies: rtts.len() as u64, rtt: Rtt::of(&rtts) }
    }
}

/// A measurement window: its edges, and the auto controller's (ticks, CPU ns)
/// at both and its trace (auto configurations only).
struct Window {
    start: WindowEdge,
    end: WindowEdge,
    ping: Option<crate::testbed::outbound::PingResult>,
    auto_start: Option<(u64, u64)>,
    auto_end: Option<(u64, u64)>,
    trace: Vec<sluice::daemon::auto::TracePoint>,
}

impl Window {
    /// The admitted rate's coefficient of variation over the window's ticks,
    /// and the controller's CPU (% of one CPU).
    fn controller(&self, secs: f64) -> (Option<f64>, Option<f64>) {
        let (Some((t0, c0)), Some((t1, c1))) = (self.auto_start, self.auto_end) else { return (None, None) };
        let n = (t1 - t0) as usize;
        let admitted: Vec<f64> = self.trace.iter().rev().take(n).map(|p| p.admitted_pps).collect();
        (coefficient_of_variation(&admitted), Some(100.0 * (c1 - c0) as f64 / (secs * 1e9)))
    }
}

/// The legitimate probe of a window.
struct Probe {
    sent: u64,
    replies: u64,
    rtt: Rtt,
}

impl Probe {
    fn loss(&self) -> f64 {
        if self.sent > 0 {
            1.0 - (self.replies as f64 / self.sent as f64).min(1.0)
        } else {
            0.0
        }
    }
}
