//! Tools around the daemon.
//! - [`netns`]: entering a network namespace, running `ip` in one;
//! - [`serve`] and [`send`]: `sluice serve udp-echo` and `sluice send`, a
//!   victim service and a paced sender for trying sluice by hand.

pub mod netns;
pub mod send;
pub mod serve;
