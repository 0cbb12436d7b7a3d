//! The bench's testbed leaves nothing behind: not when a run fails midway,
//! and `sluice bench cleanup` removes what a killed run left.
mod common;

use std::sync::Mutex;

use sluice_bench::scenarios::scenario::{self, ConfigKind};
use sluice_bench::testbed::rig::Rig;
use sluice_bench::testbed::victim::{cleanup_leftovers, VictimModel, NS_PREFIX};
use sluice_testkit::testbed::netns_exists;

/// One test, so that `bench cleanup` (which removes every bench namespace)
/// never runs beside a testbed of this binary.
#[test]
fn teardown_leaves_nothing() {
    a_run_that_fails_midway_removes_its_testbed();
    cleanup_removes_leftover_namespaces();
}

fn a_run_that_fails_midway_removes_its_testbed() {
    let sc = scenario::load("quick").unwrap();
    let exe = common::sluice_exe();
    let seen: Mutex<Option<(String, String, u32)>> = Mutex::new(None);
    let r = std::panic::catch_unwind(|| {
        let mut env = Rig::start(&sc, VictimModel::SameCore, &exe, "teardown").unwrap();
        *seen.lock().unwrap() = Some((env.tb.net.a.clone(), env.tb.net.b.clone(), env.service_pid()));
        env.apply_config(ConfigKind::Nft, 50_000.0).unwrap();
        env.measure(ConfigKind::Nft, 1.0, 50_000.0, 0).unwrap();
        panic!("a failure in the middle of a run");
    });
    assert!(r.is_err());
    let (a, b, pid) = seen.lock().unwrap().clone().expect("the testbed was made");
    assert!(!netns_exists(&a) && !netns_exists(&b), "namespaces removed");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the service process is gone");
}

fn cleanup_removes_leftover_namespaces() {
    let name = format!("{NS_PREFIX}leftover-{}", std::process::id());
    assert!(std::process::Command::new("ip").args(["netns", "add", &name]).status().unwrap().success());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-bench")).args(["cleanup"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&name));
    assert!(!netns_exists(&name));
    assert!(cleanup_leftovers().unwrap().is_empty());
}
