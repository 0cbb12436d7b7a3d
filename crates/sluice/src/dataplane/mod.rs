//! The data plane: what runs in the kernel and the code that loads it.
//! - [`gate`]: the XDP gate (load, apply a config atomically, class ids,
//!   attach, the map layer, counters, wake ring, SYN cookies' keys, test runs);
//! - [`classify`]: a config's match rules turned into the gate's tables;
//! - [`share`]: a class's rate split over the CPUs that receive it;
//! - [`steer`]: reader steering (the SK_REUSEPORT program and its groups);
//! - [`trace`]: `sluice trace`, packet fates and stage latency from
//!   tracepoints.

pub mod classify;
pub mod gate;
pub mod share;
pub mod steer;
pub mod trace;

/// How long the kernel programs trust what the daemon last wrote without a
/// new tick (it ticks every 10 to 500 ms): past it the gate fails open
/// (`Gate::keep_alive`) and the steering falls back to the kernel's hash.
pub const ALIVE_NS: u64 = 2_000_000_000;
