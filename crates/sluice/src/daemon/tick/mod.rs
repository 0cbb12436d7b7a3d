//! The control tick that `sluice run` runs every 10 ms, and the bench runs in
//! its control thread, so every bench figure measures the loop users run:
//!
//! 1. read the services' health once (`health`);
//! 2. run the auto controller on it (`auto`): a rate for each auto class
//!    with UDP sockets;
//! 3. run the budget on it (`budget`): a throttle for the classes below a
//!    service whose CPUs their admitted packets take (its own queues only
//!    where no tracer measures that);
//! 4. write each class's limit, the tightest of its own (static rate or
//!    auto rate) and the budget's throttle, split over CPUs by the arrivals
//!    each CPU saw (see the design comment in gate.bpf.c); a limited class
//!    is split again between its known and unknown sources, with a quota per
//!    unknown source (`fair`);
//! 5. tell the gate the epoch and the time (source quotas count per tick).
//!
//! In observe mode the gate drops nothing, so a service hurt by a flood in
//! a lower class stays hurt where enforcing would have throttled that
//! class. While some lower class has a budget throttle, a class's own auto
//! rate is therefore not written (its would-drops would be the flood's
//! doing, not its clients'), and its controller holds its estimate (the
//! service's health then is not what it would be enforcing).
use std::fmt::Display;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::bpf_intf::*;
use crate::daemon::auto::AutoLoop;
use crate::daemon::decisions::{Cause, Change};
use crate::dataplane::gate::counters::ClassTotals;
use crate::dataplane::gate::{ClassCounters, Clock, CounterReads, Gate};
use crate::dataplane::trace::CpuRxReader;
use crate::policy::budget::{Budget, BudgetClass};
use crate::policy::config::{Config, Limit};
use crate::policy::distress::{judge, path_lost, Judgement};
use crate::policy::remap::ClassRemap;
use crate::policy::syn_guard::SynGuards;
use crate::signals::health::{Health, HealthReader, RxWork};
use crate::signals::rx_cpu::{RxCpu, ARM_PPS};
use crate::signals::service_cpus::{Busy, ServiceLoad};
use crate::signals::syn_peers::{direct_bits, SynPeers};

/// Observing, a class stays held (`Ticker::observe_held`: its own auto
/// rate unwritten, its estimate kept) for this long after the last tick in
/// which a lower class had a budget throttle. Enforcing, that throttle would
/// have held the flood off for as long as it lasted; observing, the flood
/// still reaches the stack, and the CPU signal's distress (and with it the
/// throttle) comes and goes: a fresh-clone CI run of
/// `discover observe_mode_predicts_what_enforcing_drops` showed the
/// service's class dropping 83.3% where enforcing dropped 0.0%, the
/// budget's distress last seen 0.86 s before the end, the class's own
/// controller engaged on a capacity estimate the unthrottled flood had cut.
const OBSERVE_HOLD: Duration = Duration::from_secs(2);

/// An auto class offered over this many times its capacity estimate is
/// flooded itself: it is limited even while lower classes get traffic (see
/// [`OwnRate::passes`]; at 20 times its capacity, passing it whole every
/// other tick delivered 0 in those ticks).
const OWN_FLOOD: f64 = 1.5;

/// A known source stays known this long after its last answer (7 days).
pub const KNOWN_TTL_SECS: u64 = 7 * 24 * 3600;

pub use crate::policy::controller::STALE_TICKS;

mod class;
mod readout;
mod watch;

pub use readout::FairStatus;

