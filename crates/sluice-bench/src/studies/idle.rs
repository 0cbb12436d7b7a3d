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
//!
//! Last, once per round and binary, the daemon under a closed-port flood:
//! the sink with its CALM_PPS of clients, and `--flood-rate` packets/s to
//! a closed port, both senders on CPU 1, where the flood's receive work
//! runs too (a socket sender reaches what its CPU allows: the report shows
//! the rate). After FLOOD_SETTLE of the flood, the daemon's CPU over the
//! window, and of it the softirq time run while its threads were on a CPU
//! (`daemon_softirq_secs`: receive work for the flood that the kernel
//! charged to the daemon, this kernel having no IRQ_TIME_ACCOUNTING). The
//! rest is its own work. Whether the daemon was controlling (ticking at
//! 10 ms) at the window's end is shown beside it.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::testbed::procs::{in_ns, start_daemon, status_json, Proc};
use crate::testbed::victim::NS_PREFIX;
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

/// The closed-port flood case: how long it floods before the window opens.
const FLOOD_SETTLE: Duration = Duration::from_secs(2);
/// The closed port it floods.
const CLOSED_PORT: u16 = 9999;

/// One window of the daemon under a closed-port flood.
#[derive(Debug, Clone, Serialize)]
pub struct FloodSample {
    pub binary: String,
    pub round: usize,
    /// The daemon's threads' CPU over the window, % of one core.
    pub cpu_pct: f64,
    /// Of it, softirq run while its threads were on a CPU (None: not
    /// reported by the build, or not counted).
    pub softirq_pct: Option<f64>,
    /// The rest: its own work (None where the softirq part is).
    pub own_pct: Option<f64>,
    /// The flood as the sender sent it, packets/s.
    pub flood_pps: f64,
    /// The daemon's tick at the window's end, ms (10: controlling; None: not reported).
    pub tick_ms: Option<f64>,
}

/// Every sample, and per (binary, services) the median and range.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub window_secs: f64,
    pub samples: Vec<Sample>,
    pub reactions: Vec<Reaction>,
    /// The closed-port flood case (empty: not run, `--flood-rate 0`).
    #[serde(default)]
    pub floods: Vec<FloodSample>,
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
    let daemon = start_daemon(exe, (&tb.b, None), IF_B, &sock, &[], &dir.join("daemon.log"))?;
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
    let sink = start_sink(load, tb)?;
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("react.sock");
    let daemon = start_daemon(exe, (&tb.b, None), IF_B, &sock, &[], &dir.join("react.log"))?;
    let send = |pps: u64, secs: f64| send_cmd(load, tb, (REACT_PORT, pps), secs);
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

/// The sink on REACT_PORT in B (the service of the reaction and the flood
/// cases), given 300 ms to bind before a daemon starts and discovers it.
fn start_sink(load: &Path, tb: &Testbed) -> Result<Proc> {
    let mut c = in_ns(&tb.b, None);
    c.arg(load).args(["serve", "udp-echo", "--no-echo", "--port", &REACT_PORT.to_string()]);
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let sink = Proc::spawn(c, "sluice-bench serve")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(sink)
}

/// `sluice-bench send --json` from A, on CPU 1, to B's `port` at `pps` for `secs`.
fn send_cmd(load: &Path, tb: &Testbed, (port, pps): (u16, u64), secs: f64) -> std::process::Command {
    let mut c = in_ns(&tb.a, Some(1));
    let dst = format!("{}:{port}", tb.ip_b);
    c.arg(load).args(["send", "--dst", &dst, "--rate", &pps.to_string(), "--duration", &secs.to_string(), "--json"]);
    c
}

/// What one closed-port flood window measured: CPU and softirq % of a
/// core, the flood's packets/s, the tick at the end.
type Flooded = (f64, Option<f64>, f64, Option<f64>);

