//! The capacity estimate: what a class's service takes, from the one
//! quantity that says it, the rate the service read (`TickInput::delivered`).
//! Both algorithms keep it (the default one sets its limit from it, the
//! baseline reports it beside its own target); it is pure arithmetic on the
//! tick's signals.
//!
//! Like BBR's bottleneck bandwidth (Cardwell et al., "BBR: Congestion-Based
//! Congestion Control", ACM Queue 2016), it is a windowed maximum: what the
//! service kept up with in a tick, it can keep up with, so every sample is a
//! lower bound on its capacity and the largest recent one is the estimate. A
//! sample is what both arrived and was read: the lower of the admitted and
//! delivered rates, over SAMPLE_TICKS ticks. Not the delivered rate alone: a
//! tick in which the service emptied its queue read more than arrived, and
//! faster than it can for long (on a receive path that shares the service's
//! CPU, fewer arrivals leave it more CPU). The window is WINDOW_TICKS long,
//! so an estimate nothing confirms is forgotten.
//!
//! A maximum only rises by itself; loss brings it down, as BBR v2 bounds its
//! estimate on loss. Two kinds of loss count:
//! - a loss run (`Verdict::Overloaded`, what engages the controller):
//!   LOSS_TICKS ticks in a row each with socket drops and the queue over
//!   half the buffer at its end (a burst that overflowed and drained is
//!   not), or with drops before the socket (the gate's interface's backlog);
//! - while the gate limits, the sockets dropping over LOSS_SHARE of what it
//!   admitted over LOSS_TICKS, in all of them but one (`Verdict::Losing`):
//!   the limit is above what the service takes, though no single tick ends
//!   with a full queue.
//!
//! Either way the mean the service read over those ticks (`taken`) says what
//! it takes now (at most one cut per LOSS_TICKS, each judged on ticks under
//! the last; loss short of a loss run within LOSS_TICKS of a probe is the
//! probe's and cuts nothing):
//! - admitted over OVER_ADMIT times the estimate: the gate let through far
//!   more than the service ever showed it takes (no limit yet, a flood that
//!   livelocks the receive path): the estimate stands, the loss is the gate's;
//! - the last tick read under STALL_SHARE of the estimate, with nothing lost
//!   before the socket: the service (nearly) stopped reading. A stall (a VM
//!   pause, a restart, a reader stuck) must not collapse the estimate, so it
//!   is held for STALL_HOLD_SECS; a stall that lasts longer is the service's
//!   new state, and the estimate follows it down;
//! - otherwise the capacity fell (another process took the CPU) or the
//!   estimate was high: it becomes `taken`, and the window restarts from it.
use std::collections::VecDeque;

use super::owed::Owed;
use super::{unknown_share, TickInput, ENGAGE_TICKS};

