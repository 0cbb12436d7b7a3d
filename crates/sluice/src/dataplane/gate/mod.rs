//! The gate in the kernel: load the XDP program, write the compiled tables and
//! per-CPU shares into its maps, attach it through a bpf_link, read its
//! counters, and run it on crafted packets with BPF_PROG_TEST_RUN.
use std::collections::HashSet;
use std::ffi::CStr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf_intf::{
    sluice_bucket, sluice_cell, sluice_class_state, sluice_fair, sluice_known, sluice_known_part, sluice_share,
    sluice_src, sluice_src_key, sluice_syn_guard, sluice_v4_key, sluice_v6_key, SLUICE_CELLS, SLUICE_CLASS_IDS,
    SLUICE_CS_NR, SLUICE_GEN_GROUP_SHIFT, SLUICE_GS_NR, SLUICE_SOURCES_DEFAULT,
};
use crate::dataplane::classify::Tables;
use crate::dataplane::share::shares_for;
use crate::gate_skel::{GateSkel, GateSkelBuilder};
use crate::policy::config::{Config, Limit, Verdict, XdpMode};

mod attach;
mod cookies;
pub mod counters;
mod ids;
pub mod maps;
mod sources;
mod wake;

pub use attach::{attached_prog_id, caps_sufficient, check_privileges, ifindex, prog_name, xdp_link_holding};
pub use cookies::{describe_syn_allow, syn_allow_all};
pub use ids::{ClassIds, IdIndex, NO_CLASS};
pub use maps::{bytes_of, dump_map, from_bytes, Owned, Pod};
pub use wake::Woken;

pub const XDP_DROP: u32 = libbpf_sys::XDP_DROP;
pub const XDP_PASS: u32 = libbpf_sys::XDP_PASS;
pub const XDP_REDIRECT: u32 = libbpf_sys::XDP_REDIRECT;

/// What can go wrong between sluice and the kernel, said so a user can act on it.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(
        "sluice needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (or CAP_SYS_ADMIN and CAP_NET_ADMIN) to load and attach XDP programs: run it as root"
    )]
    NotPermitted,
    #[error("no network interface named \"{0}\" (in this network namespace); list them with `ip link`")]
    NoInterface(String),
    #[error(
        "interface {iface} already has an XDP program attached: id {id} (\"{name}\"). Remove it with \
         `ip link set dev {iface} xdp off` (or `xdp-loader unload {iface} --all`), or pass --replace"
    )]
    AlreadyAttached { iface: String, id: u32, name: String },
    #[error(
        "interface {iface} already has an XDP program (id {id}) attached through a bpf_link, which only \
         its owner can remove: stop the process that holds it (another sluice run?)"
    )]
    HeldByLink { iface: String, id: u32 },
    #[error("the driver of {0} does not support native (driver-mode) XDP; pass --xdp-mode generic (slower: runs after the kernel allocated the packet)")]
    NativeUnsupported(String),
    #[error("loading the XDP gate into the kernel failed (the verifier log, if any, is printed above): {0}")]
    Load(#[source] libbpf_rs::Error),
    #[error("attaching the XDP gate to {iface} failed: {err}")]
    Attach { iface: String, err: std::io::Error },
    #[error(
        "attaching the egress learner (tcx, Linux 6.6 or later) to {iface} failed: {err}; the gate was not left attached"
    )]
    AttachLearner { iface: String, err: std::io::Error },
    #[error("attaching the SYN cookie checker (tcx ingress) to {iface} failed: {err}; the gate was not left attached")]
    AttachCookies { iface: String, err: std::io::Error },
    #[error("BPF map operation on `{map}` failed: {err}")]
    Map { map: &'static str, err: libbpf_rs::Error },
    #[error("{0}")]
    Tables(#[from] crate::dataplane::classify::TooManyPrefixes),
    #[error("{0}; the new config was not put in force: the previous one stays, untouched")]
    NotApplied(Box<GateError>),
    #[error("{0}; the new config is in force, but the gate's state of a class whose limit changed or that was removed may be stale until the next tick")]
    AfterSwitch(Box<GateError>),
}

type Result<T, E = GateError> = std::result::Result<T, E>;

pub use crate::bpf_intf::{ClassCounters, GlobalCounters};

/// What a class's buckets get in a tick (see `Gate::rebalance`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// The class bucket: the whole class, or its known sources with `fair`.
    pub limit: Limit,
    /// Source fairness, for a limited class.
    pub fair: Option<FairTier>,
    /// The egress learner records the class's clients.
    pub learn: bool,
    /// The gate clock's last window of answers the daemon did not confirm
    /// (`struct sluice_fair`'s taint_*_ms; 0, 0: none).
    pub taint: (u64, u64),
    /// The class arrived under its limit in the last tick: every CPU's
    /// bucket gets the whole rate (`share::shares_for`).
    pub under: bool,
}

