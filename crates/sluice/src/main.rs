//! The `sluice` command: argument structs (parsed and validated by clap's
//! value parsers), then one `cmd_NAME` function per subcommand that turns
//! them into the library's options, runs it, and prints the result. Exit
//! codes are decided in `main` only.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use sluice::bench::scenario::ConfigKind;
use sluice::bench::testbed::VictimModel;
use sluice::config::XdpMode;
use sluice::{bench_gate, classify, config, daemon, send, serve, stats};

/// sluice keeps Linux network services at full speed under packet floods: an
/// XDP program classifies each packet into a traffic class and admits or drops
/// it at the driver, before the kernel spends anything on it.
#[derive(Parser)]
#[command(name = "sluice", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Run(RunArgs),
    Status(StatusArgs),
    CheckConfig(CheckArgs),
    #[command(subcommand)]
    Bench(BenchCmd),
    #[command(subcommand)]
    Serve(ServeCmd),
    Send(SendArgs),
}

/// Attach the gate to an interface and enforce the classes until stopped.
///
/// Loads the XDP program, attaches it through a bpf_link (so it detaches if the
/// daemon dies), and applies the classes from --config and/or --class. Serves
/// statistics on a Unix socket (mode 0600, default /run/sluice/IFACE.sock) and
/// Prometheus metrics (default http://127.0.0.1:9786/metrics). SIGHUP re-reads
/// the config file (a bad one is refused and the old one stays); SIGINT or
/// SIGTERM detach and print totals. Classes with rate=auto get their rate from
/// a controller that runs every 10 ms on the signals of the service's sockets
/// (found by the class's UDP ports; the service must be listening first).
#[derive(Args)]
struct RunArgs {
    /// Interface to attach to (else `interface` from the config file).
    #[arg(long, short)]
    iface: Option<String>,
    /// TOML config file (see the README's config reference).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// A class as NAME:KEY=VAL,... with keys priority, rate (packets/s,
    /// unlimited, blocked or auto), burst, match, and for rate=auto algo
    /// (knee|pno), min_share (0-1) and fallback (packets/s|unlimited)
    /// (repeatable). Example: 'dns:priority=0,rate=50k,match=udp:53,match=tcp:53@10.0.0.0/8',
    /// 'api:rate=auto,min_share=0.1,match=udp:8053'.
    /// A class with the same name as one in the file replaces it.
    #[arg(long = "class", value_name = "SPEC")]
    classes: Vec<String>,
    /// Detach an XDP program already on the interface (attached with netlink) instead of refusing.
    #[arg(long)]
    replace: bool,
    /// XDP mode: native (in the driver, the default) or generic (after skb allocation).
    #[arg(long, value_parser = parse_mode)]
    xdp_mode: Option<XdpMode>,
    /// Statistics socket path.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Prometheus listen address ADDR:PORT, or "off".
    #[arg(long, value_parser = parse_metrics)]
    metrics: Option<Metrics>,
    /// Print the totals as JSON when stopping.
    #[arg(long)]
    json: bool,
}


