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
    sluice_src, sluice_src_key, SLUICE_CELLS, SLUICE_CS_NR, SLUICE_GS_NR, SLUICE_MAX_CLASSES, SLUICE_SOURCES_DEFAULT,
};
use crate::dataplane::classify::Tables;
use crate::dataplane::share::shares_for;
use crate::gate_skel::{GateSkel, GateSkelBuilder};
use crate::policy::config::{Config, Limit, Verdict, XdpMode};
use crate::policy::remap::ClassRemap;

mod attach;
mod cookies;
pub mod counters;
pub mod maps;
mod sources;
mod wake;

pub use attach::{attached_prog_id, caps_sufficient, check_privileges, ifindex, prog_name, xdp_link_holding};
pub use cookies::{describe_syn_allow, syn_allow_all};
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
    #[error("{0}; the previous config was put back and stays in force")]
    RolledBack(Box<GateError>),
    #[error("{first}; putting the previous config back failed too ({again}): the gate's tables may be a mix of both, restart sluice")]
    RollbackFailed { first: Box<GateError>, again: Box<GateError> },
}

type Result<T, E = GateError> = std::result::Result<T, E>;

/// Per-class counters summed over CPUs, indexed by `enum sluice_class_stat`.
pub type ClassCounters = [u64; SLUICE_CS_NR as usize];
/// Global counters summed over CPUs, indexed by `enum sluice_global_stat`.
pub type GlobalCounters = [u64; SLUICE_GS_NR as usize];

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
    /// The gate clock: wall-clock ms ([`Clock::wall_ms`]), the learner's and
    /// the known map's time (see `struct sluice_known` in sluice.h).
    pub now_ms: u64,
    pub known_ttl_ms: u64,
}

impl Clock {
    /// CLOCK_MONOTONIC (the clock bpf_ktime_get_ns() reads), ns.
    pub fn now_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid out pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Wall-clock time (CLOCK_REALTIME), ms since the Unix epoch: the gate
    /// clock. Before 1970 (a clock not set at all) reads as 1 ms, never 0,
    /// which the gate takes as "not set yet".
    pub fn wall_ms() -> u64 {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.map_or(1, |d| d.as_millis() as u64).max(1)
    }
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
    /// Keys written into the tries, to delete the stale ones on reload.
    tries: TrieKeys,
    /// The config in force, to carry class state by name and to roll back to.
    applied: Option<Applied>,
}

/// The prefix-trie keys of a config, as bytes.
#[derive(Default)]
struct TrieKeys {
    v4: HashSet<Vec<u8>>,
    v6: HashSet<Vec<u8>>,
}

impl TrieKeys {
    fn of(tables: &Tables) -> TrieKeys {
        TrieKeys {
            v4: tables.v4.iter().map(|(k, _)| bytes_of(k).to_vec()).collect(),
            v6: tables.v6.iter().map(|(k, _)| bytes_of(k).to_vec()).collect(),
        }
    }
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
    tables: Tables,
    names: Vec<String>,
}

impl Applied {
    fn of(cfg: &Config, tables: &Tables) -> Applied {
        let names = cfg.classes.iter().map(|c| c.name.clone()).collect();
        Applied { cfg: cfg.clone(), tables: tables.clone(), names }
    }
}

