//! One budget for the whole receive path, shared by priority (pure logic,
//! no kernel: the daemon's tick feeds it, the unit tests feed it numbers).
//!
//! Why: every class's packets cross the same receive path (the driver, the
//! softirq, the CPU that runs the stack and the services). A flood in one
//! class, even to a port nobody listens on, spends that path's CPU and
//! starves the others (Performing Under Overload, ch. 3: a shared prefix forces its users to
//! share its limit). So the limit of each class depends on the health of the
//! classes above it, whatever hurts them.
//!
//! Others pay only for what they take. Each tick, each class with a
//! service says whether lower classes cause it distress:
//! - the receive work their admitted packets cost the CPUs its service
//!   runs on is over CPU_TAKEN of a CPU (`signals::rx_cpu`: the NET_RX
//!   softirq time of those CPUs, times the gate's interface's share of the
//!   packets their stack took in, times the lower classes' share of what
//!   the gate admitted);
//!
//! and the receive path as a whole is in distress when the per-CPU backlogs
//! dropped packets of the gate's interface (the daemon's tracer), which no
//! socket sees.
//!
//! A service's own socket drops, standing queue or listen drops are not
//! distress here: they say its own class is over-fed (its auto rate reads
//! them), not who fed it, and a local process can fill any socket without a
//! packet crossing the gate (loopback), where throttling the gate relieves
//! nothing. Only a daemon without its tracer, which measures no receive
//! work, falls back to them (said in its log at start).
//!
//! All of these are counters the kernel keeps anyway (the tracer's run on
//! freed skbs, at softirq entry and exit and at the stack's intake while
//! the CPU signal is armed), read with a few syscalls per tick.
//!
//! The rule, strict priority both ways:
//! - distress at priority p (path distress counts as distress of the highest
//!   priority present) throttles the classes of lower priority (larger
//!   number), lowest first: the lowest level that still admits more than
//!   FLOOR_PPS is cut to CUT of what it admitted, at most once every
//!   COOL_TICKS (the distress signals lag by a tick or two); the next level
//!   up is cut only when the lowest is at the floor;
//! - with no distress at or above it, the highest throttled level that is
//!   still limiting grows by GROW per tick up to CEILING of the rate it was
//!   cut at, stays there for HOLD_TICKS, then creeps up by GROW_NEAR per
//!   tick to look for more room (each distress costs the service a few ms of
//!   queueing, so the knee is probed seldom: every 10 s); a level is released (None)
//!   once its limit is over twice what it is offered and no distress was
//!   seen for RELEASE_TICKS.
//!
//! Classes at the highest distressed priority and above are never throttled
//! by the budget (an unlimited class of higher priority stays unlimited);
//! a class's own static rate stays a cap on top of this.
//!
//! In observe mode nothing is dropped, so the distress a cut would have
//! ended goes on. The budget then stops at its first step: once a level's
//! throttle would hold back traffic (offered over its limit), no higher
//! level is cut. Enforcing, that throttle would have changed the service's
//! health, and what the budget did next depends on a health observe cannot
//! see (docs/limits.md).

/// Receive work for lower classes over this share of a service's CPU is
/// its distress. From `sluice bench run --scenario http --keep-alive
/// --floods closed-v4 --flood-rate 1M` (nginx, `nic` model; docs/results/):
/// with no flood the lower classes' part sampled at 0.00% (at most; the
/// default class gets next to nothing); under the flood, without this
/// signal, zero config left nginx 57% of its requests/s (the flood's
/// softirq work on its CPU, queues empty). A tenth of a CPU is work the
/// service notices (its requests/s fall by about as much) and far above
/// what no flood shows. One value tried, not tuned.
pub const CPU_TAKEN: f64 = 0.10;

/// Packets/s a throttled class keeps at least (a stray ICMP, a new client).
pub const FLOOR_PPS: f64 = 100.0;
/// A cut leaves this share of what the class admitted in the tick.
pub const CUT: f64 = 0.5;
/// Ticks between two cuts: the signals lag by a tick or two.
pub const COOL_TICKS: u32 = 3;
/// Per-tick growth of a throttled level below CEILING of the rate it was
/// last cut at; ticks it then holds; per-tick growth after the hold. The
/// ceiling and the hold set how often the knee is touched again, and every
/// touch queues the higher service's requests behind the lower classes'
/// softirq work: measured with `sluice bench run --scenario dns --floods
/// closed-v4` (6 s x 2), zero-config p99 28 ms at 85% / 2 s, 0.64 ms at
/// 70% / 10 s, 0.43 ms at 60% / 10 s (0.30 ms at 50%, where a cut would no
/// longer grow back at all); the price is the lower classes' share of the
/// spare capacity (the simulation in tests.rs: 41%).
pub const GROW: f64 = 0.05;
pub const CEILING: f64 = 0.6;
pub const HOLD_TICKS: u32 = 1000;
pub const GROW_NEAR: f64 = 0.005;
/// Healthy ticks before a level whose limit is far above its traffic is released.
pub const RELEASE_TICKS: u32 = 200;

/// The distress the CPU signal gives, as the budget and status say it.
pub const CPU_REASON: &str = "receive work on its CPUs";

