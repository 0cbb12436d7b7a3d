//! Source fairness inside a limited class (pure logic: the tick feeds it the
//! gate's counters, the unit tests feed it numbers).
//!
//! Why: a class's token bucket drops whatever arrives when it is empty, so a
//! flood takes the class's admission in proportion to its arrivals and a
//! light client behind the same limit loses nearly everything (Performing Under Overload,
//! ch. 8: tail drop locks light flows out). The gate therefore splits a
//! limited class in two tiers (see "Source fairness" in gate.bpf.c):
//!
//! - known sources (clients the service answered while the class was healthy,
//!   recorded by the egress learner) take the class's own bucket, sized here
//!   at KNOWN_HEADROOM times the most they sent in a tick lately (decaying
//!   over seconds), at most 1 - UNKNOWN_MIN of the class rate (on the
//!   first limited tick, with no count yet, the whole rate);
//! - every other source has a slot in the gate's direct-mapped "sources"
//!   table (shared by chance with another source: each takes it over) and is paced
//!   at `quota` packets per epoch (one tick; the gate turns it into an
//!   interval per packet: see SLUICE_SRC_BURST_* in sluice.h); what is
//!   within its share takes the unknown tier's bucket, the rest of the rate
//!   and never less than UNKNOWN_MIN of it (new clients are never locked out).
//!
//! The quota is the max-min fair share, found from what the gate counted
//! in the last epoch with the quota then in force (q): `under` packets were
//! within quota, of which `over` sources sent q each and wanted more. The
//! light sources' packets are L = under - over * q; the budget of an epoch
//! is B = unknown rate x tick, so the share that fills it is (B - L) / over.
//! With no source over the quota, the quota grows by what is left of B;
//! when the light sources alone fill B, it shrinks in proportion.
//!
//! When even a quota of one packet per epoch cannot hold the unknown tier to
//! its rate (many addresses, each sending little: a spoofed flood), or the
//! sources map turns over faster than every CHURN_SECS, sources are counted
//! by a shorter prefix: /24 and /48, then /16 and /32 (PLENS), one step per
//! AGG_TICKS at most, back to single addresses after OFF_TICKS without
//! fairness. Known sources are never aggregated.
//!
//! A TCP class limited for its late answers (`late`) is cut the same way:
//! by CUT while they are late, by SOFT_CUT while they are slow.
//!
//! And when the class's own sockets drop while known clients and unknown
//! sources are both admitted (the queue they share overflowed, and it drops
//! the known clients' datagrams with the rest), the unknown tier's rate is
//! cut (every COOL_TICKS at most, down to CUT_FLOOR of the class rate): by
//! SOFT_CUT for drops alone (a probe of the auto controller, a burst), by
//! CUT when the service is behind and losing (the queue over half the
//! buffer at both tick ends: distress::Judgement::behind); it grows back by REGROW per
//! tick without drops while the socket's queue is under QUEUE_TARGET of its
//! buffer and the gate held some of the class back (FairTick::held), and
//! shrinks in proportion while it is over (QUEUE_GAIN). The
//! class's limit runs at the edge of what its service takes, where a socket
//! drops a share of everything it is given; with known clients in that
//! share, the unknown tier gives way until the queue sits at the target,
//! with room left for a known client's burst.

