//! `sluice bench step`: how each configuration follows changes, in one
//! continuous run per configuration (the generator never stops):
//!
//! | phase | from | what changes |
//! |---|---|---|
//! | flood | 0 | a flood at `flood` x the calibrated peak, plus the legitimate probe |
//! | cost x2 | 1P | the service's per-datagram work grows by 1/peak, doubling its whole cost: capacity halves |
//! | cost back | 2P | the work is restored: capacity doubles |
//! | flood stops | 3P | the flood stream pauses; the probe goes on |
//! | flood again | 4P | the flood resumes |
//!
//! A sampler reads the victim's gate and UDP counters every 10 ms. Per phase:
//! the steady admitted and delivered rates (last 40% of the phase), the
//! settling time (from the change until the admitted rate, averaged over
//! 100 ms, comes within 10% of its steady value and stays there for 300 ms),
//! the overshoot, the coefficient of
//! variation of the admitted rate over the phase's last second (10 ms ticks),
//! and the probe's loss and p99 RTT. For the two flood onsets also the
//! engage time (from the change until the first 10 ms sample in which the
//! gate admitted under half of what arrived: ENGAGED, the sample period its
//! resolution) and the probe's loss in the onset's first 500 ms (ONSET).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::scenarios::matrix::{interleave, Planned, Results};
use crate::scenarios::scenario::{ConfigKind, Scenario};
use crate::scenarios::sweep::run_on_rigs;
use crate::testbed::rig::Rig;
use crate::testbed::victim::VictimModel;
use sluice::base::fmt::missing_or;
use sluice_testkit::summary::{coefficient_of_variation, percentile};

/// The sampling period of the time series.
pub const SAMPLE: Duration = Duration::from_millis(10);
/// Settling band around the steady value, and the averaging window.
const BAND: f64 = 0.10;
const SMOOTH_TICKS: usize = 10;
/// Settled = inside the band for this long.
const HOLD_SECS: f64 = 0.3;

