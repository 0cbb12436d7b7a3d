//! One `cmd_NAME` per `sluice bench` command: it runs the benchmark and
//! prints or writes what it measured.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use sluice::surface::cli::{print_json_or, stop_flag};
use sluice::surface::stats;
use sluice_bench::load::gencheck;
use sluice_bench::scenarios::{recovery, scenario, step, sweep};
use sluice_bench::studies::{capture, cpu, demo, gate_cost, readers, tick_cost, trace_cost};
use sluice_bench::testbed::victim;
use sluice_bench::{report, services};

use crate::args::*;
use sluice_bench::testbed::cpu_plan;

/// The `sluice` binary beside this one: the bench runs its `run` and
/// `status` (and this binary's own `serve` and `send`, found beside it:
/// [`sluice_bench::load_exe`]).
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

pub(crate) fn cmd_bench_run(a: BenchRunArgs) -> Result<()> {
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
pub(crate) fn cmd_bench_services(svc: services::Service, sources: bool, a: BenchRunArgs) -> Result<()> {
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
        php: a.php,
        floods,
        flood_pps: a.flood_rate.unwrap_or(services::FLOOD_PPS),
        sources,
        calm_loads: if svc == services::Service::Dns { a.calm_loads.into_iter().flatten().collect() } else { vec![] },
        neighbours: svc == services::Service::Dns && a.neighbours,
        clients_cpu: match a.clients_cpu {
            Some(cpu) => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                anyhow::ensure!(cpu < n, "--clients-cpu {cpu}: this host runs CPUs 0 to {}", n - 1);
                cpu
            }
            None => cpu_plan::here().generator(),
        },
        gen_cpus: gen_cpus(a.gen_workers)?,
        queues: a.queues.unwrap_or_else(cpu_plan::queues),
        interrupted: stop_flag()?,
    };
    eprintln!("sluice bench: scenario {}, writing to {}", a.scenario, out.display());
    let r = services::run(svc, &o, &out)?;
    print!("{}", services::summary(&r));
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

/// The CPUs of `--gen-workers` workers: the plan's first generator CPUs
/// (all of them unless told).
fn gen_cpus(workers: Option<u32>) -> Result<Vec<usize>> {
    let cpus = &cpu_plan::here().generators;
    let n = workers.map_or(cpus.len(), |n| n as usize);
    anyhow::ensure!(
        n <= cpus.len(),
        "--gen-workers {n}: this machine's CPU plan has {} generator CPU(s) ({:?}: one a core the service and the control do not use); ask at most {}",
        cpus.len(),
        cpus,
        cpus.len()
    );
    Ok(cpus[..n].to_vec())
}

