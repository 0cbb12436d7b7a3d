//! `sluice bench gate`: the gate's cost per packet, measured in the kernel with
//! BPF_PROG_TEST_RUN and a large repeat, beside a no-op XDP program (the floor
//! of the test-run loop itself, in the bench's own object: `Generator::noop_run`)
//! in the same run.
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use indicatif::{ProgressBar, ProgressStyle};
use sluice::bpf_intf::{
    sluice_fair, sluice_known, sluice_src_key, sluice_syn_guard, SLUICE_DELAY_EVERY, SLUICE_SYN_DIRECT_V4,
    SLUICE_SYN_DIRECT_V6, SLUICE_WATCH_EVERY,
};
use sluice::dataplane::classify;
use sluice::dataplane::gate::verifier::{verifier_costs, VerifierCost, INSN_LIMIT, STACK_LIMIT};
use sluice::dataplane::gate::{Clock, Gate, Prog, XDP_DROP, XDP_PASS};
use sluice::dataplane::share::share;
use sluice::policy::config::{self, Config, Limit};
use sluice::signals::syn_peers::{peer_key, peer_words};
use sluice_testkit::packet::{v6, Frame};

use crate::load::gen::Generator;

mod sources;
mod syn;

use sources::*;
use syn::*;
pub use syn::{LearnerCost, SynCost};

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
    /// The per-source path, with 1 and SOURCES_MANY sources in the map (`ns` by that).
    pub source_rows: Vec<Row>,
    /// Kernel memory of the sources map sized for SOURCES_MANY (fdinfo memlock), bytes.
    pub sources_map_bytes: Option<u64>,
    /// This process's RSS after reading that full map once, as the daemon's scan does (bytes).
    pub rss_after_scan_bytes: Option<u64>,
    /// How long that read took (ms), and how many sources it found: the
    /// SOURCES_MANY - 1 written, less those that took each other's slots.
    #[serde(default)]
    pub scan_ms: Option<f64>,
    #[serde(default)]
    pub sources_held: Option<u64>,
    /// A SYN answered by the gate against a SYN it drops (see [`SynCost`]).
    pub syn: SynCost,
    /// The egress learner's cost for a packet leaving (see [`LearnerCost`]; none: not measured).
    pub learner: Option<LearnerCost>,
    /// What the verifier spent on each program at load (none: not read).
    #[serde(default)]
    pub verifier: Vec<VerifierCost>,
    pub repeat: u32,
    pub rounds: usize,
}

/// The per-source rows' large case: active sources in the map.
pub const SOURCES_MANY: u32 = 1 << 20;

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
fn measure(run: impl Fn(&[u8], u32) -> Result<(u32, Duration)>, pkt: &[u8], want: u32, repeat: u32) -> Result<f64> {
    let (verdict, mean) = run(pkt, repeat)?;
    anyhow::ensure!(verdict == want, "bench packet got verdict {verdict}, expected {want}");
    Ok(mean.as_nanos() as f64)
}

/// The median of the rounds (there is at least one: `rounds` >= 1 is checked).
/// A deadline far ahead, as the daemon keeps one (gate.bpf.c reads the
/// clock against it on its drop and answer paths; a gate with none skips
/// the read).
fn with_deadline(gate: &mut Gate) {
    gate.set_alive_until(u64::MAX);
}

/// `gate` with `cfg` applied (its class "bench" is the one measured) and a
/// deadline far ahead; where "bench" has a rate, each CPU's share is the
/// whole of it (the bench calls the program from one CPU).
fn bench_gate(mut gate: Gate, cfg: &Config) -> Result<(Gate, usize)> {
    gate.apply(cfg, &classify::compile(cfg)?)?;
    with_deadline(&mut gate);
    let bench = cfg.class_id("bench").expect("the bench class");
    if let Limit::Rate { pps, burst } = cfg.classes[bench].limit {
        gate.set_shares(bench, &vec![share(pps, burst); gate.ncpus()])?;
    }
    Ok((gate, bench))
}