/// Show a running daemon's classes, rates and counters.
#[derive(Args)]
struct StatusArgs {
    /// Print the snapshot as JSON (for scripts).
    #[arg(long)]
    json: bool,
    /// Refresh every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    watch: Option<Duration>,
    /// The daemon's interface (finds /run/sluice/IFACE.sock).
    #[arg(long, short)]
    iface: Option<String>,
    /// The daemon's statistics socket.
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// Validate a config file without touching the kernel.
#[derive(Args)]
struct CheckArgs {
    /// The TOML config file.
    file: PathBuf,
    /// Also print the resolved config as JSON.
    #[arg(long)]
    json: bool,
}

/// Benchmarks that print numbers.
#[derive(Subcommand)]
enum BenchCmd {
    /// The overload testbed: a flooded service in two namespaces, measured
    /// level by level with and without sluice (see `sluice bench scenarios`).
    ///
    /// Makes its own namespaces (sluice-bench-*), calibrates the victim's peak,
    /// measures every level x configuration x repeat, and writes results.json,
    /// results.csv, figures (SVG and PNG) and report.html into the output folder.
    Run(BenchRunArgs),
    /// How each configuration follows changes: a flood, then the service's
    /// cost doubles and is restored, then the flood stops and resumes, in one
    /// continuous run per configuration. Prints settling time, overshoot and
    /// the admitted rate's coefficient of variation per phase; writes
    /// step.json, step.csv, figures and summary.txt.
    Step(StepArgs),
    /// Render the outputs again from a results.json.
    Report(ReportArgs),
    /// List the built-in scenarios.
    Scenarios,
    /// Remove namespaces a killed bench left behind (sluice-bench-*).
    Cleanup,
    /// The generator's accuracy and highest paced rate, counted on the victim's side.
    Generator(GeneratorArgs),
    /// Gate cost in ns per packet (BPF_PROG_TEST_RUN) with 1, 64 and 1024 rules, beside a no-op floor.
    Gate(GateArgs),
}

#[derive(Args)]
struct BenchRunArgs {
    /// A built-in scenario name or a TOML scenario file.
    #[arg(long, short, default_value = "default")]
    scenario: String,
    /// Output folder (default: results/SCENARIO-TIMESTAMP).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Override the scenario's seconds per level.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    duration: Option<Duration>,
    /// Override the scenario's repeats per level.
    #[arg(long)]
    repeats: Option<u32>,
}

#[derive(Args)]
struct StepArgs {
    /// Victim models (nic, same-core).
    #[arg(long, value_delimiter = ',', default_value = "nic", value_parser = parse_model)]
    models: Vec<VictimModel>,
    /// Configurations (off, nft, static, auto, auto-pno, auto-idle).
    #[arg(long, value_delimiter = ',', default_value = "static,auto,auto-pno", value_parser = parse_config_kind)]
    configs: Vec<ConfigKind>,
    /// Seconds per phase (5 phases), 0.5 to 60.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_phase)]
    phase: f64,
    /// Flood rate as a multiple of the calibrated peak (above 0, at most 100).
    #[arg(long, default_value_t = 3.0, value_parser = parse_flood)]
    flood: f64,
    /// The scenario whose streams and victim are used.
    #[arg(long, short, default_value = "default")]
    scenario: String,
    /// Output folder (default: results/step-TIMESTAMP).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct ReportArgs {
    /// results.json, or the folder holding it.
    path: PathBuf,
}

#[derive(Args)]
struct GeneratorArgs {
    /// Rates to try, packets/s (e.g. 10k,100k,1M,3M).
    #[arg(long, value_delimiter = ',', default_value = "10k,100k,1M,3M,5M", value_parser = parse_rate)]
    rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, visible_alias = "secs", value_name = "SECS", default_value = "2", value_parser = parse_secs)]
    duration: Duration,
    /// Frames per flush, 1-256 (bursts never exceed it).
    #[arg(long, default_value_t = sluice::bench::gen::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=256))]
    batch: u32,
}