/// `bench run --scenario readers` (see readers.rs).
pub(crate) fn cmd_bench_readers(a: BenchRunArgs) -> Result<()> {
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
pub(crate) fn cmd_bench_cpu(a: BenchRunArgs) -> Result<()> {
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

pub(crate) fn cmd_bench_step(a: StepArgs) -> Result<()> {
    let sc = scenario::load(&a.scenario)?;
    let out = a.out.map_or_else(|| default_out("step"), Ok)?;
    let opts = step::StepOpts {
        models: a.models,
        configs: a.configs,
        phase_secs: a.phase,
        flood: a.flood,
        exe: sluice_exe()?,
        interrupted: stop_flag()?,
    };
    eprintln!("sluice bench step: writing to {}", out.display());
    let r = step::run(&sc, &opts, &out)?;
    step::write_all(&r, &out)?;
    print!("{}", step::summary(&r));
    println!("figures: {}", out.display());
    Ok(())
}

pub(crate) fn cmd_bench_demo(a: DemoArgs) -> Result<()> {
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
    let outcome = demo::run(&o)?;
    // For the report `bench run --out` writes into the same folder.
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let file = a.out.join(report::DNS_DEMO_FILE);
    std::fs::write(&file, serde_json::to_string_pretty(&outcome)?)?;
    println!(
        "(verdict and table written to {}; `sluice bench run --out {}` puts them in its report)",
        file.display(),
        a.out.display()
    );
    Ok(())
}

pub(crate) fn cmd_bench_recovery(a: RecoveryArgs) -> Result<()> {
    let sc = scenario::load(&a.scenario)?;
    let out = a.out.map_or_else(|| default_out("recovery"), Ok)?;
    let opts = recovery::RecoveryOpts {
        models: a.models,
        configs: a.configs,
        floods: a.floods,
        calm: a.calm,
        flood: a.flood,
        exe: sluice_exe()?,
        interrupted: stop_flag()?,
    };
    eprintln!("sluice bench recovery: writing to {}", out.display());
    let r = recovery::run(&sc, &opts, &out)?;
    recovery::write_all(&r, &out)?;
    print!("{}", recovery::summary(&r));
    println!("figures: {}", out.display());
    Ok(())
}

pub(crate) fn cmd_bench_capture(a: CaptureArgs) -> Result<()> {
    let o = capture::CaptureOpts { capturers: a.capturers, frames: a.frames, gaps: a.gaps };
    let runs = capture::run(&o)?;
    print_json_or(a.json, &runs, |r| capture::summary(r))
}

pub(crate) fn cmd_bench_trace(a: TraceCostArgs) -> Result<()> {
    let o = trace_cost::Opts { exe: sluice_exe()?, rounds: a.rounds, secs: a.duration.as_secs_f64() };
    let r = trace_cost::run(&o)?;
    print_json_or(a.json, &r, trace_cost::summary)
}

pub(crate) fn cmd_bench_report(a: ReportArgs) -> Result<()> {
    let file = if a.path.is_dir() { a.path.join("results.json") } else { a.path };
    let r = report::load(&file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    report::write_all(&r, dir)?;
    print!("{}", report::summary(&r));
    println!("report: {}", dir.join("report.html").display());
    Ok(())
}

pub(crate) fn cmd_bench_scenarios() -> Result<()> {
    for scenario::Builtin { name, what, .. } in scenario::BUILTIN {
        println!("{name:<10} {what}");
    }
    for (name, _, what) in FAMILIES {
        println!("{name:<10} {what}");
    }
    Ok(())
}

pub(crate) fn cmd_bench_cleanup() -> Result<()> {
    let removed = victim::cleanup_leftovers()?;
    let names = if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) };
    println!("removed {} namespaces{names}", removed.len());
    Ok(())
}

pub(crate) fn cmd_bench_generator(a: GeneratorArgs) -> Result<()> {
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

pub(crate) fn cmd_bench_idle(a: IdleArgs) -> Result<()> {
    let mut binaries = vec![sluice_exe()?];
    for b in &a.compare {
        anyhow::ensure!(b.exists(), "--compare {}: no such file", b.display());
        binaries.push(b.clone());
    }
    let r =
        sluice_bench::studies::idle::run(&binaries, (a.services, a.flood_rate), a.rounds as usize, a.window, !a.json)?;
    print_json_or(a.json, &r, sluice_bench::studies::idle::render)
}

pub(crate) fn cmd_bench_tick(a: TickArgs) -> Result<()> {
    let r = tick_cost::run(a.services, a.rounds as usize, a.calls)?;
    print_json_or(a.json, &r, tick_cost::render)
}

pub(crate) fn cmd_bench_gate(a: GateArgs) -> Result<()> {
    let r = gate_cost::run(a.repeat, a.rounds as usize, !a.json)?;
    print_json_or(a.json, &r, gate_cost::render)
}

pub(crate) fn cmd_serve_udp_echo(a: UdpEchoArgs) -> Result<()> {
    let o = sluice_bench::testbed::serve::ServeOpts {
        bind: SocketAddr::new(a.addr, a.port),
        work_ns: a.work_ns,
        duration: a.duration,
        no_echo: a.no_echo,
        readers: a.readers as usize,
        threads: a.threads as usize,
        stall: a.stall.map(|ms| (Duration::from_millis(ms), Duration::from_millis(a.stall_every))),
        rcvbuf: a.rcvbuf,
        work_file: a.work_file,
    };
    let r = sluice_bench::testbed::serve::udp_echo(&o, stop_flag()?)
        .with_context(|| format!("serving UDP on {}", o.bind))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let rate = stats::human(r.received as f64 / r.secs.max(1e-9));
        println!("received {} datagrams in {:.1} s ({rate}/s), echoed {}", r.received, r.secs, r.echoed);
    }
    Ok(())
}

pub(crate) fn cmd_send(a: SendArgs) -> Result<()> {
    let o = sluice_bench::load::send::SendOpts {
        dst: a.dst,
        src: a.src,
        rate: a.rate,
        duration: a.duration,
        payload: a.payload,
        flows: a.flows,
        burst: a.burst,
        answers: a.answers,
    };
    let r = sluice_bench::load::send::send_udp(&o).with_context(|| format!("sending to {}", o.dst))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "sent {} datagrams in {:.1} s ({}/s), {} refused by the kernel{}",
            r.sent,
            r.secs,
            stats::human(r.rate()),
            r.refused,
            r.answered.map_or(String::new(), |n| format!(", {n} answered"))
        );
    }
    Ok(())
}
