//! Late answers: when a TCP class's known clients go first (pure logic: the
//! tick feeds it the class's answer delays, the unit tests feed it numbers).
//!
//! Why: a flood of real connections (a few sources with many keep-alive
//! connections, or many new connections a second) takes a CPU-bound TCP
//! service whole with no queue to show for it. nginx reads at once and is
//! behind on its CPU: of 65-70 connections under the bench's `conns-v4`
//! flood, 0-6 held unread bytes, none for over 4 ms, and every socket rule
//! (`distress`) stayed quiet while the service's own light client lost
//! half its requests. What the flood does show is the time the service
//! takes to answer (`delay`, timed by the gate and its egress learner):
//! its p99 went from 2.1 ms to 67 ms.
//!
//! So a TCP class with no rate of its own (an auto class with no UDP port:
//! the auto controller reads UDP sockets) is judged on its answers, in
//! windows of WINDOW_ANSWERS timed answers at least: all its answers, and
//! its known clients' alone, each against its own calm. (A flood that
//! pipelines its requests is answered at once, to an earlier request on
//! its flow, and its answers are most of the class's: under the bench's
//! `conns-calm-v4` the class's p90 stayed in time in two runs of three
//! while wrk waited 37 ms. Until the known clients' stream has a calm of
//! its own, it is judged against the class's, once in time against it.) A window is late when its LATE_QUANTILE is
//! over LATE_FACTOR times the same quantile of the calm windows (a slow
//! mean, in log2, over CALM_ANSWERS of their answers) and over
//! LATE_MIN_MS; slow (SLOW_FACTOR) when over a smaller mark: a slow window
//! feeds no calm, and the class learns nobody while it lasts and has the
//! gate time every request (`Tiers::time_all`). LATE_RUN late windows in a
//! row of either engage the class where it has a load to shed for someone:
//! the CPUs its service runs on were busy, mostly with its own work
//! (`busy`: its answers are late for its load), whether it has a known lane (its calm arrivals
//! were its known clients' at least `fair::ROOM_KNOWN`: they go first) or
//! not (its unknown sources are held each to its fair share of the
//! service's work: `fair`'s quota, counted in work while engaged, and a
//! light client is within its share). Where the service's threads cannot
//! be read, a known lane engages it as before they were read. A service
//! seen idle while its answers are late waits on something else (a
//! backend, a disk): a cut would shed its clients and not bring its
//! answers back, so it is neither engaged nor cut, and an engaged one lets
//! go after RELEASE_SECS of that as after RELEASE_SECS in time. Engaged,
//! the class is limited at the most it was offered in the late run, raised
//! to KNOWN_ROOM times what its known clients send (a rate that admits what
//! came: the limit only puts the source tiers in force), and the tick
//! hands fairness "behind" while its last window was late: the unknown
//! sources' tier is cut (`fair::CUT` every COOL_TICKS) while the answers
//! are late, by `fair::SOFT_CUT` while they are slow, and grows back only
//! while they are neither and the gate holds some of the class back
//! (`fair::FairTick::held`), so the unknown tier settles where the service
//! answers within SLOW_FACTOR times its calm, the known clients ahead of
//! it. It lets go after RELEASE_SECS of windows in time with nothing of
//! the class limited in the tick; for RELEASE_HOLD_SECS after that, LATE_RUN
//! slow windows in a row engage it again (a flood of real connections
//! held back waits out TCP's retransmit timer, and comes back).
//!
//! A class with too few answers to fill a window (an idle service, or one
//! that stopped answering) is not judged: its state holds.
use crate::policy::delay::Delays;