/// Ticks (10 s) the windowed maximum remembers a sample: long against a
/// flood's pauses and the calm between floods, so a class meets the next
/// wave at the capacity the last one measured (loss, not time, is what
/// brings a high estimate down); like KNEE_MEMORY_SECS, a capacity nothing
/// has confirmed for that long is forgotten.
pub const WINDOW_TICKS: u64 = 1_000;
/// Ticks one sample spans (20 ms). One tick's count carries noise: the
/// socket's queue drained into it (a few dozen datagrams), the counters read
/// a little apart, VM steal; on the bench's veth a single tick read up to 8%
/// over the service's mean, and the maximum of such samples sits above what
/// it takes. Two ticks halve that and still see a probe (whose own tick is
/// judged alone, `Estimate::took`); the loss cut takes back the rest.
pub const SAMPLE_TICKS: usize = 2;
/// Ticks of loss in a row (30 ms) before the estimate moves down: a probe
/// overflows the socket for a tick, a burst for one or two.
pub const LOSS_TICKS: u32 = 3;
/// Share of what the gate admitted that the sockets may drop while it
/// limits (BBR v2's loss threshold, 2%): a socket buffer of a few dozen
/// datagrams (4 KiB each on veth with XDP) overflows now and then at any
/// rate near capacity, as the tick's jitter moves arrivals and reads; more
/// than this over LOSS_TICKS, with drops in all of them but one, is a limit
/// above what the service takes. (One tick's burst of drops is the service
/// descheduled for a few ms, which a lower limit would not have helped.)
pub const LOSS_SHARE: f64 = 0.02;
/// Share of the last ENGAGE_TICKS ticks with socket drops that, with
/// LOSS_SHARE of what was admitted lost over them, is steady loss
/// (`Estimate::steady_loss`).
pub const STEADY_SHARE: f64 = 0.75;
/// A cut for loss short of a loss run (`Verdict::Losing`) takes the
/// estimate down by at most this share: on a receive path sharing the
/// service's CPU (the bench's same-core model) the daemon's own ticks run
/// late and a tick's counts jitter by tens of percent, and the mean of three
/// such ticks cut the estimate far under what the service took (to 40k/s
/// against a static rate's 66k/s); persistent loss keeps cutting, a tick of
/// noise costs a tenth. Admitting a little too much costs the service only
/// the stack's work on what its socket then drops; admitting too little
/// leaves it idle.
pub const LOSING_STEP: f64 = 0.1;
/// Ticks after a cut for loss when it is judged (`Estimate::judge_cut`):
/// a tick to drain, then LOSS_TICKS under the lower limit.
pub const JUDGE_TICKS: u32 = LOSS_TICKS + 2;
/// A cut for loss helped if the loss fell under this share of what it was
/// (a cut of a tenth from a tenth over the capacity leaves some loss while
/// the queue drains; a path that loses bursts at any rate loses as much).
pub const JUDGED_HELPED: f64 = 0.8;
/// Per tick, the path's baseline loss fades by this factor (half in about
/// 7 s): a loss the path no longer shows is forgotten within the window.
pub const BASE_LOSS_DECAY: f64 = 0.999;
/// Loss while the gate admitted more than this multiple of the estimate is
/// the gate's doing (above a probe's largest gain, so a probe is not).
pub const OVER_ADMIT: f64 = 1.5;
/// A service that read under this share of its estimate in the last tick of
/// a loss, with nothing lost before its socket, is stalled, not slower (a
/// capacity that halves reads half; a receive path in livelock loses in the
/// backlog).
pub const STALL_SHARE: f64 = 0.25;
/// How long a stall holds the estimate (s): a VM pause or a restart is over
/// well within it; a service that stopped for longer is limited to what it
/// reads now, and its probes find its capacity again when it reads.
pub const STALL_HOLD_SECS: f64 = 0.5;

/// What the last tick showed about the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No loss run: the service takes what it is given.
    Calm,
    /// A loss run: it was given more than it takes.
    Overloaded,
    /// The gate limits, and the sockets dropped over LOSS_SHARE of what it
    /// admitted: the limit is over what the service takes.
    Losing,
    /// A loss run in which it read almost nothing, held.
    Stalled,
}

#[derive(Debug, Clone)]
pub struct Estimate {
    /// Packets/s; 0 until the first sample.
    pub capacity: f64,
    pub verdict: Verdict,
    window: MaxWindow,
    /// The last ticks, newest last.
    recent: VecDeque<Recent>,
    /// Ticks in a row that lost packets before the socket.
    path_ticks: u32,
    loss_ticks: u32,
    stall_secs: f64,
    /// Ticks since the estimate was last cut, and since the last probe.
    since_cut: u32,
    since_probe: u32,
    /// The last cut for loss, until it is judged (`judge_cut`).
    cut: Option<Cut>,
    /// The last ENGAGE_TICKS ticks, and their sums, for `steady_loss`,
    /// `arrived_mean` and `unknown_arrived_mean`.
    steady: VecDeque<Seen>,
    steady_sums: Seen,
    steady_dropping: usize,
    /// The share of what is admitted the path loses whatever the rate.
    base_loss: f64,
    /// What the class's clients owe (`owed`): arrivals that repay it are
    /// not fresh.
    owed: Owed,
}

/// What one tick (or the sum of several) brought: socket drops, admitted
/// packets, its length (s), and the gate's sample of its arrivals (how many
/// sampled, how many of those from known sources).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    drops: f64,
    admitted: f64,
    /// Of `admitted`, what repaid a debt of the clients (`Owed`).
    repaid: f64,
    secs: f64,
    sampled: u64,
    known: u64,
}

impl Seen {
    fn add(&mut self, o: &Seen) {
        self.drops += o.drops;
        self.admitted += o.admitted;
        self.repaid += o.repaid;
        self.secs += o.secs;
        self.sampled += o.sampled;
        self.known += o.known;
    }

    fn sub(&mut self, o: &Seen) {
        self.drops -= o.drops;
        self.admitted -= o.admitted;
        self.repaid -= o.repaid;
        self.secs -= o.secs;
        self.sampled -= o.sampled;
        self.known -= o.known;
    }
}

