//! One victim model's running bench rig: the testbed, the gates on both
//! sides, the service, the generator and reply receiver in A, the CPU meter,
//! and the control thread that runs the daemon's tick. A measurement of one
//! level is in `level.rs`.
//!
//! Addresses: the legitimate stream comes from A's own address and port
//! LEGIT_SPORT, where a socket in A receives the echoed replies; flood streams
//! come from FLOOD_SRC (another address behind A), so their echoes are dropped
//! by a gate on A's side (only replies to LEGIT_SPORT and non-IP pass there)
//! and never cost the generator's CPU.
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::load::gen::{stream_value, StreamCount, StreamSpec};
use crate::load::workers::{GenDone, GenWorker, ReplyRx};
use crate::scenarios::scenario::{ConfigKind, Scenario};
use crate::testbed::measure::{udp_counters, IdleMeter, NftCounter, NsFile};
use crate::testbed::victim::{VictimBed, VictimModel, IF_A, IF_B};
use sluice::daemon::known_store::Shape;
use sluice::daemon::sched::set_napi;
use sluice::daemon::tick::Ticker;
use sluice::dataplane::gate::Gate;
use sluice::policy::config::{self, NapiSched, XdpMode};
use sluice::surface::stats::ClassTotals;
use sluice::{base::netns, dataplane::classify};

pub const LEGIT_SPORT: u16 = 40000;
pub const FLOOD_SPORT: u16 = 20000;
/// Flood sources: this address and the next `sources - 1`.
pub const FLOOD_SRC_V4: &str = "10.77.0.10";
pub const FLOOD_SRC_V6: &str = "fd77::10";
const NFT_TABLE: &str = "sluice_bench";

/// The bench's control thread: the daemon's `Ticker` for the configuration
/// in place, and the error that stopped it, if one did (a measurement then fails).
pub(crate) struct ControlState {
    pub ticker: Ticker,
    pub failed: Option<String>,
}

/// B's /proc/net/snmp and snmp6, and A's /proc/net/dev, kept open.
pub(crate) struct ProcFiles {
    pub snmp: NsFile,
    pub snmp6: NsFile,
    pub dev: NsFile,
}

/// Totals for the step bench's time series.
#[derive(Debug, Clone, Copy)]
pub struct TickCounters {
    /// Packets the victim's gate saw and admitted.
    pub seen: u64,
    pub admitted: u64,
    /// Datagrams the services took.
    pub delivered: u64,
}

/// One victim model's running bench rig. Dropping it stops everything and
/// removes the namespaces.
pub struct Rig {
    pub scenario: Scenario,
    pub victim_gate: Arc<Mutex<Gate>>,
    pub(crate) rebalance_stop: Arc<AtomicBool>,
    /// What the control thread runs every tick: the daemon's tick.
    pub(crate) control: Arc<Mutex<ControlState>>,
    /// Classes of the victim's current configuration.
    pub(crate) n_classes: usize,
    pub(crate) service: Child,
    /// The low-priority service of `victim.bulk_port`.
    pub(crate) bulk_service: Option<Child>,
    pub(crate) gen: GenWorker,
    pub(crate) replies: Option<ReplyRx>,
    pub(crate) meter: IdleMeter,
    pub(crate) procs: Mutex<ProcFiles>,
    /// The nftables drop counter, while the `nft` configuration is in place.
    pub(crate) nft: Mutex<Option<NftCounter>>,
    pub(crate) _filter: Gate,
    /// The kernel's drops after the victim's gate, by reason (the daemon's
    /// drop counter, bpf/trace.bpf.c); None if it could not load (said once).
    pub(crate) tracer: Option<sluice::dataplane::trace::Tracer>,
    /// The NAPI study's steady outbound flow from the victim to A.
    pub(crate) outbound: crate::testbed::outbound::Outbound,
    // Last, so the namespaces go after everything that lives in them.
    pub tb: VictimBed,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // The outbound flow first: detaching A's XDP program while B still
        // sends into it once hung in napi_disable.
        self.outbound.stop();
        self.rebalance_stop.store(true, Ordering::Relaxed);
        for c in std::iter::once(&mut self.service).chain(self.bulk_service.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(work_file(&self.tb, self.scenario.victim.port));
        self.replies = None;
    }
}

