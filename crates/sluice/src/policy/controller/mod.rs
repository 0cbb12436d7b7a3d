//! The "auto" rate controller: pure logic, no kernel, testable without root.
//!
//! Every tick (10 ms, the 100 Hz of Macpherson's "Performing Under Overload") the daemon hands [`Controller::step`]
//! what it measured over one auto class in the tick ([`Signals`]) and gets
//! back the rate `T` that class may admit; [`decide`] turns it into the
//! class's limit.
//!
//! Each auto class has its own controller, fed its own signals: its own
//! sockets' queue and drops and its own delivered rate (`auto.rs`), so one
//! service's trouble never moves another's limit (classes meet only in the
//! budget, `budget`, which throttles lower priorities for a higher one).
//!
//! A controller is *engaged* only while its own service shows overload: its
//! socket overflowing with the queue over OVERLOAD_QUEUE of the buffer for
//! OVERLOAD_TICKS (not a stall, below), or, for the class carrying most of
//! the traffic, loss before the socket for OVERLOAD_TICKS. A controller that is not engaged leaves its class
//! unlimited (a healthy service is never limited, whatever its load or its
//! bursts); it disengages after RELEASE_TICKS in which what arrived fitted
//! under the limit and the service showed no overload. While engaged, two algorithms pick the rate:
//!
//! - [`Algo::Pno`], perturb and observe as Macpherson's "Performing Under
//!   Overload" (UNSW thesis, chapter 6) describes it: perturb `T` by a fixed step
//!   every tick; keep the direction if the delivered rate rose, reverse it if it
//!   fell, go down if it was flat; reverse at the caps. It must keep moving to
//!   see the slope, so it always admits a little too much or too little.
//! - [`Algo::Knee`], ours. While a service socket of the class holds a
//!   queue (over 1/16 of its buffer: fewer are the datagrams a batch-reading
//!   service leaves under steady arrivals) at both ends of a tick, the service
//!   never waited in that tick, so
//!   what it took (its delivered rate) *is* its capacity: no perturbation is needed
//!   to measure it. A socket buffer holds only a few milliseconds of packets,
//!   so a queue seen at a tick's edge is a standing queue: the knee. There `T`
//!   is held; a queue over 1/8 of the buffer eases `T` down by 1% a tick;
//!   socket drops with the queue still standing cut `T` at once by 3%
//!   (below the capacity estimate). Drops after which the queue drained, or
//!   up to three ticks of drops in which the service took under 70% of its
//!   capacity, are a stall of the service (pre-emption, a VM hiccup, the napi
//!   kthread's turn), not overload, and leave `T` alone; longer than that,
//!   the capacity itself fell and the estimate follows what is delivered. With the
//!   gate dropping and the queue empty, the service could take more: `T`
//!   creeps up by 1% a tick, and after 15 such quiet ticks (the capacity may
//!   have risen) grows by 1%, 2%, 4%, 8%, then 16% a tick. When the loss is
//!   upstream of the socket (softnet backlog drops, time squeeze) the queue
//!   says nothing, and the controller uses a slope test instead: if admitting
//!   more did not deliver more, admit less. When demand falls below `T`,
//!   everything passes and `T` stays at the capacity estimate, ready for the
//!   next flood.
//!
//! When the signals vanish (the service's socket is gone), the last `T` is held
//! for a configured time, then each class falls back to its safe limit.

use serde::Serialize;

