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
//! Three parts, one file each:
//! - `estimate`: what the service takes (its capacity), a windowed maximum
//!   of what it read, brought down by loss, held through a stall. Both
//!   algorithms keep it.
//! - `capacity` ([`Algo::Capacity`], the default): `T` is the estimate,
//!   with a short probe above it every 40 ms, as BBR paces at its
//!   bottleneck bandwidth estimate.
//! - `pno` ([`Algo::Pno`], the baseline): Macpherson's perturb and observe.
//!
//! And here, what both share: a controller is *engaged* only while its own
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
pub mod estimate;
pub mod owed;
mod pno;

use crate::policy::fair::KnownShare;
use serde::Serialize;

pub use capacity::{CYCLE, DRAIN_GAIN, PROBE_STEP, PROBE_STEP_MAX, PROBE_STEP_MIN};
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
/// Ticks (1 s) in which what arrived fitted under the limit and no loss run
/// was seen before an engaged controller lets go: a flood that ended is
/// unlimited again a second later, a pause of a few ticks is not an end.
pub const RELEASE_TICKS: u32 = 100;
/// Ticks (300 ms) a loss run lasts before it engages an unlimited class. A
/// client's burst fills the socket, which drops what the gate would have,
/// and a limit would only add the gate's drops for the second it takes to
/// let go: dnsperf paced at half NSD's capacity sent 1.1-3.6 times what NSD
/// read in runs of 3-4 ticks (NSD, at a quarter of a CPU, at times read
/// 24k/s in a tick, not its usual 70-78k/s), and at 100 ms one fresh-clone
/// run in four still engaged on it (5,207 gate drops). A flood lasts; 300 ms
/// of it unlimited is what this costs at each start.
pub const ENGAGE_TICKS: u32 = 30;
/// A loss run whose arrivals are over this multiple of the capacity the
/// service showed while calm is a surge, not a client's burst: it engages
/// the class at once (after LOSS_TICKS, 30 ms), not after ENGAGE_TICKS.
/// The bursts ENGAGE_TICKS waits out reached 1.1-3.6 times what NSD read
/// in the tick, and the plant test holds a 60 ms burst at 6 times the calm
/// load unlimited; a flood of valid queries at 5 times dnsperf's capacity
/// arrives at about 150 times the calm load of the bench's clients. Under
/// ENGAGE_TICKS, that flood had 300 ms (and often a second) unlimited, in
/// which the socket dropped the known clients' queries with the rest.
pub const SURGE: f64 = 8.0;
/// A run of ticks with drops engages an unlimited class once what was
/// admitted over the capacity in it (`run_excess`) adds up to this many
/// ticks of the capacity (after LOSS_TICKS at least), so the time to
/// engage falls with the overload: 5x the capacity after 10 ticks, 10x
/// after 5, where
/// ENGAGE_TICKS alone made a 10x flood wait 300 ms like a 1.3x one
/// (`sluice bench step --flood 10`: 240-330 ms at each onset). Under about
/// 2.3x, ENGAGE_TICKS comes first. 40: a third over the 30 that the burst
/// the controller tests keep unlimited piles up (60 ms at 6 times a calm
/// load of half the capacity, which the plant's estimate takes for the
/// capacity); not tuned on the bench.
pub const ENGAGE_EXCESS: f64 = 40.0;
/// A loss run that lasted, a run of drops (ENGAGE_EXCESS) or steady loss
/// without a loss run (`Estimate::steady_loss`: a batch reader) engages a
/// class only with arrivals over this multiple of the calm capacity: a
/// service that its own clients hold at its knee loses in runs and
/// steadily as well (dnsperf at 90% of NSD's capacity: the gate dropped
/// 24,201 of its queries in an 8 s cell when steady loss alone engaged),
/// and so does one slowed under its own load. A flood that brings less
/// than its service's calm capacity again is left to the socket (a miss
/// where the service was near its knee already).
pub const STEADY_SURGE: f64 = 2.0;

/// Which rule engaged a controller (`Controller::engage`), for status and
/// the daemon's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engage {
    /// A loss run that lasted ENGAGE_TICKS, with arrivals over STEADY_SURGE
    /// times the calm capacity.
    LossRun,
    /// A loss run of LOSS_TICKS with arrivals over SURGE times the calm capacity.
    Surge,
    /// A run of drops whose arrivals over the capacity added up to ENGAGE_EXCESS.
    Excess,
    /// Steady loss with no loss run (a batch reader), with arrivals from
    /// sources the class does not know over STEADY_SURGE times the calm
    /// capacity over the same ENGAGE_TICKS.
    SteadyLoss,
    /// In one tick, over STEADY_SURGE times the calm capacity arrived from
    /// sources the class does not know, and its socket dropped, over half
    /// full, where its quiet arrivals had a known lane (CALM_KNOWN).
    Newcomers,
}