/// Timed answers a window takes at least (the gate stamps one admitted
/// packet of a class in 16 per CPU: nginx answering 11k requests/s fills a
/// window in about 50 ms).
pub const WINDOW_ANSWERS: u64 = 32;
/// A window with fewer answers is judged once it is this old (s), if it has
/// WINDOW_MIN_ANSWERS; with fewer still, it is dropped unjudged.
pub const WINDOW_SECS: f64 = 0.25;
pub const WINDOW_MIN_ANSWERS: u64 = 8;
/// The quantile a window is judged on: the tail the light clients wait in.
/// (Under `conns-v4` the median moved from 0.52-1.05 ms to 2.1 ms, inside
/// what a calm service's bursts do; the p99 from 2.1 ms to 67 ms.)
pub const LATE_QUANTILE: f64 = 0.9;
/// A window is late at over this many times the calm windows' quantile
/// (three of the gate's power-of-two buckets above it) ...
pub const LATE_FACTOR: f64 = 8.0;
/// ... and over this many ms: a service that answers in microseconds when
/// calm is not late at a millisecond.
pub const LATE_MIN_MS: f64 = 8.0;
/// Late windows in a row that engage the class (one may be a moment's
/// stall of the service's CPU).
pub const LATE_RUN: u32 = 2;
/// A window is slow at over this many times the calm windows' quantile
/// and over SLOW_MIN_MS: not late, but no longer what the class's calm
/// was. A slow window does not feed the calm quantile (a flood that
/// raises the class's answer delay step by step would raise its own
/// baseline: under the bench's `conns-calm-v4` the class's calm p90
/// went from 1.0 to 2.0 ms in a second of 4 ms windows, so 8 ms was never
/// 8 times it), and while a stream's last window was slow the class
/// learns nobody (`LateAnswers::slow`): the known clients' stream takes
/// windows to judge a flood late, and the flood's sources, answered from
/// their first packet, may be learned meanwhile (in a traced bench cell
/// the learner ran half a second into the flood). Three, not two: the
/// quantile is a power-of-two bucket's upper edge, and a calm nginx's
/// windows read its calm's bucket and the next one up.
pub const SLOW_FACTOR: f64 = 3.0;
pub const SLOW_MIN_MS: f64 = 2.0;
/// The calm quantile is a mean over about this many answers of calm
/// windows (50 full windows); a stream is judged only after
/// CALM_MIN_ANSWERS of them. Answers, not windows: a calm daemon ticks
/// every 500 ms and judges one window a tick, however many answers it
/// holds (the bench's known clients, known a second before its flood, had
/// two calm windows, and their stream was never judged). Until the known
/// clients' stream has its own, its windows are late against the class's
/// calm, once one of them was in time against it: clients known shortly
/// before a flood, or restored from the state file after a restart (the
/// judge starts empty), have none, and a flood that pipelines its requests
/// keeps the class's windows under the late mark (the bench's known
/// clients, traced, had theirs 2-3 s before its flood). Only once: a
/// service whose long-lived clients ask for slower answers than its
/// passing ones is not late when calm, and their windows teach the stream
/// its own calm.
pub const CALM_ANSWERS: f64 = 50.0 * WINDOW_ANSWERS as f64;
pub const CALM_MIN_ANSWERS: u64 = 4 * WINDOW_ANSWERS;
/// Seconds of windows in time, with nothing of the class limited, before
/// an engaged class lets go. Not one: a flood of real connections whose
/// retransmissions the gate dropped several times in a row waits out
/// TCP's doubling retransmit timer (0.4, 0.8, 1.6 s ...) and sends
/// nothing meanwhile (the bench's `conns-calm-v4`, the unknown tier
/// UNKNOWN_DEPTH_SECS deep: let go after one second in 4 cells of 12,
/// and in one the flood came back at full rate and took the service).
pub const RELEASE_SECS: f64 = 5.0;
/// For this long after it let go, a class engages again at LATE_RUN slow
/// windows in a row, not only late ones. A flood of real connections that
/// the gate held back is silent while its connections wait out TCP's
/// retransmit timer, which doubles at each loss (0.2, 0.4, 0.8, 1.6, 3.2 s:
/// over 6 s in all), so a second with nothing to limit is no proof it has
/// gone; and let go, it comes back at a rate that may take the service
/// from its known clients while their p90 stays under the late mark (the
/// bench's `conns-calm-v4`: let go in 2 cells of 6 once the unknown tier
/// paced the flood, wrk then got 5.7k of its 13k requests/s at p99 38 ms,
/// and the class stayed unlimited).
pub const RELEASE_HOLD_SECS: f64 = 10.0;
/// When a class's answers turn slow or late (either stops its learner),
/// the clients the learner first noted
/// from this long (ms) before its last learning tick are not known (the
/// gate's `known_entry`), and start their span again at their next answer
/// (`Tiers::taint`): a flood of real connections is
/// answered from its first packet and brings no surge of packets, and
/// before its late windows were judged (a calm daemon ticks every 500 ms)
/// its sources had a second's span and were known (the bench's
/// `conns-calm-v4`: the four flood addresses among the class's five known
/// sources, its known clients' answers then the flood's; and with slow
/// windows stopping the learner before any late one, three of the four,
/// noted in the flood's first 50 ms, where only late ones reached back).
pub const LATE_TAINT_MS: u64 = 1_000;
/// An engaged class's rate is at least this many times what its known
/// clients send: their tier (twice their peak, at most 0.9 of the rate:
/// fair.rs) is never capped by a rate set when the flood held them back
/// (the bench's `newconns-calm-v4`: wrk came back to 8k requests/s,
/// about 40k packets/s, against a rate of the flood's 60k).
pub const KNOWN_ROOM: f64 = 2.5;
/// The least rate an engaged class is limited at (packets/s).
pub const RATE_FLOOR_PPS: f64 = 1000.0;
/// A service is busy (`busy`) where the CPUs its threads ran on were busy
/// for this share of their time since the daemon's last reading
/// (`signals::service_cpus::Busy`) ...
pub const BUSY_SHARE: f64 = 0.9;
/// ... and at least this share of that busy time was its own (its
/// processes' and its local backends' time, and those CPUs' softirq work,
/// for its packets): late
/// answers are then its load's. (nginx flooded by the bench's `conns-v4`
/// ran its one worker's CPU at 99%; a service behind a slow backend waits,
/// its CPU idle. Its threads' own time alone left out the handshakes'
/// softirq work under a flood of new connections, and read under 0.9 while
/// the CPU was full; the CPUs' busy time alone counted a neighbour's
/// spinning as the service's load; and its own time over all the CPUs'
/// time at 0.9 let the bench's connection flood take more, anything else
/// on its CPU, the daemon or a probe, suspected of pulling it under.)
pub const OWN_SHARE: f64 = 0.6;