impl Tiers {
    /// One bucket for the whole class, no fairness, no learning.
    pub fn plain(limit: Limit) -> Tiers {
        Tiers { limit, fair: None, learn: false, taint: (0, 0), under: false }
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
}

impl FairTier {
    /// The quota as the gate paces it: ns between one source's packets
    /// (an epoch is one tick; 0: unlimited, a source with nobody to share with).
    pub fn source_interval_ns(&self) -> u32 {
        if self.quota == u32::MAX {
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
    /// The gate clock: wall-clock ms ([`crate::base::clock::wall_ms`]), the learner's and
    /// the known map's time (see `struct sluice_known` in sluice.h).
    pub now_ms: u64,
    pub known_ttl_ms: u64,
}

/// Frames a cpumap entry queues for its kthread (the kernel's samples use 192-2048).
const CPUMAP_QSIZE: u32 = 2048;

/// Which program of the object to test-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prog {
    Gate,
    /// XDP_PASS and nothing else: the floor for benchmarks.
    Noop,
    /// The egress learner (a TC program; test-run on a frame as it leaves).
    Learn,
    /// The cookie checker (a TC program at ingress).
    CookieAck,
}

/// A loaded (and perhaps attached) gate.
pub struct Gate {
    skel: Owned<GateSkel<'static>>,
    ncpus: usize,
    link: Option<OwnedFd>,
    /// The egress learner's tcx link (attached with the gate).
    learn_link: Option<OwnedFd>,
    /// The SYN cookie checker's tcx ingress link (with the gate, where the kernel takes gate cookies).
    cookie_link: Option<OwnedFd>,
    /// Why the namespace's settings keep the gate from answering SYNs (`cookies.rs`).
    syn_why_not: Option<&'static str>,
    /// The gate's id of each class in force (`ids.rs`).
    ids: ClassIds,
    /// Ids the last apply freed, with their classes' names, until their
    /// known entries are taken (`take_freed_known`).
    freed: Vec<(u8, String)>,
    /// The tables generation in force (0 or 1; sluice.h, SLUICE_GENERATIONS).
    gen: u32,
    /// The trie keys written into each generation, to delete when that
    /// generation is written again.
    tries: [TrieKeys; 2],
    /// The config in force.
    applied: Option<Applied>,
}

/// The prefix-trie keys of one generation's tables, as bytes.
#[derive(Default)]
struct TrieKeys {
    v4: HashSet<Vec<u8>>,
    v6: HashSet<Vec<u8>>,
}

/// Delete a key; one that is not there (never inserted) is no error.
fn delete_present(map: &libbpf_rs::Map, key: &[u8]) -> Result<(), libbpf_rs::Error> {
    match map.delete(key) {
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// A config the gate runs.
struct Applied {
    cfg: Config,
}

/// `tables` as generation `gen` of the gate holds them: class ids for class
/// indexes, and the generation in each prefix group.
fn tables_for(tables: &Tables, ids: &ClassIds, gen: u32) -> Tables {
    let group = |g: u32| (u32::from_be(g) | gen << SLUICE_GEN_GROUP_SHIFT).to_be();
    Tables {
        cells: tables.cells.iter().map(|c| sluice_cell { class_id: ids.id(c.class_id as usize) as u8, ..*c }).collect(),
        v4: tables
            .v4
            .iter()
            .map(|(k, c)| (sluice_v4_key { group: group(k.group), ..*k }, ids.id(*c as usize)))
            .collect(),
        v6: tables
            .v6
            .iter()
            .map(|(k, c)| (sluice_v6_key { group: group(k.group), ..*k }, ids.id(*c as usize)))
            .collect(),
        groups: tables.groups,
    }
}

impl Gate {
    /// Open and load the BPF object (no attach), with the default size of
    /// the per-source map (SLUICE_SOURCES_DEFAULT entries).
    pub fn load() -> Result<Gate> {
        Gate::load_with(SLUICE_SOURCES_DEFAULT)
    }

    /// Load with room for `sources` unknown sources (the LRU "sources" map;
    /// its kernel memory is allocated at load: see `sources_memory`).
    pub fn load_with(sources: u32) -> Result<Gate> {
        let possible = libbpf_rs::num_possible_cpus().map_err(GateError::Load)?;
        let skel = Owned::new(|storage| {
            let mut open = GateSkelBuilder::default().open(storage)?;
            open.maps.sources.set_max_entries(sources.max(1))?;
            open.maps.cpus.set_max_entries(possible as u32)?;
            open.load()
        })
        .map_err(GateError::Load)?;
        let ncpus = libbpf_rs::num_possible_cpus().map_err(GateError::Load)?;
        Ok(Gate {
            skel,
            ncpus,
            link: None,
            learn_link: None,
            cookie_link: None,
            syn_why_not: None,
            ids: ClassIds::default(),
            freed: Vec::new(),
            gen: 0,
            tries: Default::default(),
            applied: None,
        })
    }

    pub fn ncpus(&self) -> usize {
        self.ncpus
    }

    /// Put a config in force: settings, tables, and each class's shares
    /// (even split until arrivals are known). Safe to call again on a
    /// running gate, and atomic for packets:
    ///
    /// - the new tables and settings are written into the generation not in
    ///   force, then one write of `tables_gen` switches to them: a packet is
    ///   classified by the old config or by the new one, never a mix;
    /// - a class keeps its gate id by name (`ids.rs`), so its counters,
    ///   bucket, fairness, SYN guard and known clients stay where they are,
    ///   wherever the class moves in the list; a new class takes a fresh id
    ///   (zeroed before the switch), a removed class's id is zeroed after it;
    /// - a failure before the switch (a map update refused, for example the
    ///   prefix tries full with both generations' entries) leaves the
    ///   previous config in force, untouched: `GateError::NotApplied`;
    /// - a class whose configured limit is unchanged keeps the limit in force
    ///   (an auto class's controller rate, a budget throttle) until the next
    ///   tick writes it again: a reload does not open it for a tick. A class
    ///   whose limit changed gets its new shares just after the switch (as
    ///   every tick writes them).
    pub fn apply(&mut self, cfg: &Config, tables: &Tables) -> Result<()> {
        let names: Vec<&str> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
        let (ids, freed) = self.ids.next(&names);
        let next = 1 - self.gen;
        let new_ids: Vec<usize> = (0..names.len()).filter(|&c| self.ids.class_of(ids.id(c) as u8).is_none()).collect();
        let written = (|| {
            for &class in &new_ids {
                self.reset_id(ids.id(class))?;
                self.set_percpu(
                    &self.skel.maps.shares,
                    "shares",
                    ids.id(class),
                    &self.fresh_shares(&cfg.classes[class].limit),
                )?;
            }
            self.write_generation(next, cfg, &ids, tables)
        })();
        if let Err(err) = written.and_then(|()| self.switch_to(next)) {
            return Err(GateError::NotApplied(Box::new(err)));
        }
        // In force from here on.
        let old = self.applied.replace(Applied { cfg: cfg.clone() });
        let before = std::mem::replace(&mut self.ids, ids);
        self.freed.extend(freed.iter().cloned());
        let mut after = Ok(());
        for (class, c) in cfg.classes.iter().enumerate() {
            let kept = before.class_of(self.ids.id(class) as u8);
            let limit_changed = match (&old, kept) {
                (Some(o), Some(at)) => o.cfg.classes[at].limit != c.limit,
                _ => false,
            };
            if limit_changed {
                after = after.and(self.set_shares(class, &self.fresh_shares(&c.limit)));
            }
        }
        for (id, _) in &freed {
            after = after.and(self.reset_id(u32::from(*id)));
        }
        after.map_err(|err| GateError::AfterSwitch(Box::new(err)))
    }

    /// Shares for a class whose arrivals are not known yet.
    fn fresh_shares(&self, limit: &Limit) -> Vec<sluice_share> {
        shares_for(limit, &vec![0; self.ncpus], false)
    }

    /// Zero everything the gate keeps for class id `id` (a new class's, or a freed one).
    fn reset_id(&self, id: u32) -> Result<()> {
        self.set_percpu(
            &self.skel.maps.class_state,
            "class_state",
            id,
            &vec![sluice_class_state::default(); self.ncpus],
        )?;
        self.set_percpu(&self.skel.maps.fairness, "fairness", id, &vec![sluice_fair::default(); self.ncpus])?;
        self.set_percpu(&self.skel.maps.shares, "shares", id, &vec![sluice_share::default(); self.ncpus])?;
        let key = id.to_ne_bytes();
        let map_err = |map| move |err| GateError::Map { map, err };
        self.skel.maps.away.update(&key, &0u32.to_ne_bytes(), MapFlags::ANY).map_err(map_err("away"))?;
        let part = sluice_known_part::default();
        self.skel.maps.known_part.update(&key, bytes_of(&part), MapFlags::ANY).map_err(map_err("known_part"))?;
        // syn_guard_any stays: a later check time than any guard's only has
        // the checker parse ACKs until then, and the next guard write sets it.
        let guard = sluice_syn_guard::default();
        self.skel.maps.syn_guard.update(&key, bytes_of(&guard), MapFlags::ANY).map_err(map_err("syn_guard"))
    }

    /// Write generation `gen` (not in force): `cfg`'s settings and `tables`
    /// with the class ids `ids`. Its trie keys from the last time it was
    /// written go first.
    fn write_generation(&mut self, gen: u32, cfg: &Config, ids: &ClassIds, tables: &Tables) -> Result<()> {
        let tables = tables_for(tables, ids, gen);
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        let v = &mut data.settings.verdicts[gen as usize];
        v.malformed_verdict = match cfg.malformed {
            Verdict::Drop => XDP_DROP,
            Verdict::Pass => XDP_PASS,
        };
        v.default_class = ids.id(cfg.default_class);
        v.observe = u32::from(cfg.observe);
        let map_err = |map| move |err| GateError::Map { map, err };
        let stale = std::mem::take(&mut self.tries[gen as usize]);
        for k in &stale.v4 {
            delete_present(&self.skel.maps.prefix_v4, k).map_err(map_err("prefix_v4"))?;
        }
        for k in &stale.v6 {
            delete_present(&self.skel.maps.prefix_v6, k).map_err(map_err("prefix_v6"))?;
        }
        // Recorded before the inserts, so a failure part-way leaves none unrecorded.
        let keys = &mut self.tries[gen as usize];
        keys.v4.extend(tables.v4.iter().map(|(k, _)| bytes_of(k).to_vec()));
        keys.v6.extend(tables.v6.iter().map(|(k, _)| bytes_of(k).to_vec()));
        for (k, class) in &tables.v4 {
            self.skel
                .maps
                .prefix_v4
                .update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("prefix_v4"))?;
        }
        for (k, class) in &tables.v6 {
            self.skel
                .maps
                .prefix_v6
                .update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("prefix_v6"))?;
        }
        self.write_cells(gen, &tables.cells)
    }

    /// Put generation `gen` in force: one write, which every program reads once a packet.
    fn switch_to(&mut self, gen: u32) -> Result<()> {
        self.skel
            .maps
            .tables_gen
            .update(&0u32.to_ne_bytes(), &gen.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "tables_gen", err })?;
        self.gen = gen;
        Ok(())
    }