impl Rig {
    /// Build the testbed for `model` and start everything in it.
    pub fn start(scenario: &Scenario, model: VictimModel, exe: &Path, tag: &str) -> Result<Rig> {
        let tb = VictimBed::create(tag, model)?;
        let (gen_cpu, victim_cpu) = (tb.gen_cpu, tb.victim_cpu);
        add_flood_neighbours(&tb, scenario.streams.iter().map(|s| s.sources).max().unwrap_or(1))?;
        // A's side: the legitimate replies, the victim's outbound flow and
        // ping's echo replies; everything else is dropped there.
        let replies_only = [
            format!("replies:match=udp:{LEGIT_SPORT}"),
            format!("outbound:match=udp:{}", crate::testbed::outbound::OUT_PORT),
            "ping:match=icmp".into(),
            "default:rate=blocked,match=icmpv6".into(),
        ];
        let filter = attach_gate(&tb.net.a, IF_A, replies_only.to_vec())?;
        // The victim's gate, pass-through until a configuration is applied.
        let victim = attach_gate(&tb.net.b, IF_B, vec![format!("svc:match=udp:{}", scenario.victim.port)])?;
        tb.apply_model()?;
        let tracer = drop_tracer(&tb.net.b, victim.prog_id());
        let victim_gate = Arc::new(Mutex::new(victim));
        let rebalance_stop = Arc::new(AtomicBool::new(false));
        let control = Arc::new(Mutex::new(ControlState { ticker: Ticker::idle(), failed: None }));
        spawn_control(victim_gate.clone(), control.clone(), rebalance_stop.clone(), tb.control_cpu.unwrap_or(gen_cpu));
        let service = start_service(&tb, scenario, exe, scenario.victim.port)?;
        let bulk_service = match scenario.victim.bulk_port {
            Some(p) => Some(start_service(&tb, scenario, exe, p)?),
            None => None,
        };
        let gen = GenWorker::start(&tb.net.a, &[gen_cpu], tb.net.ifindex_a, 0)?;
        let legit_v6 = scenario.streams.iter().any(|s| s.legit && s.ipv6);
        let replies = if scenario.streams.iter().any(|s| s.legit) {
            let ip = if legit_v6 { tb.net.ip6_a } else { tb.net.ip_a };
            Some(ReplyRx::start(&tb.net.a, SocketAddr::new(ip, LEGIT_SPORT))?)
        } else {
            None
        };
        let outbound = crate::testbed::outbound::Outbound::start(&tb, exe)?;
        let meter = IdleMeter::start(victim_cpu)?;
        let procs = Mutex::new(ProcFiles {
            snmp: NsFile::open(&tb.net.b, "snmp")?,
            snmp6: NsFile::open(&tb.net.b, "snmp6")?,
            dev: NsFile::open(&tb.net.a, "dev")?,
        });
        std::thread::sleep(Duration::from_millis(300));
        Ok(Rig {
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
            tracer,
            outbound,
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
        // `off` and `nft` measure the kernel without sluice's control: no tick.
        let ticker = match kind {
            ConfigKind::Off | ConfigKind::Nft => None,
            _ => Some(Ticker::new(&cfg, Some(&self.tb.net.b), true)?),
        };
        // The receive work per CPU, as the daemon reads it from its tracer.
        let ticker = match (ticker, &self.tracer) {
            (Some(mut t), Some(tr)) => {
                t.read_rx_from(tr.cpu_rx_reader()?);
                Some(t)
            }
            (t, _) => t,
        };
        {
            // Lock order: the gate, then the control state (as the control thread does).
            let mut gate = self.victim_gate.lock().unwrap();
            let mut c = self.control.lock().unwrap();
            c.ticker = Ticker::idle();
            gate.apply(&cfg, &classify::compile(&cfg)?)?;
            // The classes' parts of the known map, as the daemon's start
            // writes them: without a part the learner records nobody, and
            // the configurations would run with no known client.
            sluice::daemon::known_store::hold_to_parts(&gate, Shape::of(&cfg, 0, &gate))?;
            c.ticker = ticker.unwrap_or_else(Ticker::idle);
        }
        self.n_classes = cfg.classes.len();
        if self.tb.model == VictimModel::SameCore {
            // The receive-work knob: SCHED_IDLE for auto-idle, back to normal otherwise.
            let policy = if kind == ConfigKind::AutoIdle { NapiSched::Idle } else { NapiSched::Keep };
            sluice::base::netns::run_in(&self.tb.net.b, move || {
                set_napi(&sluice::dataplane::gate::iface(IF_B)?, policy)
            })?;
            // The idle-thread meter would compete with a SCHED_IDLE kthread:
            // /proc/stat alone measures that configuration.
            self.meter.pause(kind == ConfigKind::AutoIdle);
        }
        let _ = netns::sh(&["ip", "netns", "exec", &self.tb.net.b, "nft", "delete", "table", "inet", NFT_TABLE]);
        if kind == ConfigKind::Nft {
            let rules = format!(
                "table inet {NFT_TABLE} {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n  \
                 udp dport {limited_port} limit rate over {rate_pps}/second burst {} packets counter drop\n }}\n}}\n",
                (rate / 100.0).max(8.0) as u64
            );
            let f = std::env::temp_dir().join(format!("sluice-bench-nft-{}.nft", std::process::id()));
            std::fs::write(&f, rules)?;
            netns::sh(&["ip", "netns", "exec", &self.tb.net.b, "nft", "-f", f.to_str().unwrap()])
                .context("loading the nft configuration (is nftables installed? `make deps`)")?;
            let _ = std::fs::remove_file(f);
            *self.nft.lock().unwrap() = Some(NftCounter::start(&self.tb.net.b, NFT_TABLE)?);
        }
        Ok(())
    }

    /// Totals for a time series.
    pub fn tick_counters(&self) -> Result<TickCounters> {
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
        let udp = udp_counters(&p.snmp.read()?, &p.snmp6.read()?);
        Ok(TickCounters { seen, admitted, delivered: udp.in_datagrams })
    }

    /// Load the streams of `level_pps` into the generator; returns them.
    pub fn load_streams(&mut self, level_pps: f64) -> Result<Vec<(StreamSpec, bool)>> {
        let streams = self.streams(level_pps)?;
        let values = streams
            .iter()
            .map(|(s, _)| stream_value(s, self.tb.net.mac_b, self.tb.net.mac_a))
            .collect::<Result<Vec<_>>>()?;
        self.gen.set_streams(&values)?;
        Ok(streams)
    }

    /// Start the generator for `d`; the receiver gets (counts, seconds) at the end.
    pub fn send_for(&self, d: Duration) -> mpsc::Receiver<GenDone> {
        self.gen.send_for(d, self.scenario.gen_batch)
    }

    /// Change stream `i`'s rate during a run (0 pauses it).
    pub fn set_stream_rate(&self, i: usize, rate: f64) -> Result<()> {
        self.gen.set_rate_live(i, rate)
    }

    /// The generator's per-stream counts so far.
    pub fn gen_counts(&self) -> Result<Vec<StreamCount>> {
        self.gen.counts()
    }

    /// Replies to the legitimate stream since the last call: (sent_ns, recv_ns).
    pub fn take_replies(&self) -> Vec<(u64, u64)> {
        self.replies
            .as_ref()
            .map(|r| r.take().into_iter().map(|x| (x.sent_ns, x.recv_ns)).collect())
            .unwrap_or_default()
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
    pub fn auto_trace(&self) -> Vec<sluice::daemon::auto::TracePoint> {
        self.control.lock().unwrap().ticker.auto.as_ref().map(|a| a.trace.iter().copied().collect()).unwrap_or_default()
    }

    /// The auto loop's (ticks, CPU ns) so far.
    pub(crate) fn auto_progress(&self) -> Option<(u64, u64)> {
        self.control.lock().unwrap().ticker.auto.as_ref().map(|a| (a.ticks, a.cpu_ns))
    }

    pub(crate) fn nft_drops(&self) -> Result<u64> {
        match self.nft.lock().unwrap().as_mut() {
            Some(n) => n.packets(),
            None => Ok(0),
        }
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
                    (true, false) => (tb.net.ip_a, tb.net.ip_b),
                    (true, true) => (tb.net.ip6_a, tb.net.ip6_b),
                    (false, false) => (FLOOD_SRC_V4.parse().unwrap(), tb.net.ip_b),
                    (false, true) => (FLOOD_SRC_V6.parse().unwrap(), tb.net.ip6_b),
                };
                let sport = if s.legit { LEGIT_SPORT } else { FLOOD_SPORT };
                let spec = StreamSpec {
                    name: s.name.clone(),
                    rate,
                    frame_len: s.frame,
                    src: SocketAddr::new(src_ip, sport),
                    flows: s.flows,
                    srcs: s.sources,
                    random_srcs: false,
                    dst: SocketAddr::new(dst_ip, s.port.unwrap_or(self.scenario.victim.port)),
                    dports: s.dports,
                    stamp: s.legit,
                    syn: false,
                    tcp_flags: None,
                    payload: None,
                };
                Ok((spec, s.legit))
            })
            .collect()
    }
}