/// Is a service whose CPUs were `cpus` busy, `own` of that its own, busy
/// for late answers (BUSY_SHARE, OWN_SHARE)? A neighbour that takes over
/// 40% of its CPUs' busy time makes them full, not it busy.
pub fn busy(cpus: f64, own: f64) -> bool {
    cpus >= BUSY_SHARE && own >= OWN_SHARE
}

/// One tick of a class, as `LateAnswers::step` takes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct LateTick {
    /// The answers timed in the tick (`Delays::since` of the class's
    /// totals), and of those, the answers to its known clients.
    pub answers: Delays,
    pub known_answers: Delays,
    /// Packets/s offered to the class in the tick, and its length (s).
    pub offered: f64,
    pub dt: f64,
    /// The gate dropped some of the class's packets in the tick.
    pub limiting: bool,
    /// Packets/s of its known clients the gate saw in the tick (counted
    /// while the class is limited).
    pub known_pps: f64,
    /// The class has a known lane (`fair::Fair::calm_known_share` at
    /// ROOM_KNOWN or over).
    pub known_lane: bool,
    /// Its service was busy at the daemon's last look (BUSY_SHARE; None:
    /// its threads could not be read, or no reading was there to judge from).
    pub busy: Option<bool>,
}

/// What the class gets for the next tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LateOut {
    /// The class's rate (None: unlimited).
    pub rate: Option<f64>,
    /// The last window judged was late: the unknown tier is cut.
    pub late: bool,
}

/// One stream of answers judged in windows against its own calm: all the
/// class's answers, or its known clients' alone.
#[derive(Debug, Clone, Default)]
struct Judge {
    /// The window being filled and its age (s).
    window: Delays,
    window_secs: f64,
    /// The calm windows' quantile (log2 of ms), and how many answers made it.
    calm_log2: f64,
    calm_answers: u64,
    /// Late windows in a row, slow ones (a late one is slow too), and the
    /// last window's verdicts and quantile (ms).
    run: u32,
    slow_run: u32,
    late: bool,
    slow: bool,
    last_ms: Option<f64>,
    /// With no calm of its own yet, a window of it was in time against the
    /// class's (SLOW_FACTOR): its windows are late against that until it
    /// has one.
    borrows: bool,
}

impl Judge {
    /// Fold a tick's answers in and judge a full window (a window in time
    /// feeds the calm quantile where `calm` says so) against its own calm:
    /// Some(late) when a window was judged. Until it has a calm of its
    /// own, a window is late against `borrowed` (ms), once one of its
    /// windows was in time against that (`borrows`); it is never slow for
    /// it, and what is not late feeds its own calm.
    fn add(&mut self, answers: &Delays, dt: f64, calm: bool, borrowed: Option<f64>) -> Option<bool> {
        self.window = self.window.plus(answers);
        self.window_secs += dt;
        let n = self.window.samples;
        if !(n >= WINDOW_ANSWERS || (self.window_secs >= WINDOW_SECS && n >= WINDOW_MIN_ANSWERS)) {
            if self.window_secs >= 4.0 * WINDOW_SECS {
                (self.window, self.window_secs) = (Delays::default(), 0.0);
            }
            return None;
        }
        let ms = self.window.quantile_ms(LATE_QUANTILE)?;
        (self.window, self.window_secs) = (Delays::default(), 0.0);
        let over = |calm: f64, factor: f64, min_ms: f64| ms > (factor * calm).max(min_ms);
        (self.late, self.slow) = match (self.calm_ms(), borrowed) {
            (Some(c), _) => (over(c, LATE_FACTOR, LATE_MIN_MS), over(c, SLOW_FACTOR, SLOW_MIN_MS)),
            (None, Some(b)) if self.borrows => {
                let late = over(b, LATE_FACTOR, LATE_MIN_MS);
                (late, late)
            }
            (None, Some(b)) => {
                self.borrows = !over(b, SLOW_FACTOR, SLOW_MIN_MS);
                (false, false)
            }
            (None, None) => (false, false),
        };
        self.slow_run = if self.slow { self.slow_run + 1 } else { 0 };
        if self.late {
            self.run += 1;
        } else {
            self.run = 0;
            if calm && !self.slow {
                let n = n as f64;
                let w = n / ((self.calm_answers as f64).min(CALM_ANSWERS) + n);
                self.calm_log2 += w * (ms.log2() - self.calm_log2);
                self.calm_answers = self.calm_answers.saturating_add(n as u64);
            }
        }
        self.last_ms = Some(ms);
        Some(self.late)
    }

