//! `sluice bench run --scenario dns|http`: real services a user would run,
//! flooded, without sluice and with the daemon a user runs.
//!
//! The victim is Debian's NSD (`dns`, legitimate load: dnsperf at a steady
//! rate plus a 200 queries/s probe that times every answer) or nginx (`http`,
//! legitimate load: wrk, a new connection per request), pinned to CPU 1 of the
//! `nic` model (the IP/UDP/TCP stack runs in softirq there, beside the
//! service). The flood is the bench's BPF generator asked for FLOOD_PPS
//! (more than it reaches: it sends at its top rate), from 16-64 spoofed
//! sources behind A. Four floods, each over IPv4 and IPv6, and the legitimate
//! clients use the flood's family:
//! - `closed-v4`/`closed-v6`: UDP to port 9, where nothing listens;
//! - `own-v4`/`own-v6`: to the service's own port: junk UDP to NSD's port 53
//!   (an all-zero header, answered by NSD or not, it costs NSD a read), a SYN
//!   flood to nginx's port 80 (answered by the kernel's SYN cookies).
//!
//! Configurations, interleaved within each flood and repeat:
//! - `off`: the gate attached with no limit (the generator's live frames need
//!   an XDP program on the receiving veth), no daemon: the kernel alone;
//! - `zero`: `sluice run --iface vb` and nothing else;
//! - `static`: `sluice run --no-discover` with the hand-tuned best classes: the
//!   service's port(s) at priority 0 (NSD capped at its capacity measured by
//!   dnsperf at the start; nginx unlimited), everything else capped at 1k/s;
//! - `blocked`: the service's ports unlimited, everything else blocked: "the
//!   flood blocked entirely", the reference of the `http` target (closed-port
//!   floods only: an own-port flood cannot be told apart by port).
//!
//! Where each part runs is the CPU plan's (`testbed::cpu_plan`). On two CPUs,
//! CPU 0 carries the generator, the legitimate clients and the XDP gate's
//! work (each veth queue's NAPI runs on the CPU that sent into it), unless
//! `--clients-cpu 1` puts the clients beside the service; the clients
//! cannot have a CPU of their own. The generator runs at nice 19, so the
//! clients get the CPU time they ask for and the flood takes what is left (its
//! rate is measured and shown per cell); a cell whose dnsperf still could not
//! send 95% of its asked rate is marked.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::load::gen::{stream_value, StreamSpec};
use crate::load::workers::GenWorker;
use crate::scenarios::matrix::{interleave, Results, Runner};
use crate::testbed::procs::{daemon_softirq_secs, start_daemon, status_after, tree_cpu_secs, Proc};
use crate::testbed::rig::{add_flood_neighbours, attach_gate, FLOOD_SRC_V4, FLOOD_SRC_V6};
use crate::testbed::victim::{link_stats, VictimBed, VictimModel, IF_A, IF_B};
use sluice::base::netns;
use sluice::dataplane::gate::Gate;
use sluice::signals::procfs::{proc_counter, NsFile};

mod bench;
pub mod dns;
pub mod http;
mod report;

use bench::Bench;
pub(crate) use bench::{attach_client_filter, flood_stream, service_drops};
use report::cell_line;
pub use report::{summary, targets, write_all};

/// What the generator is asked for: above its top rate on this VM, so it sends as fast as it can.
pub const FLOOD_PPS: f64 = 8e6;
/// The closed port of the `closed-*` floods.
pub const CLOSED_PORT: u16 = 9;
/// A's filter passes replies to the clients' ephemeral ports (32768 and up);
/// the flood's source ports stay below, so its answers (ICMP errors, NSD's
/// replies, SYN-ACKs) are dropped on A's side and cost the clients nothing.
const CLIENT_PORTS: &str = "32768-65535";

/// The real service a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    Dns,
    Http,
}

