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
use crate::dataplane::share::{known_shares, shares_for, unknown_shares, CpuArrivals, SplitCounts};
use crate::gate_skel::{GateSkel, GateSkelBuilder};
use crate::policy::config::{Config, Limit, Verdict, XdpMode};

mod apply;
mod attach;
pub mod class_state;
mod cookies;
pub mod counters;
mod host;
mod ids;
mod limits;
pub mod maps;
mod source_maps;
pub mod verifier;
mod wake;

use apply::{Applied, TrieKeys};
pub use attach::{attached_prog_id, caps_sufficient, check_privileges, iface, ifindex, prog_name, xdp_link_holding};
pub use class_state::{state_key, CounterReads};
pub use cookies::{describe_syn_allow, syn_allow_all};
pub use host::local_port_range;
pub use ids::{ClassIds, GateId, IdIndex, NO_CLASS};
pub use limits::{Clock, FairTier, Tiers};
pub use maps::{bytes_of, dump_map, from_bytes, Owned, Pod};
pub use source_maps::{occupied_sources, slot_of};
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

/// Frames a cpumap entry queues for its kthread (the kernel's samples use 192-2048).
const CPUMAP_QSIZE: u32 = 2048;

/// Which program of the object to test-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prog {
    Gate,
    /// The egress learner (a TC program; test-run on a frame as it leaves).
    Learn,
    /// The cookie checker (a TC program at ingress).
    CookieAck,
}

/// A loaded (and perhaps attached) gate.
pub struct Gate {
    skel: Owned<GateSkel<'static>>,
    ncpus: usize,
    /// "class_state" and "class_cpus", mapped (`class_state.rs`).
    states: class_state::ClassStates,
    link: Option<OwnedFd>,
    /// The egress learner's tcx link (attached with the gate).
    learn_link: Option<OwnedFd>,
    /// The SYN cookie checker's tcx ingress link (with the gate, where the kernel takes gate cookies).
    cookie_link: Option<OwnedFd>,
    /// Why the namespace's settings or the interface's VLANs keep the gate from answering SYNs (`cookies.rs`).
    syn_why_not: Option<String>,
    /// The interface the cookie checker is attached to, whose forwarding settings and VLANs are read with the TCP settings.
    cookie_iface: Option<String>,
    /// The gate's id of each class in force (`ids.rs`).
    ids: ClassIds,
    /// Ids the last apply freed, with their classes' names, until their
    /// known entries are taken (`take_freed_known`).
    freed: Vec<(GateId, String)>,
    /// The tables generation in force (0 or 1; sluice.h, SLUICE_GENERATIONS).
    gen: u32,
    /// The trie keys written into each generation, to delete when that
    /// generation is written again.
    tries: [TrieKeys; 2],
    /// The config in force.
    applied: Option<Applied>,
    /// The program `--replace` took off the interface, with its interface:
    /// put back if the daemon's start fails after the attach (`undo_attach`).
    replaced: Option<(attach::Replaced, String)>,
}

/// A gate dropped with the program `--replace` took off still kept (a
/// daemon whose start failed after the attach) puts it back.
impl Drop for Gate {
    fn drop(&mut self) {
        if self.replaced.is_some() {
            self.undo_attach();
        }
    }
}

/// N random words (getrandom): the SYN cookies' key, the sources table's seed.
fn random_words<const N: usize>() -> std::io::Result<[u64; N]> {
    let mut w = [0u64; N];
    let len = std::mem::size_of_val(&w);
    // SAFETY: w is len writable bytes.
    let n = unsafe { libc::getrandom(w.as_mut_ptr().cast(), len, 0) };
    if n != len as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(w)
}

