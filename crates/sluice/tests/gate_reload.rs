//! Re-applying a config to a running gate (what SIGHUP does): a class keeps
//! its gate id, and so its counters, bucket and known clients, by name
//! wherever it moves; a config that fails before the switch leaves the
//! previous one in force; and no packet is classified by a mix of the two
//! (BPF_PROG_TEST_RUN on crafted packets).
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
    // And they go on counting where they are now.
    send(&g, "10.0.0.1", 53, 1);
    assert_eq!(seen(&g, &after, "a"), 4);
    // A removed class that comes back is a new class: it starts at zero.
    let again = cfg(&flags(&["b:match=udp:54", "gone:match=udp:56", "a:match=udp:53"]));
    apply(&mut g, &again).unwrap();
    assert_eq!(seen(&g, &again, "gone"), 0, "gone's 7 packets went with its id");
    assert_eq!(seen(&g, &again, "a"), 4);
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

/// Two configs of 40,000 source prefixes each: the new one is written into
/// the generation not in force while the old one's entries stay in the
/// tries, so they need 80,000 entries of the 65,536 the trie holds, and the
/// write fails part-way, before the switch.
#[test]
fn a_reload_that_fails_part_way_leaves_the_previous_config_in_force() {
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
    assert!(msg.contains("the previous one stays, untouched"), "{msg}");
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

/// Run the gate program on `packet` from another thread, `repeat` runs a
/// call, until `stop`: (calls made, runs that did not pass). It opens the
/// program by id (root), so the test's thread keeps `&mut Gate` for apply.
fn run_alongside(
    prog_id: u32,
    packet: Vec<u8>,
    repeat: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, u64)> {
    use libbpf_rs::libbpf_sys;
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        // SAFETY: a plain syscall wrapper; the fd is closed below.
        let fd = unsafe { libbpf_sys::bpf_prog_get_fd_by_id(prog_id) };
        assert!(fd >= 0, "opening the gate program by id: {}", std::io::Error::last_os_error());
        let (mut calls, mut not_passed) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let mut opts = libbpf_sys::bpf_test_run_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
                data_in: packet.as_ptr().cast(),
                data_size_in: packet.len() as u32,
                repeat: repeat as i32,
                ..Default::default()
            };
            // SAFETY: opts points at `packet`, which outlives the call.
            let r = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, &mut opts) };
            assert_eq!(r, 0, "test run: {}", std::io::Error::last_os_error());
            calls += 1;
            not_passed += u64::from(opts.retval != XDP_PASS);
        }
        // SAFETY: the fd opened above, closed once.
        unsafe { libc::close(fd) };
        (calls, not_passed)
    })
}