#[derive(Args)]
struct GateArgs {
    /// Repeats per test-run call.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Interleaved rounds, one call per case each (the median is reported).
    #[arg(long, default_value_t = 31, value_parser = clap::value_parser!(u64).range(1..10_000))]
    rounds: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Victim services for demos and benchmarks.
#[derive(Subcommand)]
enum ServeCmd {
    /// A UDP echo service that spends --work-ns of CPU per datagram.
    UdpEcho(UdpEchoArgs),
}

#[derive(Args)]
struct UdpEchoArgs {
    /// UDP port to listen on.
    #[arg(long)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "0.0.0.0")]
    addr: std::net::IpAddr,
    /// CPU nanoseconds spent per datagram (emulated work).
    #[arg(long, default_value_t = 0)]
    work_ns: u64,
    /// Stop after SECS seconds (default: until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    duration: Option<Duration>,
    /// Receive only, send no replies.
    #[arg(long)]
    no_echo: bool,
    /// Reader threads, each with its own socket in one SO_REUSEPORT group.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    readers: u16,
    /// Socket receive buffer in bytes (SO_RCVBUF; SO_RCVBUFFORCE as root,
    /// past net.core.rmem_max). Default: the kernel's.
    #[arg(long)]
    rcvbuf: Option<usize>,
    /// On SIGUSR1, set the work to the ns in this file (default: double
    /// it); SIGUSR2 restores --work-ns.
    #[arg(long)]
    work_file: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// A paced UDP sender over sockets (a few 100k packets/s; for demos and tests).
#[derive(Args)]
struct SendArgs {
    /// Destination ADDR:PORT.
    #[arg(long)]
    dst: SocketAddr,
    /// Packets per second (0 = as fast as possible).
    #[arg(long)]
    rate: u64,
    /// Seconds to send.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    duration: Duration,
    /// UDP payload bytes.
    #[arg(long, default_value_t = 18)]
    payload: usize,
    /// Source ports to rotate over.
    #[arg(long, default_value_t = 8)]
    flows: u16,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}


// ---------------------------------------------------------------------------
// Value parsers: a bad value is refused by clap, naming the flag, before
// anything runs.

fn parse_mode(s: &str) -> Result<XdpMode, String> {
    match s {
        "native" => Ok(XdpMode::Native),
        "generic" => Ok(XdpMode::Generic),
        _ => Err(format!("\"{s}\": valid modes are native and generic")),
    }
}

/// A duration in seconds: positive, finite, under 1e6 (fractions allowed).
fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("\"{s}\" is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v < 1e6) {
        return Err(format!("{s}: a positive number of seconds (under 1e6) is needed"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_phase(s: &str) -> Result<f64, String> {
    let v = parse_secs(s)?.as_secs_f64();
    if !(0.5..=60.0).contains(&v) {
        return Err(format!("{s}: a phase is 0.5 to 60 seconds"));
    }
    Ok(v)
}

fn parse_flood(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("\"{s}\" is not a number"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("{s}: a multiple of the peak, above 0 and at most 100"));
    }
    Ok(v)
}

/// Packets/s with an optional k/M/G suffix.
fn parse_rate(s: &str) -> Result<f64, String> {
    config::parse_count(s).map(|x| x as f64)
}

/// "ADDR:PORT" or "off".
#[derive(Clone, Copy)]
enum Metrics {
    Off,
    On(SocketAddr),
}

fn parse_metrics(s: &str) -> Result<Metrics, String> {
    match s {
        "off" => Ok(Metrics::Off),
        a => a.parse().map(Metrics::On).map_err(|_| format!("\"{a}\" is not ADDR:PORT or \"off\"")),
    }
}

fn parse_model(s: &str) -> Result<VictimModel, String> {
    VictimModel::parse(s).map_err(|e| e.to_string())
}

fn parse_config_kind(s: &str) -> Result<ConfigKind, String> {
    ConfigKind::parse(s).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// The commands.

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Status(a) => cmd_status(a),
        Cmd::CheckConfig(a) => cmd_check_config(a),
        Cmd::Bench(BenchCmd::Run(a)) => cmd_bench_run(a),
        Cmd::Bench(BenchCmd::Step(a)) => cmd_bench_step(a),
        Cmd::Bench(BenchCmd::Report(a)) => cmd_bench_report(a),
        Cmd::Bench(BenchCmd::Scenarios) => cmd_bench_scenarios(),
        Cmd::Bench(BenchCmd::Cleanup) => cmd_bench_cleanup(),
        Cmd::Bench(BenchCmd::Generator(a)) => cmd_bench_generator(a),
        Cmd::Bench(BenchCmd::Gate(a)) => cmd_bench_gate(a),
        Cmd::Serve(ServeCmd::UdpEcho(a)) => cmd_serve_udp_echo(a),
        Cmd::Send(a) => cmd_send(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Print `value` as pretty JSON, or as `table` renders it.
fn print_json_or<T: Serialize>(json: bool, value: &T, table: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", table(value));
    }
    Ok(())
}

/// A flag set by SIGINT or SIGTERM, for commands that stop cleanly.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone())?;
    }
    Ok(flag)
}

/// results/PREFIX-UNIXTIME.
fn default_out(prefix: &str) -> Result<PathBuf> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    Ok(PathBuf::from(format!("results/{prefix}-{stamp}")))
}

impl From<RunArgs> for daemon::RunOpts {
    fn from(a: RunArgs) -> Self {
        daemon::RunOpts {
            iface: a.iface,
            config: a.config,
            classes: a.classes,
            replace: a.replace,
            xdp_mode: a.xdp_mode,
            socket: a.socket,
            metrics: a.metrics.map(|m| match m {
                Metrics::Off => None,
                Metrics::On(addr) => Some(addr),
            }),
        }
    }
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let json = a.json;
    let snap = daemon::Daemon::start(a.into())?.run()?;
    print_json_or(json, &snap, stats::render_table)
}

fn cmd_status(a: StatusArgs) -> Result<()> {
    let path = daemon::find_socket(a.socket.as_deref(), a.iface.as_deref())?;
    loop {
        let snap = daemon::fetch_snapshot(&path)?;
        if a.watch.is_some() && !a.json {
            print!("\x1b[2J\x1b[H");
        }
        print_json_or(a.json, &snap, stats::render_table)?;
        match a.watch {
            Some(every) => std::thread::sleep(every),
            None => return Ok(()),
        }
    }
}

fn cmd_check_config(a: CheckArgs) -> Result<()> {
    let cfg = config::load_file(&a.file)?;
    let tables = classify::compile(&cfg)?;
    let rules: usize = cfg.classes.iter().map(|c| c.rules.len()).sum();
    println!(
        "{}: OK: {} classes (default \"{}\"), {} rules, {} source-prefix groups, {} + {} prefix entries",
        a.file.display(),
        cfg.classes.len(),
        cfg.classes[cfg.default_class].name,
        rules,
        tables.groups,
        tables.v4.len(),
        tables.v6.len()
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&cfg)?);
    }
    Ok(())
}

