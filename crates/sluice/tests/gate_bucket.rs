//! Token-bucket accuracy, by BPF_PROG_TEST_RUN in a tight loop: the admitted
//! count over a measured time must equal rate x time + burst. These are
//! accuracy checks (counts against the kernel clock), not timing targets.
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestGate;
use sluice::dataplane::gate::Prog;
use sluice::dataplane::share::share;
use sluice::policy::config::Limit;
use sluice_testkit::packet::Frame;

/// The tests here measure time on both CPUs: never two at once.
static SERIAL: Mutex<()> = Mutex::new(());

fn pin(cpu: usize) {
    // SAFETY: plain cpu_set_t, affinity of the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0, "pin to CPU {cpu}");
    }
}

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns() reads.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Repeats that make one test-run call last about `secs` on this machine.
fn calibrate(g: &TestGate, pkt: &[u8], secs: f64) -> u32 {
    let t = Instant::now();
    g.gate.test_run(Prog::Gate, pkt, 1_000_000).unwrap();
    let per = t.elapsed().as_secs_f64() / 1e6;
    ((secs / per) as u64).min(u32::MAX as u64) as u32
}

/// The rate and burst a test can check on this machine: at most a quarter
/// of what one CPU offers (`repeat` packets in `secs`), so the flood always
/// exceeds the bucket, and a burst of at least 10 ms of the rate, so the
/// gaps in which the scheduler runs something else on the CPU (a few ms on a
/// busy machine) do not cost tokens. A machine half as fast tests a lower rate.
fn testable(rate: u64, burst: u64, repeat: u32, secs: f64) -> (u64, u64) {
    let rate = rate.min((repeat as f64 / secs / 4.0) as u64).max(1);
    (rate, burst.max(rate / 100))
}

/// Flood from this thread in ONE long test-run call (each call has a fixed
/// cost of ~10 ms, a gap in which the bucket would sit full). Returns the
/// CLOCK_MONOTONIC time just before the call.
fn flood(g: &TestGate, pkt: &[u8], repeat: u32) -> u64 {
    let start = mono_ns();
    g.gate.test_run(Prog::Gate, pkt, repeat).unwrap();
    start
}

/// The window ends at the last refill (the kernel clock at one of the last
/// packets); it starts before the call, so it includes the call's setup
/// (about 10 ms of 2 s: +0.5% to the expectation).
fn last_refill(g: &TestGate, class: usize) -> u64 {
    g.gate.buckets(class).unwrap().iter().map(|b| b.last_ns).max().unwrap()
}

fn within(what: &str, got: f64, want: f64, tol: f64) {
    let err = (got - want) / want;
    eprintln!("{what}: admitted {got:.0}, expected {want:.0} ({:+.2}%)", err * 100.0);
    assert!(
        err.abs() <= tol,
        "{what}: admitted {got:.0}, expected {want:.0}: off by {:+.2}% (tolerance {}%)",
        err * 100.0,
        tol * 100.0
    );
}

#[test]
fn one_cpu_admits_rate_times_time_plus_burst_within_2_percent() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (rate, burst) in [(1_000_000u64, 1000u64), (50_000, 5000), (2_000, 8)] {
        let g = TestGate::new(&[&format!("c:rate={rate},burst={burst},match=udp:9")]);
        let id = g.class("c");
        let pkt = Frame::udp("10.0.0.1", "10.0.0.2", 1, 9).build();
        pin(0);
        let repeat = calibrate(&g, &pkt, 2.0);
        let (rate, burst) = testable(rate, burst, repeat, 2.0);
        // All of the rate on every CPU: only CPU 0 runs packets here.
        g.gate.set_shares(id, &vec![share(rate, burst); g.gate.ncpus()]).unwrap();
        g.gate.reset_counters().unwrap();
        let t0 = flood(&g, &pkt, repeat);
        let t1 = last_refill(&g, id);
        let c = g.counters().classes[id];
        assert!(c.dropped_rate_pkts > c.admitted_pkts, "the flood must exceed the rate to test it");
        let want = rate as f64 * (t1 - t0) as f64 / 1e9 + burst as f64;
        within(&format!("1 CPU, {rate} pps burst {burst}"), c.admitted_pkts as f64, want, 0.02);
    }
}