/// Flood sources: more addresses behind A (FLOOD_SRC_V4/V6 and the next
/// `sources - 1`, as the generator counts them: IPv6 on bits 32-63), made
/// known to B as neighbours at A's MAC in one `ip -batch`; and routes on B
/// through A for the sources past those (10.0.0.0/8, fd77::/16), so answers
/// to any flood source leave B as they would to a remote client.
pub(crate) fn add_flood_neighbours(tb: &VictimBed, sources: u32) -> Result<()> {
    let mac = sluice_testkit::testbed::format_mac(tb.net.mac_a);
    let mut batch = format!("route replace 10.0.0.0/8 via {}\n", tb.net.ip_a);
    batch += &format!("route replace fd77::/16 via {}\n", tb.net.ip6_a);
    for i in 0..sources {
        let v4 = std::net::Ipv4Addr::from(u32::from(FLOOD_SRC_V4.parse::<std::net::Ipv4Addr>()?) + i);
        let v6 =
            std::net::Ipv6Addr::from(u128::from(FLOOD_SRC_V6.parse::<std::net::Ipv6Addr>()?) + ((i as u128) << 64));
        for ip in [v4.to_string(), v6.to_string()] {
            batch += &format!("neigh replace {ip} lladdr {mac} dev {IF_B} nud permanent\n");
        }
    }
    let file = std::env::temp_dir().join(format!("sluice-bench-neigh-{}", std::process::id()));
    std::fs::write(&file, batch)?;
    let r = netns::sh(&["ip", "-n", &tb.net.b, "-batch", file.to_str().unwrap_or_default()]);
    let _ = std::fs::remove_file(&file);
    r.map(|_| ())
}