/// Delete a key; one that is not there (never inserted) is no error.
fn delete_present(map: &libbpf_rs::Map, key: &[u8]) -> Result<(), libbpf_rs::Error> {
    match map.delete(key) {
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

impl Gate {
    /// Open and load the BPF object (no attach), with the default size of
    /// the per-source map (SLUICE_SOURCES_DEFAULT entries).
    pub fn load() -> Result<Gate> {
        Gate::load_with(SLUICE_SOURCES_DEFAULT)
    }

    /// Load with `sources` slots for unknown sources (the direct-mapped
    /// "sources" table, rounded up to a power of 2; its kernel memory is
    /// allocated at load), and a random seed for where a source's slot is.
    pub fn load_with(sources: u32) -> Result<Gate> {
        let seed = random_words::<1>().map_err(|e| GateError::Load(e.into()))?[0];
        Gate::load_seeded(sources, seed)
    }

    /// Load as `load_with`, with this seed for the sources' slots: tests
    /// whose sources must not share a slot by chance (`slot_of` says where
    /// each one goes).
    pub fn load_seeded(sources: u32, seed: u64) -> Result<Gate> {
        Gate::load_logged(sources, seed, 0)
    }

    /// Load as `load_seeded`, the verifier logging at `log_level` (4: its
    /// statistics; libbpf hands the log to its print callback: `verifier`).
    fn load_logged(sources: u32, seed: u64, log_level: u32) -> Result<Gate> {
        let possible = libbpf_rs::num_possible_cpus().map_err(GateError::Load)?;
        let slots = sources.max(1).checked_next_power_of_two().unwrap_or(1 << 31);
        let skel = Owned::new(|storage| {
            let mut open = GateSkelBuilder::default().open(storage)?;
            if log_level > 0 {
                open.progs.sluice_gate.set_log_level(log_level);
                open.progs.sluice_learn.set_log_level(log_level);
                open.progs.sluice_cookie_ack.set_log_level(log_level);
            }
            open.maps.sources.set_max_entries(slots)?;
            open.maps.cpus.set_max_entries(possible as u32)?;
            let (states, marks) = class_state::sizes(possible);
            open.maps.class_state.set_max_entries(states)?;
            open.maps.shares.set_max_entries(states)?;
            open.maps.fairness.set_max_entries(states)?;
            open.maps.class_cpus.set_max_entries(marks)?;
            let data = open.maps.data_data.as_deref_mut().expect(".data is mmap'ed before load");
            data.settings.sources_mask = slots - 1;
            data.settings.slot_seed = seed;
            // Whose sockets' replies are the host's own (gate/host.h): as
            // discovery trusts a service's owner.
            data.settings.host_uid_min = crate::signals::discover::login_uids().0;
            open.load()
        })
        .map_err(GateError::Load)?;
        let ncpus = possible;
        let m = &skel.maps;
        let maps = class_state::PerCpuMaps {
            states: &m.class_state,
            marks: &m.class_cpus,
            shares: &m.shares,
            fairness: &m.fairness,
        };
        let states = class_state::ClassStates::map(maps, ncpus)?;
        Ok(Gate {
            skel,
            ncpus,
            states,
            link: None,
            learn_link: None,
            cookie_link: None,
            syn_why_not: None,
            cookie_iface: None,
            ids: ClassIds::default(),
            freed: Vec::new(),
            gen: 0,
            tries: Default::default(),
            applied: None,
            replaced: None,
        })
    }

    pub fn ncpus(&self) -> usize {
        self.ncpus
    }

    /// The maps the tracer shares (the class tables, the class counters and
    /// the known clients),
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
            ("known", &m.known),
            ("known_part", &m.known_part),
        ] {
            let handle = libbpf_rs::MapHandle::try_from(map).map_err(|err| GateError::Map { map: name, err })?;
            out.insert(name.to_string(), handle);
        }
        Ok(out)
    }

    /// A class's counters on each CPU.
    pub fn class_counters_percpu(&self, class: usize) -> Result<Vec<ClassCounters>> {
        Ok(self.states.entries(self.ids.id(class).key()).into_iter().map(|s| s.cnt).collect())
    }

    /// A class's counters summed over CPUs.
    pub fn class_counters(&self, class: usize) -> Result<ClassCounters> {
        Ok(sum_cpus(self.class_counters_percpu(class)?))
    }

    /// Every class's counters (by class index, `classes` of them) on each
    /// CPU: every entry read (the daemon's tick and statistics read those
    /// that changed, `CounterReads`; tests and benches read them all).
    pub fn all_class_counters_percpu(&self, classes: usize) -> Result<Vec<Vec<ClassCounters>>> {
        (0..classes).map(|c| self.class_counters_percpu(c)).collect()
    }

    /// Every class's counters (by class index) summed over CPUs.
    pub fn all_class_counters(&self, classes: usize) -> Result<Vec<ClassCounters>> {
        Ok(self.all_class_counters_percpu(classes)?.into_iter().map(sum_cpus).collect())
    }

    /// Global counters summed over CPUs.
    pub fn global_counters(&self) -> Result<GlobalCounters> {
        let per_cpu: Vec<Vec<u64>> =
            maps::percpu_entries(&self.skel.maps.global_stats, "global_stats", SLUICE_GS_NR, self.ncpus)?;
        let mut sum = [0u64; SLUICE_GS_NR as usize];
        sum.iter_mut().zip(&per_cpu).for_each(|(s, cpus)| *s = cpus.iter().sum());
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
        (0..SLUICE_CLASS_IDS).try_for_each(|id| self.set_class_state(id, &sluice_class_state::default()))?;
        zero(&self.skel.maps.global_stats, "global_stats", SLUICE_GS_NR)
    }

    fn prog(&self, prog: Prog) -> &libbpf_rs::ProgramMut<'static> {
        match prog {
            Prog::Gate => &self.skel.progs.sluice_gate,
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

/// One class's counters summed over its per-CPU copies.
pub fn sum_cpus(per_cpu: impl IntoIterator<Item = ClassCounters>) -> ClassCounters {
    let mut sum = [0u64; SLUICE_CS_NR as usize];
    for c in per_cpu {
        sum.iter_mut().zip(c).for_each(|(s, v)| *s += v);
    }
    sum
}

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
