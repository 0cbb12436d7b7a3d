//! A short real bench run: every applied packet is accounted for in the ledger.
mod common;

use sluice_bench::scenarios::scenario::{self, ConfigKind};
use sluice_bench::testbed::rig::Rig;
use sluice_bench::testbed::victim::VictimModel;

/// One testbed at a time: the bench owns both CPUs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// IPv6 frames from the generator carry valid UDP checksums: the stack delivers
/// them (a bad checksum gets every one dropped as InCsumErrors, so the bound
/// below is far from what a broken generator gives, and far from a noisy VM).
#[test]
fn ipv6_streams_are_delivered() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut sc = scenario::load("quick").unwrap();
    for s in &mut sc.streams {
        s.ipv6 = true;
        s.frame = s.frame.max(100);
    }
    sc.validate().unwrap();
    let exe = common::sluice_exe();
    // The nic model: the veth ring is served in softirq on the generator's
    // CPU, not by a NAPI thread that competes with the generator and the
    // service on one CPU (same-core: at 5k/s the ring dropped 4,574 of 5,503
    // frames in one run, a stall of that thread, not the checksums).
    let mut env = Rig::start(&sc, VictimModel::Nic, &exe, "v6").unwrap();
    env.apply_config(ConfigKind::Off, 0.0).unwrap();
    // 5k/s: far below what any victim takes, so what is lost is a VM stall's,
    // not the victim's saturation.
    let r = env.measure(ConfigKind::Off, 1.0, 5_000.0, 0).unwrap();
    eprintln!(
        "IPv6: sent {:.0}/s delivered {:.0}/s legit {}/{} ledger {:?}",
        r.sent_pps, r.delivered_pps, r.legit_replies, r.legit_sent, r.ledger
    );
    // A broken IPv6 path delivers nothing; the bound leaves room for the
    // socket drops a VM stall causes (3-9% usually at 20k/s, 26% once in CI).
    assert!(r.delivered_pps >= 0.5 * r.sent_pps, "IPv6 datagrams delivered: {} of {}", r.delivered_pps, r.sent_pps);
    assert!(r.legit_replies as f64 >= 0.8 * r.legit_sent as f64, "IPv6 echoes came back");
}

#[test]
fn the_ledger_balances_on_a_short_real_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sc = scenario::load("quick").unwrap();
    let exe = common::sluice_exe();
    for model in [VictimModel::Nic, VictimModel::SameCore] {
        let mut env = Rig::start(&sc, model, &exe, "ledger").unwrap();
        for (config, rate) in [
            (ConfigKind::Off, 0.0),
            (ConfigKind::Static, 100_000.0),
            (ConfigKind::Nft, 100_000.0),
            (ConfigKind::Auto, 0.0),
        ] {
            env.apply_config(config, rate).unwrap();
            for level in [100_000.0, 600_000.0] {
                let r = env.measure(config, 1.0, level, 0).unwrap();
                let l = r.ledger;
                let what = format!("{} {} at {level}", model.name(), config.name());
                eprintln!(
                    "{what}: sent {:.0}/s valid {} delivered {:.0}/s cpu {:.2}/{:.2} legit {}/{} p99 {:?}us ctl {:?}% cv {:?} ledger {:?}",
                    r.sent_pps, r.valid, r.delivered_pps, r.cpu_busy, r.cpu_busy_procstat, r.legit_replies, r.legit_sent, r.rtt.p99_us, r.ctl_cpu_pct, r.admitted_cv, l
                );
                assert!(l.applied > 0);
                // `valid` is printed, not asserted here: a stall of this VM can hold the
                // generator under 98% of 600k now and then. That the flag can fail is
                // asserted by a_rate_beyond_the_generator_is_marked_invalid.
                // Only the auto configuration has a controller to report on.
                assert_eq!(r.ctl_cpu_pct.is_some(), config == ConfigKind::Auto, "{:?}", r.ctl_cpu_pct);
                assert_eq!(r.admitted_cv.is_some(), config == ConfigKind::Auto);
                if let (Some(ctl), Some(cv)) = (r.ctl_cpu_pct, r.admitted_cv) {
                    // Bounds a broken meter misses by far: a tick loop that spins reads ~100%,
                    // one that does not run reads 0.
                    assert!(ctl > 0.0 && ctl < 25.0, "{what}: controller CPU {ctl}%");
                    // The CV is only checked to be a computed figure (finite, over the
                    // window's ticks), not for stability: one run in about ten, same-core auto
                    // at 100k swings (CV 0.66 seen). Stability is what the controller tests
                    // and `sluice bench step` measure.
                    assert!(cv.is_finite() && cv >= 0.0, "{what}: admitted CV {cv}");
                }
                // The victim's CPU: some work at any of these loads, by both meters.
                for (meter, busy) in [("idle thread", r.cpu_busy), ("/proc/stat", r.cpu_busy_procstat)] {
                    assert!(busy > 0.05 && busy <= 1.0, "{what}: victim CPU by the {meter}: {busy}");
                }
                // The probe's replies came back (500/s for 1 s) with a round trip
                // under a second. Not asked of `off` or `nft` at the top level:
                // with no gate (nftables drops after the stack has paid) the victim
                // may livelock outright (no reply in CI once for off, and once for
                // nft on 2026-11-24), which is what the bench exists to show, not
                // a broken meter.
                let gateless = matches!(config, ConfigKind::Off | ConfigKind::Nft);
                if !gateless || level < 600_000.0 {
                    assert!(r.legit_replies > 0, "{what}: no legitimate reply");
                }
                if let Some(p99) = r.rtt.p99_us {
                    assert!(p99 > 0.0 && p99 < 1e6, "{what}: p99 {p99} us");
                }
                // Reading the counters is a small part of the window, or the
                // skew's allowance below would excuse anything.
                assert!(
                    l.edge_skew as f64 <= 0.1 * l.applied as f64,
                    "{what}: edge skew {} of {}",
                    l.edge_skew,
                    l.applied
                );
                // Packets in flight at the edges: 1%, and what was sent while
                // each edge's counters were read (nft at 600k once took long
                // enough for 6,135 of 602,110, 1.02%, in CI).
                assert!(
                    (l.unaccounted.unsigned_abs() as f64) <= 0.01 * l.applied as f64 + l.edge_skew as f64,
                    "ledger off by {} of {} (edge skew {})",
                    l.unaccounted,
                    l.applied,
                    l.edge_skew
                );
            }
        }
    }
}

/// A level the generator cannot send (it reaches about 6M pkt/s from one
/// core here) is marked invalid, not reported as if it had been applied.
#[test]
fn a_rate_beyond_the_generator_is_marked_invalid() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sc = scenario::load("quick").unwrap();
    let exe = common::sluice_exe();
    let mut env = Rig::start(&sc, VictimModel::Nic, &exe, "invalid").unwrap();
    env.apply_config(ConfigKind::Off, 0.0).unwrap();
    let r = env.measure(ConfigKind::Off, 1.0, 15_000_000.0, 0).unwrap();
    eprintln!("asked {:.0}/s, sent {:.0}/s, valid {}", r.asked_pps, r.sent_pps, r.valid);
    assert!(r.sent_pps < 0.98 * r.asked_pps, "the generator cannot send 15M pkt/s here: sent {:.0}", r.sent_pps);
    assert!(!r.valid, "a level the generator fell short of is invalid");
}
