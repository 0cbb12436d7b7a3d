//! The arguments of each `sluice bench` command, checked by clap's value
//! parsers.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use sluice::surface::cli::{parse_rate, parse_secs};
use sluice_bench::scenarios::scenario::ConfigKind;
use sluice_bench::services;
use sluice_bench::testbed::victim::VictimModel;

#[derive(Args)]
pub(crate) struct RecoveryArgs {
    /// Victim models (nic, same-core).
    #[arg(long, value_delimiter = ',', default_value = "nic", value_parser = parse_model)]
    pub(crate) models: Vec<VictimModel>,
    /// Configurations (off, nft, static, auto, auto-pno, auto-idle).
    #[arg(long, value_delimiter = ',', default_value = "off,auto", value_parser = parse_config_kind)]
    pub(crate) configs: Vec<ConfigKind>,
    /// Flood lengths, seconds (each 0.5 to 60).
    #[arg(long, value_delimiter = ',', default_value = "10,30,60", value_parser = parse_phase)]
    pub(crate) floods: Vec<f64>,
    /// Flood rate as a multiple of the calibrated peak (above 0, at most 100).
    #[arg(long, default_value_t = 10.0, value_parser = parse_flood)]
    pub(crate) flood: f64,
    /// Seconds of probe alone before the flood (the baseline), 0.5 to 60.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_phase)]
    pub(crate) calm: f64,
    /// The scenario whose streams and victim are used.
    #[arg(long, short, default_value = "default")]
    pub(crate) scenario: String,
    /// Output folder (default: results/recovery-TIMESTAMP).
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct CaptureArgs {
    /// Capture programs: tcpdump, raw.
    #[arg(long, value_delimiter = ',', default_value = "tcpdump,raw", value_parser = ["tcpdump", "raw"])]
    pub(crate) capturers: Vec<String>,
    /// Frame sizes, bytes (60 to 1514).
    #[arg(long, value_delimiter = ',', default_value = "64,1500", value_parser = clap::value_parser!(u32).range(60..=1514))]
    pub(crate) frames: Vec<u32>,
    /// Gaps between frames: none (6 Mpps asked in all) or 1us (1 Mpps in all).
    #[arg(long, value_delimiter = ',', default_value = "none,1us", value_parser = ["none", "1us"])]
    pub(crate) gaps: Vec<String>,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct TraceCostArgs {
    /// Rounds (each: untraced, counting, sampling).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub(crate) rounds: u32,
    /// Seconds per window.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_secs)]
    pub(crate) duration: Duration,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct IdleArgs {
    /// Idle UDP services in the second case (each gets a class).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=60))]
    pub(crate) services: u32,
    /// Seconds measured per case (after 4 s to settle).
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    pub(crate) window: Duration,
    /// Interleaved rounds (the median and range are reported).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..100))]
    pub(crate) rounds: u64,
    /// Other `sluice` binaries to measure beside this one (an older build).
    #[arg(long, value_delimiter = ',')]
    pub(crate) compare: Vec<PathBuf>,
    /// Packets/s of the closed-port flood case (a socket sender on CPU 1,
    /// where the flood's receive work runs; the report shows the rate it
    /// reached); 0 skips the case.
    #[arg(long, value_name = "PPS", default_value_t = 1_000_000)]
    pub(crate) flood_rate: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct TickArgs {
    /// UDP services and TCP listeners to hold (each gets a class).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=60))]
    pub(crate) services: u32,
    /// Interleaved rounds (the median is reported).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u64).range(1..1000))]
    pub(crate) rounds: u64,
    /// Calls per read per round.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub(crate) calls: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct BenchRunArgs {
    /// A built-in scenario name (`sluice bench scenarios`; `dns` and `http` run real services) or a TOML scenario file.
    #[arg(long, short, default_value = "default")]
    pub(crate) scenario: String,
    /// Output folder (default: results/SCENARIO-TIMESTAMP).
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
    /// Override the scenario's seconds per level.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub(crate) duration: Option<Duration>,
    /// Override the scenario's repeats per level.
    #[arg(long)]
    pub(crate) repeats: Option<u32>,
    /// dns scenario: dnsperf's steady rate of legitimate queries, queries/s.
    #[arg(long, default_value = "5k", value_parser = parse_rate)]
    pub(crate) qps: f64,
    /// http scenario: wrk's connections (each request on a new one, unless --keep-alive).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) conns: u32,
    /// http scenario: wrk keeps its connections open (many requests on
    /// each), the usual web client: a flood then takes the server's CPU
    /// without filling any of its queues.
    #[arg(long)]
    pub(crate) keep_alive: bool,
    /// http scenario: nginx hands every request to php-fpm (Debian's, one
    /// worker, on nginx's CPU) over a unix socket, as a PHP site does: the
    /// service's work is then mostly its backend's.
    #[arg(long)]
    pub(crate) php: bool,
    /// dns and http scenarios: the floods to run (closed-v4, closed-v6, own-v4, own-v6; default all;
    /// http also ack-v4, rst-v4, conns-v4 and newconns-v4, by name only: TCP ACKs or RSTs of no connection
    /// to nginx's port; real keep-alive connections from 4 addresses pipelining requests; a new real
    /// connection per request from 32 addresses).
    #[arg(long, value_delimiter = ',', value_parser = parse_flood_name)]
    pub(crate) floods: Vec<services::Flood>,
    /// dns and http scenarios: the generator's asked flood rate, packets/s
    /// (default: its top rate, 8M/s, more than it reaches). Lower it until
    /// the ring drops (ring/s) are under 5% of the flood: a flood the gate
    /// sees whole.
    #[arg(long, value_name = "PPS", value_parser = parse_rate)]
    pub(crate) flood_rate: Option<f64>,
    /// dns scenario: calm cells (no flood), dnsperf at these fractions of
    /// NSD's measured capacity, off and zero config side by side; "none"
    /// for none.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.5,0.9", value_parser = parse_load)]
    pub(crate) calm_loads: Vec<Option<f64>>,
    /// dns scenario: also calm cells at half NSD's capacity beside a local
    /// process of user nobody that misbehaves: a UDP socket that never reads
    /// (filled over loopback), and one bound and closed 100 times a second.
    #[arg(long)]
    pub(crate) neighbours: bool,
    /// dns and http scenarios: the CPU the legitimate clients (dnsperf, the
    /// probes, wrk) run on; default the generator's (0). On veth the gate
    /// runs on the sender's CPU: 1 puts the clients on another queue than
    /// the flood, as a NIC's RSS would.
    #[arg(long, value_name = "CPU")]
    pub(crate) clients_cpu: Option<usize>,
    /// dns and http scenarios: generator workers, each on a core of its
    /// own from the CPU plan and each sending its share of the flood, so the
    /// flood enters on that many queues (default: every generator CPU the
    /// plan has; 1 on a 2-CPU machine).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) gen_workers: Option<u32>,
    /// dns and http scenarios: queues of each veth end (default: one per
    /// CPU, a sender entering on its CPU's queue as RSS would put a flow; 1:
    /// every sender on one queue, as runs before issue 51 had it).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) queues: Option<u32>,
}

/// A calm cell's load: a fraction of capacity in (0, 2], or "none".
pub(crate) fn parse_load(s: &str) -> Result<Option<f64>, String> {
    if s == "none" {
        return Ok(None);
    }
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 2.0 => Ok(Some(f)),
        _ => Err(format!("\"{s}\" is not a fraction of capacity: give 0.2, 0.5, ... (up to 2), or none")),
    }
}

#[derive(Args)]
pub(crate) struct StepArgs {
    /// Victim models (nic, same-core).
    #[arg(long, value_delimiter = ',', default_value = "nic", value_parser = parse_model)]
    pub(crate) models: Vec<VictimModel>,
    /// Configurations (off, nft, static, auto, auto-pno, auto-idle).
    #[arg(long, value_delimiter = ',', default_value = "static,auto,auto-pno", value_parser = parse_config_kind)]
    pub(crate) configs: Vec<ConfigKind>,
    /// Seconds per phase (5 phases), 0.5 to 60.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_phase)]
    pub(crate) phase: f64,
    /// Flood rate as a multiple of the calibrated peak (above 0, at most 100).
    #[arg(long, default_value_t = 3.0, value_parser = parse_flood)]
    pub(crate) flood: f64,
    /// The scenario whose streams and victim are used.
    #[arg(long, short, default_value = "default")]
    pub(crate) scenario: String,
    /// Output folder (default: results/step-TIMESTAMP).
    #[arg(long, short)]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Seconds per phase (three phases: no flood, flood without sluice, flood with sluice).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub(crate) duration: Duration,
    /// dnsperf's steady rate of legitimate queries, queries/s.
    #[arg(long, default_value = "5k", value_parser = parse_rate)]
    pub(crate) qps: f64,
    /// Folder for the verdict and table (dns-demo.json), which the report of
    /// `sluice bench run --out` the same folder shows first.
    #[arg(long, value_name = "DIR", default_value = "results/demo")]
    pub(crate) out: PathBuf,
}

#[derive(Args)]
pub(crate) struct ReportArgs {
    /// results.json, or the folder holding it.
    pub(crate) path: PathBuf,
}

#[derive(Args)]
pub(crate) struct GeneratorArgs {
    /// Rates to try, packets/s (e.g. 10k,100k,1M,3M).
    #[arg(long, value_delimiter = ',', default_value = "10k,100k,1M,3M,5M", value_parser = parse_rate)]
    pub(crate) rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, visible_alias = "secs", value_name = "SECS", default_value = "2", value_parser = parse_secs)]
    pub(crate) duration: Duration,
    /// Frames per flush, 1-256 (bursts never exceed it).
    #[arg(long, default_value_t = sluice_bench::load::gen::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) batch: u32,
}

#[derive(Args)]
pub(crate) struct GateArgs {
    /// Repeats per test-run call.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) repeat: u32,
    /// Interleaved rounds, one call per case each (the median is reported).
    #[arg(long, default_value_t = 31, value_parser = clap::value_parser!(u64).range(1..10_000))]
    pub(crate) rounds: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

// ---------------------------------------------------------------------------
// Value parsers: a bad value is refused by clap, naming the flag, before
// anything runs.

pub(crate) fn parse_phase(s: &str) -> Result<f64, String> {
    let v = parse_secs(s)?.as_secs_f64();
    if !(0.5..=60.0).contains(&v) {
        return Err(format!("{s}: a phase is 0.5 to 60 seconds"));
    }
    Ok(v)
}

pub(crate) fn parse_flood(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("\"{s}\" is not a number"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("{s}: a multiple of the peak, above 0 and at most 100"));
    }
    Ok(v)
}

pub(crate) fn parse_flood_name(s: &str) -> Result<services::Flood, String> {
    services::Flood::parse(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_model(s: &str) -> Result<VictimModel, String> {
    VictimModel::parse(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_config_kind(s: &str) -> Result<ConfigKind, String> {
    ConfigKind::parse(s).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// The commands.

/// Victim services for tests, demos and benchmarks.
#[derive(Subcommand)]
pub(crate) enum ServeCmd {
    /// A UDP echo service that spends --work-ns of CPU per datagram.
    UdpEcho(UdpEchoArgs),
}

#[derive(Args)]
pub(crate) struct UdpEchoArgs {
    /// UDP port to listen on.
    #[arg(long)]
    pub(crate) port: u16,
    /// Address to bind.
    #[arg(long, default_value = "0.0.0.0")]
    pub(crate) addr: std::net::IpAddr,
    /// CPU nanoseconds spent per datagram (emulated work).
    #[arg(long, default_value_t = 0)]
    pub(crate) work_ns: u64,
    /// Stop after SECS seconds (default: until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub(crate) duration: Option<Duration>,
    /// Receive only, send no replies.
    #[arg(long)]
    pub(crate) no_echo: bool,
    /// Reader sockets, in one SO_REUSEPORT group when 2 or more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) readers: u16,
    /// Threads reading each socket (the shared-socket study's shared socket: --readers 1 --threads 8).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) threads: u16,
    /// The first reader stops reading for MS milliseconds every --stall-every
    /// (a reader held up by a lock, a page fault, a slow request).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) stall: Option<u64>,
    /// The period of --stall, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(crate) stall_every: u64,
    /// Socket receive buffer in bytes (SO_RCVBUF; SO_RCVBUFFORCE as root,
    /// past net.core.rmem_max). Default: the kernel's.
    #[arg(long)]
    pub(crate) rcvbuf: Option<usize>,
    /// On SIGUSR1, set the work to the ns in this file (default: double
    /// it); SIGUSR2 restores --work-ns.
    #[arg(long)]
    pub(crate) work_file: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A paced UDP sender over sockets (a few 100k packets/s; for demos and tests).
#[derive(Args)]
pub(crate) struct SendArgs {
    /// Destination ADDR:PORT.
    #[arg(long)]
    pub(crate) dst: SocketAddr,
    /// Local address to send from (one of this host's; default: the
    /// kernel's choice for the destination).
    #[arg(long)]
    pub(crate) src: Option<std::net::IpAddr>,
    /// Packets per second (0 = as fast as possible).
    #[arg(long)]
    pub(crate) rate: u64,
    /// Seconds to send.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub(crate) duration: Duration,
    /// UDP payload bytes.
    #[arg(long, default_value_t = 18)]
    pub(crate) payload: usize,
    /// Source ports to rotate over.
    #[arg(long, default_value_t = 8)]
    pub(crate) flows: u16,
    /// Datagrams sent back to back each time, the rate kept on average (a
    /// burst of N every N/rate seconds); 1 paces them evenly.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) burst: u64,
    /// Also count the datagrams that come back (an echo service's
    /// answers), until 300 ms after the last one sent.
    #[arg(long)]
    pub(crate) answers: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}
