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
//! CPU 0 carries the generator, the legitimate clients and the XDP gate's work
//! (veth runs the receiving NAPI on the sending CPU); with two CPUs the clients
//! cannot have a CPU of their own. The generator runs at nice 19, so the
//! clients get the CPU time they ask for and the flood takes what is left (its
//! rate is measured and shown per cell); a cell whose dnsperf still could not
//! send 95% of its asked rate is marked.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::gen::{stream_value, StreamSpec};
use crate::procs::{start_daemon, status_after, tree_cpu_secs, Proc};
use crate::rig::{add_flood_neighbours, attach_gate, FLOOD_SRC_V4, FLOOD_SRC_V6};
use crate::victim::{link_stats, VictimBed, VictimModel, IF_A, IF_B};
use crate::workers::GenWorker;
use crate::{dns, http};
use sluice::gate::Gate;
use sluice::netns;
use sluice::signals::{proc_counter, NsFile};

const GEN_CPU: usize = 0;
const VICTIM_CPU: usize = 1;
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
}

impl Flood {
    /// The flood named `name`.
    pub fn parse(name: &str) -> Result<Flood> {
        let all = || FLOODS.iter().chain(&SOURCE_FLOODS);
        all().find(|f| f.name == name).copied().ok_or_else(|| {
            let names: Vec<&str> = all().map(|f| f.name).collect();
            anyhow::anyhow!("unknown flood \"{name}\"; valid: {}", names.join(", "))
        })
    }
}

const fn flood(name: &'static str, v6: bool, own_port: bool, srcs: u32, calm: bool) -> Flood {
    Flood { name, v6, own_port, srcs, calm }
}

/// The `dns` and `http` scenarios' floods.
pub const FLOODS: [Flood; 4] = [
    flood("closed-v4", false, false, 16, false),
    flood("closed-v6", true, false, 16, false),
    flood("own-v4", false, true, 16, false),
    flood("own-v6", true, true, 16, false),
];

/// The `sources` scenario's floods: junk DNS to NSD's port from 1, 16 and
/// 65,536 sources after a calm period, and from 65,536 starting first.
pub const SOURCE_FLOODS: [Flood; 6] = [
    flood("src1-v4", false, true, 1, true),
    flood("src16-v4", false, true, 16, true),
    flood("src64k-v4", false, true, 65_536, true),
    flood("src16-v6", true, true, 16, true),
    flood("src64k-v6", true, true, 65_536, true),
    flood("first64k-v4", false, true, 65_536, false),
];

/// Sources of a SYN flood, drawn at random per frame (issue 22: 65,536
/// spoofed sources), each with 30,000 source ports: distinct connections.
const SYN_SRCS: u32 = 65_536;
/// Seconds the clients run before a `calm` flood starts: learning needs a
/// healthy second (fair.rs, LEARN_CALM_TICKS), then answers.
pub const CALM_SECS: f64 = 3.0;
/// A client that first appears during the flood (the `sources` scenario):
/// a probe from these addresses, added to A.
pub const NEW_CLIENT_V4: &str = "10.77.0.200";
pub const NEW_CLIENT_V6: &str = "fd77::200";

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
        let mut c = crate::procs::in_ns(ns, None);
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
    Static,
    Blocked,
}

