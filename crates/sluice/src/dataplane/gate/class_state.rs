//! The gate's state of each class on each CPU ("class_state": its buckets
//! and counters), the marks of the CPUs that wrote it since the daemon
//! last looked ("class_cpus"), and what the daemon sets for each class on
//! each CPU ("shares": its part of the limit, "fairness": its source
//! fairness), all through mappings of their own, an entry per class id and
//! CPU (bpf/gate/maps.h has the layout). The daemon writes a setting only
//! where its value changed: a limited class's split costs a read of its
//! entries and the writes of those that moved, with no system call.
//!
//! A CPU marks a class at its first packet of the class in each of the
//! daemon's ticks (`settings.epoch`). The daemon's tick reads a class's
//! entries through `CounterReads`: only those of the CPUs marked since its
//! last read, and of those marked at the two reads before (a CPU marks once
//! a tick, so its later packets of that tick, and one the gate was still
//! counting at a read, are read at the next two). What a tick copies grows with
//! the (class, CPU) pairs that saw packets in the last 10 ms, not with the
//! ids in use times the possible CPUs: a per-CPU array's lookup copied
//! every possible CPU's value through the kernel (issue 51).
use std::sync::atomic::Ordering;

use libbpf_rs::{MapCore, MapFlags};

use super::maps::Mapping;
use super::{bytes_of, ClassCounters, Gate, GateError, Result};
use crate::bpf_intf::{sluice_class_state, sluice_fair, sluice_share, SLUICE_CLASS_IDS, SLUICE_CS_NR};

const IDS: usize = SLUICE_CLASS_IDS as usize;

/// The key of class id `id`'s entry for `cpu` in "class_state", "shares"
/// and "fairness" (bpf/gate/maps.h).
pub fn state_key(cpu: usize, id: u32) -> u32 {
    (cpu * IDS) as u32 + id
}

/// The sizes for `possible` CPUs of the maps with an entry per CPU and
/// class id ("class_state", "shares", "fairness"), and of "class_cpus".
pub(super) fn sizes(possible: usize) -> (u32, u32) {
    ((possible * IDS) as u32, (possible.div_ceil(64) * IDS) as u32)
}

/// The maps with an entry per CPU and class id, and the marks, mapped: the
/// states read-only, the marks (the daemon takes them) and the settings
/// read-write.
pub(super) struct ClassStates {
    states: Mapping,
    marks: Mapping,
    shares: Mapping,
    fairness: Mapping,
    ncpus: usize,
}

/// The maps `ClassStates` maps.
pub(super) struct PerCpuMaps<'a> {
    pub states: &'a dyn MapCore,
    pub marks: &'a dyn MapCore,
    pub shares: &'a dyn MapCore,
    pub fairness: &'a dyn MapCore,
}

/// Map `map` after checking its values are `T`s.
fn mapping_of<T>(map: &dyn MapCore, name: &'static str, writable: bool) -> Result<Mapping> {
    if map.value_size() as usize != std::mem::size_of::<T>() {
        let e = std::io::Error::other("value size differs from the header");
        return Err(GateError::Map { map: name, err: e.into() });
    }
    Mapping::of(map, name, writable)
}

impl ClassStates {
    pub(super) fn map(m: PerCpuMaps, ncpus: usize) -> Result<ClassStates> {
        Ok(ClassStates {
            states: mapping_of::<sluice_class_state>(m.states, "class_state", false)?,
            marks: mapping_of::<u64>(m.marks, "class_cpus", true)?,
            shares: mapping_of::<sluice_share>(m.shares, "shares", true)?,
            fairness: mapping_of::<sluice_fair>(m.fairness, "fairness", true)?,
            ncpus,
        })
    }

    /// Class id `id`'s share of its limit on every possible CPU.
    pub(super) fn shares(&self, id: u32) -> Vec<sluice_share> {
        every_cpu(&self.shares, id, self.ncpus)
    }

    /// Class id `id`'s source fairness on every possible CPU.
    pub(super) fn fairness(&self, id: u32) -> Vec<sluice_fair> {
        every_cpu(&self.fairness, id, self.ncpus)
    }