/// Hardening: a rebalance keeps the wake mark the daemon armed. It wrote
/// each limited class's shares whole, without the wake fields, so a class
/// that went idle was never re-armed and a flood on it waited up to a calm
/// tick (500 ms) for the daemon.
#[test]
fn a_rebalance_keeps_the_wake_mark() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = TestGate::new(&["c:rate=1000,match=udp:9"]);
    let id = g.class("c");
    let at: Vec<u64> = (0..g.gate.ncpus() as u64).map(|cpu| 100 + cpu).collect();
    g.gate.arm_wake(id, &at, 5_000_000, 3_000).unwrap();
    let limit = Limit::Rate { pps: 2000, burst: 100 };
    g.gate.rebalance(id, &sluice::dataplane::gate::Tiers::plain(limit), &mut Default::default()).unwrap();
    let shares = g.gate.shares(id).unwrap();
    assert!(shares.iter().any(|s| s.rate_pps > 0), "the new limit is written: {shares:?}");
    let kept: Vec<(u64, u64, u32)> = shares.iter().map(|s| (s.wake_at, s.wake_gap_ns, s.slow_wake_us)).collect();
    assert_eq!(kept, at.iter().map(|&a| (a, 5_000_000, 3_000)).collect::<Vec<_>>());
}

/// How a flood's packets spread over CPUs 0 and 1.
#[derive(Debug, Clone, Copy)]
enum Spread {
    /// Both CPUs flood back to back.
    Even,
    /// CPU 0 floods back to back; CPU 1 sends about a ninth of that
    /// (90/10), among packets of another class.
    Skewed,
    /// CPU 0 alone (CPU 1 sends another class's packets).
    OneHot,
}