impl Engage {
    pub fn name(self) -> &'static str {
        match self {
            Engage::LossRun => "loss-run",
            Engage::Surge => "surge",
            Engage::Excess => "excess",
            Engage::SteadyLoss => "steady-loss",
            Engage::Newcomers => "newcomers",
        }
    }

    /// What the rule saw, in words, for the daemon's log.
    pub fn describe(self) -> String {
        let ms = |ticks: u32| (f64::from(ticks) * 1000.0 / TICK_HZ).round();
        match self {
            Engage::LossRun => format!(
                "its sockets dropped with a standing queue for {} ms while over {STEADY_SURGE} times its calm capacity arrived",
                ms(ENGAGE_TICKS)
            ),
            Engage::Surge => format!("a loss run while over {SURGE} times its calm capacity arrived"),
            Engage::Excess => format!("drops while arrivals over its capacity added up to {ENGAGE_EXCESS} ticks of it"),
            Engage::SteadyLoss => format!(
                "its sockets dropped in most ticks for {} ms while over {STEADY_SURGE} times its calm capacity arrived from sources it does not know",
                ms(ENGAGE_TICKS)
            ),
            Engage::Newcomers => format!(
                "over {STEADY_SURGE} times its calm capacity arrived in {} ms from sources it does not know, and its socket dropped",
                ms(1)
            ),
        }
    }
}