    /// The tables generation in force (0 or 1).
    pub fn generation(&self) -> u32 {
        self.gen
    }

    /// The gate's ids of the classes in force (`ids.rs`).
    pub fn class_ids(&self) -> &ClassIds {
        &self.ids
    }

    fn write_cells(&self, gen: u32, cells: &[sluice_cell]) -> Result<()> {
        assert_eq!(cells.len(), SLUICE_CELLS as usize);
        let keys: Vec<u8> = (gen * SLUICE_CELLS..(gen + 1) * SLUICE_CELLS).flat_map(u32::to_ne_bytes).collect();
        let values: Vec<u8> = cells.iter().flat_map(|c| bytes_of(c).to_vec()).collect();
        self.skel
            .maps
            .cells
            .update_batch(&keys, &values, SLUICE_CELLS, MapFlags::ANY, MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "cells", err })
    }

    /// Set one class's per-CPU bucket parameters (one value per possible CPU).
    pub fn set_shares(&self, class: usize, shares: &[sluice_share]) -> Result<()> {
        self.set_percpu(&self.skel.maps.shares, "shares", self.ids.id(class), shares)
    }

    /// Re-split a class's limits over CPUs by the arrivals each CPU saw
    /// since the last call (`last_seen`: per-CPU seen packets, updated here):
    /// the class bucket's, and with source fairness the unknown tier's.
    /// The daemon calls this every tick; see the design comment in gate.bpf.c.
    pub fn rebalance(&self, class: usize, tiers: &Tiers, last_seen: &mut Vec<u64>) -> Result<()> {
        let seen: Vec<u64> = self
            .class_counters_percpu(class)?
            .iter()
            .map(|c| c[crate::bpf_intf::SLUICE_CS_SEEN_PKTS as usize])
            .collect();
        last_seen.resize(seen.len(), 0);
        let arrivals: Vec<u64> = seen.iter().zip(last_seen.iter()).map(|(n, o)| n.saturating_sub(*o)).collect();
        *last_seen = seen;
        let now = self.shares(class)?;
        let mut shares = shares_for(&tiers.limit, &arrivals, tiers.under);
        // The wake mark the daemon armed (`arm_wake`) stays: a class limited
        // now may go quiet, and only its mark wakes a calm daemon for it.
        for (new, old) in shares.iter_mut().zip(&now) {
            (new.wake_at, new.wake_gap_ns) = (old.wake_at, old.wake_gap_ns);
        }
        if now != shares {
            self.set_shares(class, &shares)?;
        }
        // Learning (and its taint) apply with fairness on or off.
        let base = sluice_fair {
            learn: tiers.learn as u8,
            taint_from_ms: tiers.taint.0,
            taint_to_ms: tiers.taint.1,
            ..Default::default()
        };
        let fair: Vec<sluice_fair> = match &tiers.fair {
            None => vec![base; self.ncpus],
            Some(f) => shares_for(&f.unknown, &arrivals, tiers.under)
                .into_iter()
                .map(|unknown| sluice_fair {
                    unknown,
                    on: 1,
                    quota: f.quota,
                    src_interval_ns: f.source_interval_ns(),
                    plen4: f.plens.0,
                    plen6: f.plens.1,
                    ..base
                })
                .collect(),
        };
        self.set_fairness(class, &fair)
    }

