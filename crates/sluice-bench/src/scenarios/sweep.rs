//! A whole bench run: for each victim model, calibrate the victim's peak,
//! then measure every level x configuration x repeat, interleaving the
//! configurations at each level so drifts of the machine hit them alike.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::Result;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::scenarios::level::LevelResult;
use crate::scenarios::matrix::{self, interleave, Planned, Runner};
use crate::scenarios::scenario::{ConfigKind, Scenario, SCHEMA_VERSION};
use crate::testbed::rig::Rig;
use crate::testbed::victim::VictimModel;
use sluice_testkit::summary::median;

/// Calibration: the load doubles from this rate until the delivered rate falls
/// below CALIB_STOP of the best seen (past the knee) or the cap is reached.
const CALIB_START: f64 = 20_000.0;
const CALIB_STOP: f64 = 0.8;
/// Loss below this fraction counts as loss-free (for the MLFRR). Not zero:
/// a window's edges cut through packets in flight, and a socket queue of a few
/// hundred datagrams overflows now and then at any load on a shared VM.
pub const LOSS_FREE: f64 = 0.005;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    pub sent_pps: f64,
    pub delivered_pps: f64,
}

/// Median and range of one metric over the repeats of a level. Repeats
/// without a value (no reply came back, nothing was delivered) are counted in
/// `missing` and left out; with none left, median, min and max are None.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    #[serde(default)]
    pub missing: u32,
}

impl Stat {
    pub fn of(v: impl IntoIterator<Item = Option<f64>>) -> Stat {
        let all: Vec<Option<f64>> = v.into_iter().collect();
        let v: Vec<f64> = all.iter().flatten().copied().filter(|x| x.is_finite()).collect();
        Stat {
            median: median(&v),
            min: v.iter().copied().reduce(f64::min),
            max: v.iter().copied().reduce(f64::max),
            missing: (all.len() - v.len()) as u32,
        }
    }

    /// Of values every repeat has.
    pub fn of_all(v: impl IntoIterator<Item = f64>) -> Stat {
        Stat::of(v.into_iter().map(Some))
    }

    /// "median (min-max)" for a table, or "n/a"; `show` formats one value.
    pub fn show(&self, show: impl Fn(f64) -> String) -> String {
        match (self.median, self.min, self.max) {
            (Some(m), Some(lo), Some(hi)) if lo == hi => format!("{}{}", show(m), self.missing_note()),
            (Some(m), Some(lo), Some(hi)) => format!("{} ({}-{}){}", show(m), show(lo), show(hi), self.missing_note()),
            _ => "n/a".to_string(),
        }
    }

    fn missing_note(&self) -> String {
        if self.missing > 0 {
            format!(" [{} n/a]", self.missing)
        } else {
            String::new()
        }
    }
}

/// The repeats of one (configuration, level), summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub config: ConfigKind,
    pub multiple: f64,
    pub asked_pps: f64,
    pub sent_pps: Stat,
    pub delivered_pps: Stat,
    pub legit_replies_pps: Stat,
    pub legit_loss: Stat,
    pub legit_p99_us: Stat,
    pub cpu_busy: Stat,
    /// The same CPU by /proc/stat, beside the idle-thread figure.
    #[serde(default)]
    pub cpu_busy_procstat: Stat,
    /// Repeats whose two CPU meters disagree by more than CPU_METERS_BOUND.
    #[serde(default)]
    pub cpu_meters_disagree: u32,
    pub ns_per_delivered: Stat,
    /// Every repeat reached the asked rate (within 2%).
    pub valid: bool,
    /// The NAPI study's side measurements: the victim's outbound flow (Mb/s
    /// received) and ping's mean round trip (us).
    #[serde(default)]
    pub outbound_mbps: Stat,
    #[serde(default)]
    pub ping_avg_us: Stat,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRun {
    pub model: VictimModel,
    /// Which CPU runs which stage.
    pub stages: Vec<(String, usize)>,
    pub calibration: Vec<CalibrationPoint>,
    /// The victim's peak delivered rate (datagrams/s), from the calibration.
    pub peak_pps: f64,
    /// Maximum loss-free receive rate: the highest sent rate (calibration, `off`)
    /// with less than LOSS_FREE (0.5%) lost, and the per-packet cost it implies.
    pub mlfrr_pps: Option<f64>,
    pub mlfrr_ns_per_packet: Option<f64>,
    /// The static configuration's rate (packets/s).
    pub static_rate: f64,
    pub results: Vec<LevelResult>,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub kernel: String,
    pub cpu: String,
    pub cpus: usize,
    pub sluice: String,
}