impl Service {
    /// The scenario names `bench run --scenario` takes for these.
    pub const ALL: [(Service, &'static str, &'static str); 2] = [
        (
            Service::Dns,
            "dns",
            "NSD + dnsperf under closed-port and own-port UDP floods, IPv4 and IPv6: off / zero / static",
        ),
        (
            Service::Http,
            "http",
            "nginx + wrk under closed-port UDP floods and SYN floods, IPv4 and IPv6: off / zero / static",
        ),
    ];

    pub fn parse(name: &str) -> Option<Service> {
        Service::ALL.iter().find(|s| s.1 == name).map(|s| s.0)
    }

    pub fn name(self) -> &'static str {
        Service::ALL.iter().find(|s| s.0 == self).map_or("?", |s| s.1)
    }

    /// Its classes when configured by hand (`static`, `blocked`): match rules.
    fn matches(self) -> &'static str {
        match self {
            Service::Dns => "match=udp:53,match=tcp:53",
            Service::Http => "match=tcp:80",
        }
    }
}

/// One flood.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Flood {
    pub name: &'static str,
    pub v6: bool,
    /// To the service's own port (else to CLOSED_PORT).
    pub own_port: bool,
    /// Source addresses (UDP floods; a SYN flood uses SYN_SRCS), drawn at
    /// random per frame when more than 16.
    pub srcs: u32,
    /// The legitimate clients run CALM_SECS before the flood starts (so the
    /// service answers them while healthy and they become known); else the
    /// flood starts first.
    pub calm: bool,
    /// TCP segments with these flags (an ACK or RST flood of no connection,
    /// to the service's port, from SYN_SRCS sources); 0: the flood's usual
    /// kind (UDP, or SYNs to nginx's port).
    pub tcp_flags: u8,
    /// Before it floods for good, the flood pulses this many times
    /// (PULSE_ON_SECS on, PULSE_OFF_SECS off) while the clients run: an
    /// attacker trying to be learnt as a known client (0: no pulses).
    pub pulses: u8,
    /// UDP to NSD's port over IPv4: valid queries for its name (NSD answers
    /// each, at a few times the cost of junk), not junk.
    pub queries: bool,
    /// Real connections to nginx from this many of A's addresses
    /// (HEAVY_SRC_V4 and the next), not the generator's frames: an HTTP
    /// flood from a few machines (`http::start_heavy`; 0: not one), each
    /// asking over keep-alive connections or over a new one per request.
    #[serde(default)]
    pub heavy_srcs: u8,
    #[serde(default)]
    pub new_conns: bool,
    /// Beside it, a closed-port flood (`closed-v4`'s: junk to CLOSED_PORT
    /// from 16 sources), each at half the asked rate: an own-port flood
    /// mixed with one the gate can tell by port.
    #[serde(default)]
    pub with_closed: bool,
}

impl Flood {
    /// The flood named `name`.
    pub fn parse(name: &str) -> Result<Flood> {
        let all = || all_floods();
        all().find(|f| f.name == name).copied().ok_or_else(|| {
            let names: Vec<&str> = all().map(|f| f.name).collect();
            anyhow::anyhow!("unknown flood \"{name}\"; valid: {}", names.join(", "))
        })
    }
}

const fn flood(name: &'static str, v6: bool, own_port: bool, srcs: u32, calm: bool) -> Flood {
    Flood {
        name,
        v6,
        own_port,
        srcs,
        calm,
        tcp_flags: 0,
        pulses: 0,
        queries: false,
        heavy_srcs: 0,
        new_conns: false,
        with_closed: false,
    }
}

