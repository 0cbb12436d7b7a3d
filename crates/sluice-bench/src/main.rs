//! The `sluice-bench` command (`sluice bench ...` runs it): the commands and
//! their arguments (`args.rs`, validated by clap's value parsers), then one
//! `cmd_NAME` per command (`cmd.rs`).
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod cmd;

use args::*;
use cmd::*;

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
    /// results.json (rewritten after each run), step.csv, figures and summary.txt.
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
    /// writes results.json (rewritten after each run), summary.txt and figures. About 7 minutes per
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
    /// then its CPU under a closed-port flood (--flood-rate), its own work
    /// apart from the softirq charged to it; --compare measures other builds
    /// beside it, interleaved round by round.
    Idle(IdleArgs),
    /// A victim service for tests and demos, with a set CPU cost per
    /// datagram (the daemon's binary does not ship it).
    #[command(subcommand)]
    Serve(ServeCmd),
    /// A paced UDP sender over sockets (a few 100k packets/s; for tests and
    /// demos). Every run is bounded by --duration.
    Send(SendArgs),
}

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
        BenchCmd::Serve(ServeCmd::UdpEcho(a)) => cmd_serve_udp_echo(a),
        BenchCmd::Send(a) => cmd_send(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice bench: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