    fn calm_ms(&self) -> Option<f64> {
        (self.calm_answers >= CALM_MIN_ANSWERS).then(|| self.calm_log2.exp2())
    }
}

/// A class's judge of its answers, between ticks.
#[derive(Debug, Clone, Default)]
pub struct LateAnswers {
    /// All its answers, and its known clients' alone.
    all: Judge,
    known: Judge,
    /// The most offered since a window was last judged, and in the late run (packets/s).
    window_offered: f64,
    run_offered: f64,
    /// The rate while engaged.
    rate: Option<f64>,
    /// Seconds in time with nothing limited, while engaged.
    calm_secs: f64,
    /// Seconds since the class let go, within RELEASE_HOLD_SECS of it.
    since_release: Option<f64>,
    /// Times it engaged since the judge began (a daemon's start).
    engagements: u64,
}

impl LateAnswers {
    /// One tick: fold its answers into the windows, judge full ones,
    /// engage or let go.
    pub fn step(&mut self, t: &LateTick) -> LateOut {
        self.window_offered = self.window_offered.max(t.offered);
        // The calm quantiles follow the windows in time while unlimited.
        let calm = self.rate.is_none();
        let all = self.all.add(&t.answers, t.dt, calm, None);
        // The known clients' stream is judged against the class's calm
        // until it has its own (CALM_MIN_ANSWERS).
        let borrowed = self.all.calm_ms();
        let known = self.known.add(&t.known_answers, t.dt, calm, borrowed);
        // Soon after letting go, slow windows count as late ones did.
        let held = self.since_release.is_some();
        let behind = |j: &Judge| if held { j.slow } else { j.late };
        if all.is_some() || known.is_some() {
            let run = behind(&self.all) || behind(&self.known);
            self.run_offered = if run { self.run_offered.max(self.window_offered) } else { 0.0 };
            self.window_offered = 0.0;
        }
        let run = |j: &Judge| if held { j.slow_run } else { j.run };
        self.since_release = self.since_release.map(|s| s + t.dt).filter(|s| *s < RELEASE_HOLD_SECS);
        // A load to shed for someone: a service seen busy (known clients
        // to serve first, or light sources to keep within their shares),
        // or known clients where the service's threads cannot be read.
        let sheds = t.busy.unwrap_or(t.known_lane);
        match self.rate {
            None if (run(&self.all) >= LATE_RUN || run(&self.known) >= LATE_RUN) && sheds => {
                self.rate = Some(self.run_offered.max(RATE_FLOOR_PPS));
                self.engagements += 1;
                (self.calm_secs, self.since_release) = (0.0, None);
            }
            Some(r) => {
                // The known clients are never held under the rate: it grows
                // to KNOWN_ROOM times what they send (their tier is at most
                // 0.9 of it, `fair::UNKNOWN_MIN`), as they come back.
                self.rate = Some(r.max(KNOWN_ROOM * t.known_pps));
                // In time with nothing limited, or late with nothing to shed.
                let done = if self.late() { !sheds } else { !t.limiting };
                self.calm_secs = if done { self.calm_secs + t.dt } else { 0.0 };
                if self.calm_secs >= RELEASE_SECS - 1e-9 {
                    (self.rate, self.since_release) = (None, Some(0.0));
                }
            }
            None => {}
        }
        LateOut { rate: self.rate, late: self.rate.is_some() && self.late() && sheds }
    }

    /// The calm windows' quantile in ms, of all answers and of the known
    /// clients' (None: fewer than CALM_MIN_ANSWERS yet).
    pub fn calm_ms(&self) -> (Option<f64>, Option<f64>) {
        (self.all.calm_ms(), self.known.calm_ms())
    }

    /// The last judged window's quantile in ms, of all answers and of the
    /// known clients' (None: none yet).
    pub fn last_ms(&self) -> (Option<f64>, Option<f64>) {
        (self.all.last_ms, self.known.last_ms)
    }