/// How long the capacity a service showed at its quiet ticks is kept in
/// mind against a fall of the estimate (s; a mean time: it fades by e over
/// it): a loss run cuts the estimate to what the service read, and a
/// service slowed for a moment (a neighbour on its CPU, a VM's stall) came
/// back calm with an estimate of its load only, against which its own
/// clients' next burst was more than it took calm (busy loops at nice -10
/// for 60 ms of every 460: the loss run's rule engaged the class in a 4 s
/// calm cell at half NSD's capacity, 4,743 gate drops). The estimate's own
/// window is as long.
pub const CALM_MEMORY_SECS: f64 = 10.0;

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

    /// Engage at once on a surge of newcomers (`newcomers`) or a loss run
    /// of a surge (SURGE); or, with arrivals over
    /// STEADY_SURGE times the calm capacity, on the service's own overload
    /// that lasted ENGAGE_TICKS, on drops that piled up ENGAGE_EXCESS over
    /// the capacity, or on steady loss over ENGAGE_TICKS with no loss run
    /// (a batch reader: `Estimate::steady_loss`; its arrivals counted from
    /// unknown sources only); let go after
    /// RELEASE_TICKS in which what arrived fitted under the limit with no
    /// loss run.
    fn engage(&mut self, s: &TickInput) {
        let overload = self.est.verdict == Verdict::Overloaded;
        let fits = s.offered <= self.target * LIMITING_MARGIN + 1.0;
        self.calm_ticks = if fits && !overload { self.calm_ticks.saturating_add(1) } else { 0 };
        // Every rise is judged on fresh arrivals: what repaid the clients'
        // debt (`owed`: they were held back, and catch up) is no surge.
        let surge = surge(self.calm_capacity, self.est.fresh_mean());
        self.run_excess =
            run_excess(self.run_excess, self.est.capacity, &TickInput { admitted: self.est.fresh(), ..s.clone() });
        self.drop_ticks = if s.dropped() { self.drop_ticks.saturating_add(1) } else { 0 };
        // Every rule but the surge's asks that arrivals rose over
        // STEADY_SURGE times the calm capacity (or that the service was
        // never calm: a flood from the daemon's first ticks): a service its
        // own clients hold at its knee loses in runs and steadily too, and
        // one slowed under its own load (a VM's slow moment, a neighbour on
        // its CPU) loses in a lasting loss run; a limit would only add the
        // gate's drops to its socket's (dns calm-50 in a slow hour, NSD
        // behind with no sluice as well, p99 21 ms: the gate's limit dropped
        // 2,367 of dnsperf's queries when the loss run needed arrivals over
        // the calm capacity once only).
        let calm = self.calm_capacity;
        let risen = |arriving: f64| calm == 0.0 || arriving >= STEADY_SURGE * calm;
        // After LOSS_TICKS, as a surge: the estimate has seen what the
        // service reads under the flood, where the limit starts.
        let heavy = self.drop_ticks >= LOSS_TICKS && self.run_excess >= ENGAGE_EXCESS && risen(self.est.fresh_mean());
        // Over the loss run's ENGAGE_TICKS, not its last LOSS_TICKS: what
        // arrived in a slow moment comes at once after it.
        let lasting = self.est.loss_ticks() >= ENGAGE_TICKS && risen(self.est.arrived_mean());
        // A batch reader's steady loss needs a calm capacity seen: with
        // none, it may be the daemon's first ticks of a service at its knee.
        // Its arrivals are judged over the ticks its loss is counted in,
        // and only those from sources it does not know (the gate's sample;
        // all of them with too few sampled), as the newcomers rule does: a
        // service slowed for a moment loses steadily, and then its own
        // clients catch up at several times their pace (dnsperf after a
        // slow moment: 85-146k/s against its usual 21k/s, for ticks or,
        // held back by its outstanding-query cap, for most of a second),
        // which looked like a flood (a calm cell at half NSD's capacity
        // beside busy loops and a status poller: 9,540 gate drops, engaged
        // by steady loss, 77% of the sample known). A batch reader its known clients alone overload is
        // left to its socket, as one they hold at its knee.
        let steady = self.est.steady_loss() && calm > 0.0 && risen(self.est.unknown_arrived_mean());
        let newcomers = self.calm_known.share().is_some_and(|k| k >= CALM_KNOWN) && newcomers(calm, s);
        if self.est.quiet() {
            // The highest estimate of a quiet tick, fading over
            // CALM_MEMORY_SECS: after a slowdown, whose loss run cut the
            // estimate to what the service read in it, the estimate is back
            // at the load only (the window restarted), and the clients'
            // packets that piled up in the slowdown arrived over it.
            let fade = (-s.dt / CALM_MEMORY_SECS).exp();
            self.calm_capacity = self.est.capacity.max(fade * self.calm_capacity);
            self.calm_known.note(s.sampled, s.sampled_known);
        }
        let why = if newcomers {
            Some(Engage::Newcomers)
        } else if overload && surge {
            Some(Engage::Surge)
        } else if overload && lasting {
            Some(Engage::LossRun)
        } else if heavy {
            Some(Engage::Excess)
        } else if steady {
            Some(Engage::SteadyLoss)
        } else {
            None
        };
        if let (Some(why), None) = (why, self.engaged) {
            // Start from what the service takes, never from the calm load
            // (or pno's wandering) the target followed while unlimited. At
            // a surge of newcomers' first tick the estimate has seen no
            // loss run, only the calm before it: from what the service
            // read in that tick, and never under the calm capacity, which
            // the known clients took (from the calm estimate alone, a
            // service that had seen only its clients' light load was held
            // at it under a flood of 65,536 sources: 7% of its capacity
            // admitted, where a start from the loss run's estimate kept
            // 127-133%).
            self.engaged = Some(why);
            let start = match why {
                Engage::Newcomers => self.est.capacity.max(calm).max(s.delivered),
                _ => self.est.capacity,
            };
            self.target = start.clamp(self.tuning.min_pps, self.tuning.max_pps);
        } else if self.calm_ticks >= RELEASE_TICKS {
            self.engaged = None;
        }
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

/// The newcomers' rule needs a known lane: at least this share of the quiet
/// ticks' arrivals from known sources (`fair::ROOM_KNOWN`'s). A service
/// whose clients could not be learned (never calm: a VM's slow hour held
/// NSD behind dnsperf at half its capacity) has every client unknown, and
/// its own clients catching up then looked like newcomers: the gate
/// dropped 12,843 of dnsperf's queries in a calm-50 cell.
pub const CALM_KNOWN: f64 = crate::policy::fair::ROOM_KNOWN;

/// Did a surge of newcomers arrive in the tick `s`: over STEADY_SURGE times
/// the calm capacity (`calm`, 0: never calm) from sources the class does
/// not know (the gate's sample), while its socket dropped with its queue
/// over OVERLOAD_QUEUE at the tick's end? It engages at once, with no loss
/// run: every rule that waits for one leaves the first 30-300 ms of a flood
/// unlimited, in which the socket drops the known clients' packets with
/// the flood's. What it needs beside the loss is who sent the excess:
/// its clients' own bursts (a client catching up after a slow moment, at
/// 4-6 times its pace) come from known sources, and a flash crowd the
/// service keeps up with fills no socket. A flood at the daemon's start
/// (no calm capacity yet, every client unknown), or at a class under
/// CALM_KNOWN of whose quiet arrivals came from known clients, is left to the
/// other rules: a service at its knee looks the same then.
pub fn newcomers(calm: f64, s: &TickInput) -> bool {
    let losing = s.sock_drops > 0 && s.queue_over(OVERLOAD_QUEUE);
    calm > 0.0 && losing && s.unknown_share().is_some_and(|u| u * s.offered >= STEADY_SURGE * calm)
}

/// Is `arriving` (packets/s reaching the service over a loss run) a surge
/// against the capacity it showed while calm (`calm`; 0: never calm yet,
/// so no surge can be told from its normal load)?
pub fn surge(calm: f64, arriving: f64) -> bool {
    calm > 0.0 && arriving >= SURGE * calm
}

/// The ticks of the service's capacity admitted over it in the current
/// run of ticks that dropped (at its sockets or before them), from the
/// run's `before` (0 at its first tick) and this tick's signals: 0 in a
/// tick that dropped nothing, or before a capacity was measured. A run of
/// drops, not the loss run: a batch reader's queue dips under half at a
/// tick's edge now and then under a flood, and each dip restarted the loss
/// run (the bench's second onset: 230 ms). The capacity is the estimate,
/// or what the service read in the tick where that is more: while calm the
/// estimate is only the calm load (what was read), and a client's burst
/// over it would pile up against that.
pub fn run_excess(before: f64, capacity: f64, s: &TickInput) -> f64 {
    if !s.dropped() || capacity <= 0.0 {
        return 0.0;
    }
    before + (s.admitted / capacity.max(s.delivered) - 1.0).max(0.0) * s.dt * TICK_HZ
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