/// The unknown tier keeps at least this share of the class rate. (Half was
/// tried, to bound what addresses poisoned while calm can claim, issue 49
/// item 3, and taken back: where a service's load is its known clients,
/// held at its knee, their packets over half the rate would be dropped.)
pub const UNKNOWN_MIN: f64 = 0.1;
/// The known tier's bucket is this many times what known sources sent
/// recently: the highest rate of a tick, decaying by KNOWN_DECAY a tick
/// (half in 3.5 s), so a known client's bursts and returns find room sized
/// over seconds, not by the last 10 ms.
pub const KNOWN_HEADROOM: f64 = 2.0;
pub const KNOWN_DECAY: f64 = 0.998;
/// The unknown tier is never cut below this rate.
pub const UNKNOWN_FLOOR_PPS: f64 = 100.0;
/// Socket distress halves the unknown tier, every COOL_TICKS at most, down
/// to CUT_FLOOR of the class rate (at least UNKNOWN_FLOOR_PPS: new clients
/// keep a way in); it grows back by REGROW per healthy tick. The floor is
/// far below UNKNOWN_MIN because the class rate itself may be far above what
/// the service can take (the auto controller's estimate, mid-probe).
pub const CUT: f64 = 0.5;
/// The cut for socket drops without a standing queue: a tenth, so a tier
/// that a probe's one tick of overflow cut is back within five ticks.
pub const SOFT_CUT: f64 = 0.9;
pub const CUT_FLOOR: f64 = 0.01;
pub const COOL_TICKS: u32 = 3;
pub const REGROW: f64 = 0.02;
/// While known clients share the socket with unknown sources, the unknown
/// tier is sized by the socket's queue, not only by its drops: a drop is a
/// known client's datagram lost already. Over QUEUE_TARGET of the buffer
/// at a tick's end (the fullest socket's) the tier shrinks each tick by
/// QUEUE_GAIN times how far over it is (as a share of the room above the
/// target: at a full buffer, by QUEUE_GAIN); it grows back (REGROW) only
/// while the queue is under the target (and the tier binds: FairTick::held).
/// A quarter leaves three quarters
/// of the buffer for a known client's burst, and a queue that never
/// empties keeps the service busy (its throughput is not given away): at
/// the bench's 4 MiB NSD buffer (about 1,000 datagrams of 4 KiB truesize)
/// and 94k reads/s, a quarter is about 2.7 ms of sojourn. Sized before the
/// issue-48 runs, not tuned on them (docs/protection.md has the figures).
pub const QUEUE_TARGET: f64 = 0.25;
pub const QUEUE_GAIN: f64 = 0.25;
/// While the unknown tier runs at a rate of its own beside known clients
/// (`FairOut::by_work`), its bucket holds UNKNOWN_DEPTH_SECS of that rate
/// (at least UNKNOWN_DEPTH_MIN tokens), not the 10 ms of a class's own
/// bucket: what the tier admits at once is work the service takes before
/// the next known client's request, and a rate within what the service
/// takes makes a millisecond of it at most a millisecond's wait. With
/// 10 ms, the bench's pipelining flood (`conns-calm-v4`), bursting after
/// each pause, held the light client's p99 at 1.7 ms against 0.29 ms
/// unflooded, where its server-side wait (the gate's answer delay) was
/// the flood's work queued ahead of it; 1 ms deep, 0.25-0.67 ms against
/// 0.24-0.29 ms.
pub const UNKNOWN_DEPTH_SECS: f64 = 0.001;
pub const UNKNOWN_DEPTH_MIN: u64 = 8;
/// Prefix lengths sources are counted at: (IPv4, IPv6), by aggregation level.
pub const PLENS: [(u8, u8); 3] = [(32, 64), (24, 48), (16, 32)];

/// Ticks a level is held before the next step up.
pub const AGG_TICKS: u32 = 100;
/// Fewer active sources per epoch than this are never aggregated: a few
/// heavy sources are cut by their quota, not by their neighbours' count.
pub const AGG_MIN_SOURCES: u64 = 256;
/// The sources map may turn over at most once in this many seconds.
pub const CHURN_SECS: f64 = 10.0;
/// Ticks without fairness before sources are counted one by one again.
pub const OFF_TICKS: u32 = 500;
/// Is a client answered from `first_ms` to `last_ms` (either clock, both
/// the same) known: answered over SLUICE_KNOWN_SPAN_MS at least? An entry
/// whose last answer is dated before its first (a clock stepped back) is
/// not. The gate's copy of the rule is `known_span` in bpf/known.h.
pub fn known_span(first_ms: u64, last_ms: u64) -> bool {
    last_ms.checked_sub(first_ms).is_some_and(|d| d >= u64::from(crate::bpf_intf::SLUICE_KNOWN_SPAN_MS))
}

