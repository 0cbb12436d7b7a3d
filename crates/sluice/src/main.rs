//! The `sluice` command: a thin layer of argument parsing over the library.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

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
    #[arg(long)]
    metrics: Option<String>,
    /// Print the totals as JSON when stopping.
    #[arg(long)]
    json: bool,
}

fn parse_mode(s: &str) -> Result<XdpMode, String> {
    match s {
        "native" => Ok(XdpMode::Native),
        "generic" => Ok(XdpMode::Generic),
        _ => Err(format!("\"{s}\": valid modes are native and generic")),
    }
}

/// Show a running daemon's classes, rates and counters.
#[derive(Args)]
struct StatusArgs {
    /// Print the snapshot as JSON (for scripts).
    #[arg(long)]
    json: bool,
    /// Refresh every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
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
    Run {
        /// A built-in scenario name or a TOML scenario file.
        #[arg(long, short, default_value = "default")]
        scenario: String,
        /// Output folder (default: results/SCENARIO-TIMESTAMP).
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// Override the scenario's seconds per level.
        #[arg(long)]
        duration: Option<f64>,
        /// Override the scenario's repeats per level.
        #[arg(long)]
        repeats: Option<u32>,
    },
    /// How each configuration follows changes: a flood, then the service's
    /// cost doubles and is restored, then the flood stops and resumes, in one
    /// continuous run per configuration. Prints settling time, overshoot and
    /// the admitted rate's coefficient of variation per phase; writes
    /// step.json, step.csv, figures and summary.txt.
    Step {
        /// Victim models (nic, same-core).
        #[arg(long, value_delimiter = ',', default_value = "nic")]
        models: Vec<String>,
        /// Configurations (off, nft, static, auto, auto-pno, auto-idle).
        #[arg(long, value_delimiter = ',', default_value = "static,auto,auto-pno")]
        configs: Vec<String>,
        /// Seconds per phase (5 phases).
        #[arg(long, default_value_t = 3.0)]
        phase: f64,
        /// Flood rate as a multiple of the calibrated peak.
        #[arg(long, default_value_t = 3.0)]
        flood: f64,
        /// The scenario whose streams and victim are used.
        #[arg(long, short, default_value = "default")]
        scenario: String,
        /// Output folder (default: results/step-TIMESTAMP).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Render the outputs again from a results.json.
    Report {
        /// results.json, or the folder holding it.
        path: PathBuf,
    },
    /// List the built-in scenarios.
    Scenarios,
    /// Remove namespaces a killed bench left behind (sluice-bench-*).
    Cleanup,
    /// The generator's accuracy and highest paced rate, counted on the victim's side.
    Generator {
        /// Rates to try, packets/s (e.g. 10k,100k,1M,3M).
        #[arg(long, value_delimiter = ',', default_value = "10k,100k,1M,3M,5M")]
        rates: Vec<String>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        /// Frames per flush, 1-256 (bursts never exceed it).
        #[arg(long, default_value_t = sluice::bench::gen::DEFAULT_BATCH)]
        batch: u32,
    },
    /// Gate cost in ns per packet (BPF_PROG_TEST_RUN) with 1, 64 and 1024 rules, beside a no-op floor.
    Gate {
        /// Repeats per test-run call.
        #[arg(long, default_value_t = 2_000_000)]
        repeat: u32,
        /// Interleaved rounds, one call per case each (the median is reported).
        #[arg(long, default_value_t = 31)]
        rounds: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Victim services for demos and benchmarks.
#[derive(Subcommand)]
enum ServeCmd {
    /// A UDP echo service that spends --work-ns of CPU per datagram.
    UdpEcho {
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
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
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
    },
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
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
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

fn secs(s: f64, what: &str) -> Result<Duration> {
    anyhow::ensure!(s.is_finite() && s > 0.0 && s < 1e6, "{what} must be a positive number of seconds, got {s}");
    Ok(Duration::from_secs_f64(s))
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run(a) => {
            let opts = daemon::RunOpts {
                iface: a.iface,
                config: a.config,
                classes: a.classes,
                replace: a.replace,
                xdp_mode: a.xdp_mode,
                socket: a.socket,
                metrics: a.metrics,
            };
            let snap = daemon::Daemon::start(opts)?.run()?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&snap)?);
            } else {
                print!("{}", stats::render_table(&snap));
            }
        }
        Cmd::Status(a) => {
            let path = daemon::find_socket(a.socket.as_deref(), a.iface.as_deref())?;
            loop {
                let snap = daemon::fetch_snapshot(&path)?;
                if a.json {
                    println!("{}", serde_json::to_string_pretty(&snap)?);
                } else {
                    if a.watch.is_some() {
                        print!("\x1b[2J\x1b[H");
                    }
                    print!("{}", stats::render_table(&snap));
                }
                match a.watch {
                    Some(s) => std::thread::sleep(secs(s, "--watch")?),
                    None => break,
                }
            }
        }
        Cmd::CheckConfig(a) => {
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
        }
        Cmd::Bench(BenchCmd::Gate { repeat, rounds, json }) => {
            anyhow::ensure!(rounds > 0 && repeat > 0, "--rounds and --repeat must be at least 1");
            let r = bench_gate::run(repeat, rounds, !json)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", bench_gate::render(&r));
            }
        }
        Cmd::Bench(BenchCmd::Run { scenario, out, duration, repeats }) => {
            let mut sc = sluice::bench::scenario::load(&scenario)?;
            if let Some(d) = duration {
                sc.duration = d;
            }
            if let Some(r) = repeats {
                sc.repeats = r;
            }
            sc.validate().context("after --duration/--repeats")?;
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            let out = out.unwrap_or_else(|| PathBuf::from(format!("results/{}-{stamp}", sc.name)));
            let interrupted = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, interrupted.clone())?;
            }
            let opts = sluice::bench::sweep::SweepOpts { exe: std::env::current_exe()?, progress: true, interrupted };
            eprintln!("sluice bench: scenario {}, writing to {}", sc.name, out.display());
            let r = sluice::bench::sweep::run(&sc, &opts, |partial| sluice::bench::report::write_all(partial, &out))?;
            print!("{}", sluice::bench::report::summary(&r));
            println!("report: {}", out.join("report.html").display());
        }
        Cmd::Bench(BenchCmd::Step { models, configs, phase, flood, scenario, out }) => {
            use sluice::bench::scenario::ConfigKind;
            let sc = sluice::bench::scenario::load(&scenario)?;
            let models = models.iter().map(|m| sluice::bench::testbed::VictimModel::parse(m)).collect::<Result<Vec<_>>>()?;
            let configs = configs.iter().map(|c| ConfigKind::parse(c)).collect::<Result<Vec<_>>>()?;
            anyhow::ensure!((0.5..=60.0).contains(&phase), "--phase: 0.5 to 60 seconds");
            anyhow::ensure!(flood > 0.0 && flood <= 100.0, "--flood: a multiple of the peak, above 0 and at most 100");
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            let out = out.unwrap_or_else(|| PathBuf::from(format!("results/step-{stamp}")));
            let opts = sluice::bench::step::StepOpts { models, configs, phase_secs: phase, flood, exe: std::env::current_exe()?, progress: true };
            eprintln!("sluice bench step: writing to {}", out.display());
            let r = sluice::bench::step::run(&sc, &opts)?;
            sluice::bench::step::write_all(&r, &out)?;
            print!("{}", sluice::bench::step::summary(&r));
            println!("figures: {}", out.display());
        }
        Cmd::Bench(BenchCmd::Report { path }) => {
            let file = if path.is_dir() { path.join("results.json") } else { path.clone() };
            let r = sluice::bench::report::load(&file)?;
            let dir = file.parent().unwrap_or(std::path::Path::new("."));
            sluice::bench::report::write_all(&r, dir)?;
            print!("{}", sluice::bench::report::summary(&r));
            println!("report: {}", dir.join("report.html").display());
        }
        Cmd::Bench(BenchCmd::Scenarios) => {
            for (name, _, what) in sluice::bench::scenario::BUILTIN {
                println!("{name:<10} {what}");
            }
        }
        Cmd::Bench(BenchCmd::Generator { rates, secs: s, batch }) => {
            let rates = rates.iter().map(|r| config::parse_count(r).map(|x| x as f64).map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
            secs(s, "--secs")?;
            println!("{:>10} {:>12} {:>10} {:>10} {:>12} {:>9}", "asked/s", "arrived/s", "late", "ring drops", "XDP seen", "error");
            for c in sluice::bench::gencheck::check(&rates, s, batch)? {
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
        }
        Cmd::Bench(BenchCmd::Cleanup) => {
            let removed = sluice::bench::testbed::cleanup_leftovers()?;
            println!("removed {} namespaces{}", removed.len(), if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) });
        }
        Cmd::Serve(ServeCmd::UdpEcho { port, addr, work_ns, duration, no_echo, readers, rcvbuf, work_file, json }) => {
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone())?;
            }
            let o = serve::ServeOpts {
                bind: SocketAddr::new(addr, port),
                work_ns,
                duration: duration.map(|d| secs(d, "--duration")).transpose()?,
                no_echo,
                readers: readers as usize,
                rcvbuf,
                work_file,
            };
            let r = serve::udp_echo(&o, stop).with_context(|| format!("serving UDP on {}", o.bind))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "received {} datagrams in {:.1} s ({}/s), echoed {}",
                    r.received,
                    r.secs,
                    stats::human(r.received as f64 / r.secs.max(1e-9)),
                    r.echoed
                );
            }
        }
        Cmd::Send(a) => {
            let o = send::SendOpts {
                dst: a.dst,
                rate: a.rate,
                duration: secs(a.duration, "--duration")?,
                payload: a.payload,
                flows: a.flows,
            };
            let r = send::send_udp(&o).with_context(|| format!("sending to {}", o.dst))?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("sent {} datagrams in {:.1} s ({}/s), {} refused by the kernel", r.sent, r.secs, stats::human(r.rate()), r.refused);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
