//! Helpers shared by the test binaries: a gate loaded with a config, and a
//! record of which counter one packet moved.
#![allow(dead_code)]

use sluice::bpf_intf::SLUICE_SOURCES_DEFAULT;
use sluice::dataplane::classify;
use sluice::dataplane::gate::{Gate, Prog, XDP_DROP, XDP_PASS};
use sluice::dataplane::share::share;
use sluice::policy::config::{self, Config, Limit, Verdict};
use sluice::surface::stats::{ClassTotals, GlobalTotals};

/// The counter a packet is expected to land in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landed {
    Admitted(String),
    DroppedRate(String),
    DroppedBlocked(String),
    DroppedShare(String),
    DroppedRoom(String),
    NonIp,
    NonIpDropped,
    MalformedDrop,
    MalformedPass,
}

/// A gate loaded (not attached) with a config.
pub struct TestGate {
    pub gate: Gate,
    pub cfg: Config,
}

/// Counters of every class and the globals at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Counters {
    pub classes: Vec<ClassTotals>,
    pub global: GlobalTotals,
}

/// The sources table's seed in TestGate: a test's few sources take the same
/// slots every run (with a random seed two of them would share one about
/// once in 262,144 runs a pair).
pub const TEST_SEED: u64 = 0x5eed_0f50_0ace_5107;

impl TestGate {
    pub fn new(flags: &[&str]) -> TestGate {
        Self::with(flags, Verdict::Drop)
    }

    pub fn with(flags: &[&str], malformed: Verdict) -> TestGate {
        // The buckets are per CPU and a test run executes on whichever CPU
        // the thread is on: keep this test's thread on the CPU it is on now,
        // so a bucket one run spent is the one the next run meets (a thread
        // that migrated between runs met a full bucket on the other CPU).
        // SAFETY: sched_getcpu reads the calling thread's CPU.
        let cpu = unsafe { libc::sched_getcpu() };
        sluice::base::netns::pin_thread(usize::try_from(cpu).unwrap_or(0)).expect("pin the test thread");
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let mut cfg = config::from_flags(&flags).expect("test config is valid");
        cfg.malformed = malformed;
        let mut gate =
            Gate::load_seeded(SLUICE_SOURCES_DEFAULT, TEST_SEED).expect("the gate loads (tests run as root)");
        gate.apply(&cfg, &classify::compile(&cfg).unwrap()).unwrap();
        // A test run executes on one CPU, whichever the thread is on: give every
        // CPU the whole limit (the daemon's split is tested on its own).
        for (id, class) in cfg.classes.iter().enumerate() {
            if let Limit::Rate { pps, burst } = class.limit {
                gate.set_shares(id, &vec![share(pps, burst); gate.ncpus()]).unwrap();
            }
        }
        TestGate { gate, cfg }
    }

    pub fn counters(&self) -> Counters {
        Counters {
            classes: (0..self.cfg.classes.len()).map(|i| self.gate.class_counters(i).unwrap().into()).collect(),
            global: self.gate.global_counters().unwrap().into(),
        }
    }

    pub fn class(&self, name: &str) -> usize {
        self.cfg.class_id(name).unwrap_or_else(|| panic!("no class {name}"))
    }

    /// Run one packet; return the verdict and the counters before and after.
    pub fn run(&self, pkt: &[u8]) -> (u32, Counters, Counters) {
        let before = self.counters();
        let (verdict, _) = self.gate.test_run(Prog::Gate, pkt, 1).expect("test run");
        (verdict, before, self.counters())
    }

    /// Run one packet and assert its verdict and that exactly the expected
    /// verdict counter (and nothing else of the verdict counters) moved by one.
    #[track_caller]
    pub fn expect(&self, what: &str, pkt: &[u8], landed: Landed) {
        let (verdict, b, a) = self.run(pkt);
        let want_verdict = match &landed {
            Landed::Admitted(_) | Landed::NonIp | Landed::MalformedPass => XDP_PASS,
            _ => XDP_DROP,
        };
        assert_eq!(verdict, want_verdict, "{what}: verdict (2 = PASS, 1 = DROP), expected {landed:?}");
        let mut moved = Vec::new();
        for (i, (cb, ca)) in b.classes.iter().zip(&a.classes).enumerate() {
            let name = &self.cfg.classes[i].name;
            let d = |f: fn(&ClassTotals) -> u64| f(ca) - f(cb);
            if d(|t| t.admitted_pkts) > 0 {
                moved.push((Landed::Admitted(name.clone()), d(|t| t.admitted_pkts)));
            }
            if d(|t| t.dropped_rate_pkts) > 0 {
                moved.push((Landed::DroppedRate(name.clone()), d(|t| t.dropped_rate_pkts)));
            }
            if d(|t| t.dropped_blocked_pkts) > 0 {
                moved.push((Landed::DroppedBlocked(name.clone()), d(|t| t.dropped_blocked_pkts)));
            }
            if d(|t| t.dropped_share_pkts) > 0 {
                moved.push((Landed::DroppedShare(name.clone()), d(|t| t.dropped_share_pkts)));
            }
            if d(|t| t.dropped_room_pkts) > 0 {
                moved.push((Landed::DroppedRoom(name.clone()), d(|t| t.dropped_room_pkts)));
            }
            let seen = d(|t| t.seen_pkts);
            let verdicts = d(|t| t.admitted_pkts) + d(|t| t.dropped_pkts());
            assert_eq!(seen, verdicts, "{what}: class {name}: seen moved {seen}, verdicts {verdicts}");
            if seen > 0 {
                assert_eq!(d(|t| t.seen_bytes), pkt.len() as u64, "{what}: class {name}: seen bytes");
            }
        }
        let g = |f: fn(&GlobalTotals) -> u64| f(&a.global) - f(&b.global);
        for (l, n) in [
            (Landed::NonIp, g(|t| t.non_ip_pass)),
            (Landed::NonIpDropped, g(|t| t.non_ip_drop)),
            (Landed::MalformedDrop, g(|t| t.malformed_drop)),
            (Landed::MalformedPass, g(|t| t.malformed_pass)),
        ] {
            if n > 0 {
                moved.push((l, n));
            }
        }
        assert_eq!(moved, vec![(landed, 1)], "{what}: verdict counters that moved");
    }
}
pub mod tcp;
pub mod testbed;
pub mod trace;
