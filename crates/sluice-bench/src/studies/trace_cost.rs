//! `sluice bench trace`: what `sluice trace` costs the service it watches.
//!
//! The demo scenario's victim (nic model, a static limit at the calibrated
//! peak, so the gate is attached) at 1x its peak, measured in interleaved
//! windows: no trace, `sluice trace --samples-per-sec 0` (counting only) and
//! `sluice trace` with its default sampling, each started in the victim's
//! namespace as a user would and stopped with SIGINT after the window. The
//! figure is delivered throughput with tracing over the untraced windows of
//! the same round (target: at least 95%), with the rounds' spread.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::scenarios::scenario::{self, ConfigKind};
use crate::scenarios::sweep::{calibrate, Stat};
use crate::testbed::rig::Rig;
use crate::testbed::victim::{VictimModel, IF_B};

/// The traced configurations, in the order each round runs them.
pub const MODES: [(&str, Option<u32>); 3] = [("untraced", None), ("counting", Some(0)), ("sampling", Some(2000))];

pub struct Opts {
    pub exe: PathBuf,
    pub rounds: u32,
    pub secs: f64,
}

/// One window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Window {
    pub mode: String,
    pub round: u32,
    pub sent_pps: f64,
    pub delivered_pps: f64,
    /// The trace's own ledger over its run (sampling/counting windows): unaccounted, % of applied.
    pub trace_unaccounted_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub peak_pps: f64,
    pub windows: Vec<Window>,
    /// Per traced mode: delivered over the same round's untraced window.
    pub ratios: Vec<(String, Stat)>,
}

/// Start `sluice trace` on the victim's interface; returns once its programs are loaded.
fn start_trace(exe: &PathBuf, ns: &str, samples: u32) -> Result<Child> {
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(["trace", "--iface", IF_B, "--duration", "600", "--json", "--samples-per-sec", &samples.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sluice trace")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !trace_loaded() {
        if Instant::now() > deadline {
            bail!("sluice trace did not load its programs within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    Ok(child)
}

/// Whether a `sluice trace` (not the daemon's drop counter alone) has its programs loaded.
fn trace_loaded() -> bool {
    libbpf_rs::query::ProgInfoIter::default().any(|p| p.name.to_string_lossy() == "trace_stack")
}

/// Stop a trace with SIGINT and read its report's worst unaccounted share.
fn stop_trace(child: Child) -> Result<Option<f64>> {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("sluice trace failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let r: sluice::surface::trace::fate::Report =
        serde_json::from_slice(&out.stdout).context("reading sluice trace's JSON")?;
    Ok(r.classes
        .iter()
        .filter(|c| c.ledger.applied > 1000)
        .filter_map(|c| c.ledger.unaccounted_pct)
        .max_by(f64::total_cmp))
}

pub fn run(o: &Opts) -> Result<Results> {
    sluice::dataplane::gate::check_privileges()?;
    let mut s = scenario::load("demo")?;
    s.duration = o.secs;
    let mut rig = Rig::start(&s, VictimModel::Nic, &o.exe, "trace")?;
    let bar = ProgressBar::new((o.rounds as usize * MODES.len()) as u64);
    let cal = calibrate(&mut rig, 4e6, &bar)?;
    let peak = cal.iter().map(|c| c.delivered_pps).fold(0.0, f64::max);
    rig.apply_config(ConfigKind::Static, peak)?;
    let mut windows = Vec::new();
    for round in 0..o.rounds {
        for (mode, samples) in MODES {
            bar.set_message(format!("round {round}: {mode}"));
            let child = samples.map(|n| start_trace(&o.exe, &rig.tb.net.b, n)).transpose()?;
            let r = rig.measure(ConfigKind::Static, 1.0, peak, round)?;
            let trace_unaccounted_pct = child.map(stop_trace).transpose()?.flatten();
            windows.push(Window {
                mode: mode.to_string(),
                round,
                sent_pps: r.sent_pps,
                delivered_pps: r.delivered_pps,
                trace_unaccounted_pct,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let ratios = MODES[1..]
        .iter()
        .map(|(mode, _)| {
            let per_round = (0..o.rounds).map(|round| {
                let of = |m: &str| windows.iter().find(|w| w.round == round && w.mode == m).map(|w| w.delivered_pps);
                Some(of(mode)? / of("untraced")?.max(1.0))
            });
            (mode.to_string(), Stat::of(per_round))
        })
        .collect();
    Ok(Results { peak_pps: peak, windows, ratios })
}

pub fn summary(r: &Results) -> String {
    let mut o = format!(
        "sluice trace's cost at 1x load (nic model, static limit at the calibrated peak {}/s):\n",
        sluice::base::fmt::human(r.peak_pps)
    );
    for (mode, _) in MODES {
        let d = Stat::of_all(r.windows.iter().filter(|w| w.mode == mode).map(|w| w.delivered_pps));
        let u = Stat::of(r.windows.iter().filter(|w| w.mode == mode).map(|w| w.trace_unaccounted_pct));
        o += &format!(
            "  {mode:<10} delivered {}/s median (min-max); trace ledger unaccounted {}\n",
            d.show(sluice::base::fmt::human),
            if mode == "untraced" { "-".to_string() } else { u.show(|v| format!("{v:.2}%")) }
        );
    }
    for (mode, st) in &r.ratios {
        o += &format!(
            "  {mode} / untraced in the same round: {} (target >= 95%)\n",
            st.show(|v| format!("{:.1}%", v * 100.0))
        );
    }
    o
}
