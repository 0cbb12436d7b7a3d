//! When a controller engages (its class is limited) and lets go: the rules
//! over one class's tick signals, from a surge of newcomers at once to a
//! loss run that lasted, and the release after a calm second. The top of
//! `controller` says why a healthy service is never limited.
use serde::Serialize;

use super::estimate::{Verdict, LOSS_TICKS};
use super::{Controller, TickInput, LIMITING_MARGIN, OVERLOAD_QUEUE, TICK_HZ};

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

impl Controller {
    /// Engage at once on a surge of newcomers (`newcomers`) or a loss run
    /// of a surge (SURGE); or, with arrivals over
    /// STEADY_SURGE times the calm capacity, on the service's own overload
    /// that lasted ENGAGE_TICKS, on drops that piled up ENGAGE_EXCESS over
    /// the capacity, or on steady loss over ENGAGE_TICKS with no loss run
    /// (a batch reader: `Estimate::steady_loss`; its arrivals counted from
    /// unknown sources only); let go after
    /// RELEASE_TICKS in which what arrived fitted under the limit with no
    /// loss run.
    pub(super) fn engage(&mut self, s: &TickInput) {
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
        // Not from a tick too short for the service to be seen reading
        // (SHORT_TICK): its start is what the service read in the tick.
        let newcomers = s.dt >= SHORT_TICK / TICK_HZ
            && self.calm_known.share().is_some_and(|k| k >= CALM_KNOWN)
            && newcomers(calm, s);
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
}

/// A tick under this share of the nominal one is too short for the
/// service's reads in it to say what it takes, and engages no class by
/// newcomers: the daemon woken early by the gate's wake mark read a tick
/// of 1-2 ms in which the socket's drops ate all that was admitted (0/s
/// delivered), and the limit started from the known clients' 5-6k/s of
/// NSD's 77k/s, where it stayed for seconds (two sources bench cells of
/// 2026-11-30, a new client answered 54-56%). The next tick, at most a
/// tick later, engages from what the service read in it.
pub const SHORT_TICK: f64 = 0.5;

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
