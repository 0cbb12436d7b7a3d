//! Whether the services' signals (sock_diag, /proc) can be read, and when
//! their failing makes them stale.
use crate::policy::controller::STALE_TICKS;

/// While they stay unreadable, the log hears of it every this many ticks (10 s).
const SAY_EVERY_TICKS: u64 = 1000;

/// Whether the services' signals (sock_diag, /proc) could be read: the
/// failures in a row, in all, and the last error.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalWatch {
    pub failing: u64,
    pub errors: u64,
    pub last_error: Option<String>,
}

impl SignalWatch {
    /// A failed read: (now stale, worth a log line: the first failure of a
    /// run, the tick it goes stale, then every SAY_EVERY_TICKS).
    pub fn failed(&mut self, e: &dyn std::fmt::Display) -> (bool, bool) {
        self.failing += 1;
        self.errors += 1;
        self.last_error = Some(e.to_string());
        let say = self.failing == 1 || self.failing == STALE_TICKS || self.failing.is_multiple_of(SAY_EVERY_TICKS);
        (self.stale(), say)
    }

    /// A good read: Some(failures in the run it ends), if one ended.
    pub fn ok(&mut self) -> Option<u64> {
        let ended = std::mem::take(&mut self.failing);
        (ended > 0).then_some(ended)
    }

    pub fn stale(&self) -> bool {
        self.failing >= STALE_TICKS
    }

    /// How long the reads have failed in a row (None: the last one worked).
    pub fn stale_secs(&self) -> Option<f64> {
        (self.failing > 0).then(|| self.failing as f64 * crate::policy::controller::TICK.as_secs_f64())
    }
}
