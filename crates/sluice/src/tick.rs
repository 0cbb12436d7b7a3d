//! The control tick that `sluice run` runs every 10 ms, and the bench runs in
//! its control thread, so every bench figure measures the loop users run:
//! re-split each limited class's rate over CPUs by the arrivals each CPU saw
//! (see the design comment in gate.bpf.c), then run the auto controller.
use std::fmt::Display;

use anyhow::Result;

use crate::auto::AutoLoop;
use crate::config::{Config, Limit};
use crate::gate::Gate;

/// A class with a packets/s limit, and its per-CPU arrivals at the last split.
struct Split {
    class: usize,
    limit: Limit,
    last_seen: Vec<u64>,
}

/// What runs every tick for one config.
pub struct Ticker {
    splits: Vec<Split>,
    /// The controller of the `rate = "auto"` classes, if any.
    pub auto: Option<AutoLoop>,
    /// Ticks whose auto signals could not be read.
    pub auto_errors: u64,
}

impl Ticker {
    pub fn new(cfg: &Config, auto: Option<AutoLoop>) -> Ticker {
        let splits = cfg
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.limit, Limit::Rate { .. }))
            .map(|(class, c)| Split { class, limit: c.limit, last_seen: vec![] })
            .collect();
        Ticker { splits, auto, auto_errors: 0 }
    }

    /// A ticker with nothing to do (no config in place yet).
    pub fn idle() -> Ticker {
        Ticker { splits: vec![], auto: None, auto_errors: 0 }
    }

    /// One tick. A per-CPU split that cannot be written is an error (the
    /// gate's maps refuse writes: nothing later will work either). An auto
    /// signal that cannot be read is not: the gate keeps the last rates, and
    /// `log` hears of it at the 1st, 2nd, 4th, 8th... failure.
    pub fn tick(&mut self, gate: &Gate, log: impl Fn(&dyn Display)) -> Result<()> {
        for s in &mut self.splits {
            gate.rebalance(s.class, &s.limit, &mut s.last_seen)?;
        }
        if let Some(a) = &mut self.auto {
            if let Err(e) = a.tick(gate) {
                self.auto_errors += 1;
                if self.auto_errors.is_power_of_two() {
                    log(&format_args!("auto: reading signals failed ({} times so far): {e:#}", self.auto_errors));
                }
            }
        }
        Ok(())
    }
}