/// Ticks per second: Macpherson's rate selection ("Performing Under Overload") ran at 100 Hz.
pub const TICK_HZ: f64 = 100.0;
/// The tick itself (10 ms): the daemon's control loop, the auto controller,
/// the per-CPU splits and source fairness all take a tick to be this long.
pub const TICK: std::time::Duration = std::time::Duration::from_millis((1000.0 / TICK_HZ) as u64);
/// Knee: per-tick growth of `T` while the gate drops, the service's queue is
/// empty, and the last sign of the knee (a queue or drops) is recent.
pub const CREEP: f64 = 0.01;
/// Knee: quiet ticks (no queue, no drops, the gate limiting) before fast growth.
pub const PROBE_AFTER_TICKS: u32 = 15;
/// Knee: first per-tick fast growth; it doubles every tick up to 16x.
pub const PROBE_GAIN: f64 = 0.01;
/// Knee: a queue over this fraction of the receive buffer at a tick's edge
/// is a standing one (below it: the few datagrams a batch-reading service
/// leaves under steady arrivals). A socket buffer holds only a few
/// milliseconds of packets, so a standing queue means the knee.
pub const QUEUE_LOW: f64 = 1.0 / 16.0;
/// Knee: a queue longer than this fraction of the receive buffer at a tick's
/// end means `T` is above capacity: ease off by QUEUE_EASE per tick.
pub const QUEUE_HIGH: f64 = 0.125;
pub const QUEUE_EASE: f64 = 0.01;
/// Knee: weight of a new busy-tick capacity sample in the running estimate.
pub const CAPACITY_EWMA: f64 = 0.2;
/// Knee: on overload drops, `T` goes to this fraction of itself or of the
/// capacity estimate, whichever is lower.
pub const BACKOFF: f64 = 0.97;
/// Knee: drops in ticks where the service took less than this share of its
/// capacity estimate, for at most STALL_TICKS ticks running, are a stall.
pub const STALL_SHARE: f64 = 0.7;
pub const STALL_TICKS: u32 = 3;
/// Knee: the gate is limiting when more than this much over what it admitted
/// was offered (1%, plus one packet so an idle class is not "limiting").
pub const LIMITING_MARGIN: f64 = 1.01;
/// Knee, slope test (drops before the socket): admitted rose by more than
/// SLOPE_IN while delivered rose by less than SLOPE_OUT means more in gave no
/// more out: step down by SLOPE_DOWN, else up by SLOPE_UP. The thresholds sit
/// above a tick's counting noise (a few packets in a thousand).
pub const SLOPE_IN: f64 = 1.005;
pub const SLOPE_OUT: f64 = 1.0025;
pub const SLOPE_DOWN: f64 = 0.95;
pub const SLOPE_UP: f64 = 1.01;
/// Offered over this share of a measured capacity, a class is near its knee
/// (`Controller::near_knee`).
pub const NEAR_KNEE: f64 = 0.5;
/// A knee shown this long ago (seconds) still counts for `Controller::near_knee`.
pub const KNEE_MEMORY_SECS: f64 = 10.0;
/// Knee: weight of the newest tick in the smoothed delivered rate (the lower
/// bound on capacity while no queue stands).
pub const DELIVERED_EWMA: f64 = 0.3;
/// Knee: with demand below the target, keep `T` this much above what arrives.
pub const IDLE_HEADROOM: f64 = 1.05;
/// Ticks (1 s) in which what arrived fitted under the limit and the service
/// showed no overload before an engaged controller lets go: a flood that
/// ended is unlimited again a second later, a pause of a few ticks is not
/// an end, and bursts of a load the service takes on average do not hold
/// the limit in place.
pub const RELEASE_TICKS: u32 = 100;
/// Ticks in a row (30 ms) the service's queue must stand at the tick's end
/// over OVERLOAD_QUEUE of its buffer, or loss before the socket must recur,
/// before socket drops engage the controller: a burst that overflows a
/// buffer a few ms deep drains within a tick when the service keeps up
/// (dnsperf's bursts overflowed NSD's socket at a fifth of its capacity,
/// and left a few datagrams queued at tick edges at half of it), a
/// service under overload keeps its buffer full.
pub const OVERLOAD_TICKS: u32 = 3;
pub const OVERLOAD_QUEUE: f64 = 0.5;

/// The rate selection algorithm of the auto classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// Capacity from busy ticks, a small standing queue (ours).
    #[default]
    Knee,
    /// Perturb and observe, as in Macpherson's "Performing Under Overload" (the baseline).
    Pno,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Knee => "knee",
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
    /// The gate drops while the service idles: `T` grows.
    Probing,
    /// The service is busy with a queue: `T` follows its capacity.
    Tracking,
    /// The socket overflowed: `T` was cut.
    Backoff,
    /// Loss upstream of the socket: slope test.
    Slope,
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
            CtlState::Probing => "probing",
            CtlState::Tracking => "tracking",
            CtlState::Backoff => "backoff",
            CtlState::Slope => "slope",
            CtlState::PnoUp => "pno-up",
            CtlState::PnoDown => "pno-down",
            CtlState::Holding => "holding",
            CtlState::Fallback => "fallback",
        }
    }
}