/// The `http` scenario's ACK, RST and connection floods (by name only, not
/// in the default set): segments of no connection to nginx's port from
/// 65,536 random sources, as the SYN-cookie tests send them (the gate drops
/// them itself while the class's SYN guard answers, engaged by the kernel's
/// drops of them, TCP_FLAGS and TCP_RESET); and real connections from A's
/// own addresses: keep-alive ones from HEAVY_SRCS, pipelining requests
/// (`conns-v4`), and a new one per request from NEWCONN_SRCS (`newconns-v4`),
/// each also after CALM_SECS_HTTP of the light clients alone (`-calm`: the
/// service answered them while calm, so they are known).
pub const TCP_FLOODS: [Flood; 6] = [
    Flood {
        name: "ack-v4",
        v6: false,
        own_port: true,
        srcs: 65_536,
        calm: false,
        tcp_flags: 0x10,
        pulses: 0,
        queries: false,
        heavy_srcs: 0,
        new_conns: false,
        with_closed: false,
    },
    Flood {
        name: "rst-v4",
        v6: false,
        own_port: true,
        srcs: 65_536,
        calm: false,
        tcp_flags: 0x04,
        pulses: 0,
        queries: false,
        heavy_srcs: 0,
        new_conns: false,
        with_closed: false,
    },
    Flood { heavy_srcs: HEAVY_SRCS, ..flood("conns-v4", false, true, HEAVY_SRCS as u32, false) },
    Flood {
        heavy_srcs: NEWCONN_SRCS,
        new_conns: true,
        ..flood("newconns-v4", false, true, NEWCONN_SRCS as u32, false)
    },
    Flood { heavy_srcs: HEAVY_SRCS, ..flood("conns-calm-v4", false, true, HEAVY_SRCS as u32, true) },
    Flood {
        heavy_srcs: NEWCONN_SRCS,
        new_conns: true,
        ..flood("newconns-calm-v4", false, true, NEWCONN_SRCS as u32, true)
    },
];

/// The connection floods' sources: HEAVY_SRC_V4 and the next addresses on A.
pub const HEAVY_SRCS: u8 = 4;
pub const NEWCONN_SRCS: u8 = 32;
pub const HEAVY_SRC_V4: &str = "10.77.0.100";

/// Every flood a scenario can name.
pub fn all_floods() -> impl Iterator<Item = &'static Flood> + Clone {
    FLOODS.iter().chain(&SOURCE_FLOODS).chain(&TCP_FLOODS)
}

/// The `dns` and `http` scenarios' floods.
pub const FLOODS: [Flood; 4] = [
    flood("closed-v4", false, false, 16, false),
    flood("closed-v6", true, false, 16, false),
    flood("own-v4", false, true, 16, false),
    flood("own-v6", true, true, 16, false),
];

/// The `sources` scenario's floods: junk DNS to NSD's port from 1, 16 and
/// 65,536 sources after a calm period, from 65,536 starting first, and from
/// one source that pulses three times beside the clients before it floods;
/// valid queries (q...) from one source, from 65,536 and from one that
/// pulses: NSD answers each, so a flood a few times its capacity is a rate
/// the generator reaches without starving dnsperf on the shared CPU; and
/// the one-source and 65,536-source query floods each mixed with a
/// closed-port flood (`+closed`, half the rate each).
pub const SOURCE_FLOODS: [Flood; 12] = [
    flood("src1-v4", false, true, 1, true),
    flood("src16-v4", false, true, 16, true),
    flood("src64k-v4", false, true, 65_536, true),
    flood("src16-v6", true, true, 16, true),
    flood("src64k-v6", true, true, 65_536, true),
    flood("first64k-v4", false, true, 65_536, false),
    Flood { pulses: 3, ..flood("pulse1-v4", false, true, 1, true) },
    Flood { queries: true, ..flood("q1-v4", false, true, 1, true) },
    Flood { queries: true, ..flood("q64k-v4", false, true, 65_536, true) },
    Flood { queries: true, pulses: 3, ..flood("qpulse1-v4", false, true, 1, true) },
    Flood { queries: true, with_closed: true, ..flood("q1+closed-v4", false, true, 1, true) },
    Flood { queries: true, with_closed: true, ..flood("q64k+closed-v4", false, true, 65_536, true) },
];

