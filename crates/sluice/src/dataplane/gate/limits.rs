//! Each class's limits as the gate holds them: its per-CPU shares of the
//! rate (rebalanced every tick by the arrivals each CPU saw), its source
//! fairness, where its admitted packets go (CPU protection), and the
//! run-time clock of source fairness.
use super::*;
use crate::policy::fair::Room;

/// What a class's buckets get in a tick (see `Gate::rebalance`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// The class bucket: the whole class, or its known sources with `fair`.
    pub limit: Limit,
    /// Source fairness, for a limited class.
    pub fair: Option<FairTier>,
    /// The egress learner records the class's clients, since this gate
    /// clock ms (`struct sluice_fair`'s learn_from_ms); None: it does not.
    pub learn: Option<u64>,
    /// Room in the class's UDP sockets for its known clients: kept, armed
    /// or off (`struct sluice_fair`'s room and surge_pkts: see bpf/gate/room.h).
    pub room: Room,
    /// The gate clock's last window of answers the daemon did not confirm
    /// (`struct sluice_fair`'s taint_*_ms; 0, 0: none).
    pub taint: (u64, u64),
    /// The class arrived under its limit in the last tick: every CPU's
    /// bucket gets the whole rate (`share::shares_for`).
    pub under: bool,
    /// Time every request the gate admits, not one in SLUICE_DELAY_EVERY
    /// (`struct sluice_fair`'s delay_every): the class's answers are slow
    /// (`policy::late`), and its judge wants its known clients' windows soon.
    pub time_all: bool,
}

impl Tiers {
    /// One bucket for the whole class, no fairness, no learning.
    pub fn plain(limit: Limit) -> Tiers {
        Tiers { limit, fair: None, learn: None, room: Room::Off, taint: (0, 0), under: false, time_all: false }
    }
}

/// The unknown sources' tier of a limited class.
#[derive(Debug, Clone, PartialEq)]
pub struct FairTier {
    pub unknown: Limit,
    /// Packets per unknown source and epoch.
    pub quota: u32,
    /// Prefix lengths unknown sources are counted at (IPv4, IPv6).
    pub plens: (u8, u8),
    /// The unknown tier counts TCP data in work (`FairOut::by_work`).
    pub by_work: bool,
}

impl FairTier {
    /// The quota as the gate paces it: ns between one source's packets
    /// (an epoch is one tick; 0: unlimited, a source with nobody to share with).
    pub fn source_interval_ns(&self) -> u32 {
        if self.quota == crate::policy::fair::UNPACED {
            return 0;
        }
        let tick = crate::policy::controller::TICK.as_nanos() as u64;
        (tick / self.quota.max(1) as u64).clamp(1, u32::MAX as u64) as u32
    }
}

/// The run-time settings of source fairness (see `Gate::set_clock`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    pub epoch: u32,
    /// The gate clock: ms since the Unix epoch ([`crate::base::clock::gate_ms`]), the learner's and
    /// the known map's time (see `struct sluice_known` in sluice.h).
    pub now_ms: u64,
    pub known_ttl_ms: u64,
}

impl Gate {
    /// Set one class's per-CPU bucket parameters (one value per possible
    /// CPU; the entries that changed are written).
    pub fn set_shares(&self, class: usize, shares: &[sluice_share]) -> Result<()> {
        self.states.set_shares(self.ids.id(class).key(), shares);
        Ok(())
    }

    /// Re-split a class's limits over CPUs by the arrivals each CPU saw
    /// since the last call (`last`: the per-CPU counters then, updated
    /// here): the class bucket by all of the class's arrivals, or with
    /// source fairness the known tier by the known sources' and the unknown
    /// tier by the unknown sources' (`CpuArrivals`). The daemon calls this
    /// every tick (`rebalance_from`); see the design comment in gate.bpf.c.
    /// Returns the entries of "shares" and "fairness" written: those whose
    /// values changed.
    pub fn rebalance(&self, class: usize, tiers: &Tiers, last: &mut SplitCounts) -> Result<usize> {
        self.rebalance_from(class, tiers, &self.class_counters_percpu(class)?, last)
    }

