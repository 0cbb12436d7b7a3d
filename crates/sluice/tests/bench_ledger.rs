//! A short real bench run: every applied packet is accounted for in the ledger.
use std::path::PathBuf;

use sluice::bench::run::Env;
use sluice::bench::scenario::{self, ConfigKind};
use sluice::bench::testbed::VictimModel;

#[test]
fn the_ledger_balances_on_a_short_real_run() {
    let sc = scenario::load("quick").unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    for model in [VictimModel::Nic, VictimModel::SameCore] {
        let mut env = Env::start(&sc, model, &exe, "ledger").unwrap();
        for (config, rate) in [(ConfigKind::Off, 0.0), (ConfigKind::Static, 100_000.0), (ConfigKind::Nft, 100_000.0)] {
            env.apply_config(config, rate).unwrap();
            for level in [100_000.0, 600_000.0] {
                let r = env.measure(config, 1.0, level, 0).unwrap();
                let l = r.ledger;
                eprintln!(
                    "{} {:>6} {level:>7}: sent {:.0}/s valid {} delivered {:.0}/s cpu {:.2}/{:.2} legit {}/{} p99 {:.0}us ledger {:?}",
                    model.name(), config.name(), r.sent_pps, r.valid, r.delivered_pps, r.cpu_busy, r.cpu_busy_procstat, r.legit_replies, r.legit_sent, r.rtt.p99_us, l
                );
                assert!(l.applied > 0);
                assert!((l.unaccounted.unsigned_abs() as f64) <= 0.01 * l.applied as f64, "ledger off by {} of {}", l.unaccounted, l.applied);
            }
        }
    }
}
