//! `sluice bench run --scenario readers`: how a service's readers share its
//! datagrams (the shared-socket study), measured on the `nic` victim model.
//!
//! - part `threads`: N threads reading ONE socket (the shared-socket study's experiment)
//!   against N sockets in a reuseport group, steered by the kernel's hash,
//!   round-robin or least-loaded, for N = 1, 2, 4, 8; offered more than the
//!   service can serve, so the delivered rate is its capacity. The service
//!   may run on both CPUs (as a threaded server would), so 2+ readers can
//!   read in parallel and contend for a shared socket;
//! - part `stall`: 4 reuseport readers on the victim CPU (1), the first
//!   stalling 20 ms every 200 ms (`serve --stall`), at a rate they serve
//!   easily: STALL_LOAD of what they were measured to serve on this
//!   machine (a calibration cell offered more than they take, once per
//!   run), at most STALL_RATE; with the kernel's default buffer size
//!   (212,992 bytes) set explicitly: loss and p99 per policy, with and
//!   without the stall. At 60k/s a stall queues 20 ms x 15k/s = 300
//!   datagrams at a hashed reader.
//!
//! - part `nsd`: a real service, NSD with 2 server processes and
//!   `reuseport: yes`, on the victim CPU, under dnsperf at 20k queries/s:
//!   the kernel's hash against least-loaded (what zero-config discovery
//!   gives it; here set by a flag in both cells, so only the policy differs).
//!
//! Every cell starts the daemon as a user would (`sluice run --no-discover
//! --class svc:match=udp:PORT,readers=POLICY`; with `hash` sluice attaches
//! nothing to the group). The client runs in namespace A on CPU 0, where
//! the veth's NAPI and the gate also run; RPS hands the stack work to CPU 1.
//! This machine has 2 CPUs and the client takes much of CPU 0: the service
//! has about 1.5 CPUs whatever its readers, so part `threads` can show the
//! cost of sharing a socket between 2 CPUs but not scaling to 8. With more
//! cores the readers would run in parallel; that is where the shared-socket study saw the
//! shared socket stop scaling.
//!
//! The steering program's cost is read from the kernel's own BPF run
//! statistics (kernel.bpf_stats_enabled, switched on for the run).
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use sluice_testkit::summary::median;

use crate::scenarios::matrix::{interleave, Results, Runner};
use crate::services::dns;
use crate::studies::echo::{self, percentile, Load};
use crate::testbed::measure::IdleMeter;
use crate::testbed::procs::{in_ns, start_daemon, tree_cpu_secs, Proc};
use crate::testbed::victim::{VictimBed, VictimModel};

const PORT: u16 = 7500;
/// Part `threads`: offered load and the service's work per datagram.
const THREADS_RATE: u64 = 120_000;
const THREADS_WORK_NS: u64 = 10_000;
/// Part `stall`: offered load (at most STALL_RATE, and STALL_LOAD of the
/// capacity measured offering CALIBRATE_RATE: a fixed rate saturated a
/// slower machine, whose losses were then the CPU's, not the stall's),
/// work, and the stall of the first reader.
const STALL_RATE: u64 = 60_000;
const STALL_LOAD: f64 = 0.5;
const CALIBRATE_RATE: u64 = 200_000;
const STALL_WORK_NS: u64 = 5_000;
const STALL_MS: u64 = 20;
const STALL_EVERY_MS: u64 = 200;
/// Part `stall`: each socket's buffer, as asked of SO_RCVBUF (which doubles
/// it): 212,992 bytes, the kernel's usual rmem_default.
const STALL_RCVBUF: u64 = 106_496;
/// Part `nsd`: NSD's server processes and dnsperf's rate.
const NSD_SERVERS: u32 = 2;
const NSD_QPS: u64 = 20_000;