impl Setup {
    pub fn name(self) -> &'static str {
        match self {
            Setup::Off => "off",
            Setup::Zero => "zero",
            Setup::Static => "static",
            Setup::Blocked => "blocked",
        }
    }

    /// The configurations measured under `flood` (None: the unflooded reference).
    fn for_flood(flood: Option<&Flood>) -> &'static [Setup] {
        match flood {
            None => &[Setup::Off],
            Some(f) if f.own_port => &[Setup::Off, Setup::Zero, Setup::Static],
            Some(_) => &[Setup::Off, Setup::Zero, Setup::Static, Setup::Blocked],
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
    /// wrk's connections (http).
    pub conns: u32,
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
    /// `sources`: the answered share of a probe from an address first seen
    /// during the flood (NEW_CLIENT_V4/V6).
    #[serde(default)]
    pub new_client: Option<f64>,
    /// Calm cells: dnsperf's asked rate as a fraction of NSD's capacity.
    #[serde(default)]
    pub load: Option<f64>,
    /// Packets of the service's classes the gate dropped in the cell (a
    /// daemon's cells without an own-port flood: then all of them are
    /// legitimate); None where not measured.
    #[serde(default)]
    pub gate_drops: Option<u64>,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceRun {
    pub service: Service,
    pub secs: f64,
    pub repeats: u32,
    /// dns: NSD's answered queries/s with dnsperf unpaced (the static cap).
    pub capacity: Option<f64>,
    pub cells: Vec<Cell>,
}

/// Run the scenario: every repeat x flood x configuration, printing a line
/// per cell; writes results.json and summary.txt into `out` as it goes.
pub fn run(svc: Service, o: &ServiceOpts, out: &Path) -> Result<ServiceRun> {
    sluice::gate::check_privileges()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let bed = VictimBed::create(svc.name(), VictimModel::Nic, GEN_CPU, VICTIM_CPU)?;
    let dir = std::env::temp_dir().join(format!("{}-files", bed.net.b));
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        let b = Bench::start(svc, o, &bed, &dir)?;
        b.run_all(out)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The running testbed of one scenario.
struct Bench<'a> {
    svc: Service,
    o: &'a ServiceOpts,
    bed: &'a VictimBed,
    dir: &'a Path,
    service: Proc,
    gen: GenWorker,
    capacity: Option<f64>,
    _filter: Gate,
}

/// What carries the configuration during a cell.
enum Installed {
    /// The pass-through gate, attached while held.
    Pass {
        _gate: Box<Gate>,
    },
    Daemon(Proc, PathBuf),
}

impl<'a> Bench<'a> {
    fn start(svc: Service, o: &'a ServiceOpts, bed: &'a VictimBed, dir: &'a Path) -> Result<Bench<'a>> {
        add_flood_neighbours(bed, 64)?;
        if o.sources {
            add_new_client(bed)?;
        }
        let filter = attach_client_filter(bed)?;
        // The nic model's receive side: the stack on the victim CPU (RPS), beside the service.
        bed.net
            .write_in_b(&format!("/sys/class/net/{IF_B}/queues/rx-0/rps_cpus"), &format!("{:x}", 1u64 << VICTIM_CPU))?;
        let (a, b) = (&bed.net.a, &bed.net.b);
        let service = match svc {
            Service::Dns => {
                let addrs = [bed.net.ip_b.to_string(), bed.net.ip6_b.to_string()];
                dns::start_nsd(dir, b, VICTIM_CPU, &addrs, (a, GEN_CPU))?
            }
            Service::Http => http::start_nginx(dir, b, VICTIM_CPU, a, bed.net.ip_b)?,
        };
        // At nice 19: the clients on its CPU send what they ask; the flood takes the rest.
        let gen = GenWorker::start(a, GEN_CPU, bed.net.ifindex_a, 19)?;
        eprintln!(
            "== {}: namespaces {a} (clients, generator: CPU {GEN_CPU}) and {b} ({}, CPU {VICTIM_CPU}, nic model)",
            svc.name(),
            if svc == Service::Dns { "NSD" } else { "nginx" }
        );
        let mut bench = Bench { svc, o, bed, dir, service, gen, capacity: None, _filter: filter };
        if svc == Service::Dns {
            bench.capacity = Some(bench.dns_capacity()?);
        }
        Ok(bench)
    }

    /// NSD's answered queries/s with dnsperf unpaced for 2 s (dnsperf's own
    /// CPU may be the limit: then this is below NSD's true capacity, and the
    /// static cap only safer).
    fn dns_capacity(&self) -> Result<f64> {
        let p = dns::spawn_dnsperf(&self.bed.net.a, GEN_CPU, self.dir, &self.bed.net.ip_b.to_string(), None, 2.0)?;
        let perf = dns::finish_dnsperf(p, self.dir, 2.0)?;
        let cap = perf.completed as f64 / 2.0;
        eprintln!("== NSD capacity (dnsperf unpaced, 2 s): {}/s answered; the static cap", sluice::stats::human(cap));
        Ok(cap)
    }

    fn run_all(&self, out: &Path) -> Result<ServiceRun> {
        let mut r = ServiceRun {
            service: self.svc,
            secs: self.o.secs,
            repeats: self.o.repeats,
            capacity: self.capacity,
            cells: vec![],
        };
        let floods: Vec<Option<&Flood>> = std::iter::once(None).chain(self.o.floods.iter().map(Some)).collect();
        let mut shown_status = false;
        for repeat in 0..self.o.repeats {
            let neighbours: &[Option<Neighbour>] =
                if self.o.neighbours { &[None, Some(Neighbour::FullSocket), Some(Neighbour::Churn)] } else { &[None] };
            let calm = self.o.calm_loads.iter().map(|&l| (l, None));
            let beside = neighbours.iter().flatten().map(|&n| (NEIGHBOUR_LOAD, Some(n)));
            for (load, neighbour) in calm.chain(beside) {
                for setup in [Setup::Off, Setup::Zero] {
                    if self.o.interrupted.load(Ordering::Relaxed) {
                        bail!("interrupted");
                    }
                    let cell = self.calm_cell(load, neighbour, setup, repeat)?;
                    eprintln!("[{}/{}] {}", repeat + 1, self.o.repeats, cell_line(self.svc, &cell));
                    r.cells.push(cell);
                    write_all(&r, out)?;
                }
            }
            for flood in &floods {
                for &setup in Setup::for_flood(*flood) {
                    if self.o.interrupted.load(Ordering::Relaxed) {
                        bail!("interrupted");
                    }
                    let show = !shown_status && setup == Setup::Zero;
                    shown_status |= show;
                    let cell = self.cell(*flood, setup, repeat, show)?;
                    eprintln!("[{}/{}] {}", repeat + 1, self.o.repeats, cell_line(self.svc, &cell));
                    r.cells.push(cell);
                    write_all(&r, out)?;
                }
            }
        }
        Ok(r)
    }

    /// A calm cell (do no harm): no flood, dnsperf at `load` times NSD's
    /// measured capacity, a misbehaving neighbour beside NSD if asked, and
    /// what the gate dropped of the service's classes.
    fn calm_cell(&self, load: f64, neighbour: Option<Neighbour>, setup: Setup, repeat: u32) -> Result<Cell> {
        let qps = (load * self.capacity.unwrap_or(self.o.qps as f64)).round().max(1.0) as u64;
        // Before the daemon, as a service already running would be (discovery finds it at start).
        let _neighbour = neighbour.map(|n| n.start(&self.bed.net.b, self.o.secs + 5.0)).transpose()?;
        std::thread::sleep(Duration::from_millis(300));
        let installed = self.install(setup)?;
        let daemon = match &installed {
            Installed::Daemon(p, _) => Some((p.id(), tree_cpu_secs(p.id()))),
            Installed::Pass { .. } => None,
        };
        let (cpu0, t0) = (tree_cpu_secs(self.service.id()), Instant::now());
        let mut cell = self.dns_clients_at(false, self.o.secs, qps)?;
        let secs_run = t0.elapsed().as_secs_f64();
        cell.service_cpu = 100.0 * (tree_cpu_secs(self.service.id()) - cpu0) / secs_run;
        cell.daemon_cpu = daemon.map(|(pid, c0)| 100.0 * (tree_cpu_secs(pid) - c0) / secs_run);
        cell.gate_drops = match &installed {
            Installed::Daemon(_, sock) => Some(service_drops(&self.o.exe, &self.bed.net.b, sock)?),
            Installed::Pass { .. } => None,
        };
        self.uninstall(installed)?;
        cell.flood =
            format!("calm-{:.0}{}", load * 100.0, neighbour.map_or(String::new(), |n| format!("+{}", n.name())));
        (cell.config, cell.repeat, cell.load) = (setup, repeat, Some(load));
        Ok(cell)
    }

    /// One cell: the configuration, the flood from 0.5 s before the clients
    /// to their end (a `calm` flood: after the clients ran CALM_SECS alone),
    /// the clients for `secs`.
    fn cell(&self, flood: Option<&Flood>, setup: Setup, repeat: u32, show_status: bool) -> Result<Cell> {
        let installed = self.install(setup)?;
        let secs = self.o.secs;
        if flood.is_some_and(|f| f.calm) {
            self.dns_clients(flood.is_some_and(|f| f.v6), CALM_SECS)?;
        }
        let gen = match flood {
            Some(f) => {
                let spec = self.flood_stream(f);
                let v = stream_value(&spec, self.bed.net.mac_b, self.bed.net.mac_a)?;
                self.gen.gen.write().unwrap().set_streams(&[v])?;
                let rx = self.gen.send_for(Duration::from_secs_f64(secs + 1.5), crate::gen::DEFAULT_BATCH);
                std::thread::sleep(Duration::from_millis(500));
                Some(rx)
            }
            None => None,
        };
        let status = match (&installed, show_status) {
            (Installed::Daemon(_, sock), true) => {
                Some(status_after(&self.o.exe, &self.bed.net.b, sock, Duration::from_secs_f64(secs / 2.0)))
            }
            _ => None,
        };
        let v6 = flood.is_some_and(|f| f.v6);
        let ring0 = link_stats(&self.bed.net.a, IF_A)?.tx_dropped;
        let mut netstat = NsFile::open(&self.bed.net.b, "netstat")?;
        let cookies0 = proc_counter(&netstat.read()?, "TcpExt:", "SyncookiesSent");
        let daemon = match &installed {
            Installed::Daemon(p, _) => Some(p.id()),
            Installed::Pass { .. } => None,
        };
        let daemon0 = daemon.map(tree_cpu_secs);
        let (cpu0, t0) = (tree_cpu_secs(self.service.id()), Instant::now());
        let newcomer = (self.o.sources && flood.is_some()).then(|| self.new_client(v6));
        let mut cell = match self.svc {
            Service::Dns => self.dns_clients(v6, secs)?,
            Service::Http => self.http_clients(v6)?,
        };
        if let Some(t) = newcomer {
            let probe = t.join().map_err(|_| anyhow::anyhow!("the new client's probe panicked"))??;
            cell.new_client = probe.answered_share();
        }
        let secs_run = t0.elapsed().as_secs_f64();
        cell.service_cpu = 100.0 * (tree_cpu_secs(self.service.id()) - cpu0) / secs_run;
        cell.daemon_cpu = daemon.zip(daemon0).map(|(pid, c0)| 100.0 * (tree_cpu_secs(pid) - c0) / secs_run);
        cell.ring_drops = link_stats(&self.bed.net.a, IF_A)?.tx_dropped.saturating_sub(ring0) as f64 / secs_run;
        let cookies = proc_counter(&netstat.read()?, "TcpExt:", "SyncookiesSent").saturating_sub(cookies0);
        cell.syn_cookies = cookies as f64 / secs_run;
        if let Some(st) = status.and_then(|t| t.join().ok()).transpose()? {
            eprintln!("== sluice status during the {} flood (zero config):\n{st}", flood.map_or("", |f| f.name));
        }
        if let Some(rx) = gen {
            let (counts, gsecs) = rx.recv().context("the generator thread ended")??;
            cell.flood_pps = Some(counts[0].sent as f64 / gsecs.max(1e-9));
        }
        if let (Installed::Daemon(_, sock), Service::Http) = (&installed, self.svc) {
            cell.gate_synacks = Some(gate_synacks(&self.o.exe, &self.bed.net.b, sock)? as f64 / secs_run);
        }
        if let (Installed::Daemon(_, sock), true) = (&installed, flood.is_some_and(|f| !f.own_port)) {
            // The flood goes to another class: every drop of the service's classes is a client's.
            cell.gate_drops = Some(service_drops(&self.o.exe, &self.bed.net.b, sock)?);
        }
        self.uninstall(installed)?;
        cell.flood = flood.map_or("none", |f| f.name).into();
        cell.config = setup;
        cell.repeat = repeat;
        Ok(cell)
    }

    fn flood_stream(&self, f: &Flood) -> StreamSpec {
        StreamSpec { rate: self.o.flood_pps, ..flood_stream(&self.bed.net, self.svc, f) }
    }

    /// Put `setup` in place on vb.
    fn install(&self, setup: Setup) -> Result<Installed> {
        let svc_class = format!("svc:priority=0,{}", self.svc.matches());
        let args: Vec<String> = match setup {
            Setup::Off => {
                let g = attach_gate(&self.bed.net.b, IF_B, vec![svc_class])?;
                return Ok(Installed::Pass { _gate: Box::new(g) });
            }
            Setup::Zero => vec![],
            Setup::Static => {
                let cap = self.capacity.map(|c| format!("rate={},", c.round().max(1.0) as u64)).unwrap_or_default();
                let svc = format!("svc:priority=1,{cap}{}", self.svc.matches());
                let mut args: Vec<String> =
                    ["--no-discover", "--class", &svc, "--class", "default:rate=1k"].map(String::from).to_vec();
                if self.o.sources {
                    // The hand-tuned best against an own-port flood: the resolver's address first.
                    let (a4, a6) = (self.bed.net.ip_a, self.bed.net.ip6_a);
                    args.push("--class".into());
                    args.push(format!("resolver:priority=0,match=udp:53@{a4}/32,match=udp:53@{a6}/128"));
                }
                args
            }
            Setup::Blocked => {
                ["--no-discover", "--class", &svc_class, "--class", "default:rate=blocked"].map(String::from).to_vec()
            }
        };
        let sock = self.dir.join("sluice.sock");
        let p = start_daemon(&self.o.exe, &self.bed.net.b, IF_B, &sock, &args, &self.dir.join("sluice-run.log"))?;
        // Zero config: the first discovery is at start; a tick or two for the first rates.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Installed::Daemon(p, sock))
    }

    fn uninstall(&self, i: Installed) -> Result<()> {
        if let Installed::Daemon(p, _) = i {
            if let Err(e) = p.terminate("sluice run").map(drop) {
                let log = std::fs::read_to_string(self.dir.join("sluice-run.log")).unwrap_or_default();
                bail!("{e:#}\n{log}");
            }
        }
        Ok(())
    }

    /// A PROBE_QPS probe for `secs` from an address the service never saw before the flood.
    fn new_client(&self, v6: bool) -> std::thread::JoinHandle<Result<dns::Probe>> {
        let net = &self.bed.net;
        let (bind, server) = if v6 { (NEW_CLIENT_V6, net.ip6_b) } else { (NEW_CLIENT_V4, net.ip_b) };
        let (ns, secs) = (net.a.clone(), self.o.secs);
        let bind: std::net::IpAddr = bind.parse().expect("an address");
        std::thread::spawn(move || {
            dns::probe_bound(&ns, GEN_CPU, Some(bind), std::net::SocketAddr::new(server, 53), dns::PROBE_QPS, secs)
        })
    }

    /// dnsperf at the scenario's rate and the probe, side by side, for `secs`.
    fn dns_clients(&self, v6: bool, secs: f64) -> Result<Cell> {
        self.dns_clients_at(v6, secs, self.o.qps)
    }

    /// dnsperf at `qps` and the probe, side by side, for `secs`.
    fn dns_clients_at(&self, v6: bool, secs: f64, qps: u64) -> Result<Cell> {
        let net = &self.bed.net;
        let server = if v6 { net.ip6_b } else { net.ip_b };
        let (p, probe) = dns::clients(&net.a, GEN_CPU, self.dir, server, qps, secs)?;
        Ok(Cell {
            client_rate: p.sent_qps,
            client_short: p.sent_qps < 0.95 * qps as f64,
            success: (p.sent > 0).then(|| p.completed as f64 / p.sent as f64),
            p50_ms: sluice::summary::percentile(&probe.rtt_ms, 0.5),
            p99_ms: sluice::summary::percentile(&probe.rtt_ms, 0.99),
            ..Cell::default()
        })
    }

    /// wrk for `secs`, and beside it the probe (connect times, a long-lived connection).
    fn http_clients(&self, v6: bool) -> Result<Cell> {
        let net = &self.bed.net;
        let addr = if v6 { net.ip6_b } else { net.ip_b };
        let probe = http::start_probe(&net.a, GEN_CPU, addr, self.o.secs);
        let w = http::run_wrk(&net.a, GEN_CPU, addr, self.o.conns, self.o.secs)?;
        let p = probe.join().map_err(|_| anyhow::anyhow!("the http probe panicked"))??;
        let tried = w.requests + w.errors;
        let timeout_ms = http::CONNECT_TIMEOUT.as_secs_f64() * 1e3;
        let mut connects: Vec<f64> =
            p.connect_ms.iter().copied().chain((0..p.connect_failed).map(|_| timeout_ms)).collect();
        connects.sort_by(f64::total_cmp);
        Ok(Cell {
            client_rate: w.rps,
            success: (tried > 0).then(|| w.requests as f64 / tried as f64),
            p50_ms: w.p50_ms,
            p99_ms: w.p99_ms,
            connect_p50_ms: sluice::summary::percentile(&connects, 0.5),
            connect_p99_ms: sluice::summary::percentile(&connects, 0.99),
            connects_failed: Some(p.connect_failed),
            kept_rps: p.kept_rps(),
            ..Cell::default()
        })
    }
}

/// A's filter: it passes replies to the clients' ports and drops the rest
/// (the victim's ICMP errors to the flood's spoofed sources, ...), so the
/// generator's CPU spends nothing on them.
pub(crate) fn attach_client_filter(bed: &VictimBed) -> Result<Gate> {
    attach_gate(
        &bed.net.a,
        IF_A,
        vec![
            format!("clients:match=udp:{CLIENT_PORTS},match=tcp:{CLIENT_PORTS}"),
            "default:rate=blocked,match=icmp,match=icmpv6".into(),
        ],
    )
}

/// A flood's stream: UDP to the closed port or NSD's port, or SYNs to nginx's.
pub(crate) fn flood_stream(net: &sluice::testbed::Testbed, svc: Service, f: &Flood) -> StreamSpec {
    let (src, dst) = if f.v6 {
        (FLOOD_SRC_V6.parse().expect("an address"), net.ip6_b)
    } else {
        (FLOOD_SRC_V4.parse().expect("an address"), net.ip_b)
    };
    let syn = f.own_port && svc == Service::Http;
    let dport = match (f.own_port, svc) {
        (false, _) => CLOSED_PORT,
        (true, Service::Dns) => 53,
        (true, Service::Http) => http::PORT,
    };
    // Many source ports and addresses for SYNs (distinct connections), below the clients' ports.
    let (sport, flows, srcs) = if syn { (1024, 30_000, SYN_SRCS) } else { (20_000, 64, f.srcs) };
    StreamSpec {
        name: f.name.into(),
        rate: FLOOD_PPS,
        frame_len: if syn && f.v6 { 80 } else { 64 },
        src: std::net::SocketAddr::new(src, sport),
        flows,
        srcs,
        random_srcs: srcs > 16,
        dst: std::net::SocketAddr::new(dst, dport),
        dports: 1,
        stamp: false,
        syn,
    }
}

/// Packets the daemon's gate dropped of every class but the default one
/// (the service's classes), since it started.
pub(crate) fn service_drops(exe: &Path, ns: &str, sock: &Path) -> Result<u64> {
    let snap = daemon_status(exe, ns, sock)?;
    Ok(snap.classes.iter().filter(|c| c.name != "default").map(|c| c.totals.dropped_pkts()).sum())
}

/// SYNs the daemon's gate answered with a cookie SYN-ACK since it started, all classes.
fn gate_synacks(exe: &Path, ns: &str, sock: &Path) -> Result<u64> {
    Ok(daemon_status(exe, ns, sock)?.classes.iter().map(|c| c.totals.synack_pkts).sum())
}

fn daemon_status(exe: &Path, ns: &str, sock: &Path) -> Result<sluice::stats::Snapshot> {
    let out = crate::procs::in_ns(ns, None).arg(exe).args(["status", "--json", "--socket"]).arg(sock).output()?;
    Ok(serde_json::from_value(crate::procs::json_of(out, "sluice status")?)?)
}

/// The new client's addresses on A: deprecated (preferred_lft 0), so the
/// other clients never pick them as their source, and known to B as
/// neighbours (A's filter blocks ICMPv6, so B could not resolve them).
fn add_new_client(bed: &VictimBed) -> Result<()> {
    let (a, b) = (&bed.net.a, &bed.net.b);
    let mac = sluice::testbed::format_mac(bed.net.mac_a);
    for (ip, len) in [(NEW_CLIENT_V4, 24), (NEW_CLIENT_V6, 64)] {
        let addr = format!("{ip}/{len}");
        netns::sh(&["ip", "-n", a, "addr", "add", &addr, "dev", IF_A, "nodad", "preferred_lft", "0"])?;
        netns::sh(&["ip", "-n", b, "neigh", "replace", ip, "lladdr", &mac, "dev", IF_B, "nud", "permanent"])?;
    }
    Ok(())
}

fn pct(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{:.2}%", 100.0 * v))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| if v < 10.0 { format!("{v:.2} ms") } else { format!("{v:.0} ms") })
}

/// A cell as one progress line.
fn cell_line(svc: Service, c: &Cell) -> String {
    let rate = sluice::stats::human(c.client_rate);
    format!(
        "{:<11} {:<7} flood {:>6}/s (ring drops {}/s, SYN cookies {}/s)  {} {rate}{}/s  ok {}{}  p50 {}  p99 {}  service CPU {:.0}%  sluice CPU {}",
        c.flood,
        c.config.name(),
        c.flood_pps.map_or("-".into(), sluice::stats::human),
        sluice::stats::human(c.ring_drops),
        sluice::stats::human(c.syn_cookies),
        if svc == Service::Dns { "dnsperf sent" } else { "wrk" },
        if c.client_short { " (!)" } else { "" },
        pct(c.success),
        c.new_client.map_or(String::new(), |n| format!("  new client {}", pct(Some(n)))),
        ms(c.p50_ms),
        ms(c.p99_ms),
        c.service_cpu,
        c.daemon_cpu.map_or("-".into(), |v| format!("{v:.1}%"))
    )
}

/// The calm cells' names (no flood: `calm-N`, `calm-N+neighbour`), in run order.
fn calm_names(r: &ServiceRun) -> Vec<&str> {
    let mut names: Vec<&str> = vec![];
    for c in r.cells.iter().filter(|c| c.load.is_some()) {
        if !names.contains(&c.flood.as_str()) {
            names.push(&c.flood);
        }
    }
    names
}

/// The cells of (flood, config) across repeats.
fn group<'c>(r: &'c ServiceRun, flood: &str, config: Setup) -> Vec<&'c Cell> {
    r.cells.iter().filter(|c| c.flood == flood && c.config == config).collect()
}