/// One tick's measurements, as rates over the tick unless said otherwise.
#[derive(Debug, Clone, Default)]
pub struct Signals {
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
    /// Knee: the service capacity estimate (packets/s); 0 until measured.
    pub capacity: f64,
    pub state: CtlState,
    /// Seconds without signals.
    pub lost_secs: f64,
    /// Pno: +1 up, -1 down; the delivered rate of the previous tick.
    dir: f64,
    last_delivered: f64,
    /// Slope test: the previous tick's admitted and delivered rates.
    last_admitted: f64,
    /// Knee: consecutive ticks with the gate limiting, no queue and no drops.
    quiet_ticks: u32,
    /// Knee: the delivered rate, smoothed over a few ticks.
    delivered_avg: f64,
    /// Knee: consecutive ticks with socket drops.
    drop_ticks: u32,
    /// Knee: the service has shown a knee (a standing queue, drops, or loss
    /// before the socket) since the start. Until it does, arrivals that rise
    /// are let through: a service taking all it is sent is no reason to cap
    /// it at the rate of its first tick.
    knee_seen: bool,
    /// Knee: seconds since the service last showed a knee (a standing
    /// queue, drops, loss before the socket); infinite before the first.
    knee_age_secs: f64,
    /// The service showed distress and the gate has not yet been quiet for
    /// RELEASE_TICKS: the class is limited to `target` (else unlimited).
    pub engaged: bool,
    /// Ticks in a row with nothing dropped by the gate or the socket.
    calm_ticks: u32,
    /// Ticks in a row ending with a standing queue, and with loss before the socket.
    standing_ticks: u32,
    path_ticks: u32,
}

impl Controller {
    pub fn new(algo: Algo, tuning: Tuning) -> Controller {
        Controller {
            algo,
            tuning,
            target: tuning.max_pps,
            capacity: 0.0,
            state: CtlState::Starting,
            lost_secs: 0.0,
            dir: -1.0,
            last_delivered: 0.0,
            last_admitted: 0.0,
            quiet_ticks: 0,
            delivered_avg: 0.0,
            drop_ticks: 0,
            knee_seen: false,
            knee_age_secs: f64::INFINITY,
            engaged: false,
            calm_ticks: 0,
            standing_ticks: 0,
            path_ticks: 0,
        }
    }

    /// The class's limit: the target while engaged, None (unlimited) while
    /// its service shows no distress.
    pub fn limit(&self) -> Option<f64> {
        self.engaged.then_some(self.target)
    }

    /// Engage on the service's own distress; let go after RELEASE_TICKS
    /// with nothing dropped. `overload`: the tick's signals showed it.
    fn engage(&mut self, s: &Signals, overload: bool) {
        // What arrives fits under the limit: the limit binds on bursts at most.
        let fits = s.offered <= self.target * LIMITING_MARGIN + 1.0;
        self.calm_ticks = if fits && !overload { self.calm_ticks.saturating_add(1) } else { 0 };
        if overload && !self.engaged {
            // Engaging: start from what the service takes, never from the
            // calm load the target followed while the class was unlimited.
            self.engaged = true;
            self.capacity = self.capacity.max(s.delivered);
            self.target = self.target.max(self.capacity).clamp(self.tuning.min_pps, self.tuning.max_pps);
        } else if overload {
            self.engaged = true;
        } else if self.calm_ticks >= RELEASE_TICKS {
            self.engaged = false;
        }
    }

    /// Is the service near its knee, so its class needs the 10 ms tick?
    /// Engaged (limited); or it showed a knee in the last KNEE_MEMORY_SECS
    /// and is offered at least half the capacity estimate. A service that
    /// keeps up (no standing queue, no drops) is not near its knee whatever
    /// it is offered: before any knee the estimate is only what it took so
    /// far, and a knee long past may have been a stall (a VM pause queues a
    /// few ms of a light load, and the estimate follows what was taken
    /// then). Pno sees no knee: engaged only.
    pub fn near_knee(&self, offered: f64) -> bool {
        self.engaged || (self.knee_age_secs < KNEE_MEMORY_SECS && offered >= NEAR_KNEE * self.capacity)
    }

    /// True once the signals have been gone longer than the hold time.
    pub fn in_fallback(&self) -> bool {
        self.state == CtlState::Fallback
    }

