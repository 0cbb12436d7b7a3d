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