/// A cut for loss: the estimate before it, the loss share that made it, and
/// ticks since.
#[derive(Debug, Clone, Copy)]
struct Cut {
    from: f64,
    loss: f64,
    /// What the service read over the ticks that made it.
    taken: f64,
    ticks: u32,
}

/// One tick's rates (packets/s) and length (s).
#[derive(Debug, Clone, Copy)]
struct Recent {
    delivered: f64,
    admitted: f64,
    /// Of `admitted`, what repaid no debt of the clients (`Owed`).
    fresh: f64,
    /// Dropped by the service's sockets.
    dropped: f64,
    dt: f64,
}

impl Default for Estimate {
    fn default() -> Self {
        Estimate {
            capacity: 0.0,
            verdict: Verdict::Calm,
            window: MaxWindow::default(),
            recent: VecDeque::with_capacity(LOSS_TICKS as usize),
            loss_ticks: 0,
            path_ticks: 0,
            stall_secs: 0.0,
            since_cut: u32::MAX,
            since_probe: u32::MAX,
            cut: None,
            steady: VecDeque::with_capacity(ENGAGE_TICKS as usize),
            steady_sums: Seen::default(),
            steady_dropping: 0,
            base_loss: 0.0,
            owed: Owed::default(),
        }
    }
}

/// Did the tick lose packets the service was given: socket drops with its
/// queue standing over half the buffer (`queue::losing`, the rule
/// `distress::Judgement::behind` is too: a client's burst that overflowed a
/// short queue and drained within the tick is not), or drops before the
/// socket?
pub fn lost(s: &TickInput) -> bool {
    crate::policy::queue::losing(s.sock_drops > 0, s.queue_start, s.queue_end, s.rcvbuf)
        || s.backlog_drops > 0
        || s.squeeze > 0
}

impl Estimate {
    /// Take one tick's signals (the service's sockets were found);
    /// `probed`: the gate admitted over the estimate in it on purpose.
    pub fn observe(&mut self, s: &TickInput, probed: bool) {
        if self.recent.len() == (LOSS_TICKS as usize).max(SAMPLE_TICKS) {
            self.recent.pop_front();
        }
        let dropped = s.sock_drops as f64 / s.dt.max(1e-6);
        // What the clients sent (offered: a limit is no lull of theirs);
        // quiet as of the tick before. While the class is unlimited,
        // admitted is offered, and `fresh` what repaid no debt of it.
        let repaid = self.owed.tick(s.offered * s.dt, s.dt, self.quiet());
        let fresh = (s.admitted * s.dt - repaid).max(0.0) / s.dt.max(1e-6);
        self.recent.push_back(Recent { delivered: s.delivered, admitted: s.admitted, fresh, dropped, dt: s.dt });
        self.note_steady(Seen {
            drops: s.sock_drops as f64,
            admitted: s.admitted * s.dt,
            repaid,
            secs: s.dt,
            sampled: s.sampled,
            known: s.sampled_known.min(s.sampled),
        });
        self.loss_ticks = if lost(s) { self.loss_ticks.saturating_add(1) } else { 0 };
        let path = s.backlog_drops > 0 || s.squeeze > 0;
        self.path_ticks = if path { self.path_ticks.saturating_add(1) } else { 0 };
        self.since_cut = self.since_cut.saturating_add(1);
        self.since_probe = if probed { 0 } else { self.since_probe.saturating_add(1) };
        self.base_loss *= BASE_LOSS_DECAY;
        let n = LOSS_TICKS as usize;
        let overloaded = self.loss_ticks >= LOSS_TICKS;
        let share = self.loss_share();
        self.judge_cut(share);
        // While the gate limits, the limit sets the loss: more than
        // LOSS_SHARE of what it admitted dropped by the socket, over what
        // the path loses at any rate (`base_loss`), is too much.
        let dropping = self.recent.iter().rev().take(n).filter(|r| r.dropped > 0.0).count();
        let losing = s.limiting() && dropping >= n - 1 && share > self.base_loss + LOSS_SHARE;
        if !overloaded && !losing {
            self.verdict = Verdict::Calm;
            self.stall_secs = 0.0;
            self.push(self.mean(SAMPLE_TICKS, |r| r.delivered.min(r.admitted)));
            return;
        }
        let taken = self.mean(n, |r| r.delivered);
        let admitted = self.mean(n, |r| r.admitted);
        let verdict = if overloaded { Verdict::Overloaded } else { Verdict::Losing };
        // A probe's loss says the probe went too far, not that the
        // estimate it started from is high: BBR v2 too bounds its probe, not
        // its estimate, on loss in a probe.
        if !overloaded && self.since_probe < LOSS_TICKS {
            self.verdict = Verdict::Calm;
            self.push(self.mean(SAMPLE_TICKS, |r| r.delivered.min(r.admitted)));
        } else if admitted > OVER_ADMIT * self.capacity {
            // The gate's loss: what was read is still a sample.
            self.verdict = verdict;
            self.push(taken);
        } else if s.delivered < STALL_SHARE * self.capacity && self.path_ticks == 0 && self.stall_secs < STALL_HOLD_SECS
        {
            self.verdict = Verdict::Stalled;
            self.stall_secs += s.dt;
        } else {
            self.verdict = verdict;
            // One cut for loss per LOSS_TICKS: the next is judged on ticks
            // under the new limit. A loss run cuts at once.
            if overloaded || self.since_cut >= LOSS_TICKS {
                // A loss run (full queues) is the service's state: follow it
                // at once. Loss short of one may be the measurement's jitter
                // as much as the limit: a step of at most LOSING_STEP, and
                // judged (`judge_cut`).
                let floor = if overloaded { 0.0 } else { (1.0 - LOSING_STEP) * self.capacity };
                // (A loss run's cut is the rate's doing: nothing to judge,
                // and one pending is settled by it.)
                self.cut = (!overloaded).then_some(Cut { from: self.capacity, loss: share, taken, ticks: 0 });
                self.restart(taken.max(floor).min(self.capacity));
                self.since_cut = 0;
            }
        }
    }