/// A pulse of a pulsing flood, and the pause after it (seconds): each pulse
/// is answered for the few ms before the daemon sees it, the pause is as
/// long as the calm the learner waits for (fair.rs, LEARN_CALM_SECS).
pub const PULSE_ON_SECS: f64 = 2.0;
pub const PULSE_OFF_SECS: f64 = 1.0;

/// Sources of a SYN flood, drawn at random per frame (issue 22: 65,536
/// spoofed sources), each with 30,000 source ports: distinct connections.
const SYN_SRCS: u32 = 65_536;
/// Seconds the clients run before a `calm` flood starts: learning needs a
/// healthy second (fair.rs, LEARN_CALM_SECS), then answers.
pub const CALM_SECS: f64 = 3.0;
/// The same for the http scenario's connection floods: the learner's warm
/// and calm seconds, then a second's span, make wrk's address known about
/// when CALM_SECS ends, and the class's known lane needs calm ticks after
/// that; with 3 s the late-answers rule found no known lane in 2 cells of
/// 3 (`conns-calm-v4`, 7286434; a traced run: the lane 0.5 s before the flood).
pub const CALM_SECS_HTTP: f64 = 5.0;
/// A flood's first seconds, before the cell's clients start: a `calm`
/// flood's clients go on through them, and a probe from their address
/// times them (`Cell::onset_answered`; issue 48's target: at least 99%
/// answered in a flood's first 500 ms).
pub const ONSET_SECS: f64 = 0.5;
/// A client that first appears during the flood (the `sources` scenario):
/// a probe from these addresses, added to A. Outside the floods' source
/// ranges and their aggregates (FLOOD_SRC_V4 and the next 65,535 addresses
/// span 10.77.0.10-10.78.0.9; IPv6 fd77:0:0:N::/64): 10.77.0.200 was one of
/// the spoofed addresses, so counting sources by /16 made it one with the
/// flood.
pub const NEW_CLIENT_V4: &str = "10.200.0.200";
pub const NEW_CLIENT_V6: &str = "fd77:ffff::200";
/// The http scenario's light client (the probe: `http::start_probe`), a
/// host of its own beside wrk's, outside the floods' ranges and their
/// aggregates as the new client is.
pub const LIGHT_CLIENT_V4: &str = "10.200.0.201";
pub const LIGHT_CLIENT_V6: &str = "fd77:ffff::201";

/// A local process beside NSD that misbehaves, run as user nobody in the
/// victim's namespace with no flood (do no harm: NSD must not pay for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neighbour {
    /// A UDP socket on NEIGHBOUR_PORT with a 2 KiB buffer that never
    /// reads, filled over loopback (nothing of it crosses the gate).
    FullSocket,
    /// Binds a UDP socket on NEIGHBOUR_PORT and closes it, 100 times a second.
    Churn,
}

/// The neighbours' port, and the load (of NSD's capacity) of their cells.
pub const NEIGHBOUR_PORT: u16 = 7777;
pub const NEIGHBOUR_LOAD: f64 = 0.5;

impl Neighbour {
    pub fn name(self) -> &'static str {
        match self {
            Neighbour::FullSocket => "full-socket",
            Neighbour::Churn => "churn",
        }
    }

    /// The neighbour's Python program, bounded by `secs`.
    fn program(self, secs: f64) -> String {
        let body = match self {
            Neighbour::FullSocket => format!(
                "r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)\n\
                 r.bind(('0.0.0.0', {NEIGHBOUR_PORT}))\n\
                 w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 while time.time() < end:\n    \
                     for _ in range(50): w.sendto(b'x' * 32, ('127.0.0.1', {NEIGHBOUR_PORT}))\n    \
                     time.sleep(0.01)\n"
            ),
            Neighbour::Churn => format!(
                "while time.time() < end:\n    \
                     s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    \
                     s.bind(('0.0.0.0', {NEIGHBOUR_PORT}))\n    \
                     s.close()\n    \
                     time.sleep(0.01)\n"
            ),
        };
        format!("import socket, time\nend = time.time() + {secs}\n{body}")
    }

    /// Start it in `ns` as user nobody; killed when the handle drops.
    fn start(self, ns: &str, secs: f64) -> Result<Proc> {
        let mut c = crate::testbed::procs::in_ns(ns, None);
        c.args(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "python3", "-c"]);
        c.arg(self.program(secs));
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        Proc::spawn(c, "the neighbour (setpriv, python3)")
    }
}