/// Healthy seconds (no drop, no distress, no surge) before the learner
/// records clients. Time, not ticks: while all is calm the daemon ticks
/// every 500 ms, and 100 ticks were then most of a minute (a client answered
/// for seconds before a flood was never learnt).
pub const LEARN_CALM_SECS: f64 = 1.0;
/// A tick whose arrivals are over LEARN_SURGE times the class's usual
/// (a slow mean over healthy ticks) plus LEARN_SLACK_PPS is a surge: a flood
/// starting, whose sources the service may answer before anything is limited.
pub const LEARN_SURGE: f64 = 4.0;
pub const LEARN_SLACK_PPS: f64 = 1000.0;
/// Seconds after a restart (the state file held known clients) in which
/// no class learns (`Fair::hold_learning`). A restart forgets each class's
/// usual arrivals, and the first second of traffic after it sets them with
/// no surge check: an attacker who pulses right after restarts (issue 49
/// item 3: three pulses, a restart between each, the state kept) was its
/// usual load, answered while calm, and known after the third. Held, a
/// pulse must last the hold and a calm second more. A first start (no
/// state) has nobody known to lose and learns at once.
pub const LEARN_HOLD_AFTER_RESTART_SECS: f64 = 10.0;
/// Seconds a class keeps room in its sockets for known clients after a
/// tick of surge (`Fair::keeps_room`): a flood whose arrivals the limit or
/// the room drops soon bring down is still that flood.
pub const ROOM_HOLD_SECS: f64 = 2.0;
/// A run of surge ticks keeps room (`Fair::keeps_room`) once what arrived
/// in it over the usual adds up to this many seconds of the usual load
/// (plus LEARN_SLACK_PPS). A client that fell behind its schedule (its CPU
/// taken for a moment, as its server's was) catches up in a burst over
/// LEARN_SURGE times its usual, but one that carries only what it owed:
/// room kept for it dropped a calm NSD's own clients whenever its socket
/// was three quarters full, for the next two seconds (a fresh-clone CI run:
/// 7,196 of dnsperf's queries at half NSD's capacity, with no flood).
/// Busy loops at nice -10 for 60 ms of every 460 made dnsperf catch up at
/// 4-6 times its usual for up to 120 ms, 0.27 s of its usual load over it;
/// at 0.1 s, two runs of four still kept room, at 0.2 s one of six. A
/// flood's excess grows for as long as it lasts: at 40 times the usual it
/// reaches this in the first 10 ms tick, at 10 times in three, at
/// LEARN_SURGE times in seven.
pub const ROOM_EXCESS_SECS: f64 = 0.2;
/// The gate marks a surge on its own (an armed room, bpf/gate/room.h) at
/// this many times the class's usual arrivals reaching one CPU. Ten, where
/// the daemon's surge is LEARN_SURGE: it acts on a CPU's 2 ms, not a tick,
/// and dnsperf catching up after its CPU was taken for 60 ms ran at 4-6
/// times its usual (ROOM_EXCESS_SECS). One CPU's count against the class's
/// whole usual: a CPU that takes all of a class's traffic never marks its
/// usual load, however many CPUs there are; a flood spread over n CPUs is
/// marked at n times that.
pub const GATE_SURGE: f64 = 10.0;
/// The fewest packets a gate's surge mark counts (a NIC's poll batch, 64
/// frames): a class whose usual is a trickle is not marked by one poll.
pub const GATE_SURGE_MIN_PKTS: u32 = 64;

/// What the class's sockets keep for its known clients (bpf/gate/room.h;
/// `struct sluice_fair`'s room and surge_pkts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Room {
    /// Nothing: no known lane, or still warming up.
    #[default]
    Off,
    /// Room on every CPU (`Fair::keeps_room`).
    Kept,
    /// Room on a CPU once `surge_pkts` of the class's packets reach it
    /// within SLUICE_SURGE_WINDOW_NS, for SLUICE_SURGE_HOLD_NS.
    Armed { surge_pkts: u32 },
}

