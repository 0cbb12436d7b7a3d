//! Signals: what the daemon reads about the host and its services.
//! - [`kernel`]: the kernel's own counters (/proc/net/snmp, softnet_stat,
//!   /proc/stat) and sock_diag, read in place each tick;
//! - [`health`]: each class's service health per tick, from those;
//! - [`service_cpus`]: the CPUs each class's service runs on;
//! - [`rx_cpu`]: the CPU signal: receive work for lower classes on those CPUs;
//! - [`discover`]: the listening services and their owners (zero-config);
//! - [`sources`]: the gate's source maps summed up for status;
//! - [`known`]: the known clients' state file;
//! - [`syn_peers`]: what lets the gate answer a SYN without its socket lookup;
//! - [`netdev`]: an interface's NAPI instances and their kthreads (generic netlink).

pub mod discover;
pub mod health;
pub mod kernel;
pub mod known;
pub mod netdev;
pub mod rx_cpu;
pub mod service_cpus;
pub mod sources;
pub mod syn_peers;
