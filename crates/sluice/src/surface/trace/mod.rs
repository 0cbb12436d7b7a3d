//! `sluice trace`: the command. It finds the classes (a running daemon's, or
//! its own from the config and discovery), starts the tracer
//! (`dataplane::trace`) on the gate's tables, and makes the report
//! (`fate.rs`: where each class's packets went, and each stage's latency).
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::bpf_intf::SLUICE_TRACE_UNCLASSIFIED;
use crate::dataplane::gate::counters::ClassTotals;
use crate::dataplane::trace::{gate_maps, Counts, Options, Tables, Tracer};
use fate::{ClassFate, Drop, GateCounts, Interval, Report, StageCounts, INTERVALS, REPORT_VERSION};

pub mod fate;

/// `sluice trace` options.
pub struct TraceOpts {
    pub iface: String,
    /// The daemon's statistics socket (default: /run/sluice/IFACE.sock).
    pub socket: Option<PathBuf>,
    /// Only this class in the report.
    pub class: Option<String>,
    pub duration: Duration,
    /// Time about this many packets per second (1 in N, N from the rate); 0 = no latency.
    pub samples_per_sec: u32,
    /// Without a daemon: the config the classes come from, and whether to discover services.
    pub config: Option<PathBuf>,
    pub class_flags: Vec<String>,
    pub discover: bool,
    /// Print a line a second to stderr.
    pub progress: bool,
}

/// Where the class names and the gate's counters come from.
struct Source {
    names: Vec<String>,
    default_class: u32,
    gate: Option<(u32, String)>,
    own: Option<crate::dataplane::classify::Tables>,
}

/// The snapshot of a daemon on this interface, if one runs.
fn daemon_snapshot(o: &TraceOpts, ifindex: u32) -> Option<crate::surface::stats::Snapshot> {
    crate::surface::client::find_socket(o.socket.as_deref(), Some(&o.iface))
        .ok()
        .and_then(|p| crate::surface::client::fetch_snapshot(&p).ok())
        .filter(|s| s.ifindex == ifindex)
}

fn daemon_names(o: &TraceOpts, ifindex: u32) -> Option<Vec<String>> {
    daemon_snapshot(o, ifindex).map(|s| names_by_gate_id(&s.classes))
}

/// A daemon's class names by the gate's id ("" where no class holds the
/// id): the gate's maps and the tracer count by id.
fn names_by_gate_id(classes: &[crate::surface::stats::ClassSnapshot]) -> Vec<String> {
    let mut names = Vec::new();
    for c in classes {
        let id = c.gate_id.map_or(c.id, |g| g as usize);
        if names.len() <= id {
            names.resize(id + 1, String::new());
        }
        names[id] = c.name.clone();
    }
    names
}

fn find_source(o: &TraceOpts, ifindex: u32) -> Result<Source> {
    if let Some(s) = daemon_snapshot(o, ifindex) {
        let names = names_by_gate_id(&s.classes);
        let default_class = s.classes.iter().find(|c| c.is_default).map_or(0, |c| c.gate_id.unwrap_or(c.id as u32));
        return Ok(Source {
            names,
            default_class,
            gate: Some((s.prog_id, format!("daemon pid {}", s.pid))),
            own: None,
        });
    }
    let mut cfg = crate::policy::config::resolve(o.config.as_deref(), &o.class_flags)?;
    if o.discover && cfg.discover {
        let mut d = crate::signals::discover::Discovery::new(ifindex)?;
        cfg = crate::signals::discover::merge(&cfg, &d.poll()?).0;
    }
    let tables = crate::dataplane::classify::compile(&cfg)?;
    let names = cfg.names().into_iter().map(String::from).collect();
    Ok(Source { names, default_class: cfg.default_class as u32, gate: None, own: Some(tables) })
}

/// 1 in N so that about `per_sec` packets a second are timed at `rate` packets/s.
pub fn sample_every_for(rate: f64, per_sec: u32) -> u32 {
    if per_sec == 0 {
        return 0;
    }
    (rate / per_sec as f64).ceil().clamp(1.0, 1e6) as u32
}