fn median(v: &mut [f64]) -> f64 {
    sluice_testkit::summary::median(v).unwrap_or(f64::NAN)
}

/// One measured configuration: a loaded gate, the packet, the verdict it must get.
struct Cell {
    gate: Gate,
    pkt: Vec<u8>,
    verdict: u32,
    samples: Vec<f64>,
    /// The socket the packet goes to, for the cases that look at it.
    _socket: Option<std::net::UdpSocket>,
}

/// Run every case with 1, 64 and 1024 rules, and the no-op floor, in
/// interleaved rounds (so drifts of the machine hit all of them alike); report
/// the median of the rounds.
/// A table row per case: its name and verdict, its cells' median and least ns.
fn rows_of<'a>(cases: impl Iterator<Item = (&'a str, u32)>, cells: &mut [Vec<Cell>]) -> Vec<Row> {
    cases
        .zip(cells.iter_mut())
        .map(|((name, verdict), row)| Row {
            case: name.to_string(),
            verdict: if verdict == XDP_PASS { "PASS" } else { "DROP" }.into(),
            ns: row.iter_mut().map(|c| median(&mut c.samples)).collect(),
            min_ns: row.iter().map(|c| c.samples.iter().copied().fold(f64::INFINITY, f64::min)).collect(),
        })
        .collect()
}

pub fn run(repeat: u32, rounds: usize, progress: bool) -> Result<Report> {
    sluice::dataplane::gate::check_privileges()?;
    // Run on one CPU; each gate gives that CPU the class's whole limit.
    pin_to_cpu(0);
    let rules = vec![1usize, 64, 1024];
    let v4_udp = Frame::udp("10.0.0.1", "10.0.0.2", 1234, 7000).frame_len(64).build();
    let v6_udp = Frame::udp(&v6(1), &v6(2), 1234, 7000).frame_len(64).build();
    let v4_tcp = Frame::tcp("10.0.0.1", "10.0.0.2", 1234, 7000).frame_len(64).build();
    let host = HostSockets::new()?;
    let (outside, no_socket, reply) =
        (host.frame(HostCase::Outside), host.frame(HostCase::NoSocket), host.frame(HostCase::Reply));
    let cases: Vec<GateCase> = vec![
        ("IPv4 UDP, admitted", &v4_udp, "1G", XDP_PASS, false, None),
        ("IPv4 UDP, dropped by rate", &v4_udp, "1", XDP_DROP, false, None),
        ("IPv6 UDP, admitted", &v6_udp, "1G", XDP_PASS, false, None),
        ("IPv4 TCP, admitted", &v4_tcp, "1G", XDP_PASS, false, None),
        ("IPv4 UDP, source-prefix rules, admitted", &v4_udp, "1G", XDP_PASS, true, None),
        (
            "IPv4 UDP, default class, dropped, port outside the ephemeral range",
            &outside,
            "1G",
            XDP_DROP,
            false,
            Some(HostCase::Outside),
        ),
        (
            "IPv4 UDP, default class, dropped, ephemeral port (socket lookup: none)",
            &no_socket,
            "1G",
            XDP_DROP,
            false,
            Some(HostCase::NoSocket),
        ),
        (
            "IPv4 UDP, default class, a reply to a connected socket, passed",
            &reply,
            "1G",
            XDP_PASS,
            false,
            Some(HostCase::Reply),
        ),
    ];
    let (mut source_cells, memory) = source_cells(&v4_udp)?;
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    for (_, pkt, rate, verdict, prefixes, host_case) in &cases {
        let mut row = Vec::new();
        for &n in &rules {
            let cfg = config_with_rules(n, rate, *prefixes)?;
            let (mut gate, _) = bench_gate(Gate::load()?, &cfg)?;
            if host_case.is_some() {
                // As "dropped by rate": rate 1, its burst drained below.
                gate.set_shares(cfg.default_class, &vec![share(1, 1_000_000); gate.ncpus()])?;
                gate.set_ephemeral(Some(host.range));
            }
            // Drain the burst so "dropped by rate" measures the drop path.
            gate.test_run(Prog::Gate, pkt, 2_000_000)?;
            row.push(Cell { gate, pkt: pkt.to_vec(), verdict: *verdict, samples: vec![], _socket: None });
        }
        cells.push(row);
    }
    let bar = if progress { ProgressBar::new(rounds as u64) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:30}] round {pos}/{len} ({eta} left)").unwrap());
    bar.set_message("bench gate");
    let floor = Generator::load()?;
    let mut noop = Vec::new();
    for _ in 0..rounds {
        noop.push(measure(|p, n| floor.noop_run(p, n), &v4_udp, XDP_PASS, repeat)?);
        for c in cells.iter_mut().flatten().chain(source_cells.iter_mut().flatten()) {
            let ns = measure(|p, n| Ok(c.gate.test_run(Prog::Gate, p, n)?), &c.pkt, c.verdict, repeat)?;
            c.samples.push(ns);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let rows = rows_of(cases.iter().map(|(name, _, _, verdict, _, _)| (*name, *verdict)), &mut cells);
    drop(host);
    let source_rows = rows_of(SOURCE_CASES.iter().map(|(name, verdict, _)| (*name, *verdict)), &mut source_cells);
    let noop_min_ns = noop.iter().copied().fold(f64::INFINITY, f64::min);
    let syn = syn_cost(rounds)?;
    let learner = Some(learner_cost(rounds)?);
    let verifier = verifier_costs()?;
    Ok(Report {
        rules,
        noop_ns: median(&mut noop),
        noop_min_ns,
        rows,
        source_rows,
        sources_map_bytes: memory.0,
        rss_after_scan_bytes: memory.1,
        scan_ms: memory.2,
        sources_held: memory.3,
        repeat,
        rounds,
        syn,
        learner,
        verifier,
    })
}

/// A row of the main table: its name, the frame, the bench class's rate,
/// the verdict it must get, source-prefix rules or not, and the default
/// class's case if it is one.
type GateCase<'a> = (&'a str, &'a [u8], &'a str, u32, bool, Option<HostCase>);