/// The packets in one SLUICE_SURGE_WINDOW_NS on one CPU that mark a surge
/// of a class whose usual arrivals are `usual_pps`, rounded up to a step of
/// a quarter of its highest power of two: the usual drifts a little every
/// tick, and each change is a write of the class's per-CPU maps.
pub fn gate_surge_pkts(usual_pps: f64) -> u32 {
    let window = crate::bpf_intf::SLUICE_SURGE_WINDOW_NS as f64 / 1e9;
    let pkts = (GATE_SURGE * usual_pps * window).ceil().min(f64::from(u32::MAX >> 1)) as u32;
    let pkts = pkts.max(GATE_SURGE_MIN_PKTS);
    let step = 1u32 << (31 - pkts.leading_zeros()).saturating_sub(2);
    pkts.div_ceil(step) * step
}

/// A class has a known lane when at least this share of its calm arrivals
/// came from its known clients (the gate's sample, `note_known`; MIN_SAMPLES
/// of them at least): room is kept for known clients only then, and the
/// controller's newcomers rule (`controller::CALM_KNOWN` is this) needs it.
/// Where the clients were never learned (a service held behind dnsperf in
/// a VM's slow hour is never calm to learn it), the room protected the few
/// known packets (a 200/s probe, about 1% of the arrivals) by dropping the
/// clients themselves: 7,158 of dnsperf's queries in a calm-50 cell, after
/// a catch-up that brought more than ROOM_EXCESS_SECS. A tenth, not a half:
/// a client learned a second before a flood sent most of its calm packets
/// while still unknown (the batch-reader integration test).
pub const ROOM_KNOWN: f64 = 0.1;
/// The calm ticks' known share is a moving mean over about this many of
/// their sampled packets (not seconds: a light class samples a packet a
/// tick or less, and a pause before a flood must not fade what it showed).
pub const KNOWN_SHARE_SAMPLES: f64 = 256.0;

/// What the gate counted for one class in one tick (differences of its
/// SLUICE_CS_* counters).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FairCounts {
    pub known: u64,
    pub unknown: u64,
    pub under: u64,
    pub active: u64,
    pub over: u64,
    pub inserts: u64,
    /// Packets whose source the gate sampled (any mode), and the known ones.
    pub sampled: u64,
    pub sampled_known: u64,
}

/// The known sources' share of a class's sampled packets (the gate samples
/// one in SLUICE_KNOWN_SAMPLE), a moving mean over KNOWN_SHARE_SAMPLES of
/// them, fed only the ticks its owner counts (the calm ones).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KnownShare {
    /// Samples seen, up to KNOWN_SHARE_SAMPLES.
    samples: f64,
    known: f64,
}

impl KnownShare {
    /// Add a tick's `sampled` packets, `known` of them from known sources.
    pub fn note(&mut self, sampled: u64, known: u64) {
        if sampled == 0 {
            return;
        }
        let n = sampled as f64;
        let weight = n / (n + self.samples.min(KNOWN_SHARE_SAMPLES));
        self.known += weight * (known.min(sampled) as f64 / n - self.known);
        self.samples = (self.samples + n).min(KNOWN_SHARE_SAMPLES);
    }

    /// The known share (None: fewer than MIN_SAMPLES samples yet).
    pub fn share(&self) -> Option<f64> {
        (self.samples >= crate::policy::controller::MIN_SAMPLES as f64).then_some(self.known)
    }
}

