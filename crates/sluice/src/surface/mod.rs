//! The user surface: what a person or a scraper sees.
//! - [`cli`]: value parsers for clap and output helpers;
//! - [`client`]: the statistics client (`sluice status`, `sluice top`);
//! - [`stats`]: the snapshot on the wire, the status table, the metrics text;
//! - [`endpoint`]: the metrics endpoint, bounded;
//! - [`trace`]: `sluice trace`, the command and its report.

pub mod cli;
pub mod client;
pub mod endpoint;
pub mod stats;
pub mod trace;
