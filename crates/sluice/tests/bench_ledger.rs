//! A short real bench run: every applied packet is accounted for in the ledger.
use std::path::PathBuf;

use sluice::bench::run::Env;
use sluice::bench::scenario::{self, ConfigKind};
use sluice::bench::testbed::VictimModel;

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
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let mut env = Env::start(&sc, VictimModel::SameCore, &exe, "v6").unwrap();
    env.apply_config(ConfigKind::Off, 0.0).unwrap();
    let r = env.measure(ConfigKind::Off, 1.0, 20_000.0, 0).unwrap();
    eprintln!("IPv6: sent {:.0}/s delivered {:.0}/s legit {}/{} ledger {:?}", r.sent_pps, r.delivered_pps, r.legit_replies, r.legit_sent, r.ledger);
    assert!(r.delivered_pps >= 0.8 * r.sent_pps, "IPv6 datagrams delivered: {} of {}", r.delivered_pps, r.sent_pps);
    assert!(r.legit_replies as f64 >= 0.8 * r.legit_sent as f64, "IPv6 echoes came back");
}

#[test]
fn the_ledger_balances_on_a_short_real_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sc = scenario::load("quick").unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    for model in [VictimModel::Nic, VictimModel::SameCore] {
        let mut env = Env::start(&sc, model, &exe, "ledger").unwrap();
        for (config, rate) in [(ConfigKind::Off, 0.0), (ConfigKind::Static, 100_000.0), (ConfigKind::Nft, 100_000.0), (ConfigKind::Auto, 0.0)] {
            env.apply_config(config, rate).unwrap();
            for level in [100_000.0, 600_000.0] {
                let r = env.measure(config, 1.0, level, 0).unwrap();
                let l = r.ledger;
                eprintln!(
                    "{} {:>6} {level:>7}: sent {:.0}/s valid {} delivered {:.0}/s cpu {:.2}/{:.2} legit {}/{} p99 {:.0}us ctl {:?}% cv {:?} ledger {:?}",
                    model.name(), config.name(), r.sent_pps, r.valid, r.delivered_pps, r.cpu_busy, r.cpu_busy_procstat, r.legit_replies, r.legit_sent, r.rtt.p99_us, r.ctl_cpu_pct, r.admitted_cv, l
                );
                assert!(l.applied > 0);
                // Only the auto configuration has a controller to report on.
                assert_eq!(r.ctl_cpu_pct.is_some(), config == ConfigKind::Auto, "{:?}", r.ctl_cpu_pct);
                assert_eq!(r.admitted_cv.is_some(), config == ConfigKind::Auto);
                assert!((l.unaccounted.unsigned_abs() as f64) <= 0.01 * l.applied as f64, "ledger off by {} of {}", l.unaccounted, l.applied);
            }
        }
    }
}
