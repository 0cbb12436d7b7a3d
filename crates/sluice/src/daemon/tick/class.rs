//! One class as the tick keeps it: its counters at the last tick, its
//! source fairness, what was written for it, and the drops it took while
//! its service had room; and how a class's limits combine.
use crate::bpf_intf::*;
use crate::dataplane::gate::counters::ClassTotals;
use crate::dataplane::gate::{ClassCounters, Tiers};
use crate::dataplane::share::SplitCounts;
use crate::policy::budget::FLOOR_PPS;
use crate::policy::config::{default_burst, Limit};
use crate::policy::fair::{Fair, FairCounts, FairTick, Room};
use crate::policy::late::{LateAnswers, LateOut, LateTick};

/// An auto class whose gate drops while it admits under this share of its
/// service's capacity estimate drops with room (`dropped_with_room`): its
/// controller admits the estimate, a drain tick 5% under it.
pub(super) const HAD_ROOM: f64 = 0.9;
/// Only drops in a stretch of ticks with room lasting this long (s) count:
/// a limit just written starts its buckets empty, and a drain or a cut for
/// loss dips under the estimate for a few ticks by design (in a namespace
/// test, the first three ticks of a flood admitted half the new limit).
const ROOM_SECS: f64 = 0.5;

/// Packets the gate dropped while its service had room, counted by
/// stretches of ROOM_SECS or longer (a shorter one is the controller's own
/// transient, not a limit under what the service takes).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WithRoom {
    /// Seconds the current stretch has lasted, and its drops so far.
    pub(super) secs: f64,
    pub(super) pending: u64,
    /// Counted so far.
    pub(super) total: u64,
}

impl WithRoom {
    pub(super) fn tick(&mut self, room: bool, dropped: u64, dt: f64) {
        if !room {
            (self.secs, self.pending) = (0.0, 0);
            return;
        }
        self.secs += dt;
        self.pending += dropped;
        if self.secs >= ROOM_SECS - 1e-9 {
            self.total += std::mem::take(&mut self.pending);
        }
    }
}

/// One class as the tick keeps it.
pub(super) struct TickClass {
    pub(super) priority: u8,
    /// The class's own limit from the config.
    pub(super) limit: Limit,
    /// Seen and admitted packets at the last tick, the packets/s offered
    /// and admitted in it, and its length (s).
    pub(super) totals: Option<ClassTotals>,
    pub(super) offered: f64,
    pub(super) admitted: f64,
    pub(super) dt: f64,
    /// The per-CPU counters at the last split (`Gate::rebalance`).
    pub(super) split: SplitCounts,
    /// Source fairness, and the gate's counters at the last tick for it.
    pub(super) fair: Fair,
    pub(super) raw: Option<ClassCounters>,
    pub(super) counts: FairCounts,
    /// The class's sockets were in distress in the last tick, and in how many ticks so far.
    pub(super) distress: bool,
    /// Its service was behind and losing in the last tick (distress::Judgement::behind):
    /// what cuts the unknown sources' tier.
    pub(super) behind: bool,
    /// Its sockets dropped in the last tick (distress::Judgement::dropped): what cuts the
    /// unknown tier by a tenth while known clients share them.
    pub(super) dropped: bool,
    /// Its fullest UDP socket's queue at the last tick's end, as a share of
    /// that socket's buffer (None: no UDP socket): what sizes the unknown
    /// tier while known clients share it (`fair::QUEUE_TARGET`).
    pub(super) queue: Option<f64>,
    pub(super) distress_ticks: u64,
    /// Packets the gate dropped while the service had room (see
    /// `ClassSnapshot::dropped_with_room_pkts`).
    pub(super) dropped_with_room: WithRoom,
    /// The tiers written at the last tick (None: not written yet).
    pub(super) tiers: Option<Tiers>,
    /// The limit decided at the last tick, before the split over sources.
    pub(super) decided: Option<Limit>,
    /// The learner may record the class's clients: every class but the
    /// default one, whose "answers" are the host's own outbound traffic
    /// (a resolver's upstream queries, a proxy's connections), not clients.
    pub(super) learns: bool,
    /// The gate clock of the last tick that let the learner learn (its
    /// answers since are confirmed by the next tick, or not), and the last
    /// window the next tick did not confirm (`Tiers::taint`).
    pub(super) learned_at: Option<u64>,
    pub(super) taint: (u64, u64),
    /// The gate clock of the first tick of the learner's current run (None:
    /// not learning): the gate keeps a pause before it out of its known
    /// clients' spans (`struct sluice_fair`'s learn_from_ms).
    pub(super) learning_since: Option<u64>,
    /// Observing: the last tick at which a lower class had a budget
    /// throttle (`Ticker::observe_held`).
    pub(super) observe_held_at: Option<std::time::Instant>,
    /// A TCP auto class (no UDP port, so no auto controller) is judged on
    /// its answer delays (`late`): the judge, and what it said last tick.
    pub(super) late: Option<LateAnswers>,
    pub(super) late_out: LateOut,
    /// How busy the CPUs its service ran on were at the last look, and how
    /// much of that was its own work (None: its threads were not read).
    pub(super) load: Option<crate::signals::service_cpus::Busy>,
}

