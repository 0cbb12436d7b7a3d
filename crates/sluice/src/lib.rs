//! sluice: admission control at the driver for Linux network services under packet floods.
//!
//! The module map (the one map of this crate: the README and docs/design.md
//! link here). One folder per layer; a layer imports only from itself and
//! the layers below it, lowest first `base`, then `policy`,
//! `signals`, `dataplane`, `surface`, `daemon` (docs/design.md, "The
//! layers"; `tests/layers.rs` checks it). Each module is named by its job:
//!
//! - [`base`]: log.rs (log lines, human or JSON), clock.rs (the monotonic
//!   and wall clocks), fmt.rs (numbers for tables), iface.rs (an interface
//!   by name and index, resolved once), netns.rs (code and commands in a
//!   network namespace);
//! - [`dataplane`]: what runs in the kernel and the code that loads it.
//!   `gate/` (mod.rs: load, apply into the tables generation not in force and
//!   switch, per-CPU splits, test runs; ids.rs: the gate's class ids, kept by
//!   name; maps.rs: typed map reads; attach.rs: privileges, bpf_link, tcx;
//!   counters.rs; cookies.rs: SYN cookies at the driver; source_maps.rs: the
//!   per-source maps; wake.rs: the ring that wakes a calm daemon),
//!   `classify.rs` (rules to cells and prefix tries), `share.rs` (a class's
//!   rate split over CPUs), `steer/` (reader steering: groups.rs, pure
//!   logic; mod.rs: pidfd_getfd, sockarray, attach), `trace/` (the tracer:
//!   load, share the gate's tables, read counts);
//! - [`policy`]: pure logic, no kernel I/O. `config/` (mod.rs: types and
//!   checks; grammar.rs: a class's keys and how they make a class, for
//!   both syntaxes; values.rs: the value parsers; file.rs: TOML with
//!   file:line errors; flags.rs: `--class`), `controller/` (the auto controller: capacity estimate, when it engages,
//!   capacity and pno), `budget/` (one budget by priority, and what causes
//!   distress for it), `fair/` (source fairness in a limited class),
//!   `delay.rs` (the answer delay's quantiles), `late.rs` (when a TCP
//!   class answers late: its known clients first), `queue.rs`
//!   (the rules that read a queue: stands, over, dropped), `remap.rs` (class identity across a
//!   config switch), `protect.rs` (CPU protection, `cpu = "away"`), `syn_guard.rs` (when the
//!   gate answers SYNs);
//! - [`signals`]: what the daemon reads. `procfs.rs` (/proc/net/snmp,
//!   netstat, softnet_stat, /proc/PID/stat), `sock_diag.rs` (the sockets
//!   behind a class's ports), `health.rs` (each class's
//!   service health per tick), `service_cpus.rs`, `rx_cpu.rs` (lower
//!   classes' receive work on a service's CPUs), `discover/` (zero config: mod.rs the classes, listeners.rs the sockets, owners.rs who holds them),
//!   `source_tables.rs` (source fairness as status shows it: the scan of the per-source maps summed by class), `known.rs` (the
//!   known clients' file and each class's part of the map), `netdev.rs`
//!   (an interface's NAPI kthreads, generic netlink), `syn_peers.rs` (what
//!   lets the gate answer a SYN without its socket lookup);
//! - [`daemon`]: `sluice run`. mod.rs (start, the cadence table, stop),
//!   setup.rs (the tracer, steering and the start's log lines),
//!   tick/ (the 10 ms tick the daemon and the bench run: mod.rs, each
//!   class's part in class.rs, what it shows of itself in readout.rs,
//!   whether the signals can be read in
//!   watch.rs), auto.rs,
//!   decisions.rs (which limit changes get a log line), drop_book.rs (the
//!   kernel's drops after the gate, by class name),
//!   sched.rs (SCHED_FIFO, NAPI kthreads' policy), generation.rs (config
//!   source, reload, discovery, switch), publish.rs (snapshot, socket and
//!   metrics servers), source_scan.rs, known_store.rs, protect.rs, pace.rs
//!   (10 ms or calm, woken by the gate), privileges.rs;
//! - [`surface`]: what a user sees. cli.rs, client.rs (a daemon's socket),
//!   stats/ (the snapshot as wire data; table.rs: `sluice status`;
//!   metrics.rs: Prometheus text; families.rs: each metric's one
//!   description), endpoint.rs (the metrics endpoint), trace/ (`sluice
//!   trace`: the command; fate.rs: the ledger, latency figures and report).
//!
//! The victim service and the paced sender the tests and the bench run
//! (`sluice-bench serve udp-echo`, `sluice-bench send`) are in the bench's
//! crate: the daemon's binary ships none of them.
//!
//! Beside this crate: `bpf/` (sluice.h, shared with Rust through bindgen;
//! gate.bpf.c and its parts by role in gate/: maps.h, parse.h, bucket.h,
//! sources.h, synack.h, checker.h; steer.bpf.c, trace.bpf.c; classify.h,
//! known.h (the source key, the known maps and the span rule, shared by the
//! gate and the tracer), syncookie.h, kernel.h), `build.rs` (clang to
//! skeletons), `src/main.rs` (the `sluice` command), `tests/` (one binary
//! per topic: docs/testing.md). The bench is the `sluice-bench` crate (its
//! own map is in its lib.rs); what the tests and the bench share (the
//! namespace testbed, crafted frames, sample summaries, the controller's
//! simulated victim, promtool's rules) is the `sluice-testkit` crate, which
//! this library never links. `packaging/` (the unit, the Debian package, an
//! example config), `deploy/` (Prometheus, Grafana, Kubernetes),
//! `scenarios/` (bench scenarios) and `docs/` are at the top.

/// The Rust view of `bpf/sluice.h`, generated by bindgen in build.rs.
pub mod bpf_intf {
    #![allow(non_camel_case_types, non_upper_case_globals, dead_code)]
    include!(concat!(env!("OUT_DIR"), "/sluice_intf.rs"));

    /// SLUICE_CELLS from the header (a macro over an enum, which bindgen does not evaluate).
    pub const SLUICE_CELLS: u32 = SLUICE_SLOT_NR * SLUICE_PORTS_PER_SLOT;

    /// Per-class counters summed over CPUs, indexed by `enum sluice_class_stat`.
    pub type ClassCounters = [u64; SLUICE_CS_NR as usize];
    /// Global counters summed over CPUs, indexed by `enum sluice_global_stat`.
    pub type GlobalCounters = [u64; SLUICE_GS_NR as usize];
}

/// The libbpf skeleton of `bpf/gate.bpf.c`, generated by libbpf-cargo in build.rs.
pub mod gate_skel {
    #![allow(clippy::all, non_camel_case_types, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/gate.skel.rs"));
}

/// The libbpf skeleton of `bpf/steer.bpf.c` (reader steering), generated in build.rs.
pub mod steer_skel {
    #![allow(clippy::all, non_camel_case_types, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/steer.skel.rs"));
}

/// The libbpf skeleton of `bpf/trace.bpf.c` (packet fates and stage latency), generated in build.rs.
pub mod trace_skel {
    #![allow(clippy::all, non_camel_case_types, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/trace.skel.rs"));
}

pub mod base;
pub mod daemon;
pub mod dataplane;
pub mod policy;
pub mod signals;
pub mod surface;