    /// One tick: take the measurements, return the new admitted total.
    pub fn step(&mut self, s: &Signals) -> f64 {
        if !s.present {
            self.lost_secs += s.dt;
            self.state = if self.lost_secs > self.tuning.hold_secs { CtlState::Fallback } else { CtlState::Holding };
            return self.target;
        }
        if (self.state == CtlState::Starting || self.state == CtlState::Fallback) && s.offered == 0.0 {
            // Nothing arrives yet: nothing to learn from.
            return self.target;
        }
        if self.state == CtlState::Starting || self.state == CtlState::Fallback {
            // First measurement (or back from fallback): start from what the
            // service delivers now, or from what arrives if nothing does yet.
            self.target = s.delivered.max(s.admitted).max(self.tuning.min_pps);
            self.capacity = s.delivered;
        }
        self.lost_secs = 0.0;
        let before = self.target;
        let t = match self.algo {
            Algo::Pno => self.pno(s),
            Algo::Knee => self.knee(s),
        };
        self.last_delivered = s.delivered;
        self.last_admitted = s.admitted;
        self.target = t.clamp(self.tuning.min_pps, self.tuning.max_pps);
        let overload = self.overloaded(s, before);
        self.engage(s, overload);
        self.target
    }

    /// Did this tick show the service's own overload? Socket drops with the
    /// queue standing at the end of OVERLOAD_TICKS ticks in a row that are
    /// not a stall (the knee backed off), or loss before the socket in
    /// OVERLOAD_TICKS ticks in a row (the auto loop passes path signals only
    /// to the class that carries most of the traffic). A standing queue
    /// alone is not: a healthy service near its capacity queues under bursts.
    fn overloaded(&mut self, s: &Signals, before: f64) -> bool {
        let stands = s.queue_end as f64 > s.rcvbuf as f64 * OVERLOAD_QUEUE;
        self.standing_ticks = if stands { self.standing_ticks.saturating_add(1) } else { 0 };
        let path = s.backlog_drops > 0 || s.squeeze > 0;
        self.path_ticks = if path { self.path_ticks.saturating_add(1) } else { 0 };
        let not_a_stall = match self.algo {
            Algo::Knee => self.state == CtlState::Backoff && self.target < before,
            Algo::Pno => true,
        };
        let drops = s.sock_drops > 0 && self.standing_ticks >= OVERLOAD_TICKS && not_a_stall;
        drops || self.path_ticks >= OVERLOAD_TICKS
    }

    /// Macpherson's section 6.2: the derivative of the output decides the direction.
    fn pno(&mut self, s: &Signals) -> f64 {
        if s.delivered < self.last_delivered {
            self.dir = -self.dir;
        } else if s.delivered == self.last_delivered {
            self.dir = -1.0;
        }
        let mut t = self.target + self.dir * self.tuning.pno_step;
        if t > self.tuning.max_pps || t < self.tuning.min_pps {
            t = t.clamp(self.tuning.min_pps, self.tuning.max_pps);
            self.dir = -self.dir;
        }
        self.state = if self.dir > 0.0 { CtlState::PnoUp } else { CtlState::PnoDown };
        t
    }

