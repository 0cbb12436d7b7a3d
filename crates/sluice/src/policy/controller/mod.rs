//! The "auto" rate controller: pure logic, no kernel, testable without root.
//!
//! Every tick (10 ms, the 100 Hz of Macpherson's "Performing Under
//! Overload") the daemon hands [`Controller::step`] what it measured over one
//! auto class in the tick ([`TickInput`]) and gets back the rate `T` that class
//! may admit; [`decide`] turns it into the class's limit.
//!
//! Each auto class has its own controller, fed its own signals: its own
//! sockets' queue and drops and its own delivered rate (`auto.rs`), so one
//! service's trouble never moves another's limit (classes meet only in the
//! budget, `budget`, which throttles lower priorities for a higher one).
//!
//! Four parts, one file each:
//! - `estimate`: what the service takes (its capacity), a windowed maximum
//!   of what it read, brought down by loss, held through a stall. Both
//!   algorithms keep it.
//! - `capacity` ([`Algo::Capacity`], the default): `T` is the estimate,
//!   with a short probe above it every 40 ms, as BBR paces at its
//!   bottleneck bandwidth estimate.
//! - `pno` ([`Algo::Pno`], the baseline): Macpherson's perturb and observe.
//! - `engage`: when a controller engages and lets go, as follows.
//!
//! What both algorithms share: a controller is *engaged* only while its own
//! service is overloaded by more arriving than it took while calm: in the
//! first tick where over STEADY_SURGE times the capacity it showed while
//! calm arrives from sources the class does not know (the gate's sample)
//! and its socket drops (`newcomers`); `estimate`'s
//! loss run (LOSS_TICKS of socket drops with the queue over half the
//! buffer, or of drops before the socket, not a stall) at once where what
//! arrives in it is over SURGE times the capacity the service showed while
//! calm; otherwise, with arrivals over STEADY_SURGE times that capacity, a
//! loss run that lasted ENGAGE_TICKS, steady loss over ENGAGE_TICKS without
//! a standing queue (a batch reader), or a run of drops whose arrivals over
//! the capacity add up to ENGAGE_EXCESS ticks of it (a larger overload
//! engages sooner). A service slowed under its own load is not flooded,
//! and a limit would only add the gate's drops to its socket's. A controller
//! that is not engaged leaves its class unlimited (a
//! healthy service is never limited, whatever its load or its bursts); it
//! lets go after RELEASE_TICKS in which what arrived fitted under the limit
//! and no loss run was seen. When the signals vanish (the service's socket is
//! gone), the last `T` is held for the configured time, then the class falls
//! back to its safe limit.

mod capacity;
mod engage;
pub mod estimate;
pub mod owed;
mod pno;

use crate::policy::fair::KnownShare;
use serde::Serialize;

pub use capacity::{CYCLE, DRAIN_GAIN, PROBE_STEP, PROBE_STEP_MAX, PROBE_STEP_MIN};
pub use engage::{
    newcomers, run_excess, surge, Engage, CALM_KNOWN, CALM_MEMORY_SECS, ENGAGE_EXCESS, ENGAGE_TICKS, RELEASE_TICKS,
    SHORT_TICK, STEADY_SURGE, SURGE,
};
use estimate::{lost, Estimate};
pub use estimate::{
    Verdict, LOSING_STEP, LOSS_SHARE, LOSS_TICKS, SAMPLE_TICKS, STALL_HOLD_SECS, STALL_SHARE, STEADY_SHARE,
    WINDOW_TICKS,
};

/// Ticks per second: Macpherson's rate selection ("Performing Under Overload") ran at 100 Hz.
pub const TICK_HZ: f64 = 100.0;
/// The tick itself (10 ms): the daemon's control loop, the auto controller,
/// the per-CPU splits and source fairness all take a tick to be this long.
pub const TICK: std::time::Duration = std::time::Duration::from_millis((1000.0 / TICK_HZ) as u64);
/// Signals unreadable for this many ticks in a row (1 s) are stale: the
/// daemon's tick drops the throttles and auto limits they set.
pub const STALE_TICKS: u64 = 100;
pub use crate::policy::queue::{OVERLOAD_QUEUE, QUEUE_LOW};
/// The gate is limiting when more than this much over what it admitted
/// was offered (1%, plus one packet so an idle class is not "limiting").
pub const LIMITING_MARGIN: f64 = 1.01;
/// Offered over this share of a measured capacity, a class is near its knee
/// (`Controller::near_knee`).
pub const NEAR_KNEE: f64 = 0.5;
/// A knee shown this long ago (seconds) still counts for `Controller::near_knee`.
pub const KNEE_MEMORY_SECS: f64 = 10.0;
/// The rate selection algorithm of the auto classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// The capacity estimate, probed in a cycle (ours).
    #[default]
    Capacity,
    /// Perturb and observe, as in Macpherson's "Performing Under Overload" (the baseline).
    Pno,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Capacity => "capacity",
            Algo::Pno => "pno",
        }
    }
}