impl TickClass {
    /// Its service is busy, mostly with its own work (`late::busy`): late
    /// answers are then its load's (None: its threads were not read).
    pub(super) fn busy(&self) -> Option<bool> {
        self.load.map(|b| crate::policy::late::busy(b.cpus, b.own))
    }

    /// A class as the tick first sees it; `learns`: the learner may record
    /// its clients (every class but the default one); `judged_late`: its
    /// answers' delay may engage it (`late`).
    pub(super) fn new(priority: u8, limit: Limit, learns: bool, judged_late: bool) -> TickClass {
        TickClass {
            priority,
            limit,
            totals: None,
            offered: 0.0,
            admitted: 0.0,
            dt: 0.0,
            split: SplitCounts::default(),
            fair: Fair::default(),
            raw: None,
            counts: FairCounts::default(),
            distress: false,
            behind: false,
            dropped: false,
            queue: None,
            distress_ticks: 0,
            dropped_with_room: WithRoom::default(),
            tiers: None,
            decided: None,
            learns,
            learned_at: None,
            taint: (0, 0),
            learning_since: None,
            observe_held_at: None,
            late: judged_late.then(LateAnswers::default),
            late_out: LateOut::default(),
            load: None,
        }
    }

    /// Judge the tick's answers (`now`: this tick's totals; the class's own
    /// are the last tick's, not yet replaced), for a class judged on them:
    /// a late one is behind (its unknown tier is cut).
    pub(super) fn judge_answers(&mut self, now: &ClassTotals, dt: f64) {
        let busy = self.busy();
        let (Some(late), Some(old)) = (self.late.as_mut(), self.totals) else { return };
        let t = LateTick {
            answers: now.answer_delays.since(&old.answer_delays),
            known_answers: now.answer_delays_known.since(&old.answer_delays_known),
            offered: self.offered,
            dt,
            limiting: now.dropped_pkts() > old.dropped_pkts(),
            known_pps: now.known_pkts.saturating_sub(old.known_pkts) as f64 / dt.max(1e-4),
            known_lane: self.learns && self.fair.has_known_lane(),
            busy,
        };
        self.late_out = late.step(&t);
        self.behind |= self.late_out.late;
    }

    /// Was the class's last window of answers late (`LateAnswers::late`)?
    pub(super) fn answers_late(&self) -> bool {
        self.late.as_ref().is_some_and(LateAnswers::late)
    }

    /// Was it slow (`LateAnswers::slow`; a late one is slow too)?
    pub(super) fn answers_slow(&self) -> bool {
        self.late.as_ref().is_some_and(LateAnswers::slow)
    }

    /// The fairness counters of the last tick, from the gate's raw counters.
    pub(super) fn counts_from(&mut self, raw: ClassCounters) {
        let old = self.raw.replace(raw).unwrap_or(raw);
        let d = |i: u32| raw[i as usize].saturating_sub(old[i as usize]);
        self.counts = FairCounts {
            known: d(SLUICE_CS_KNOWN_PKTS),
            unknown: d(SLUICE_CS_UNKNOWN_PKTS),
            under: d(SLUICE_CS_UNDER_PKTS),
            active: d(SLUICE_CS_SRC_ACTIVE),
            over: d(SLUICE_CS_SRC_OVER),
            inserts: d(SLUICE_CS_SRC_INSERTS),
            sampled: d(SLUICE_CS_SAMPLED_PKTS),
            sampled_known: d(SLUICE_CS_SAMPLED_KNOWN),
        };
    }

    /// The class's room rule (`Fair::room`), where it learns its clients.
    fn room(&self) -> Room {
        if self.learns {
            self.fair.room()
        } else {
            Room::Off
        }
    }