/// Run a trace for `o.duration` (or until SIGINT/SIGTERM) and report.
pub fn run(o: &TraceOpts) -> Result<Report> {
    crate::dataplane::gate::check_privileges()?;
    let ifindex = crate::dataplane::gate::ifindex(&o.iface)?;
    let src = find_source(o, ifindex)?;
    if let Some(want) = &o.class {
        if !src.names.iter().any(|n| n == want) {
            bail!("--class {want}: no such class on {} (classes: {})", o.iface, src.names.join(", "));
        }
    }
    let tables = match (&src.gate, &src.own) {
        (Some((id, _)), _) => Tables::Gate(gate_maps(*id)?),
        (None, Some(t)) => Tables::Own(t),
        (None, None) => unreachable!("find_source gives a gate or tables"),
    };
    let opts = Options {
        ifindex,
        netns: crate::base::netns::current_inode()?,
        default_class: src.default_class,
        drops_only: false,
        tgid: None,
    };
    let mut tracer = Tracer::start(&opts, tables)?;
    let gate_before = tracer.gate_totals(src.names.len())?;
    let stop = crate::surface::cli::stop_flag()?;
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut progress_at = Instant::now();
    // Start timing at a low rate; adjusted each second from the driver stage's rate.
    tracer.set_sample_every(if o.samples_per_sec == 0 { 0 } else { 64 });
    while started.elapsed() < o.duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100).min(o.duration.saturating_sub(started.elapsed())));
        let driver = tracer.driver_total()?;
        let rate = (driver - last.1) as f64 / last.0.elapsed().as_secs_f64();
        tracer.set_sample_every(sample_every_for(rate, o.samples_per_sec));
        last = (Instant::now(), driver);
        if progress_at.elapsed() >= Duration::from_secs(1) {
            progress_at = Instant::now();
            let c = tracer.counts()?;
            if o.progress {
                let dropped: u64 = c.drops.values().sum();
                eprintln!(
                    "trace {:>4.0} s: {:.0} pkt/s at the driver, {} dropped after the gate so far",
                    started.elapsed().as_secs_f64(),
                    rate,
                    dropped
                );
            }
        }
    }
    let counts = tracer.counts()?;
    let gate_after = tracer.gate_totals(src.names.len())?;
    let mut notes = Vec::new();
    let gate_counts = match gate_before.zip(gate_after) {
        Some(g) if src.gate.is_some() && daemon_names(o, ifindex).as_ref() != Some(&src.names) => {
            notes.push(format!(
                "the daemon's classes changed during the trace (a reload, or discovery found or lost a service): \
                 gate counts left out, and packets may be counted under the class that had their id before ({g_len} classes at the start)",
                g_len = g.0.len()
            ));
            None
        }
        g => g,
    };
    let duration_secs = started.elapsed().as_secs_f64();
    let sample_every = tracer.sample_every();
    let mut report = build_report(&tracer, &counts, &src, gate_counts, o, duration_secs, sample_every);
    report.notes = notes;
    drop(tracer);
    Ok(report)
}

fn build_report(
    tracer: &Tracer,
    counts: &Counts,
    src: &Source,
    gate: Option<(Vec<ClassTotals>, Vec<ClassTotals>)>,
    o: &TraceOpts,
    duration_secs: f64,
    sample_every: u32,
) -> Report {
    let mut classes = Vec::new();
    for (id, name) in src.names.iter().enumerate() {
        if name.is_empty() || o.class.as_ref().is_some_and(|c| c != name) {
            continue;
        }
        let g = gate.as_ref().map(|(before, after)| GateCounts::between(&before[id], &after[id]));
        let stages = StageCounts::from_array(counts.stage_in[id]);
        let mut fate = ClassFate::new(id, name.clone(), g, stages, drops_of(tracer, counts, id as u32));
        fate.latency = INTERVALS.iter().enumerate().map(|(i, n)| Interval::of(n, &counts.latency[id][i])).collect();
        if o.class.is_some() || !fate.is_empty() {
            classes.push(fate);
        }
    }
    Report {
        version: REPORT_VERSION,
        interface: o.iface.clone(),
        duration_secs,
        gate: src.gate.as_ref().map(|(_, who)| who.clone()),
        sample_every,
        classes,
        unclassified_drops: drops_of(tracer, counts, SLUICE_TRACE_UNCLASSIFIED),
        notes: Vec::new(),
    }
}

/// A class's drops as (stage, reason, packets).
pub fn drops_of(tracer: &Tracer, counts: &Counts, class: u32) -> Vec<Drop> {
    counts
        .drops
        .iter()
        .filter(|((c, _), n)| *c == class && **n > 0)
        .map(|((_, r), n)| Drop::new(tracer.reason_name(*r), *n))
        .collect()
}