/// What the controller is doing, for status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CtlState {
    /// No measurement yet.
    #[default]
    Starting,
    /// Demand is below the target: everything is admitted.
    Idle,
    /// At the estimate.
    Cruising,
    /// Above the estimate for a tick, to see if the service takes more.
    Probing,
    /// Below it for a tick, to empty the socket's queue.
    Draining,
    /// A loss run: the estimate came down to what the service reads.
    Backoff,
    /// A loss run in which the service read (nearly) nothing: held.
    Stalled,
    /// Perturb and observe, going up.
    PnoUp,
    /// Perturb and observe, going down.
    PnoDown,
    /// Signals lost: the last target is held.
    Holding,
    /// Signals lost for longer than the hold time: safe limits.
    Fallback,
}

impl CtlState {
    pub fn name(self) -> &'static str {
        match self {
            CtlState::Starting => "starting",
            CtlState::Idle => "idle",
            CtlState::Cruising => "cruising",
            CtlState::Probing => "probing",
            CtlState::Draining => "draining",
            CtlState::Backoff => "backoff",
            CtlState::Stalled => "stalled",
            CtlState::PnoUp => "pno-up",
            CtlState::PnoDown => "pno-down",
            CtlState::Holding => "holding",
            CtlState::Fallback => "fallback",
        }
    }
}

/// One tick's measurements, as rates over the tick unless said otherwise.
#[derive(Debug, Clone, Default)]
pub struct TickInput {
    /// Length of the tick (s).
    pub dt: f64,
    /// False when the service's sockets could not be found this tick.
    pub present: bool,
    /// Packets/s the class's traffic offered at the gate (XDP seen).
    pub offered: f64,
    /// Packets/s the gate admitted for the class.
    pub admitted: f64,
    /// Datagrams/s the class's service took from its sockets (estimated:
    /// see `auto.rs`).
    pub delivered: f64,
    /// Bytes queued in the classes' sockets at the start and at the end of the tick.
    pub queue_start: u64,
    pub queue_end: u64,
    /// The sockets' receive buffer (bytes, summed).
    pub rcvbuf: u64,
    /// Socket drops in the tick (sock_diag drops / RcvbufErrors).
    pub sock_drops: u64,
    /// softnet backlog drops and time squeezes in the tick.
    pub backlog_drops: u64,
    pub squeeze: u64,
    /// Packets of the tick whose source the gate sampled (one in
    /// SLUICE_KNOWN_SAMPLE), and of those the known sources'.
    pub sampled: u64,
    pub sampled_known: u64,
}

/// Sampled packets a tick needs before their known share says anything.
pub const MIN_SAMPLES: u64 = 8;

/// The share of `sampled` packets not from a known source (`known` of
/// them), None under MIN_SAMPLES.
pub fn unknown_share(sampled: u64, known: u64) -> Option<f64> {
    (sampled >= MIN_SAMPLES).then(|| 1.0 - known.min(sampled) as f64 / sampled as f64)
}

impl TickInput {
    /// The share of the tick's arrivals from sources the class does not
    /// know (None: under MIN_SAMPLES sampled).
    pub fn unknown_share(&self) -> Option<f64> {
        unknown_share(self.sampled, self.sampled_known)
    }

    /// The gate refused part of what was offered (more than LIMITING_MARGIN
    /// over what it admitted, plus a packet so an idle class is not limiting).
    pub fn limiting(&self) -> bool {
        self.offered > self.admitted * LIMITING_MARGIN + 1.0
    }

    /// The tick dropped something the class was given: at its sockets or
    /// before them (backlog drops, time squeezes).
    pub fn dropped(&self) -> bool {
        self.sock_drops > 0 || self.backlog_drops > 0 || self.squeeze > 0
    }

    /// The sockets' queue at the tick's end is over `share` of their buffer.
    pub fn queue_over(&self, share: f64) -> bool {
        crate::policy::queue::over(self.queue_end, self.rcvbuf, share)
    }

    /// The sockets' queue at both ends of the tick is over `share` of their buffer.
    pub fn queue_stands(&self, share: f64) -> bool {
        crate::policy::queue::stands(self.queue_start, self.queue_end, self.rcvbuf, share)
    }
}

/// Tunables of a controller (defaults from [`Tuning::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// Lowest and highest total rate the controller may pick (packets/s).
    pub min_pps: f64,
    pub max_pps: f64,
    /// Perturb and observe: the fixed step (packets/s per tick).
    pub pno_step: f64,
    /// How long to hold the last target when the signals vanish (s).
    pub hold_secs: f64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { min_pps: 1_000.0, max_pps: 10_000_000.0, pno_step: 1_000.0, hold_secs: 2.0 }
    }
}

