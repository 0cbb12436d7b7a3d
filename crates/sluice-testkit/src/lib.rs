//! The sluice test kit: what the tests (`crates/sluice/tests`) and the bench
//! (`sluice-bench`) share, kept out of the daemon's library so that
//! `sluice` never links it (it is only a dev-dependency there).
//! - [`testbed`]: the two network namespaces and their veth pair that every
//!   test, bench and demo runs in, always removed on drop;
//! - [`packet`]: crafted Ethernet frames (IPv4/IPv6, UDP/TCP/ICMP, extension
//!   headers, malformed ones) for BPF_PROG_TEST_RUN and the generator;
//! - [`summary`]: median, percentiles, coefficient of variation (`None` for
//!   no samples, never 0);
//! - [`plant`]: a simulated victim (gate, receive stage, socket, service)
//!   that livelocks when flooded, for the auto controller's tests;
//! - [`promlint`]: promtool's rules for the metrics text, without promtool;
//! - [`neighbour`]: a process spinning on a CPU (a service's neighbour).

pub mod neighbour;
pub mod packet;
pub mod plant;
pub mod promlint;
pub mod summary;
pub mod testbed;