fn cmd_bench_run(a: BenchRunArgs) -> Result<()> {
    let mut sc = sluice::bench::scenario::load(&a.scenario)?;
    if let Some(d) = a.duration {
        sc.duration = d.as_secs_f64();
    }
    if let Some(r) = a.repeats {
        sc.repeats = r;
    }
    sc.validate().context("after --duration/--repeats")?;
    let out = a.out.map_or_else(|| default_out(&sc.name), Ok)?;
    let opts = sluice::bench::sweep::SweepOpts { exe: std::env::current_exe()?, progress: true, interrupted: stop_flag()? };
    eprintln!("sluice bench: scenario {}, writing to {}", sc.name, out.display());
    let r = sluice::bench::sweep::run(&sc, &opts, |partial| sluice::bench::report::write_all(partial, &out))?;
    print!("{}", sluice::bench::report::summary(&r));
    println!("report: {}", out.join("report.html").display());
    Ok(())
}

fn cmd_bench_step(a: StepArgs) -> Result<()> {
    let sc = sluice::bench::scenario::load(&a.scenario)?;
    let out = a.out.map_or_else(|| default_out("step"), Ok)?;
    let opts = sluice::bench::step::StepOpts {
        models: a.models,
        configs: a.configs,
        phase_secs: a.phase,
        flood: a.flood,
        exe: std::env::current_exe()?,
        progress: true,
    };
    eprintln!("sluice bench step: writing to {}", out.display());
    let r = sluice::bench::step::run(&sc, &opts)?;
    sluice::bench::step::write_all(&r, &out)?;
    print!("{}", sluice::bench::step::summary(&r));
    println!("figures: {}", out.display());
    Ok(())
}

fn cmd_bench_report(a: ReportArgs) -> Result<()> {
    let file = if a.path.is_dir() { a.path.join("results.json") } else { a.path };
    let r = sluice::bench::report::load(&file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    sluice::bench::report::write_all(&r, dir)?;
    print!("{}", sluice::bench::report::summary(&r));
    println!("report: {}", dir.join("report.html").display());
    Ok(())
}

fn cmd_bench_scenarios() -> Result<()> {
    for (name, _, what) in sluice::bench::scenario::BUILTIN {
        println!("{name:<10} {what}");
    }
    Ok(())
}

fn cmd_bench_cleanup() -> Result<()> {
    let removed = sluice::bench::testbed::cleanup_leftovers()?;
    let names = if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) };
    println!("removed {} namespaces{names}", removed.len());
    Ok(())
}

fn cmd_bench_generator(a: GeneratorArgs) -> Result<()> {
    println!("{:>10} {:>12} {:>10} {:>10} {:>12} {:>9}", "asked/s", "arrived/s", "late", "ring drops", "XDP seen", "error");
    for c in sluice::bench::gencheck::check(&a.rates, a.duration.as_secs_f64(), a.batch)? {
        println!(
            "{:>10} {:>12} {:>10} {:>10} {:>12} {:>+8.2}%{}",
            stats::human(c.asked_pps),
            stats::human((c.xdp_seen + c.ring_drops) as f64 / c.secs),
            c.late,
            c.ring_drops,
            c.xdp_seen,
            c.error * 100.0,
            if c.error.abs() > 0.02 { "  (short by more than 2%: a bench run would be invalid)" } else { "" }
        );
    }
    Ok(())
}

fn cmd_bench_gate(a: GateArgs) -> Result<()> {
    let r = bench_gate::run(a.repeat, a.rounds as usize, !a.json)?;
    print_json_or(a.json, &r, bench_gate::render)
}

fn cmd_serve_udp_echo(a: UdpEchoArgs) -> Result<()> {
    let o = serve::ServeOpts {
        bind: SocketAddr::new(a.addr, a.port),
        work_ns: a.work_ns,
        duration: a.duration,
        no_echo: a.no_echo,
        readers: a.readers as usize,
        rcvbuf: a.rcvbuf,
        work_file: a.work_file,
    };
    let r = serve::udp_echo(&o, stop_flag()?).with_context(|| format!("serving UDP on {}", o.bind))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let rate = stats::human(r.received as f64 / r.secs.max(1e-9));
        println!("received {} datagrams in {:.1} s ({rate}/s), echoed {}", r.received, r.secs, r.echoed);
    }
    Ok(())
}

fn cmd_send(a: SendArgs) -> Result<()> {
    let o = send::SendOpts { dst: a.dst, rate: a.rate, duration: a.duration, payload: a.payload, flows: a.flows };
    let r = send::send_udp(&o).with_context(|| format!("sending to {}", o.dst))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("sent {} datagrams in {:.1} s ({}/s), {} refused by the kernel", r.sent, r.secs, stats::human(r.rate()), r.refused);
    }
    Ok(())
}