/// The controller of one auto class's admitted rate.
#[derive(Debug, Clone)]
pub struct Controller {
    pub algo: Algo,
    pub tuning: Tuning,
    /// The admitted total it asks for (packets/s).
    pub target: f64,
    /// What the service takes (`estimate`).
    pub est: Estimate,
    pub state: CtlState,
    /// Seconds without signals.
    pub lost_secs: f64,
    /// The service showed distress (by the rule named) and the gate has not
    /// yet been quiet for RELEASE_TICKS: the class is limited to `target`
    /// (else unlimited).
    pub engaged: Option<Engage>,
    /// Capacity: the gain `target` was set with and the position in the
    /// probe cycle.
    gain: f64,
    phase: u8,
    /// Capacity: how far the next probe goes over the estimate (a share).
    step: f64,
    /// Pno: +1 up, -1 down; the delivered rate of the previous tick.
    dir: f64,
    last_delivered: f64,
    /// Seconds since the service last showed a knee (a standing queue or
    /// loss); infinite before the first.
    knee_age_secs: f64,
    /// Ticks in a row with what arrived under the limit and no loss run.
    calm_ticks: u32,
    /// The highest capacity estimate of a quiet tick (no socket drop in the
    /// last ENGAGE_TICKS; 0: none yet), fading over CALM_MEMORY_SECS: what
    /// the service showed while calm, against which arrivals are judged.
    calm_capacity: f64,
    /// The share of its arrivals in quiet ticks that came from known
    /// sources (the gate's sample): whether the class has a known lane that
    /// newcomers could be told from.
    calm_known: KnownShare,
    /// Ticks of the capacity admitted over it in the current run of drops
    /// (ENGAGE_EXCESS), and the run's length in ticks.
    run_excess: f64,
    drop_ticks: u32,
}

impl Controller {
    pub fn new(algo: Algo, tuning: Tuning) -> Controller {
        Controller {
            algo,
            tuning,
            target: tuning.max_pps,
            est: Estimate::default(),
            state: CtlState::Starting,
            lost_secs: 0.0,
            engaged: None,
            gain: 1.0,
            phase: CYCLE - 1,
            step: PROBE_STEP,
            dir: -1.0,
            last_delivered: 0.0,
            knee_age_secs: f64::INFINITY,
            calm_ticks: 0,
            calm_capacity: 0.0,
            calm_known: KnownShare::default(),
            run_excess: 0.0,
            drop_ticks: 0,
        }
    }

    /// The service capacity estimate (packets/s); 0 until measured.
    pub fn capacity(&self) -> f64 {
        self.est.capacity
    }

    /// The class's limit: the target while engaged, None (unlimited) while
    /// its service shows no distress.
    pub fn limit(&self) -> Option<f64> {
        self.engaged.is_some().then_some(self.target)
    }

    /// Is the service near its knee, so its class needs the 10 ms tick?
    /// Engaged (limited); or it showed a knee (a standing queue, loss) in the
    /// last KNEE_MEMORY_SECS and is offered at least half the capacity
    /// estimate. A service that keeps up is not near its knee whatever it is
    /// offered, and a knee long past may have been a stall.
    pub fn near_knee(&self, offered: f64) -> bool {
        self.engaged.is_some() || (self.knee_age_secs < KNEE_MEMORY_SECS && offered >= NEAR_KNEE * self.est.capacity)
    }

    /// True once the signals have been gone longer than the hold time.
    pub fn in_fallback(&self) -> bool {
        self.state == CtlState::Fallback
    }

    /// One tick: take the measurements, return the new admitted total.
    pub fn step(&mut self, s: &TickInput) -> f64 {
        if !s.present {
            self.lost_secs += s.dt;
            self.state = if self.lost_secs > self.tuning.hold_secs { CtlState::Fallback } else { CtlState::Holding };
            return self.target;
        }
        let starting = matches!(self.state, CtlState::Starting | CtlState::Fallback);
        if starting && s.offered == 0.0 {
            // Nothing arrives yet: nothing to learn from.
            return self.target;
        }
        if starting {
            // First measurement (or back from fallback): start from what the
            // service reads now, or from what arrives if it reads nothing yet.
            self.target = s.delivered.max(s.admitted);
            self.est.restart(s.delivered);
        }
        self.lost_secs = 0.0;
        self.est.observe(s, self.algo == Algo::Capacity && self.gain > 1.0);
        let knee = lost(s) || s.queue_stands(QUEUE_LOW);
        self.knee_age_secs = if knee { 0.0 } else { self.knee_age_secs + s.dt };
        let t = match self.algo {
            Algo::Capacity => self.capacity_target(s),
            Algo::Pno => self.pno(s),
        };
        self.last_delivered = s.delivered;
        self.target = t.clamp(self.tuning.min_pps, self.tuning.max_pps);
        self.engage(s);
        self.target
    }
}

/// What the auto loop decides every tick for one class, and what the tests
/// of this module run against the simulated victim: the controller's step
/// on the tick's signals, then the class's rate: the target while the
/// controller is engaged, None (unlimited) while the service is healthy, or
/// the class's fallback rate once the signals have been lost for too long.
pub fn decide(ctl: &mut Controller, sig: &TickInput, fallback: Option<f64>) -> Option<f64> {
    ctl.step(sig);
    if ctl.in_fallback() {
        fallback
    } else {
        ctl.limit()
    }
}
