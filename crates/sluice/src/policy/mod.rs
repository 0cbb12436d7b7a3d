//! Policy: pure logic that decides, with no kernel I/O, so unit tests cover
//! it without root.
//! - [`config`]: the TOML file and `--class` flags, checked, into a `Config`;
//! - [`controller`]: the auto rate controller (100 Hz, after Macpherson's
//!   rate selection);
//! - [`budget`]: one packet budget shared by priority;
//! - [`queue`]: the rules that read a queue (stands, full, dropped);
//! - [`distress`]: what two readings of a class's sockets say (distress,
//!   behind, SYN pressure), from those rules;
//! - [`delay`]: how long a class's service takes to answer, from the
//!   gate's buckets;
//! - [`fair`]: source fairness inside a limited class;
//! - [`late`]: when a TCP class's answers are late, and its known
//!   clients go first;
//! - [`remap`]: class identity across a config switch;
//! - [`protect`]: CPU protection (`cpu = "away"`), when and where to move a service;
//! - [`syn_guard`]: when the gate answers a class's SYNs with cookies.

pub mod budget;
pub mod config;
pub mod controller;
pub mod delay;
pub mod distress;
pub mod fair;
pub mod late;
pub mod protect;
pub mod queue;
pub mod remap;
pub mod syn_guard;