pub const PHASES: [&str; 5] = ["flood", "cost x2", "cost back", "flood stops", "flood again"];
/// The phases a flood starts in.
const ONSETS: [usize; 2] = [0, 4];
/// A sample in which the gate admitted under this share of the arrivals is engaged.
const ENGAGED: f64 = 0.5;
/// The onset's first stretch, seconds, for the probe's loss in it.
const ONSET: f64 = 0.5;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct StepPoint {
    pub t: f64,
    pub offered_pps: f64,
    pub admitted_pps: f64,
    pub delivered_pps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseStats {
    pub name: String,
    pub start: f64,
    pub steady_admitted_pps: f64,
    pub steady_delivered_pps: f64,
    /// Seconds from the change until the admitted rate settles; None: never.
    pub settle_secs: Option<f64>,
    /// Highest 100 ms admitted rate above the steady value, as a fraction of it.
    pub overshoot: f64,
    /// None: fewer than two ticks, or nothing admitted.
    pub admitted_cv: Option<f64>,
    pub legit_loss: f64,
    /// None: no reply came back in the phase.
    pub legit_p99_us: Option<f64>,
    /// A flood onset: seconds from the change until the first sample in
    /// which the gate admitted under ENGAGED of the arrivals (None: never,
    /// or not an onset).
    #[serde(default)]
    pub engage_secs: Option<f64>,
    /// A flood onset: the probe's loss in its first ONSET seconds (None:
    /// not an onset, or the probe sent nothing then).
    #[serde(default)]
    pub legit_loss_onset: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRun {
    pub model: VictimModel,
    pub config: ConfigKind,
    pub peak_pps: f64,
    pub flood_pps: f64,
    pub phase_secs: f64,
    pub phases: Vec<PhaseStats>,
    pub trace: Vec<StepPoint>,
    /// Auto configurations: the controller's own trace (target, capacity, queue, state).
    #[serde(default)]
    pub controller: Vec<sluice::daemon::auto::TracePoint>,
}

/// What a step run was: the testbed's scenario (its streams and victim).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepHead {
    pub testbed: Scenario,
}

/// results.json of `bench step`: the envelope every family writes, one
/// cell per model and configuration.
pub type StepResults = Results<StepHead, StepRun>;

pub struct StepOpts {
    pub models: Vec<VictimModel>,
    pub configs: Vec<ConfigKind>,
    pub phase_secs: f64,
    /// Flood rate as a multiple of the calibrated peak.
    pub flood: f64,
    pub exe: std::path::PathBuf,
    /// Set by SIGINT or SIGTERM: the run stops before its next cell.
    pub interrupted: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The settling time, overshoot and steady value of one phase's admitted series.
pub fn settle(points: &[StepPoint], start: f64, steady_from: f64) -> (f64, Option<f64>, f64) {
    let adm: Vec<(f64, f64)> = points.iter().map(|p| (p.t, p.admitted_pps)).collect();
    let tail: Vec<f64> = adm.iter().filter(|(t, _)| *t >= steady_from).map(|p| p.1).collect();
    let steady = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let smooth: Vec<(f64, f64)> = adm
        .windows(SMOOTH_TICKS)
        .map(|w| (w[w.len() - 1].0, w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64))
        .collect();
    // The first time the smoothed rate is inside the band and stays there for HOLD_SECS.
    let inside = |v: f64| (v - steady).abs() <= BAND * steady;
    let settle = (0..smooth.len())
        .find(|&i| {
            let until = smooth[i].0 + HOLD_SECS;
            smooth[i..].iter().take_while(|p| p.0 <= until).all(|p| inside(p.1))
                && smooth.last().is_some_and(|l| l.0 >= until)
        })
        .map(|i| (smooth[i].0 - start).max(0.0));
    let peak = smooth.iter().map(|p| p.1).fold(0.0, f64::max);
    let overshoot = if steady > 0.0 { (peak / steady - 1.0).max(0.0) } else { 0.0 };
    (steady, settle, overshoot)
}

/// The seconds from `start` until the first point in which the gate
/// admitted under ENGAGED of the arrivals (None: none did).
pub fn engage(points: &[StepPoint], start: f64) -> Option<f64> {
    points.iter().find(|p| p.offered_pps > 0.0 && p.admitted_pps < ENGAGED * p.offered_pps).map(|p| p.t - start)
}

/// The probe's loss: `sent` probes, of which those sent in [s_ns, e_ns)
/// have a reply in `replies` (sent, received; None: nothing sent).
fn loss_between(replies: &[(u64, u64)], (s_ns, e_ns): (u64, u64), sent: u64) -> Option<f64> {
    let got = replies.iter().filter(|r| r.0 >= s_ns && r.0 < e_ns).count() as f64;
    (sent > 0).then(|| 1.0 - (got / sent as f64).min(1.0))
}

/// Phase `k`'s figures from the run's trace, the probe's (sent, received)
/// times, the run's start on the monotonic clock, and the probe's sent count
/// at the phase's start, ONSET seconds into it, and at its end.
fn phase_stats(
    k: usize,
    phase_secs: f64,
    trace: &[StepPoint],
    replies: &[(u64, u64)],
    mono0: u64,
    legit_sent: (u64, u64, u64),
) -> PhaseStats {
    let (start, end) = (k as f64 * phase_secs, (k + 1) as f64 * phase_secs);
    let pts: Vec<StepPoint> = trace.iter().copied().filter(|p| p.t > start && p.t <= end).collect();
    let (steady, settle_secs, overshoot) = settle(&pts, start, end - 0.4 * phase_secs);
    let deliv: Vec<f64> = pts.iter().filter(|p| p.t >= end - 0.4 * phase_secs).map(|p| p.delivered_pps).collect();
    let cv: Vec<f64> = pts.iter().filter(|p| p.t >= end - 1.0).map(|p| p.admitted_pps).collect();
    let (s_ns, e_ns) = (mono0 + (start * 1e9) as u64, mono0 + (end * 1e9) as u64);
    let mut rtts: Vec<f64> =
        replies.iter().filter(|r| r.0 >= s_ns && r.0 < e_ns).map(|r| r.1.saturating_sub(r.0) as f64 / 1e3).collect();
    rtts.sort_by(f64::total_cmp);
    let sent = legit_sent.2.saturating_sub(legit_sent.0);
    let onset = ONSETS.contains(&k);
    let onset_ns = (s_ns, mono0 + ((start + ONSET) * 1e9) as u64);
    PhaseStats {
        name: PHASES[k].into(),
        start,
        steady_admitted_pps: steady,
        steady_delivered_pps: deliv.iter().sum::<f64>() / deliv.len().max(1) as f64,
        settle_secs,
        overshoot,
        admitted_cv: coefficient_of_variation(&cv),
        legit_loss: loss_between(replies, (s_ns, e_ns), sent).unwrap_or(0.0),
        legit_p99_us: percentile(&rtts, 0.99),
        engage_secs: if onset { engage(&pts, start) } else { None },
        legit_loss_onset: if onset {
            loss_between(replies, onset_ns, legit_sent.1.saturating_sub(legit_sent.0))
        } else {
            None
        },
    }
}

fn one_run(env: &mut Rig, config: ConfigKind, peak: f64, o: &StepOpts) -> Result<StepRun> {
    env.apply_config(config, peak)?;
    let flood_pps = o.flood * peak;
    // Twice the whole per-datagram cost (1 / peak), not just twice the work.
    let doubled_work = env.scenario.victim.work_ns + (1e9 / peak.max(1.0)) as u64;
    let streams = env.load_streams(flood_pps)?;
    let flood_idx: Vec<usize> = (0..streams.len()).filter(|&i| !streams[i].1).collect();
    let legit_idx = streams.iter().position(|s| s.1);
    let total = o.phase_secs * PHASES.len() as f64;
    let done = env.send_for(Duration::from_secs_f64(total + 0.2));
    let _ = env.take_replies();
    // Sample from the generator's CPU: on the victim's it would steal from the service.
    sluice::base::netns::pin_thread(env.tb.gen_cpu)?;
    let t0 = Instant::now();
    let mono0 = crate::load::gen::mono_ns();
    let mut trace = vec![];
    let legit_sent = |env: &Rig| legit_idx.map_or(Ok(0), |i| env.gen_counts().map(|c| c[i].sent));
    let mut legit_sent_at = vec![]; // legit sent count at each phase start, and at the end
    let mut legit_sent_onset = [0u64; PHASES.len()]; // and ONSET seconds into each phase
    let (mut last_at, mut last) = (t0, env.tick_counters()?);
    let mut next = t0;
    let (mut phase, mut onset_taken) = (0, false);
    legit_sent_at.push(legit_sent(env)?);
    while phase < PHASES.len() {
        next += SAMPLE;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        let c = env.tick_counters()?;
        let dt = now.duration_since(last_at).as_secs_f64();
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt;
        trace.push(StepPoint {
            t: now.duration_since(t0).as_secs_f64(),
            offered_pps: d(last.seen, c.seen),
            admitted_pps: d(last.admitted, c.admitted),
            delivered_pps: d(last.delivered, c.delivered),
        });
        (last_at, last) = (now, c);
        let elapsed = now.duration_since(t0).as_secs_f64();
        if !onset_taken && elapsed >= phase as f64 * o.phase_secs + ONSET {
            legit_sent_onset[phase] = legit_sent(env)?;
            onset_taken = true;
        }
        if elapsed >= (phase + 1) as f64 * o.phase_secs {
            phase += 1;
            onset_taken = false;
            legit_sent_at.push(legit_sent(env)?);
            match phase {
                1 => env.set_service_work(Some(doubled_work))?,
                2 => env.set_service_work(None)?,
                3 => flood_idx.iter().try_for_each(|&i| env.set_stream_rate(i, 0.0))?,
                4 => flood_idx.iter().try_for_each(|&i| env.set_stream_rate(i, streams[i].0.rate))?,
                _ => {}
            }
        }
    }
    done.recv().context("generator")??;
    std::thread::sleep(Duration::from_millis(200));
    let replies = env.take_replies();
    let phases = (0..PHASES.len())
        .map(|k| {
            let sent = (legit_sent_at[k], legit_sent_onset[k].max(legit_sent_at[k]), legit_sent_at[k + 1]);
            phase_stats(k, o.phase_secs, &trace, &replies, mono0, sent)
        })
        .collect();
    let controller = env.auto_trace();
    Ok(StepRun {
        model: env.tb.model,
        config,
        peak_pps: peak,
        flood_pps,
        phase_secs: o.phase_secs,
        phases,
        trace,
        controller,
    })
}

/// Run the step experiment for every model and configuration, on the
/// matrix runner: OUT/results.json is rewritten after every run, so an
/// interrupted run keeps what it measured.
pub fn run(scenario: &Scenario, o: &StepOpts, out: &Path) -> Result<StepResults> {
    sluice::dataplane::gate::check_privileges()?;
    let plan: Vec<Planned<(VictimModel, ConfigKind)>> = o
        .models
        .iter()
        .flat_map(|&m| {
            interleave(&o.configs.iter().filter(|c| c.applies_to(m)).map(|&c| (m, c)).collect::<Vec<_>>(), 1)
        })
        .collect();
    run_on_rigs(
        scenario,
        &o.exe,
        ("step", StepHead { testbed: scenario.clone() }),
        &plan,
        &o.interrupted,
        out,
        |(m, c)| format!("{} {}: {} phases of {} s", m.name(), c.name(), PHASES.len(), o.phase_secs),
        |b, &config| one_run(&mut b.rig, config, b.peak, o),
    )
}

/// The table printed at the end.
pub fn summary(r: &StepResults) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for run in &r.cells {
        let _ = writeln!(
            o,
            "{} {}: peak {}/s, flood {}/s, phases of {} s",
            run.model.name(),
            run.config.name(),
            sluice::base::fmt::human(run.peak_pps),
            sluice::base::fmt::human(run.flood_pps),
            run.phase_secs
        );
        let _ = writeln!(
            o,
            "  {:<12} {:>9} {:>9} {:>8} {:>9} {:>6} {:>7} {:>8} {:>8} {:>10}",
            "phase", "admit/s", "deliv/s", "settle", "overshoot", "cv", "loss", "p99 us", "engage", "loss 0.5s"
        );
        for p in &run.phases {
            let onset = ONSETS.iter().any(|&k| PHASES[k] == p.name);
            let engage = match (onset, p.engage_secs) {
                (false, _) => "".into(),
                (true, None) => "never".into(),
                (true, Some(s)) => format!("{:.0}ms", s * 1e3),
            };
            let onset_loss =
                if onset { missing_or(p.legit_loss_onset, |v| format!("{:.2}%", v * 100.0)) } else { "".into() };
            let _ = writeln!(
                o,
                "  {:<12} {:>9} {:>9} {:>8} {:>8.1}% {:>6} {:>6.2}% {:>8} {:>8} {:>10}",
                p.name,
                sluice::base::fmt::human(p.steady_admitted_pps),
                sluice::base::fmt::human(p.steady_delivered_pps),
                p.settle_secs.map_or("never".into(), |s| format!("{:.0}ms", s * 1e3)),
                p.overshoot * 100.0,
                missing_or(p.admitted_cv, |v| format!("{:.1}%", v * 100.0)),
                p.legit_loss * 100.0,
                missing_or(p.legit_p99_us, |v| format!("{v:.0}")),
                engage,
                onset_loss
            );
        }
    }
    o
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[&StepRun],
    delivered: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    let what = if delivered { "delivered" } else { "admitted" };
    let t1 = runs.iter().flat_map(|r| r.trace.last()).map(|p| p.t).fold(1.0, f64::max);
    let y1 = runs
        .iter()
        .flat_map(|r| r.trace.iter())
        .map(|p| if delivered { p.delivered_pps } else { p.admitted_pps })
        .fold(1.0, f64::max);
    let y1 = y1.min(runs.iter().map(|r| r.peak_pps * 2.5).fold(1.0, f64::max));
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{what} rate through the steps ({} model)", runs[0].model.name()), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t1, 0.0..y1 * 1.05)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("time (s); phases: flood | cost x2 | cost back | flood stops | flood again")
        .y_desc(format!("{what} (packets/s, 100 ms mean)"))
        .y_label_formatter(&|v| sluice::base::fmt::human(*v))
        .draw()
        .map_err(e)?;
    for r in runs {
        let col = crate::report::colour(r.config);
        let pts: Vec<(f64, f64)> = r
            .trace
            .windows(SMOOTH_TICKS)
            .map(|w| {
                (
                    w[w.len() - 1].t,
                    w.iter().map(|p| if delivered { p.delivered_pps } else { p.admitted_pps }).sum::<f64>()
                        / w.len() as f64,
                )
            })
            .collect();
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(2)))
            .map_err(e)?
            .label(r.config.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], col.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// results.json, step.csv (the time series), figures, and summary.txt into `dir`.
pub fn write_all(r: &StepResults, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    r.save(dir)?;
    let mut csv = String::from("model,config,t,offered_pps,admitted_pps,delivered_pps\n");
    for run in &r.cells {
        for p in &run.trace {
            csv += &format!(
                "{},{},{:.3},{:.0},{:.0},{:.0}\n",
                run.model.name(),
                run.config.name(),
                p.t,
                p.offered_pps,
                p.admitted_pps,
                p.delivered_pps
            );
        }
    }
    std::fs::write(dir.join("step.csv"), csv)?;
    std::fs::write(dir.join("summary.txt"), summary(r))?;
    crate::report::plot::register_font()?;
    let mut models: Vec<VictimModel> = r.cells.iter().map(|x| x.model).collect();
    models.dedup();
    for m in models {
        let runs: Vec<&StepRun> = r.cells.iter().filter(|x| x.model == m).collect();
        for delivered in [false, true] {
            let stem = format!("step-{}-{}", m.name(), if delivered { "delivered" } else { "admitted" });
            let _svg = crate::report::plot::svg_and_png!(dir, stem, (900, 460), |root| draw(root, &runs, delivered));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(v: &[f64]) -> Vec<StepPoint> {
        v.iter()
            .enumerate()
            .map(|(i, &a)| StepPoint {
                t: (i + 1) as f64 * 0.01,
                offered_pps: 0.0,
                admitted_pps: a,
                delivered_pps: 0.0,
            })
            .collect()
    }

    /// The step's results are the versioned envelope the other families
    /// write (they were an unversioned step.json before), and load back.
    #[test]
    fn step_results_are_the_versioned_envelope() {
        let dir = tempfile::tempdir().unwrap();
        let testbed = crate::scenarios::scenario::load("default").unwrap();
        let r = StepResults::new("step", StepHead { testbed });
        r.save(dir.path()).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
        assert_eq!((v["schema_version"].as_u64(), v["scenario"].as_str()), (Some(1), Some("step")));
        assert!(v["testbed"]["victim"].is_object(), "{v}");
        crate::scenarios::matrix::load::<StepHead, StepRun>(&dir.path().join("results.json")).unwrap();
    }

    #[test]
    fn engage_time_is_the_first_sample_that_drops_over_half() {
        let p = |t: f64, offered: f64, admitted: f64| StepPoint {
            t,
            offered_pps: offered,
            admitted_pps: admitted,
            delivered_pps: 0.0,
        };
        let pts = [p(3.01, 100.0, 100.0), p(3.02, 1000.0, 900.0), p(3.03, 1000.0, 499.0), p(3.04, 1000.0, 100.0)];
        let e = engage(&pts, 3.0).unwrap();
        assert!((e - 0.03).abs() < 1e-9, "{e}");
        assert_eq!(engage(&pts[..2], 3.0), None, "never under half");
        assert_eq!(engage(&[p(3.01, 0.0, 0.0)], 3.0), None, "nothing arrived: not engaged");
        assert_eq!(loss_between(&[(5, 9), (7, 9), (20, 30)], (0, 10), 4), Some(0.5));
        assert_eq!(loss_between(&[], (0, 10), 0), None, "nothing sent: missing, not 0");
    }

    #[test]
    fn settling_time_and_overshoot_of_a_step() {
        // 10 ticks at 200, then steady at 100: smoothing over 10 ticks is
        // inside the 10% band once at most one 200 is in the window.
        let mut v = vec![200.0; 10];
        v.extend([100.0; 40]);
        let (steady, settle_s, over) = settle(&pts(&v), 0.0, 0.3);
        assert_eq!(steady, 100.0);
        assert!((settle_s.unwrap() - 0.19).abs() < 1e-9, "{settle_s:?}");
        assert!((over - 1.0).abs() < 1e-9);
        // Never 300 ms in a row inside the band: never settled.
        let v: Vec<f64> = (0..100).map(|i| if (i / 20) % 2 == 0 { 100.0 } else { 300.0 }).collect();
        assert_eq!(settle(&pts(&v), 0.0, 0.0).1, None);
    }
}
