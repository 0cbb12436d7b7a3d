//! `sluice bench idle`: what an always-on daemon costs while nothing
//! happens. `sluice run --iface vb` (the binary a user runs) in a fresh
//! testbed, with no service and no traffic, then with SERVICES idle UDP
//! services (each gets a class): its CPU time over a window, all threads
//! (/proc/PID/task/*/schedstat: time on a CPU, ns), as % of one core. Other
//! builds given with --compare are measured in the same run, interleaved
//! round by round, so a slow hour slows them all alike.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::procs::{in_ns, start_daemon, Proc};
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
}

/// Every sample, and per (binary, services) the median and range.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub window_secs: f64,
    pub samples: Vec<Sample>,
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

/// One window: the daemon `exe` in `tb` with `services` idle UDP services.
fn one(exe: &Path, tb: &Testbed, services: u32, settle: Duration, window: Duration) -> Result<(f64, usize)> {
    let holders: Vec<Proc> = (0..services)
        .map(|i| {
            let mut c = in_ns(&tb.b, None);
            c.arg(exe).args(["serve", "udp-echo", "--no-echo", "--port", &(7000 + i).to_string()]);
            c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            Proc::spawn(c, "sluice serve")
        })
        .collect::<Result<_>>()?;
    let dir = std::env::temp_dir().join(format!("sluice-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("idle.sock");
    let daemon = start_daemon(exe, &tb.b, IF_B, &sock, &[], &dir.join("daemon.log"))?;
    std::thread::sleep(settle);
    let (c0, t0) = (threads_cpu_ns(daemon.id()).0, Instant::now());
    std::thread::sleep(window);
    let (c1, threads) = threads_cpu_ns(daemon.id());
    let pct = 100.0 * c1.saturating_sub(c0) as f64 / t0.elapsed().as_nanos() as f64;
    daemon.terminate("sluice run")?;
    for h in holders {
        let _ = h.terminate("sluice serve");
    }
    Ok((pct, threads))
}

/// `rounds` rounds; in each, every binary with no service, then with `services`.
pub fn run(binaries: &[PathBuf], services: u32, rounds: usize, window: Duration, progress: bool) -> Result<Report> {
    sluice::dataplane::gate::check_privileges()?;
    let tb = Testbed::create(TestbedOpts { prefix: NS_PREFIX, ipv6: true }, &format!("{}-idle", std::process::id()))?;
    // Past the daemon's start, discovery and the first calm second.
    let settle = Duration::from_secs(4);
    let mut samples = vec![];
    for round in 0..rounds {
        for exe in binaries {
            for n in [0, services] {
                if progress {
                    eprintln!("round {}/{rounds}: {} with {n} services, {:?}", round + 1, exe.display(), window);
                }
                let (cpu_pct, threads) =
                    one(exe, &tb, n, settle, window).with_context(|| format!("{} with {n} services", exe.display()))?;
                samples.push(Sample { binary: exe.display().to_string(), services: n, round, cpu_pct, threads });
            }
        }
    }
    Ok(Report { window_secs: window.as_secs_f64(), samples })
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
    o += &format!("{:<48} {:>8} {:>10} {:>20} {:>8}\n", "BINARY", "SERVICES", "MEDIAN", "RANGE", "THREADS");
    for (b, n) in keys {
        let v: Vec<f64> = r.samples.iter().filter(|s| s.binary == b && s.services == n).map(|s| s.cpu_pct).collect();
        let threads = r.samples.iter().find(|s| s.binary == b && s.services == n).map_or(0, |s| s.threads);
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        let med = median(&v).map_or("-".to_string(), |m| format!("{m:.3}%"));
        o += &format!("{b:<48} {n:>8} {med:>10} {:>20} {threads:>8}\n", format!("{lo:.3}-{hi:.3}% ({} runs)", v.len()));
    }
    o
}
