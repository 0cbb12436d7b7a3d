//! The `sluice-bench` command (`sluice bench ...` runs it): argument structs
//! validated by clap's value parsers, then one `cmd_NAME` per subcommand.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use sluice::surface::cli::{parse_rate, parse_secs, print_json_or, stop_flag};
use sluice::surface::stats;
use sluice_bench::scenario::ConfigKind;
use sluice_bench::victim::VictimModel;
use sluice_bench::{
    capture, cpu, demo, gate_cost, gencheck, readers, recovery, report, scenario, services, step, sweep, tick_cost,
    trace_cost, victim,
};

/// The sluice bench: a flooded service in two network namespaces this
/// command makes (and removes), measured with and without sluice. Needs root.
#[derive(Parser)]
#[command(name = "sluice bench", bin_name = "sluice bench", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCmd,
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
    /// The daemon in action: a real DNS server (NSD) answering dnsperf, with
    /// no flood, under a closed-port flood without sluice, and under the same
    /// flood with `sluice run --iface vb` and nothing else; `sluice status` midway.
    ///
    /// Makes its own namespaces (sluice-bench-*) and removes them; traffic
    /// stays inside them. About 3 x (SECS + 2) seconds.
    Demo(DemoArgs),
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
    /// How long the legitimate probe takes to come back after a flood ends
    /// (the NAPI study): floods of 10, 30 and 60 s, with and without sluice, one
    /// continuous run each (calm, flood, after); prints the recovery time and
    /// writes recovery.json, summary.txt and figures. About 7 minutes per
    /// model with the defaults.
    Recovery(RecoveryArgs),
    /// The capture-cost study's capture experiment: tcpdump (AF_PACKET) and a plain raw
    /// socket on the victim CPU, 10,000 frames of the captured class among
    /// nine times as many others, 64 and 1500 bytes, no gap and a 1 us gap;
    /// how many reach the capture program, where the rest die, the
    /// driver->stack time with a 95% interval; without the gate in front and
    /// with it admitting only the captured class.
    Capture(CaptureArgs),
    /// What `sluice trace` costs the service it watches: delivered throughput
    /// at 1x load with no trace, a counting trace and a sampling trace, in
    /// interleaved windows (nic model, gate attached); about ROUNDS x 3 x
    /// (SECS + 2) seconds after a calibration.
    Trace(TraceCostArgs),
    /// The daemon's own CPU: its 10 ms tick and each read it makes (sock_diag,
    /// /proc, gate counters) and discovery, in CPU µs per call and % of one core.
    Tick(TickArgs),
    /// What an idle daemon costs: `sluice run` in a fresh testbed with no
    /// traffic, with no service and then with --services idle UDP services,
    /// its threads' CPU over --window, % of one core; then how soon a flood
    /// of a class with calm traffic (10k/s, flooded at 100k/s) is ticked;
    /// --compare measures other builds beside it, interleaved round by round.
    Idle(IdleArgs),
}

