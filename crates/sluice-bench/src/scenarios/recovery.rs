//! `sluice bench recovery`: how long the service takes to come back after a
//! flood ends (the NAPI study saw a server unstable for about as long as the flood
//! had lasted). One continuous run per (configuration, flood length), the
//! legitimate probe never stopping:
//!
//! | phase | length | load |
//! |---|---|---|
//! | before | `calm` s | the probe alone |
//! | flood | 10, 30 or 60 s | the probe and a flood at `flood` x the calibrated peak |
//! | after | as long as the flood (at least 10 s) | the probe alone |
//!
//! The probe's replies are binned by send time (BIN). The baseline is the
//! "before" phase without its first second: the probe's reply rate and the
//! median of its bins' median round trip. Recovered = the first bin after
//! the flood from which every bin for HOLD is back: reply rate at least 90%
//! of the baseline, median round trip at most 10% above it (or 20 us, on
//! this VM's few-tens-of-us round trips: whichever is larger).
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
use sluice_testkit::summary::median;

pub const BIN: f64 = 0.25;
pub const HOLD: f64 = 1.0;
const BAND: f64 = 0.10;
const RTT_FLOOR_US: f64 = 20.0;

/// One bin of the probe.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Bin {
    /// Seconds from the flood's start (negative: before it).
    pub t: f64,
    /// Replies to probes sent in the bin, per second.
    pub replies_pps: f64,
    /// Median round trip of those replies; None: no reply.
    pub rtt_p50_us: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecoveryRun {
    pub model: VictimModel,
    pub config: ConfigKind,
    pub flood_secs: f64,
    pub flood_pps: f64,
    pub base_replies_pps: f64,
    pub base_rtt_us: Option<f64>,
    /// Medians over the flood's bins (None: no bin in the flood).
    pub flood_replies_pps: Option<f64>,
    pub flood_rtt_us: Option<f64>,
    /// Seconds after the flood stopped until back within the band; None: not within the "after" phase.
    pub recovery_secs: Option<f64>,
    pub after_secs: f64,
    pub bins: Vec<Bin>,
}

pub struct RecoveryOpts {
    pub models: Vec<VictimModel>,
    pub configs: Vec<ConfigKind>,
    pub floods: Vec<f64>,
    pub calm: f64,
    /// Flood rate as a multiple of the calibrated peak.
    pub flood: f64,
    pub exe: std::path::PathBuf,
    /// Set by SIGINT or SIGTERM: the run stops before its next cell.
    pub interrupted: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a recovery run was: the testbed's scenario (its streams and victim).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecoveryHead {
    pub testbed: Scenario,
}

/// results.json of `bench recovery`: the envelope every family writes, one
/// cell per model, flood length and configuration.
pub type RecoveryResults = Results<RecoveryHead, RecoveryRun>;

/// Bin the probe's (sent, received) times from `t0` (ns, the flood's start).
pub fn bins(replies: &[(u64, u64)], t0: u64, from: f64, to: f64) -> Vec<Bin> {
    let n = ((to - from) / BIN).floor().max(0.0) as usize;
    let mut rtts: Vec<Vec<f64>> = vec![Vec::new(); n];
    for &(sent, recv) in replies {
        let t = (sent as f64 - t0 as f64) / 1e9;
        let i = ((t - from) / BIN).floor();
        if i >= 0.0 && (i as usize) < n {
            rtts[i as usize].push(recv.saturating_sub(sent) as f64 / 1e3);
        }
    }
    rtts.into_iter()
        .enumerate()
        .map(|(i, r)| Bin { t: from + i as f64 * BIN, replies_pps: r.len() as f64 / BIN, rtt_p50_us: median(&r) })
        .collect()
}

/// Whether a bin is back within the band of the baseline.
fn within(b: &Bin, base_pps: f64, base_rtt: Option<f64>) -> bool {
    let rate_ok = b.replies_pps >= (1.0 - BAND) * base_pps;
    let rtt_ok = match (b.rtt_p50_us, base_rtt) {
        (Some(r), Some(base)) => r <= base + (BAND * base).max(RTT_FLOOR_US),
        (None, _) => false,
        (Some(_), None) => true,
    };
    rate_ok && rtt_ok
}

/// Seconds from `end` (the flood's end) to the first bin from which HOLD
/// seconds of bins are all within the band; None if that never happens.
pub fn recovery(bins: &[Bin], end: f64, base_pps: f64, base_rtt: Option<f64>) -> Option<f64> {
    let after: Vec<&Bin> = bins.iter().filter(|b| b.t >= end - 1e-9).collect();
    let hold = (HOLD / BIN).round() as usize;
    (0..after.len().saturating_sub(hold - 1))
        .find(|&i| after[i..i + hold].iter().all(|b| within(b, base_pps, base_rtt)))
        .map(|i| after[i].t - end)
}