impl Machine {
    pub fn here() -> Machine {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").map(|x| x.trim_start_matches([' ', '\t', ':']).to_string()))
            .unwrap_or_default();
        Machine { kernel, cpu, cpus: num_cpus(), sluice: env!("CARGO_PKG_VERSION").to_string() }
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Everything a run produced: results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema_version: u32,
    pub scenario: Scenario,
    pub machine: Machine,
    /// Seconds since the Unix epoch at the start.
    pub started: u64,
    pub models: Vec<ModelRun>,
}

pub struct SweepOpts {
    pub exe: PathBuf,
    pub progress: bool,
    /// Set by SIGINT/SIGTERM: the run stops before its next level, removing its testbed.
    pub interrupted: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

pub(crate) fn summarise(results: &[LevelResult], configs: &[ConfigKind], multiples: &[f64]) -> Vec<Point> {
    let mut out = Vec::new();
    for &m in multiples {
        for &c in configs {
            let rs: Vec<&LevelResult> = results.iter().filter(|r| r.config == c && r.multiple == m).collect();
            if rs.is_empty() {
                continue;
            }
            out.push(Point {
                config: c,
                multiple: m,
                asked_pps: rs[0].asked_pps,
                sent_pps: Stat::of_all(rs.iter().map(|r| r.sent_pps)),
                delivered_pps: Stat::of_all(rs.iter().map(|r| r.delivered_pps)),
                legit_replies_pps: Stat::of_all(rs.iter().map(|r| r.legit_replies_pps)),
                legit_loss: Stat::of_all(rs.iter().map(|r| r.legit_loss)),
                legit_p99_us: Stat::of(rs.iter().map(|r| r.rtt.p99_us)),
                cpu_busy: Stat::of_all(rs.iter().map(|r| r.cpu_busy)),
                cpu_busy_procstat: Stat::of_all(rs.iter().map(|r| r.cpu_busy_procstat)),
                cpu_meters_disagree: rs.iter().filter(|r| !r.cpu_meters_agree()).count() as u32,
                ns_per_delivered: Stat::of(rs.iter().map(|r| r.ns_per_delivered)),
                valid: rs.iter().all(|r| r.valid),
                outbound_mbps: Stat::of(rs.iter().map(|r| r.outbound_mbps)),
                ping_avg_us: Stat::of(rs.iter().map(|r| r.ping_avg_us)),
            });
        }
    }
    out
}

/// The levels actually run: multiples of the peak whose load fits under the cap.
pub fn levels(scenario: &Scenario, peak: f64) -> Vec<(f64, f64)> {
    scenario.levels.iter().map(|&m| (m, m * peak)).filter(|&(_, r)| r <= scenario.max_rate).collect()
}

/// One model's rig and the peak its calibration found, for the families
/// that run each model's cells on one rig (step, recovery).
pub struct Calibrated {
    pub model: VictimModel,
    pub rig: Rig,
    pub peak: f64,
}

impl Calibrated {
    /// `slot`'s rig if it is `model`'s; else the old one removed first, a
    /// new rig started (named `tag`-MODEL) and calibrated (progress on `bar`).
    pub fn for_model<'a>(
        slot: &'a mut Option<Calibrated>,
        scenario: &Scenario,
        model: VictimModel,
        exe: &Path,
        tag: &str,
        bar: &ProgressBar,
    ) -> Result<&'a mut Calibrated> {
        if slot.as_ref().map(|c| c.model) != Some(model) {
            *slot = None;
            let mut rig = Rig::start(scenario, model, exe, &format!("{tag}-{}", model.name()))?;
            let cal = calibrate(&mut rig, scenario.max_rate, bar)?;
            let peak = cal.iter().map(|p| p.delivered_pps).fold(0.0, f64::max);
            *slot = Some(Calibrated { model, rig, peak });
        }
        Ok(slot.as_mut().expect("set above"))
    }
}

