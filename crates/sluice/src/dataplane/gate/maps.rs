//! The map layer: which types may cross into BPF maps as bytes (`Pod`),
//! typed reads and writes of hash and per-CPU maps, shared mappings of
//! mmapable arrays (`Mapping`), and a skeleton that owns the open object it
//! borrows from (`Owned`).
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;

use libbpf_rs::{MapCore, MapFlags, OpenObject};

use crate::bpf_intf::*;

use super::{GateError, Result};

/// A type whose values are plain bytes: it may be copied into and out of a
/// BPF map as its in-memory representation.
///
/// # Safety
/// Implement only for `#[repr(C)]` types (or integers, or arrays of them)
/// that have no padding bytes (every byte of a value is initialised) and for
/// which every bit pattern is a valid value. The header `bpf/sluice.h` gives
/// its structs explicit padding fields for this.
pub unsafe trait Pod: Copy + 'static {}

macro_rules! pod {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: integers, or bindgen structs of `bpf/sluice.h` (and the
        // bench's header) made of integers with explicit padding fields.
        unsafe impl Pod for $t {}
    )* };
}

pod!(u8, u16, u32, u64, i64, [u32; 4], [u64; SLUICE_CS_NR as usize]);
pod!(
    sluice_bucket,
    sluice_cell,
    sluice_cpu_rx,
    sluice_class_state,
    sluice_fair,
    sluice_group,
    sluice_known,
    sluice_known_part,
    sluice_latency,
    sluice_wake,
    sluice_pacer,
    sluice_reuseport_sock,
    sluice_share,
    sluice_src,
    sluice_src_key,
    sluice_src_slot,
    sluice_syn_guard,
    sluice_v4_key,
    sluice_v6_key,
);

/// A value's bytes, to write into a map.
pub fn bytes_of<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: T is Pod: every byte is initialised; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A value read back from a map's bytes.
pub fn from_bytes<T: Pod>(b: &[u8]) -> T {
    assert_eq!(b.len(), std::mem::size_of::<T>(), "map value size matches the header");
    // SAFETY: the length is checked and T is Pod: any bit pattern is a value.
    unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) }
}

/// Every entry of a hash map (not per-CPU), read in batches of BATCH
/// (bpf_map_lookup_batch) until the kernel says the map is done (ENOENT).
/// A hash map's batch ends at a bucket's edge, so most batches come back
/// short of BATCH before the end: libbpf-rs's batch iterator took a short
/// batch for the last and stopped, and a read of 59,000 known entries
/// returned 8,190 (`gate_sources::known_entries_are_written_and_deleted_in_batches`).
pub fn dump_map<K: Pod, V: Pod>(map: &dyn MapCore, name: &'static str) -> Result<Vec<(K, V)>> {
    const BATCH: u32 = 4096;
    let (ks, vs) = (std::mem::size_of::<K>(), std::mem::size_of::<V>());
    let err = |e: std::io::Error| GateError::Map { map: name, err: e.into() };
    if map.key_size() as usize != ks || map.value_size() as usize != vs {
        return Err(err(std::io::Error::other("key or value size differs from the header")));
    }
    let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    let (mut keys, mut values) = (vec![0u8; ks * BATCH as usize], vec![0u8; vs * BATCH as usize]);
    // The kernel's place in the map between batches (a bucket index for a hash map).
    let (mut token, mut next) = (None::<[u8; 8]>, [0u8; 8]);
    let mut out = Vec::new();
    loop {
        let mut n = BATCH;
        let prev = token.as_mut().map_or(std::ptr::null_mut(), |t| t.as_mut_ptr());
        // SAFETY: the buffers hold BATCH keys and values of the map's sizes
        // (checked above) and the tokens 8 bytes (a hash map's is 4).
        let ret = unsafe {
            libbpf_rs::libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                prev.cast(),
                next.as_mut_ptr().cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut n,
                &opts,
            )
        };
        let errno = (ret < 0).then(std::io::Error::last_os_error);
        if errno.as_ref().is_some_and(|e| e.kind() == std::io::ErrorKind::Interrupted) {
            continue;
        }
        for i in 0..n as usize {
            out.push((from_bytes::<K>(&keys[i * ks..(i + 1) * ks]), from_bytes::<V>(&values[i * vs..(i + 1) * vs])));
        }
        match errno {
            None => token = Some(next),
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(err(e)),
        }
    }
}

