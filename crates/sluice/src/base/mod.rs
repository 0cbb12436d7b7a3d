//! The bottom layer: what every other layer may use and that uses none of
//! them. Log lines, the clocks, number formatting, a network interface by
//! name and index, and running code in a network namespace.

pub mod clock;
pub mod fmt;
pub mod iface;
pub mod log;
pub mod netns;
