//! One victim model's environment (testbed, victim gate, service, generator,
//! reply receiver, CPU meter) and the measurement of one load level.
//!
//! Addresses: the legitimate stream comes from A's own address and port
//! LEGIT_SPORT, where a socket in A receives the echoed replies; flood streams
//! come from FLOOD_SRC (another address behind A), so their echoes are dropped
//! by a gate on A's side (only replies to LEGIT_SPORT and non-IP pass there)
//! and never cost the generator's CPU.
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::gen::{mono_ns, stream_value, Generator, StreamCount, StreamSpec};
use crate::bench::measure::{dev_tx_dropped, softnet, udp_counters, CpuSample, IdleMeter, NftCounter, NsFile, UdpCounters};
use crate::bench::scenario::{ConfigKind, Scenario};
use crate::bench::testbed::{Testbed, VictimModel, IF_A, IF_B};
use crate::auto::AutoLoop;
use crate::sched::set_napi;
use crate::config::{self, NapiSched, XdpMode};
use crate::gate::Gate;
use crate::stats::ClassTotals;
use crate::tick::Ticker;
use crate::summary::{coefficient_of_variation, percentile};
use crate::{classify, netns};

pub const LEGIT_SPORT: u16 = 40000;
pub const FLOOD_SPORT: u16 = 20000;
/// Flood sources: this address and the next `sources - 1`.
pub const FLOOD_SRC_V4: &str = "10.77.0.10";
pub const FLOOD_SRC_V6: &str = "fd77::10";
const NFT_TABLE: &str = "sluice_bench";

/// One legitimate reply: when its request was sent, its sequence, when the reply came back.
#[derive(Debug, Clone, Copy)]
struct Reply {
    sent_ns: u64,
    recv_ns: u64,
}

/// The socket in A that receives the echoed legitimate requests.
struct ReplyRx {
    replies: Arc<Mutex<Vec<Reply>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ReplyRx {
    fn start(ns: &str, bind: SocketAddr) -> Result<ReplyRx> {
        let replies = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, ns) = (replies.clone(), stop.clone(), ns.to_string());
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let sock = (|| -> Result<UdpSocket> {
                netns::enter(&ns)?;
                let sock = UdpSocket::bind(bind)?;
                sock.set_read_timeout(Some(Duration::from_millis(50)))?;
                Ok(sock)
            })();
            let sock = match sock {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    if n >= 16 {
                        let sent_ns = u64::from_ne_bytes(buf[0..8].try_into().unwrap());
                        r.lock().unwrap().push(Reply { sent_ns, recv_ns: mono_ns() });
                    }
                }
            }
        });
        rx.recv().context("reply receiver")??;
        Ok(ReplyRx { replies, stop, thread: Some(thread) })
    }

    fn take(&self) -> Vec<Reply> {
        std::mem::take(&mut *self.replies.lock().unwrap())
    }
}

impl Drop for ReplyRx {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The generator, on a thread that lives in A, pinned to the generator CPU.
struct GenWorker {
    gen: Arc<RwLock<Generator>>,
    jobs: mpsc::Sender<(Duration, u32, mpsc::Sender<Result<(Vec<StreamCount>, f64)>>)>,
}

impl GenWorker {
    fn start(ns: &str, cpu: usize, ifindex: u32) -> Result<GenWorker> {
        let gen = Arc::new(RwLock::new(Generator::load()?));
        let (jobs, rx) = mpsc::channel::<(Duration, u32, mpsc::Sender<Result<(Vec<StreamCount>, f64)>>)>();
        let (g, ns) = (gen.clone(), ns.to_string());
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let setup = netns::enter(&ns).and_then(|_| netns::pin_thread(cpu));
            let ok = setup.is_ok();
            let _ = ready_tx.send(setup);
            if !ok {
                return;
            }
            for (d, batch, reply) in rx {
                let _ = reply.send(g.read().unwrap().run(ifindex, d, batch));
            }
        });
        ready_rx.recv().context("generator thread")??;
        Ok(GenWorker { gen, jobs })
    }

    fn send_for(&self, d: Duration, batch: u32) -> mpsc::Receiver<Result<(Vec<StreamCount>, f64)>> {
        let (tx, rx) = mpsc::channel();
        let _ = self.jobs.send((d, batch, tx));
        rx
    }
}