/// Entries 0..count of a per-CPU array in one bpf_map_lookup_batch: for each,
/// one value per possible CPU (`ncpus`). A read a tick makes of every class
/// costs one system call, not one per class (with 20 classes those calls
/// were 15% of an idle daemon's CPU, `perf record`).
pub fn percpu_entries<T: Pod>(map: &dyn MapCore, name: &'static str, count: u32, ncpus: usize) -> Result<Vec<Vec<T>>> {
    let err = |e: std::io::Error| GateError::Map { map: name, err: e.into() };
    let size = std::mem::size_of::<T>();
    if map.value_size() as usize != size || map.key_size() != 4 {
        return Err(err(std::io::Error::other("key or value size differs from the header")));
    }
    if count == 0 {
        return Ok(vec![]);
    }
    // The kernel lays each entry out as ncpus values, each rounded up to 8 bytes.
    let stride = size.next_multiple_of(8);
    let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    let (mut keys, mut values) = (vec![0u32; count as usize], vec![0u8; count as usize * ncpus * stride]);
    let mut next = 0u32;
    let mut n = count;
    loop {
        // SAFETY: the buffers hold `count` keys of 4 bytes and `count`
        // entries of ncpus values of `stride` bytes; the array's token is its
        // next index (4 bytes).
        let ret = unsafe {
            libbpf_rs::libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                std::ptr::null_mut(),
                (&raw mut next).cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut n,
                &opts,
            )
        };
        match (ret < 0).then(std::io::Error::last_os_error) {
            Some(e) if e.kind() == std::io::ErrorKind::Interrupted => n = count,
            // ENOENT: the array ended at or before `count`.
            Some(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(err(e)),
            _ => break,
        }
    }
    if n != count {
        return Err(err(std::io::Error::other(format!("{n} of {count} entries read"))));
    }
    Ok(values
        .chunks_exact(ncpus * stride)
        .map(|entry| entry.chunks_exact(stride).map(|v| from_bytes::<T>(&v[..size])).collect())
        .collect())
}

/// Entry `idx` of a per-CPU array: one value per possible CPU (empty if absent).
pub fn percpu<T: Pod>(map: &dyn MapCore, name: &'static str, idx: u32) -> Result<Vec<T>> {
    let vals = map
        .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
        .map_err(|err| GateError::Map { map: name, err })?
        .unwrap_or_default();
    Ok(vals.iter().map(|v| from_bytes::<T>(v)).collect())
}

/// Entry `idx` of a per-CPU array of u64 counters, summed over CPUs.
pub fn percpu_sum(map: &dyn MapCore, name: &'static str, idx: u32) -> Result<u64> {
    Ok(percpu::<u64>(map, name, idx)?.iter().sum())
}

/// A libbpf skeleton together with the open object it borrows from: the
/// object is freed after the skeleton, when this is dropped.
pub struct Owned<S> {
    skel: ManuallyDrop<S>,
    storage: *mut MaybeUninit<OpenObject>,
}

impl<S> Owned<S> {
    /// Open and load a skeleton with `make`, over storage this owns.
    pub fn new<E>(
        make: impl FnOnce(&'static mut MaybeUninit<OpenObject>) -> std::result::Result<S, E>,
    ) -> std::result::Result<Owned<S>, E> {
        let storage = Box::into_raw(Box::new(MaybeUninit::uninit()));
        // SAFETY: a fresh allocation; only the skeleton borrows it, and Drop
        // frees it after the skeleton (the 'static borrow never outlives it).
        match make(unsafe { &mut *storage }) {
            Ok(skel) => Ok(Owned { skel: ManuallyDrop::new(skel), storage }),
            Err(e) => {
                // SAFETY: `make` returned; nothing borrows the storage any more.
                drop(unsafe { Box::from_raw(storage) });
                Err(e)
            }
        }
    }
}

// SAFETY: the storage pointer is owned like a Box, and moves with the
// skeleton that borrows it; it is Send when a Box of it would be.
unsafe impl<S: Send> Send for Owned<S> where Box<MaybeUninit<OpenObject>>: Send {}
// SAFETY: a shared Owned gives out only `&S`; the storage is not touched through it.
unsafe impl<S: Sync> Sync for Owned<S> where Box<MaybeUninit<OpenObject>>: Sync {}

impl<S> Deref for Owned<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.skel
    }
}