fn one_run(env: &mut Rig, config: ConfigKind, peak: f64, flood_secs: f64, o: &RecoveryOpts) -> Result<RecoveryRun> {
    env.apply_config(config, peak)?;
    let flood_pps = o.flood * peak;
    let streams = env.load_streams(flood_pps)?;
    let flood_idx: Vec<usize> = (0..streams.len()).filter(|&i| !streams[i].1).collect();
    anyhow::ensure!(streams.iter().any(|s| s.1), "the scenario has no legitimate stream to probe with");
    let after = flood_secs.max(10.0);
    let total = o.calm + flood_secs + after;
    for &i in &flood_idx {
        env.set_stream_rate(i, 0.0)?;
    }
    let done = env.send_for(Duration::from_secs_f64(total + 0.3));
    let _ = env.take_replies();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(o.calm));
    let t0 = crate::load::gen::mono_ns();
    for &i in &flood_idx {
        env.set_stream_rate(i, streams[i].0.rate)?;
    }
    std::thread::sleep(Duration::from_secs_f64(flood_secs));
    for &i in &flood_idx {
        env.set_stream_rate(i, 0.0)?;
    }
    std::thread::sleep(Duration::from_secs_f64(total).saturating_sub(start.elapsed()));
    done.recv().context("generator")??;
    std::thread::sleep(Duration::from_millis(300));
    let b = bins(&env.take_replies(), t0, -o.calm, flood_secs + after);
    // The calm phase less its first second (half of it, when shorter), the generator's start.
    let base: Vec<&Bin> = b.iter().filter(|x| x.t >= -o.calm + (o.calm / 2.0).min(1.0) && x.t < 0.0).collect();
    let base_replies_pps = base.iter().map(|x| x.replies_pps).sum::<f64>() / base.len().max(1) as f64;
    let base_rtt_us = median(&base.iter().filter_map(|x| x.rtt_p50_us).collect::<Vec<_>>());
    let during: Vec<&Bin> = b.iter().filter(|x| x.t >= 0.0 && x.t < flood_secs).collect();
    Ok(RecoveryRun {
        model: env.tb.model,
        config,
        flood_secs,
        flood_pps,
        base_replies_pps,
        base_rtt_us,
        flood_replies_pps: median(&during.iter().map(|x| x.replies_pps).collect::<Vec<_>>()),
        flood_rtt_us: median(&during.iter().filter_map(|x| x.rtt_p50_us).collect::<Vec<_>>()),
        recovery_secs: recovery(&b, flood_secs, base_replies_pps, base_rtt_us),
        after_secs: after,
        bins: b,
    })
}

/// Run every model, flood length and configuration on the matrix runner
/// (the configurations interleaved at each flood length): OUT/results.json
/// is rewritten after every run, so an interrupted run keeps what it measured.
pub fn run(scenario: &Scenario, o: &RecoveryOpts, out: &Path) -> Result<RecoveryResults> {
    sluice::dataplane::gate::check_privileges()?;
    let plan: Vec<Planned<(VictimModel, (f64, ConfigKind))>> = o
        .models
        .iter()
        .flat_map(|&m| {
            let cells: Vec<_> = o
                .floods
                .iter()
                .flat_map(|&f| o.configs.iter().filter(move |c| c.applies_to(m)).map(move |&c| (m, (f, c))))
                .collect();
            interleave(&cells, 1)
        })
        .collect();
    run_on_rigs(
        scenario,
        &o.exe,
        ("recovery", RecoveryHead { testbed: scenario.clone() }),
        &plan,
        &o.interrupted,
        out,
        |(m, (f, c))| format!("{} {}: {f} s flood", m.name(), c.name()),
        |b, &(flood_secs, config)| one_run(&mut b.rig, config, b.peak, flood_secs, o),
    )
}

pub fn summary(r: &RecoveryResults) -> String {
    let mut o = format!(
        "recovery after a flood (probe binned by {BIN} s; recovered = {HOLD} s of bins with replies >= 90% and p50 RTT <= 110% of before):\n"
    );
    o += &format!(
        "  {:<10} {:<8} {:>6} {:>9} {:>12} {:>9} {:>12} {:>14}\n",
        "model", "config", "flood", "before/s", "before p50", "during/s", "during p50", "recovered in"
    );
    for x in &r.cells {
        let us = |v: Option<f64>| missing_or(v, |u| format!("{u:.0} us"));
        o += &format!(
            "  {:<10} {:<8} {:>5}s {:>9.0} {:>12} {:>9} {:>12} {:>14}\n",
            x.model.name(),
            x.config.name(),
            x.flood_secs,
            x.base_replies_pps,
            us(x.base_rtt_us),
            missing_or(x.flood_replies_pps, |p| format!("{p:.0}")),
            us(x.flood_rtt_us),
            x.recovery_secs.map_or(format!("not in {:.0} s", x.after_secs), |s| format!("{s:.2} s"))
        );
    }
    o
}