/// The daemon `exe` under a closed-port flood of `pps` (module comment).
fn closed_port_flood(
    exe: &Path,
    load: &Path,
    tb: &Testbed,
    dir: &Path,
    (settle, window): (Duration, Duration),
    pps: u64,
) -> Result<Flooded> {
    let sink = start_sink(load, tb)?;
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("flood.sock");
    let daemon = start_daemon(exe, (&tb.b, None), IF_B, &sock, &[], &dir.join("flood.log"))?;
    std::thread::sleep(settle);
    let secs = (FLOOD_SETTLE + window + Duration::from_secs(1)).as_secs_f64();
    let send = |to: (u16, u64)| {
        let mut c = send_cmd(load, tb, to, secs);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        Proc::spawn(c, "sluice-bench send")
    };
    let clients = send((REACT_PORT, CALM_PPS))?;
    let sender = send((CLOSED_PORT, pps))?;
    std::thread::sleep(FLOOD_SETTLE);
    let soft = || crate::testbed::procs::daemon_softirq_secs(exe, &tb.b, &sock);
    let (c0, s0, t0) = (threads_cpu_ns(daemon.id()).0, soft(), Instant::now());
    std::thread::sleep(window);
    let (c1, s1) = (threads_cpu_ns(daemon.id()).0, soft());
    let elapsed = t0.elapsed().as_secs_f64();
    let tick_ms = status_json(exe, &tb.b, &sock)?["tick_ms"].as_f64();
    let cpu = 100.0 * c1.saturating_sub(c0) as f64 / (elapsed * 1e9);
    let softirq = s0.zip(s1).map(|(a, b)| 100.0 * (b - a).max(0.0) / elapsed);
    let sent = crate::testbed::procs::json_of(sender.into_output()?, "sluice-bench send")?;
    let field = |k: &str| sent[k].as_f64().with_context(|| format!("sluice-bench send's report has no {k}"));
    let rate = field("sent")? / field("secs")?.max(1e-9);
    drop(clients);
    daemon.terminate("sluice run")?;
    sink.terminate("sluice-bench serve")?;
    Ok((cpu, softirq, rate, tick_ms))
}

/// `rounds` rounds; in each, every binary with no service, then with
/// `services`, the reaction, and a closed-port flood of `flood_pps` (0: not run).
pub fn run(
    binaries: &[PathBuf],
    (services, flood_pps): (u32, u64),
    rounds: usize,
    window: Duration,
    progress: bool,
) -> Result<Report> {
    sluice::dataplane::gate::check_privileges()?;
    let tb = Testbed::create(
        TestbedOpts { prefix: NS_PREFIX, ipv6: true, queues: 1 },
        &format!("{}-idle", std::process::id()),
    )?;
    // Past the daemon's start, discovery and the first calm second.
    let settle = Duration::from_secs(4);
    // The service and the sender are this build's, whichever daemon is measured.
    let load = crate::load_exe(binaries.first().context("no sluice binary to measure")?);
    let (mut samples, mut reactions, mut floods) = (vec![], vec![], vec![]);
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
            if flood_pps == 0 {
                continue;
            }
            if progress {
                eprintln!("round {}/{rounds}: {}: a closed-port flood of {flood_pps}/s", round + 1, exe.display());
            }
            let (cpu_pct, softirq_pct, flood_pps, tick_ms) =
                closed_port_flood(exe, &load, &tb, &scratch_dir(), (settle, window), flood_pps)
                    .with_context(|| format!("{}: closed-port flood", exe.display()))?;
            let own_pct = softirq_pct.map(|s| (cpu_pct - s).max(0.0));
            let binary = exe.display().to_string();
            floods.push(FloodSample { binary, round, cpu_pct, softirq_pct, own_pct, flood_pps, tick_ms });
        }
    }
    Ok(Report { window_secs: window.as_secs_f64(), samples, reactions, floods })
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
        let (lo, hi) = range(&v);
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
    o + &render_reactions(r) + &render_floods(r)
}

/// The least and the largest of `v`.
fn range(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)))
}

