//! The `sluice` command: argument structs (parsed and validated by clap's
//! value parsers), then one `cmd_NAME` function per subcommand that turns
//! them into the library's options, runs it, and prints the result. Exit
//! codes are decided in `main` only.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use sluice::policy::config::XdpMode;
use sluice::surface::cli::{parse_secs, print_json_or};
use sluice::{daemon, dataplane::classify, policy::config, surface::client, surface::stats};

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
    Sources(SourcesArgs),
    CheckConfig(CheckArgs),
    Trace(TraceArgs),
    /// Benchmarks that print numbers: runs `sluice-bench ARGS` (installed beside
    /// sluice); `sluice bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    Generate(GenerateArgs),
}

/// Attach the gate to an interface and enforce the classes until stopped.
///
/// With no config at all (`sluice run --iface eth0`), every UDP and TCP service
/// listening in this network namespace gets a class of its own (found again every
/// second), its priority from its process's nice value; traffic to no service goes
/// to the lowest class, and when a service shows distress the classes below it are
/// throttled, lowest first, until it recovers.
///
/// Loads the XDP program, attaches it through a bpf_link (so it detaches if the
/// daemon dies), and applies the classes from --config and/or --class. Serves
/// statistics on a Unix socket (mode 0600, default /run/sluice/IFACE.sock) and
/// Prometheus metrics (default http://127.0.0.1:9786/metrics). SIGHUP re-reads
/// the config file (a bad one is refused and the old one stays); SIGINT or
/// SIGTERM detach and print totals. Classes with rate=auto get their rate from
/// a controller that runs every 10 ms on the signals of the service's sockets
/// (found by the class's ports; a configured service must be listening first).
#[derive(Args)]
struct RunArgs {
    /// Interface to attach to (else `interface` from the config file).
    #[arg(long, short)]
    iface: Option<String>,
    /// TOML config file (see docs/config.md). Default:
    /// /etc/sluice/IFACE.toml if it exists (looked for again on SIGHUP), else
    /// none: zero-config protection.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// A class as NAME:KEY=VAL,... (repeatable; --help lists the keys).
    #[arg(long = "class", value_name = "SPEC", long_help = sluice::policy::config::class_flag_help())]
    classes: Vec<String>,
    /// Detach an XDP program already on the interface (attached with netlink) instead of refusing.
    #[arg(long)]
    replace: bool,
    /// Do not add a class for each listening service (same as discover = false in the file).
    /// By default every UDP and TCP service listening in this network namespace that no
    /// configured class matches gets an auto class, its priority from its process's nice value.
    #[arg(long)]
    no_discover: bool,
    /// Observe mode (same as mode = "observe" in the file): everything runs and
    /// is counted, nothing is dropped; status, metrics and the log show what
    /// would have been dropped. Roll sluice out this way first.
    #[arg(long)]
    observe: bool,
    /// XDP mode: native (in the driver, the default) or generic (after skb allocation).
    #[arg(long, value_parser = parse_mode)]
    xdp_mode: Option<XdpMode>,
    /// Statistics socket path.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Prometheus listen address ADDR:PORT, or "off".
    #[arg(long, value_parser = parse_metrics)]
    metrics: Option<Metrics>,
    /// Directory of the known sources' state file (known-IFACE.json): the
    /// clients each service answered while healthy, which come first under a
    /// flood, kept across restarts. Created if missing; a file that cannot be
    /// read is ignored with a log line.
    #[arg(long, value_name = "DIR", default_value = sluice::signals::known::STATE_DIR)]
    state_dir: PathBuf,
    /// Print the totals as JSON when stopping.
    #[arg(long)]
    json: bool,
    /// Log lines (stderr, the journal under systemd): "human" (sluice:
    /// MESSAGE) or "json" (one object per line: ts, level, event, msg and the
    /// event's fields). A line per limit or class change, at most 10 a second.
    #[arg(long, value_name = "FORMAT", value_parser = parse_log_format, default_value = "human")]
    log_format: sluice::base::log::Format,
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
    /// Print the JSON Schema of --json's output, each field described, and
    /// exit (no daemon needed; docs/status-json.md is made from it).
    #[arg(long, conflicts_with_all = ["json", "watch", "iface", "socket"])]
    schema: bool,
}

