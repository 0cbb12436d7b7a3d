//! Waking a calm daemon: the gate writes a class id into the "wake" ring
//! buffer when the class's packets on a CPU pass the mark the daemon armed
//! (`sluice_share.wake_at`; see `daemon/pace.rs`).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bpf_intf::sluice_wake;

use super::*;

impl Gate {
    /// Have the gate wake the daemon (`wake_ring`) once `class`'s seen
    /// packets on each CPU reach `at` (by CPU; 0: never on that CPU), or
    /// once SLUICE_WAKE_BATCH of them arrive on a CPU within `gap_ns`
    /// (0: no rate mark), or once the egress learner has timed
    /// SLUICE_SLOW_WAKE_ANSWERS of its answers on a CPU over `slow_us`
    /// (0: no slow mark; see `Ticker::slow_marks_us`).
    pub fn arm_wake(&self, class: usize, at: &[u64], gap_ns: u64, slow_us: u32) -> Result<()> {
        let mut shares = self.shares(class)?;
        for (s, &a) in shares.iter_mut().zip(at) {
            (s.wake_at, s.wake_gap_ns) = (a, gap_ns);
            (s.slow_wake_us, s.slow_answers) = (slow_us, 0);
        }
        self.set_shares(class, &shares)
    }

    /// The ring the gate writes a `sluice_wake` into when a class's
    /// arrivals pass their wake mark; each record consumed
    /// (`RingBuffer::poll`) is counted in `woke`, with how long it took from
    /// the gate to here.
    pub fn wake_ring(&self, woke: Arc<Woken>) -> Result<libbpf_rs::RingBuffer<'static>> {
        let map_err = |err| GateError::Map { map: "wake", err };
        let handle = libbpf_rs::MapHandle::try_from(&self.skel.maps.wake).map_err(map_err)?;
        let mut b = libbpf_rs::RingBufferBuilder::new();
        b.add(&handle, move |data: &[u8]| {
            let at_ns = data.get(..std::mem::size_of::<sluice_wake>()).map(|b| from_bytes::<sluice_wake>(b).at_ns);
            woke.note(at_ns);
            0
        })
        .map_err(map_err)?;
        b.build().map_err(map_err)
    }
}

/// What the wake ring delivered: how many records, and of the last one the
/// gate's clock at its call and how long it took from there to the
/// daemon's loop (ns; u64::MAX: none measured yet).
#[derive(Debug)]
pub struct Woken {
    count: AtomicU64,
    last_at: AtomicU64,
    last_ns: AtomicU64,
}

impl Default for Woken {
    fn default() -> Self {
        Woken { count: AtomicU64::new(0), last_at: AtomicU64::new(u64::MAX), last_ns: AtomicU64::new(u64::MAX) }
    }
}

impl Woken {
    /// A record whose gate clock was `at_ns` (None: a record too short to carry it).
    fn note(&self, at_ns: Option<u64>) {
        if let Some(at) = at_ns {
            self.last_at.store(at, Ordering::Relaxed);
            self.last_ns.store(crate::base::clock::now_ns().saturating_sub(at), Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The last record's gate clock (CLOCK_MONOTONIC ns; None: none yet).
    pub fn last_at(&self) -> Option<u64> {
        let at = self.last_at.load(Ordering::Relaxed);
        (at != u64::MAX).then_some(at)
    }

    /// Records consumed so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The last record's time from the gate to the loop (None: none yet).
    pub fn last(&self) -> Option<Duration> {
        let ns = self.last_ns.load(Ordering::Relaxed);
        (ns != u64::MAX).then(|| Duration::from_nanos(ns))
    }
}
