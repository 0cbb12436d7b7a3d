//! Tools around the daemon.
//! - [`serve`] and [`send`]: `sluice serve udp-echo` and `sluice send`, a
//!   victim service and a paced sender for trying sluice by hand.

pub mod send;
pub mod serve;
