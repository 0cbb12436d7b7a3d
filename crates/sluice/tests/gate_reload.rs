//! Re-applying a config to a running gate (what SIGHUP does): a class keeps
//! its counters and bucket by name wherever it moves, and a config that fails
//! part-way is rolled back whole (BPF_PROG_TEST_RUN on crafted packets).
use sluice::dataplane::classify;
use sluice::dataplane::gate::{Gate, GateError, Prog, XDP_PASS};
use sluice::policy::config::{self, Config};
use sluice::surface::stats::ClassTotals;
use sluice_testkit::packet::Frame;

fn cfg(flags: &[String]) -> Config {
    config::from_flags(flags).expect("test config is valid")
}

fn flags(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn apply(g: &mut Gate, c: &Config) -> Result<(), GateError> {
    g.apply(c, &classify::compile(c).unwrap())
}

/// Packets each named class has seen, as the gate counts them.
fn seen(g: &Gate, c: &Config, name: &str) -> u64 {
    ClassTotals::from(g.class_counters(c.class_id(name).unwrap()).unwrap()).seen_pkts
}

fn send(g: &Gate, src: &str, dport: u16, n: u64) {
    let p = Frame::udp(src, "10.0.0.2", 1000, dport).build();
    for _ in 0..n {
        assert_eq!(g.test_run(Prog::Gate, &p, 1).unwrap().0, XDP_PASS);
    }
}

#[test]
fn a_reload_that_reorders_and_renames_classes_keeps_counters_by_name() {
    // Indexes: a 0, b 1, gone 2, x 3, default 4.
    let before = cfg(&flags(&["a:match=udp:53", "b:match=udp:54", "gone:match=udp:56", "x:match=udp:57"]));
    let mut g = Gate::load().unwrap();
    apply(&mut g, &before).unwrap();
    send(&g, "10.0.0.1", 53, 3);
    send(&g, "10.0.0.1", 54, 5);
    send(&g, "10.0.0.1", 56, 7);
    send(&g, "10.0.0.1", 99, 2);
    // Now b 0, new 1 (where b was), a 2, default 3 (where x was); index 4 unused.
    let after = cfg(&flags(&["b:match=udp:54", "new:match=udp:55", "a:match=udp:53"]));
    apply(&mut g, &after).unwrap();
    assert_eq!(seen(&g, &after, "a"), 3, "a keeps its count at its new index");
    assert_eq!(seen(&g, &after, "b"), 5, "b keeps its count at its new index");
    assert_eq!(seen(&g, &after, "new"), 0, "a new class starts at zero, not with b's old count");
    assert_eq!(seen(&g, &after, "default"), 2, "default keeps its count at its new index");
    let unused = ClassTotals::from(g.class_counters(4).unwrap());
    assert_eq!(unused.seen_pkts, 0, "the index no class uses any more is zeroed");
    // And they go on counting where they are now.
    send(&g, "10.0.0.1", 53, 1);
    assert_eq!(seen(&g, &after, "a"), 4);
}

#[test]
fn a_reload_that_keeps_the_classes_keeps_every_counter() {
    let c = cfg(&flags(&["a:rate=1k,match=udp:53", "b:match=udp:54"]));
    let mut g = Gate::load().unwrap();
    apply(&mut g, &c).unwrap();
    send(&g, "10.0.0.1", 54, 4);
    let changed = cfg(&flags(&["a:rate=2k,match=udp:53", "b:match=udp:54,match=udp:57"]));
    apply(&mut g, &changed).unwrap();
    assert_eq!(seen(&g, &changed, "b"), 4);
}

/// A reload keeps the limit in force of a class whose configured limit is
/// unchanged (an auto class's controller rate, here), wherever the class
/// moves; a class whose limit changed gets the new one (issue 23, item 6:
/// every auto class was unlimited until the next tick).
#[test]
fn a_reload_keeps_the_limit_in_force_of_an_unchanged_class() {
    use sluice::bpf_intf::SLUICE_MODE_LIMITED;
    let before = cfg(&flags(&["svc:rate=auto,match=udp:53", "lim:rate=1k,match=udp:54"]));
    let mut g = Gate::load().unwrap();
    apply(&mut g, &before).unwrap();
    // What the tick would write: the controller's rate for svc.
    let ticked =
        sluice::dataplane::share::shares_for(&config::Limit::Rate { pps: 777, burst: 8 }, &vec![0; g.ncpus()], false);
    g.set_shares(before.class_id("svc").unwrap(), &ticked).unwrap();
    // svc moves (a class before it), lim's limit changes.
    let after = cfg(&flags(&["new:match=udp:55", "svc:rate=auto,match=udp:53", "lim:rate=2k,match=udp:54"]));
    apply(&mut g, &after).unwrap();
    let svc = g.shares(after.class_id("svc").unwrap()).unwrap();
    assert_eq!(svc, ticked, "svc keeps its controller's rate at its new id");
    let lim = g.shares(after.class_id("lim").unwrap()).unwrap();
    assert!(lim.iter().all(|s| s.mode == SLUICE_MODE_LIMITED), "{lim:?}");
    let total: u64 = lim.iter().map(|s| s.rate_pps).sum();
    assert!(total.abs_diff(2000) <= g.ncpus() as u64, "lim gets its new 2k: {lim:?}");
}

/// Two configs of 40,000 source prefixes each: while both live in the tries
/// (new entries go in before old ones leave) they need 80,000 entries of the
/// 65,536 the trie holds, so the update fails part-way.
#[test]
fn a_reload_that_fails_part_way_puts_the_previous_config_back() {
    let prefixes = |second: u8| -> String {
        (0..40_000u32)
            .map(|i| format!("match=udp:53@10.{second}.{}.{}/32", i / 250, i % 250))
            .collect::<Vec<_>>()
            .join(",")
    };
    let old = cfg(&[format!("a:{}", prefixes(1)), "other:match=udp:54".to_string()]);
    let new = cfg(&[format!("b:{}", prefixes(2)), "other:match=udp:54".to_string()]);
    let mut g = Gate::load().unwrap();
    apply(&mut g, &old).unwrap();
    send(&g, "10.1.0.1", 53, 2);
    let err = apply(&mut g, &new).expect_err("80,000 trie entries do not fit in 65,536");
    let msg = err.to_string();
    assert!(msg.contains("previous config was put back"), "{msg}");
    // The old config is whole: its prefixes classify into a, the new ones do not.
    send(&g, "10.1.0.2", 53, 1);
    assert_eq!(seen(&g, &old, "a"), 3, "old prefixes still reach class a, with its counts");
    let default_before = seen(&g, &old, "default");
    send(&g, "10.2.0.2", 53, 1);
    assert_eq!(seen(&g, &old, "a"), 3, "a prefix of the refused config does not reach class a");
    assert_eq!(seen(&g, &old, "default"), default_before + 1, "it goes to the default class");
    // And the gate takes a good config afterwards.
    let small = cfg(&flags(&["b:match=udp:53@10.2.0.0/16", "other:match=udp:54"]));
    apply(&mut g, &small).unwrap();
    send(&g, "10.2.0.2", 53, 1);
    assert_eq!(seen(&g, &small, "b"), 1);
}