/// Each binary once, in the order first measured.
fn in_order<'a>(binaries: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut bins: Vec<&str> = vec![];
    for b in binaries {
        if !bins.contains(&b) {
            bins.push(b);
        }
    }
    bins
}

/// The closed-port flood: per binary, medians and ranges over rounds.
fn render_floods(r: &Report) -> String {
    if r.floods.is_empty() {
        return String::new();
    }
    let mut o = format!(
        "\nunder a closed-port flood (a service with {CALM_PPS}/s of clients; the daemon's threads over {:.0} s windows), % of one core\n",
        r.window_secs
    );
    o += &format!(
        "{:<48} {:>22} {:>22} {:>22} {:>12} {:>10}\n",
        "BINARY", "CPU", "SOFTIRQ", "OWN WORK", "FLOOD pps", "TICK ms"
    );
    let spread = |v: &[f64]| match median(v) {
        None => "n/a".to_string(),
        Some(m) => {
            let (lo, hi) = range(v);
            format!("{m:.2}% ({lo:.2}-{hi:.2})")
        }
    };
    for b in in_order(r.floods.iter().map(|x| x.binary.as_str())) {
        let mine: Vec<&FloodSample> = r.floods.iter().filter(|x| x.binary == b).collect();
        let cpu: Vec<f64> = mine.iter().map(|x| x.cpu_pct).collect();
        let soft: Vec<f64> = mine.iter().filter_map(|x| x.softirq_pct).collect();
        let own: Vec<f64> = mine.iter().filter_map(|x| x.own_pct).collect();
        let pps: Vec<f64> = mine.iter().map(|x| x.flood_pps).collect();
        let pps = median(&pps).map_or("n/a".to_string(), |p| format!("{p:.0}"));
        let ticks: Vec<String> =
            mine.iter().map(|x| x.tick_ms.map_or("n/a".to_string(), |t| format!("{t:.0}"))).collect();
        o += &format!(
            "{b:<48} {:>22} {:>22} {:>22} {pps:>12} {:>10}\n",
            spread(&cpu),
            spread(&soft),
            spread(&own),
            ticks.join(",")
        );
    }
    o + "medians (range) over rounds; SOFTIRQ: receive work run while the daemon's threads were on a CPU \
         (status daemon_softirq_secs; n/a: not reported); OWN WORK: CPU less SOFTIRQ (target: at most 2%); \
         TICK: each round's tick at the window's end (10: controlling, 500: calm)\n"
}

/// The reactions: per binary, each round's.
fn render_reactions(r: &Report) -> String {
    let mut o = format!(
        "\nreaction: a class at {CALM_PPS}/s flooded at {FLOOD_PPS}/s, from the flood's first packet to the next tick, ms\n"
    );
    for b in in_order(r.reactions.iter().map(|x| x.binary.as_str())) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_without_its_softirq_part_shows_its_own_work_as_missing() {
        let f = |binary: &str, softirq_pct: Option<f64>| FloodSample {
            binary: binary.into(),
            round: 0,
            cpu_pct: 2.0,
            softirq_pct,
            own_pct: softirq_pct.map(|s| 2.0 - s),
            flood_pps: 1e5,
            tick_ms: Some(10.0),
        };
        let floods = vec![f("new", Some(0.5)), f("old", None)];
        let out = render_floods(&Report { window_secs: 15.0, samples: vec![], reactions: vec![], floods });
        let new = out.lines().find(|l| l.starts_with("new")).expect("a row per binary");
        assert!(new.contains("2.00% (2.00-2.00)") && new.contains("1.50% (1.50-1.50)"), "{new}");
        let old = out.lines().find(|l| l.starts_with("old")).expect("a row per binary");
        assert_eq!(old.matches("n/a").count(), 2, "softirq and own work missing, not 0: {old}");
        assert!(
            render_floods(&Report { window_secs: 1.0, samples: vec![], reactions: vec![], floods: vec![] }).is_empty()
        );
    }
}