    /// What the class's buckets get: a limited class is split between known
    /// and unknown sources; any class but the default one lets the learner
    /// record its clients once it has been healthy (nothing dropped, no
    /// distress) for a while.
    pub(super) fn tiers(&mut self, limit: Limit, capacity: u32, now_ms: u64) -> Tiers {
        let late = self.answers_late();
        // A class limited for its late answers is not healthy until it lets
        // go: the flood it holds back is answered in time meanwhile, and
        // nothing of it dropped once its tier grows back, so the learner
        // would learn the flood's addresses (the bench's `conns-calm-v4`:
        // 2 cells of 12 were learning at their end, still engaged).
        let engaged = self.late_out.rate.is_some();
        let healthy = !self.distress && !late && !engaged && self.admitted >= self.offered;
        // Answers slower than usual (`late::SLOW_FACTOR`) pause the learner
        // without restarting its calm second (a calm service's moment of
        // load does not cost it a second of learning), and have the gate
        // time every request it admits (`Tiers::time_all`).
        let slow = self.answers_slow();
        let learn = self.fair.learn(healthy, self.offered, self.dt) && self.learns && !slow;
        self.fair.note_known(self.counts.sampled, self.counts.sampled_known);
        // The learner noted answers since the last learning tick with the
        // gate clock that tick wrote: this tick confirms them, or taints
        // them (a surge or distress seen now may have been answered then).
        self.learning_since = if learn { self.learning_since.or(Some(now_ms)) } else { None };
        let learn = self.learning_since;
        if learn.is_some() {
            self.learned_at = Some(now_ms);
        } else if let Some(at) = self.learned_at.take() {
            // Slow answers (a late one is slow too) taint further back
            // (`late::LATE_TAINT_MS`): the window that showed them took
            // answers to fill, and a flood of real connections is answered
            // from its first packet. (Late only, the learner stopped at the
            // first slow window and the taint held its last 30 ms: in a
            // traced `conns-calm-v4` cell
            // three of the flood's four addresses, noted in the flood's
            // first 50 ms, were known 3 s later, and took wrk's place.)
            let back = if slow { crate::policy::late::LATE_TAINT_MS } else { 0 };
            self.taint = (at.saturating_sub(back), now_ms);
        }
        let taint = self.taint;
        let Limit::Rate { pps, burst } = limit else {
            self.fair.idle();
            return Tiers { limit, fair: None, learn, room: self.room(), taint, under: false, time_all: slow };
        };
        // The counts' rates over the tick's measured length (a tick after a
        // 500 ms calm one, or one that overran, is not 10 ms); the budget is
        // for the next epoch, a fast tick.
        let epoch = crate::policy::controller::TICK.as_secs_f64();
        let dt = if self.dt > 0.0 { self.dt } else { epoch };
        let t = FairTick {
            rate: pps as f64,
            dt,
            epoch,
            counts: self.counts,
            distress: self.behind,
            dropped: self.dropped,
            late: self.late_out.late,
            by_answers: engaged,
            slow,
            held: self.admitted < self.offered,
            queue: self.queue,
            capacity,
        };
        let out = self.fair.step(&t);
        let tier = |r: f64, depth: Option<u64>| {
            let pps = r.round().max(1.0) as u64;
            Limit::Rate { pps, burst: depth.unwrap_or_else(|| default_burst(pps)).min(burst) }
        };
        Tiers {
            limit: tier(out.known_pps, None),
            fair: Some(crate::dataplane::gate::FairTier {
                unknown: tier(out.unknown_pps, out.unknown_depth()),
                quota: out.quota,
                plens: (out.plen4, out.plen6),
                by_work: out.by_work,
            }),
            learn,
            room: self.room(),
            taint,
            under: self.offered < pps as f64,
            time_all: slow,
        }
    }
}

/// An auto class whose rate is over this many times what it was offered in
/// the last tick admits everything until its traffic comes closer (a flood
/// that starts is limited from the next tick, 10 ms later).
const AUTO_IDLE: f64 = 2.0;

/// What decides whether an auto class's rate is written this tick.
#[derive(Debug, Clone, Copy)]
pub(super) struct OwnRate {
    /// Packets/s offered to the class in the tick.
    pub(super) offered: f64,
    /// The most any class of lower priority admitted (packets/s).
    pub(super) lower_admitted: f64,
    /// Offered over OWN_FLOOD times its service's capacity estimate.
    pub(super) own_flood: bool,
    /// Observe mode, and a lower class has a budget throttle (see the
    /// module comment of `tick`).
    pub(super) observe_held: bool,
}

impl OwnRate {
    /// Is the controller's rate `r` left unwritten (the class admits all)?
    /// - far above what arrives: the per-CPU split would hold a CPU that
    ///   starts receiving to a small share;
    /// - below what arrives while a lower class still gets more than the
    ///   budget's floor: a service starved by their traffic has them
    ///   throttled first, not its own clients;
    /// - observing while a lower class would be throttled: enforcing, that
    ///   throttle would have come first, and the class's signals are not
    ///   what they would be.
    ///
    /// The last two never for a class flooded itself (passing it all would
    /// livelock its service).
    pub(super) fn passes(&self, r: f64) -> bool {
        let lower_busy = self.lower_admitted > FLOOR_PPS;
        r > AUTO_IDLE * self.offered || (!self.own_flood && ((lower_busy && r < self.offered) || self.observe_held))
    }
}

/// A packets/s limit for a rate (None: unlimited), its bucket at least
/// `depth` packets deep.
pub(super) fn rate_limit(r: Option<f64>, depth: u64) -> Limit {
    r.map_or(Limit::Unlimited, |r| {
        let pps = r.round().max(1.0) as u64;
        Limit::Rate { pps, burst: default_burst(pps).max(depth) }
    })
}

/// The tighter of a class's own limit and the budget's throttle.
pub(super) fn tightest(own: Limit, throttle: Option<f64>) -> Limit {
    let Some(t) = throttle else {
        return match own {
            Limit::Auto(_) => Limit::Unlimited,
            l => l,
        };
    };
    match own {
        Limit::Blocked => Limit::Blocked,
        Limit::Rate { pps, burst } if (pps as f64) <= t => Limit::Rate { pps, burst },
        _ => rate_limit(Some(t), 0),
    }
}
