//! `sluice bench idle`: what an always-on daemon costs while nothing
//! happens. `sluice run --iface vb` (the binary a user runs) in a fresh
//! testbed, with no service and no traffic, then with SERVICES idle UDP
//! services (each gets a class): its CPU time over a window, all threads
//! (/proc/PID/task/*/schedstat: time on a CPU, ns), as % of one core. Other
//! builds given with --compare are measured in the same run, interleaved
//! round by round, so a slow hour slows them all alike.
//!
//! After each window, the wake: WAKE_BURST packets at WAKE_RATE from
//! namespace A to a closed port (the default class), and how long the
//! gate's wake took to reach the calm loop (`sluice status --json`:
//! `wake_ms`; a build without the field: not measured). A flood is ticked at
//! 10 ms from its first packet after the wake mark's packets (256 on an
//! idle CPU) plus that time.
//!
//! Then, once per round and binary, the reaction on a class with calm
//! traffic: a UDP sink that CALM_PPS arrive at steadily; once the daemon
//! ticks calmly, a flood of FLOOD_PPS to the same port, both senders on CPU
//! 1 (one CPU's marks). The reaction is the gate's clock at the wake (status
//! `wake_gate_ns`) less the flood sender's start (`sluice-bench send --json`
//! `start_ns`, the same clock), plus the wake's time to the loop: from the
//! flood's first packet to the tick that follows it. A daemon that never
//! ticks calmly with that traffic reacts within its 10 ms tick: shown so.
//! Before the flood, the daemon's CPU over CALM_WINDOW of the calm traffic.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::procs::{in_ns, start_daemon, status_json, Proc};
use crate::victim::NS_PREFIX;
use sluice_testkit::summary::median;
use sluice_testkit::testbed::{Testbed, TestbedOpts, IF_B};

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub binary: String,
    pub services: u32,
    pub round: usize,
    /// CPU time of the daemon's threads over the window, % of one core.
    pub cpu_pct: f64,
    /// Its threads at the end of the window.
    pub threads: usize,
    /// Time from the gate's wake call to the loop after the burst, ms
    /// (None: not reported, an older build, or no wake).
    pub wake_ms: Option<f64>,
}

/// The burst that wakes the calm loop: packets/s, for WAKE_SECS.
const WAKE_RATE: u64 = 40_000;
const WAKE_SECS: f64 = 0.05;

/// The reaction on a class with calm traffic.
const CALM_PPS: u64 = 10_000;
const FLOOD_PPS: u64 = 100_000;
const FLOOD_SECS: f64 = 0.1;
/// The daemon's CPU is measured over this window of the calm traffic.
const CALM_WINDOW: Duration = Duration::from_secs(5);
/// The sink's port (no idle service uses it).
const REACT_PORT: u16 = 6999;

/// One reaction measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Reaction {
    pub binary: String,
    pub round: usize,
    /// The daemon ticked calmly with the calm traffic (else it stays at 10 ms).
    pub calm: bool,
    /// The daemon's CPU with the calm traffic over CALM_WINDOW, % of one core.
    pub calm_cpu_pct: f64,
    /// From the flood's first packet to the tick after the wake, ms (None:
    /// not calm, or a build that does not report the wake's clock).
    pub reaction_ms: Option<f64>,
}

/// Every sample, and per (binary, services) the median and range.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub window_secs: f64,
    pub samples: Vec<Sample>,
    pub reactions: Vec<Reaction>,
}

/// CPU time (ns) of every thread of `pid` so far, and how many there are.
fn threads_cpu_ns(pid: u32) -> (u64, usize) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    let mut n = 0;
    let total = dir
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .inspect(|_| n += 1)
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    (total, n)
}

/// Where the daemons' sockets and logs go.
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("sluice-idle-{}", std::process::id()))
}

/// One window: the daemon `exe` in `tb` with `services` idle UDP services.
fn one(
    exe: &Path,
    load: &Path,
    tb: &Testbed,
    services: u32,
    settle: Duration,
    window: Duration,
) -> Result<(f64, usize, Option<f64>)> {
    let holders: Vec<Proc> = (0..services)
        .map(|i| {
            let mut c = in_ns(&tb.b, None);
            c.arg(load).args(["serve", "udp-echo", "--no-echo", "--port", &(7000 + i).to_string()]);
            c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            Proc::spawn(c, "sluice-bench serve")
        })
        .collect::<Result<_>>()?;
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("idle.sock");
    let daemon = start_daemon(exe, &tb.b, IF_B, &sock, &[], &dir.join("daemon.log"))?;
    std::thread::sleep(settle);
    let (c0, t0) = (threads_cpu_ns(daemon.id()).0, Instant::now());
    std::thread::sleep(window);
    let (c1, threads) = threads_cpu_ns(daemon.id());
    let pct = 100.0 * c1.saturating_sub(c0) as f64 / t0.elapsed().as_nanos() as f64;
    let wake = wake_ms(exe, load, tb, &sock);
    daemon.terminate("sluice run")?;
    for h in holders {
        let _ = h.terminate("sluice-bench serve");
    }
    Ok((pct, threads, wake?))
}