/// A configuration of the victim (see the module comment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Setup {
    #[default]
    Off,
    Zero,
    /// Zero config in observe mode (`--observe`): its gate drops are what
    /// enforcing would have dropped, to compare with `zero`'s.
    Observe,
    Static,
    Blocked,
}

impl Setup {
    pub fn name(self) -> &'static str {
        match self {
            Setup::Off => "off",
            Setup::Zero => "zero",
            Setup::Observe => "observe",
            Setup::Static => "static",
            Setup::Blocked => "blocked",
        }
    }

    /// The configurations measured under `flood` (None: the unflooded reference).
    fn for_flood(flood: Option<&Flood>) -> &'static [Setup] {
        match flood {
            // Unflooded: off and zero config side by side (do no harm).
            None => &[Setup::Off, Setup::Zero],
            Some(f) if f.own_port => &[Setup::Off, Setup::Zero, Setup::Static],
            // Observe mode's prediction beside what enforcing did, where every
            // drop of the service's classes is a client's.
            Some(_) => &[Setup::Off, Setup::Zero, Setup::Static, Setup::Observe, Setup::Blocked],
        }
    }
}

pub struct ServiceOpts {
    pub exe: PathBuf,
    /// Seconds the legitimate clients run per cell.
    pub secs: f64,
    pub repeats: u32,
    /// dnsperf's asked rate (dns).
    pub qps: u64,
    /// wrk's connections (http), and whether they stay open.
    pub conns: u32,
    pub keep_alive: bool,
    /// http: nginx in front of php-fpm (`http::start_php`).
    pub php: bool,
    /// The floods to run (names from FLOODS or SOURCE_FLOODS), in this order.
    pub floods: Vec<Flood>,
    /// The generator's asked flood rate, packets/s (FLOOD_PPS: its top rate).
    pub flood_pps: f64,
    /// The `sources` scenario: `static` gives the legitimate client's
    /// address a class of its own, a new client probes during each flood.
    pub sources: bool,
    /// dns: calm cells (no flood) with dnsperf at these fractions of NSD's
    /// measured capacity, `off` and `zero` side by side (do no harm).
    pub calm_loads: Vec<f64>,
    /// dns: calm cells at NEIGHBOUR_LOAD with a misbehaving local neighbour
    /// beside NSD (see [`Neighbour`]).
    pub neighbours: bool,
    /// The CPU the legitimate clients (dnsperf, the probes, wrk) run on:
    /// the generator's (`cpu_plan`) unless told. On veth the gate runs on
    /// the sender's CPU, so another CPU than the generator's is
    /// another RSS queue: the clients enter where the flood does not.
    pub clients_cpu: usize,
    /// The generator workers' CPUs (`cpu_plan::Plan::generators`, or the
    /// first of them): each sends its share of the flood on its queue.
    pub gen_cpus: Vec<usize>,
    /// Queues of each veth end (`cpu_plan::queues`: one per CPU).
    pub queues: u32,
    /// Set by Ctrl-C: stop after the current cell.
    pub interrupted: Arc<AtomicBool>,
}