/// One tick of a limited class.
#[derive(Debug, Clone, Copy)]
pub struct FairTick {
    /// The class's limit, packets/s.
    pub rate: f64,
    /// The length of the tick the counts span, seconds (measured: a tick
    /// after a calm 500 ms one, or one that overran, is not the fast tick).
    pub dt: f64,
    /// The length of the epoch the budget is for, seconds: the fast tick.
    pub epoch: f64,
    pub counts: FairCounts,
    /// The class's own service is behind and losing (distress::Judgement::behind): its
    /// sockets dropped with their queue standing over half the buffer.
    pub distress: bool,
    /// Its sockets dropped in the tick, with or without a standing queue.
    pub dropped: bool,
    /// Its answers are late (`late`): its known clients wait behind the
    /// unknown sources' requests, and may send nothing in a tick for it.
    pub late: bool,
    /// The class is limited for its late answers (`late::LateOut::rate`):
    /// its unknown tier runs at a rate of its own, cut while they are late
    /// or slow, and counts in work, though nobody known shares the class (a
    /// busy service flooded by real connections from new sources: each
    /// source is held to its share of the service's work).
    pub by_answers: bool,
    /// Its answers are slow, late or not (`late::SLOW_FACTOR`): the
    /// unknown tier is cut by SOFT_CUT, as for socket drops, and does not
    /// grow. So a class limited for late answers settles where they are
    /// under 3 times the calm p90, not where they are just under late:
    /// grown back while merely slow, the tier took the service to 8 ms
    /// again and again, and was halved each time.
    pub slow: bool,
    /// The gate held back some of the class's packets in the tick (it
    /// admitted fewer than it was offered): the tiers bound. The unknown
    /// tier grows only then. A tier nobody fills says nothing of what the
    /// service can take: a keep-alive flood's clients send in rounds (the
    /// bench's `conns-calm-v4`: a burst of about 40 ms every 0.23 s,
    /// nothing between). Grown through each silence (a median 7-11% in
    /// three traced cells, up to 49%), the tier made good each burst's cut
    /// and met the next one as high, and every burst took the service from
    /// the known clients (their packets fell from about 690 a tick to 35).
    pub held: bool,
    /// Its fullest UDP socket's queue at the tick's end, as a share of
    /// that socket's buffer (None: no UDP socket read).
    pub queue: Option<f64>,
    /// Entries of the sources map.
    pub capacity: u32,
}

/// The quota of a class with one unknown source alone: it has nobody to
/// share with, and the gate does not pace it (`FairTier::source_interval_ns`).
/// Status shows no quota for it, not this number.
pub const UNPACED: u32 = u32::MAX;

/// What the gate is told for the next tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairOut {
    pub known_pps: f64,
    pub unknown_pps: f64,
    pub quota: u32,
    pub plen4: u8,
    pub plen6: u8,
    /// The unknown tier runs at a rate of its own (beside known clients,
    /// or limited for late answers): the gate counts its TCP data in work,
    /// not packets (`struct sluice_fair`'s by_work), and paces each source
    /// in it, since one segment of a keep-alive flood carries many
    /// pipelined requests. Its rate and the quota are then in those tokens.
    pub by_work: bool,
}

impl FairOut {
    /// The unknown tier's bucket depth (tokens) when it runs at a rate of
    /// its own (UNKNOWN_DEPTH_SECS of it); None: a class's usual depth.
    pub fn unknown_depth(&self) -> Option<u64> {
        self.by_work.then(|| ((self.unknown_pps * UNKNOWN_DEPTH_SECS).ceil() as u64).max(UNKNOWN_DEPTH_MIN))
    }
}

/// One class's fairness state between ticks.
#[derive(Debug, Clone)]
pub struct Fair {
    /// The quota in force (None: fairness just started).
    quota: Option<f64>,
    /// Index into PLENS, and ticks spent at it.
    level: usize,
    level_ticks: u32,
    /// The unknown tier's rate at the last tick while known clients share
    /// the class (None: it follows what the known tier leaves).
    unknown: Option<f64>,
    since_cut: u32,
    off_ticks: u32,
    calm_secs: f64,
    /// The class's usual arrivals (packets/s), a slow mean over healthy
    /// ticks, and the healthy seconds seen (the first LEARN_CALM_SECS set
    /// it up, with no surge check: a service's first load is its usual).
    usual_pps: f64,
    healthy_secs: f64,
    /// The known sources' highest rate of a tick, decaying (KNOWN_DECAY).
    known_peak_pps: f64,
    /// Seconds left in which the class keeps room in its sockets for its
    /// known clients after a surge (ROOM_HOLD_SECS).
    room_secs: f64,
    /// The known sources' share of the calm ticks' sampled packets (`note_known`).
    calm_known: KnownShare,
    /// Packets over the usual in the current run of surge ticks (ROOM_EXCESS_SECS).
    surge_excess: f64,
    /// Seconds left in which the learner records nothing (`hold_learning`).
    hold_secs: f64,
}