    /// Was the last window judged late, of either stream (engaged or not)?
    /// A class whose answers are late is not healthy: its learner records
    /// nobody (a flood of real connections is answered, and its few
    /// packets are no surge of arrivals: unchecked, its sources were known
    /// within a second).
    pub fn late(&self) -> bool {
        self.all.late || self.known.late
    }

    /// The delay over which one of the class's answers is slow while the
    /// daemon ticks slowly (ms): SLOW_FACTOR times the calm quantile of all
    /// its answers, at least SLOW_MIN_MS (None: no calm yet). The gate's
    /// learner wakes the daemon at SLUICE_SLOW_WAKE_ANSWERS such answers
    /// on a CPU between two calm ticks: a calm tick judges one window in
    /// 500 ms, and a flood of real connections brings no jump of arrivals
    /// to wake it (under `conns-calm-v4` the first slow window was judged
    /// up to half a second into the flood).
    pub fn slow_mark_ms(&self) -> Option<f64> {
        self.all.calm_ms().map(|c| (SLOW_FACTOR * c).max(SLOW_MIN_MS))
    }

    /// Was the last window of either stream slow (SLOW_FACTOR; a late one
    /// is slow too)? The class learns nobody meanwhile: what its service
    /// answers now may be a flood's first seconds.
    pub fn slow(&self) -> bool {
        self.all.slow || self.known.slow
    }