/// Median of a field over cells (None if any cell lacks it: a missing value is not dropped).
fn med(cells: &[&Cell], f: impl Fn(&Cell) -> Option<f64>) -> Option<f64> {
    let v: Option<Vec<f64>> = cells.iter().map(|c| f(c)).collect();
    sluice::summary::median(&v?)
}

/// "median (min-max)" of a field, or just the median with one repeat.
fn spread(cells: &[&Cell], f: impl Fn(&Cell) -> Option<f64>, show: impl Fn(Option<f64>) -> String) -> String {
    let v: Vec<f64> = cells.iter().filter_map(|c| f(c)).collect();
    let m = show(med(cells, &f));
    if v.len() < 2 {
        return m;
    }
    let (lo, hi) =
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    format!("{m} ({}-{})", show(Some(lo)), show(Some(hi)))
}

/// The table (medians over repeats, spread of the key figure), then the targets.
pub fn summary(r: &ServiceRun) -> String {
    let dns = r.service == Service::Dns;
    let mut s = format!(
        "\nscenario {} ({} s per cell, {} repeat(s), medians; (min-max) over repeats){}\n",
        r.service.name(),
        r.secs,
        r.repeats,
        r.capacity.map_or(String::new(), |c| format!("; NSD capacity {}/s", sluice::stats::human(c)))
    );
    s += &format!(
        "{:<10} {:<8} {:>8} {:>8} {:>12} {:>24} {:>9} {:>9} {:>8} {:>10}{}\n",
        "flood",
        "config",
        "flood/s",
        "ring/s",
        if dns { "dnsperf/s" } else { "requests/s" },
        if dns { "answered" } else { "ok" },
        "p50",
        "p99",
        "svc CPU",
        "sluice CPU",
        if dns { "" } else { "  cookies/s  gate SYN-ACKs/s    connect p50/p99  kept/s" }
    );
    let calm = calm_names(r);
    let names =
        calm.iter().copied().chain(std::iter::once("none")).chain(FLOODS.iter().chain(&SOURCE_FLOODS).map(|f| f.name));
    for flood in names {
        let f = FLOODS.iter().chain(&SOURCE_FLOODS).find(|x| x.name == flood);
        let setups = if calm.contains(&flood) { &[Setup::Off, Setup::Zero][..] } else { Setup::for_flood(f) };
        for &setup in setups {
            let cells = group(r, flood, setup);
            if cells.is_empty() {
                continue;
            }
            let short = if cells.iter().any(|c| c.client_short) { " (!)" } else { "" };
            let key = if dns {
                spread(&cells, |c| c.success, pct)
            } else {
                spread(&cells, |c| Some(c.client_rate), |v| v.map_or("n/a".into(), sluice::stats::human))
            };
            s += &format!(
                "{:<10} {:<8} {:>8} {:>8} {:>12} {:>24} {:>9} {:>9} {:>7.0}% {:>10}{}\n",
                flood,
                setup.name(),
                med(&cells, |c| c.flood_pps).map_or("-".into(), sluice::stats::human),
                ring_cell(&cells),
                format!("{}{short}", med(&cells, |c| Some(c.client_rate)).map_or("n/a".into(), sluice::stats::human)),
                if dns { key } else { format!("{key} {}", pct(med(&cells, |c| c.success))) },
                ms(med(&cells, |c| c.p50_ms)),
                ms(med(&cells, |c| c.p99_ms)),
                med(&cells, |c| Some(c.service_cpu)).unwrap_or(0.0),
                med(&cells, |c| c.daemon_cpu).map_or("-".into(), |v| format!("{v:.1}%")),
                if r.cells.iter().any(|c| c.new_client.is_some()) {
                    format!("  new client {}", spread(&cells, |c| c.new_client, pct))
                } else if dns {
                    String::new()
                } else {
                    let human = |v: Option<f64>| v.map_or("-".into(), sluice::stats::human);
                    format!(
                        "{:>11} {:>16} {:>18} {:>7}",
                        human(med(&cells, |c| Some(c.syn_cookies))),
                        human(med(&cells, |c| c.gate_synacks)),
                        format!("{}/{}", ms(med(&cells, |c| c.connect_p50_ms)), ms(med(&cells, |c| c.connect_p99_ms))),
                        human(med(&cells, |c| c.kept_rps))
                    )
                }
            );
        }
    }
    if dns {
        s += "(!) = dnsperf sent under 95% of its asked rate in a repeat (CPU 0 is shared with the generator and the gate's work)\n";
        s += "answered = dnsperf's completed/sent; p50/p99 = a separate 200 queries/s probe timing each answer\n";
    } else {
        s += "requests/s = wrk's completed requests (a new connection each); ok = requests / (requests + errors)\n";
        s += "cookies/s = SYN cookies the victim's kernel sent (TcpExt SyncookiesSent): SYNs it answered without queueing;\n";
        s += "  gate SYN-ACKs/s = SYNs the gate answered itself with a cookie (SYN cookies at the driver; - = no daemon)\n";
        s += "connect p50/p99 = a probe's new connection every 10 ms, timed to the handshake's end (a failed one counts as its 3 s timeout);\n";
        s += "  kept/s = requests/s answered over the probe's one long-lived connection, which asks 500/s\n";
    }
    if !calm.is_empty() {
        s += "calm-N = no flood, dnsperf asked N% of NSD's measured capacity (do no harm: zero config must answer what off answers)\n";
    }
    s += "svc CPU / sluice CPU = the service's / the daemon's processes, % of one core (the daemon: its tick, discovery, statistics)\n";
    s += "ring/s = frames/s vb's full ring refused before any XDP ran (flood and clients alike: the CPU 0 NAPI is saturated);\n";
    s += "  (*) = over RING_MARK of the frames never reached the gate: no gate could have saved that cell (lower --flood-rate)\n";
    s + &targets(r)
}