/// One measured cell.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// A flood's name, or "none".
    pub flood: String,
    pub config: Setup,
    pub repeat: u32,
    /// Flood packets/s the generator sent (None: no flood).
    pub flood_pps: Option<f64>,
    /// dnsperf's sent queries/s, or wrk's completed requests/s.
    pub client_rate: f64,
    /// dnsperf sent under 95% of its asked rate.
    pub client_short: bool,
    /// Answered share of dnsperf's queries, or wrk's requests / (requests + errors).
    pub success: Option<f64>,
    /// The probe's (dns) or wrk's (http) latency percentiles, ms.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The service's CPU (all its processes), % of one core.
    pub service_cpu: f64,
    /// Frames/s vb's full receive ring refused (va's tx drops): lost before
    /// any XDP program ran, the flood's and the clients' alike (a NIC's ring overflowing).
    #[serde(default)]
    pub ring_drops: f64,
    /// SYN cookies/s the victim's kernel sent (TcpExt SyncookiesSent): the
    /// SYN flood's frames were valid and reached TCP.
    #[serde(default)]
    pub syn_cookies: f64,
    /// The daemon's own CPU (`zero`, `static`, `blocked`), % of one core.
    #[serde(default)]
    pub daemon_cpu: Option<f64>,
    /// Of daemon_cpu, the softirq work the kernel ran while a daemon thread
    /// was on the CPU (charged to it), % of one core; None: not reported.
    #[serde(default)]
    pub daemon_softirq: Option<f64>,
    /// `sources`: the answered share of a probe from an address first seen
    /// during the flood (NEW_CLIENT_V4/V6).
    #[serde(default)]
    pub new_client: Option<f64>,
    /// A `calm` flood: the answered share of a PROBE_QPS probe from the
    /// clients' address over the flood's first ONSET_SECS (before the
    /// cell's clients start; None: no such flood).
    #[serde(default)]
    pub onset_answered: Option<f64>,
    /// Calm cells: dnsperf's asked rate as a fraction of NSD's capacity.
    #[serde(default)]
    pub load: Option<f64>,
    /// Packets of the service's classes the gate dropped in the cell (a
    /// daemon's cells without an own-port flood: then all of them are
    /// legitimate); None where not measured.
    #[serde(default)]
    pub gate_drops: Option<u64>,
    /// Calm cells: of gate_drops, those made while the service had room
    /// (no distress of its sockets); None where not measured.
    #[serde(default)]
    pub dropped_with_room: Option<u64>,
    /// Calm cells: of gate_drops, those the room kept for known clients
    /// made (`dropped_room_pkts`: unknown or over-pace datagrams to a socket
    /// over three quarters full); None where not measured.
    #[serde(default)]
    pub room_drops: Option<u64>,
    /// http: SYNs/s the daemon's gate answered itself (SYN cookies at the
    /// driver); None without a daemon.
    #[serde(default)]
    pub gate_synacks: Option<f64>,
    /// http: the probe's new connections' connect time, ms (a failed or
    /// timed-out connect counts as its 3 s timeout), and how many failed.
    #[serde(default)]
    pub connect_p50_ms: Option<f64>,
    #[serde(default)]
    pub connect_p99_ms: Option<f64>,
    #[serde(default)]
    pub connects_failed: Option<u64>,
    /// http: requests/s answered over the probe's one long-lived connection
    /// (it asks 500/s).
    #[serde(default)]
    pub kept_rps: Option<f64>,
    /// http: the 99th percentile of those requests' times, ms (the light
    /// client's wait; it runs on the clients' CPU, as wrk does). None:
    /// none answered.
    #[serde(default)]
    pub kept_p99_ms: Option<f64>,
    /// The service's answer delay over the cell, as the gate timed it
    /// (bpf/gate/delay.h: from the request's admission to the answer
    /// leaving): median and 99th percentile in ms, each its power-of-two
    /// bucket's upper edge. The service's own classes, every configuration
    /// (off: the pass-through gate's counters); None: none timed.
    #[serde(default)]
    pub answer_p50_ms: Option<f64>,
    #[serde(default)]
    pub answer_p99_ms: Option<f64>,
    /// The same 99th percentile for the known clients' requests alone
    /// (the light clients the service answered while calm): the part of
    /// their wait spent at the server, where their own tools' p99 adds
    /// their CPU's. None: none timed (no daemon knows anyone, or off).
    #[serde(default)]
    pub known_answer_p99_ms: Option<f64>,
    /// The CPU signal: the largest share of a service's CPU that receive
    /// work for lower classes took, over the cell's samples (None: no daemon
    /// or never measured).
    #[serde(default)]
    pub cpu_taken_max: Option<f64>,
    /// Packets/s the gate admitted for the service's classes over the
    /// clients' run (None: no daemon): beside NSD's capacity, whether a
    /// flooded class admits what its service takes.
    #[serde(default)]
    pub admitted_pps: Option<f64>,
    /// Datagrams/s the service's namespace read (its Udp InDatagrams, counted
    /// as the service receives them) over the clients' run: what NSD took of
    /// the flood and the clients. The calibrated capacity is dnsperf's own
    /// top rate (one client process on a shared CPU), which NSD reading a
    /// flood of one cheap query goes far past.
    #[serde(default)]
    pub read_pps: Option<f64>,
    /// Known sources of the service's classes at the cell's end, from the
    /// daemon's last scan (None: no daemon, or no scan yet).
    #[serde(default)]
    pub known: Option<u64>,
    /// Packets of the known clients of the service's classes that the
    /// receive path dropped after the gate admitted them (the daemon's
    /// `known_lost_pkts`, its target 0; None: no daemon or no tracer).
    #[serde(default)]
    pub known_lost: Option<u64>,
    /// A pulsing flood: its source is a known client (a second of answers) in
    /// the daemon's known-clients file after the cell (None: not a pulsing
    /// flood, or no daemon).
    #[serde(default)]
    pub attacker_known: Option<bool>,
    /// The daemon's judge of the service's answers at the cell's end (a
    /// TCP auto class's: its calm p90s, its known clients' share of its
    /// calm arrivals, its rate if engaged, and `engagements`, the times it
    /// engaged during the cell: the rest is its state after the flood):
    /// why a cell engaged or did not. None: no daemon, or no class judged
    /// on its answers.
    #[serde(default)]
    pub late: Option<sluice::surface::stats::LateStatus>,
}