    fn knee(&mut self, s: &Signals) -> f64 {
        // A few datagrams are always in a socket under steady arrivals (the
        // service reads in batches): only more than QUEUE_LOW of the buffer
        // is a standing queue.
        let low = s.rcvbuf as f64 * QUEUE_LOW;
        let queued = |q: u64| q as f64 > low;
        let busy = queued(s.queue_start) && queued(s.queue_end);
        // The gate is the bottleneck when it refuses part of what is offered.
        let limiting = s.offered > s.admitted * LIMITING_MARGIN + 1.0;
        self.drop_ticks = if s.sock_drops > 0 { self.drop_ticks + 1 } else { 0 };
        let knee = busy || s.sock_drops > 0 || s.backlog_drops > 0 || s.squeeze > 0;
        self.knee_seen |= knee;
        self.knee_age_secs = if knee { 0.0 } else { self.knee_age_secs + s.dt };
        if s.sock_drops > 0 {
            return self.knee_socket_drops(s, queued(s.queue_end));
        }
        if s.backlog_drops > 0 || s.squeeze > 0 {
            // Loss before the socket: the queue cannot tell; did more in give more out?
            self.quiet_ticks = 0;
            self.state = CtlState::Slope;
            let more_in = s.admitted > self.last_admitted * SLOPE_IN;
            let more_out = s.delivered > self.last_delivered * SLOPE_OUT;
            return if more_in && !more_out { self.target * SLOPE_DOWN } else { self.target * SLOPE_UP };
        }
        // What the service took over the last ticks, smoothed.
        self.delivered_avg = if self.delivered_avg > 0.0 {
            (1.0 - DELIVERED_EWMA) * self.delivered_avg + DELIVERED_EWMA * s.delivered
        } else {
            s.delivered
        };
        if busy {
            // The service never waited in this tick: what it took is its capacity.
            self.capacity = capacity_ewma(self.capacity, s.delivered);
        } else if limiting {
            // It took this much without a queue: a lower bound on capacity.
            self.capacity = self.capacity.max(self.delivered_avg);
        }
        if !limiting || !self.knee_seen {
            // Demand below the target (or no knee seen yet): everything passes. Keep T at least at
            // the capacity estimate and a little above what arrives, so a
            // returning flood meets the known capacity, not an old low target.
            self.state = CtlState::Idle;
            self.quiet_ticks = 0;
            return self.target.max(self.capacity).max(s.offered * IDLE_HEADROOM);
        }
        let fill = s.queue_end as f64 / s.rcvbuf.max(1) as f64;
        if fill > QUEUE_HIGH {
            // A long standing queue: at capacity and above it; ease off.
            self.state = CtlState::Tracking;
            self.quiet_ticks = 0;
            return self.target * (1.0 - QUEUE_EASE);
        }
        if queued(s.queue_end) {
            // A short standing queue: the knee. Hold.
            self.state = CtlState::Tracking;
            self.quiet_ticks = 0;
            return self.target;
        }
        // The gate drops while the service's queue is empty: it can take more.
        // Creep while the knee is recent; after a few quiet ticks, grow fast
        // (the capacity may have risen), doubling the step each tick.
        self.quiet_ticks += 1;
        self.state = CtlState::Probing;
        if self.quiet_ticks <= PROBE_AFTER_TICKS {
            return self.target * (1.0 + CREEP);
        }
        let k = (self.quiet_ticks - PROBE_AFTER_TICKS - 1).min(4);
        self.target.max(s.delivered) * (1.0 + PROBE_GAIN * f64::from(1u32 << k))
    }

    /// Knee, socket drops in the tick: a stall (leave everything alone) or
    /// overload (back off below the lower of target and capacity).
    fn knee_socket_drops(&mut self, s: &Signals, queue_stands: bool) -> f64 {
        // A stall of the service (pre-empted, a VM hiccup, the napi
        // kthread's turn) overflows a buffer a few ms deep just as
        // overload does. It ends with the queue drained, or shows as a
        // tick or three in which the service took far less than its
        // capacity: leave `T`, the estimate and the quiet count alone.
        let slow = s.delivered < STALL_SHARE * self.capacity;
        if !queue_stands || (slow && self.drop_ticks <= STALL_TICKS) {
            self.state = CtlState::Backoff;
            return self.target;
        }
        // Overload: the queue is full and stays full. At the capacity
        // (the service keeps pace) the target is just above it: come down
        // below it. Far below the capacity for longer than a stall: the
        // capacity itself fell; take what the service does now.
        // It took `delivered` while overflowing: never estimate below that
        // (a controller that engages starts from what the service takes
        // under overload, not from the load it saw while healthy).
        self.capacity = if slow {
            capacity_ewma(self.capacity, s.delivered)
        } else {
            self.capacity.min(self.target).max(s.delivered)
        };
        self.quiet_ticks = 0;
        self.state = CtlState::Backoff;
        BACKOFF * self.target.min(self.capacity)
    }
}

/// The capacity estimate with a new sample `x` (the first sample is taken as it is).
fn capacity_ewma(c: f64, x: f64) -> f64 {
    if c > 0.0 {
        (1.0 - CAPACITY_EWMA) * c + CAPACITY_EWMA * x
    } else {
        x
    }
}

/// What the auto loop decides every tick for one class, and what the tests
/// of this module run against the simulated victim: the controller's step
/// on the tick's signals, then the class's rate: the target while the
/// controller is engaged, None (unlimited) while the service is healthy, or
/// the class's fallback rate once the signals have been lost for too long.
pub fn decide(ctl: &mut Controller, sig: &Signals, fallback: Option<f64>) -> Option<f64> {
    ctl.step(sig);
    if ctl.in_fallback() {
        fallback
    } else {
        ctl.limit()
    }
}