/// The default class's cases (bpf/gate/host.h), its limit 1/s: a
/// datagram it drops to a port outside the ephemeral range (no lookup), to
/// an ephemeral port where no socket is (the socket lookup finds none), and
/// a reply to a connected socket (the lookup finds it: passed).
#[derive(Clone, Copy, PartialEq)]
enum HostCase {
    Outside,
    NoSocket,
    Reply,
}

/// The sockets the default class's cases look for, on loopback.
struct HostSockets {
    /// Connected to 127.0.0.2:5353.
    connected: std::net::UdpSocket,
    /// A port in the range that no socket holds (one that was bound, then closed).
    free_port: u16,
    /// The host's ephemeral range (its default where unreadable).
    range: (u16, u16),
}

impl HostSockets {
    fn new() -> Result<HostSockets> {
        let connected = std::net::UdpSocket::bind("127.0.0.1:0")?;
        connected.connect("127.0.0.2:5353")?;
        let free_port = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let range = sluice::dataplane::gate::local_port_range().unwrap_or((32768, 60999));
        Ok(HostSockets { connected, free_port, range })
    }

    fn frame(&self, case: HostCase) -> Vec<u8> {
        let port = match case {
            HostCase::Outside => 9,
            HostCase::NoSocket => self.free_port,
            HostCase::Reply => self.connected.local_addr().map_or(0, |a| a.port()),
        };
        Frame::udp("127.0.0.2", "127.0.0.1", 5353, port).frame_len(64).build()
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The Markdown table the gate-cost results file carries: median (fastest) per cell.
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
    let _ = writeln!(
        o,
        "\n| per-source path (a limited class, fairness on; the last row off, learning) | verdict | 1 source | {} sources | many vs 1 |",
        SOURCES_MANY
    );
    let _ = writeln!(o, "|---|---|---|---|---|");
    for row in &r.source_rows {
        let cells: Vec<String> = row.ns.iter().zip(&row.min_ns).map(|(m, n)| cell(*m, *n)).collect();
        let ratio = row.ns[1] / row.ns[0];
        let _ =
            writeln!(o, "| {} | {} | {} | {:+.1}% |", row.case, row.verdict, cells.join(" | "), (ratio - 1.0) * 100.0);
    }
    let admitted = r.rows.first().map(|row| row.ns[0] - r.noop_ns);
    let fair = r.source_rows.first().map(|row| row.ns[1] - r.noop_ns);
    if let (Some(a), Some(f)) = (admitted, fair) {
        let _ = writeln!(
            o,
            "\nover the floor: the per-source path (1M sources, admitted) adds {f:.0} ns, today's admitted IPv4 UDP {a:.0} ns: {:.1}x (target: at most 2x)",
            f / a.max(1e-9)
        );
    }
    let y = &r.syn;
    let (answer, direct, drop) = (y.answered_ns - y.noop_ns, y.direct_ns - y.noop_ns, y.dropped_ns - y.noop_ns);
    let _ = writeln!(
        o,
        "\nIPv4 TCP SYN with Linux's options, one run per call ({SYN_CALLS} calls, median of up to 7 rounds): no-op {:.0} ns, \
         dropped by rate {:.0} ns, answered with a cookie SYN-ACK after the socket lookup {:.0} ns, without it (a direct \
         class) {:.0} ns; over the floor the drop costs {drop:.0} ns, the answer {answer:.0} ns ({:.1}x), the direct answer \
         {direct:.0} ns ({:.1}x; target: at most 3x). No per-source state: flat in the number of sources",
        y.noop_ns,
        y.dropped_ns,
        y.answered_ns,
        y.direct_ns,
        answer / drop.max(1e-9),
        direct / drop.max(1e-9)
    );
    let ns = |v: Option<f64>| v.map_or("not measured".to_string(), |v| format!("{v:.0} ns"));
    let _ = writeln!(
        o,
        "a SYN passed to the kernel: by a class that does not watch its listeners {}, by one that does (the \
         default: one SYN in {SLUICE_WATCH_EVERY} looked up, its listener's SYN queue with room) {}; watching costs a SYN {}",
        ns(y.passed_ns),
        ns(y.watched_ns),
        ns(y.watched_ns.zip(y.passed_ns).map(|(w, p)| w - p)),
    );
    if let Some(l) = &r.learner {
        let _ = writeln!(
            o,
            "a packet leaving through the egress learner, one run per call: no-op (XDP) {:.0} ns, from no class's port {:.0} ns, \
             a class's answer with no stamp to time {:.0} ns (answer delays: the gate offers one admitted packet in \
             {SLUICE_DELAY_EVERY} a stamp; an answer that times one adds a clock read, not measured here)",
            l.noop_ns, l.unclassed_ns, l.untimed_ns
        );
    }
    for c in &r.verifier {
        let _ = writeln!(
            o,
            "verifier: {} processed {} insns ({:.0}% of {INSN_LIMIT}); stack {} (a call chain's frames share {STACK_LIMIT} bytes)",
            c.program,
            c.insns,
            c.insns as f64 * 100.0 / INSN_LIMIT as f64,
            c.stack.iter().map(u32::to_string).collect::<Vec<_>>().join("+"),
        );
    }
    let mib =
        |b: Option<u64>| b.map_or("not measured".to_string(), |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64));
    let _ = writeln!(
        o,
        "sources map for {} entries: {} of kernel memory (memlock); this process's RSS after reading it whole once: {}; \
         that read took {} and found {} sources",
        SOURCES_MANY,
        mib(r.sources_map_bytes),
        mib(r.rss_after_scan_bytes),
        r.scan_ms.map_or("(not measured)".to_string(), |ms| format!("{ms:.0} ms")),
        r.sources_held.map_or("(not measured)".to_string(), |n| n.to_string()),
    );
    o
}