    /// Give class id `id` `shares` (one per possible CPU), writing the
    /// entries whose value differs; how many were written.
    pub(super) fn set_shares(&self, id: u32, shares: &[sluice_share]) -> usize {
        set_changed(&self.shares, id, shares, self.ncpus)
    }

    /// As `set_shares`, for source fairness.
    pub(super) fn set_fairness(&self, id: u32, fair: &[sluice_fair]) -> usize {
        set_changed(&self.fairness, id, fair, self.ncpus)
    }

    /// Class id `id`'s state on `cpu`.
    pub(super) fn entry(&self, cpu: usize, id: u32) -> sluice_class_state {
        self.states.read(state_key(cpu, id) as usize)
    }

    /// Class id `id`'s state on every possible CPU.
    pub(super) fn entries(&self, id: u32) -> Vec<sluice_class_state> {
        every_cpu(&self.states, id, self.ncpus)
    }

    /// The CPUs that marked class id `id` since the last take, as words of
    /// 64 CPUs, each zeroed as it is taken.
    fn take_marks(&self, id: u32) -> Vec<u64> {
        let words = self.ncpus.div_ceil(64);
        (0..words).map(|w| self.marks.word(w * IDS + id as usize).swap(0, Ordering::AcqRel)).collect()
    }

    /// Mark every CPU of class id `id`: its entries were written from user
    /// space (zeroed), and every reader reads them all again.
    fn mark_all(&self, id: u32) {
        for w in 0..self.ncpus.div_ceil(64) {
            self.marks.word(w * IDS + id as usize).store(u64::MAX, Ordering::Release);
        }
    }
}

/// Class id `id`'s entries of `map` on every possible CPU.
fn every_cpu<T: super::maps::Pod>(map: &Mapping, id: u32, ncpus: usize) -> Vec<T> {
    (0..ncpus).map(|cpu| map.read(state_key(cpu, id) as usize)).collect()
}

/// Write into `map` the entries of class id `id` (one per possible CPU,
/// `values`) that differ from what it holds; how many were written.
fn set_changed<T: super::maps::Pod + PartialEq>(map: &Mapping, id: u32, values: &[T], ncpus: usize) -> usize {
    assert_eq!(values.len(), ncpus, "a value per possible CPU");
    let mut written = 0;
    for (cpu, v) in values.iter().enumerate() {
        let key = state_key(cpu, id) as usize;
        if map.read::<T>(key) != *v {
            map.write(key, v);
            written += 1;
        }
    }
    written
}

impl Gate {
    /// Write `value` into class id `id`'s entry on every possible CPU, and
    /// mark them for the readers.
    pub(super) fn set_class_state(&self, id: u32, value: &sluice_class_state) -> Result<()> {
        let keys: Vec<u8> = (0..self.ncpus).flat_map(|cpu| state_key(cpu, id).to_ne_bytes()).collect();
        let values = bytes_of(value).repeat(self.ncpus);
        let map = &self.skel.maps.class_state;
        map.update_batch(&keys, &values, self.ncpus as u32, MapFlags::ANY, MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "class_state", err })?;
        self.states.mark_all(id);
        Ok(())
    }

    /// Mark every class id on every CPU, as if each saw packets everywhere:
    /// the next `CounterReads::read` copies every entry (`sluice bench tick`).
    pub fn mark_every_class(&self) {
        (0..SLUICE_CLASS_IDS).for_each(|id| self.states.mark_all(id));
    }
}

/// One class id's counters as a reader last read them.
#[derive(Debug, Clone)]
struct IdCounters {
    /// By CPU.
    per_cpu: Vec<ClassCounters>,
    /// Their sum.
    sum: ClassCounters,
    /// By word of 64 CPUs, the marks taken at the last two ticks' reads
    /// (with those of the reads between them): those CPUs are read again.
    last: Vec<[u64; 2]>,
}