    /// The share of what the gate admitted over the last LOSS_TICKS that the
    /// sockets dropped.
    fn loss_share(&self) -> f64 {
        let n = LOSS_TICKS as usize;
        let admitted = self.mean(n, |r| r.admitted);
        if admitted > 0.0 {
            self.mean(n, |r| r.dropped) / admitted
        } else {
            0.0
        }
    }

    /// Did the last cut for loss (`Verdict::Losing`) help? Judged
    /// JUDGE_TICKS after it, on the ticks under the lower limit. It helped if
    /// the loss fell under JUDGED_HELPED of what it was, or the service read
    /// as much as before (within LOSS_SHARE): what the cut refused was
    /// excess, whose stack work only took the service's CPU. Otherwise the
    /// service read less and lost as much: the loss was not the limit's (a
    /// receive path sharing the service's CPU drops bursts into a socket of a
    /// few dozen datagrams at any rate): the estimate goes back, and loss
    /// counts only above that baseline from then on (`base_loss`, fading over
    /// seconds). Without this, on such a path each cut took the estimate to
    /// what was read, the loss took a tenth of that again, and the limit
    /// walked down to a fraction of what the service takes.
    fn judge_cut(&mut self, share: f64) {
        let Some(c) = &mut self.cut else { return };
        c.ticks += 1;
        if c.ticks < JUDGE_TICKS {
            return;
        }
        let c = self.cut.take().expect("checked above");
        let taken = self.mean(LOSS_TICKS as usize, |r| r.delivered);
        let helped = share < JUDGED_HELPED * c.loss || taken >= (1.0 - LOSS_SHARE) * c.taken;
        if !helped {
            self.base_loss = self.base_loss.max(share);
            self.restart(c.from);
        }
    }

    /// Ticks in a row that lost packets the service was given (`lost`).
    pub fn loss_ticks(&self) -> u32 {
        self.loss_ticks
    }

    /// Keep the last ENGAGE_TICKS ticks.
    fn note_steady(&mut self, tick: Seen) {
        if self.steady.len() == ENGAGE_TICKS as usize {
            let old = self.steady.pop_front().expect("full");
            self.steady_sums.sub(&old);
            self.steady_dropping -= usize::from(old.drops > 0.0);
        }
        self.steady.push_back(tick);
        self.steady_sums.add(&tick);
        self.steady_dropping += usize::from(tick.drops > 0.0);
    }

