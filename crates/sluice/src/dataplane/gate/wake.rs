//! Waking a calm daemon: the gate writes a class id into the "wake" ring
//! buffer when the class's packets on a CPU pass the mark the daemon armed
//! (`sluice_share.wake_at`; see `daemon/pace.rs`).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

impl Gate {
    /// Have the gate wake the daemon (`wake_ring`) once `class`'s seen
    /// packets on each CPU reach `at` (by CPU; 0: never on that CPU).
    pub fn arm_wake(&self, class: usize, at: &[u64]) -> Result<()> {
        let mut shares = self.shares(class)?;
        for (s, &a) in shares.iter_mut().zip(at) {
            s.wake_at = a;
        }
        self.set_shares(class, &shares)
    }

    /// The ring the gate writes a class id into when its arrivals pass their
    /// wake mark; `woke` is set for each one consumed (`RingBuffer::poll`).
    pub fn wake_ring(&self, woke: Arc<AtomicU64>) -> Result<libbpf_rs::RingBuffer<'static>> {
        let map_err = |err| GateError::Map { map: "wake", err };
        let handle = libbpf_rs::MapHandle::try_from(&self.skel.maps.wake).map_err(map_err)?;
        let mut b = libbpf_rs::RingBufferBuilder::new();
        b.add(&handle, move |_: &[u8]| {
            woke.fetch_add(1, Ordering::Relaxed);
            0
        })
        .map_err(map_err)?;
        b.build().map_err(map_err)
    }
}