impl Default for Fair {
    fn default() -> Self {
        Fair {
            quota: None,
            level: 0,
            level_ticks: 0,
            unknown: None,
            since_cut: u32::MAX,
            off_ticks: 0,
            calm_secs: 0.0,
            usual_pps: 0.0,
            healthy_secs: 0.0,
            known_peak_pps: 0.0,
            room_secs: 0.0,
            calm_known: KnownShare::default(),
            surge_excess: 0.0,
            hold_secs: 0.0,
        }
    }
}

impl Fair {
    /// One tick of a class that is limited: the tiers' rates and the quota.
    pub fn step(&mut self, t: &FairTick) -> FairOut {
        self.off_ticks = 0;
        self.known_peak_pps = (t.counts.known as f64 / t.dt).max(self.known_peak_pps * KNOWN_DECAY);
        // The gate counts known sources only while the class is limited: on
        // its first limited tick there is no count yet, and sized by none the
        // known tier let 1 packet/s through (the bench's known client lost
        // 40-50 queries at each onset). That tick (10 ms) gives both tiers
        // the whole rate: it may admit twice the rate once, which the
        // socket's buffer (about 10 ms of reads) absorbs.
        let first = self.quota.is_none() && self.known_peak_pps < 1.0;
        let known_pps = if first { t.rate } else { self.known_rate(t.rate) };
        let unknown_pps = self.unknown_rate(t, if first { t.rate } else { t.rate - known_pps });
        let budget = (unknown_pps * t.epoch).max(1.0);
        let quota = self.next_quota(&t.counts, budget);
        self.aggregate(t, budget, quota);
        let (plen4, plen6) = PLENS[self.level];
        // One source alone has nobody to share with: its quota is moot, and
        // a tick that runs long would cut it below the rate.
        let quota = if t.counts.active <= 1 { UNPACED } else { self.quota.unwrap_or(budget.floor()) as u32 };
        FairOut { known_pps, unknown_pps, quota, plen4, plen6, by_work: self.unknown.is_some() }
    }

    /// The known tier's rate at a class rate `rate`: KNOWN_HEADROOM times
    /// what known sources sent lately, at most 1 - UNKNOWN_MIN of the rate.
    fn known_rate(&self, rate: f64) -> f64 {
        (KNOWN_HEADROOM * self.known_peak_pps).min((1.0 - UNKNOWN_MIN) * rate)
    }

    /// A tick with the class not limited.
    pub fn idle(&mut self) {
        self.quota = None;
        self.unknown = None;
        self.off_ticks = self.off_ticks.saturating_add(1);
        if self.off_ticks >= OFF_TICKS {
            (self.level, self.level_ticks) = (0, 0);
        }
    }

    /// Does the egress learner record this class's clients? Only after
    /// LEARN_CALM_SECS healthy in a row with no surge of arrivals
    /// (`offered`, packets/s, over the last `dt` seconds): what a service
    /// answers while it is flooded, or in the ticks before a flood is
    /// limited, may be the flood's addresses.
    pub fn learn(&mut self, healthy: bool, offered: f64, dt: f64) -> bool {
        let usual = self.usual_pps;
        let warming = self.healthy_secs < LEARN_CALM_SECS;
        let surge = !warming && offered > LEARN_SURGE * usual + LEARN_SLACK_PPS;
        // The usual follows healthy ticks over about a second (a tenth of
        // that while warming up), surges over about ten (a service whose
        // load grew for good learns again).
        let secs = if warming {
            0.1
        } else if surge {
            10.0
        } else {
            1.0
        };
        if healthy {
            self.usual_pps = usual + (1.0 - (-dt / secs).exp()) * (offered - usual);
            // Warming ends after a second of traffic, not of an idle class:
            // a service's first load, whenever it comes, is its usual.
            if offered > 0.0 {
                self.healthy_secs += dt;
            }
        }
        self.calm_secs = if healthy && !surge { self.calm_secs + dt } else { 0.0 };
        self.surge_excess = if surge { self.surge_excess + (offered - usual) * dt } else { 0.0 };
        let lasting = self.surge_excess >= ROOM_EXCESS_SECS * (usual + LEARN_SLACK_PPS);
        self.room_secs = if lasting { ROOM_HOLD_SECS } else { (self.room_secs - dt).max(0.0) };
        if self.hold_secs > 0.0 {
            // The calm must come after the hold, whole.
            self.hold_secs = (self.hold_secs - dt).max(0.0);
            self.calm_secs = 0.0;
        }
        self.calm_secs >= LEARN_CALM_SECS - 1e-9
    }

