//! `sluice bench`: the overload testbed, its traffic generator, and the
//! measurements that show what a flood does to a service, with and without sluice.
pub mod gen;
pub mod testbed;
pub mod measure;
pub mod scenario;
pub mod run;
pub mod report;
pub mod sweep;
pub mod gencheck;
pub mod step;