/// A gate with the classes `flags`, attached to `iface` in namespace `ns`.
pub(crate) fn attach_gate(ns: &str, iface: &'static str, flags: Vec<String>) -> Result<Gate> {
    netns::run_in(ns, move || {
        let cfg = config::from_flags(&flags)?;
        let mut g = Gate::load()?;
        g.apply(&cfg, &classify::compile(&cfg)?)?;
        g.attach(iface, XdpMode::Native, false)?;
        Ok(g)
    })
}

/// The daemon's drop counter on the victim's interface, sharing the gate's classes.
fn drop_tracer(ns: &str, prog_id: u32) -> Option<sluice::dataplane::trace::Tracer> {
    let start = || -> Result<sluice::dataplane::trace::Tracer> {
        let b = ns.to_string();
        let ifindex = netns::run_in(ns, move || Ok(sluice::dataplane::gate::ifindex(IF_B)?))
            .with_context(|| format!("finding {IF_B} in {b}"))?;
        let opts = sluice::dataplane::trace::Options {
            ifindex,
            netns: sluice::base::netns::inode(ns)?,
            default_class: 0,
            drops_only: true,
            tgid: None,
        };
        sluice::dataplane::trace::Tracer::start(
            &opts,
            sluice::dataplane::trace::Tables::Gate(sluice::dataplane::trace::gate_maps(prog_id)?),
        )
    };
    start().map_err(|e| eprintln!("bench: kernel drops by reason are not counted: {e:#}")).ok()
}

/// The control thread: the daemon's tick every TICK, on the generator's CPU
/// (like everything of the bench but the victim), at SCHED_FIFO as the
/// daemon's loop runs. A tick that fails stops it and is reported by the
/// next measurement.
fn spawn_control(gate: Arc<Mutex<Gate>>, control: Arc<Mutex<ControlState>>, stop: Arc<AtomicBool>, cpu: usize) {
    std::thread::spawn(move || {
        let _ = netns::pin_thread(cpu);
        sluice::daemon::sched::realtime_thread();
        let mut next = std::time::Instant::now();
        while !stop.load(Ordering::Relaxed) {
            {
                // Lock order: the gate, then the control state (as apply_config does).
                let mut g = gate.lock().unwrap();
                let mut c = control.lock().unwrap();
                if c.failed.is_none() {
                    if let Err(e) = c.ticker.tick(&mut g, |m| eprintln!("sluice bench: {m}")) {
                        c.failed = Some(format!("{e:#}"));
                    }
                }
            }
            next += sluice::policy::controller::TICK;
            std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
        }
    });
}

/// Where the bench's step experiment writes the service's stepped work (ns).
pub fn work_file(tb: &VictimBed, port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("{}-work-{port}", tb.net.b))
}

fn start_service(tb: &VictimBed, s: &Scenario, exe: &Path, port_num: u16) -> Result<Child> {
    let cpu = tb.victim_cpu.to_string();
    let port = port_num.to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &tb.net.b, "taskset", "-c", &cpu]);
    match &s.victim.command {
        Some(c) => cmd.args(["sh", "-c", &c.replace("{port}", &port)]),
        None => {
            cmd.arg(crate::load_exe(exe)).args([
                "serve",
                "udp-echo",
                "--addr",
                "::",
                "--port",
                &port,
                "--work-ns",
                &s.victim.work_ns.to_string(),
                "--readers",
                &s.victim.readers.to_string(),
            ]);
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
