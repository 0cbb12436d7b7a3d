//! The default algorithm: the limit is the capacity estimate (`estimate`),
//! paced in a cycle like BBR's ProbeBW.
//!
//! While the gate is limiting (it refuses part of what is offered), `T`
//! follows a cycle of CYCLE ticks: one tick over the estimate (a probe: if
//! the service can take more, it reads more, and the estimate's window keeps
//! the higher sample), one as far under it if the probe left a queue (a
//! drain: the probe's excess is read), then the estimate itself. A probe the
//! service took (no queue left) found a capacity that rose: the next tick
//! probes again, twice as far, while it keeps rising (BBR's STARTUP doubles
//! its rate the same way), so a doubled capacity is reached in a few ticks;
//! a probe it did not take makes the next one half as far.
//!
//! Loss overrides the cycle: an estimate just cut by a loss run, or a queue
//! over half the buffer at the tick's end, is followed by a drain tick
//! (what stands in the socket is read before more comes), then the cycle
//! resumes without a probe. A stall holds `T` where it was.
//!
//! With nothing refused (demand fits), `T` is the estimate: the class is
//! either unlimited (not engaged) or let go after RELEASE_TICKS.
use super::estimate::{Verdict, LOSS_SHARE};
use super::{Controller, CtlState, TickInput, OVERLOAD_QUEUE, QUEUE_LOW};

/// Ticks in one probe cycle (40 ms): a capacity that rose is found within
/// 40 ms even while the service is not saturated (BBR cycles through eight
/// phases of a round trip each; a tick here is far longer than the
/// service's queue takes to fill, so fewer are enough).
pub const CYCLE: u8 = 4;
/// How far over the estimate a probe goes, as a share of it: the first
/// probe PROBE_STEP; each probe the service took (it read at least half of
/// the excess) doubles the next one, to at least PROBE_STEP and up to
/// PROBE_STEP_MAX (a capacity ten
/// times the estimate, a limit started from a livelocked tick's reading, is
/// reached in about ten ticks, as BBR's STARTUP doubles its rate each round
/// trip); each one it did not take halves it, down to PROBE_STEP_MIN, so
/// the probes close in on the peak. BBR probes a network path at 5/4, where
/// sending too much only queues; a receive path is degradable (seed 003:
/// what is admitted over capacity costs the service CPU in the stack), and
/// a fixed probe past a livelocking plant's peak reads less than the peak,
/// so it never finds it.
pub const PROBE_STEP: f64 = 0.05;
pub const PROBE_STEP_MIN: f64 = 0.01;
pub const PROBE_STEP_MAX: f64 = 0.2;
/// A drain tick after loss or with the queue over half the buffer admits
/// this share of the estimate: what stands (at most a socket buffer, a few
/// ms of the service's reads) is read within a tick or two. The drain after
/// a probe mirrors the probe, no deeper than this.
pub const DRAIN_GAIN: f64 = 0.95;

impl Controller {
    pub(super) fn capacity_target(&mut self, s: &TickInput) -> f64 {
        let probed = self.gain > 1.0;
        let queued = s.queue_over(QUEUE_LOW);
        // What the probe's tick read of what arrived in it: a clean sample
        // of its own (`Estimate::took`), not to be averaged with the tick
        // before. Read whole (nothing dropped, no queue left): the capacity
        // rose, and the next probe goes twice as far; else it found the
        // capacity, and the next goes half as far. (Whole, not "over the
        // estimate by so much": the gate's bucket admits a little under its
        // rate, by more than a small probe's excess.)
        let took = s.delivered.min(s.admitted);
        let rose = probed && !queued && s.sock_drops == 0 && took >= s.admitted * (1.0 - LOSS_SHARE);
        if probed {
            if self.est.verdict == Verdict::Calm {
                self.est.took(took);
            }
            let step = if rose { (self.step * 2.0).max(PROBE_STEP) } else { self.step / 2.0 };
            self.step = step.clamp(PROBE_STEP_MIN, PROBE_STEP_MAX);
        }
        let cap = self.est.capacity;
        let (limiting, standing) = (s.limiting(), s.queue_over(OVERLOAD_QUEUE));
        let (probe, drain) = (1.0 + self.step, DRAIN_GAIN);
        // After a probe, a drain as far under the estimate as it went over.
        // (No deeper than DRAIN_GAIN: what a probe leaves queued is at most
        // a socket buffer, a few ms of reads.)
        let mirror = if probed { (2.0 - self.gain).max(drain) } else { drain };
        (self.state, self.gain) = match self.est.verdict {
            Verdict::Stalled => return self.target.max(self.tuning.min_pps),
            Verdict::Overloaded | Verdict::Losing => {
                // The estimate was cut to what the service read while
                // overloaded (less than it takes when not: the excess cost
                // it CPU); the next probes start from the first step.
                self.phase = 1;
                self.step = PROBE_STEP;
                (CtlState::Backoff, drain)
            }
            Verdict::Calm if standing => {
                self.phase = self.phase.max(1);
                (CtlState::Draining, drain)
            }
            Verdict::Calm if !limiting => {
                self.phase = CYCLE - 1;
                (CtlState::Idle, 1.0)
            }
            Verdict::Calm if rose => {
                // It took all of the probe: probe again at once, twice as far.
                self.phase = 0;
                (CtlState::Probing, probe)
            }
            Verdict::Calm => {
                self.phase = (self.phase + 1) % CYCLE;
                match self.phase {
                    0 => (CtlState::Probing, probe),
                    // The probe left a queue: it found the capacity; read the queue.
                    1 if queued => (CtlState::Draining, mirror),
                    _ => (CtlState::Cruising, 1.0),
                }
            }
        };
        cap * self.gain
    }
}