use class::{rate_limit, tightest, OwnRate, TickClass, HAD_ROOM};
pub use watch::SignalWatch;
/// What runs every tick for one config.
pub struct Ticker {
    classes: Vec<TickClass>,
    health: Option<HealthReader>,
    last: Option<(std::time::Instant, Health)>,
    /// The controller of the `rate = "auto"` classes with UDP sockets, if any.
    pub auto: Option<AutoLoop>,
    pub budget: Budget,
    /// When the gate answers each TCP class's SYNs itself.
    pub syn: SynGuards,
    /// What lets it answer them without its socket lookup (None: every
    /// answered SYN is looked up; set by the daemon, which shares its
    /// listeners' reading).
    pub syn_peers: Option<SynPeers>,
    /// Whether the services' signals could be read lately.
    pub signals: SignalWatch,
    /// Ticks run (the gate's epoch), and the gate clock this tick wrote.
    epoch: u32,
    now_ms: u64,
    /// The classes (by id) whose limit the last tick changed, and why (for the log).
    pub changes: Vec<(usize, Change)>,
    /// The tracer's receive work per CPU (None: no tracer, so no backlog
    /// drops and no CPU signal; said in the log where the tracer failed).
    rx: Option<CpuRxReader>,
    /// The CPU signal, and by class index the CPUs its service runs on (set
    /// at each of the daemon's looks, every 250 ms while it ticks fast and
    /// every 10 s while calm; empty: none known), how busy they were and how
    /// much of that was the service's (`ServiceLoad::busy`).
    pub rx_cpu: RxCpu,
    service_cpus: Vec<Vec<usize>>,
    service_busy: Vec<Option<Busy>>,
    /// The budget's last distress (priority, why) and when it was seen, for
    /// status: a signal that fires for a few ticks and is answered by a cut
    /// is gone by the time someone looks.
    last_distress: Option<((u8, &'static str), std::time::Instant)>,
    /// The CPU signal's measurement is wanted (`RxCpu::arm`).
    rx_cpu_wanted: bool,
    /// Observe mode: the gate counts its verdicts and drops nothing.
    observe: bool,
    /// May a calm tick with no UDP arrival carry the last UDP read
    /// (`HealthReader::read`)? Always, but in `sluice bench tick`'s loaded tick.
    carry_udp: bool,
    /// Every class's per-CPU counters, read each tick where they changed
    /// (none this tick until `control` reads them): the totals, and the
    /// splits (`Gate::rebalance_from`).
    counters: CounterReads,
}

impl Ticker {
    /// The tick for `cfg`, reading the services in namespace `ns` (None: the
    /// current one). `require_sockets`: see [`AutoLoop::new`].
    pub fn new(cfg: &Config, ns: Option<&str>, require_sockets: bool) -> Result<Ticker> {
        let auto = AutoLoop::new(cfg, ns, require_sockets)?;
        let classes = cfg
            .classes
            .iter()
            .enumerate()
            .map(|(id, c)| {
                let learns = id != cfg.default_class;
                let tcp_auto =
                    matches!(c.limit, Limit::Auto(_)) && c.udp_ports().is_empty() && !c.tcp_ports().is_empty();
                TickClass::new(c.priority, c.limit, learns, learns && tcp_auto)
            })
            .collect();
        let health = Some(HealthReader::new(cfg, ns)?);
        Ok(Ticker {
            classes,
            health,
            auto,
            budget: Budget::new(cfg.observe),
            syn: SynGuards::new(cfg),
            observe: cfg.observe,
            ..Ticker::idle()
        })
    }

    /// No class's learner records a client for `secs` seconds, then only
    /// after a calm second (`Fair::hold_learning`: a restart).
    pub fn hold_learning(&mut self, secs: f64) {
        for c in &mut self.classes {
            c.fair.hold_learning(secs);
        }
    }

    /// A ticker with nothing to do (no config in place yet).
    pub fn idle() -> Ticker {
        Ticker {
            classes: vec![],
            health: None,
            last: None,
            auto: None,
            budget: Budget::default(),
            syn: SynGuards::default(),
            syn_peers: None,
            signals: SignalWatch::default(),
            epoch: 0,
            now_ms: 0,
            changes: vec![],
            rx: None,
            rx_cpu: RxCpu::default(),
            service_cpus: vec![],
            service_busy: vec![],
            last_distress: None,
            rx_cpu_wanted: false,
            observe: false,
            carry_udp: true,
            counters: CounterReads::default(),
        }
    }

    /// Read every signal at every tick, as a tick does while packets
    /// arrive: `sluice bench tick` times that tick beside the calm one.
    pub fn read_every_tick(&mut self) {
        self.carry_udp = false;
    }

    /// Every class's counters summed over CPUs, by class index, read now
    /// where they changed since the last read (the statistics' read between
    /// ticks: `CounterReads::read_between`).
    pub fn counter_totals(&mut self, gate: &Gate) -> Vec<ClassCounters> {
        self.counters.read_between(gate, self.classes.len());
        self.counters.totals()
    }

    /// Read the receive path's work from the tracer's `cpu_rx` (kept across
    /// a config switch by `carry_from`).
    pub fn read_rx_from(&mut self, reader: CpuRxReader) {
        self.rx = Some(reader);
    }

    /// Do the classes below some running service admit over ARM_PPS?
    fn lower_busy(&self) -> bool {
        let running = |id: usize| self.service_cpus.get(id).is_some_and(|c| !c.is_empty());
        (0..self.classes.len()).filter(|&id| running(id)).any(|id| {
            let p = self.classes[id].priority;
            self.classes.iter().filter(|c| c.priority > p).map(|c| c.admitted).sum::<f64>() > ARM_PPS
        })
    }

    /// Should the tracer measure the receive work per CPU now (its softirq
    /// pair attached: see `Tracer::set_softirq`)?
    pub fn wants_rx_cpu(&self) -> bool {
        self.rx_cpu_wanted
    }

    /// Does the tick read the receive work per CPU (a tracer)?
    pub fn reads_rx(&self) -> bool {
        self.rx.is_some()
    }

    /// By class index, where each class's service ran at the last look and
    /// how busy it was (`signals::service_cpus`): for the CPU signal, and
    /// for the late-answers rule (`late::LateTick::busy`).
    pub fn set_service_loads(&mut self, loads: Vec<ServiceLoad>) {
        self.service_busy = loads.iter().map(|l| l.busy).collect();
        self.service_cpus = loads.into_iter().map(|l| l.cpus).collect();
    }

    /// Take over what `old` learnt (the controller, the budget's throttles,
    /// the per-CPU arrivals), matching classes by name (`remap`): a class list that
    /// changes (discovery, a reload) does not restart the control.
    pub fn carry_from(&mut self, mut old: Ticker, remap: &ClassRemap) {
        // The reader mirrors the gate's syn_peers, which a switch keeps.
        self.syn_peers = old.syn_peers.take();
        for (id, c) in self.classes.iter_mut().enumerate() {
            if let Some(o) = remap.old_of(id).and_then(|i| old.classes.get(i)) {
                c.split = o.split.clone();
                c.fair = o.fair.clone();
                c.decided = o.decided;
                c.distress_ticks = o.distress_ticks;
                c.dropped_with_room = o.dropped_with_room;
                c.observe_held_at = o.observe_held_at;
                if let (Some(_), Some(l)) = (&c.late, &o.late) {
                    (c.late, c.late_out) = (Some(l.clone()), o.late_out);
                }
            }
        }
        self.epoch = old.epoch;
        // The counters are kept by gate id, which a class keeps across the
        // switch (and a new class's id is reset, marked for a read of all).
        self.counters = old.counters;
        self.rx = old.rx;
        self.last_distress = old.last_distress;
        self.syn.carry_from(&old.syn, remap);
        self.budget = old.budget;
        self.budget.observe = self.observe;
        self.budget.remap(remap);
        if let (Some(new), Some(old)) = (&mut self.auto, old.auto) {
            new.carry_from(old, remap);
        }
    }

    /// One tick. A limit that cannot be written is an error (the gate's maps
    /// refuse writes: nothing later will work either). Signals that cannot
    /// be read are not: the gate keeps the last limits, and `log` hears of
    /// it at the 1st, 2nd, 4th, 8th... failure.
    pub fn tick(&mut self, gate: &mut Gate, log: impl Fn(&dyn Display)) -> Result<()> {
        self.epoch = self.epoch.wrapping_add(1);
        self.changes.clear();
        self.counters.stale();
        self.now_ms = crate::base::clock::gate_ms();
        gate.set_clock(&Clock { epoch: self.epoch, now_ms: self.now_ms, known_ttl_ms: KNOWN_TTL_SECS * 1000 });
        let throttles = match self.control(gate) {
            Ok(t) => {
                if let Some(n) = self.signals.ok() {
                    log(&format_args!("reading signals works again, after {n} failed ticks"));
                }
                t
            }
            Err(e) => {
                let (stale, say) = self.signals.failed(&e);
                if say {
                    log(&format_args!(
                        "reading signals failed for {:.1} s ({} failed ticks in all): {e:#}{}",
                        self.signals.stale_secs().unwrap_or(0.0),
                        self.signals.errors,
                        if stale { "; throttles released and auto classes unlimited until it works again" } else { "" }
                    ));
                }
                if stale {
                    // The SYN guards fail open too: an answering guard whose
                    // step no longer runs would keep answering after its
                    // checker's window, and RST every new connection.
                    if gate.answers_syns() {
                        for (id, guard) in self.syn.release(crate::base::clock::gate_ms()) {
                            gate.set_syn_guard(id, &guard)?;
                        }
                    }
                    vec![]
                } else {
                    self.budget.limits.clone()
                }
            }
        };
        // Limits from signals that could not be read for STALE_TICKS are not
        // kept: the gate fails open (do no harm) and status says why.
        let stale = self.signals.stale();
        let auto: Vec<(usize, Option<f64>, u64)> =
            self.auto.iter().filter(|_| !stale).flat_map(|a| a.rates()).collect();
        let floors: Vec<(usize, f64)> = self.auto.iter().flat_map(|a| a.floors()).collect();
        let now = Instant::now();
        self.note_observe_held(&throttles, now);
        let held = self.observe_held(&throttles, now);
        // (priority, admitted) of every class, to see who is below whom.
        let admitted: Vec<(u8, f64)> = self.classes.iter().map(|c| (c.priority, c.admitted)).collect();
        for (id, c) in self.classes.iter_mut().enumerate() {
            let lower = admitted.iter().filter(|&&(p, _)| p > c.priority).map(|&(_, a)| a).fold(0.0, f64::max);
            let own_flood =
                self.auto.as_ref().and_then(|a| a.capacity_of(id)).is_some_and(|cap| c.offered > OWN_FLOOD * cap);
            let seen = OwnRate { offered: c.offered, lower_admitted: lower, own_flood, observe_held: held[id] };
            let pass = |r: &Option<f64>| r.is_some_and(|r| seen.passes(r));
            let by_auto = auto.iter().find(|(i, _, _)| *i == id);
            let own = by_auto.map_or(c.limit, |(_, r, depth)| rate_limit(r.filter(|_| !pass(r)), *depth));
            // A TCP class whose answers are late (`late`).
            let own = if c.late_out.rate.is_some() { rate_limit(c.late_out.rate, 0) } else { own };
            // An auto class's minimum share of its capacity is kept under any throttle.
            let floor = floors.iter().find(|(i, _)| *i == id).map_or(0.0, |f| f.1);
            let limit = tightest(own, throttles.get(id).copied().flatten().map(|t| t.max(floor)));
            let cause = match () {
                _ if limit != tightest(own, None) => Cause::Budget(self.budget.distress),
                _ if by_auto.is_some() => Cause::Auto,
                _ if c.late.is_some() => Cause::Late,
                _ => Cause::Config,
            };
            if let Some(from) = c.decided.replace(limit).filter(|&l| l != limit) {
                self.changes.push((id, Change { from, to: limit, cause }));
            }
            let tiers = c.tiers(limit, gate.sources_capacity(), self.now_ms);
            // An unlimited or blocked class needs writing only when its tiers
            // (its limit, its learning) change.
            let fixed = matches!(limit, Limit::Unlimited | Limit::Blocked | Limit::Auto(_));
            if !fixed || c.tiers.as_ref() != Some(&tiers) {
                match self.counters.per_cpu(id) {
                    Some(counters) => gate.rebalance_from(id, &tiers, counters, &mut c.split)?,
                    None => gate.rebalance(id, &tiers, &mut c.split)?,
                };
                c.tiers = Some(tiers);
            }
        }
        Ok(())
    }

    /// By class index: observing, does some class of lower priority have a
    /// budget throttle (`throttles`), or had one within OBSERVE_HOLD of
    /// `now` (`note_observe_held`)? Enforcing, that throttle would have
    /// acted first (see the module comment). All false when enforcing.
    fn observe_held(&self, throttles: &[Option<f64>], now: Instant) -> Vec<bool> {
        let lately = |c: &TickClass| c.observe_held_at.is_some_and(|t| now.saturating_duration_since(t) < OBSERVE_HOLD);
        let below = self.throttled_below(throttles);
        self.classes.iter().zip(below).map(|(c, b)| self.observe && (b || lately(c))).collect()
    }

    /// Observing, note the classes a lower class's throttle holds at `now`.
    fn note_observe_held(&mut self, throttles: &[Option<f64>], now: Instant) {
        if !self.observe {
            return;
        }
        let below = self.throttled_below(throttles);
        for (c, b) in self.classes.iter_mut().zip(below) {
            if b {
                c.observe_held_at = Some(now);
            }
        }
    }

    /// By class index: does some class of lower priority have a throttle in `throttles`?
    fn throttled_below(&self, throttles: &[Option<f64>]) -> Vec<bool> {
        let below = |p: u8| self.classes.iter().zip(throttles).any(|(c, t)| c.priority > p && t.is_some());
        self.classes.iter().map(|c| below(c.priority)).collect()
    }

    /// Read the health, run the auto controller and the budget; the budget's throttles.
    fn control(&mut self, gate: &Gate) -> Result<Vec<Option<f64>>> {
        // One read of each class's counters serves the auto loop, the budget and fairness
        // (a ticker with no health reader has no class: nothing is read).
        self.counters.read(gate, self.classes.len());
        let raw: Vec<ClassCounters> = self.counters.totals();
        let totals: Vec<ClassTotals> = raw.iter().map(|&r| ClassTotals::from(r)).collect();
        let udp_quiet = self.carry_udp && self.calm() && self.no_udp_arrivals(&totals);
        let Some(reader) = &mut self.health else { return Ok(vec![]) };
        let mut now = (std::time::Instant::now(), reader.read(udp_quiet)?);
        now.1.rx = self.rx.as_ref().map(|r| r.read()).transpose()?.map(|cpus| rx_work(&cpus));
        let held = self.observe_held(&self.budget.limits, now.0);
        if let Some(a) = &mut self.auto {
            a.tick(&totals, &now.1, &held)?;
        }
        let admitted_so_far: Vec<u64> = totals.iter().map(|t| t.admitted_pkts).collect();
        let priorities: Vec<u8> = self.classes.iter().map(|c| c.priority).collect();
        self.rx_cpu.step(now.0, now.1.rx.as_ref(), &admitted_so_far, &priorities, &self.service_cpus);
        let mut demand = Vec::with_capacity(self.classes.len());
        let dt = self.last.as_ref().map_or(1.0, |(at, _)| now.0.duration_since(*at).as_secs_f64().max(1e-4));
        let judgements: Vec<Judgement> = (0..self.classes.len()).map(|id| self.judge(&now.1, id)).collect();
        for ((id, c), &t) in self.classes.iter_mut().enumerate().zip(&totals) {
            let rate = |f: fn(&ClassTotals) -> u64| c.totals.map_or(0.0, |o| f(&t).saturating_sub(f(&o)) as f64 / dt);
            c.offered = rate(|t| t.seen_pkts);
            c.admitted = rate(|t| t.admitted_pkts);
            // (The first tick has no rates: no time for the learner's calm.)
            c.dt = if c.totals.is_some() { dt } else { 0.0 };
            // Its own sockets' trouble says its own class is over-fed (the
            // auto controller reads it), not who fed it: a local process
            // can fill them without a packet crossing the gate. Others pay
            // only for what they take: the receive work their admitted
            // packets cost its CPUs. With no tracer nothing measures that,
            // and its queues are all there is (the log says so at start).
            let judged = judgements[id];
            let own = judged.distress;
            let why = crate::policy::budget::cause(self.rx_cpu.taken_of(id), own, now.1.rx.is_some());
            c.distress = own.is_some() || why.is_some();
            // The gate's room drops (bpf/gate/room.h) are the socket's
            // overflow made before it: the tiers take them as its drops.
            let room = c.totals.is_some_and(|o| t.dropped_room_pkts > o.dropped_room_pkts);
            c.queue = now.1.classes.get(id).and_then(|h| h.udp.fullest_share());
            c.behind = judged.behind || (room && judged.queue_stands);
            c.dropped = judged.dropped || room;
            c.load = self.service_busy.get(id).copied().flatten();
            c.judge_answers(&t, dt);
            c.distress_ticks += u64::from(c.distress);
            // Dropped with room: a service with sockets and no distress, under no cap
            // but sluice's own (no static rate, no budget throttle for a higher class).
            let own_limit_only = matches!(c.limit, Limit::Auto(_) | Limit::Unlimited)
                && self.budget.limits.get(id).copied().flatten().is_none();
            // An auto class's controller admits what its service takes: its
            // drops are sluice's doing only while it admits well under that.
            let estimate = self.auto.as_ref().and_then(|a| a.capacity_of(id));
            let under = estimate.is_none_or(|cap| c.admitted < HAD_ROOM * cap);
            let room = now.1.classes.get(id).is_some_and(|h| h.udp.sockets > 0) && !c.distress && under;
            if let Some(o) = c.totals {
                c.dropped_with_room.tick(room && own_limit_only, t.dropped_pkts().saturating_sub(o.dropped_pkts()), dt);
            }
            demand.push(BudgetClass { priority: c.priority, offered: c.offered, admitted: c.admitted, distress: why });
            c.totals = Some(t);
            c.counts_from(raw[id]);
        }
        self.guard_syns(gate, &raw, &judgements, dt)?;
        let path = self.last.as_ref().is_some_and(|(_, prev)| path_lost(prev.backlog_drops(), now.1.backlog_drops()));
        let limits =
            if self.last.is_some() { self.budget.step(&demand, path).to_vec() } else { self.budget.limits.clone() };
        if let Some(d) = self.budget.distress {
            self.last_distress = Some((d, now.0));
        }
        let throttled = self.budget.limits.iter().any(Option::is_some);
        // Stray ACKs and RSTs are weighed by what they cost: measured too.
        self.rx_cpu_wanted = self.rx_cpu.arm(now.0, throttled || self.lower_busy() || self.syn.strays_seen());
        self.last = Some(now);
        Ok(limits)
    }

    /// What class `id`'s sockets say between the last tick's reading and
    /// `now` (nothing on the first tick, or for a class not read in both).
    fn judge(&self, now: &Health, id: usize) -> Judgement {
        let prev = self.last.as_ref().and_then(|(_, prev)| prev.classes.get(id));
        prev.zip(now.classes.get(id)).map(|(p, n)| judge(&p.reading(), &n.reading())).unwrap_or_default()
    }

    /// Did no packet of a class with UDP ports reach the gate since the last
    /// tick (`totals`: this tick's counters)? The first tick has no last.
    fn no_udp_arrivals(&self, totals: &[ClassTotals]) -> bool {
        let Some(reader) = &self.health else { return false };
        reader.udp_classes().all(|id| {
            let (Some(c), Some(t)) = (self.classes.get(id), totals.get(id)) else { return false };
            c.totals.is_some_and(|o| o.seen_pkts == t.seen_pkts)
        })
    }

    /// Step each class's SYN guard and write the changed ones to the gate
    /// (none where the gate cannot answer SYNs: an older kernel).
    fn guard_syns(&mut self, gate: &Gate, raw: &[ClassCounters], judged: &[Judgement], dt: f64) -> Result<()> {
        if !gate.answers_syns() {
            return Ok(());
        }
        let pressure: Vec<bool> = judged.iter().map(|j| j.syn_pressure).collect();
        let rx: Vec<(Option<f64>, f64)> = (0..self.classes.len())
            .map(|id| {
                let share = self.rx_cpu.busiest.get(id).copied().flatten();
                (share, self.rx_cpu.admitted_pps.get(id).copied().unwrap_or(0.0))
            })
            .collect();
        self.syn.tick(raw, &pressure, &rx, dt);
        let direct = self.direct_syns(gate);
        for (id, guard) in self.syn.writes(crate::base::clock::gate_ms()) {
            gate.set_syn_guard(id, &guard)?;
        }
        direct
    }

    /// Tell the gate which answered SYNs may skip its socket lookup
    /// (bpf/sluice.h, struct sluice_syn_guard): when a class's guard starts
    /// answering, the client addresses of the sockets on its ports (one
    /// dump, into syn_peers; the gate marks later ones itself), then, in
    /// the guards written after this, each answering class's direct
    /// families, from the listeners read once a second. When no guard
    /// answers, syn_peers is cleared. What cannot be read leaves every SYN
    /// to the lookup.
    fn direct_syns(&mut self, gate: &Gate) -> Result<()> {
        let Some(peers) = &mut self.syn_peers else { return Ok(()) };
        if !self.syn.any_answering() {
            if peers.release() {
                gate.clear_syn_peers()?;
            }
            return Ok(());
        }
        let fresh = self.syn.unseeded_ports();
        if !fresh.is_empty() {
            let seeded = peers
                .holding(&fresh)
                .context("reading the sockets on the ports of a class whose SYN guard starts answering")
                .and_then(|holding| Ok(gate.set_syn_peer_words(&peers.add(&holding))?));
            if let Err(e) = seeded {
                self.syn.set_direct(|_| 0);
                return Err(e);
            }
            self.syn.seeded();
        }
        match peers.listeners(!fresh.is_empty()) {
            Ok(None) => {}
            Ok(Some(r)) => self.syn.set_direct(|ports| direct_bits(ports, &r.listeners, r.mptcp.as_ref())),
            Err(e) => {
                self.syn.set_direct(|_| 0);
                return Err(e.context("reading the listeners of the answering classes"));
            }
        }
        Ok(())
    }

    /// Does nothing need the 10 ms tick? No class limited by a rate while
    /// packets arrive, no throttle, no distress or queue behind, no SYN guard
    /// answering, signals read fine, no auto class near its capacity. The
    /// daemon then ticks slowly, and the gate wakes it when arrivals jump.
    pub fn calm(&self) -> bool {
        let quiet = |c: &TickClass| {
            let limited = matches!(c.decided, Some(Limit::Rate { .. })) && c.offered > 0.0;
            // Slow (or late) answers: the next windows come at the fast
            // tick (a calm tick's window is 500 ms of answers, and the late
            // run is two: under `conns-calm-v4` the first slow window came
            // half a second before the first late one, a calm tick apart).
            !c.distress && !c.behind && !limited && !c.answers_slow()
        };
        self.signals.failing == 0
            && self.budget.distress.is_none()
            && self.budget.limits.iter().all(Option::is_none)
            && self.classes.iter().all(quiet)
            && !self.syn.any_answering()
            && self.auto.as_ref().is_none_or(AutoLoop::calm)
    }
}

/// The tracer's per-CPU counts as the health's receive work.
fn rx_work(cpus: &[sluice_cpu_rx]) -> RxWork {
    RxWork {
        softirq_ns: cpus.iter().map(|c| c.rx_ns).collect(),
        backlog_drops: cpus.iter().map(|c| c.backlog_drops).sum(),
        stack_pkts: cpus.iter().map(|c| c.stack_pkts).collect(),
        iface_pkts: cpus.iter().map(|c| c.iface_pkts).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::default_burst;
    use class::{OwnRate, WithRoom};

    /// Hardening: fairness reads the tick's counts as rates over the tick's
    /// measured length. A tick out of a 500 ms calm spell that counted 300
    /// known packets sized the known tier at 600/s (times its headroom),
    /// where the constant 10 ms made 30,000/s of them, a bucket 50 times too
    /// deep that took seconds to decay.
    #[test]
    fn the_known_tier_is_sized_over_the_measured_tick() {
        use crate::policy::fair::KNOWN_HEADROOM;
        let limit = Limit::Rate { pps: 100_000, burst: 1_000 };
        let mut c = TickClass::new(1, limit, true, false);
        c.dt = 0.5;
        c.counts.known = 300;
        let t = c.tiers(limit, 1 << 18, 1_000_000);
        let Limit::Rate { pps, .. } = t.limit else { panic!("a rate: {:?}", t.limit) };
        assert_eq!(pps as f64, 600.0 * KNOWN_HEADROOM, "{:?}", t.limit);
    }

    /// Drops with room count from a stretch of ROOM_SECS on, all of its
    /// drops; a shorter stretch (a new limit's first ticks) counts nothing.
    #[test]
    fn drops_with_room_count_by_lasting_stretches() {
        let mut w = WithRoom::default();
        for _ in 0..3 {
            w.tick(true, 3_500, 0.01);
        }
        w.tick(false, 3_500, 0.01);
        assert_eq!(w.total, 0, "three ticks of a limit just written");
        for _ in 0..50 {
            w.tick(true, 100, 0.01);
        }
        assert_eq!(w.total, 5_000, "a half-second stretch counts whole");
        w.tick(true, 7, 0.01);
        assert_eq!(w.total, 5_007, "and each tick of it after");
    }

    #[test]
    fn unreadable_signals_go_stale_after_a_second_and_say_so_sparingly() {
        let mut w = SignalWatch::default();
        let e = "sock_diag: no such file";
        assert_eq!(w.failed(&e), (false, true), "the first failure is said");
        let mut said = 0;
        for _ in 2..super::STALE_TICKS {
            let (stale, say) = w.failed(&e);
            assert!(!stale);
            said += usize::from(say);
        }
        assert_eq!(said, 0, "not again until it goes stale");
        assert_eq!(w.failed(&e), (true, true), "stale at STALE_TICKS, said");
        assert!((w.stale_secs().unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(w.ok(), Some(super::STALE_TICKS), "recovery reports the run");
        assert!(!w.stale() && w.stale_secs().is_none());
        assert_eq!(w.errors, super::STALE_TICKS, "failures in all are kept");
        assert_eq!(w.ok(), None);
    }

    /// Hardening (issue 35, item 15): observing, a service whose lower
    /// classes would be throttled is not shown dropping its own clients,
    /// even once those classes admit no more than the budget's floor (in a
    /// namespace run the flood's class was held to 100/s, its service still
    /// starved by the unenforced flood, and its controller's rate showed
    /// 35% of its clients as would-drops; enforcing dropped none). A class
    /// flooded itself is still limited.
    #[test]
    fn observing_a_class_whose_lower_classes_would_be_throttled_admits_its_clients() {
        let at_floor = OwnRate { offered: 30_000.0, lower_admitted: 100.0, own_flood: false, observe_held: false };
        assert!(!at_floor.passes(20_000.0), "enforcing, lower classes at the floor: the rate is written");
        assert!(at_floor.passes(80_000.0), "far above what arrives: not written");
        let observed = OwnRate { observe_held: true, ..at_floor };
        assert!(observed.passes(20_000.0), "observing with a lower throttle: not written");
        assert!(!OwnRate { own_flood: true, ..observed }.passes(20_000.0), "flooded itself: written");
        let busy = OwnRate { lower_admitted: 5_000.0, ..at_floor };
        assert!(busy.passes(20_000.0) && !OwnRate { own_flood: true, ..busy }.passes(20_000.0));
    }

    /// Observing, a class whose lower class had a budget throttle stays
    /// held for OBSERVE_HOLD after the throttle's last tick: the distress
    /// that set it comes and goes while the unthrottled flood goes on.
    /// Enforcing, nothing is held.
    #[test]
    fn observing_a_class_stays_held_through_a_lull_of_the_lower_throttle() {
        let mut t = Ticker::idle();
        t.classes = vec![
            TickClass::new(0, Limit::Auto(Default::default()), true, false),
            TickClass::new(20, Limit::Unlimited, false, false),
        ];
        let t0 = Instant::now();
        let (on, off) = ([None, Some(100.0)], [None, None]);
        t.note_observe_held(&on, t0);
        assert_eq!(t.observe_held(&on, t0), vec![false, false], "enforcing: never held");
        t.observe = true;
        t.note_observe_held(&on, t0);
        assert_eq!(t.observe_held(&on, t0), vec![true, false], "a lower class throttled");
        let lull = t0 + OBSERVE_HOLD / 2;
        t.note_observe_held(&off, lull);
        assert_eq!(t.observe_held(&off, lull), vec![true, false], "the throttle gone a moment: still held");
        let later = t0 + OBSERVE_HOLD + Duration::from_millis(10);
        assert_eq!(t.observe_held(&off, later), vec![false, false], "gone for OBSERVE_HOLD: let go");
    }

    /// A TCP auto class whose answers turn slow (`late::SLOW_FACTOR`)
    /// learns nobody (and taints what it learnt in the last
    /// `late::LATE_TAINT_MS`), has the gate time every request and brings the fast
    /// tick; in time again, it learns at once (its calm second was not
    /// restarted) and the daemon may tick slowly.
    #[test]
    fn slow_answers_pause_learning_time_every_request_and_bring_the_fast_tick() {
        let mut t = Ticker::idle();
        t.classes = vec![TickClass::new(20, Limit::Auto(Default::default()), true, true)];
        let c = &mut t.classes[0];
        let mut totals = crate::dataplane::gate::counters::ClassTotals::default();
        c.totals = Some(totals);
        let mut now_ms = 1_000_000;
        // One tick of 10 ms whose answers are a window at bucket `b`.
        let mut tick = |c: &mut TickClass, b: usize| {
            totals.answer_delays.samples += crate::policy::late::WINDOW_ANSWERS;
            totals.answer_delays.buckets[b] += crate::policy::late::WINDOW_ANSWERS;
            (c.offered, c.admitted, c.dt) = (1_000.0, 1_000.0, 0.01);
            c.judge_answers(&totals, 0.01);
            c.totals = Some(totals);
            now_ms += 10;
            c.tiers(Limit::Unlimited, 1 << 18, now_ms)
        };
        // Two calm seconds at about 1 ms (bucket 5).
        let mut tiers = None;
        for _ in 0..200 {
            tiers = Some(tick(c, 5));
        }
        let calm = tiers.unwrap();
        assert!(calm.learn.is_some() && !calm.time_all, "{calm:?}");
        assert!(t.calm(), "in time: the slow tick");
        // 4.2 ms: slow, not late.
        let c = &mut t.classes[0];
        let slow = tick(c, 7);
        assert!(slow.learn.is_none() && slow.time_all, "{slow:?}");
        // What the learner noted from LATE_TAINT_MS before its last
        // learning tick (the 200th, at 1,002,000 ms) is not known: the slow
        // window took answers to fill.
        let last_learnt = 1_000_000 + 200 * 10;
        assert_eq!(slow.taint, (last_learnt - crate::policy::late::LATE_TAINT_MS, last_learnt + 10), "{slow:?}");
        assert_eq!(c.late_out, crate::policy::late::LateOut::default(), "not late, not limited");
        assert!(!t.calm(), "slow: the fast tick");
        // In time again: learning at once, one request in SLUICE_DELAY_EVERY timed.
        let c = &mut t.classes[0];
        let back = tick(c, 5);
        assert!(back.learn.is_some() && !back.time_all, "{back:?}");
        assert!(t.calm());
    }

    /// A TCP auto class limited for its late answers learns nobody until it
    /// lets go, though its answers are in time again and nothing of it is
    /// dropped: the flood it holds back is answered meanwhile. Let go, it
    /// learns again after its calm second.
    #[test]
    fn a_class_engaged_by_late_answers_learns_nobody_until_it_lets_go() {
        use crate::policy::late::{RELEASE_SECS, WINDOW_ANSWERS};
        let mut c = TickClass::new(20, Limit::Auto(Default::default()), true, true);
        let mut totals = crate::dataplane::gate::counters::ClassTotals::default();
        c.totals = Some(totals);
        let mut now_ms = 1_000_000;
        // One tick of 10 ms whose answers (all of them a known client's)
        // are a window at bucket `b`, every packet sampled and known.
        let mut tick = |c: &mut TickClass, b: usize| {
            for d in [&mut totals.answer_delays, &mut totals.answer_delays_known] {
                d.samples += WINDOW_ANSWERS;
                d.buckets[b] += WINDOW_ANSWERS;
            }
            (c.offered, c.admitted, c.dt) = (1_000.0, 1_000.0, 0.01);
            c.counts = crate::policy::fair::FairCounts { sampled: 10, sampled_known: 10, ..Default::default() };
            c.judge_answers(&totals, 0.01);
            c.totals = Some(totals);
            now_ms += 10;
            c.tiers(Limit::Unlimited, 1 << 18, now_ms)
        };
        for _ in 0..200 {
            tick(&mut c, 5);
        }
        assert!(tick(&mut c, 5).learn.is_some(), "calm: learning");
        // 67 ms (bucket 12) twice: engaged.
        tick(&mut c, 12);
        tick(&mut c, 12);
        assert!(c.late_out.rate.is_some(), "engaged: {:?}", c.late_out);
        // In time again, nothing dropped: still engaged, and learning nobody.
        let in_time = ((RELEASE_SECS - 0.5) / 0.01) as usize;
        for i in 0..in_time {
            let t = tick(&mut c, 5);
            assert!(t.learn.is_none(), "tick {i} of {in_time} in time while engaged: {t:?}");
        }
        assert!(c.late_out.rate.is_some(), "not let go yet");
        // Let go, then a calm second: learning again.
        let mut learnt = false;
        for _ in 0..200 {
            learnt |= tick(&mut c, 5).learn.is_some();
        }
        assert!(c.late_out.rate.is_none() && learnt, "let go and learning: {:?}", c.late_out);
    }

    #[test]
    fn a_static_rate_stays_a_cap_and_blocked_stays_blocked() {
        let r = |pps| Limit::Rate { pps, burst: default_burst(pps) };
        assert_eq!(tightest(r(1000), Some(5000.0)), r(1000));
        assert_eq!(tightest(r(10_000), Some(5000.0)), r(5000));
        assert_eq!(tightest(Limit::Unlimited, Some(5000.0)), r(5000));
        assert_eq!(tightest(Limit::Unlimited, None), Limit::Unlimited);
        assert_eq!(tightest(Limit::Blocked, Some(5000.0)), Limit::Blocked);
        assert_eq!(tightest(Limit::Auto(Default::default()), None), Limit::Unlimited);
    }
}