/// Issue 51, item 1: a class's admitted rate while its flood spreads over
/// the CPUs as `spread` says, its shares re-split every 10 ms as the
/// daemon's tick does. Returns (admitted per second in the steady state,
/// the limit). The limit is at most a quarter of what one CPU sends here
/// (`testable`), so each CPU's part of the flood exceeds its part of the limit.
fn admitted_rate(spread: Spread) -> (f64, u64) {
    let g = Arc::new(TestGate::new(&["c:rate=1000000,burst=1000,match=udp:9"]));
    assert!(g.gate.ncpus() >= 2, "this test needs two CPUs");
    let id = g.class("c");
    let pkt = Frame::udp("10.0.0.1", "10.0.0.2", 1, 9).build();
    pin(0);
    let per_sec = calibrate(&g, &pkt, 1.0);
    let (rate, burst) = testable(1_000_000, 1000, per_sec, 1.0);
    let limit = Limit::Rate { pps: rate, burst };
    let tiers = sluice::dataplane::gate::Tiers::plain(limit);
    g.gate.rebalance(id, &tiers, &mut Default::default()).unwrap();
    g.gate.reset_counters().unwrap();
    let (secs, chunk) = (1.5, (per_sec / 100).max(9));
    let done = Arc::new(AtomicBool::new(false));
    let rebalancer = {
        let (g, done) = (g.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut last, mut samples) = (Default::default(), Vec::new());
            while !done.load(Ordering::Relaxed) {
                g.gate.rebalance(id, &tiers, &mut last).unwrap();
                let (t, per_cpu) = (mono_ns(), g.gate.class_counters_percpu(id).unwrap());
                let seen: Vec<u64> = per_cpu.iter().map(|c| c[0]).collect();
                samples.push((t, seen, per_cpu.iter().map(|c| c[2]).sum::<u64>()));
                std::thread::sleep(Duration::from_millis(10));
            }
            samples
        })
    };
    let start = mono_ns();
    let until = start + (secs * 1e9) as u64;
    let senders: Vec<_> = [(0, Spread::Even), (1, spread)]
        .into_iter()
        .map(|(cpu, s)| {
            let (g, pkt) = (g.clone(), pkt.clone());
            let other = Frame::udp("10.0.0.1", "10.0.0.2", 1, 10).build();
            std::thread::spawn(move || {
                pin(cpu);
                while mono_ns() < until {
                    match s {
                        // A ninth of a call of the class, then the rest of
                        // it of another class: the CPU is never idle between
                        // calls (each test run puts the program into the XDP
                        // dispatcher and takes it out; a CPU that sleeps
                        // between short calls makes the other's calls wait
                        // 15-30 ms on that, measured).
                        Spread::Skewed => {
                            g.gate.test_run(Prog::Gate, &pkt, (chunk / 9).max(1)).unwrap();
                            g.gate.test_run(Prog::Gate, &other, chunk - chunk / 9).unwrap();
                        }
                        // Another class only: CPU 0's calls do not wait on the dispatcher.
                        Spread::OneHot if cpu == 1 => {
                            g.gate.test_run(Prog::Gate, &other, chunk).unwrap();
                        }
                        _ => {
                            g.gate.test_run(Prog::Gate, &pkt, chunk).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    senders.into_iter().for_each(|h| h.join().unwrap());
    done.store(true, Ordering::Relaxed);
    let samples = rebalancer.join().unwrap();
    // Steady state: from 300 ms in (the split has followed the arrivals
    // for many ticks) to 100 ms before the senders stop, less the ticks in
    // which a sending CPU sent under half its usual (its thread was not
    // running: this 2-CPU machine runs the harness too, and a bucket left
    // alone that long caps its tokens; that is the harness, not the split).
    let ticks: Vec<(u64, Vec<u64>, u64)> = samples
        .windows(2)
        .filter(|w| w[0].0 > start + 300_000_000 && w[1].0 + 100_000_000 < until)
        .map(|w| (w[1].0 - w[0].0, w[1].1.iter().zip(&w[0].1).map(|(b, a)| b - a).collect(), w[1].2 - w[0].2))
        .collect();
    let sending: Vec<usize> = (0..2).filter(|&cpu| cpu == 0 || !matches!(spread, Spread::OneHot)).collect();
    let usual: Vec<u64> = sending
        .iter()
        .map(|&cpu| {
            let mut v: Vec<u64> = ticks.iter().map(|t| t.1[cpu]).collect();
            v.sort_unstable();
            v[v.len() / 2]
        })
        .collect();
    // The tick after a short one too: its buckets start full.
    let normal: Vec<bool> =
        ticks.iter().map(|t| sending.iter().zip(&usual).all(|(&cpu, &u)| t.1[cpu] * 2 >= u)).collect();
    let kept: Vec<&(u64, Vec<u64>, u64)> =
        ticks.iter().enumerate().filter(|&(i, _)| normal[i] && (i == 0 || normal[i - 1])).map(|(_, t)| t).collect();
    assert!(kept.len() * 2 >= ticks.len(), "most ticks must be kept: {} of {}", kept.len(), ticks.len());
    let (ns, admitted): (u64, u64) = kept.iter().fold((0, 0), |(n, a), t| (n + t.0, a + t.2));
    let got = admitted as f64 * 1e9 / ns as f64;
    let seen: Vec<u64> = g.gate.class_counters_percpu(id).unwrap().iter().map(|c| c[0]).collect();
    eprintln!(
        "{spread:?}: arrivals per CPU {seen:?}, {} of {} ticks kept; admitted {got:.0}/s of a limit of {rate}/s",
        kept.len(),
        ticks.len()
    );
    (got, rate)
}

/// Measured here (three runs): even -0.00%, 89/11 -0.4 to -0.6%, one CPU
/// -0.78% (the idle CPU's floor, 1/64 of an even share: at most 1/64 of the
/// rate at any number of CPUs).
#[test]
fn a_class_limit_holds_within_5_percent_however_its_flood_spreads_over_cpus() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for spread in [Spread::Even, Spread::Skewed, Spread::OneHot] {
        let (got, rate) = admitted_rate(spread);
        within(&format!("{spread:?}, {rate} pps"), got, rate as f64, 0.05);
    }
}
