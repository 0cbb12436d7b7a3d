//! `sluice bench run --scenario cpu`: CPU protection (the priority-receive study). Two
//! services share the victim CPU (1): `hi` (an echo service at nice 0, 20 us
//! per datagram, 10k/s of legitimate load from an echo client) and `lo` (a
//! sink at nice 19, 50 us per datagram: about 15k/s at most beside hi),
//! flooded at 200k/s from the generator (over 10x what lo can take).
//! Discovery gives hi priority 20 and lo priority 39.
//!
//! Configurations, in both victim models:
//! - `unflooded`: the daemon with no flags, no flood: hi's baseline;
//! - `off`: a pass-through gate (the generator's frames need one), flooded;
//! - `zero`: the daemon with no flags (the budget throttles lo when hi is in
//!   distress), flooded;
//! - `away`: as `zero`, with lo's class given `cpu=away` (the same class
//!   discovery makes, plus that key): while a service is in distress lo's
//!   admitted packets go to CPU 0's cpumap kthread;
//! - `napi-idle`: as `zero`, with `[auto] napi = "idle"` (the napi kthreads
//!   at SCHED_IDLE: receive work only in the victim CPU's idle time; threaded
//!   NAPI only, so the `same-core` model).
//!
//! Each cell first runs the echo client for 0.5 s unmeasured (neighbour
//! entries, the daemon's first look at the services).
//!
//! The generator and the echo client run in namespace A on CPU 0; in the
//! `nic` model the gate and NAPI run there too and RPS hands the stack work
//! to CPU 1; in `same-core` everything of the victim (NAPI and the gate in
//! the napi kthread) runs on CPU 1.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_testkit::summary::median;
use sluice_testkit::testbed::IF_B;

use crate::load::gen::{stream_value, udp_stream};
use crate::load::workers::GenWorker;
use crate::scenarios::matrix::{interleave, Planned, Results, Runner};
use crate::studies::echo::{self, percentile};
use crate::testbed::procs::{in_ns, start_daemon, status_json, Proc};
use crate::testbed::rig::{attach_gate, FLOOD_SRC_V4};
use crate::testbed::victim::{VictimBed, VictimModel};

const HI_PORT: u16 = 7600;
const LO_PORT: u16 = 7700;
const HI_RATE: u64 = 10_000;
const HI_WORK_NS: u64 = 20_000;
const LO_WORK_NS: u64 = 50_000;
const FLOOD_PPS: f64 = 200_000.0;
/// Each service's socket buffer (SO_RCVBUF, doubled by the kernel: 4 MiB).
/// With the default 212,992 bytes and veth's 4 KiB per datagram (XDP
/// attached), a batch of 13 datagrams looks like a standing queue to the
/// knee controller, which then holds hi's rate at what it took and drops
/// 3-7% of its legitimate load with no flood at all (measured here).
const RCVBUF: u64 = 2 << 20;

pub struct CpuOpts {
    pub exe: PathBuf,
    pub secs: f64,
    pub repeats: u32,
    pub interrupted: Arc<AtomicBool>,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub model: String,
    pub config: &'static str,
    pub repeat: u32,
    /// hi's requests sent, answered datagrams/s, lost share, and round trips.
    pub hi_sent: u64,
    pub hi_pps: f64,
    pub hi_lost: f64,
    pub hi_p50_us: Option<f64>,
    pub hi_p99_us: Option<f64>,
    /// The flood the generator sent, packets/s (None: no flood).
    pub flood_pps: Option<f64>,
    /// lo's packets the gate sent to another CPU, and dropped, over the
    /// daemon's life in the cell (None: no daemon).
    pub lo_away: Option<u64>,
    pub lo_dropped: Option<u64>,
    /// hi's packets the gate dropped (None: no daemon).
    pub hi_dropped: Option<u64>,
}

const CONFIGS: [&str; 5] = ["unflooded", "off", "zero", "away", "napi-idle"];

/// What results.json holds besides the cells.
#[derive(Debug, Clone, Serialize)]
pub struct Head {
    pub secs: f64,
    pub repeats: u32,
}

/// One model's testbed with the flood loaded into its generator.
struct Bed {
    model: VictimModel,
    bed: VictimBed,
    gen: GenWorker,
}

impl Bed {
    fn start(model: VictimModel) -> Result<Bed> {
        let bed = VictimBed::create("cpu", model)?;
        let gen = GenWorker::start(&bed.net.a, &[bed.gen_cpu], bed.net.ifindex_a, 19)?;
        let mut flood = udp_stream("flood", FLOOD_PPS, 64, FLOOD_SRC_V4.parse()?, 20_000, bed.net.ip_b, LO_PORT);
        flood.flows = 64;
        gen.set_streams(&[stream_value(&flood, bed.net.mac_b, bed.net.mac_a)?])?;
        crate::testbed::rig::add_flood_neighbours(&bed, 1)?;
        Ok(Bed { model, bed, gen })
    }
}