pub struct ReadersOpts {
    pub exe: PathBuf,
    pub secs: f64,
    pub repeats: u32,
    pub interrupted: Arc<AtomicBool>,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub part: &'static str,
    /// "shared" (one socket, N threads) or the reuseport policy.
    pub layout: String,
    pub readers: usize,
    pub stall: bool,
    pub repeat: u32,
    pub offered_pps: u64,
    pub sent: u64,
    pub answered: u64,
    pub lost: u64,
    pub delivered_pps: f64,
    /// Victim CPU busy time per answered datagram (all of CPU 1: service
    /// and softirq), by the idle-thread meter.
    pub cpu_ns_per_dgram: Option<f64>,
    /// The service's own CPU time (user + system, every thread, on any CPU)
    /// per answered datagram: what its readers spend, lock waits included.
    pub service_ns_per_dgram: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// The steering program's mean run time from the kernel's BPF stats
    /// (None for `shared` and `hash`, where no program runs).
    pub prog_ns: Option<f64>,
    pub prog_runs: Option<u64>,
}

/// What one cell runs.
#[derive(Debug, Clone)]
struct Setup {
    part: &'static str,
    layout: &'static str,
    readers: usize,
    stall: bool,
}

fn plan() -> Vec<Setup> {
    let mut v = vec![];
    for n in [1, 2, 4, 8] {
        for layout in ["shared", "hash", "round-robin", "least-loaded"] {
            if n == 1 && layout != "shared" {
                continue; // one socket is one socket
            }
            v.push(Setup { part: "threads", layout, readers: n, stall: false });
        }
    }
    for stall in [false, true] {
        for layout in ["hash", "round-robin", "least-loaded"] {
            v.push(Setup { part: "stall", layout, readers: 4, stall });
        }
    }
    for layout in ["hash", "least-loaded"] {
        v.push(Setup { part: "nsd", layout, readers: NSD_SERVERS as usize, stall: false });
    }
    v
}

/// What results.json holds besides the cells.
#[derive(Debug, Clone, Serialize)]
pub struct Head {
    pub secs: f64,
    pub repeats: u32,
}

/// Run every cell `repeats` times (each repeat runs the cells in order, so
/// configurations interleave); results go to OUT/results.json as they come.
pub fn run(o: &ReadersOpts, out: &Path) -> Result<Vec<Cell>> {
    std::fs::create_dir_all(out)?;
    let bed = VictimBed::create("readers", VictimModel::Nic)?;
    let stats = BpfStats::enable()?;
    let meter = IdleMeter::start(bed.victim_cpu)?;
    let plan = interleave(&plan(), o.repeats);
    let mut results = Results::new("readers", Head { secs: o.secs, repeats: o.repeats });
    let mut stall_rate = None;
    let mut runner = Runner::new(plan.len(), &o.interrupted, false);
    let label = |s: &Setup, r: u32| {
        let stalling = if s.stall { " stalling" } else { "" };
        format!("readers: repeat {}/{}: {} {} x{}{stalling}", r + 1, o.repeats, s.part, s.layout, s.readers)
    };
    let cells = runner.run(
        &plan,
        label,
        |s, repeat| {
            let rate = match s.part {
                "threads" => THREADS_RATE,
                "stall" => match stall_rate {
                    Some(r) => r,
                    None => *stall_rate.insert(calibrate_stall(o, &bed, &meter, out)?),
                },
                _ => NSD_QPS,
            };
            cell(o, &bed, &meter, s, repeat, out, rate)
                .with_context(|| format!("cell {} {} x{}", s.part, s.layout, s.readers))
        },
        |cells| {
            results.cells = cells.to_vec();
            results.save(out)
        },
    )?;
    runner.finish();
    drop(stats);
    Ok(cells)
}

/// The service for one cell, pinned to the victim CPU.
fn start_service(o: &ReadersOpts, bed: &VictimBed, s: &Setup) -> Result<Proc> {
    let (sockets, threads) = if s.layout == "shared" { (1, s.readers) } else { (s.readers, 1) };
    let work = if s.part == "threads" { THREADS_WORK_NS } else { STALL_WORK_NS };
    let cpu = if s.part == "threads" { None } else { Some(bed.victim_cpu) };
    let mut c = in_ns(&bed.net.b, cpu);
    c.arg(crate::load_exe(&o.exe)).args(["serve", "udp-echo", "--port", &PORT.to_string(), "--json"]);
    c.args(["--readers", &sockets.to_string(), "--threads", &threads.to_string()]);
    c.args(["--work-ns", &work.to_string(), "--duration", &format!("{}", o.secs + 10.0)]);
    if s.part == "stall" {
        c.args(["--rcvbuf", &STALL_RCVBUF.to_string()]);
    }
    if s.stall {
        c.args(["--stall", &STALL_MS.to_string(), "--stall-every", &STALL_EVERY_MS.to_string()]);
    }
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let p = Proc::spawn(c, "sluice-bench serve")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(p)
}