/// A cell whose ring refused over this share of what was sent is marked:
/// the gate never saw those frames.
const RING_MARK: f64 = 0.05;

/// The ring/s column: the median ring drops, marked (*) where they were
/// over RING_MARK of the flood the generator sent in a repeat.
fn ring_cell(cells: &[&Cell]) -> String {
    let over = cells.iter().any(|c| c.flood_pps.is_some_and(|f| c.ring_drops > RING_MARK * f));
    let v = med(cells, |c| Some(c.ring_drops)).map_or("-".into(), sluice::stats::human);
    if over {
        format!("{v} (*)")
    } else {
        v
    }
}

/// A target's verdict; a missing figure is "not measured".
fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "MET",
        Some(false) => "MISSED",
        None => "not measured",
    }
}

/// The targets, each MET or MISSED with its figures; a missing figure is "not measured".
pub fn targets(r: &ServiceRun) -> String {
    let mut s = String::from("targets (zero config):\n");
    let calm = calm_names(r);
    for name in calm {
        let (off, zero) = (group(r, name, Setup::Off), group(r, name, Setup::Zero));
        let (a_off, a_zero) = (med(&off, |c| c.success), med(&zero, |c| c.success));
        let drops: Option<u64> = zero.iter().map(|c| c.gate_drops).sum();
        s += &format!(
            "  dns {name} (no flood): answered {} vs {} off (>= off - 0.1 point: {}); gate dropped {} of the service's packets (0: {})\n",
            pct(a_zero),
            pct(a_off),
            verdict(a_zero.zip(a_off).map(|(z, o)| z >= o - 0.001)),
            drops.map_or("n/a".into(), |d| d.to_string()),
            verdict(drops.map(|d| d == 0))
        );
    }
    let base = format!("calm-{:.0}", NEIGHBOUR_LOAD * 100.0);
    for n in [Neighbour::FullSocket, Neighbour::Churn] {
        let name = format!("{base}+{}", n.name());
        let with = med(&group(r, &name, Setup::Zero), |c| c.success);
        let without = med(&group(r, &base, Setup::Zero), |c| c.success);
        if with.is_none() {
            continue;
        }
        s += &format!(
            "  dns {name}: zero config answered {} beside the neighbour vs {} without it (within 0.1 point: {})\n",
            pct(with),
            pct(without),
            verdict(with.zip(without).map(|(w, o)| w >= o - 0.001))
        );
    }
    let calm_p99 = med(&group(r, "none", Setup::Off), |c| c.p99_ms);
    let ran = |f: &&Flood| r.cells.iter().any(|c| c.flood == f.name);
    for f in FLOODS.iter().filter(ran).filter(|f| !f.own_port) {
        let zero = group(r, f.name, Setup::Zero);
        if r.service == Service::Dns {
            let (ans, p99) = (med(&zero, |c| c.success), med(&zero, |c| c.p99_ms));
            // The gate's own drops of the clients' queries, as a share of what dnsperf sent.
            let sent: f64 = zero.iter().map(|c| c.client_rate * r.secs).sum();
            let dropped: Option<u64> = zero.iter().map(|c| c.gate_drops).sum();
            let share = dropped.filter(|_| sent > 0.0).map(|d| d as f64 / sent);
            s += &format!(
                "  dns {}: answered {} (>= 99.9%: {}); p99 {} vs {} unflooded (within 2x: {}); gate dropped {} of the clients' queries (<= 0.05%: {})\n",
                f.name,
                pct(ans),
                verdict(ans.map(|a| a >= 0.999)),
                ms(p99),
                ms(calm_p99),
                verdict(p99.zip(calm_p99).map(|(p, c)| p <= 2.0 * c)),
                share.map_or("n/a".into(), |x| format!("{:.3}%", 100.0 * x)),
                verdict(share.map(|x| x <= 0.0005))
            );
        } else {
            let z = med(&zero, |c| Some(c.client_rate));
            let blocked = med(&group(r, f.name, Setup::Blocked), |c| Some(c.client_rate));
            let ratio = z.zip(blocked).filter(|(_, b)| *b > 0.0).map(|(z, b)| z / b);
            s += &format!(
                "  http {}: {} requests/s, {} of the flood blocked entirely (>= 90%: {})\n",
                f.name,
                z.map_or("n/a".into(), sluice::stats::human),
                pct(ratio),
                verdict(ratio.map(|x| x >= 0.9))
            );
        }
    }
    for f in SOURCE_FLOODS.iter().filter(ran) {
        let zero = group(r, f.name, Setup::Zero);
        let (ans, new) = (med(&zero, |c| c.success), med(&zero, |c| c.new_client));
        let goal = if f.srcs <= 16 { 0.999 } else { 0.99 };
        let target = if f.calm {
            format!(">= {}: {}", pct(Some(goal)), verdict(ans.map(|a| a >= goal)))
        } else {
            "the flood came first, nobody was known: reported".into()
        };
        s += &format!(
            "  sources {}: {} answered ({target}); a client new during the flood: {} answered (reported)\n",
            f.name,
            pct(ans),
            pct(new)
        );
    }
    if r.service == Service::Http {
        for f in FLOODS.iter().filter(ran).filter(|f| f.own_port) {
            let z = med(&group(r, f.name, Setup::Zero), |c| Some(c.client_rate));
            let off = med(&group(r, f.name, Setup::Off), |c| Some(c.client_rate));
            let ratio = z.zip(off).filter(|(_, o)| *o > 0.0).map(|(z, o)| z / o);
            s += &format!(
                "  http {} (SYN flood): {} of the kernel alone's requests/s (never worse, within 5% noise: {})\n",
                f.name,
                pct(ratio),
                verdict(ratio.map(|x| x >= 0.95))
            );
            s += &syn_flood_clients(r, f);
        }
    }
    s
}

