//! The one loop every scenario family runs its cells through (the sweep's
//! levels, `dns`/`http`/`sources`, `readers`, `cpu`): a plan of cells, each
//! a configuration at a repeat, run in order with an interrupt check before
//! each, one progress display, and the results saved as they come so an
//! interrupted run keeps what it measured.
//!
//! Every family's `results.json` carries `schema_version` and `scenario`:
//! the sweep's in its own schema (docs/results-schema.md), the others in the
//! envelope [`Results`] (a family's head fields, then its cells).
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

/// Version of the [`Results`] envelope (cpu, readers, dns, http, sources).
pub const RESULTS_VERSION: u32 = 1;

/// A family's results file: its head (what the run was), then its cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results<H, C> {
    pub schema_version: u32,
    pub scenario: String,
    #[serde(flatten)]
    pub head: H,
    pub cells: Vec<C>,
}

impl<H: Serialize, C: Serialize> Results<H, C> {
    pub fn new(scenario: &str, head: H) -> Self {
        Results { schema_version: RESULTS_VERSION, scenario: scenario.to_string(), head, cells: vec![] }
    }

    /// Write OUT/results.json.
    pub fn save(&self, out: &Path) -> Result<()> {
        std::fs::write(out.join("results.json"), serde_json::to_string_pretty(self)?)?;
        Ok(())
    }
}

/// Read a family's results.json, checking its version.
pub fn load<H: for<'de> Deserialize<'de>, C: for<'de> Deserialize<'de>>(path: &Path) -> Result<Results<H, C>> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let version = v["schema_version"].as_u64().unwrap_or(0);
    if version != RESULTS_VERSION as u64 {
        bail!("{}: results version {version}, this bench reads {RESULTS_VERSION}", path.display());
    }
    Ok(serde_json::from_value(v)?)
}

/// One cell of a plan: what to run, at which repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned<K> {
    pub what: K,
    pub repeat: u32,
}

/// Each repeat runs every item in order, so configurations measured side by
/// side sit close in time (this VM's speed moves by the hour).
pub fn interleave<K: Clone>(items: &[K], repeats: u32) -> Vec<Planned<K>> {
    (0..repeats).flat_map(|repeat| items.iter().map(move |k| Planned { what: k.clone(), repeat })).collect()
}

/// Runs plans, one after another, against one progress display.
pub struct Runner<'a> {
    interrupted: &'a AtomicBool,
    bar: ProgressBar,
    /// No bar: a line per cell instead (families that print their results
    /// line by line, and output that is not a terminal).
    lines: bool,
    done: u64,
}

impl<'a> Runner<'a> {
    /// `total` cells over every plan this runner will run; `bar`: a
    /// progress bar, else a line per cell on stderr.
    pub fn new(total: usize, interrupted: &'a AtomicBool, bar: bool) -> Self {
        let b = if bar { ProgressBar::new(total as u64) } else { ProgressBar::hidden() };
        b.set_length(total as u64);
        b.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed}, ~{eta} left)").unwrap());
        Runner { interrupted, bar: b, lines: !bar, done: 0 }
    }

    /// The progress display, for what a family does between cells (calibration).
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Count `n` planned cells that will not run (a level over the generator's cap).
    pub fn skip(&mut self, n: usize) {
        self.done += n as u64;
        self.bar.inc(n as u64);
    }

    /// Stop here if SIGINT or SIGTERM came.
    pub fn check(&self) -> Result<()> {
        if self.interrupted.load(Ordering::Relaxed) {
            bail!("interrupted; the testbed is removed");
        }
        Ok(())
    }

    /// Run `plan` in order: `cell` measures one, `after` sees the cells so
    /// far (the families with a [`Results`] envelope save them there; the
    /// sweep saves a model's summary when its plan ends). `label` names a
    /// cell for the display.
    pub fn run<K, C>(
        &mut self,
        plan: &[Planned<K>],
        label: impl Fn(&K, u32) -> String,
        mut cell: impl FnMut(&K, u32) -> Result<C>,
        mut after: impl FnMut(&[C]) -> Result<()>,
    ) -> Result<Vec<C>> {
        let mut cells = Vec::with_capacity(plan.len());
        for p in plan {
            self.check()?;
            let name = label(&p.what, p.repeat);
            if self.lines {
                eprintln!("[{}/{}] {name}", self.done + 1, self.bar.length().unwrap_or(0));
            }
            self.bar.set_message(name);
            cells.push(cell(&p.what, p.repeat)?);
            after(&cells)?;
            self.done += 1;
            self.bar.inc(1);
        }
        Ok(cells)
    }

    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_interleave_the_configurations() {
        let p = interleave(&["off", "auto"], 2);
        let got: Vec<(&str, u32)> = p.iter().map(|p| (p.what, p.repeat)).collect();
        assert_eq!(got, [("off", 0), ("auto", 0), ("off", 1), ("auto", 1)]);
    }

    #[test]
    fn an_interrupt_stops_before_the_next_cell_and_keeps_what_ran() {
        let stop = AtomicBool::new(false);
        let mut r = Runner::new(3, &stop, false);
        let mut saved = 0;
        let plan = interleave(&[1, 2, 3], 1);
        let e = r
            .run(
                &plan,
                |k, _| format!("cell {k}"),
                |k, _| {
                    if *k == 2 {
                        stop.store(true, Ordering::Relaxed);
                    }
                    Ok(*k)
                },
                |c| {
                    saved = c.len();
                    Ok(())
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("interrupted"), "{e}");
        assert_eq!(saved, 2, "cells 1 and 2 saved, 3 never ran");
    }

    #[test]
    fn results_carry_their_version_and_scenario_and_round_trip() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Head {
            secs: f64,
        }
        let dir = tempfile::tempdir().unwrap();
        let mut r = Results::new("cpu", Head { secs: 2.0 });
        r.cells = vec![1u32, 2];
        r.save(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join("results.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!((v["schema_version"].as_u64(), v["scenario"].as_str()), (Some(1), Some("cpu")));
        assert_eq!(v["secs"].as_f64(), Some(2.0), "the head's fields sit at the top: {text}");
        let back: Results<Head, u32> = load(&dir.path().join("results.json")).unwrap();
        assert_eq!(back, r);
        std::fs::write(dir.path().join("results.json"), text.replace("\"schema_version\": 1", "\"schema_version\": 9"))
            .unwrap();
        assert!(load::<Head, u32>(&dir.path().join("results.json")).is_err());
    }
}