/// The plan: each model in turn (one testbed each), every configuration
/// `repeats` times, interleaved; `napi-idle` only where NAPI is threaded.
fn plan(repeats: u32) -> Vec<Planned<(VictimModel, &'static str)>> {
    [VictimModel::Nic, VictimModel::SameCore]
        .into_iter()
        .flat_map(|m| {
            let configs: Vec<_> = CONFIGS
                .into_iter()
                .filter(|c| *c != "napi-idle" || m == VictimModel::SameCore)
                .map(|c| (m, c))
                .collect();
            interleave(&configs, repeats)
        })
        .collect()
}

/// Run the plan; results go to OUT/results.json as they come.
pub fn run(o: &CpuOpts, out: &Path) -> Result<Vec<Cell>> {
    std::fs::create_dir_all(out)?;
    let plan = plan(o.repeats);
    let mut results = Results::new("cpu", Head { secs: o.secs, repeats: o.repeats });
    let mut bed: Option<Bed> = None;
    let mut runner = Runner::new(plan.len(), &o.interrupted, false);
    let cells = runner.run(
        &plan,
        |(m, c), r| format!("cpu: {} repeat {}/{}: {c}", m.name(), r + 1, o.repeats),
        |&(model, config), repeat| {
            if bed.as_ref().map(|b| b.model) != Some(model) {
                bed = None; // the last model's testbed goes first
                bed = Some(Bed::start(model)?);
            }
            let b = bed.as_ref().expect("started above");
            cell(o, &b.bed, &b.gen, config, repeat, out).with_context(|| format!("{} {config}", model.name()))
        },
        |cells| {
            results.cells = cells.to_vec();
            results.save(out)
        },
    )?;
    runner.finish();
    Ok(cells)
}

/// An echo or sink service on the victim CPU at `nice`.
fn service(o: &CpuOpts, bed: &VictimBed, port: u16, work: u64, nice: i32, echo: bool) -> Result<Proc> {
    let mut c = in_ns(&bed.net.b, Some(bed.victim_cpu));
    c.args(["nice", "-n", &nice.to_string()]).arg(crate::load_exe(&o.exe));
    c.args(["serve", "udp-echo", "--port", &port.to_string(), "--work-ns", &work.to_string()]);
    c.args(["--duration", &format!("{}", o.secs + 15.0), "--rcvbuf", &RCVBUF.to_string()]);
    if !echo {
        c.arg("--no-echo");
    }
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    Proc::spawn(c, "sluice-bench serve")
}