/// Part `stall`'s rate: STALL_LOAD of what its 4 unstalled readers
/// delivered offered CALIBRATE_RATE (the kernel's hash), at most STALL_RATE.
fn calibrate_stall(o: &ReadersOpts, bed: &VictimBed, meter: &IdleMeter, out: &Path) -> Result<u64> {
    let s = Setup { part: "stall", layout: "hash", readers: 4, stall: false };
    let c = cell(o, bed, meter, &s, 0, out, CALIBRATE_RATE).context("the stall part's calibration cell")?;
    let rate = ((STALL_LOAD * c.delivered_pps) as u64).min(STALL_RATE);
    eprintln!(
        "readers: 4 readers served {:.0}/s offered {CALIBRATE_RATE}/s; the stall part offers {rate}/s",
        c.delivered_pps
    );
    anyhow::ensure!(
        rate > 1000,
        "the calibration cell delivered {:.0}/s: the service does not answer",
        c.delivered_pps
    );
    Ok(rate)
}

fn cell(
    o: &ReadersOpts,
    bed: &VictimBed,
    meter: &IdleMeter,
    s: &Setup,
    repeat: u32,
    out: &Path,
    rate: u64,
) -> Result<Cell> {
    let service = if s.part == "nsd" { start_nsd(bed, out)? } else { start_service(o, bed, s)? };
    let policy = if s.layout == "shared" { "hash" } else { s.layout };
    let sock = out.join("sluice.sock");
    let daemon = start_daemon(
        &o.exe,
        (&bed.net.b, None),
        sluice_testkit::testbed::IF_B,
        &sock,
        &daemon_args(s),
        &out.join("daemon.log"),
    )?;
    bed.apply_model()?;
    if policy != "hash" {
        wait_steered(&o.exe, &bed.net.b, &sock)?;
    }
    let before = prog_stats();
    let cpu0 = meter.sample(bed.victim_cpu)?;
    let svc0 = tree_cpu_secs(service.id());
    let load = if s.part == "nsd" {
        dns_load(bed, out, o.secs)?
    } else {
        echo::client(&bed.net.a, bed.gen_cpu, &format!("{}:{PORT}", bed.net.ip_b), rate, o.secs)?
    };
    let cpu1 = meter.sample(bed.victim_cpu)?;
    let svc_ns = (tree_cpu_secs(service.id()) - svc0) * 1e9;
    let after = prog_stats();
    daemon.terminate("sluice run")?;
    drop(service);
    let busy = meter.busy_between(&cpu0, &cpu1).idle_thread;
    let busy_ns = busy.map(|b| b * cpu1.t_ns.saturating_sub(cpu0.t_ns) as f64);
    let (prog_ns, prog_runs) = match (policy, before, after) {
        ("hash", _, _) => (None, None),
        (_, b, Some(a)) => {
            let (t, n) = b.map_or(a, |b| (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)));
            ((n > 0).then(|| t as f64 / n as f64), Some(n))
        }
        _ => (None, None),
    };
    let per = |ns: f64| (load.answered > 0).then(|| ns / load.answered as f64);
    Ok(Cell {
        part: s.part,
        layout: s.layout.into(),
        readers: s.readers,
        stall: s.stall,
        repeat,
        offered_pps: rate,
        sent: load.sent,
        answered: load.answered,
        lost: load.sent.saturating_sub(load.answered),
        delivered_pps: load.answered as f64 / o.secs,
        cpu_ns_per_dgram: busy_ns.and_then(per),
        service_ns_per_dgram: per(svc_ns),
        p50_us: percentile(&load.rtts_us, 0.50),
        p99_us: percentile(&load.rtts_us, 0.99),
        prog_ns,
        prog_runs,
    })
}