/// For each class of `new` (by id): the shares in force for the class of
/// the same name and the same configured limit in `old` (`shares`, by old
/// id), to keep across an apply; None where the class or its limit is new.
fn kept_shares(old: &Config, new: &Config, shares: &[Option<Vec<sluice_share>>]) -> Vec<Option<Vec<sluice_share>>> {
    let remap = ClassRemap::of(old, new);
    (0..new.classes.len())
        .map(|id| {
            let at = remap.old_of(id).filter(|&i| old.classes[i].limit == new.classes[id].limit)?;
            shares.get(at).cloned().flatten()
        })
        .collect()
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
            tries: TrieKeys::default(),
            applied: None,
        })
    }

    pub fn ncpus(&self) -> usize {
        self.ncpus
    }

    /// Write a config: settings, tables, and each class's shares (even split
    /// until arrivals are known). Safe to call again on a running gate:
    ///
    /// - a class keeps its counters and bucket by name, wherever it moves in
    ///   the new list; a new class starts from zero, a removed one is zeroed;
    /// - a failure part-way (a map update refused, for example the prefix
    ///   tries full while the old and new entries both live in them) puts the
    ///   previous config back, so the gate runs either the old config or the
    ///   new one, never a mix. The error says which;
    /// - a class whose configured limit is unchanged keeps the limit in force
    ///   (an auto class's controller rate, a budget throttle) until the next
    ///   tick writes it again: a reload does not open it for a tick.
    pub fn apply(&mut self, cfg: &Config, tables: &Tables) -> Result<()> {
        // The class state is read (to move it, or to put it back) only when classes move.
        let moves = self
            .applied
            .as_ref()
            .filter(|p| !p.names.iter().map(String::as_str).eq(cfg.classes.iter().map(|c| c.name.as_str())));
        let saved_state = moves.map(|p| self.class_states(p.names.len())).transpose()?;
        let old_shares = match &self.applied {
            Some(p) => (0..p.names.len()).map(|id| self.shares(id).map(Some)).collect::<Result<Vec<_>>>()?,
            None => vec![],
        };
        let kept = self.applied.as_ref().map_or_else(Vec::new, |p| kept_shares(&p.cfg, cfg, &old_shares));
        let previous = self.applied.take();
        let result = self.write_config(cfg, tables, &kept).and_then(|()| match (&previous, &saved_state) {
            (Some(p), Some(saved)) => self.carry_states(&p.names, saved, cfg),
            _ => Ok(()),
        });
        match result {
            Ok(()) => {
                self.applied = Some(Applied::of(cfg, tables));
                Ok(())
            }
            Err(err) => {
                let Some(p) = previous else { return Err(err) };
                let restored = self
                    .write_config(&p.cfg, &p.tables, &old_shares)
                    .and_then(|()| saved_state.as_deref().map_or(Ok(()), |saved| self.write_class_states(saved)));
                self.applied = Some(p);
                match restored {
                    Ok(()) => Err(GateError::RolledBack(Box::new(err))),
                    Err(again) => Err(GateError::RollbackFailed { first: Box::new(err), again: Box::new(again) }),
                }
            }
        }
    }

    /// Settings, shares, tries and cells of a config (not the class state).
    fn write_config(&mut self, cfg: &Config, tables: &Tables, kept: &[Option<Vec<sluice_share>>]) -> Result<()> {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.malformed_verdict = match cfg.malformed {
            Verdict::Drop => XDP_DROP,
            Verdict::Pass => XDP_PASS,
        };
        data.settings.default_class = cfg.default_class as u32;
        data.settings.observe = u32::from(cfg.observe);
        for (id, class) in cfg.classes.iter().enumerate() {
            match kept.get(id).and_then(Option::as_ref) {
                Some(shares) => self.set_shares(id, shares)?,
                None => self.set_shares(id, &shares_for(&class.limit, &vec![0; self.ncpus], false))?,
            }
        }
        // Tries first (new groups become reachable only when cells point at them), then cells,
        // then remove trie keys the new tables no longer have. From the first insert on,
        // `self.tries` holds every key that may be in the tries (old and new), so a
        // rollback after a failure part-way removes the new ones again.
        let new = TrieKeys::of(tables);
        self.tries.v4.extend(new.v4.iter().cloned());
        self.tries.v6.extend(new.v6.iter().cloned());
        let map_err = |map| move |err| GateError::Map { map, err };
        for (k, class) in tables.v4.iter().map(|(k, c)| (bytes_of(k), c)) {
            self.skel.maps.prefix_v4.update(k, &class.to_ne_bytes(), MapFlags::ANY).map_err(map_err("prefix_v4"))?;
        }
        for (k, class) in tables.v6.iter().map(|(k, c)| (bytes_of(k), c)) {
            self.skel.maps.prefix_v6.update(k, &class.to_ne_bytes(), MapFlags::ANY).map_err(map_err("prefix_v6"))?;
        }
        self.write_cells(&tables.cells)?;
        for k in self.tries.v4.difference(&new.v4) {
            delete_present(&self.skel.maps.prefix_v4, k).map_err(map_err("prefix_v4"))?;
        }
        for k in self.tries.v6.difference(&new.v6) {
            delete_present(&self.skel.maps.prefix_v6, k).map_err(map_err("prefix_v6"))?;
        }
        self.tries = new;
        Ok(())
    }

    /// The per-CPU class state (bucket and counters) of classes 0..n.
    fn class_states(&self, n: usize) -> Result<Vec<Vec<sluice_class_state>>> {
        (0..n).map(|id| self.percpu(&self.skel.maps.class_state, "class_state", id)).collect()
    }

    /// Write per-CPU class states back, class i from `states[i]`.
    fn write_class_states(&self, states: &[Vec<sluice_class_state>]) -> Result<()> {
        for (id, per_cpu) in states.iter().enumerate() {
            self.set_percpu(&self.skel.maps.class_state, "class_state", id, per_cpu)?;
        }
        Ok(())
    }

    /// Move each class's state to its index in `cfg` by name; new classes and
    /// indexes no class uses any more start from zero. `apply` calls it only
    /// when the names changed, so a reload that keeps the classes touches no
    /// counter. (When classes move, packets counted between `apply`'s read and
    /// this write are lost: microseconds.)
    fn carry_states(&self, old_names: &[String], saved: &[Vec<sluice_class_state>], cfg: &Config) -> Result<()> {
        let new_names: Vec<&str> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
        let zero = vec![sluice_class_state::default(); self.ncpus];
        let mut moved = ClassRemap::between(old_names, &new_names).carry_or(saved, || zero.clone());
        // Indexes no class uses any more are zeroed too.
        moved.resize(old_names.len().max(new_names.len()), zero);
        self.write_class_states(&moved)
    }

    fn write_cells(&self, cells: &[sluice_cell]) -> Result<()> {
        assert_eq!(cells.len(), SLUICE_CELLS as usize);
        let keys: Vec<u8> = (0..SLUICE_CELLS).flat_map(u32::to_ne_bytes).collect();
        let values: Vec<u8> = cells.iter().flat_map(|c| bytes_of(c).to_vec()).collect();
        self.skel
            .maps
            .cells
            .update_batch(&keys, &values, SLUICE_CELLS, MapFlags::ANY, MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "cells", err })
    }

    /// Set one class's per-CPU bucket parameters (one value per possible CPU).
    pub fn set_shares(&self, class: usize, shares: &[sluice_share]) -> Result<()> {
        self.set_percpu(&self.skel.maps.shares, "shares", class, shares)
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
        self.set_percpu(&self.skel.maps.fairness, "fairness", class, fair)
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
            .update(&(class as u32).to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "away", err })
    }

    /// One class's per-CPU source fairness as the gate has it.
    pub fn fairness(&self, class: usize) -> Result<Vec<sluice_fair>> {
        self.percpu(&self.skel.maps.fairness, "fairness", class)
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
        self.percpu(&self.skel.maps.shares, "shares", class)
    }

    /// One class's per-CPU bucket state.
    pub fn buckets(&self, class: usize) -> Result<Vec<sluice_bucket>> {
        let v: Vec<sluice_class_state> = self.percpu(&self.skel.maps.class_state, "class_state", class)?;
        Ok(v.into_iter().map(|s| s.bucket).collect())
    }

    /// Write entry `idx` of a per-CPU array: one value per possible CPU.
    fn set_percpu<T: Pod>(&self, map: &libbpf_rs::Map, name: &'static str, idx: usize, per_cpu: &[T]) -> Result<()> {
        assert_eq!(per_cpu.len(), self.ncpus);
        maps::set_percpu(map, name, idx as u32, per_cpu)
    }

    fn percpu<T: Pod>(&self, map: &libbpf_rs::Map, name: &'static str, idx: usize) -> Result<Vec<T>> {
        maps::percpu(map, name, idx as u32)
    }

    /// A class's counters on each CPU.
    pub fn class_counters_percpu(&self, class: usize) -> Result<Vec<ClassCounters>> {
        let v: Vec<sluice_class_state> = self.percpu(&self.skel.maps.class_state, "class_state", class)?;
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
        zero(&self.skel.maps.class_state, "class_state", SLUICE_MAX_CLASSES)?;
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