/// Counters read at one edge of a measurement window.
#[derive(Debug, Clone)]
struct Snap {
    t_ns: u64,
    gen: Vec<StreamCount>,
    ring_drops: u64,
    classes: Vec<ClassTotals>,
    gate_global: crate::stats::GlobalTotals,
    udp: UdpCounters,
    softnet_drops: u64,
    nft_drops: u64,
    cpu: CpuSample,
}

/// Where the packets of a window went; all counts are packets in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
    /// edges, or lost somewhere not counted (tolerance: 1% of applied).
    pub unaccounted: i64,
}

impl LevelResult {
    /// Do the idle-thread and /proc/stat CPU figures agree within CPU_METERS_BOUND?
    pub fn cpu_meters_agree(&self) -> bool {
        (self.cpu_busy - self.cpu_busy_procstat).abs() <= CPU_METERS_BOUND
    }
}

impl Ledger {
    /// The columns in order, for the CSV and the report's table.
    pub const COLUMNS: [&'static str; 8] =
        ["applied", "ring_drops", "xdp_drops", "nft_drops", "backlog_drops", "socket_drops", "delivered", "unaccounted"];

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
}

/// The bench's control thread: the daemon's `Ticker` for the configuration
/// in place, and the error that stopped it, if one did (a measurement then fails).
struct Control {
    ticker: Ticker,
    failed: Option<String>,
}

/// One victim model's running environment. Dropping it stops everything and
/// removes the namespaces.
pub struct Env {
    pub scenario: Scenario,
    pub victim_gate: Arc<Mutex<Gate>>,
    rebalance_stop: Arc<AtomicBool>,
    /// What the control thread runs every tick: the daemon's tick.
    control: Arc<Mutex<Control>>,
    /// Classes of the victim's current configuration.
    n_classes: usize,
    service: Child,
    /// The low-priority service of `victim.bulk_port`.
    bulk_service: Option<Child>,
    gen: GenWorker,
    replies: Option<ReplyRx>,
    meter: IdleMeter,
    /// B's /proc/net/snmp and snmp6, A's /proc/net/dev.
    procs: Mutex<(NsFile, NsFile, NsFile)>,
    /// The nftables drop counter, while the `nft` configuration is in place.
    nft: Mutex<Option<NftCounter>>,
    _filter: Gate,
    // Last, so the namespaces go after everything that lives in them.
    pub tb: Testbed,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.rebalance_stop.store(true, Ordering::Relaxed);
        for c in std::iter::once(&mut self.service).chain(self.bulk_service.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(work_file(&self.tb, self.scenario.victim.port));
        self.replies = None;
    }
}

impl Env {
    /// Build the testbed for `model` and start everything in it.
    pub fn start(scenario: &Scenario, model: VictimModel, exe: &PathBuf, tag: &str) -> Result<Env> {
        let (gen_cpu, victim_cpu) = (0, 1);
        let tb = Testbed::create(tag, model, gen_cpu, victim_cpu)?;
        // Flood sources: more addresses behind A, known to B as neighbours.
        let mac = tb.mac_a.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        let sources = scenario.streams.iter().map(|s| s.sources).max().unwrap_or(1);
        let mut batch = String::new();
        for i in 0..sources {
            let v4 = std::net::Ipv4Addr::from(u32::from(FLOOD_SRC_V4.parse::<std::net::Ipv4Addr>()?) + i);
            let v6 = std::net::Ipv6Addr::from(u128::from(FLOOD_SRC_V6.parse::<std::net::Ipv6Addr>()?) + i as u128);
            for ip in [v4.to_string(), v6.to_string()] {
                batch += &format!("neigh replace {ip} lladdr {mac} dev {IF_B} nud permanent\n");
            }
        }
        let file = std::env::temp_dir().join(format!("sluice-bench-neigh-{}", std::process::id()));
        std::fs::write(&file, batch)?;
        let r = netns::sh(&["ip", "-n", &tb.b, "-batch", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        r?;
        // A's side: only legitimate replies (and ARP/ND) reach A's stack.
        let filter = netns::run_in(&tb.a, || {
            let cfg = config::from_flags(&[format!("replies:match=udp:{LEGIT_SPORT}"), "default:rate=blocked,match=icmp,match=icmpv6".into()])?;
            let mut g = Gate::load()?;
            g.apply(&cfg, &classify::compile(&cfg)?)?;
            g.attach(IF_A, XdpMode::Native, false)?;
            Ok(g)
        })?;
        // The victim's gate, pass-through until a configuration is applied.
        let port = scenario.victim.port;
        let victim = netns::run_in(&tb.b, move || {
            let cfg = config::from_flags(&[format!("svc:match=udp:{port}")])?;
            let mut g = Gate::load()?;
            g.apply(&cfg, &classify::compile(&cfg)?)?;
            g.attach(IF_B, XdpMode::Native, false)?;
            Ok(g)
        })?;
        tb.apply_model()?;
        let victim_gate = Arc::new(Mutex::new(victim));
        let rebalance_stop = Arc::new(AtomicBool::new(false));
        let control = Arc::new(Mutex::new(Control { ticker: Ticker::idle(), failed: None }));
        spawn_control(victim_gate.clone(), control.clone(), rebalance_stop.clone(), gen_cpu);
        let service = start_service(&tb, scenario, exe, scenario.victim.port)?;
        let bulk_service = match scenario.victim.bulk_port {
            Some(p) => Some(start_service(&tb, scenario, exe, p)?),
            None => None,
        };
        let gen = GenWorker::start(&tb.a, gen_cpu, tb.ifindex_a)?;
        let legit_v6 = scenario.streams.iter().any(|s| s.legit && s.ipv6);
        let replies = if scenario.streams.iter().any(|s| s.legit) {
            let ip = if legit_v6 { tb.ip6_a } else { tb.ip_a };
            Some(ReplyRx::start(&tb.a, SocketAddr::new(ip, LEGIT_SPORT))?)
        } else {
            None
        };
        let meter = IdleMeter::start(victim_cpu)?;
        let procs = Mutex::new((NsFile::open(&tb.b, "snmp")?, NsFile::open(&tb.b, "snmp6")?, NsFile::open(&tb.a, "dev")?));
        std::thread::sleep(Duration::from_millis(300));
        Ok(Env {
            scenario: scenario.clone(),
            victim_gate,
            rebalance_stop,
            control,
            n_classes: 2,
            service,
            bulk_service,
            gen,
            replies,
            meter,
            procs,
            nft: Mutex::new(None),
            _filter: filter,
            tb,
        })
    }

    /// The service's process id.
    pub fn service_pid(&self) -> u32 {
        self.service.id()
    }

    /// Put a configuration in place on the victim.
    pub fn apply_config(&mut self, kind: ConfigKind, rate: f64) -> Result<()> {
        *self.nft.lock().unwrap() = None;
        let (port, bulk) = (self.scenario.victim.port, self.scenario.victim.bulk_port);
        let rate_pps = rate.round().max(1.0) as u64;
        // The class the static/nft limit applies to: the flooded one.
        let limited_port = bulk.unwrap_or(port);
        let class = |name: &str, prio: u8, p: u16| {
            let r = match kind {
                ConfigKind::Off | ConfigKind::Nft => String::new(),
                ConfigKind::Static if p == limited_port => format!("rate={rate_pps},"),
                ConfigKind::Static => String::new(),
                _ => format!("rate=auto,algo={},", kind.algo().unwrap().name()),
            };
            format!("{name}:priority={prio},{r}match=udp:{p}")
        };
        let mut flags = vec![class("svc", 0, port)];
        if let Some(b) = bulk {
            flags.push(class("bulk", 1, b));
        }
        let cfg = config::from_flags(&flags)?;
        let auto = AutoLoop::new(&cfg, Some(&self.tb.b), self.victim_gate.lock().unwrap().ncpus())?;
        {
            // Lock order: the gate, then the control state (as the control thread does).
            let mut gate = self.victim_gate.lock().unwrap();
            let mut c = self.control.lock().unwrap();
            c.ticker = Ticker::idle();
            gate.apply(&cfg, &classify::compile(&cfg)?)?;
            c.ticker = Ticker::new(&cfg, auto);
        }
        self.n_classes = cfg.classes.len();
        if self.tb.model == VictimModel::SameCore {
            // The receive-work knob: SCHED_IDLE for auto-idle, back to normal otherwise.
            let policy = if kind == ConfigKind::AutoIdle { NapiSched::Idle } else { NapiSched::Keep };
            set_napi(IF_B, policy)?;
            // The idle-thread meter would compete with a SCHED_IDLE kthread:
            // /proc/stat alone measures that configuration.
            self.meter.pause(kind == ConfigKind::AutoIdle);
        }
        let _ = netns::sh(&["ip", "netns", "exec", &self.tb.b, "nft", "delete", "table", "inet", NFT_TABLE]);
        if kind == ConfigKind::Nft {
            let rules = format!(
                "table inet {NFT_TABLE} {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n  \
                 udp dport {limited_port} limit rate over {rate_pps}/second burst {} packets counter drop\n }}\n}}\n",
                (rate / 100.0).max(8.0) as u64
            );
            let f = std::env::temp_dir().join(format!("sluice-bench-nft-{}.nft", std::process::id()));
            std::fs::write(&f, rules)?;
            netns::sh(&["ip", "netns", "exec", &self.tb.b, "nft", "-f", f.to_str().unwrap()])
                .context("loading the nft configuration (is nftables installed? `make deps`)")?;
            let _ = std::fs::remove_file(f);
            *self.nft.lock().unwrap() = Some(NftCounter::start(&self.tb.b, NFT_TABLE)?);
        }
        Ok(())
    }

    /// Totals for a time series: (seen by the victim's gate, admitted by it,
    /// datagrams the services took).
    pub fn tick_counters(&self) -> Result<(u64, u64, u64)> {
        let (mut seen, mut admitted) = (0, 0);
        {
            let g = self.victim_gate.lock().unwrap();
            for i in 0..self.n_classes {
                let t = ClassTotals::from(g.class_counters(i)?);
                seen += t.seen_pkts;
                admitted += t.admitted_pkts;
            }
        }
        let mut p = self.procs.lock().unwrap();
        let udp = udp_counters(&p.0.read()?, &p.1.read()?);
        Ok((seen, admitted, udp.in_datagrams))
    }

    /// Load the streams of `level_pps` into the generator; returns them.
    pub fn load_streams(&mut self, level_pps: f64) -> Result<Vec<(StreamSpec, bool)>> {
        let streams = self.streams(level_pps)?;
        let values = streams.iter().map(|(s, _)| stream_value(s, self.tb.mac_b, self.tb.mac_a)).collect::<Result<Vec<_>>>()?;
        self.gen.gen.write().unwrap().set_streams(&values)?;
        Ok(streams)
    }

    /// Start the generator for `d`; the receiver gets (counts, seconds) at the end.
    pub fn send_for(&self, d: Duration) -> mpsc::Receiver<Result<(Vec<StreamCount>, f64)>> {
        self.gen.send_for(d, self.scenario.gen_batch)
    }

    /// Change stream `i`'s rate during a run (0 pauses it).
    pub fn set_stream_rate(&self, i: usize, rate: f64) -> Result<()> {
        self.gen.gen.read().unwrap().set_rate_live(i, rate)
    }

    /// The generator's per-stream counts so far.
    pub fn gen_counts(&self) -> Result<Vec<StreamCount>> {
        self.gen.gen.read().unwrap().counts()
    }

    /// Replies to the legitimate stream since the last call: (sent_ns, recv_ns).
    pub fn take_replies(&self) -> Vec<(u64, u64)> {
        self.replies.as_ref().map(|r| r.take().into_iter().map(|x| (x.sent_ns, x.recv_ns)).collect()).unwrap_or_default()
    }

    /// Set the main service's per-datagram work to `ns` (None: back to the
    /// scenario's): the step experiment's capacity change.
    pub fn set_service_work(&self, ns: Option<u64>) -> Result<()> {
        anyhow::ensure!(self.scenario.victim.command.is_none(), "the cost step needs the built-in udp-echo victim");
        let file = work_file(&self.tb, self.scenario.victim.port);
        let sig = match ns {
            Some(ns) => {
                std::fs::write(&file, ns.to_string())?;
                libc::SIGUSR1
            }
            None => libc::SIGUSR2,
        };
        // SAFETY: kill(2) on our own child's pid.
        if unsafe { libc::kill(self.service.id() as i32, sig) } != 0 {
            bail!("signalling the service: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The auto loop's trace (10 ms ticks) since the configuration was applied.
    pub fn auto_trace(&self) -> Vec<crate::auto::TracePoint> {
        self.control.lock().unwrap().ticker.auto.as_ref().map(|a| a.trace.iter().copied().collect()).unwrap_or_default()
    }

    /// The auto loop's (ticks, CPU ns) so far.
    fn auto_progress(&self) -> Option<(u64, u64)> {
        self.control.lock().unwrap().ticker.auto.as_ref().map(|a| (a.ticks, a.cpu_ns))
    }

    fn nft_drops(&self) -> Result<u64> {
        match self.nft.lock().unwrap().as_mut() {
            Some(n) => n.packets(),
            None => Ok(0),
        }
    }

    fn snap(&self) -> Result<Snap> {
        if let Some(e) = &self.control.lock().unwrap().failed {
            bail!("the control tick (per-CPU split, auto controller) failed: {e}");
        }
        // Every counter within a millisecond, downstream first (nftables, the
        // service, the stack, the gate, the ring, the generator).
        let nft_drops = self.nft_drops()?;
        let mut p = self.procs.lock().unwrap();
        let udp = udp_counters(&p.0.read()?, &p.1.read()?);
        let softnet_drops = softnet()?.1;
        let (classes, gate_global) = {
            let g = self.victim_gate.lock().unwrap();
            let classes = (0..self.n_classes).map(|i| g.class_counters(i).map(ClassTotals::from)).collect::<Result<Vec<_>, _>>()?;
            (classes, g.global_counters()?.into())
        };
        let ring_drops = dev_tx_dropped(&p.2.read()?, IF_A);
        let gen = self.gen.gen.read().unwrap().counts()?;
        Ok(Snap {
            t_ns: mono_ns(),
            gen,
            ring_drops,
            classes,
            gate_global,
            udp,
            softnet_drops,
            nft_drops,
            cpu: self.meter.sample(self.tb.victim_cpu)?,
        })
    }

    /// The streams of a level whose load is `level_pps`.
    pub fn streams(&self, level_pps: f64) -> Result<Vec<(StreamSpec, bool)>> {
        let tb = &self.tb;
        self.scenario
            .streams
            .iter()
            .map(|s| {
                let rate = s.rate.unwrap_or_else(|| s.share.unwrap_or(1.0) * level_pps);
                let (src_ip, dst_ip): (IpAddr, IpAddr) = match (s.legit, s.ipv6) {
                    (true, false) => (tb.ip_a, tb.ip_b),
                    (true, true) => (tb.ip6_a, tb.ip6_b),
                    (false, false) => (FLOOD_SRC_V4.parse().unwrap(), tb.ip_b),
                    (false, true) => (FLOOD_SRC_V6.parse().unwrap(), tb.ip6_b),
                };
                let sport = if s.legit { LEGIT_SPORT } else { FLOOD_SPORT };
                let spec = StreamSpec {
                    name: s.name.clone(),
                    rate,
                    frame_len: s.frame,
                    src: SocketAddr::new(src_ip, sport),
                    flows: s.flows,
                    srcs: s.sources,
                    dst: SocketAddr::new(dst_ip, s.port.unwrap_or(self.scenario.victim.port)),
                    dports: s.dports,
                    stamp: s.legit,
                };
                Ok((spec, s.legit))
            })
            .collect()
    }

    /// Measure one level: warm up, then count over `duration`.
    pub fn measure(&mut self, config: ConfigKind, multiple: f64, level_pps: f64, repeat: u32) -> Result<LevelResult> {
        let streams = self.streams(level_pps)?;
        let values = streams
            .iter()
            .map(|(s, _)| stream_value(s, self.tb.mac_b, self.tb.mac_a))
            .collect::<Result<Vec<_>>>()?;
        self.gen.gen.write().unwrap().set_streams(&values)?;
        let (warmup, duration) = (self.scenario.warmup, self.scenario.duration);
        let done = self.gen.send_for(Duration::from_secs_f64(warmup + duration + 0.3), self.scenario.gen_batch);
        std::thread::sleep(Duration::from_secs_f64(warmup + 0.02));
        if let Some(r) = &self.replies {
            r.take();
        }
        let s0 = self.snap()?;
        let a0 = self.auto_progress();
        std::thread::sleep(Duration::from_secs_f64(duration));
        let s1 = self.snap()?;
        let a1 = self.auto_progress();
        // The controller's ticks of the window (it goes on ticking after it).
        let window_trace = self.auto_trace();
        let (_, gen_secs) = done.recv().context("generator")??;
        if gen_secs < warmup + duration {
            bail!("the generator stopped after {gen_secs:.2} s, before the window ended");
        }
        // Let the replies of the window's last requests come back.
        std::thread::sleep(Duration::from_millis(200));
        let secs = (s1.t_ns - s0.t_ns) as f64 / 1e9;
        let d = |a: u64, b: u64| b.saturating_sub(a);

        let asked: f64 = streams.iter().map(|(s, _)| s.rate).sum();
        let sent: u64 = s0.gen.iter().zip(&s1.gen).map(|(a, b)| d(a.sent, b.sent)).sum();
        let seen: u64 = s0.classes.iter().zip(&s1.classes).map(|(a, b)| d(a.seen_pkts, b.seen_pkts)).sum::<u64>()
            + d(s0.gate_global.non_ip_pass, s1.gate_global.non_ip_pass)
            + d(s0.gate_global.malformed_drop, s1.gate_global.malformed_drop);
        let xdp_drops: u64 = s0.classes.iter().zip(&s1.classes).map(|(a, b)| d(a.dropped_pkts(), b.dropped_pkts())).sum::<u64>()
            + d(s0.gate_global.malformed_drop, s1.gate_global.malformed_drop);
        let delivered = d(s0.udp.in_datagrams, s1.udp.in_datagrams);
        let ledger = {
            let mut l = Ledger {
                applied: sent,
                ring_drops: d(s0.ring_drops, s1.ring_drops),
                xdp_drops,
                nft_drops: d(s0.nft_drops, s1.nft_drops),
                backlog_drops: d(s0.softnet_drops, s1.softnet_drops),
                socket_drops: d(s0.udp.rcvbuf_errors, s1.udp.rcvbuf_errors),
                delivered,
                unaccounted: 0,
            };
            l.unaccounted = l.applied as i64
                - (l.ring_drops + l.xdp_drops + l.nft_drops + l.backlog_drops + l.socket_drops + l.delivered) as i64;
            l
        };

        // The legitimate probe: requests sent in the window, and their replies.
        let legit_idx = streams.iter().position(|(_, legit)| *legit);
        let (legit_sent, legit_replies, rtt) = match (legit_idx, &self.replies) {
            (Some(i), Some(rx)) => {
                let sent = d(s0.gen[i].sent, s1.gen[i].sent);
                let mut rtts: Vec<f64> = rx
                    .take()
                    .into_iter()
                    .filter(|r| r.sent_ns >= s0.t_ns && r.sent_ns < s1.t_ns)
                    .map(|r| r.recv_ns.saturating_sub(r.sent_ns) as f64 / 1e3)
                    .collect();
                rtts.sort_by(f64::total_cmp);
                (sent, rtts.len() as u64, Rtt::of(&rtts))
            }
            _ => (0, 0, Rtt::default()),
        };

        // The idle-thread meter, or /proc/stat where it is paused (auto-idle).
        let busy = self.meter.busy_between(&s0.cpu, &s1.cpu);
        let (cpu_busy, cpu_busy_procstat) = (busy.idle_thread.unwrap_or(busy.procstat), busy.procstat);
        let delivered_pps = delivered as f64 / secs;
        let sent_pps = sent as f64 / secs;
        let (admitted_cv, ctl_cpu_pct) = match (a0, a1) {
            (Some((t0, c0)), Some((t1, c1))) => {
                let n = (t1 - t0) as usize;
                let adm: Vec<f64> = window_trace.iter().rev().take(n).map(|p| p.admitted_pps).collect();
                (coefficient_of_variation(&adm), Some(100.0 * (c1 - c0) as f64 / (secs * 1e9)))
            }
            _ => (None, None),
        };
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
            legit_sent,
            legit_replies,
            legit_replies_pps: legit_replies as f64 / secs,
            legit_loss: if legit_sent > 0 { 1.0 - (legit_replies as f64 / legit_sent as f64).min(1.0) } else { 0.0 },
            rtt,
            cpu_busy,
            cpu_busy_procstat,
            ns_per_delivered: (delivered_pps > 0.0).then(|| cpu_busy * 1e9 / delivered_pps),
            ledger,
            admitted_cv,
            ctl_cpu_pct,
        })
    }
}

/// The control thread: the daemon's tick every TICK, on the generator's CPU
/// (like everything of the bench but the victim), at SCHED_FIFO as the
/// daemon's loop runs. A tick that fails stops it and is reported by the
/// next measurement.
fn spawn_control(gate: Arc<Mutex<Gate>>, control: Arc<Mutex<Control>>, stop: Arc<AtomicBool>, cpu: usize) {
    std::thread::spawn(move || {
        let _ = netns::pin_thread(cpu);
        crate::sched::realtime_thread();
        let mut next = std::time::Instant::now();
        while !stop.load(Ordering::Relaxed) {
            {
                // Lock order: the gate, then the control state (as apply_config does).
                let g = gate.lock().unwrap();
                let mut c = control.lock().unwrap();
                if c.failed.is_none() {
                    if let Err(e) = c.ticker.tick(&g, |m| eprintln!("sluice bench: {m}")) {
                        c.failed = Some(format!("{e:#}"));
                    }
                }
            }
            next += crate::daemon::TICK;
            std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
        }
    });
}

/// Where the bench's step experiment writes the service's stepped work (ns).
pub fn work_file(tb: &Testbed, port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("{}-work-{port}", tb.b))
}

fn start_service(tb: &Testbed, s: &Scenario, exe: &PathBuf, port_num: u16) -> Result<Child> {
    let cpu = tb.victim_cpu.to_string();
    let port = port_num.to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &tb.b, "taskset", "-c", &cpu]);
    match &s.victim.command {
        Some(c) => cmd.args(["sh", "-c", &c.replace("{port}", &port)]),
        None => {
            cmd.arg(exe).args(["serve", "udp-echo", "--addr", "::", "--port", &port, "--work-ns", &s.victim.work_ns.to_string(), "--readers", &s.victim.readers.to_string()]);
            if let Some(b) = s.victim.rcvbuf {
                cmd.args(["--rcvbuf", &b.to_string()]);
            }
            cmd.arg("--work-file").arg(work_file(tb, port_num));
            &mut cmd
        }
    };
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("starting the victim service")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(child)
}
