//! Signals: what the daemon reads about the host and its services.
//! - [`procfs`]: the /proc files (/proc/net/snmp, netstat, softnet_stat,
//!   /proc/PID/stat), opened once and read in place each tick;
//! - [`sock_diag`]: a sock_diag client for the sockets behind a class's ports;
//! - [`health`]: each class's service health per tick, from those;
//! - [`service_cpus`]: the CPUs each class's service runs on;
//! - [`backends`]: the local processes a service connected to (its work too);
//! - [`rx_cpu`]: the CPU signal: receive work for lower classes on those CPUs;
//! - [`discover`]: the listening services and their owners (zero-config);
//! - [`source_tables`]: the gate's source maps summed up for status;
//! - [`known`]: the known clients' state file;
//! - [`syn_peers`]: what lets the gate answer a SYN without its socket lookup;
//! - [`netdev`]: an interface's NAPI instances and their kthreads (generic netlink).

pub mod backends;
pub mod discover;
pub mod health;
pub mod known;
pub mod netdev;
pub mod procfs;
pub mod rx_cpu;
pub mod service_cpus;
pub mod sock_diag;
pub mod source_tables;
pub mod syn_peers;