/// The SYN-flood targets for clients beside wrk: zero config's connect p99
/// within 2x of unflooded, the long-lived connection >= 95% of its
/// unflooded requests/s (unflooded: the `none` cell, the kernel alone).
fn syn_flood_clients(r: &ServiceRun, f: &Flood) -> String {
    let (zero, calm) = (group(r, f.name, Setup::Zero), group(r, "none", Setup::Off));
    let (p99, calm_p99) = (med(&zero, |c| c.connect_p99_ms), med(&calm, |c| c.connect_p99_ms));
    let (kept, calm_kept) = (med(&zero, |c| c.kept_rps), med(&calm, |c| c.kept_rps));
    let kept_ratio = kept.zip(calm_kept).filter(|(_, c)| *c > 0.0).map(|(k, c)| k / c);
    format!(
        "  http {}: connect p99 {} vs {} unflooded (within 2x: {}); long-lived connection {} of its unflooded requests/s (>= 95%: {})\n",
        f.name,
        ms(p99),
        ms(calm_p99),
        verdict(p99.zip(calm_p99).map(|(p, c)| p <= 2.0 * c)),
        pct(kept_ratio),
        verdict(kept_ratio.map(|k| k >= 0.95))
    )
}

/// results.json and summary.txt.
pub fn write_all(r: &ServiceRun, out: &Path) -> Result<()> {
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(out.join("summary.txt"), summary(r))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(flood: &str, config: Setup, rate: f64, success: Option<f64>, p99: Option<f64>) -> Cell {
        Cell { flood: flood.into(), config, client_rate: rate, success, p99_ms: p99, ..Cell::default() }
    }

    fn run(service: Service, cells: Vec<Cell>) -> ServiceRun {
        ServiceRun { service, secs: 8.0, repeats: 1, capacity: None, cells }
    }

    #[test]
    fn dns_targets_compare_with_the_unflooded_p99_and_say_missing_when_missing() {
        let r = run(
            Service::Dns,
            vec![
                cell("none", Setup::Off, 5000.0, Some(1.0), Some(0.05)),
                cell("closed-v4", Setup::Zero, 5000.0, Some(0.9995), Some(0.09)),
                cell("closed-v6", Setup::Zero, 5000.0, Some(0.99), None),
            ],
        );
        let t = targets(&r);
        assert!(
            t.contains("closed-v4: answered 99.95% (>= 99.9%: MET); p99 0.09 ms vs 0.05 ms unflooded (within 2x: MET)"),
            "{t}"
        );
        assert!(
            t.contains(
                "closed-v6: answered 99.00% (>= 99.9%: MISSED); p99 n/a vs 0.05 ms unflooded (within 2x: not measured)"
            ),
            "{t}"
        );
    }

    #[test]
    fn http_targets_are_ratios_to_the_blocked_and_the_off_runs() {
        let r = run(
            Service::Http,
            vec![
                cell("closed-v4", Setup::Zero, 900.0, Some(1.0), None),
                cell("closed-v4", Setup::Blocked, 1000.0, Some(1.0), None),
                cell("own-v4", Setup::Zero, 500.0, Some(1.0), None),
                cell("own-v4", Setup::Off, 1000.0, Some(1.0), None),
            ],
        );
        let t = targets(&r);
        assert!(
            t.contains("http closed-v4: 900 requests/s, 90.00% of the flood blocked entirely (>= 90%: MET)"),
            "{t}"
        );
        assert!(!t.contains("closed-v6"), "a flood that did not run has no target line: {t}");
        assert!(
            t.contains(
                "own-v4 (SYN flood): 50.00% of the kernel alone's requests/s (never worse, within 5% noise: MISSED)"
            ),
            "{t}"
        );
    }

    #[test]
    fn syn_flood_clients_compare_with_the_unflooded_kernel_alone() {
        let probe = |flood: &str, config, p99, kept| Cell {
            connect_p99_ms: p99,
            kept_rps: kept,
            ..cell(flood, config, 100.0, Some(1.0), None)
        };
        let r = run(
            Service::Http,
            vec![
                probe("none", Setup::Off, Some(2.0), Some(500.0)),
                probe("own-v4", Setup::Zero, Some(4.0), Some(480.0)),
                probe("own-v6", Setup::Zero, Some(4.1), None),
            ],
        );
        let v4 = syn_flood_clients(&r, &Flood::parse("own-v4").unwrap());
        assert_eq!(
            v4,
            "  http own-v4: connect p99 4.00 ms vs 2.00 ms unflooded (within 2x: MET); \
             long-lived connection 96.00% of its unflooded requests/s (>= 95%: MET)\n"
        );
        let v6 = syn_flood_clients(&r, &Flood::parse("own-v6").unwrap());
        assert!(
            v6.contains("(within 2x: MISSED)") && v6.contains("n/a of its unflooded requests/s (>= 95%: not measured)"),
            "{v6}"
        );
    }

    #[test]
    fn the_median_of_two_repeats_is_their_mean_and_a_missing_one_makes_it_missing() {
        let a = cell("x", Setup::Zero, 100.0, Some(0.5), Some(1.0));
        let b = cell("x", Setup::Zero, 300.0, Some(1.0), None);
        assert_eq!(med(&[&a, &b], |c| Some(c.client_rate)), Some(200.0));
        assert_eq!(med(&[&a, &b], |c| c.p99_ms), None);
        assert_eq!(spread(&[&a, &b], |c| c.success, pct), "75.00% (50.00%-100.00%)");
    }

    #[test]
    fn every_flood_has_off_zero_and_static_and_only_closed_port_floods_a_blocked_reference() {
        for f in &FLOODS {
            let s = Setup::for_flood(Some(f));
            assert!(s.starts_with(&[Setup::Off, Setup::Zero, Setup::Static]));
            assert_eq!(s.contains(&Setup::Blocked), !f.own_port);
        }
        assert_eq!(Setup::for_flood(None), &[Setup::Off]);
        assert_eq!(Service::parse("http"), Some(Service::Http));
        assert_eq!(Service::parse("default"), None);
    }
}