    /// How many times the class engaged since the judge began: what it
    /// did over a flood, where its state now is only how it ends.
    pub fn engagements(&self) -> u64 {
        self.engagements
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delay::BUCKETS;

    /// `n` answers, all in bucket `i`.
    fn answers(i: usize, n: u64) -> Delays {
        let mut d = Delays { samples: n, ..Delays::default() };
        d.buckets[i.min(BUCKETS - 1)] = n;
        d
    }

    /// A tick of `n` answers in bucket `i` at `offered` packets/s.
    fn tick(i: usize, n: u64, offered: f64, known_lane: bool) -> LateTick {
        LateTick { answers: answers(i, n), offered, dt: 0.01, limiting: false, known_lane, ..LateTick::default() }
    }

    /// A tick of a window of the class's answers in bucket `all` and one
    /// of its known clients' in bucket `known`, at 30k packets/s.
    fn both(all: usize, known: usize) -> LateTick {
        LateTick {
            answers: answers(all, WINDOW_ANSWERS),
            known_answers: answers(known, WINDOW_ANSWERS),
            offered: 30_000.0,
            dt: 0.01,
            known_lane: true,
            ..LateTick::default()
        }
    }

    /// A judge that saw `windows` calm windows at bucket 6 (up to 2.1 ms).
    fn calm(windows: u32) -> LateAnswers {
        let mut l = LateAnswers::default();
        for _ in 0..windows {
            assert_eq!(l.step(&tick(6, WINDOW_ANSWERS, 5_000.0, true)), LateOut::default());
        }
        l
    }

    #[test]
    fn a_calm_service_is_never_limited_and_learns_its_calm() {
        let l = calm(200);
        let c = l.calm_ms().0.expect("calm learned");
        assert!((c - 2.097152).abs() < 1e-6, "{c}");
        assert_eq!(l.rate, None, "never engaged");
        // Before CALM_MIN_ANSWERS there is no calm to be late against.
        assert_eq!(calm((CALM_MIN_ANSWERS / WINDOW_ANSWERS) as u32 - 1).calm_ms(), (None, None));
        // However they come: one window of 500 ms (a calm tick) holds them.
        let mut l = LateAnswers::default();
        l.step(&LateTick { dt: 0.5, ..tick(6, CALM_MIN_ANSWERS, 5_000.0, true) });
        assert!(l.calm_ms().0.is_some());
    }

    #[test]
    fn late_windows_in_a_row_engage_at_the_most_offered_and_cut_while_late() {
        let mut l = calm(20);
        // 67 ms answers (bucket 12) at 30k packets/s: the first late window does not engage ...
        assert_eq!(l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true)), LateOut::default());
        // ... the second does, at the most offered in the run.
        let out = l.step(&tick(12, WINDOW_ANSWERS, 40_000.0, true));
        assert_eq!(out, LateOut { rate: Some(40_000.0), late: true });
        assert_eq!(l.last_ms(), (Some(answers(12, 1).quantile_ms(0.9).unwrap()), None));
        // Answers in time: still limited, no longer cutting.
        let out = l.step(&tick(6, WINDOW_ANSWERS, 40_000.0, true));
        assert_eq!(out, LateOut { rate: Some(40_000.0), late: false });
        // The calm quantile did not follow the engaged windows.
        assert!((l.calm_ms().0.unwrap() - 2.097152).abs() < 1e-6);
    }

    /// A flood that pipelines its requests is answered at once (to an
    /// earlier request on its flow): the class's answers stay in time while
    /// its known clients wait. Their own windows engage the class.
    #[test]
    fn the_known_clients_late_answers_engage_where_the_floods_own_hide_them() {
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            assert_eq!(l.step(&both(6, 6)), LateOut::default());
        }
        assert_eq!(l.step(&both(5, 12)), LateOut::default(), "one late window of the known clients");
        assert_eq!(l.step(&both(5, 12)), LateOut { rate: Some(30_000.0), late: true });
        let (all, known) = l.last_ms();
        assert!(all < Some(2.1) && known > Some(67.0), "{all:?} {known:?}");
        // And the class's own late windows engage it as before, the known clients' in time.
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            l.step(&both(6, 6));
        }
        l.step(&both(12, 6));
        assert!(l.step(&both(12, 6)).rate.is_some());
    }

    /// Clients known shortly before the flood have too few timed answers
    /// for a calm of their own: once a window of theirs was in time against
    /// the class's calm, their stream is late against it until it has one,
    /// so the flood's answers in time do not hide theirs (the race of a
    /// cell of 8 under `conns-calm-v4`).
    #[test]
    fn known_clients_with_no_calm_of_their_own_are_judged_against_the_classs() {
        // The class's calm (bucket 6) learned before its known clients
        // had any answers; then a window of theirs, in time.
        let class_calm = || {
            let mut l = LateAnswers::default();
            for _ in 0..20 {
                l.step(&LateTick { known_answers: Delays::default(), ..both(6, 6) });
            }
            l
        };
        let mut l = class_calm();
        assert_eq!(l.step(&both(6, 6)), LateOut::default());
        assert_eq!(l.calm_ms().1, None, "a window is not a calm");
        // The flood's answers in time (bucket 5), the known clients' at 67 ms.
        assert_eq!(l.step(&both(5, 12)), LateOut::default(), "one late window");
        assert_eq!(l.step(&both(5, 12)), LateOut { rate: Some(30_000.0), late: true });
        // Under the borrowed calm a window not late is not slow either, and
        // feeds their own (four times the class's).
        let mut l = class_calm();
        l.step(&both(6, 6));
        for _ in 0..(CALM_MIN_ANSWERS / WINDOW_ANSWERS) {
            assert_eq!(l.step(&both(6, 8)), LateOut::default());
            assert!(!l.slow());
        }
        assert!(l.calm_ms().1.is_some());
        // Known clients whose answers were never like the class's (a
        // service whose long-lived clients ask for slower answers than its
        // passing ones) are not late when calm: their windows teach them
        // their own calm.
        let mut l = class_calm();
        for _ in 0..10 {
            assert_eq!(l.step(&both(6, 12)).rate, None);
        }
        assert!(l.calm_ms().1.is_some_and(|c| c > 60.0), "{:?}", l.calm_ms());
        // With no calm anywhere, nothing is late.
        let mut l = LateAnswers::default();
        for _ in 0..10 {
            assert_eq!(l.step(&both(12, 12)).rate, None);
        }
    }

    /// Let go after RELEASE_SECS in time with nothing limited, a class
    /// engages again at LATE_RUN slow windows (four times its calm, under
    /// the late mark) for RELEASE_HOLD_SECS; after that only late ones do.
    #[test]
    fn soon_after_letting_go_slow_windows_engage_again() {
        let engage = |l: &mut LateAnswers| {
            l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
            assert!(l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true)).rate.is_some());
        };
        let let_go = |l: &mut LateAnswers| {
            for _ in 0..(RELEASE_SECS / 0.01).round() as usize {
                l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true));
            }
            assert_eq!(l.rate, None, "let go");
        };
        let mut l = calm(20);
        engage(&mut l);
        let_go(&mut l);
        // Slow windows (bucket 8: 8.4 ms against a calm 2.1 ms; slow, not late).
        assert_eq!(l.step(&tick(8, WINDOW_ANSWERS, 35_000.0, true)).rate, None, "one slow window");
        let out = l.step(&tick(8, WINDOW_ANSWERS, 45_000.0, true));
        assert!(!l.late() && l.slow());
        assert_eq!(out, LateOut { rate: Some(45_000.0), late: false }, "engaged at the most offered in the slow run");
        // Past the hold, slow windows are what they were: no engage.
        let_go(&mut l);
        for _ in 0..(RELEASE_HOLD_SECS / 0.01).round() as usize {
            l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true));
        }
        for _ in 0..10 {
            assert_eq!(l.step(&tick(8, WINDOW_ANSWERS, 30_000.0, true)).rate, None);
        }
        // Nor before any engage.
        let mut l = calm(20);
        for _ in 0..10 {
            assert_eq!(l.step(&tick(8, WINDOW_ANSWERS, 30_000.0, true)).rate, None);
        }
    }

    #[test]
    fn without_a_known_lane_there_is_nobody_to_serve_first() {
        let mut l = calm(20);
        for _ in 0..10 {
            assert_eq!(l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, false)).rate, None);
        }
    }

    /// With nobody known, a service late while busy is late for its load:
    /// engaged, its unknown tier is cut while it stays busy; late while
    /// idle (it waits on something else), it is not cut, and lets go after
    /// RELEASE_SECS of that. Its threads not read, nothing engages it.
    #[test]
    fn with_nobody_known_a_busy_service_sheds_its_load_and_an_idle_one_is_let_go() {
        let busy = |i: usize, busy: Option<bool>| LateTick { busy, ..tick(i, WINDOW_ANSWERS, 30_000.0, false) };
        let mut l = calm(20);
        assert_eq!(l.step(&busy(12, Some(true))).rate, None, "one late window");
        let out = l.step(&busy(12, Some(true)));
        assert_eq!(out, LateOut { rate: Some(30_000.0), late: true }, "two: engaged, cutting");
        // Late and idle: no cut, and let go after RELEASE_SECS of it.
        let idle_ticks = (RELEASE_SECS / 0.01).round() as usize;
        for i in 0..idle_ticks - 1 {
            assert_eq!(l.step(&busy(12, Some(false))), LateOut { rate: Some(30_000.0), late: false }, "tick {i}");
        }
        assert_eq!(l.step(&busy(12, Some(false))).rate, None, "let go");
        assert_eq!(l.engagements(), 1, "engaged once, let go since");
        for seen in [Some(false), None] {
            let mut l = calm(20);
            for _ in 0..10 {
                assert_eq!(l.step(&busy(12, seen)).rate, None, "{seen:?}: never engaged");
            }
        }
    }

    /// Do no harm: a service with known clients whose answers come late
    /// while its CPU idles (a slow backend) is not cut; its known lane
    /// engages it where it was read busy, or its threads were not read.
    #[test]
    fn a_known_lane_sheds_nothing_for_a_service_seen_idle() {
        let lane = |busy: Option<bool>| LateTick { busy, ..tick(12, WINDOW_ANSWERS, 30_000.0, true) };
        for (busy, engaged) in [(Some(false), false), (Some(true), true), (None, true)] {
            let mut l = calm(20);
            l.step(&lane(busy));
            assert_eq!(l.step(&lane(busy)).rate.is_some(), engaged, "{busy:?}");
        }
    }

    #[test]
    fn a_moment_late_a_few_buckets_up_or_under_the_floor_is_not_late() {
        // One late window between calm ones (a stall) never engages.
        let mut l = calm(20);
        for _ in 0..20 {
            l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
            assert_eq!(l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true)).rate, None);
        }
        // Four times the calm quantile is not late (bucket 8: 8.4 ms against 2.1).
        let mut l = calm(20);
        for _ in 0..10 {
            assert_eq!(l.step(&tick(8, WINDOW_ANSWERS, 30_000.0, true)).rate, None);
        }
        // A microsecond service at a few ms: over 8 times its calm, under LATE_MIN_MS.
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            l.step(&tick(0, WINDOW_ANSWERS, 5_000.0, true));
        }
        for _ in 0..10 {
            assert_eq!(l.step(&tick(7, WINDOW_ANSWERS, 30_000.0, true)).rate, None, "4.2 ms is not late");
        }
    }

    /// A flood that raises the answer delay in steps: windows at four times
    /// the calm are slow, not late; they neither feed the calm (which would
    /// rise to meet the flood) nor let the class learn.
    #[test]
    fn slow_windows_neither_feed_the_calm_nor_let_the_class_learn() {
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            l.step(&tick(5, WINDOW_ANSWERS, 5_000.0, true));
        }
        assert!((l.calm_ms().0.unwrap() - 1.048576).abs() < 1e-6, "{:?}", l.calm_ms());
        // The next bucket up (a calm service's own jitter) is neither slow
        // nor late, and feeds the calm.
        l.step(&tick(6, WINDOW_ANSWERS, 5_000.0, true));
        assert!(!l.slow() && !l.late());
        let calm_ms = l.calm_ms().0.unwrap();
        assert!(calm_ms > 1.05, "{calm_ms}");
        // Four times the calm (4.2 ms) for 100 windows: slow, never late, the calm unmoved.
        for _ in 0..100 {
            assert_eq!(l.step(&tick(7, WINDOW_ANSWERS, 30_000.0, true)), LateOut::default());
            assert!(l.slow() && !l.late());
        }
        assert!((l.calm_ms().0.unwrap() - calm_ms).abs() < 1e-6, "{:?}", l.calm_ms());
        // So 16 times the calm (16.8 ms) is late, and engages.
        l.step(&tick(9, WINDOW_ANSWERS, 30_000.0, true));
        assert!(l.late() && l.slow());
        assert!(l.step(&tick(9, WINDOW_ANSWERS, 30_000.0, true)).rate.is_some());
        // The known clients' stream alone being slow is enough.
        let mut l = LateAnswers::default();
        let both = |all: usize, known: usize| LateTick {
            known_answers: answers(known, WINDOW_ANSWERS),
            ..tick(all, WINDOW_ANSWERS, 5_000.0, true)
        };
        for _ in 0..20 {
            l.step(&both(5, 5));
        }
        l.step(&both(5, 8));
        assert!(l.slow() && !l.late());
        l.step(&both(5, 5));
        assert!(!l.slow());
        // Under SLOW_MIN_MS nothing is slow: a microsecond service at 0.5 ms.
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            l.step(&tick(0, WINDOW_ANSWERS, 5_000.0, true));
        }
        l.step(&tick(4, WINDOW_ANSWERS, 5_000.0, true));
        assert!(!l.slow());
        assert_eq!(l.slow_mark_ms(), Some(SLOW_MIN_MS), "the learner's wake mark: SLOW_MIN_MS at least");
    }

    /// The learner's wake mark: SLOW_FACTOR times the calm p90 of all the
    /// class's answers, once there is a calm.
    #[test]
    fn the_slow_mark_follows_the_calm_of_all_answers() {
        assert_eq!(LateAnswers::default().slow_mark_ms(), None, "no calm, no mark");
        let mut l = LateAnswers::default();
        for _ in 0..20 {
            l.step(&tick(5, WINDOW_ANSWERS, 5_000.0, true));
        }
        let mark = l.slow_mark_ms().unwrap();
        assert!((mark - SLOW_FACTOR * 1.048576).abs() < 1e-6, "{mark}");
    }

    #[test]
    fn a_window_waits_for_its_answers_and_a_silent_class_holds() {
        let mut l = calm(20);
        // Three answers a tick: a window is judged once it has WINDOW_ANSWERS.
        for i in 0..11 {
            l.step(&tick(12, 3, 30_000.0, true));
            assert_eq!(l.all.run, u32::from(i >= 10), "tick {i}");
        }
        // No answers for seconds: nothing judged, nothing changes.
        let mut l = calm(20);
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        let engaged = l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        for _ in 0..500 {
            assert_eq!(l.step(&tick(0, 0, 30_000.0, true)), engaged);
        }
        // Too few answers in an old window: dropped unjudged.
        let mut l = calm(20);
        for _ in 0..100 {
            l.step(&tick(12, 0, 30_000.0, true));
        }
        l.step(&tick(12, WINDOW_MIN_ANSWERS - 1, 30_000.0, true));
        assert_eq!(l.all.run, 0);
    }

    #[test]
    fn an_engaged_class_lets_go_after_a_second_in_time_with_nothing_limited() {
        let mut l = calm(20);
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        assert!(l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true)).rate.is_some());
        // In time, but the gate still drops (the unknown tier grows back): held.
        for _ in 0..200 {
            let out = l.step(&LateTick { limiting: true, ..tick(6, WINDOW_ANSWERS, 30_000.0, true) });
            assert!(out.rate.is_some());
        }
        // In time with nothing limited: let go after RELEASE_SECS.
        let ticks = (RELEASE_SECS / 0.01).round() as usize;
        for i in 1..=ticks {
            let out = l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true));
            assert_eq!(out.rate.is_none(), i == ticks, "tick {i}");
        }
        // A late window restarts the count.
        let mut l = calm(20);
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        for _ in 0..ticks - 1 {
            l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true));
        }
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        assert!(l.step(&tick(6, WINDOW_ANSWERS, 30_000.0, true)).rate.is_some());
        // The known clients coming back raise the rate (KNOWN_ROOM), never lower it.
        let mut l = calm(20);
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true));
        let back = LateTick { known_pps: 20_000.0, ..tick(12, WINDOW_ANSWERS, 30_000.0, true) };
        assert_eq!(l.step(&back).rate, Some(50_000.0));
        assert_eq!(l.step(&tick(12, WINDOW_ANSWERS, 30_000.0, true)).rate, Some(50_000.0));
        // A light offered rate is limited at the floor, not below.
        let mut l = calm(20);
        l.step(&tick(12, WINDOW_ANSWERS, 10.0, true));
        assert_eq!(l.step(&tick(12, WINDOW_ANSWERS, 10.0, true)).rate, Some(RATE_FLOOR_PPS));
    }
}