/// The daemon's flags: the service's class with the cell's policy (`hash`:
/// sluice attaches nothing). The NSD cells keep discovery on and give NSD's
/// class `rate=auto`, as discovery would: the cells differ by policy only.
fn daemon_args(s: &Setup) -> Vec<String> {
    let policy = if s.layout == "shared" { "hash" } else { s.layout };
    match s.part {
        "nsd" => vec!["--class".into(), format!("nsd:match=udp:53,rate=auto,readers={policy}")],
        _ => vec!["--no-discover".into(), "--class".into(), format!("svc:match=udp:{PORT},readers={policy}")],
    }
}

/// NSD with NSD_SERVERS server processes (`reuseport: yes`) on the victim CPU.
fn start_nsd(bed: &VictimBed, out: &Path) -> Result<Proc> {
    let dir = out.join("nsd");
    std::fs::create_dir_all(&dir)?;
    let addrs = [bed.net.ip_b.to_string()];
    dns::start_nsd_servers(&dir, &bed.net.b, bed.victim_cpu, &addrs, (&bed.net.a, bed.gen_cpu), NSD_SERVERS)
}

/// dnsperf at NSD_QPS and the latency probe, from namespace A.
fn dns_load(bed: &VictimBed, out: &Path, secs: f64) -> Result<Load> {
    let (perf, probe) = dns::clients(&bed.net.a, bed.gen_cpu, &out.join("nsd"), bed.net.ip_b, NSD_QPS, secs)?;
    let rtts_us = probe.rtt_ms.iter().map(|ms| (ms * 1000.0) as u32).collect();
    Ok(Load { sent: perf.sent, answered: perf.completed, rtts_us })
}

/// Wait until the daemon says it steers the group (it looks once a second).
fn wait_steered(exe: &Path, ns: &str, sock: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = in_ns(ns, None).arg(exe).args(["status", "--json", "--socket"]).arg(sock).output()?;
        let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if snap["readers"].as_array().is_some_and(|g| !g.is_empty()) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the daemon did not steer udp:{PORT} within 5 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The newest loaded `steer` program's (run_time_ns, run_cnt).
fn prog_stats() -> Option<(u64, u64)> {
    libbpf_rs::query::ProgInfoIter::default()
        .filter(|p| p.name.to_str() == Some("steer"))
        .max_by_key(|p| p.id)
        .map(|p| (p.run_time_ns, p.run_cnt))
}

/// kernel.bpf_stats_enabled on for the run, the old value back after.
struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Result<BpfStats> {
        let old = std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing {BPF_STATS}"))?;
        Ok(BpfStats(old.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.0);
    }
}

/// The summary table: per cell, the median over repeats and the spread (min-max).
pub fn summary(cells: &[Cell]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<8} {:<13} {:>3} {:>5} {:>12} {:>8} {:>10} {:>10} {:>20} {:>8}",
        "PART",
        "LAYOUT",
        "N",
        "STALL",
        "DELIVERED/s",
        "LOST %",
        "CPU1 ns/dg",
        "SVC ns/dg",
        "p99 us (min-max)",
        "PROG ns"
    );
    for s in plan() {
        let same: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.part == s.part && c.layout == s.layout && c.readers == s.readers && c.stall == s.stall)
            .collect();
        if same.is_empty() {
            continue;
        }
        let med = |f: &dyn Fn(&Cell) -> Option<f64>| median(&same.iter().filter_map(|c| f(c)).collect::<Vec<_>>());
        let fmt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
        let p99: Vec<f64> = same.iter().filter_map(|c| c.p99_us).collect();
        let spread = match (p99.iter().cloned().reduce(f64::min), p99.iter().cloned().reduce(f64::max)) {
            (Some(a), Some(b)) => format!("{} ({a:.0}-{b:.0})", fmt(median(&p99), 0)),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "{:<8} {:<13} {:>3} {:>5} {:>12} {:>8} {:>10} {:>10} {:>20} {:>8}",
            s.part,
            s.layout,
            s.readers,
            if s.stall { "yes" } else { "no" },
            fmt(med(&|c| Some(c.delivered_pps)), 0),
            fmt(med(&|c| Some(100.0 * c.lost as f64 / c.sent.max(1) as f64)), 3),
            fmt(med(&|c| c.cpu_ns_per_dgram), 0),
            fmt(med(&|c| c.service_ns_per_dgram), 0),
            spread,
            fmt(med(&|c| c.prog_ns), 1),
        );
    }
    o
}