/// Run `plan` on the matrix runner, each model's cells on one calibrated
/// rig (`tag`-MODEL): the cells go to OUT/results.json, the envelope of
/// `family` with `head`, rewritten after every cell so an interrupted run
/// keeps what it measured.
#[allow(clippy::too_many_arguments)]
pub fn run_on_rigs<K, H: Serialize, C: Serialize + Clone>(
    scenario: &Scenario,
    exe: &Path,
    (family, head): (&str, H),
    plan: &[Planned<(VictimModel, K)>],
    interrupted: &AtomicBool,
    out: &Path,
    label: impl Fn(&(VictimModel, K)) -> String,
    mut cell: impl FnMut(&mut Calibrated, &K) -> Result<C>,
) -> Result<matrix::Results<H, C>> {
    std::fs::create_dir_all(out)?;
    let mut results = matrix::Results::new(family, head);
    let mut runner = Runner::new(plan.len(), interrupted, true);
    // The display, for a model's calibration before its first cell.
    let bar = runner.bar().clone();
    let mut bed: Option<Calibrated> = None;
    let cells = runner.run(
        plan,
        |w, _| label(w),
        |(model, what), _| cell(Calibrated::for_model(&mut bed, scenario, *model, exe, family, &bar)?, what),
        |cells| {
            results.cells = cells.to_vec();
            results.save(out)
        },
    )?;
    runner.finish();
    results.cells = cells;
    Ok(results)
}

pub fn calibrate(env: &mut Rig, max_rate: f64, bar: &ProgressBar) -> Result<Vec<CalibrationPoint>> {
    let (d, w) = (env.scenario.duration, env.scenario.warmup);
    env.scenario.duration = d.min(1.0);
    env.scenario.warmup = w.min(0.3);
    env.apply_config(ConfigKind::Off, 0.0)?;
    // A first run to warm everything up (service, page pools, caches), not recorded.
    env.measure(ConfigKind::Off, 0.0, CALIB_START, 0)?;
    let mut points = Vec::new();
    let mut rate = CALIB_START;
    let mut best: f64 = 0.0;
    while rate <= max_rate {
        bar.set_message(format!("{} calibrating at {:.0}k pkt/s", env.tb.model.name(), rate / 1e3));
        let r = env.measure(ConfigKind::Off, 0.0, rate, 0)?;
        points.push(CalibrationPoint { sent_pps: r.sent_pps, delivered_pps: r.delivered_pps });
        best = best.max(r.delivered_pps);
        if r.delivered_pps < CALIB_STOP * best {
            break;
        }
        rate *= 2.0;
    }
    // Refine around the best point: the doubling steps are coarse near the knee.
    let best_sent =
        points.iter().max_by(|a, b| a.delivered_pps.total_cmp(&b.delivered_pps)).map(|p| p.sent_pps).unwrap_or(0.0);
    for f in [1.25, 1.5] {
        let rate = best_sent * f;
        if rate > max_rate {
            break;
        }
        bar.set_message(format!("{} calibrating at {:.0}k pkt/s", env.tb.model.name(), rate / 1e3));
        let r = env.measure(ConfigKind::Off, 0.0, rate, 0)?;
        points.push(CalibrationPoint { sent_pps: r.sent_pps, delivered_pps: r.delivered_pps });
    }
    env.scenario.duration = d;
    env.scenario.warmup = w;
    Ok(points)
}