/// The class counters as the daemon reads them: each class id's per-CPU
/// counters kept between reads, and at each read only the entries of the
/// CPUs marked since (see the module's comment). A read takes the marks: a
/// gate has one such reader, the daemon's, for its tick (`read`) and for
/// its statistics between ticks (`read_between`); every other read is of
/// every entry (`Gate::all_class_counters`).
#[derive(Debug, Clone, Default)]
pub struct CounterReads {
    /// By gate id.
    ids: Vec<Option<IdCounters>>,
    /// By class index: its gate id at the last read.
    classes: Vec<u32>,
    /// Read since `stale` (this tick).
    read: bool,
    /// Entries (a class on a CPU) the last read copied.
    pub copied: usize,
}

impl CounterReads {
    /// Nothing is read yet this tick: `per_cpu` says None until `read`.
    pub fn stale(&mut self) {
        self.read = false;
    }

    /// The tick's read: the counters of classes 0..`classes` (by class
    /// index) that changed since the last read. The marks it takes are read
    /// again at the next two ticks' reads.
    pub fn read(&mut self, gate: &Gate, classes: usize) {
        self.read_marked(gate, classes, true);
        self.read = true;
    }

    /// A read between ticks (the statistics'): the entries marked since the
    /// last read only, so what it copies is what saw packets since (a
    /// CPU's packets counted after the tick's read, with no mark since,
    /// wait for the next tick's read). The marks it takes join those of the
    /// tick's last read, so the next two ticks' reads still copy every CPU
    /// marked since; a tick's `per_cpu` still says what the tick read.
    pub fn read_between(&mut self, gate: &Gate, classes: usize) {
        self.read_marked(gate, classes, false);
    }

    /// Copy the entries marked since the last read and, at a tick's read
    /// (`tick`), those marked at the two ticks' reads before; a tick's
    /// marks become the last tick's, a read between ticks joins them.
    fn read_marked(&mut self, gate: &Gate, classes: usize, tick: bool) {
        let ncpus = gate.ncpus;
        self.ids.resize(IDS, None);
        self.classes = (0..classes).map(|c| gate.ids.id(c).key()).collect();
        self.copied = 0;
        for &id in &self.classes {
            let e = self.ids[id as usize].get_or_insert_with(|| IdCounters {
                per_cpu: vec![[0; SLUICE_CS_NR as usize]; ncpus],
                sum: [0; SLUICE_CS_NR as usize],
                // Never read: every CPU is.
                last: vec![[u64::MAX; 2]; ncpus.div_ceil(64)],
            });
            let marks = gate.states.take_marks(id);
            for (w, (&now, last)) in marks.iter().zip(e.last.iter_mut()).enumerate() {
                let mut want = if tick { now | last[0] | last[1] } else { now };
                *last = if tick { [now, last[0]] } else { [now | last[0], last[1]] };
                while want != 0 {
                    let cpu = w * 64 + want.trailing_zeros() as usize;
                    want &= want - 1;
                    if cpu >= ncpus {
                        break;
                    }
                    let new = gate.states.entry(cpu, id).cnt;
                    let old = std::mem::replace(&mut e.per_cpu[cpu], new);
                    for ((s, n), o) in e.sum.iter_mut().zip(new).zip(old) {
                        *s = s.wrapping_add(n).wrapping_sub(o);
                    }
                    self.copied += 1;
                }
            }
        }
    }

    /// Class `class`'s counters on each CPU, as of this tick's read (None:
    /// not read this tick).
    pub fn per_cpu(&self, class: usize) -> Option<&[ClassCounters]> {
        let id = *self.classes.get(class).filter(|_| self.read)?;
        self.ids[id as usize].as_ref().map(|e| e.per_cpu.as_slice())
    }

    /// Every class's counters summed over CPUs, by class index, as of the
    /// last read.
    pub fn totals(&self) -> Vec<ClassCounters> {
        self.classes
            .iter()
            .map(|&id| self.ids[id as usize].as_ref().map_or([0; SLUICE_CS_NR as usize], |e| e.sum))
            .collect()
    }
}