impl<S> DerefMut for Owned<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.skel
    }
}

impl<S> Drop for Owned<S> {
    fn drop(&mut self) {
        // SAFETY: the skeleton goes first, then the storage it borrowed; each once.
        unsafe {
            ManuallyDrop::drop(&mut self.skel);
            drop(Box::from_raw(self.storage));
        }
    }
}

/// A shared mapping of an mmapable BPF array, unmapped when dropped.
pub struct Mapping {
    base: *mut libc::c_void,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory, valid until dropped; every
// access goes through a volatile read or write or an atomic (`Mapping::read`,
// `Mapping::write`, `Mapping::word`).
unsafe impl Send for Mapping {}
// SAFETY: as above: a write through `&Mapping` is volatile u64 stores (a
// value's fields may be seen half written, as the gate's readers may see
// them; no u64 is torn) or an atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map all of `map`'s values (an array with BPF_F_MMAPABLE, each value
    /// a multiple of 8 bytes: an mmapable array lays them out back to back
    /// from offset 0), read-only or read-write.
    pub fn of(map: &dyn MapCore, name: &'static str, writable: bool) -> Result<Mapping> {
        let err = |e: std::io::Error| GateError::Map { map: name, err: e.into() };
        if !(map.value_size() as usize).is_multiple_of(8) {
            return Err(err(std::io::Error::other("its values are not a multiple of 8 bytes")));
        }
        let len = map.max_entries() as usize * map.value_size() as usize;
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a shared mapping of the map's fd, of at most its size.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, map.as_fd().as_raw_fd(), 0) };
        if base == libc::MAP_FAILED {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(Mapping { base, len, writable })
    }

    /// Value `i` (a `T` of the map's value size, a multiple of 8 bytes),
    /// read a u64 at a time, each with a volatile load. The gate may be
    /// writing it, so its fields may be read half old, half new, but no
    /// u64 is torn: a copy byte by byte could read a counter's low bytes
    /// before a carry and its high bytes after (the kernel copies per-CPU
    /// values a long at a time for the same reason).
    pub fn read<T: Pod>(&self, i: usize) -> T {
        const { assert!(std::mem::size_of::<T>().is_multiple_of(8), "values of whole u64s") };
        let size = std::mem::size_of::<T>();
        assert!((i + 1) * size <= self.len, "value {i} is past the mapping");
        let mut out = MaybeUninit::<T>::uninit();
        // SAFETY: the words read are inside the mapping (above), 8-aligned
        // (values of whole u64s in a page-aligned mapping); they are written
        // into `out` unaligned, all of its bytes, and T is Pod (any bits
        // are a value).
        unsafe {
            let src = self.base.cast::<u8>().add(i * size).cast::<u64>();
            let dst = out.as_mut_ptr().cast::<u64>();
            for w in 0..size / 8 {
                dst.add(w).write_unaligned(std::ptr::read_volatile(src.add(w)));
            }
            out.assume_init()
        }
    }

    /// Write value `i` of a read-write mapping (a `T` of the map's value
    /// size), a u64 at a time, each with a volatile store: the gate reading
    /// it meanwhile may see some fields new and some old, none torn.
    pub fn write<T: Pod>(&self, i: usize, v: &T) {
        const { assert!(std::mem::size_of::<T>().is_multiple_of(8), "values of whole u64s") };
        let size = std::mem::size_of::<T>();
        assert!(self.writable, "a write to a read-only mapping");
        assert!((i + 1) * size <= self.len, "value {i} is past the mapping");
        // SAFETY: the words written are inside a writable mapping (above),
        // 8-aligned (values of whole u64s in a page-aligned mapping); they
        // are read from `v` unaligned, all of its bytes initialised (Pod).
        unsafe {
            let src = (v as *const T).cast::<u64>();
            let dst = self.base.cast::<u8>().add(i * size).cast::<u64>();
            for w in 0..size / 8 {
                std::ptr::write_volatile(dst.add(w), src.add(w).read_unaligned());
            }
        }
    }

    /// Word `i` of a read-write mapping of u64 values, as an atomic.
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!((i + 1) * 8 <= self.len, "word {i} is past the mapping");
        // SAFETY: inside the mapping, 8-aligned, valid while `self` is; the
        // gate writes it only with atomic ops.
        unsafe { AtomicU64::from_ptr(self.base.cast::<u64>().add(i)) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, no longer used.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