pub fn write_all(r: &RecoveryResults, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    r.save(dir)?;
    std::fs::write(dir.join("summary.txt"), summary(r))?;
    crate::report::plot::register_font()?;
    let mut keys: Vec<(VictimModel, u64)> = r.cells.iter().map(|x| (x.model, x.flood_secs as u64)).collect();
    keys.dedup();
    for (model, secs) in keys {
        let runs: Vec<&RecoveryRun> =
            r.cells.iter().filter(|x| x.model == model && x.flood_secs as u64 == secs).collect();
        for rtt in [false, true] {
            let stem = format!("recovery-{}-{secs}s-{}", model.name(), if rtt { "rtt" } else { "replies" });
            let _svg = crate::report::plot::svg_and_png!(dir, stem, (900, 420), |root| draw(root, &runs, rtt));
        }
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[&RecoveryRun],
    rtt: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    let (plot, legend) = root.split_horizontally(760);
    let value = |b: &Bin| if rtt { b.rtt_p50_us } else { Some(b.replies_pps) };
    let all = runs.iter().flat_map(|r| r.bins.iter());
    let (x0, x1) = all.clone().fold((0.0f64, 1.0f64), |(a, b), p| (a.min(p.t), b.max(p.t + BIN)));
    let y1 = all.filter_map(value).fold(1.0, f64::max) * 1.1;
    let f = runs.first().map_or(0.0, |r| r.flood_secs);
    let title = format!("probe {} around a {f:.0} s flood", if rtt { "median RTT" } else { "replies" });
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("seconds from the flood's start (flood from 0 to the dashed line)")
        .y_desc(if rtt { "median round trip (us)" } else { "replies/s" })
        .draw()
        .map_err(e)?;
    let dashed = BLACK.mix(0.6).stroke_width(1);
    for x in [0.0, f] {
        chart.draw_series(DashedLineSeries::new([(x, 0.0), (x, y1)], 6, 4, dashed)).map_err(e)?;
    }
    let mut y = 40;
    for r in runs {
        let col = crate::report::colour(r.config);
        let pts: Vec<(f64, f64)> = r.bins.iter().filter_map(|b| Some((b.t + BIN / 2.0, value(b)?))).collect();
        chart.draw_series(LineSeries::new(pts, col.stroke_width(2))).map_err(e)?;
        legend.draw(&PathElement::new(vec![(8, y + 7), (30, y + 7)], col.stroke_width(3))).map_err(e)?;
        legend.draw(&Text::new(r.config.name().to_string(), (36, y), ("sans-serif", 14))).map_err(e)?;
        y += 22;
    }
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(t: f64, pps: f64, rtt: f64) -> Bin {
        Bin { t, replies_pps: pps, rtt_p50_us: Some(rtt) }
    }

    #[test]
    fn recovery_is_the_first_bin_that_stays_back_for_a_second() {
        let mut b = vec![bin(-1.0, 1000.0, 100.0)];
        // The flood ends at 10: two bad bins, one good, one bad, then good for good.
        for (i, ok) in [false, false, true, false, true, true, true, true, true].iter().enumerate() {
            let t = 10.0 + i as f64 * BIN;
            b.push(if *ok { bin(t, 1000.0, 105.0) } else { bin(t, 200.0, 5000.0) });
        }
        assert_eq!(recovery(&b, 10.0, 1000.0, Some(100.0)), Some(4.0 * BIN));
        // Too few good bins left: not recovered.
        b.truncate(b.len() - 2);
        assert_eq!(recovery(&b, 10.0, 1000.0, Some(100.0)), None);
    }

    #[test]
    fn a_bin_with_no_reply_or_a_slow_median_is_not_back() {
        assert!(!within(&Bin { t: 0.0, replies_pps: 1000.0, rtt_p50_us: None }, 1000.0, Some(100.0)));
        assert!(!within(&bin(0.0, 1000.0, 125.0), 1000.0, Some(100.0)), "25 us over: past 20 us and 10%");
        assert!(within(&bin(0.0, 1000.0, 118.0), 1000.0, Some(100.0)), "within the 20 us floor");
        assert!(!within(&bin(0.0, 890.0, 100.0), 1000.0, Some(100.0)));
    }

    #[test]
    fn replies_are_binned_by_send_time() {
        let t0 = 1_000_000_000u64;
        let r = [(t0 + 100_000_000, t0 + 100_050_000), (t0 + 300_000_000, t0 + 300_070_000)];
        let b = bins(&r, t0, 0.0, 0.5);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].replies_pps, 4.0);
        assert_eq!(b[0].rtt_p50_us, Some(50.0));
        assert_eq!(b[1].rtt_p50_us, Some(70.0));
    }
}