/// Issue 35, item 14. Config A sends 10.1.0.0/16 on udp:9000 to p (a
/// prefix group for port 9000) and the rest of 9000 to q; config B sends
/// all of 9000 to q, and 10.1.0.0/16 on udp:9001 to s (a prefix group for
/// 9001). Both configs number their one prefix group 0. A packet from
/// 10.1.0.1 to 9000 is p's under A and q's under B; only a mix (A's cell
/// for 9000 with B's trie entry for group 0) makes it s's. Before the
/// tables had two generations, a reload wrote the tries first and then the
/// cells one by one, and such packets reached s while the cells were
/// written.
#[test]
fn no_packet_is_classified_by_a_mix_of_two_configs_during_reloads() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let a = cfg(&flags(&["p:match=udp:9000@10.1.0.0/16", "q:match=udp:9000", "s:match=udp:9001"]));
    let b = cfg(&flags(&["p:match=udp:9002", "q:match=udp:9000", "s:match=udp:9001@10.1.0.0/16"]));
    let (ta, tb) = (classify::compile(&a).unwrap(), classify::compile(&b).unwrap());
    assert_eq!((ta.groups, tb.groups), (1, 1), "each config has one prefix group, numbered 0");
    let mut g = Gate::load().unwrap();
    g.apply(&a, &ta).unwrap();
    let packet = Frame::udp("10.1.0.1", "10.0.0.2", 1000, 9000).build();
    // Each config alone classifies as said above.
    send(&g, "10.1.0.1", 9000, 1);
    assert_eq!((seen(&g, &a, "p"), seen(&g, &a, "q")), (1, 0));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sender = run_alongside(g.prog_id(), packet, 200, stop.clone());
    // Reloads back and forth while the other thread runs the packet (a
    // bounded count; each reload writes 196,608 cells).
    let started = std::time::Instant::now();
    let mut reloads = 0;
    while reloads < 200 && started.elapsed() < std::time::Duration::from_secs(20) {
        let (c, t) = if reloads % 2 == 0 { (&b, &tb) } else { (&a, &ta) };
        g.apply(c, t).unwrap();
        reloads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (calls, not_passed) = sender.join().unwrap();
    assert_eq!(not_passed, 0);
    let (p, q, s) = (seen(&g, &a, "p"), seen(&g, &a, "q"), seen(&g, &a, "s"));
    eprintln!("{reloads} reloads, {calls} calls of 200 runs: p {p}, q {q}, s {s}");
    assert!(reloads >= 20, "too few reloads to test anything: {reloads}");
    assert!(p > 1 && q > 0, "the packets ran under both configs: p {p}, q {q}");
    assert_eq!(s, 0, "{s} packets were classified by a mix of the two configs");
    assert_eq!(p + q, 1 + calls * 200, "every run counted once, by p or by q");
}

/// Issue 35, item 3: a reload re-keyed every known entry (59k syscalls on
/// the control thread) because the key holds the class id and ids moved
/// with the list. Now a class keeps its id: its entries stay where they are,
/// and only a removed class's entries come out (for the daemon to keep by
/// name until the class returns).
#[test]
fn a_class_that_moves_keeps_its_known_clients_in_place() {
    use sluice::bpf_intf::{sluice_known, sluice_src_key};
    let before = cfg(&flags(&["svc:match=udp:53", "gone:match=udp:54"]));
    let mut g = Gate::load().unwrap();
    apply(&mut g, &before).unwrap();
    let entry = |class: usize, i: u32| {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&(0x0a00_0000 + i).to_be_bytes());
        let k = sluice_src_key { class_id: class as u8, family: 4, plen: 32, addr, ..Default::default() };
        (k, sluice_known { first_ms: 1, last_ms: 2_000, answers: 3, ..Default::default() })
    };
    let svc: Vec<_> = (0..1000).map(|i| entry(before.class_id("svc").unwrap(), i)).collect();
    let gone: Vec<_> = (0..10).map(|i| entry(before.class_id("gone").unwrap(), 5000 + i)).collect();
    g.insert_known(&svc).unwrap();
    g.insert_known(&gone).unwrap();
    let svc_id = g.class_ids().id(before.class_id("svc").unwrap());
    // svc moves from index 0 to 1; gone goes.
    let after = cfg(&flags(&["new:match=udp:55", "svc:match=udp:53"]));
    apply(&mut g, &after).unwrap();
    assert_eq!(g.class_ids().id(after.class_id("svc").unwrap()), svc_id, "svc keeps its gate id");
    let (taken, names) = g.take_freed_known().unwrap();
    assert_eq!(names, vec!["gone".to_string()]);
    assert_eq!(taken.len(), 10, "gone's entries come out");
    assert!(taken.iter().all(|(k, _)| names[k.class_id as usize] == "gone"));
    let known = g.known().unwrap();
    assert_eq!(known.len(), 1000, "only svc's entries are left");
    let svc_now = after.class_id("svc").unwrap() as u8;
    assert!(known.iter().all(|(k, _)| k.class_id == svc_now), "read by svc's new index");
    assert!(g.take_freed_known().unwrap().0.is_empty(), "taken once");
}
