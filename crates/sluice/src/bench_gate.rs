//! `sluice bench gate`: the gate's cost per packet, measured in the kernel with
//! BPF_PROG_TEST_RUN and a large repeat, beside a no-op XDP program (the floor
//! of the test-run loop itself) in the same run.
use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use crate::classify;
use crate::config::{self, Config};
use crate::gate::{Gate, Prog, XDP_DROP, XDP_PASS};
use crate::packet::{v6, Frame};

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: String,
    pub verdict: String,
    /// Median ns per packet for 1, 64 and 1024 rules.
    pub ns: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rules: Vec<usize>,
    pub noop_ns: f64,
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

/// Median ns/packet of `rounds` test runs of `repeat` each.
fn measure(gate: &Gate, prog: Prog, pkt: &[u8], want: u32, repeat: u32, rounds: usize) -> Result<f64> {
    let mut v = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        // The kernel reports a whole-ns mean; timing the call gives a finer one
        // (the syscall's own microseconds vanish in millions of repeats).
        let t = std::time::Instant::now();
        let (verdict, _) = gate.test_run(prog, pkt, repeat)?;
        let total = t.elapsed();
        anyhow::ensure!(verdict == want, "bench packet got verdict {verdict}, expected {want}");
        v.push(total.as_nanos() as f64 / repeat as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

pub fn run(repeat: u32, rounds: usize, progress: bool) -> Result<Report> {
    crate::gate::check_privileges()?;
    // Run on one CPU so every round sees the same per-CPU state.
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
    let mut gate = Gate::load()?;
    let noop_ns = measure(&gate, Prog::Noop, &v4_udp, XDP_PASS, repeat, rounds)?;
    let mut rows = Vec::new();
    for (name, pkt, rate, verdict, prefixes) in cases {
        let mut ns = Vec::new();
        for &n in &rules {
            let cfg = config_with_rules(n, rate, prefixes)?;
            gate.apply(&cfg, &classify::compile(&cfg)?)?;
            gate.reset_counters()?;
            // Drain the burst so "dropped by rate" measures the drop path.
            if verdict == XDP_DROP {
                gate.test_run(Prog::Gate, pkt, 2_000_000)?;
            }
            ns.push(measure(&gate, Prog::Gate, pkt, verdict, repeat, rounds)?);
            if progress {
                eprintln!("  {name}, {n} rules: {:.1} ns", ns.last().unwrap());
            }
        }
        rows.push(Row { case: name.into(), verdict: if verdict == XDP_PASS { "PASS" } else { "DROP" }.into(), ns });
    }
    Ok(Report { rules, noop_ns, rows, repeat, rounds })
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The Markdown table the README carries.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "| case (64-byte frames) | verdict | 1 rule | 64 rules | 1024 rules | 1024 vs 1 |");
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    let _ = writeln!(o, "| no-op XDP program (floor) | PASS | {:.1} ns | | | |", r.noop_ns);
    for row in &r.rows {
        let ratio = row.ns[2] / row.ns[0];
        let _ = writeln!(
            o,
            "| {} | {} | {:.1} ns | {:.1} ns | {:.1} ns | {:+.1}% |",
            row.case,
            row.verdict,
            row.ns[0],
            row.ns[1],
            row.ns[2],
            (ratio - 1.0) * 100.0
        );
    }
    let _ = writeln!(
        o,
        "\nMedian of {} BPF_PROG_TEST_RUN calls of {} repeats each, on CPU 0; the gate minus the floor is what it adds.",
        r.rounds, r.repeat
    );
    o
}