/// Why a class's service is in distress for the budget, from what was read
/// of it this tick: `taken`, the CPU signal (the share of its busiest CPU
/// that lower classes' receive work took, `signals::rx_cpu`), distress at
/// CPU_TAKEN or more; `own`, its own sockets' trouble (drops, a standing
/// queue: `policy::distress`); `traced`, whether the daemon's tracer
/// measures receive work at all. Others pay only for what they take: with
/// the tracer, its own sockets say nothing here (a local process fills any
/// socket over loopback, and the gate relieves none of it); without it,
/// they are all there is.
pub fn cause(taken: Option<f64>, own: Option<&'static str>, traced: bool) -> Option<&'static str> {
    let cpu = taken.filter(|&t| t >= CPU_TAKEN).map(|_| CPU_REASON);
    cpu.or(own.filter(|_| !traced))
}

/// One class as the budget sees it in a tick.
#[derive(Debug, Clone, Default)]
pub struct BudgetClass {
    /// 0 = highest.
    pub priority: u8,
    /// Packets/s offered at the gate and admitted by it in the tick.
    pub offered: f64,
    pub admitted: f64,
    /// Why its service is in distress this tick, if it is.
    pub distress: Option<&'static str>,
}

/// The budget's state between ticks.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Each class's throttle (packets/s); None = not throttled.
    pub limits: Vec<Option<f64>>,
    /// The rate a class admitted when it was last cut (the knee it grows back to).
    cut_at: Vec<f64>,
    /// Ticks a class still holds at its ceiling.
    hold: Vec<u32>,
    /// Ticks since the last cut, and since the last distress.
    since_cut: u32,
    pub healthy_ticks: u32,
    /// The highest distressed priority of the last tick, and what said so.
    pub distress: Option<(u8, &'static str)>,
    /// Observe mode: throttles are counted, not enforced (see the module comment).
    pub observe: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            limits: vec![],
            cut_at: vec![],
            hold: vec![],
            since_cut: u32::MAX,
            healthy_ticks: 0,
            distress: None,
            observe: false,
        }
    }
}

impl Budget {
    /// A budget with no throttle yet; `observe`: see the module comment.
    pub fn new(observe: bool) -> Budget {
        Budget { observe, ..Budget::default() }
    }

    /// One tick: update and return each class's throttle.
    pub fn step(&mut self, classes: &[BudgetClass], path_distress: bool) -> &[Option<f64>] {
        self.limits.resize(classes.len(), None);
        self.cut_at.resize(classes.len(), f64::INFINITY);
        self.hold.resize(classes.len(), 0);
        self.since_cut = self.since_cut.saturating_add(1);
        let mut worst = classes.iter().filter_map(|c| c.distress.map(|d| (c.priority, d))).min_by_key(|(p, _)| *p);
        if path_distress {
            let top = classes.iter().map(|c| c.priority).min().unwrap_or(0);
            worst = Some((top, "backlog drops")).filter(|_| worst.is_none_or(|(p, _)| top < p)).or(worst);
        }
        self.distress = worst;
        match worst {
            Some((p, _)) => {
                self.healthy_ticks = 0;
                if self.since_cut >= COOL_TICKS {
                    self.cut_below(classes, p);
                }
            }
            None => {
                self.healthy_ticks = self.healthy_ticks.saturating_add(1);
                self.grow(classes);
            }
        }
        &self.limits
    }

    /// Cut the lowest level below priority `p` that admits more than the
    /// floor (observing: not above a level whose throttle would hold back traffic).
    fn cut_below(&mut self, classes: &[BudgetClass], p: u8) {
        let level = classes.iter().filter(|c| c.priority > p && c.admitted > FLOOR_PPS).map(|c| c.priority).max();
        let Some(level) = level else { return };
        let holds_back = |(i, c): (usize, &BudgetClass)| self.limits[i].is_some_and(|l| c.offered > l);
        if self.observe && classes.iter().enumerate().filter(|(_, c)| c.priority > level).any(holds_back) {
            return;
        }
        for (i, c) in classes.iter().enumerate().filter(|(_, c)| c.priority == level) {
            self.cut_at[i] = c.admitted;
            self.hold[i] = HOLD_TICKS;
            self.limits[i] = Some((c.admitted * CUT).max(FLOOR_PPS));
        }
        self.since_cut = 0;
    }

    /// Grow the highest throttled level that is still limiting; release
    /// levels whose limits are far above their traffic.
    fn grow(&mut self, classes: &[BudgetClass]) {
        let limiting = |i: usize| self.limits[i].is_some_and(|l| classes[i].offered > l);
        let level = (0..classes.len()).filter(|&i| limiting(i)).map(|i| classes[i].priority).min();
        for (i, c) in classes.iter().enumerate() {
            let Some(l) = self.limits[i] else { continue };
            if Some(c.priority) == level {
                let ceiling = CEILING * self.cut_at[i];
                self.limits[i] = Some(if l < ceiling {
                    (l * (1.0 + GROW)).min(ceiling)
                } else if self.hold[i] > 0 {
                    self.hold[i] -= 1;
                    l
                } else {
                    l * (1.0 + GROW_NEAR)
                });
            } else if self.healthy_ticks >= RELEASE_TICKS && l > 2.0 * c.offered {
                self.limits[i] = None;
                self.cut_at[i] = f64::INFINITY;
            }
        }
    }

    /// Carry the throttles over to a new class list.
    pub fn remap(&mut self, remap: &crate::policy::remap::ClassRemap) {
        self.limits = remap.carry(std::mem::take(&mut self.limits));
        self.cut_at = remap.carry_or(&self.cut_at, || f64::INFINITY);
        self.hold = remap.carry(std::mem::take(&mut self.hold));
    }
}

#[cfg(test)]
mod tests;