/// What a run's results.json holds besides its cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceHead {
    pub service: Service,
    pub secs: f64,
    pub repeats: u32,
    /// dns: NSD's answered queries/s with dnsperf unpaced (the static cap).
    pub capacity: Option<f64>,
    /// http: wrk kept its connections open (false: a new connection per request).
    #[serde(default)]
    pub keep_alive: bool,
    /// http: nginx handed every request to php-fpm (`--php`).
    #[serde(default)]
    pub php: bool,
    /// The CPUs: the flood's generator, the service, and its legitimate
    /// clients (None: a run from before they were recorded, clients beside
    /// the generator).
    #[serde(default)]
    pub cpus: Option<CpuPlan>,
}

/// Where a run's parts ran (issue 51: the bench's CPU plan).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPlan {
    /// The first generator worker's CPU.
    pub generator: usize,
    pub service: usize,
    pub clients: usize,
    /// Every generator worker's CPU (empty: a run from before workers, one
    /// on `generator`).
    #[serde(default)]
    pub generators: Vec<usize>,
    /// The daemon's CPU (None: where the scheduler put it).
    #[serde(default)]
    pub control: Option<usize>,
    /// Queues of each veth end (None: a run from before they were
    /// recorded, one queue).
    #[serde(default)]
    pub queues: Option<u32>,
}

/// A run: its scenario (dns, http, sources), head and cells.
pub type ServiceRun = Results<ServiceHead, Cell>;

/// Run the scenario: every repeat x flood x configuration, printing a line
/// per cell; writes results.json and summary.txt into `out` as it goes.
pub fn run(svc: Service, o: &ServiceOpts, out: &Path) -> Result<ServiceRun> {
    sluice::dataplane::gate::check_privileges()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let bed = VictimBed::with_queues(svc.name(), VictimModel::Nic, o.queues)?;
    let dir = std::env::temp_dir().join(format!("{}-files", bed.net.b));
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        let b = Bench::start(svc, o, &bed, &dir)?;
        b.run_all(out)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