    /// Set one class's per-CPU source fairness (all zero: off).
    pub fn set_fairness(&self, class: usize, fair: &[sluice_fair]) -> Result<()> {
        self.set_percpu(&self.skel.maps.fairness, "fairness", self.ids.id(class), fair)
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
            .update(&self.ids.id(class).to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "away", err })
    }

    /// One class's per-CPU source fairness as the gate has it.
    pub fn fairness(&self, class: usize) -> Result<Vec<sluice_fair>> {
        self.percpu(&self.skel.maps.fairness, "fairness", self.ids.id(class))
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

    /// The maps the tracer shares (the class tables and the class counters),
    /// by name, as handles of their own.
    pub fn shared_maps(&self) -> Result<std::collections::BTreeMap<String, libbpf_rs::MapHandle>, GateError> {
        let m = &self.skel.maps;
        let mut out = std::collections::BTreeMap::new();
        for (name, map) in [
            ("cells", &m.cells),
            ("tables_gen", &m.tables_gen),
            ("prefix_v4", &m.prefix_v4),
            ("prefix_v6", &m.prefix_v6),
            ("class_state", &m.class_state),
        ] {
            let handle = libbpf_rs::MapHandle::try_from(map).map_err(|err| GateError::Map { map: name, err })?;
            out.insert(name.to_string(), handle);
        }
        Ok(out)
    }

    /// One class's per-CPU shares as the gate has them.
    pub fn shares(&self, class: usize) -> Result<Vec<sluice_share>> {
        self.percpu(&self.skel.maps.shares, "shares", self.ids.id(class))
    }

    /// One class's per-CPU bucket state.
    pub fn buckets(&self, class: usize) -> Result<Vec<sluice_bucket>> {
        let v: Vec<sluice_class_state> = self.percpu(&self.skel.maps.class_state, "class_state", self.ids.id(class))?;
        Ok(v.into_iter().map(|s| s.bucket).collect())
    }

    /// Write entry `id` of a per-CPU array: one value per possible CPU.
    fn set_percpu<T: Pod>(&self, map: &libbpf_rs::Map, name: &'static str, id: u32, per_cpu: &[T]) -> Result<()> {
        assert_eq!(per_cpu.len(), self.ncpus);
        maps::set_percpu(map, name, id, per_cpu)
    }

    fn percpu<T: Pod>(&self, map: &libbpf_rs::Map, name: &'static str, id: u32) -> Result<Vec<T>> {
        maps::percpu(map, name, id)
    }

    /// A class's counters on each CPU.
    pub fn class_counters_percpu(&self, class: usize) -> Result<Vec<ClassCounters>> {
        let v: Vec<sluice_class_state> = self.percpu(&self.skel.maps.class_state, "class_state", self.ids.id(class))?;
        Ok(v.into_iter().map(|s| s.cnt).collect())
    }

    /// A class's counters summed over CPUs.
    pub fn class_counters(&self, class: usize) -> Result<ClassCounters> {
        let mut sum = [0u64; SLUICE_CS_NR as usize];
        for c in self.class_counters_percpu(class)? {
            sum.iter_mut().zip(c).for_each(|(s, v)| *s += v);
        }
        Ok(sum)
    }

    /// Global counters summed over CPUs.
    pub fn global_counters(&self) -> Result<GlobalCounters> {
        let mut sum = [0u64; SLUICE_GS_NR as usize];
        for (i, s) in sum.iter_mut().enumerate() {
            *s = maps::percpu_sum(&self.skel.maps.global_stats, "global_stats", i as u32)?;
        }
        Ok(sum)
    }

    /// Zero every counter and bucket (tests and benchmarks).
    pub fn reset_counters(&self) -> Result<()> {
        let zero = |map: &libbpf_rs::Map, name: &'static str, n: u32| -> Result<()> {
            let size = map.value_size() as usize;
            for i in 0..n {
                map.update_percpu(&i.to_ne_bytes(), &vec![vec![0u8; size]; self.ncpus], MapFlags::ANY)
                    .map_err(|err| GateError::Map { map: name, err })?;
            }
            Ok(())
        };
        zero(&self.skel.maps.class_state, "class_state", SLUICE_CLASS_IDS)?;
        zero(&self.skel.maps.global_stats, "global_stats", SLUICE_GS_NR)
    }

    fn prog(&self, prog: Prog) -> &libbpf_rs::ProgramMut<'static> {
        match prog {
            Prog::Gate => &self.skel.progs.sluice_gate,
            Prog::Noop => &self.skel.progs.sluice_noop,
            Prog::Learn => &self.skel.progs.sluice_learn,
            Prog::CookieAck => &self.skel.progs.sluice_cookie_ack,
        }
    }

    /// Run a program on one packet `repeat` times in the kernel (BPF_PROG_TEST_RUN)
    /// on the calling thread's CPU. Returns the verdict and the mean time per run.
    pub fn test_run(&self, prog: Prog, packet: &[u8], repeat: u32) -> Result<(u32, Duration), libbpf_rs::Error> {
        let p = self.prog(prog);
        let input = libbpf_rs::ProgramInput { data_in: Some(packet), repeat, ..Default::default() };
        let out = p.test_run(input)?;
        Ok((out.return_value, out.duration))
    }

    /// Run a program once on a packet; its verdict and the packet as it left
    /// it (a rewritten frame: the gate's SYN-ACK).
    pub fn test_run_out(&self, prog: Prog, packet: &[u8]) -> Result<(u32, Vec<u8>), libbpf_rs::Error> {
        let p = self.prog(prog);
        let mut out = vec![0u8; packet.len() + 256];
        let input = libbpf_rs::ProgramInput { data_in: Some(packet), data_out: Some(&mut out), ..Default::default() };
        let res = p.test_run(input)?;
        let (verdict, len) = (res.return_value, res.data.map_or(0, |d| d.len()));
        out.truncate(len);
        Ok((verdict, out))
    }
}

/// Attach a TC program to an interface's tcx hook (`BPF_TCX_INGRESS` or
/// `BPF_TCX_EGRESS`) through a bpf_link: it goes when the link is dropped.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_parsing() {
        assert!(caps_sufficient("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!caps_sufficient("CapEff:\t0000000000000000\n"));
        // CAP_NET_ADMIN + CAP_BPF + CAP_PERFMON without CAP_SYS_ADMIN is enough (the unit's set)...
        let caps = |bits: &[u32]| format!("CapEff:\t{:016x}\n", bits.iter().map(|b| 1u64 << b).sum::<u64>());
        assert!(caps_sufficient(&caps(&[12, 38, 39])));
        assert!(caps_sufficient(&caps(&[12, 21])));
        // ...and none of them can be left out (without CAP_PERFMON the load fails with EPERM).
        assert!(!caps_sufficient(&caps(&[12, 39])));
        assert!(!caps_sufficient(&caps(&[38, 39])));
        assert!(!caps_sufficient(&caps(&[39])));
        assert!(!caps_sufficient("garbage"));
    }
}