    /// Did the sockets lose over LOSS_SHARE of what was admitted over the
    /// last ENGAGE_TICKS ticks, with drops in STEADY_SHARE of them? That is
    /// overload whatever the queue showed at the ticks' edges: a reader
    /// that takes its datagrams in batches (recvmmsg) empties its queue
    /// between bursts of drops, and its queue never stands at both edges of
    /// a tick, so the loss run never starts. A client's burst drops in runs
    /// of 3-4 ticks (dnsperf's against NSD), not in three ticks of four
    /// over 300 ms.
    pub fn steady_loss(&self) -> bool {
        let Seen { drops, admitted, .. } = self.steady_sums;
        self.steady.len() == ENGAGE_TICKS as usize
            && self.steady_dropping as f64 >= STEADY_SHARE * ENGAGE_TICKS as f64
            && admitted > 0.0
            && drops > LOSS_SHARE * admitted
    }

    /// ENGAGE_TICKS ticks seen, none with a socket drop, and no loss run.
    pub fn quiet(&self) -> bool {
        self.steady.len() == ENGAGE_TICKS as usize && self.steady_dropping == 0 && self.loss_ticks == 0
    }

    /// Fresh packets/s (what the gate admitted, less what repaid a debt
    /// of the clients: `Owed`) in the last tick; while the class is
    /// unlimited, what arrived.
    pub fn fresh(&self) -> f64 {
        self.recent.back().map_or(0.0, |r| r.fresh)
    }

    /// Fresh packets/s over the last LOSS_TICKS ticks.
    pub fn fresh_mean(&self) -> f64 {
        self.mean(LOSS_TICKS as usize, |r| r.fresh)
    }

    /// Fresh packets/s over the last ENGAGE_TICKS ticks: a loss run's
    /// arrivals, where `fresh_mean` is its last LOSS_TICKS.
    pub fn arrived_mean(&self) -> f64 {
        let Seen { admitted, repaid, secs, .. } = self.steady_sums;
        if secs > 0.0 {
            (admitted - repaid).max(0.0) / secs
        } else {
            0.0
        }
    }

    /// Fresh packets/s from sources the class does not know over the last
    /// ENGAGE_TICKS ticks: what arrived times the unknown share of the
    /// gate's sample over them (all of it under MIN_SAMPLES sampled: a gate
    /// that samples nothing, or a light load), and at most `arrived_mean`
    /// (clients never learned repay their own debt).
    pub fn unknown_arrived_mean(&self) -> f64 {
        let Seen { admitted, secs, sampled, known, .. } = self.steady_sums;
        if secs <= 0.0 {
            return 0.0;
        }
        let unknown = admitted / secs * unknown_share(sampled, known).unwrap_or(1.0);
        unknown.min(self.arrived_mean())
    }

    /// A probe the service took all of: its tick alone is a clean sample
    /// (what it read when given more, with nothing left queued), not to be
    /// averaged with the tick before (`capacity.rs`, `rose`).
    pub fn took(&mut self, rate: f64) {
        if rate > self.capacity {
            self.push(rate);
        }
    }

    /// Forget the window: the estimate is `rate` from now on.
    pub fn restart(&mut self, rate: f64) {
        self.window.clear();
        self.push(rate);
    }

    fn push(&mut self, sample: f64) {
        self.capacity = self.window.push(sample);
    }

    /// The mean over the last `n` ticks of one field, weighted by their length.
    fn mean(&self, n: usize, f: impl Fn(&Recent) -> f64) -> f64 {
        let last = self.recent.iter().rev().take(n);
        let (sum, secs) = last.fold((0.0, 0.0), |(a, t), r| (a + f(r) * r.dt, t + r.dt));
        if secs > 0.0 {
            sum / secs
        } else {
            0.0
        }
    }
}

/// The largest of the last WINDOW_TICKS samples, kept as a monotone queue:
/// each sample leaves behind it only larger, older ones, so a push costs a
/// few comparisons, not a scan of the window.
#[derive(Debug, Clone, Default)]
struct MaxWindow {
    /// (tick, sample), samples falling from front to back.
    q: VecDeque<(u64, f64)>,
    tick: u64,
}

impl MaxWindow {
    /// Add the next tick's sample; the window's maximum.
    fn push(&mut self, sample: f64) -> f64 {
        self.tick += 1;
        while self.q.back().is_some_and(|&(_, v)| v <= sample) {
            self.q.pop_back();
        }
        self.q.push_back((self.tick, sample));
        while self.q.front().is_some_and(|&(t, _)| t + WINDOW_TICKS <= self.tick) {
            self.q.pop_front();
        }
        self.q.front().map_or(0.0, |&(_, v)| v)
    }

    fn clear(&mut self) {
        self.q.clear();
    }
}
