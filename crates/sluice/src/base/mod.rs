//! The bottom layer: what every other layer may use and that uses none of
//! them. Log lines, the clocks, number formatting, and running code in a
//! network namespace.

pub mod clock;
pub mod fmt;
pub mod log;
pub mod netns;