    /// Note the tick's sampled packets (the gate's sample) and the known
    /// sources' among them, after `learn` judged the tick: counted only for
    /// a calm one, into a moving mean over KNOWN_SHARE_SAMPLES.
    pub fn note_known(&mut self, sampled: u64, known: u64) {
        if self.calm_secs > 0.0 {
            self.calm_known.note(sampled, known);
        }
    }

    /// Does the class have a known lane: ROOM_KNOWN of its calm arrivals,
    /// at least, from its known clients? Only then is there anyone to keep
    /// room for or to serve first.
    pub fn has_known_lane(&self) -> bool {
        self.calm_known_share().is_some_and(|k| k >= ROOM_KNOWN)
    }

    /// The share of the calm ticks' arrivals from known sources (None: fewer
    /// than MIN_SAMPLES sampled yet).
    pub fn calm_known_share(&self) -> Option<f64> {
        self.calm_known.share()
    }

    /// Record no client for the next `secs` seconds (of `learn`'s `dt`),
    /// and then only after LEARN_CALM_SECS calm: a restart
    /// (LEARN_HOLD_AFTER_RESTART_SECS).
    pub fn hold_learning(&mut self, secs: f64) {
        self.hold_secs = secs;
    }

    /// Does the class keep room in its UDP sockets for its known clients
    /// (bpf/gate/room.h)? For ROOM_HOLD_SECS after a tick whose arrivals
    /// surged (`learn` sees it: a flood starting, or going on while its
    /// class is unhealthy, limited or not: a batch reader's class may never
    /// be), in a run of surge ticks that brought ROOM_EXCESS_SECS of the
    /// usual load over it (a client catching up after a slow moment brings
    /// less). Not otherwise, not even while limited: a service its own
    /// clients hold at its knee (dnsperf at 90% of NSD's capacity, its
    /// socket over three quarters full at times, the auto controller
    /// engaged now and then) would have the gate drop its clients not known
    /// yet, and the controller stay engaged on those drops (39,294 gate
    /// drops in an 8 s cell, answered 70.85% against 93.31% with no sluice).
    /// And only where its calm arrivals were mostly its known clients'
    /// (ROOM_KNOWN): elsewhere there is no one to keep room for.
    pub fn keeps_room(&self) -> bool {
        self.room() == Room::Kept
    }

    /// The room rule for the gate: kept (`keeps_room`); armed, in a class
    /// with a known lane past its warm-up, so that the gate marks a surge
    /// of GATE_SURGE times the usual arrivals itself, before a tick sees it
    /// (`Room::Armed`); or off.
    pub fn room(&self) -> Room {
        if !self.has_known_lane() {
            return Room::Off;
        }
        if self.room_secs > 0.0 {
            return Room::Kept;
        }
        if self.healthy_secs < LEARN_CALM_SECS || self.usual_pps <= 0.0 {
            return Room::Off;
        }
        Room::Armed { surge_pkts: gate_surge_pkts(self.usual_pps) }
    }

    /// Prefix lengths in force (IPv4, IPv6).
    pub fn plens(&self) -> (u8, u8) {
        PLENS[self.level]
    }

