//! `sluice bench gate`: the gate's cost per packet, measured in the kernel with
//! BPF_PROG_TEST_RUN and a large repeat, beside a no-op XDP program (the floor
//! of the test-run loop itself) in the same run.
use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use indicatif::{ProgressBar, ProgressStyle};
use sluice::classify;
use sluice::config::{self, Config, Limit};
use sluice::gate::{Gate, Prog, XDP_DROP, XDP_PASS};
use sluice::packet::{v6, Frame};
use sluice::share::share;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: String,
    pub verdict: String,
    /// Median ns per packet for 1, 64 and 1024 rules.
    pub ns: Vec<f64>,
    /// Fastest round, ns per packet, for 1, 64 and 1024 rules.
    pub min_ns: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rules: Vec<usize>,
    pub noop_ns: f64,
    pub noop_min_ns: f64,
    pub rows: Vec<Row>,
    pub repeat: u32,
    pub rounds: usize,
}

/// A config with `n` port rules in 63 classes; the bench's packets match the
/// class "bench" (rule n-1, the last one) whose limit is `rate`.
fn config_with_rules(n: usize, rate: &str, prefixes: bool) -> Result<Config> {
    let mut flags = Vec::new();
    // n-1 filler rules over 62 filler classes, on other ports (and other sources).
    let mut per_class: Vec<Vec<String>> = vec![vec![]; 62];
    for i in 0..n - 1 {
        let rule = if prefixes {
            format!("match=udp:7000@10.{}.{}.0/24", 100 + i / 256, i % 256)
        } else {
            format!("match=udp:{}", 10_000 + i)
        };
        per_class[i % 62].push(rule);
    }
    for (c, rules) in per_class.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        flags.push(format!("filler{c}:{}", rules.join(",")));
    }
    let src = if prefixes { "@10.0.0.0/24" } else { "" };
    flags.push(format!("bench:rate={rate},burst=1000000,match=udp:7000{src},match=tcp:7000,match=udp:7001"));
    Ok(config::from_flags(&flags)?)
}

/// Mean ns per packet of one test-run call of `repeat` runs, as the kernel
/// measures it (whole ns). Timing the call from here would add the ~10-20 ms
/// the kernel spends switching the XDP dispatcher around a repeated run.
fn measure(gate: &Gate, prog: Prog, pkt: &[u8], want: u32, repeat: u32) -> Result<f64> {
    let (verdict, mean) = gate.test_run(prog, pkt, repeat)?;
    anyhow::ensure!(verdict == want, "bench packet got verdict {verdict}, expected {want}");
    Ok(mean.as_nanos() as f64)
}

/// The median of the rounds (there is at least one: `rounds` >= 1 is checked).
fn median(v: &mut [f64]) -> f64 {
    sluice::summary::median(v).unwrap_or(f64::NAN)
}

/// One measured configuration: a loaded gate, the packet, the verdict it must get.
struct Cell {
    gate: Gate,
    pkt: Vec<u8>,
    verdict: u32,
    samples: Vec<f64>,
}

/// Run every case with 1, 64 and 1024 rules, and the no-op floor, in
/// interleaved rounds (so drifts of the machine hit all of them alike); report
/// the median of the rounds.
pub fn run(repeat: u32, rounds: usize, progress: bool) -> Result<Report> {
    sluice::gate::check_privileges()?;
    // Run on one CPU; each gate gives that CPU the class's whole limit.
    pin_to_cpu(0);
    let rules = vec![1usize, 64, 1024];
    let v4_udp = Frame::udp("10.0.0.1", "10.0.0.2", 1234, 7000).frame_len(64).build();
    let v6_udp = Frame::udp(&v6(1), &v6(2), 1234, 7000).frame_len(64).build();
    let v4_tcp = Frame::tcp("10.0.0.1", "10.0.0.2", 1234, 7000).frame_len(64).build();
    let cases: Vec<(&str, &[u8], &str, u32, bool)> = vec![
        ("IPv4 UDP, admitted", &v4_udp, "1G", XDP_PASS, false),
        ("IPv4 UDP, dropped by rate", &v4_udp, "1", XDP_DROP, false),
        ("IPv6 UDP, admitted", &v6_udp, "1G", XDP_PASS, false),
        ("IPv4 TCP, admitted", &v4_tcp, "1G", XDP_PASS, false),
        ("IPv4 UDP, source-prefix rules, admitted", &v4_udp, "1G", XDP_PASS, true),
    ];
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    for (_, pkt, rate, verdict, prefixes) in &cases {
        let mut row = Vec::new();
        for &n in &rules {
            let cfg = config_with_rules(n, rate, *prefixes)?;
            let mut gate = Gate::load()?;
            gate.apply(&cfg, &classify::compile(&cfg)?)?;
            let bench = cfg.class_id("bench").expect("the bench class");
            if let Limit::Rate { pps, burst } = cfg.classes[bench].limit {
                gate.set_shares(bench, &vec![share(pps, burst); gate.ncpus()])?;
            }
            // Drain the burst so "dropped by rate" measures the drop path.
            gate.test_run(Prog::Gate, pkt, 2_000_000)?;
            row.push(Cell { gate, pkt: pkt.to_vec(), verdict: *verdict, samples: vec![] });
        }
        cells.push(row);
    }
    let bar = if progress { ProgressBar::new(rounds as u64) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:30}] round {pos}/{len} ({eta} left)").unwrap());
    bar.set_message("bench gate");
    let mut noop = Vec::new();
    for _ in 0..rounds {
        noop.push(measure(&cells[0][0].gate, Prog::Noop, &v4_udp, XDP_PASS, repeat)?);
        for c in cells.iter_mut().flatten() {
            let ns = measure(&c.gate, Prog::Gate, &c.pkt, c.verdict, repeat)?;
            c.samples.push(ns);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let rows = cases
        .iter()
        .zip(cells.iter_mut())
        .map(|((name, _, _, verdict, _), row)| Row {
            case: name.to_string(),
            verdict: if *verdict == XDP_PASS { "PASS" } else { "DROP" }.into(),
            ns: row.iter_mut().map(|c| median(&mut c.samples)).collect(),
            min_ns: row.iter().map(|c| c.samples.iter().copied().fold(f64::INFINITY, f64::min)).collect(),
        })
        .collect();
    let noop_min_ns = noop.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Report { rules, noop_ns: median(&mut noop), noop_min_ns, rows, repeat, rounds })
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The Markdown table the README carries: median (fastest) per cell.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let cell = |med: f64, min: f64| format!("{med:.0} ({min:.0}) ns");
    let _ =
        writeln!(o, "| case (64-byte frames) | verdict | 1 rule | 64 rules | 1024 rules | 1024 vs 1 rule (median) |");
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let _ = writeln!(o, "| no-op XDP program (floor) | PASS | {} | | | |", cell(r.noop_ns, r.noop_min_ns));
    for row in &r.rows {
        let ratio = row.ns[2] / row.ns[0];
        let cells: Vec<String> = row.ns.iter().zip(&row.min_ns).map(|(m, n)| cell(*m, *n)).collect();
        let _ =
            writeln!(o, "| {} | {} | {} | {:+.1}% |", row.case, row.verdict, cells.join(" | "), (ratio - 1.0) * 100.0);
    }
    let _ = writeln!(
        o,
        "\nns per packet: median (fastest) of {} interleaved rounds, one BPF_PROG_TEST_RUN call of {} repeats \
         per case and round, on CPU 0; the kernel reports whole ns. The gate minus the floor is what it adds.",
        r.rounds, r.repeat
    );
    o
}