/// Run a scenario; `on_model` is called after each model with the results so far.
pub fn run(scenario: &Scenario, opts: &SweepOpts, mut on_model: impl FnMut(&Results) -> Result<()>) -> Result<Results> {
    sluice::dataplane::gate::check_privileges()?;
    anyhow::ensure!(num_cpus() >= 2, "the bench needs 2 CPUs: one generates load, one is the victim");
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut results = Results {
        schema_version: SCHEMA_VERSION,
        scenario: scenario.clone(),
        machine: Machine::here(),
        started,
        models: vec![],
    };
    let configs_of =
        |m: VictimModel| -> Vec<ConfigKind> { scenario.configs.iter().copied().filter(|c| c.applies_to(m)).collect() };
    let total: usize =
        scenario.models.iter().map(|&m| scenario.levels.len() * configs_of(m).len() * scenario.repeats as usize).sum();
    let mut runner = Runner::new(total, &opts.interrupted, opts.progress);
    for &model in &scenario.models {
        let configs = configs_of(model);
        let mut env = Rig::start(scenario, model, &opts.exe, model.name())?;
        let calibration = calibrate(&mut env, scenario.max_rate, runner.bar())?;
        let peak = calibration.iter().map(|p| p.delivered_pps).fold(0.0, f64::max);
        let mlfrr = calibration
            .iter()
            .filter(|p| p.delivered_pps >= (1.0 - LOSS_FREE) * p.sent_pps)
            .map(|p| p.sent_pps)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let static_rate = scenario.static_rate * peak;
        let lv = levels(scenario, peak);
        runner.skip((scenario.levels.len() - lv.len()) * configs.len() * scenario.repeats as usize);
        // Level by level; at each, every configuration side by side, `repeats` times.
        let plan: Vec<Planned<(f64, f64, ConfigKind)>> = lv
            .iter()
            .flat_map(|&(m, rate)| {
                let at: Vec<_> = configs.iter().map(|&c| (m, rate, c)).collect();
                interleave(&at, scenario.repeats)
            })
            .collect();
        let label = |&(m, rate, c): &(f64, f64, ConfigKind), _| {
            format!("{} {:>6} at {m}x ({:.0}k pkt/s)", model.name(), c.name(), rate / 1e3)
        };
        let runs = runner.run(
            &plan,
            label,
            |&(m, rate, c), rep| {
                env.apply_config(c, static_rate)?;
                env.measure(c, m, rate, rep)
            },
            |_| Ok(()),
        )?;
        let multiples: Vec<f64> = lv.iter().map(|l| l.0).collect();
        results.models.push(ModelRun {
            model,
            stages: model.stages(env.tb.gen_cpu, env.tb.victim_cpu),
            points: summarise(&runs, &configs, &multiples),
            calibration,
            peak_pps: peak,
            mlfrr_pps: mlfrr,
            mlfrr_ns_per_packet: mlfrr.map(|r| 1e9 / r),
            static_rate,
            results: runs,
        });
        drop(env);
        on_model(&results)?;
    }
    runner.finish();
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_levels() {
        let s = Stat::of_all([3.0, 1.0, 2.0, f64::INFINITY]);
        assert_eq!((s.median, s.min, s.max), (Some(2.0), Some(1.0), Some(3.0)));
        assert_eq!(s.missing, 1, "an infinite value (nothing delivered) is missing, not 0");
        let sc = crate::scenarios::scenario::load("demo").unwrap();
        let lv = levels(&sc, 200_000.0);
        // 0.5, 1, 2, 5, 10 x 200k; 10x = 2M is under the 3M cap.
        assert_eq!(lv.len(), 5);
        let lv = levels(&sc, 500_000.0);
        assert_eq!(lv.last().unwrap().0, 5.0, "10x 500k is over the generator cap");
    }

    /// Regression: the median of two repeats was the larger (v[len / 2]).
    #[test]
    fn the_median_of_two_repeats_is_their_mean() {
        let s = Stat::of_all([80_000.0, 100_000.0]);
        assert_eq!((s.median, s.min, s.max), (Some(90_000.0), Some(80_000.0), Some(100_000.0)));
        assert_eq!(s.show(|v| format!("{v:.0}")), "90000 (80000-100000)");
    }

    /// Regression: a level with no replies had a p99 of 0 us, and one that
    /// delivered nothing a cost of 0 ns per datagram.
    #[test]
    fn a_level_without_a_measurement_shows_none() {
        let s = Stat::of([None, None]);
        assert_eq!((s.median, s.missing), (None, 2));
        assert_eq!(s.show(|v| format!("{v:.0}")), "n/a");
        let s = Stat::of([Some(700.0), None]);
        assert_eq!((s.median, s.missing), (Some(700.0), 1));
        assert_eq!(s.show(|v| format!("{v:.0}")), "700 [1 n/a]");
    }
}