    /// The unknown tier's rate. With no known client lately, what the known
    /// tier leaves (`left`). With known clients sharing the class, or while
    /// it is limited for its late answers (`FairTick::by_answers`), a rate
    /// of its own, moved from the last tick's: cut by the socket's drops (CUT,
    /// SOFT_CUT, every COOL_TICKS at most) and by a queue over QUEUE_TARGET
    /// (QUEUE_GAIN, each tick), grown by REGROW a tick while the queue is
    /// under it and the gate held some of the class back (`FairTick::held`),
    /// never over `left` nor under the floor. A rate of its own,
    /// not a share of `left`: the auto controller's probes raise `left` for
    /// a tick every 40 ms, and as a share each probe reached the socket at
    /// once and dropped known clients' datagrams with the rest.
    fn unknown_rate(&mut self, t: &FairTick, left: f64) -> f64 {
        let floor = (CUT_FLOOR * t.rate).max(UNKNOWN_FLOOR_PPS).min(left);
        self.since_cut = self.since_cut.saturating_add(1);
        if self.known_peak_pps < 1.0 && !t.by_answers {
            self.unknown = None;
            return left.max(floor);
        }
        let last = self.unknown.unwrap_or(left);
        // Cuts only when known clients share the socket with admitted
        // unknown traffic in the tick: with nobody to protect, a cut would
        // only lower the class's intake below its limit. Late (or slow)
        // answers cut whether a known packet came in the tick or not: a
        // known client that waits for its answers sends nothing meanwhile
        // (a light client behind a flood of real connections sent a
        // request every 50 ms, and a cut that waited for one came in one
        // tick of five).
        let shared = t.counts.unknown > 0 && (t.counts.known > 0 || t.late || t.slow);
        let by = if t.distress { CUT } else { SOFT_CUT };
        // How far over its target the queue stands, as a share of the room
        // above it (negative: under; no socket read: as if under).
        let over = t.queue.map_or(-1.0, |q| (q - QUEUE_TARGET) / (1.0 - QUEUE_TARGET));
        let next = if (t.distress || t.dropped || t.slow) && shared {
            if self.since_cut >= COOL_TICKS {
                self.since_cut = 0;
                last * by
            } else {
                last
            }
        } else if over > 0.0 && shared {
            last * (1.0 - QUEUE_GAIN * over.min(1.0))
        } else if over < 0.0 && t.held {
            last * (1.0 + REGROW)
        } else {
            last
        };
        let next = next.min(left).max(floor);
        self.unknown = Some(next);
        next
    }

    /// The max-min fair quota for an epoch budget of `budget` packets.
    fn next_quota(&mut self, c: &FairCounts, budget: f64) -> f64 {
        let q = self.quota.unwrap_or(budget);
        let under = c.under as f64;
        let over = c.over as f64;
        let light = (under - over * q).max(0.0);
        let next = if over > 0.0 && budget > light {
            (budget - light) / over
        } else if over > 0.0 || under > budget {
            q * budget / under.max(1.0)
        } else {
            q + (budget - under)
        };
        // Whole packets: the gate compares a count with it.
        let next = next.clamp(1.0, budget).floor();
        self.quota = Some(next);
        next
    }

    /// Count by a shorter prefix when single addresses cannot be told apart
    /// (quota at 1 and still twice over budget) or the map churns.
    fn aggregate(&mut self, t: &FairTick, budget: f64, quota: f64) {
        self.level_ticks = self.level_ticks.saturating_add(1);
        let crowded = quota <= 1.0 && t.counts.under as f64 > 2.0 * budget && t.counts.active >= AGG_MIN_SOURCES;
        let churn = t.counts.inserts as f64 / t.dt > t.capacity as f64 / CHURN_SECS;
        if (crowded || churn) && self.level + 1 < PLENS.len() && self.level_ticks >= AGG_TICKS {
            self.level += 1;
            self.level_ticks = 0;
            self.quota = None;
        }
    }
}

#[cfg(test)]
mod tests;