    /// `rebalance` from the class's per-CPU counters as the caller read them
    /// (the daemon's tick reads every class's in one batch: a second read
    /// per limited class would copy each possible CPU's counters again).
    pub fn rebalance_from(
        &self,
        class: usize,
        tiers: &Tiers,
        counters: &[ClassCounters],
        last: &mut SplitCounts,
    ) -> Result<usize> {
        let arrivals = CpuArrivals::since(last, counters);
        let now = self.shares(class)?;
        let mut shares = match tiers.fair {
            Some(_) => known_shares(&tiers.limit, arrivals.known_tier(), tiers.under),
            None => shares_for(&tiers.limit, &arrivals.seen, tiers.under),
        };
        // The wake mark the daemon armed (`arm_wake`) stays: a class limited
        // now may go quiet, and only its mark wakes a calm daemon for it.
        for (new, old) in shares.iter_mut().zip(&now) {
            (new.wake_at, new.wake_gap_ns) = (old.wake_at, old.wake_gap_ns);
            (new.slow_wake_us, new.slow_answers) = (old.slow_wake_us, old.slow_answers);
        }
        let id = self.ids.id(class).key();
        let written = self.states.set_shares(id, &shares);
        // Learning (and its taint) and the room rule apply with fairness on or off.
        let base = sluice_fair {
            learn: tiers.learn.is_some() as u8,
            learn_from_ms: tiers.learn.unwrap_or(0),
            room: (tiers.room == Room::Kept) as u8,
            surge_pkts: match tiers.room {
                Room::Armed { surge_pkts } => surge_pkts,
                Room::Kept | Room::Off => 0,
            },
            taint_from_ms: tiers.taint.0,
            taint_to_ms: tiers.taint.1,
            delay_every: u32::from(tiers.time_all),
            ..Default::default()
        };
        let fair: Vec<sluice_fair> = match &tiers.fair {
            None => vec![base; self.ncpus],
            Some(f) => unknown_shares(&f.unknown, arrivals.unknown_tier(), tiers.under)
                .into_iter()
                .map(|unknown| sluice_fair {
                    unknown,
                    on: 1,
                    quota: f.quota,
                    src_interval_ns: f.source_interval_ns(),
                    plen4: f.plens.0,
                    plen6: f.plens.1,
                    by_work: u32::from(f.by_work),
                    ..base
                })
                .collect(),
        };
        Ok(written + self.states.set_fairness(id, &fair))
    }

    /// Set one class's per-CPU source fairness (all zero: off).
    pub fn set_fairness(&self, class: usize, fair: &[sluice_fair]) -> Result<()> {
        self.states.set_fairness(self.ids.id(class).key(), fair);
        Ok(())
    }

    /// Send a class's admitted packets to CPU `to`'s cpumap kthread (None:
    /// pass them where they arrive). The CPU's cpumap entry is made on first use.
    pub fn set_away(&self, class: usize, to: Option<u32>) -> Result<()> {
        let err = |err| GateError::Map { map: "cpus", err };
        if let Some(cpu) = to {
            let key = cpu.to_ne_bytes();
            if self.skel.maps.cpus.lookup(&key, MapFlags::ANY).map_err(err)?.is_none() {
                let val = libbpf_rs::libbpf_sys::bpf_cpumap_val { qsize: CPUMAP_QSIZE, ..Default::default() };
                // SAFETY: bpf_cpumap_val is a plain C struct; its bytes are its value.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        (&val as *const libbpf_sys::bpf_cpumap_val).cast::<u8>(),
                        size_of_val(&val),
                    )
                };
                self.skel.maps.cpus.update(&key, bytes, MapFlags::ANY).map_err(err)?;
            }
        }
        let v = to.map_or(0, |c| c + 1);
        self.skel
            .maps
            .away
            .update(&self.ids.id(class).key().to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "away", err })
    }

    /// One class's per-CPU source fairness as the gate has it.
    pub fn fairness(&self, class: usize) -> Result<Vec<sluice_fair>> {
        Ok(self.states.fairness(self.ids.id(class).key()))
    }

    /// The run-time clock of source fairness, written every tick: the epoch
    /// (source counts are per epoch), the gate clock, how long a known
    /// source stays known.
    pub fn set_clock(&mut self, clock: &Clock) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.epoch = clock.epoch;
        data.settings.now_ms = clock.now_ms;
        data.settings.known_ttl_ms = clock.known_ttl_ms;
    }

    /// The daemon's deadline, written every tick: past `now_ns` (CLOCK_MONOTONIC)
    /// plus ALIVE_NS without a new one, the gate fails open (gate.bpf.c,
    /// daemon_stalled). A gate never kept alive has no deadline.
    pub fn keep_alive(&mut self, now_ns: u64) {
        self.set_alive_until(now_ns + crate::dataplane::ALIVE_NS);
    }

    /// The deadline itself (tests set one in the past).
    pub fn set_alive_until(&mut self, until_ns: u64) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.alive_until_ns = until_ns;
    }

    /// One class's per-CPU shares as the gate has them.
    pub fn shares(&self, class: usize) -> Result<Vec<sluice_share>> {
        Ok(self.states.shares(self.ids.id(class).key()))
    }

    /// One class's per-CPU bucket state.
    pub fn buckets(&self, class: usize) -> Result<Vec<sluice_bucket>> {
        Ok(self.states.entries(self.ids.id(class).key()).into_iter().map(|s| s.bucket).collect())
    }
}