/// Follow every packet after the gate for a while: per class, how many
/// reached each receive stage (driver, stack, socket queue, the
/// application's read), how many the kernel dropped where and why (its own
/// drop reason names: NO_SOCKET, SOCKET_RCVBUFF, CPU_BACKLOG, ...), a ledger
/// that closes (admitted = queued + dropped + unaccounted), and the latency
/// of each stage on sampled packets (p50/p99 and mean +- 95% interval).
///
/// Uses tracepoints only (tp_btf), so it runs where kprobes and fentry do
/// not. With a daemon running on the interface it shares the gate's class
/// tables and reads its verdicts; without one, classes come from --config,
/// --class-spec and service discovery (as `sluice run` would make them) and the
/// ledger starts at the driver. Run it in the interface's network namespace.
/// Everything it attaches is detached when it ends (also on Ctrl-C).
#[derive(Args)]
struct TraceArgs {
    /// Interface to trace.
    #[arg(long, short)]
    iface: String,
    /// Only this class (as `sluice status` names it).
    #[arg(long)]
    class: Option<String>,
    /// How long to trace (e.g. 10, 10s, 500ms); Ctrl-C ends it early.
    #[arg(long, value_name = "SECS", value_parser = parse_secs, default_value = "10")]
    duration: Duration,
    /// Time about this many packets a second for the latency figures (1 in
    /// N, N set every 100 ms from the rate; 0 = no latency, least overhead).
    #[arg(long, value_name = "N", default_value_t = 2000)]
    samples_per_sec: u32,
    /// Without a daemon: the config file the classes come from.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Without a daemon: a class as for `sluice run --class` (repeatable).
    #[arg(long = "class-spec", value_name = "SPEC")]
    class_specs: Vec<String>,
    /// Without a daemon: do not add a class per listening service.
    #[arg(long)]
    no_discover: bool,
    /// The daemon's statistics socket, if not /run/sluice/IFACE.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the report as JSON (no progress lines).
    #[arg(long)]
    json: bool,
}