/// What carries the configuration during a cell (the gate is detached when dropped).
enum Installed {
    Pass(#[allow(dead_code)] Box<sluice::dataplane::gate::Gate>),
    Daemon(Proc, PathBuf),
}

fn install(o: &CpuOpts, bed: &VictimBed, config: &str, out: &Path) -> Result<Installed> {
    let inst = if config == "off" {
        Installed::Pass(Box::new(attach_gate(&bed.net.b, IF_B, vec![])?))
    } else {
        let args = match config {
            "away" => vec!["--class".into(), format!("lo:priority=39,rate=auto,cpu=away,match=udp:{LO_PORT}")],
            "napi-idle" => {
                let file = out.join("napi-idle.toml");
                std::fs::write(&file, "[auto]\nnapi = \"idle\"\n")?;
                vec!["--config".into(), file.display().to_string()]
            }
            _ => vec![],
        };
        let sock = out.join("sluice.sock");
        Installed::Daemon(start_daemon(&o.exe, (&bed.net.b, None), IF_B, &sock, &args, &out.join("daemon.log"))?, sock)
    };
    bed.apply_model()?;
    Ok(inst)
}

fn cell(o: &CpuOpts, bed: &VictimBed, gen: &GenWorker, config: &'static str, repeat: u32, out: &Path) -> Result<Cell> {
    let hi = service(o, bed, HI_PORT, HI_WORK_NS, 0, true)?;
    let lo = service(o, bed, LO_PORT, LO_WORK_NS, 19, false)?;
    std::thread::sleep(Duration::from_millis(300));
    let inst = install(o, bed, config, out)?;
    // Discovery looks once a second: let it find both services first.
    std::thread::sleep(Duration::from_millis(1000));
    let dst = format!("{}:{HI_PORT}", bed.net.ip_b);
    echo::client(&bed.net.a, bed.gen_cpu, &dst, HI_RATE / 10, 0.5)?;
    let flood = (config != "unflooded").then(|| {
        let rx = gen.send_for(Duration::from_secs_f64(o.secs + 1.0), crate::load::gen::DEFAULT_BATCH);
        std::thread::sleep(Duration::from_millis(500));
        rx
    });
    let load = echo::client(&bed.net.a, bed.gen_cpu, &dst, HI_RATE, o.secs)?;
    let (lo_away, lo_dropped, hi_dropped) = match &inst {
        Installed::Daemon(_, sock) => class_counters(&o.exe, &bed.net.b, sock)?,
        Installed::Pass(_) => (None, None, None),
    };
    let flood_pps = match flood {
        Some(rx) => {
            let (counts, secs) = rx.recv().context("the generator thread ended")??;
            Some(counts[0].sent as f64 / secs.max(1e-9))
        }
        None => None,
    };
    if let Installed::Daemon(p, _) = inst {
        p.terminate("sluice run")?;
    }
    drop((hi, lo));
    Ok(Cell {
        model: bed.model.name().into(),
        config,
        repeat,
        hi_sent: load.sent,
        hi_pps: load.answered as f64 / o.secs,
        hi_lost: load.sent.saturating_sub(load.answered) as f64 / load.sent.max(1) as f64,
        hi_p50_us: percentile(&load.rtts_us, 0.50),
        hi_p99_us: percentile(&load.rtts_us, 0.99),
        flood_pps,
        lo_away,
        lo_dropped,
        hi_dropped,
    })
}

/// The classes' counters from the daemon: lo's sent away and dropped, hi's dropped.
fn class_counters(exe: &Path, ns: &str, sock: &Path) -> Result<(Option<u64>, Option<u64>, Option<u64>)> {
    let snap: sluice::surface::stats::Snapshot = serde_json::from_value(status_json(exe, ns, sock)?)?;
    let class = |port: u16| {
        let suffix = format!("/udp:{port}");
        snap.classes.iter().find(|c| c.name.ends_with(&suffix) || (port == LO_PORT && c.name == "lo"))
    };
    let (lo, hi) = (class(LO_PORT), class(HI_PORT));
    Ok((lo.map(|c| c.totals.away_pkts), lo.map(|c| c.totals.dropped_pkts()), hi.map(|c| c.totals.dropped_pkts())))
}

/// Per model and configuration: medians of the repeats, hi's goodput as a
/// share of its unflooded goodput, p99 as a multiple of the unflooded p99.
pub fn summary(cells: &[Cell]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<10} {:<10} {:>9} {:>9} {:>9} {:>16} {:>8} {:>11} {:>11} {:>11}",
        "MODEL",
        "CONFIG",
        "HI ans/s",
        "OF BASE",
        "HI lost",
        "HI p99 us (m-M)",
        "x BASE",
        "LO away",
        "LO dropped",
        "HI dropped"
    );
    for model in ["nic", "same-core"] {
        let of =
            |config: &str| -> Vec<&Cell> { cells.iter().filter(|c| c.model == model && c.config == config).collect() };
        let med =
            |v: &[&Cell], f: &dyn Fn(&Cell) -> Option<f64>| median(&v.iter().filter_map(|c| f(c)).collect::<Vec<_>>());
        let base = of("unflooded");
        let (base_pps, base_p99) = (med(&base, &|c| Some(c.hi_pps)), med(&base, &|c| c.hi_p99_us));
        for config in CONFIGS {
            let v = of(config);
            if v.is_empty() {
                continue;
            }
            let pps = med(&v, &|c| Some(c.hi_pps));
            let p99s: Vec<f64> = v.iter().filter_map(|c| c.hi_p99_us).collect();
            let p99 = median(&p99s);
            let f = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |x| format!("{x:.d$}"));
            let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
            let spread = match (p99s.iter().cloned().reduce(f64::min), p99s.iter().cloned().reduce(f64::max)) {
                (Some(a), Some(b)) => format!("{} ({a:.0}-{b:.0})", f(p99, 0)),
                _ => "-".into(),
            };
            let count = |x: Option<u64>| x.map(|n| n as f64);
            let _ = writeln!(
                o,
                "{:<10} {:<10} {:>9} {:>8}% {:>8}% {:>16} {:>8} {:>11} {:>11} {:>11}",
                model,
                config,
                f(pps, 0),
                f(ratio(pps, base_pps).map(|r| 100.0 * r), 1),
                f(med(&v, &|c| Some(100.0 * c.hi_lost)), 2),
                spread,
                f(ratio(p99, base_p99), 2),
                f(med(&v, &|c| count(c.lo_away)), 0),
                f(med(&v, &|c| count(c.lo_dropped)), 0),
                f(med(&v, &|c| count(c.hi_dropped)), 0),
            );
        }
    }
    o
}