#[derive(Args)]
struct RecoveryArgs {
    /// Victim models (nic, same-core).
    #[arg(long, value_delimiter = ',', default_value = "nic", value_parser = parse_model)]
    models: Vec<VictimModel>,
    /// Configurations (off, nft, static, auto, auto-pno, auto-idle).
    #[arg(long, value_delimiter = ',', default_value = "off,auto", value_parser = parse_config_kind)]
    configs: Vec<ConfigKind>,
    /// Flood lengths, seconds (each 0.5 to 60).
    #[arg(long, value_delimiter = ',', default_value = "10,30,60", value_parser = parse_phase)]
    floods: Vec<f64>,
    /// Flood rate as a multiple of the calibrated peak (above 0, at most 100).
    #[arg(long, default_value_t = 10.0, value_parser = parse_flood)]
    flood: f64,
    /// Seconds of probe alone before the flood (the baseline), 0.5 to 60.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_phase)]
    calm: f64,
    /// The scenario whose streams and victim are used.
    #[arg(long, short, default_value = "default")]
    scenario: String,
    /// Output folder (default: results/recovery-TIMESTAMP).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct CaptureArgs {
    /// Capture programs: tcpdump, raw.
    #[arg(long, value_delimiter = ',', default_value = "tcpdump,raw", value_parser = ["tcpdump", "raw"])]
    capturers: Vec<String>,
    /// Frame sizes, bytes (60 to 1514).
    #[arg(long, value_delimiter = ',', default_value = "64,1500", value_parser = clap::value_parser!(u32).range(60..=1514))]
    frames: Vec<u32>,
    /// Gaps between frames: none (6 Mpps asked in all) or 1us (1 Mpps in all).
    #[arg(long, value_delimiter = ',', default_value = "none,1us", value_parser = ["none", "1us"])]
    gaps: Vec<String>,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TraceCostArgs {
    /// Rounds (each: untraced, counting, sampling).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    rounds: u32,
    /// Seconds per window.
    #[arg(long, value_name = "SECS", default_value = "3", value_parser = parse_secs)]
    duration: Duration,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct IdleArgs {
    /// Idle UDP services in the second case (each gets a class).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=60))]
    services: u32,
    /// Seconds measured per case (after 4 s to settle).
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    window: Duration,
    /// Interleaved rounds (the median and range are reported).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..100))]
    rounds: u64,
    /// Other `sluice` binaries to measure beside this one (an older build).
    #[arg(long, value_delimiter = ',')]
    compare: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TickArgs {
    /// UDP services and TCP listeners to hold (each gets a class).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=60))]
    services: u32,
    /// Interleaved rounds (the median is reported).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u64).range(1..1000))]
    rounds: u64,
    /// Calls per read per round.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    calls: u32,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchRunArgs {
    /// A built-in scenario name (`sluice bench scenarios`; `dns` and `http` run real services) or a TOML scenario file.
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
    /// dns scenario: dnsperf's steady rate of legitimate queries, queries/s.
    #[arg(long, default_value = "5k", value_parser = parse_rate)]
    qps: f64,
    /// http scenario: wrk's connections (each request on a new one, unless --keep-alive).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    conns: u32,
    /// http scenario: wrk keeps its connections open (many requests on
    /// each), the usual web client: a flood then takes the server's CPU
    /// without filling any of its queues.
    #[arg(long)]
    keep_alive: bool,
    /// dns and http scenarios: the floods to run (closed-v4, closed-v6, own-v4, own-v6; default all;
    /// http also ack-v4 and rst-v4, by name only: TCP ACKs or RSTs of no connection to nginx's port).
    #[arg(long, value_delimiter = ',', value_parser = parse_flood_name)]
    floods: Vec<services::Flood>,
    /// dns and http scenarios: the generator's asked flood rate, packets/s
    /// (default: its top rate, 8M/s, more than it reaches). Lower it until
    /// the ring drops (ring/s) are under 5% of the flood: a flood the gate
    /// sees whole.
    #[arg(long, value_name = "PPS", value_parser = parse_rate)]
    flood_rate: Option<f64>,
    /// dns scenario: calm cells (no flood), dnsperf at these fractions of
    /// NSD's measured capacity, off and zero config side by side; "none"
    /// for none.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.5,0.9", value_parser = parse_load)]
    calm_loads: Vec<Option<f64>>,
    /// dns scenario: also calm cells at half NSD's capacity beside a local
    /// process of user nobody that misbehaves: a UDP socket that never reads
    /// (filled over loopback), and one bound and closed 100 times a second.
    #[arg(long)]
    neighbours: bool,
}

/// A calm cell's load: a fraction of capacity in (0, 2], or "none".
fn parse_load(s: &str) -> Result<Option<f64>, String> {
    if s == "none" {
        return Ok(None);
    }
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 2.0 => Ok(Some(f)),
        _ => Err(format!("\"{s}\" is not a fraction of capacity: give 0.2, 0.5, ... (up to 2), or none")),
    }
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
struct DemoArgs {
    /// Seconds per phase (three phases: no flood, flood without sluice, flood with sluice).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    duration: Duration,
    /// dnsperf's steady rate of legitimate queries, queries/s.
    #[arg(long, default_value = "5k", value_parser = parse_rate)]
    qps: f64,
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
    #[arg(long, default_value_t = sluice_bench::gen::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=256))]
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

// ---------------------------------------------------------------------------
// Value parsers: a bad value is refused by clap, naming the flag, before
// anything runs.

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

fn parse_flood_name(s: &str) -> Result<services::Flood, String> {
    services::Flood::parse(s).map_err(|e| e.to_string())
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
        BenchCmd::Run(a) => cmd_bench_run(a),
        BenchCmd::Step(a) => cmd_bench_step(a),
        BenchCmd::Demo(a) => cmd_bench_demo(a),
        BenchCmd::Report(a) => cmd_bench_report(a),
        BenchCmd::Scenarios => cmd_bench_scenarios(),
        BenchCmd::Cleanup => cmd_bench_cleanup(),
        BenchCmd::Generator(a) => cmd_bench_generator(a),
        BenchCmd::Gate(a) => cmd_bench_gate(a),
        BenchCmd::Tick(a) => cmd_bench_tick(a),
        BenchCmd::Idle(a) => cmd_bench_idle(a),
        BenchCmd::Trace(a) => cmd_bench_trace(a),
        BenchCmd::Capture(a) => cmd_bench_capture(a),
        BenchCmd::Recovery(a) => cmd_bench_recovery(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice bench: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The `sluice` binary beside this one: the bench runs its `serve`, `send`,
/// `run` and `status`.
fn sluice_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe()?.with_file_name("sluice");
    anyhow::ensure!(
        exe.exists(),
        "{} not found: sluice-bench runs the sluice binary installed beside it",
        exe.display()
    );
    Ok(exe)
}

/// results/PREFIX-UNIXTIME.
fn default_out(prefix: &str) -> Result<PathBuf> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    Ok(PathBuf::from(format!("results/{prefix}-{stamp}")))
}

/// The scenarios `bench run` runs with a loop of their own cells (the
/// others are sweeps: a built-in or a TOML file).
#[derive(Clone, Copy)]
enum Family {
    Service(services::Service),
    Sources,
    Readers,
    Cpu,
}

const FAMILIES: [(&str, Family, &str); 5] = [
    ("dns", Family::Service(services::Service::Dns), services::Service::ALL[0].2),
    ("http", Family::Service(services::Service::Http), services::Service::ALL[1].2),
    (
        "sources",
        Family::Sources,
        "dns with 16 flood sources after a calm period: source fairness, the known clients and a new client's probe",
    ),
    (
        "readers",
        Family::Readers,
        "a service's readers: one shared socket vs reuseport (hash, round-robin, least-loaded), and a stalling reader",
    ),
    ("cpu", Family::Cpu, "two services on one CPU, the low one flooded: cpu = \"away\" against the budget alone"),
];

fn cmd_bench_run(a: BenchRunArgs) -> Result<()> {
    match FAMILIES.iter().find(|f| f.0 == a.scenario).map(|f| f.1) {
        Some(Family::Service(svc)) => return cmd_bench_services(svc, false, a),
        Some(Family::Sources) => return cmd_bench_services(services::Service::Dns, true, a),
        Some(Family::Readers) => return cmd_bench_readers(a),
        Some(Family::Cpu) => return cmd_bench_cpu(a),
        None => {}
    }
    let mut sc = scenario::load(&a.scenario)?;
    if let Some(d) = a.duration {
        sc.duration = d.as_secs_f64();
    }
    if let Some(r) = a.repeats {
        sc.repeats = r;
    }
    sc.validate().context("after --duration/--repeats")?;
    let out = a.out.map_or_else(|| default_out(&sc.name), Ok)?;
    let opts = sweep::SweepOpts { exe: sluice_exe()?, progress: true, interrupted: stop_flag()? };
    eprintln!("sluice bench: scenario {}, writing to {}", sc.name, out.display());
    let r = sweep::run(&sc, &opts, |partial| report::write_all(partial, &out))?;
    print!("{}", report::summary(&r));
    println!("report: {}", out.join("report.html").display());
    Ok(())
}

/// `bench run --scenario dns|http|sources`: a real service (see services/).
fn cmd_bench_services(svc: services::Service, sources: bool, a: BenchRunArgs) -> Result<()> {
    let secs = a.duration.map_or(8.0, |d| d.as_secs_f64());
    anyhow::ensure!(
        (2.0..=120.0).contains(&secs),
        "--duration: 2 to 120 seconds per cell for --scenario {}",
        svc.name()
    );
    let repeats = a.repeats.unwrap_or(1);
    anyhow::ensure!((1..=20).contains(&repeats), "--repeats: 1 to 20");
    let out = a.out.map_or_else(|| default_out(&a.scenario), Ok)?;
    let floods = match (a.floods.is_empty(), sources) {
        (false, _) => a.floods,
        (true, false) => services::FLOODS.to_vec(),
        (true, true) => services::SOURCE_FLOODS.to_vec(),
    };
    let o = services::ServiceOpts {
        exe: sluice_exe()?,
        secs,
        repeats,
        qps: a.qps as u64,
        conns: a.conns,
        keep_alive: a.keep_alive,
        floods,
        flood_pps: a.flood_rate.unwrap_or(services::FLOOD_PPS),
        sources,
        calm_loads: if svc == services::Service::Dns { a.calm_loads.into_iter().flatten().collect() } else { vec![] },
        neighbours: svc == services::Service::Dns && a.neighbours,
        interrupted: stop_flag()?,
    };
    eprintln!("sluice bench: scenario {}, writing to {}", a.scenario, out.display());
    let r = services::run(svc, &o, &out)?;
    print!("{}", services::summary(&r));
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

/// `bench run --scenario readers` (see readers.rs).
fn cmd_bench_readers(a: BenchRunArgs) -> Result<()> {
    let secs = a.duration.map_or(4.0, |d| d.as_secs_f64());
    anyhow::ensure!((1.0..=60.0).contains(&secs), "--duration: 1 to 60 seconds per cell for --scenario readers");
    let repeats = a.repeats.unwrap_or(1);
    anyhow::ensure!((1..=20).contains(&repeats), "--repeats: 1 to 20");
    let out = a.out.map_or_else(|| default_out("readers"), Ok)?;
    let o = readers::ReadersOpts { exe: sluice_exe()?, secs, repeats, interrupted: stop_flag()? };
    eprintln!("sluice bench: scenario readers, writing to {}", out.display());
    let cells = readers::run(&o, &out)?;
    print!("{}", readers::summary(&cells));
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

/// `bench run --scenario cpu` (see cpu.rs).
fn cmd_bench_cpu(a: BenchRunArgs) -> Result<()> {
    let secs = a.duration.map_or(4.0, |d| d.as_secs_f64());
    anyhow::ensure!((1.0..=60.0).contains(&secs), "--duration: 1 to 60 seconds per cell for --scenario cpu");
    let repeats = a.repeats.unwrap_or(1);
    anyhow::ensure!((1..=20).contains(&repeats), "--repeats: 1 to 20");
    let out = a.out.map_or_else(|| default_out("cpu"), Ok)?;
    let o = cpu::CpuOpts { exe: sluice_exe()?, secs, repeats, interrupted: stop_flag()? };
    eprintln!("sluice bench: scenario cpu, writing to {}", out.display());
    let cells = cpu::run(&o, &out)?;
    print!("{}", cpu::summary(&cells));
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

fn cmd_bench_step(a: StepArgs) -> Result<()> {
    let sc = scenario::load(&a.scenario)?;
    let out = a.out.map_or_else(|| default_out("step"), Ok)?;
    let opts = step::StepOpts {
        models: a.models,
        configs: a.configs,
        phase_secs: a.phase,
        flood: a.flood,
        exe: sluice_exe()?,
        progress: true,
    };
    eprintln!("sluice bench step: writing to {}", out.display());
    let r = step::run(&sc, &opts)?;
    step::write_all(&r, &out)?;
    print!("{}", step::summary(&r));
    println!("figures: {}", out.display());
    Ok(())
}

fn cmd_bench_demo(a: DemoArgs) -> Result<()> {
    // Ctrl-C or SIGTERM: remove this run's namespaces (and with them the veth
    // pair and the gate), then exit; the children stop on the same signal or
    // at the end of their --duration.
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            let mine = format!("{}{}-", victim::NS_PREFIX, std::process::id());
            let _ = sluice_testkit::testbed::cleanup_leftovers(&mine);
            eprintln!("sluice bench demo: interrupted; the testbed is removed");
            std::process::exit(128 + sig);
        }
    });
    let o = demo::DemoOpts { exe: sluice_exe()?, secs: a.duration.as_secs_f64(), qps: a.qps as u64 };
    demo::run(&o)?;
    Ok(())
}

fn cmd_bench_recovery(a: RecoveryArgs) -> Result<()> {
    let sc = scenario::load(&a.scenario)?;
    let out = a.out.map_or_else(|| default_out("recovery"), Ok)?;
    let opts = recovery::RecoveryOpts {
        models: a.models,
        configs: a.configs,
        floods: a.floods,
        calm: a.calm,
        flood: a.flood,
        exe: sluice_exe()?,
    };
    eprintln!("sluice bench recovery: writing to {}", out.display());
    let r = recovery::run(&sc, &opts)?;
    recovery::write_all(&r, &out)?;
    print!("{}", recovery::summary(&r));
    println!("figures: {}", out.display());
    Ok(())
}

fn cmd_bench_capture(a: CaptureArgs) -> Result<()> {
    let o = capture::CaptureOpts { capturers: a.capturers, frames: a.frames, gaps: a.gaps };
    let runs = capture::run(&o)?;
    print_json_or(a.json, &runs, |r| capture::summary(r))
}

fn cmd_bench_trace(a: TraceCostArgs) -> Result<()> {
    let o = trace_cost::Opts { exe: sluice_exe()?, rounds: a.rounds, secs: a.duration.as_secs_f64() };
    let r = trace_cost::run(&o)?;
    print_json_or(a.json, &r, trace_cost::summary)
}

fn cmd_bench_report(a: ReportArgs) -> Result<()> {
    let file = if a.path.is_dir() { a.path.join("results.json") } else { a.path };
    let r = report::load(&file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    report::write_all(&r, dir)?;
    print!("{}", report::summary(&r));
    println!("report: {}", dir.join("report.html").display());
    Ok(())
}

fn cmd_bench_scenarios() -> Result<()> {
    for scenario::Builtin { name, what, .. } in scenario::BUILTIN {
        println!("{name:<10} {what}");
    }
    for (name, _, what) in FAMILIES {
        println!("{name:<10} {what}");
    }
    Ok(())
}

fn cmd_bench_cleanup() -> Result<()> {
    let removed = victim::cleanup_leftovers()?;
    let names = if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) };
    println!("removed {} namespaces{names}", removed.len());
    Ok(())
}

fn cmd_bench_generator(a: GeneratorArgs) -> Result<()> {
    println!(
        "{:>10} {:>12} {:>10} {:>10} {:>12} {:>9}",
        "asked/s", "arrived/s", "late", "ring drops", "XDP seen", "error"
    );
    for c in gencheck::check(&a.rates, a.duration.as_secs_f64(), a.batch)? {
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

fn cmd_bench_idle(a: IdleArgs) -> Result<()> {
    let mut binaries = vec![sluice_exe()?];
    for b in &a.compare {
        anyhow::ensure!(b.exists(), "--compare {}: no such file", b.display());
        binaries.push(b.clone());
    }
    let r = sluice_bench::idle::run(&binaries, a.services, a.rounds as usize, a.window, !a.json)?;
    print_json_or(a.json, &r, sluice_bench::idle::render)
}

fn cmd_bench_tick(a: TickArgs) -> Result<()> {
    let r = tick_cost::run(a.services, a.rounds as usize, a.calls)?;
    print_json_or(a.json, &r, tick_cost::render)
}

fn cmd_bench_gate(a: GateArgs) -> Result<()> {
    let r = gate_cost::run(a.repeat, a.rounds as usize, !a.json)?;
    print_json_or(a.json, &r, gate_cost::render)
}
