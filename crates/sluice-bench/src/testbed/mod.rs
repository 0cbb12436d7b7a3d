//! The testbed and the victim: [`victim`] (the namespaces with a victim
//! model), [`cpu_plan`] (which CPU each part runs on), [`serve`]
//! (`sluice-bench serve udp-echo`: a service with a set CPU cost per
//! datagram), [`rig`] (one model's running rig: gates, service, the
//! control thread running the daemon's tick), [`measure`] (CPU meters,
//! /proc counters, nftables), [`outbound`] (the NAPI study's outbound flow
//! and ping beside each level), [`procs`] (child processes, the daemon as a
//! user runs it).
pub mod cpu_plan;
pub mod measure;
pub mod outbound;
pub mod procs;
pub mod rig;
pub mod serve;
pub mod victim;