/// Show one class's source fairness: its quota per unknown source, the
/// prefix length sources are counted at, known and tracked sources, and the
/// sources that lost the most packets over their quota (from the daemon's
/// last scan of its maps, every 5 s).
#[derive(Args)]
struct SourcesArgs {
    /// The class (as `sluice status` names it).
    #[arg(long)]
    class: String,
    /// Print the class's part of the snapshot as JSON.
    #[arg(long)]
    json: bool,
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

/// Write the man pages (sluice.1, sluice-run.1, ...) and the bash, zsh and
/// fish completions, made from this command's own definition, into a
/// directory (for packagers; `make install` and `make deb` use it).
#[derive(Args)]
struct GenerateArgs {
    /// Directory to write into (created if missing): man/ and completions/ under it.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
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

fn parse_log_format(s: &str) -> Result<sluice::base::log::Format, String> {
    match s {
        "human" => Ok(sluice::base::log::Format::Human),
        "json" => Ok(sluice::base::log::Format::Json),
        _ => Err(format!("\"{s}\": valid formats are human and json")),
    }
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

// ---------------------------------------------------------------------------
// The commands.

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Status(a) => cmd_status(a),
        Cmd::Sources(a) => cmd_sources(a),
        Cmd::CheckConfig(a) => cmd_check_config(a),
        Cmd::Trace(a) => cmd_trace(a),
        Cmd::Bench { args } => cmd_bench(args),
        Cmd::Generate(a) => cmd_generate(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // "sluice: error: ..." (one JSON object with `run --log-format json`).
            sluice::base::log::error(format_args!("{e:#}"));
            ExitCode::from(1)
        }
    }
}

impl From<RunArgs> for daemon::RunOpts {
    fn from(a: RunArgs) -> Self {
        let config_if_present = match (&a.config, &a.iface) {
            (None, Some(i)) => Some(Path::new(daemon::CONFIG_DIR).join(format!("{i}.toml"))),
            _ => None,
        };
        daemon::RunOpts {
            iface: a.iface,
            config: a.config,
            config_if_present,
            classes: a.classes,
            replace: a.replace,
            xdp_mode: a.xdp_mode,
            socket: a.socket,
            metrics: a.metrics.map(|m| match m {
                Metrics::Off => None,
                Metrics::On(addr) => Some(addr),
            }),
            no_discover: a.no_discover,
            state_dir: Some(a.state_dir),
            observe: a.observe,
        }
    }
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let json = a.json;
    sluice::base::log::set_format(a.log_format);
    let snap = daemon::Daemon::start(a.into())?.run()?;
    print_json_or(json, &snap, stats::render_table)
}

fn cmd_trace(a: TraceArgs) -> Result<()> {
    let opts = sluice::surface::trace::TraceOpts {
        iface: a.iface,
        socket: a.socket,
        class: a.class,
        duration: a.duration,
        samples_per_sec: a.samples_per_sec,
        config: a.config,
        class_flags: a.class_specs,
        discover: !a.no_discover,
        progress: !a.json,
    };
    let report = sluice::surface::trace::run(&opts)?;
    print_json_or(a.json, &report, sluice::surface::trace::fate::render)
}

fn cmd_status(a: StatusArgs) -> Result<()> {
    if a.schema {
        println!("{}", serde_json::to_string_pretty(&stats::schema::status_schema())?);
        return Ok(());
    }
    let path = client::find_socket(a.socket.as_deref(), a.iface.as_deref())?;
    loop {
        let snap = client::fetch_snapshot(&path)?;
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

fn cmd_sources(a: SourcesArgs) -> Result<()> {
    let path = client::find_socket(a.socket.as_deref(), a.iface.as_deref())?;
    let snap = client::fetch_snapshot(&path)?;
    let table = sluice::surface::stats::render_sources_class(&snap, &a.class).map_err(anyhow::Error::msg)?;
    if a.json {
        let c = snap.classes.iter().find(|c| c.name == a.class).expect("render_class found it");
        println!("{}", serde_json::to_string_pretty(&c.sources)?);
    } else {
        print!("{table}");
    }
    Ok(())
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
    if cfg.discover {
        print_discovered(&cfg);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&cfg)?);
    }
    Ok(())
}

/// What discovery would add to `cfg` here and now (read-only: sock_diag and /proc).
fn print_discovered(cfg: &config::Config) {
    let services = sluice::signals::discover::Discovery::new(0).and_then(|mut d| d.poll());
    match services {
        Ok(services) => {
            let (merged, note) = sluice::signals::discover::merge(cfg, &services);
            let added: Vec<_> = merged.classes.iter().filter(|c| c.discovered.is_some()).collect();
            println!(
                "discover = true: {} services listen in this network namespace; {} covered by configured classes, {} would get classes:",
                services.len(),
                note.covered,
                added.len()
            );
            for c in added {
                println!("  {} (priority {}): {}", c.name, c.priority, c.discovered.as_deref().unwrap_or_default());
            }
        }
        Err(e) => println!("discover = true: the listening services could not be read here ({e:#})"),
    }
}

/// `sluice bench ARGS`: run `sluice-bench ARGS`, found beside this binary
/// (else on PATH), as git and cargo run their subcommands.
fn cmd_bench(args: Vec<std::ffi::OsString>) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()?.with_file_name("sluice-bench");
    let exe = if beside.exists() { beside } else { PathBuf::from("sluice-bench") };
    let err = std::process::Command::new(&exe).args(args).exec();
    Err(anyhow::anyhow!(
        "running {}: {err} (the bench is the sluice-bench binary: `make build` builds it)",
        exe.display()
    ))
}

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    let (man, completions) = (a.out.join("man"), a.out.join("completions"));
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    clap_mangen::generate_to(Cli::command(), &man)
        .with_context(|| format!("writing man pages to {}", man.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "sluice", &completions)
            .with_context(|| format!("writing {shell} completions to {}", completions.display()))?;
    }
    println!("wrote man pages to {} and completions to {}", man.display(), completions.display());
    Ok(())
}