/// Wake the calm daemon with a burst to a closed port; its `wake_ms` then.
fn wake_ms(exe: &Path, load: &Path, tb: &Testbed, sock: &Path) -> Result<Option<f64>> {
    let dst = format!("{}:9999", tb.ip_b);
    let mut send = in_ns(&tb.a, None);
    send.arg(load).args([
        "send",
        "--dst",
        &dst,
        "--rate",
        &WAKE_RATE.to_string(),
        "--duration",
        &WAKE_SECS.to_string(),
    ]);
    let out = send.output().context("sluice-bench send")?;
    anyhow::ensure!(out.status.success(), "sluice-bench send: {}", String::from_utf8_lossy(&out.stderr));
    // The woken loop publishes within 10 ticks.
    std::thread::sleep(Duration::from_millis(500));
    Ok(status_json(exe, &tb.b, sock)?["wake_ms"].as_f64())
}

/// The reaction of the daemon `exe` to a flood of a class with calm traffic
/// (module comment): (calm reached, its CPU with the calm traffic, reaction in ms).
fn reaction(exe: &Path, load: &Path, tb: &Testbed, dir: &Path) -> Result<(bool, f64, Option<f64>)> {
    let mut c = in_ns(&tb.b, None);
    c.arg(load).args(["serve", "udp-echo", "--no-echo", "--port", &REACT_PORT.to_string()]);
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let sink = Proc::spawn(c, "sluice-bench serve")?;
    std::thread::sleep(Duration::from_millis(300));
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("react.sock");
    let daemon = start_daemon(exe, &tb.b, IF_B, &sock, &[], &dir.join("react.log"))?;
    let dst = format!("{}:{REACT_PORT}", tb.ip_b);
    let send = |pps: u64, secs: f64| {
        let mut c = in_ns(&tb.a, Some(1));
        c.arg(load).args([
            "send",
            "--dst",
            &dst,
            "--rate",
            &pps.to_string(),
            "--duration",
            &secs.to_string(),
            "--json",
        ]);
        c
    };
    let mut calm_c = send(CALM_PPS, 30.0);
    calm_c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let calm_traffic = Proc::spawn(calm_c, "sluice-bench send")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let calm = loop {
        if status_json(exe, &tb.b, &sock)?["tick_ms"].as_f64().is_some_and(|t| t >= 100.0) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (c0, t0) = (threads_cpu_ns(daemon.id()).0, Instant::now());
    std::thread::sleep(CALM_WINDOW);
    let cpu = 100.0 * threads_cpu_ns(daemon.id()).0.saturating_sub(c0) as f64 / t0.elapsed().as_nanos() as f64;
    let mut took = None;
    if calm {
        let out = send(FLOOD_PPS, FLOOD_SECS).output().context("sluice-bench send")?;
        anyhow::ensure!(out.status.success(), "sluice-bench send: {}", String::from_utf8_lossy(&out.stderr));
        let start = serde_json::from_slice::<serde_json::Value>(&out.stdout)?["start_ns"].as_u64();
        std::thread::sleep(Duration::from_millis(500));
        let st = status_json(exe, &tb.b, &sock)?;
        let (at, to_loop) = (st["wake_gate_ns"].as_u64(), st["wake_ms"].as_f64());
        took = match (start, at, to_loop) {
            (Some(s), Some(a), Some(l)) if a >= s => Some((a - s) as f64 / 1e6 + l),
            _ => None,
        };
    }
    drop(calm_traffic); // killed: it was to run longer than needed
    daemon.terminate("sluice run")?;
    sink.terminate("sluice-bench serve")?;
    Ok((calm, cpu, took))
}

/// `rounds` rounds; in each, every binary with no service, then with `services`.
pub fn run(binaries: &[PathBuf], services: u32, rounds: usize, window: Duration, progress: bool) -> Result<Report> {
    sluice::dataplane::gate::check_privileges()?;
    let tb = Testbed::create(TestbedOpts { prefix: NS_PREFIX, ipv6: true }, &format!("{}-idle", std::process::id()))?;
    // Past the daemon's start, discovery and the first calm second.
    let settle = Duration::from_secs(4);
    // The service and the sender are this build's, whichever daemon is measured.
    let load = crate::load_exe(binaries.first().context("no sluice binary to measure")?);
    let (mut samples, mut reactions) = (vec![], vec![]);
    for round in 0..rounds {
        for exe in binaries {
            for n in [0, services] {
                if progress {
                    eprintln!("round {}/{rounds}: {} with {n} services, {:?}", round + 1, exe.display(), window);
                }
                let (cpu_pct, threads, wake_ms) = one(exe, &load, &tb, n, settle, window)
                    .with_context(|| format!("{} with {n} services", exe.display()))?;
                let binary = exe.display().to_string();
                samples.push(Sample { binary, services: n, round, cpu_pct, threads, wake_ms });
            }
            if progress {
                eprintln!("round {}/{rounds}: {}: a flood of a class with calm traffic", round + 1, exe.display());
            }
            let (calm, calm_cpu_pct, reaction_ms) =
                reaction(exe, &load, &tb, &scratch_dir()).with_context(|| format!("{}: reaction", exe.display()))?;
            reactions.push(Reaction { binary: exe.display().to_string(), round, calm, calm_cpu_pct, reaction_ms });
        }
    }
    Ok(Report { window_secs: window.as_secs_f64(), samples, reactions })
}

/// The table: per binary and service count, median % of a core and the range over rounds.
pub fn render(r: &Report) -> String {
    let mut keys: Vec<(String, u32)> = r.samples.iter().map(|s| (s.binary.clone(), s.services)).collect();
    keys.dedup();
    keys.sort();
    keys.dedup();
    let mut o = format!(
        "idle daemon CPU over {:.0} s windows (all threads, /proc/PID/task/*/schedstat), % of one core\n",
        r.window_secs
    );
    o += &format!(
        "{:<48} {:>8} {:>10} {:>20} {:>8} {:>16}\n",
        "BINARY", "SERVICES", "MEDIAN", "RANGE", "THREADS", "WAKE ms (max)"
    );
    for (b, n) in keys {
        let mine: Vec<&Sample> = r.samples.iter().filter(|s| s.binary == b && s.services == n).collect();
        let v: Vec<f64> = mine.iter().map(|s| s.cpu_pct).collect();
        let threads = mine.first().map_or(0, |s| s.threads);
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        let med = median(&v).map_or("-".to_string(), |m| format!("{m:.3}%"));
        let wakes: Vec<f64> = mine.iter().filter_map(|s| s.wake_ms).collect();
        let wake = median(&wakes)
            .map_or("n/a".to_string(), |m| format!("{m:.2} ({:.2})", wakes.iter().fold(0.0, |a: f64, &x| a.max(x))));
        o += &format!(
            "{b:<48} {n:>8} {med:>10} {:>20} {threads:>8} {wake:>16}\n",
            format!("{lo:.3}-{hi:.3}% ({} runs)", v.len())
        );
    }
    o += "WAKE: the gate's wake call to the calm loop, median (max) over rounds; n/a: not reported (a build without it)\n";
    o + &render_reactions(r)
}

/// The reactions: per binary, each round's.
fn render_reactions(r: &Report) -> String {
    let mut o = format!(
        "\nreaction: a class at {CALM_PPS}/s flooded at {FLOOD_PPS}/s, from the flood's first packet to the next tick, ms\n"
    );
    let mut bins: Vec<&str> = vec![];
    for x in &r.reactions {
        if !bins.contains(&x.binary.as_str()) {
            bins.push(&x.binary);
        }
    }
    for b in bins {
        let mine: Vec<&Reaction> = r.reactions.iter().filter(|x| x.binary == b).collect();
        let each: Vec<String> = mine
            .iter()
            .map(|x| match (x.calm, x.reaction_ms) {
                (false, _) => "never calm (<= 10)".to_string(),
                (true, Some(ms)) => format!("{ms:.2}"),
                (true, None) => "n/a".to_string(),
            })
            .collect();
        let ms: Vec<f64> = mine.iter().filter_map(|x| x.reaction_ms).collect();
        let med = median(&ms).map_or("-".to_string(), |m| format!("{m:.2}"));
        let cpu: Vec<f64> = mine.iter().map(|x| x.calm_cpu_pct).collect();
        let cpu = median(&cpu).map_or("-".to_string(), |m| format!("{m:.3}%"));
        o += &format!("{b:<48} median {med:>8}   rounds: {}   CPU with the calm traffic {cpu}\n", each.join(", "));
    }
    o + "never calm: the daemon ticked at 10 ms throughout; n/a: calm, but no wake reported (a build without the wake's clock, or none)\n\
         CPU with the calm traffic: the daemon's threads over 5 s of it before the flood (median), % of one core\n"
}
