//! Source fairness and known sources in the gate, by BPF_PROG_TEST_RUN with
//! crafted sources (fair/mod.rs has the controller's logic, tested alone).
//! Needs root (CI is root).
mod common;

use common::{Landed::*, TestGate};
use sluice::bpf_intf::*;
use sluice::dataplane::gate::{Clock, FairTier, Gate, Prog, Tiers};
use sluice::dataplane::share::{share, SplitCounts};
use sluice::policy::config::Limit;
use sluice::policy::fair::UNKNOWN_DEPTH_MIN;
use sluice_testkit::packet::{Ext, Frame};

/// A limited class "dns" on udp:53 and tcp:53, the default class for the rest.
fn gate() -> TestGate {
    TestGate::new(&["dns:rate=1000000,burst=1000000,match=udp:53,match=tcp:53", "icmp:rate=1000000,match=icmp"])
}

/// One packet a second: a source paced at it has its first
/// SLUICE_SRC_BURST_PKTS + 1 packets within its share (its burst) and every
/// later one over it for the length of a test.
const PACED_NS: u32 = 1_000_000_000;
const WITHIN: u32 = SLUICE_SRC_BURST_PKTS + 1;

/// Source fairness for `class` on every CPU: each unknown source paced at
/// `interval_ns` a packet, the unknown tier at `rate` (burst `burst`),
/// sources counted at /plen4, /plen6.
fn fair(g: &TestGate, class: &str, interval_ns: u32, rate: u64, burst: u64, plens: (u8, u8)) {
    let f = sluice_fair {
        unknown: share(rate, burst),
        on: 1,
        quota: 1,
        src_interval_ns: interval_ns,
        plen4: plens.0,
        plen6: plens.1,
        learn: 1,
        ..Default::default()
    };
    g.gate.set_fairness(g.class(class), &vec![f; g.gate.ncpus()]).unwrap();
}

fn clock(g: &mut TestGate, epoch: u32) {
    g.gate.set_clock(&Clock { epoch, now_ms: sluice::base::clock::wall_ms(), known_ttl_ms: 3_600_000 });
}

fn counter(g: &TestGate, class: &str, idx: u32) -> u64 {
    g.gate.class_counters(g.class(class)).unwrap()[idx as usize]
}

fn dns_from(src: &str) -> Vec<u8> {
    Frame::udp(src, "10.0.0.2", 4000, 53).build()
}

/// Make 198.51.100.7 a known client of class `cls`: answered `answers`
/// times over the 10 s up to now.
fn known_client(g: &TestGate, cls: usize, answers: u32) {
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[198, 51, 100, 7]);
    let key = sluice_src_key { class_id: cls as u8, family: 4, plen: 32, addr, ..Default::default() };
    let last_ms = sluice::base::clock::wall_ms();
    let entry = sluice_known { first_ms: last_ms - 10_000, last_ms, answers, ..Default::default() };
    g.gate.insert_known(&[(key, entry)]).unwrap();
}

#[test]
fn a_source_over_its_share_is_dropped_and_a_light_one_is_not() {
    let mut g = gate();
    // The unknown tier holds 10 tokens (and refills at 1/s): over its share a
    // source may use only the top half, so after its burst of 5 the heavy one is dropped.
    fair(&g, "dns", PACED_NS, 1, 10, (32, 64));
    clock(&mut g, 1);
    for i in 0..WITHIN {
        g.expect(&format!("heavy packet {i}"), &dns_from("192.0.2.1"), Admitted("dns".into()));
    }
    for i in 0..3 {
        g.expect(&format!("heavy packet over its share {i}"), &dns_from("192.0.2.1"), DroppedShare("dns".into()));
    }
    for i in 0..WITHIN {
        g.expect(&format!("light packet {i}"), &dns_from("192.0.2.2"), Admitted("dns".into()));
    }
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_ACTIVE), 2);
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_OVER), 1, "one source went over, counted once");
    assert_eq!(counter(&g, "dns", SLUICE_CS_UNDER_PKTS), 2 * WITHIN as u64);
    // Counted per epoch, a source got its whole quota again at each epoch's
    // start (all sources at once: clumps); paced, it stays over its share.
    clock(&mut g, 2);
    g.expect("a new epoch: still over its share", &dns_from("192.0.2.1"), DroppedShare("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_ACTIVE), 3);
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_OVER), 2, "over again, counted in the new epoch");
    let heavy = g.gate.sources().unwrap().into_iter().find(|(k, _)| k.addr[..4] == [192, 0, 2, 1]).unwrap();
    assert_eq!((heavy.1.epoch, heavy.1.pkts, heavy.1.drops), (2, 1, 4));
}

/// Issue 51, item 2: a source's counts in its slot are exact while small
/// and sampled past SLUICE_SRC_EXACT (a flooding source whose flows
/// arrive on many CPUs would have each of them write its slot's cache line
/// for every packet): a heavy source's drops are about its dropped packets
/// (SLUICE_SRC_SAMPLE at a time for one packet in SLUICE_SRC_SAMPLE,
/// picked by a hash of the CPU's count: 19,995 drops read 20,000, and
/// 20,000 packets 20,016), a light one's exact.
#[test]
fn a_heavy_sources_counts_are_sampled_and_a_light_ones_exact() {
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1, 10, (32, 64));
    clock(&mut g, 1);
    let n = 20_000;
    g.gate.test_run(Prog::Gate, &dns_from("192.0.2.1"), n).unwrap();
    let dropped = counter(&g, "dns", SLUICE_CS_DROP_SHARE_PKTS);
    let slot = |g: &TestGate, last: u8| {
        g.gate.sources().unwrap().into_iter().find(|(k, _)| k.addr[..4] == [192, 0, 2, last]).unwrap().1
    };
    let heavy = slot(&g, 1);
    eprintln!("dropped {dropped}, counted {} drops and {} packets of {n}", heavy.drops, heavy.pkts);
    assert!(dropped > u64::from(n) / 2, "the source must be dropped to test it: {dropped}");
    assert!(heavy.drops.abs_diff(dropped) * 10 <= dropped, "{} drops counted of {dropped}", heavy.drops);
    assert!(u64::from(heavy.pkts).abs_diff(u64::from(n)) * 10 <= u64::from(n), "{} packets counted of {n}", heavy.pkts);
    assert_eq!(heavy.drops % u64::from(SLUICE_SRC_SAMPLE), 0, "sampled past {SLUICE_SRC_EXACT}: in steps");
    // A light source over its share: its few drops exact.
    for _ in 0..WITHIN + 3 {
        g.gate.test_run(Prog::Gate, &dns_from("192.0.2.2"), 1).unwrap();
    }
    assert_eq!((slot(&g, 2).pkts, slot(&g, 2).drops), (WITHIN + 3, 3));
}

/// Smooth admission (issue 21): a source sending back to back gets its
/// burst, then one packet per interval, never a clump. In any window the
/// packets within its share are at most window / interval + two bursts
/// (tolerance / interval + 1 each: one may be paced from this CPU's last
/// clock read, see src_within_share), however the sender is scheduled; and a
/// sender well over its pace for the whole window gets at least a quarter
/// of it (a slow or stalled test thread sends less, so not more is asserted).
#[test]
fn an_unknown_source_is_paced_at_its_share_with_a_bounded_burst() {
    let mut g = gate();
    let interval = 200_000u64; // 5,000 packets/s
    fair(&g, "dns", interval as u32, 1_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    let pkt = dns_from("192.0.2.7");
    let start = std::time::Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < std::time::Duration::from_millis(50) || sent < 1_000 {
        g.run(&pkt);
        sent += 1;
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    let within = counter(&g, "dns", SLUICE_CS_UNDER_PKTS);
    let tolerance = (SLUICE_SRC_BURST_PKTS as u64 * interval).max(SLUICE_SRC_BURST_NS as u64);
    let most = elapsed / interval + 2 * (tolerance / interval + 1);
    assert!(within <= most, "{within} within its share in {elapsed} ns, at most {most}");
    let pace = elapsed / interval;
    if sent >= 4 * pace {
        assert!(within >= pace / 4, "{within} within its share in {elapsed} ns ({sent} sent), pace {pace}");
    }
    assert!(within < sent, "a sender over its pace is not all within its share: {within} of {sent}");
}

#[test]
fn fairness_off_or_an_unlimited_class_touches_no_source_state() {
    let mut g = gate();
    clock(&mut g, 1);
    for _ in 0..10 {
        g.expect("limited, fairness off", &dns_from("192.0.2.1"), Admitted("dns".into()));
        g.expect(
            "unlimited default class",
            &Frame::udp("192.0.2.1", "10.0.0.2", 1, 9).build(),
            Admitted("default".into()),
        );
    }
    assert!(g.gate.sources().unwrap().is_empty());
}

#[test]
fn known_sources_take_the_class_bucket_while_unknown_ones_find_theirs_empty() {
    let mut g = gate();
    // The unknown tier holds one packet and refills at 1/s.
    fair(&g, "dns", PACED_NS, 1, 1, (32, 64));
    clock(&mut g, 1);
    let key = |a: [u8; 4]| {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&a);
        sluice_src_key { class_id: g.class("dns") as u8, family: 4, plen: 32, addr, ..Default::default() }
    };
    // Answered `ago` seconds before now (negative: the wall clock has since
    // stepped back) over `span` seconds.
    let known = |ago: i64, span: u64| {
        let last_ms = sluice::base::clock::wall_ms().checked_add_signed(-ago * 1000).unwrap();
        // 1000 answers over the span: its own rate is far above this test's 21 packets.
        sluice_known { first_ms: last_ms - span * 1000, last_ms, answers: 1000, ..Default::default() }
    };
    let entries = [
        (key([198, 51, 100, 7]), known(0, 10)),
        // Two hours: more than a young host's uptime (issue 23, item 1: in
        // CLOCK_MONOTONIC this saturated to 0 and stayed known).
        (key([198, 51, 100, 8]), known(7200, 10)),
        (key([198, 51, 100, 9]), known(0, 0)),
        (key([198, 51, 100, 10]), known(-60, 10)),
        // Its last answer dated before its first (the wall clock stepped
        // back between them; issue 49, item 5): a wrapping difference made
        // it known at once.
        (key([198, 51, 100, 11]), sluice_known { first_ms: known(0, 0).last_ms + 5_000, ..known(0, 0) }),
    ];
    g.gate.insert_known(&entries).unwrap();
    g.expect("unknown takes the one token", &dns_from("192.0.2.1"), Admitted("dns".into()));
    g.expect("unknown finds it empty", &dns_from("192.0.2.1"), DroppedRate("dns".into()));
    for i in 0..20 {
        g.expect(&format!("known {i}"), &dns_from("198.51.100.7"), Admitted("dns".into()));
    }
    g.expect("known too long ago is unknown", &dns_from("198.51.100.8"), DroppedRate("dns".into()));
    g.expect("answered only within one second: not known", &dns_from("198.51.100.9"), DroppedRate("dns".into()));
    g.expect("known after the clock stepped back", &dns_from("198.51.100.10"), Admitted("dns".into()));
    g.expect("last answer before the first: not known", &dns_from("198.51.100.11"), DroppedRate("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 21);
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_ADMIT_PKTS), 21);
    assert_eq!(counter(&g, "dns", SLUICE_CS_UNKNOWN_PKTS), 5);
}

/// An egress frame from the service (port 53) to `client`.
/// What `client` asks the dns class (the learner learns only replies to a peer that asked).
fn ask(g: &TestGate, client: &str) {
    let server = if client.contains(':') { "2001:db8::2" } else { "10.0.0.2" };
    g.run(&Frame::udp(client, server, 4000, 53).build());
}

fn answer(client: &str, tcp_flags: Option<u8>) -> Vec<u8> {
    let server = if client.contains(':') { "2001:db8::2" } else { "10.0.0.2" };
    let Some(flags) = tcp_flags else { return Frame::udp(server, client, 53, 4000).build() };
    with_tcp_flags(&Frame::tcp(server, client, 53, 4000), flags)
}

/// A TCP frame's bytes with its flags byte set to `flags` (Frame::tcp makes SYNs).
fn with_tcp_flags(f: &Frame, flags: u8) -> Vec<u8> {
    let (mut b, offs) = f.build_with_offsets();
    let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
    b[l4 + 13] = flags;
    b
}

/// Hardening (issue 23, item 4): a known source is known only up to its own
/// rate. An address answered 10 times over 10 s (1/s; at least
/// SLUICE_KNOWN_MIN_PPS = 10/s, times SLUICE_KNOWN_HEADROOM = 40/s, bursts of
/// 200 ms = 8 intervals) sends 11 packets back to back: 9 go as known, the
/// rest as an unknown source's (the unknown tier's one token, then empty).
/// Before, a known address flooded inside the known tier with no limit of
/// its own.
#[test]
fn a_known_source_over_its_own_rate_is_an_unknown_one() {
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1, 1, (32, 64));
    clock(&mut g, 1);
    known_client(&g, g.class("dns"), 10);
    for i in 0..9 {
        g.expect(&format!("within its own rate {i}"), &dns_from("198.51.100.7"), Admitted("dns".into()));
    }
    g.expect("over it: the unknown tier's token", &dns_from("198.51.100.7"), Admitted("dns".into()));
    g.expect("over it: the unknown tier is empty", &dns_from("198.51.100.7"), DroppedRate("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 9);
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_OVER_PKTS), 2);
}

/// A known TCP source's segments without data but SYNs (ACKs, FINs) move
/// its own rate by a quarter of a packet (SLUICE_KNOWN_BARE_SHIFT; a SYN
/// counts whole: gate_cookies tests it): the client of the test above
/// sends 28 bare ACKs and a request as known (a step of 6.25 ms each, then
/// 25 ms, against its 200 ms burst) where it sent 9 datagrams: a segment
/// with data still moves it a whole step. Counted whole, a client that
/// opens a connection per request (four bare ACKs or FINs an answer) was
/// over its own rate at its calm pace.
#[test]
fn a_known_tcp_sources_bare_acks_count_a_quarter_against_its_own_rate() {
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1, 1, (32, 64));
    clock(&mut g, 1);
    known_client(&g, g.class("dns"), 10);
    // ACKs, bare and with a request.
    let acked =
        |payload: usize| with_tcp_flags(&Frame::tcp("198.51.100.7", "10.0.0.2", 4000, 53).payload(payload), 0x10);
    let (ack, request) = (acked(0), acked(40));
    for i in 0..28 {
        g.expect(&format!("a bare ACK within its own rate {i}"), &ack, Admitted("dns".into()));
    }
    // 28 quarters: 175 ms of its 200 ms burst; one request takes 25 ms more ...
    g.expect("a request: a whole step", &request, Admitted("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_OVER_PKTS), 0);
    // ... and the burst is spent: requests go over it (the test's own time,
    // a few ms, may let one or two more through as known).
    for _ in 0..4 {
        g.run(&request);
    }
    let known = counter(&g, "dns", SLUICE_CS_KNOWN_PKTS);
    assert!((29..=31).contains(&known), "{known} known: bare ACKs counted whole let 9 through");
    assert!(counter(&g, "dns", SLUICE_CS_KNOWN_OVER_PKTS) >= 2);
}

/// Issue 50, item 2: a keep-alive flood's one segment carries many
/// pipelined requests. While the unknown tier counts in work (by_work), a
/// TCP segment takes a token per SLUICE_WORK_BYTES of its data (at most half
/// the burst); a bare ACK, a UDP datagram, or any packet with by_work off
/// takes one. Each case meets a full bucket of 16 tokens refilled at 1/s.
#[test]
fn the_unknown_tier_counted_in_work_takes_a_token_per_work_bytes_of_tcp_data() {
    let burst = 16u64;
    let segment =
        |payload: usize| with_tcp_flags(&Frame::tcp("192.0.2.9", "10.0.0.2", 4000, 53).payload(payload), 0x18);
    let w = SLUICE_WORK_BYTES as usize;
    let cases = [
        ("8 pipelined requests (4 x WORK_BYTES)", segment(4 * w), true, burst / 4),
        ("one short request", segment(40), true, burst),
        ("one byte over WORK_BYTES (rounded up)", segment(w + 1), true, burst / 2),
        ("a full-sized segment (capped at half the burst)", segment(1400), true, 2),
        ("a bare ACK", segment(0), true, burst),
        ("a UDP query", dns_from("192.0.2.9"), true, burst),
        ("8 pipelined requests, by_work off", segment(4 * w), false, burst),
    ];
    for (what, pkt, by_work, admits) in cases {
        let mut g = gate();
        let f = sluice_fair {
            unknown: share(1, burst),
            on: 1,
            quota: u32::MAX,
            by_work: u32::from(by_work),
            ..Default::default()
        };
        g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
        clock(&mut g, 1);
        for _ in 0..2 * burst {
            g.run(&pkt);
        }
        assert_eq!(counter(&g, "dns", SLUICE_CS_ADMIT_PKTS), admits, "{what}: admitted of {}", 2 * burst);
        assert_eq!(counter(&g, "dns", SLUICE_CS_DROP_RATE_PKTS), 2 * burst - admits, "{what}: dropped");
    }
}

/// Issue 50, item 2: while the tier counts in work, a source's share is of
/// the service's work too. A segment of 4 x WORK_BYTES moves its source's
/// pace on by 4 intervals, so of a source paced at one token a second, 2
/// such segments are within its share (its pace 4 intervals ahead of now
/// at most: SLUICE_SRC_BURST_PKTS), against 5 bare ACKs or 5 such segments
/// with by_work off; and what is within counts in tokens (UNDER_PKTS, the
/// daemon's quota is a share of the tier's tokens). Counted in packets, a
/// keep-alive flood's source sending 8 pipelined requests a segment got 8
/// times the share of a client asking one a connection.
#[test]
fn a_source_counted_in_work_is_paced_by_its_segments_data() {
    let segment =
        |payload: usize| with_tcp_flags(&Frame::tcp("192.0.2.9", "10.0.0.2", 4000, 53).payload(payload), 0x18);
    let w = SLUICE_WORK_BYTES as usize;
    let cases = [
        ("8 pipelined requests (4 x WORK_BYTES)", segment(4 * w), true, 2, 8),
        ("a bare ACK", segment(0), true, WITHIN, WITHIN),
        ("8 pipelined requests, by_work off", segment(4 * w), false, WITHIN, WITHIN),
    ];
    for (what, pkt, by_work, within, tokens) in cases {
        let mut g = gate();
        let f = sluice_fair {
            unknown: share(1_000_000, 1_000_000),
            on: 1,
            quota: 1,
            src_interval_ns: PACED_NS,
            plen4: 32,
            plen6: 64,
            by_work: u32::from(by_work),
            ..Default::default()
        };
        g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
        clock(&mut g, 1);
        for _ in 0..10 {
            g.run(&pkt);
        }
        assert_eq!(counter(&g, "dns", SLUICE_CS_UNDER_PKTS), u64::from(tokens), "{what}: tokens within its share");
        assert_eq!(counter(&g, "dns", SLUICE_CS_UNKNOWN_PKTS), 10, "{what}");
        // Over its share: only the spare half of the tier, which is deep here.
        let over = counter(&g, "dns", SLUICE_CS_ADMIT_PKTS) - u64::from(within);
        assert_eq!(over, 10 - u64::from(within), "{what}: the rest over its share, from the spare half");
    }
}

/// Issue 51: a known client that enters on another CPU than the flood
/// (another RSS queue; on veth, another sender's CPU) finds the known tier
/// there, and a light stranger on that CPU its part of the unknown tier. The
/// daemon splits each tier by its own arrivals (`CpuArrivals`): split by all
/// of the class's arrivals, the flood's CPU took all of the known tier but a
/// floor (about 3% of it here: of the client's 150 packets after the split,
/// about 6 passed, a bucket's burst), and the client got 51.5% of its answers in the run.
#[test]
fn a_known_client_on_another_cpu_than_the_flood_finds_the_known_tier_there() {
    let mut g = gate();
    assert!(g.gate.ncpus() >= 2, "this test needs two CPUs");
    let cls = g.class("dns");
    // Known at far more than it sends: its own rate never binds here.
    known_client(&g, cls, u32::MAX);
    clock(&mut g, 1);
    let (known_pps, unknown_pps) = (2_000u64, 1_000u64);
    let tiers = two_tiers(known_pps, unknown_pps);
    let mut split = SplitCounts::default();
    g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    // One tick's arrivals: a stranger's flood on CPU 0; on CPU 1 the known
    // client and a light stranger within its share.
    let run_on = |cpu, pkt, n| run_on(&g, cpu, pkt, n);
    std::thread::scope(|s| {
        s.spawn(run_on(0, dns_from("192.0.2.1"), 20_000));
        s.spawn(|| {
            run_on(1, dns_from("198.51.100.7"), 500)();
            run_on(1, dns_from("192.0.2.9"), 3)();
        });
    });
    g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    let (known, fair) = (g.gate.shares(cls).unwrap(), g.gate.fairness(cls).unwrap());
    let rates = |v: Vec<u64>| format!("{v:?}");
    eprintln!(
        "known tier per CPU {}, unknown tier per CPU {}",
        rates(known.iter().map(|s| s.rate_pps).collect()),
        rates(fair.iter().map(|f| f.unknown.rate_pps).collect())
    );
    assert!(
        known[1].rate_pps * 10 >= known_pps * 9,
        "the known client's CPU got {} of {known_pps}/s",
        known[1].rate_pps
    );
    // The flood's stranger had its burst and one packet a 10 ms epoch
    // within its share (quota 1), the light one its 3: CPU 1's part of the
    // max-min budget. Split by all arrivals, it got 31/s.
    let under: Vec<u64> =
        g.gate.class_counters_percpu(cls).unwrap().iter().map(|c| c[SLUICE_CS_UNDER_PKTS as usize]).collect();
    assert_eq!(under[1], 3, "the light stranger was within its share");
    let fair_part = unknown_pps * under[1] / under.iter().sum::<u64>();
    assert!(
        fair[1].unknown.rate_pps * 10 >= fair_part * 9,
        "the light stranger's CPU got {} of the unknown tier's {unknown_pps}/s, its fair part {fair_part} (within share per CPU {under:?})",
        fair[1].unknown.rate_pps
    );
    // Then the known client's next 150 packets, its bucket refilled.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = counter(&g, "dns", SLUICE_CS_KNOWN_ADMIT_PKTS);
    std::thread::scope(|s| {
        s.spawn(run_on(1, dns_from("198.51.100.7"), 150));
    });
    let admitted = counter(&g, "dns", SLUICE_CS_KNOWN_ADMIT_PKTS) - before;
    // Less the packets a dry bucket drops before it reads the clock again
    // (SLUICE_CLOCK_SKIP, gate.bpf.c: phase one left it dry). Before, about 6.
    assert!(
        admitted >= 150 - u64::from(SLUICE_CLOCK_SKIP),
        "the known client's packets on its own CPU: {admitted} of 150 admitted"
    );
}

/// What runs the gate on `pkt` `n` times from a thread pinned to `cpu`
/// (in runs of at most 10,000), as that CPU's NAPI would.
fn run_on(g: &TestGate, cpu: usize, pkt: Vec<u8>, n: u32) -> impl FnOnce() + Send + '_ {
    move || {
        sluice::base::netns::pin_thread(cpu).unwrap();
        for _ in 0..n.div_ceil(10_000) {
            g.gate.test_run(Prog::Gate, &pkt, n.min(10_000)).unwrap();
        }
    }
}

/// Beside known clients the unknown tier is 1 ms deep (issue 50), and it is
/// split by each CPU's packets within their source's share: a light
/// stranger alone on another CPU than a one-source flood got a bucket of
/// a few packets there, and lost any of its packets that came closer
/// than its pace (the sources bench's new client on CPU 1: 58-62%
/// answered, 93-95% with the tier 10 ms deep). Each CPU's bucket holds
/// the tier's least depth; the rates are split as before.
#[test]
fn a_light_stranger_on_another_cpu_than_the_flood_finds_the_tiers_least_depth_there() {
    let mut g = gate();
    assert!(g.gate.ncpus() >= 2, "this test needs two CPUs");
    let cls = g.class("dns");
    clock(&mut g, 1);
    // The tier beside known clients at 20k/s, 1 ms deep.
    let unknown = Limit::Rate { pps: 20_000, burst: 20 };
    let tiers = Tiers {
        limit: Limit::Rate { pps: 2_000, burst: 200 },
        fair: Some(FairTier { unknown, quota: 1, plens: (32, 64), by_work: true }),
        ..Tiers::plain(Limit::Unlimited)
    };
    let mut split = SplitCounts::default();
    g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    // One tick's arrivals: a stranger's flood on CPU 0, a light stranger's
    // two packets (200/s) on CPU 1.
    let run_on = |cpu, pkt, n| run_on(&g, cpu, pkt, n);
    std::thread::scope(|s| {
        s.spawn(run_on(0, dns_from("192.0.2.1"), 10_000));
        s.spawn(run_on(1, dns_from("192.0.2.9"), 2));
    });
    g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    let fair = g.gate.fairness(cls).unwrap();
    let under: Vec<u64> =
        g.gate.class_counters_percpu(cls).unwrap().iter().map(|c| c[SLUICE_CS_UNDER_PKTS as usize]).collect();
    // What the split by the rate alone gives each CPU's bucket.
    let plain = sluice::dataplane::share::shares_for(&unknown, &under, false);
    eprintln!(
        "within share per CPU {under:?}: unknown tier per CPU {:?}, by the rate alone {:?}",
        fair.iter().map(|f| (f.unknown.rate_pps, f.unknown.burst)).collect::<Vec<_>>(),
        plain.iter().map(|s| (s.rate_pps, s.burst)).collect::<Vec<_>>()
    );
    assert_eq!(under[1], 2, "the light stranger was within its share");
    assert!(plain[1].burst < UNKNOWN_DEPTH_MIN, "the case this is for: by the rate alone, {plain:?}");
    assert_eq!(fair[1].unknown.rate_pps, plain[1].rate_pps, "the rate is split as before");
    assert_eq!(fair[1].unknown.burst, UNKNOWN_DEPTH_MIN, "the light stranger's CPU: {:?}", fair[1].unknown);
}

/// A class's tiers at `known_pps` for known clients (burst 200) and
/// `unknown_pps` for the rest (burst 100), a share of one packet an epoch.
fn two_tiers(known_pps: u64, unknown_pps: u64) -> Tiers {
    Tiers {
        limit: Limit::Rate { pps: known_pps, burst: 200 },
        fair: Some(FairTier {
            unknown: Limit::Rate { pps: unknown_pps, burst: 100 },
            quota: 1,
            plens: (32, 64),
            by_work: false,
        }),
        ..Tiers::plain(Limit::Unlimited)
    }
}

/// Issue 51, item 3: a split writes the entries of `shares` and `fairness`
/// whose values changed, through a mapping, not every possible CPU's value
/// of every limited class at every tick. The same arrivals split again
/// write nothing; a flood on this CPU moves the class's shares (and this
/// CPU's unknown tier), at most both maps' entries of every CPU.
#[test]
fn a_split_writes_only_the_entries_that_changed() {
    let mut g = gate();
    let cls = g.class("dns");
    clock(&mut g, 1);
    let n = g.gate.ncpus();
    let tiers = two_tiers(2_000, 1_000);
    let mut split = SplitCounts::default();
    g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    assert_eq!(g.gate.rebalance(cls, &tiers, &mut split).unwrap(), 0, "no arrivals since: nothing written");
    g.gate.test_run(Prog::Gate, &dns_from("192.0.2.1"), 5_000).unwrap();
    let moved = g.gate.rebalance(cls, &tiers, &mut split).unwrap();
    assert!(moved > 0 && moved <= 2 * n, "a flood on one CPU: {moved} entries written of {}", 2 * n);
    let (shares, fair) = (g.gate.shares(cls).unwrap(), g.gate.fairness(cls).unwrap());
    assert!(fair.iter().all(|f| f.on == 1), "every CPU has the class's fairness: {fair:?}");
    assert!(shares.iter().all(|s| s.rate_pps > 0), "every CPU keeps a part of the rate: {shares:?}");
}

/// Cost (issue 25, item 3): a class that holds no known client skips the
/// known map's hash lookup, reading only its part's `held` (an array slot).
/// With held at 0 a source the map does hold is an unknown one; the daemon's
/// next scan (held 1) makes it known again. A gate that ignored `held`
/// would count the first packet as known; one that never looked would count
/// the second as unknown.
#[test]
fn a_class_holding_no_known_client_skips_the_known_lookup() {
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1, 1, (32, 64));
    clock(&mut g, 1);
    let cls = g.class("dns");
    known_client(&g, cls, 1000);
    assert_eq!(g.gate.known_part(cls).unwrap().held, 1, "an insert counts at once");
    g.gate.set_known_part(cls, sluice_known_part { room: 100, held: 0 }).unwrap();
    g.expect("held 0: looked up as nobody", &dns_from("198.51.100.7"), Admitted("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 0);
    assert_eq!(counter(&g, "dns", SLUICE_CS_UNKNOWN_PKTS), 1);
    g.gate.set_known_part(cls, sluice_known_part { room: 99, held: 1 }).unwrap();
    g.expect("held 1: known", &dns_from("198.51.100.7"), Admitted("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 1);
}

#[test]
fn the_learner_records_answered_clients_only_while_told_to_and_never_from_a_syn_ack() {
    let mut g = gate();
    let learn = |g: &TestGate, on: u8| {
        let f = sluice_fair { learn: on, ..Default::default() };
        g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    };
    let run = |g: &TestGate, pkt: &[u8]| assert_eq!(g.gate.test_run(Prog::Learn, pkt, 1).unwrap().0, 0, "TC_ACT_OK");
    g.gate.set_known_room(g.class("dns"), 100).unwrap();
    clock(&mut g, 1);
    run(&g, &answer("198.51.100.1", None));
    assert!(g.gate.known().unwrap().is_empty(), "learning is off until the daemon says so");
    learn(&g, 1);
    g.gate.set_clock(&Clock::default());
    run(&g, &answer("198.51.100.1", None));
    assert!(g.gate.known().unwrap().is_empty(), "nor while the gate clock is not set");
    clock(&mut g, 1);
    for client in
        ["198.51.100.1", "2001:db8::1", "198.51.100.2", "198.51.100.3", "198.51.100.4", "198.51.100.5", "198.51.100.6"]
    {
        ask(&g, client);
    }
    ask(&g, "198.51.100.1"); // two requests, two answers
    let run = |pkt: &[u8]| run(&g, pkt);
    run(&answer("198.51.100.1", None));
    run(&answer("198.51.100.1", None));
    run(&answer("2001:db8::1", None));
    run(&answer("198.51.100.2", Some(0x12))); // SYN-ACK: a spoofed SYN gets one too
    run(&answer("198.51.100.3", Some(0x04))); // RST
    run(&answer("198.51.100.4", Some(0x18))); // PSH-ACK: the end of a write of an established connection
    run(&answer("198.51.100.6", Some(0x10))); // a bare ACK, or a download's segment before its last: no answer (issue 49, item 3)
    run(&Frame::udp("10.0.0.2", "198.51.100.5", 9999, 4000).build()); // not a class's port
    let mut known: Vec<(Vec<u8>, u32)> = g
        .gate
        .known()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.addr[..if k.family == 4 { 4 } else { 16 }].to_vec(), v.answers))
        .collect();
    known.sort();
    let v6: Vec<u8> =
        "2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().octets()[..8].iter().copied().chain([0; 8]).collect();
    // The second answer to .1 came within SLUICE_LEARN_REFRESH_MS of the
    // first: counted (a client is known at the rate it was answered), its
    // last answer's time not moved. Before, it was not counted, and a client
    // answered at 5k/s was known at 10/s at most (one answer a refresh).
    assert_eq!(known, vec![(v6, 1), (vec![198, 51, 100, 1], 2), (vec![198, 51, 100, 4], 1)]);
    let part = g.gate.known_part(g.class("dns")).unwrap();
    assert_eq!((part.room, part.held), (97, 3), "each new client takes one from room and adds one to held");
    // Once the refresh time has passed, an answer is noted again (to a
    // request of its own: answers are held to requests, below).
    ask(&g, "198.51.100.1");
    let later = sluice::base::clock::wall_ms() + SLUICE_LEARN_REFRESH_MS as u64;
    g.gate.set_clock(&Clock { epoch: 1, now_ms: later, known_ttl_ms: 3_600_000 });
    g.gate.test_run(Prog::Learn, &answer("198.51.100.1", None), 1).unwrap();
    let first = g.gate.known().unwrap().into_iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, 1]).unwrap();
    assert_eq!((first.1.answers, first.1.last_ms), (3, later), "noted after the refresh time");
    clock(&mut g, 1);
    let now = sluice::base::clock::wall_ms();
    assert!(g.gate.known().unwrap().iter().all(|(_, v)| v.last_ms.abs_diff(now) <= 1000 && v.first_ms <= v.last_ms));
}

/// Issue 23, item 4: a class learns new clients only while it has room in
/// its part of the known map (the daemon writes it; none before it does);
/// clients it already knows still count their answers.
#[test]
fn a_class_learns_new_clients_only_within_its_part_of_the_known_map() {
    let mut g = gate();
    let f = sluice_fair { learn: 1, ..Default::default() };
    g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    clock(&mut g, 1);
    let run = |g: &TestGate, client: &str| g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    run(&g, "198.51.100.1");
    assert!(g.gate.known().unwrap().is_empty(), "no room written yet: nothing learned");
    g.gate.set_known_room(g.class("dns"), 2).unwrap();
    for i in 1..=5 {
        ask(&g, &format!("198.51.100.{i}"));
        run(&g, &format!("198.51.100.{i}"));
    }
    // Past the learner's refresh time, so the next answer (to a second
    // request) is noted.
    let later = sluice::base::clock::wall_ms() + SLUICE_LEARN_REFRESH_MS as u64;
    g.gate.set_clock(&Clock { epoch: 1, now_ms: later, known_ttl_ms: 3_600_000 });
    ask(&g, "198.51.100.1");
    run(&g, "198.51.100.1");
    let known = g.gate.known().unwrap();
    assert_eq!(known.len(), 2, "room for two new clients");
    let first = known.iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, 1]).expect("the first client");
    assert_eq!(first.1.answers, 2, "a known client still counts its answers with the part full");
}

/// The "dns" class learning, with room for 100 new clients in its part of the known map.
fn learning_gate() -> TestGate {
    let g = gate();
    let f = sluice_fair { learn: 1, ..Default::default() };
    g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    g.gate.set_known_room(g.class("dns"), 100).unwrap();
    g
}

/// Set the gate clock to `ms`.
fn at(g: &mut TestGate, ms: u64) {
    g.gate.set_clock(&Clock { epoch: 1, now_ms: ms, known_ttl_ms: 3_600_000 });
}

/// The answers known for 198.51.100.`last`, if it is in the known map.
fn answers_of(g: &TestGate, last: u8) -> Option<u32> {
    g.gate.known().unwrap().iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, last]).map(|(_, v)| v.answers)
}

/// Issue 23, item 4: the learner learns only replies to a peer that asked
/// the class something in the last SLUICE_ASKED_WINDOW_MS (the host's own
/// outbound traffic from a service's port, to peers that sent nothing,
/// teaches nothing), and counts the replies it skipped. Without the check
/// all three replies below are learned.
#[test]
fn the_learner_learns_only_replies_to_a_peer_that_asked_first() {
    let mut g = learning_gate();
    let now = sluice::base::clock::wall_ms();
    let reply = |g: &TestGate, client: &str| g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    let learned = |g: &TestGate| {
        let mut v: Vec<u8> = g.gate.known().unwrap().iter().map(|(k, _)| k.addr[3]).collect();
        v.sort();
        v
    };
    at(&mut g, now);
    ask(&g, "198.51.100.1");
    ask(&g, "198.51.100.3");
    reply(&g, "198.51.100.1");
    reply(&g, "198.51.100.2"); // asked nothing
    at(&mut g, now + SLUICE_ASKED_WINDOW_MS as u64 + 1);
    reply(&g, "198.51.100.3"); // asked, but longer ago than the window
    assert_eq!(learned(&g), vec![1], "only the peer that asked within the window");
    let unasked = g.gate.global_counters().unwrap()[SLUICE_GS_UNASKED as usize];
    assert_eq!(unasked, 2, "the two skipped replies are counted");
    ask(&g, "198.51.100.3");
    reply(&g, "198.51.100.3");
    assert_eq!(learned(&g), vec![1, 3], "asked again: learned");
}

/// Issue 49, item 3: a client's answers are held to its requests. A
/// service that sends four datagrams per request (each counted as an
/// answer before) teaches the learner one per request: 10 requests, 40
/// datagrams back over 10 refreshes, 10 answers. A client answered one for
/// one keeps every answer, and one whose answers lag its requests by a
/// refresh (an answer after the refresh that counted its request) loses
/// none over the span: the hold is cumulative from the entry's marks, not
/// a refresh's. Without the hold the first client is known at 40 answers.
/// A pause of learning (a flood, answers slower than usual) counts none of
/// a known client's answers, so it stays out of the client's span: its own
/// rate after the pause is what it was before. Before, the first refresh
/// after a 5 s pause stretched a 2 s span to 7 s and cut the client's rate
/// to under a third (the bench's wrk then went over its own rate mid-flood,
/// docs/results/2026-11-29-tcp-under-floods.md, round ten).
#[test]
fn a_pause_of_learning_stays_out_of_a_known_clients_span() {
    let mut g = learning_gate();
    let start = sluice::base::clock::wall_ms();
    let reply = |g: &TestGate| g.gate.test_run(Prog::Learn, &answer("198.51.100.1", None), 1).unwrap();
    let refresh = SLUICE_LEARN_REFRESH_MS as u64;
    let learning = |g: &TestGate, learn: u8, from_ms: u64| {
        let f = sluice_fair { learn, learn_from_ms: from_ms, ..Default::default() };
        g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    };
    // Answered once a refresh for 2 s.
    for round in 0..=20u64 {
        at(&mut g, start + round * refresh);
        ask(&g, "198.51.100.1");
        reply(&g);
    }
    // 5 s of a pause: its answers are not counted.
    learning(&g, 0, 0);
    for round in 21..70u64 {
        at(&mut g, start + round * refresh);
        ask(&g, "198.51.100.1");
        reply(&g);
    }
    learning(&g, 1, start + 7_000);
    at(&mut g, start + 7_000);
    ask(&g, "198.51.100.1");
    reply(&g);
    let known = g.gate.known().unwrap();
    let (_, v) = known.iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, 1]).expect("known");
    assert_eq!((v.first_ms, v.last_ms, v.answers), (start, start + 7_000, 22), "{v:?}");
    assert_eq!(v.paused_ms, 5_000, "the pause, from its last refresh to learning's return");
    let rate = v.answers as f64 * 1000.0 / (v.last_ms - v.first_ms - v.paused_ms as u64) as f64;
    assert!((10.0..=11.0).contains(&rate), "its rate as the gate takes it: {rate}/s (10.5/s before the pause)");
}

/// A gap past 32 bits of ms (49 days: over any ttl, but an entry the
/// learner still finds) is left out of the client's pauses, not wrapped
/// into them: 5,000,000,000 ms before learning's return, a wrapped sum
/// read 705,033,704 ms.
#[test]
fn a_pause_past_32_bits_of_ms_is_left_out_not_wrapped() {
    let mut g = learning_gate();
    let now = sluice::base::clock::wall_ms();
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[198, 51, 100, 9]);
    let key = sluice_src_key { class_id: g.class("dns") as u8, family: 4, plen: 32, addr, ..Default::default() };
    let last_ms = now - 5_000_000_000;
    let entry =
        sluice_known { first_ms: last_ms - 10_000, last_ms, answers: 100, paused_ms: 1_000, ..Default::default() };
    g.gate.insert_known(&[(key, entry)]).unwrap();
    let f = sluice_fair { learn: 1, learn_from_ms: now, ..Default::default() };
    g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    at(&mut g, now);
    ask(&g, "198.51.100.9");
    g.gate.test_run(Prog::Learn, &answer("198.51.100.9", None), 1).unwrap();
    let known = g.gate.known().unwrap();
    let (_, v) = known.iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, 9]).expect("known");
    assert_eq!(v.last_ms, now, "refreshed: {v:?}");
    assert_eq!(v.paused_ms, 1_000, "the gap left out: {v:?}");
}

#[test]
fn a_clients_answers_are_held_to_its_requests() {
    let mut g = learning_gate();
    let start = sluice::base::clock::wall_ms();
    let reply = |g: &TestGate, client: &str| g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    let refresh = SLUICE_LEARN_REFRESH_MS as u64;
    for round in 0..10u64 {
        at(&mut g, start + round * refresh);
        ask(&g, "198.51.100.1");
        ask(&g, "198.51.100.2");
        for _ in 0..4 {
            reply(&g, "198.51.100.1");
        }
        reply(&g, "198.51.100.2");
        // .3's answer comes in the refresh after its request.
        if round > 0 {
            reply(&g, "198.51.100.3");
        }
        ask(&g, "198.51.100.3");
    }
    // One more refresh with no request: each entry's count is held again.
    at(&mut g, start + 10 * refresh);
    reply(&g, "198.51.100.1");
    reply(&g, "198.51.100.2");
    reply(&g, "198.51.100.3");
    assert_eq!(answers_of(&g, 1), Some(10), "four datagrams a request: one answer each");
    assert_eq!(answers_of(&g, 2), Some(10), "one for one: none held back (the last reply asked nothing)");
    assert_eq!(answers_of(&g, 3), Some(10), "a reply a refresh late: 10 requests, 10 answers");
}

/// Issue 49, item 3: a slot counts at most SLUICE_ASKS_PER_SEC of its
/// peer's packets a second in itself (each count is an atomic add on a line
/// every CPU the peer reaches writes), the rest in a per-CPU count the
/// learner sums at the peer's refresh. Both kinds of peer are held: 4,000
/// requests answered four times each, 4,000 answers; 10,000 in a second
/// (past the slot's count) answered four times each, 10,000 less the first
/// round's requests before the entry's marks (100, 8 of them in flight).
/// Before the per-CPU count, the heavy peer was not held: 40,001.
#[test]
fn a_peer_past_the_slots_count_is_held_by_its_count_on_each_cpu() {
    let mut g = learning_gate();
    let asks = |g: &TestGate, client: &str, n: u32| {
        g.gate.test_run(Prog::Gate, &Frame::udp(client, "10.0.0.2", 4000, 53).build(), n).unwrap();
    };
    let replies = |g: &TestGate, client: &str, n: u32| g.gate.test_run(Prog::Learn, &answer(client, None), n).unwrap();
    let start = sluice::base::clock::wall_ms();
    at(&mut g, start);
    for _ in 0..4000 {
        asks(&g, "198.51.100.1", 1);
        replies(&g, "198.51.100.1", 4);
    }
    for _ in 0..100 {
        asks(&g, "198.51.100.2", 100);
        replies(&g, "198.51.100.2", 400);
    }
    at(&mut g, start + SLUICE_LEARN_REFRESH_MS as u64);
    replies(&g, "198.51.100.1", 1);
    replies(&g, "198.51.100.2", 1);
    assert_eq!(answers_of(&g, 1), Some(4000), "under the slot's count: one answer a request");
    assert_eq!(answers_of(&g, 2), Some(10_000 - 92), "past it: held by the per-CPU count");
}

/// Issue 49, item 3: a heavy peer whose queries arrive on both CPUs at once
/// is counted on each, and the learner sums the CPUs: answered twice per
/// query, it is held to its queries (summing one CPU only would hold it to
/// about half).
#[test]
fn a_heavy_peer_on_two_cpus_is_held_to_its_queries_on_both() {
    let mut g = learning_gate();
    let client = "198.51.100.9";
    let query = Frame::udp(client, "10.0.0.2", 4000, 53).build();
    let start = sluice::base::clock::wall_ms();
    at(&mut g, start);
    // One query and its answer: the entry and its marks.
    g.gate.test_run(Prog::Gate, &query, 1).unwrap();
    g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    let before = counter(&g, "dns", SLUICE_CS_SEEN_PKTS);
    from_both_cpus(&g, &query, 0.2);
    let queries = counter(&g, "dns", SLUICE_CS_SEEN_PKTS) - before;
    g.gate.test_run(Prog::Learn, &answer(client, None), u32::try_from(2 * queries).unwrap()).unwrap();
    at(&mut g, start + SLUICE_LEARN_REFRESH_MS as u64);
    g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    let held = u64::from(answers_of(&g, 9).unwrap());
    // The first answer and its query (marks set with up to 8 in flight), then the queries.
    assert!(held >= queries && held <= queries + 9, "{queries} queries from both CPUs, held to {held} answers");
}

/// A limited "dns" class in a gate whose sources table has `slots` slots.
fn small_table(slots: u32, seed: u64) -> TestGate {
    let flags = ["dns:rate=1000000,burst=1000000,match=udp:53"];
    let cfg = sluice::policy::config::from_flags(&flags.map(String::from)).unwrap();
    let mut gate = Gate::load_seeded(slots, seed).unwrap();
    gate.apply(&cfg, &sluice::dataplane::classify::compile(&cfg).unwrap()).unwrap();
    let g = TestGate { gate, cfg };
    g.gate.set_shares(g.class("dns"), &vec![share(1_000_000, 1_000_000); g.gate.ncpus()]).unwrap();
    g
}

#[test]
fn more_sources_than_the_table_holds_take_each_others_slots_and_are_counted() {
    let mut g = small_table(60, common::TEST_SEED);
    assert_eq!(g.gate.sources_capacity(), 64, "rounded up to a power of 2");
    fair(&g, "dns", PACED_NS, 1_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    for i in 0..1000u32 {
        let src = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        g.expect(&format!("source {i}"), &dns_from(&src), Admitted("dns".into()));
    }
    let held = g.gate.sources().unwrap().len() as u64;
    // 1,000 sources in 64 slots: a slot none of them hashes to is left
    // empty about once in 10^5 runs; held is exact either way below.
    assert!((60..=64).contains(&held), "the table holds at most its slots: {held}");
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_ACTIVE), 1000, "every source counted in its epoch");
    // All in one epoch: a slot's first source is an insert, each later one
    // takes it from a source that sent this epoch.
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_INSERTS), held);
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_COLLIDED), 1000 - held);
    // In the next epoch the holders are quiet: the first taker of each slot
    // is turnover (an insert), the others take it from a live one.
    clock(&mut g, 2);
    let (seed, mask) = g.gate.slot_hash();
    let id = g.gate.class_ids().id(g.class("dns")).byte();
    let mut slots = std::collections::BTreeSet::new();
    for i in 1000..1100u32 {
        let a = [10, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        g.run(&dns_from(&std::net::Ipv4Addr::from(a).to_string()));
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&a);
        let key = sluice_src_key { class_id: id, family: 4, plen: 32, addr, ..Default::default() };
        slots.insert(sluice::dataplane::gate::slot_of(&key, seed, mask));
    }
    let (inserts, collided) = (counter(&g, "dns", SLUICE_CS_SRC_INSERTS), counter(&g, "dns", SLUICE_CS_SRC_COLLIDED));
    assert_eq!(inserts, held + slots.len() as u64, "one insert per slot taken from a quiet source");
    assert_eq!(inserts + collided, 1100);
}

#[test]
fn the_gate_puts_a_source_where_slot_of_says_with_a_seed_drawn_per_load() {
    let seeds: Vec<u64> = (0..2).map(|_| Gate::load_with(64).unwrap().slot_hash().0).collect();
    assert_ne!(seeds[0], seeds[1], "a seed of its own each load");
    // A gate with a random seed: the source written where slot_of says is
    // the one the gate finds (no insert), counted on.
    let mut g = small_table(64, seeds[1]);
    fair(&g, "dns", PACED_NS, 1_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    assert_eq!(g.gate.fill_sources(g.class("dns") as u8, 1, 1).unwrap(), 1);
    g.expect("the filled source", &dns_from("11.0.0.0"), Admitted("dns".into()));
    assert_eq!(counter(&g, "dns", SLUICE_CS_SRC_INSERTS), 0, "found in its slot");
    let held = g.gate.sources().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].0.addr[..4].to_vec(), held[0].1.pkts), (vec![11, 0, 0, 0], 2));
}

/// What sharing a slot costs: a heavy source whose slot a light one shares
/// is paced from scratch after each of the light one's packets (a fresh
/// burst each time); the light one is never held back by it. A light one
/// in another slot changes nothing. Counted in UNDER_PKTS (within a share),
/// with a bucket large enough that no packet is dropped.
#[test]
fn a_light_source_sharing_a_heavy_ones_slot_gives_it_a_fresh_burst_and_is_never_held_back() {
    // As many light packets as its own burst: apart, all within its share too.
    const ROUNDS: u64 = WITHIN as u64;
    let run = |light: &str| -> (u64, u64) {
        let mut g = small_table(64, common::TEST_SEED);
        fair(&g, "dns", PACED_NS, 1_000_000, 1_000_000, (32, 64));
        clock(&mut g, 1);
        let under = |g: &TestGate| counter(g, "dns", SLUICE_CS_UNDER_PKTS);
        let mut heavy_within = 0;
        for _ in 0..ROUNDS {
            let before = under(&g);
            g.run(&dns_from(light));
            assert_eq!(under(&g), before + 1, "the light source is within its share");
            let before = under(&g);
            for _ in 0..20 {
                g.run(&dns_from("192.0.2.1"));
            }
            heavy_within += under(&g) - before;
        }
        (heavy_within, counter(&g, "dns", SLUICE_CS_SRC_COLLIDED))
    };
    let g = small_table(64, common::TEST_SEED);
    let slot = |a: [u8; 4]| {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&a);
        let key = sluice_src_key {
            class_id: g.gate.class_ids().id(g.class("dns")).byte(),
            family: 4,
            plen: 32,
            addr,
            ..Default::default()
        };
        let (seed, mask) = g.gate.slot_hash();
        sluice::dataplane::gate::slot_of(&key, seed, mask)
    };
    let heavy = slot([192, 0, 2, 1]);
    let pick = |same: bool| {
        (1..4096u32)
            .map(|i| [198, 51, (i >> 8) as u8, i as u8])
            .find(|&a| (slot(a) == heavy) == same)
            .expect("an address among 4,095")
    };
    let (shared, apart) = (pick(true), pick(false));
    let ip = |a: [u8; 4]| std::net::Ipv4Addr::from(a).to_string();
    let (heavy_shared, collided_shared) = run(&ip(shared));
    let (heavy_apart, collided_apart) = run(&ip(apart));
    assert_eq!(heavy_apart, WITHIN as u64, "apart: the heavy source's one burst, then paced");
    assert_eq!(collided_apart, 0);
    assert_eq!(heavy_shared, ROUNDS * WITHIN as u64, "sharing: a fresh burst after each light packet");
    // Counted apart from inserts: the daemon reads inserts as the table's turnover.
    assert_eq!(collided_shared, 2 * ROUNDS - 1, "each takes the slot from the other");
}

#[test]
fn an_ipv6_flood_rotating_the_lower_64_bits_is_one_source() {
    let mut g = gate();
    // A bucket of 20: the burst of 5 within its share, then the top half down to 10.
    fair(&g, "dns", PACED_NS, 1, 20, (32, 64));
    clock(&mut g, 1);
    let mut dropped = 0;
    for i in 0..100u32 {
        let src = format!("2001:db8:7:7:{:x}:{:x}:{:x}:1", i * 7919 % 65536, i, i * 31);
        let (verdict, _, _) = g.run(&Frame::udp(&src, "2001:db8::2", 4000, 53).build());
        dropped += (verdict == sluice::dataplane::gate::XDP_DROP) as u32;
    }
    assert_eq!(dropped, 90, "one /64: its burst, then the top half of the bucket");
    assert_eq!(g.gate.sources().unwrap().len(), 1);
}

#[test]
fn aggregated_counting_makes_a_slash_24_and_a_slash_48_one_source() {
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1, 40, (24, 48));
    clock(&mut g, 1);
    for i in 0..20u32 {
        g.run(&dns_from(&format!("203.0.113.{}", i + 1)));
        g.run(&Frame::udp(&format!("2001:db8:9:{:x}::1", i), "2001:db8::2", 4000, 53).build());
    }
    let mut keys: Vec<(u8, u8, Vec<u8>, u32)> =
        g.gate.sources().unwrap().into_iter().map(|(k, v)| (k.family, k.plen, k.addr[..8].to_vec(), v.pkts)).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![(4, 24, vec![203, 0, 113, 0, 0, 0, 0, 0], 20), (6, 48, vec![0x20, 0x01, 0x0d, 0xb8, 0, 9, 0, 0], 20)]
    );
    assert_eq!(counter(&g, "dns", SLUICE_CS_DROP_SHARE_PKTS), 20);
}

#[test]
fn fragments_are_paced_by_source_and_headers_past_the_parse_depth_never_reach_a_class() {
    let mut g = gate();
    fair(&g, "icmp", PACED_NS, 1, 2 * WITHIN as u64, (32, 64));
    fair(&g, "default", PACED_NS, 1_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    // A non-first fragment has no ports: its protocol's class, counted by source.
    let frag = Frame::icmp("192.0.2.9", "10.0.0.2").fragment(100, false).build();
    for i in 0..WITHIN {
        g.expect(&format!("fragment within its share {i}"), &frag, Admitted("icmp".into()));
    }
    g.expect("fragment over its share", &frag, DroppedShare("icmp".into()));
    // Past the parse depth: malformed, so it cannot take the (unlimited)
    // default class around its port's class and its source's share.
    let deep = (0..7).fold(Frame::udp("2001:db8::9", "2001:db8::2", 1, 53), |f, _| f.ext(Ext::DestOpts)).build();
    for _ in 0..3 {
        g.expect("too deep", &deep, MalformedDrop);
    }
}

/// The source scan runs on its own thread (issue 23, item 5: the control
/// thread read both maps itself): it reads the gate's maps through its own
/// handles, sums them per class for the config it was told, and follows a
/// new config from its next scan on; `take` never waits for it.
#[test]
fn the_source_scan_reads_the_maps_on_its_own_thread_for_the_config_it_follows() {
    use sluice::daemon::known_store::Shape;
    use sluice::daemon::source_scan::SourceScan;
    use std::time::{Duration, Instant};
    let mut g = gate();
    fair(&g, "dns", PACED_NS, 1_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    for i in 0..5u8 {
        g.expect("a new source", &dns_from(&format!("192.0.2.{i}")), Admitted("dns".into()));
    }
    let dns = g.class("dns");
    let classes = g.cfg.classes.len();
    let known_capacity = g.gate.known_capacity();
    let learns = 1u64 << dns;
    let ids = g.gate.class_ids().index();
    let shape = |generation| Shape { generation, classes, learns, untrusted: 0, known_capacity, ids };
    let scan = SourceScan::start(g.gate.source_maps().unwrap(), shape(1), Duration::from_millis(20));
    let t = Instant::now();
    assert!(scan.take().is_none(), "nothing scanned yet, and take did not wait");
    assert!(t.elapsed() < Duration::from_millis(20));
    let next = |want: u64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(f) = scan.take() {
                let f = f.unwrap();
                if f.shape.generation == want {
                    return f;
                }
            }
            assert!(Instant::now() < deadline, "no scan for generation {want}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let found = next(1);
    assert_eq!(found.entries, 5);
    assert!(found.sources_read, "the first scan reads the map");
    assert_eq!(found.per_class.len(), classes);
    assert_eq!(found.per_class[dns].0, 5, "the dns class's sources");
    scan.follow(shape(2));
    let found = next(2);
    assert_eq!(found.entries, 5);
    assert!(found.sources_read, "a new config: read again");
    // Cost (issue 25, item 2): with no class counting its sources the map is
    // not read again; the entries made meanwhile show once one counts.
    g.gate.fill_sources(dns as u8, 3, 1).unwrap();
    let skipped = next(2);
    assert!(!skipped.sources_read, "nobody counted: the last read stands");
    assert_eq!(skipped.entries, 5);
    scan.counting(true);
    // The scan in the channel may predate the flag: the one after it reads.
    let read = (0..3).map(|_| next(2)).find(|f| f.sources_read).expect("read again within two scans");
    assert_eq!(read.entries, 8, "read again after a class counted");
}

/// Poisoning: a pulsing flood of valid queries is answered in the ms before
/// the daemon sees each pulse and stops learning, so without more its
/// address is noted at two pulses seconds apart and becomes known. The
/// daemon taints the window it did not confirm (struct sluice_fair's
/// taint_*_ms): a client first noted in it starts its span again at its next
/// answer. A client first noted before the window keeps its span.
#[test]
fn a_client_first_noted_in_an_unconfirmed_window_starts_its_span_again() {
    let mut g = gate();
    let cls = g.class("dns");
    g.gate.set_known_room(cls, 100).unwrap();
    let learn = |g: &TestGate, taint: (u64, u64)| {
        let f = sluice_fair { learn: 1, taint_from_ms: taint.0, taint_to_ms: taint.1, ..Default::default() };
        g.gate.set_fairness(cls, &vec![f; g.gate.ncpus()]).unwrap();
    };
    let answered_at = |g: &mut TestGate, client: &str, ms: u64| {
        g.gate.set_clock(&Clock { epoch: 1, now_ms: ms, known_ttl_ms: 3_600_000 });
        ask(g, client);
        assert_eq!(g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap().0, 0);
    };
    let t0 = sluice::base::clock::wall_ms();
    learn(&g, (0, 0));
    answered_at(&mut g, "198.51.100.1", t0 - 2_000); // a client, while all was calm
    answered_at(&mut g, "198.51.100.2", t0); // the first pulse, answered before it was seen
                                             // The daemon's next tick saw the surge: the window from its last
                                             // learning tick (t0) to now is tainted. Three seconds later it learns again.
    learn(&g, (t0, t0 + 10));
    answered_at(&mut g, "198.51.100.1", t0 + 3_000);
    answered_at(&mut g, "198.51.100.2", t0 + 3_000); // the second pulse
    let span = |g: &TestGate, last: u8| {
        let known = g.gate.known().unwrap();
        let (_, v) = known.iter().find(|(k, _)| k.addr[..4] == [198, 51, 100, last]).expect("noted");
        (v.last_ms - v.first_ms, v.answers)
    };
    assert_eq!(span(&g, 1), (5_000, 2), "the calm client keeps its span");
    // (Known takes a span of SLUICE_KNOWN_SPAN_MS: see the tests above.)
    assert_eq!(span(&g, 2), (0, 1), "the pulse starts again: never a second's span, never known");
}

/// A known client first noted inside the window the daemon last did not
/// confirm is not known at the gate while that window stands (a flood of
/// real connections answered before the class's late answers were judged:
/// `late::LATE_TAINT_MS`), before the learner sees it again; outside the
/// window it is.
#[test]
fn a_known_client_first_noted_in_the_unconfirmed_window_is_not_known_meanwhile() {
    let mut g = gate();
    clock(&mut g, 1);
    let cls = g.class("dns");
    known_client(&g, cls, 1_000);
    let first_ms = sluice::base::clock::wall_ms() - 10_000;
    let limited = |g: &TestGate, taint: (u64, u64)| {
        let f = sluice_fair {
            unknown: share(1_000_000, 1_000_000),
            on: 1,
            quota: 1_000_000,
            src_interval_ns: 1,
            plen4: 32,
            plen6: 64,
            taint_from_ms: taint.0,
            taint_to_ms: taint.1,
            ..Default::default()
        };
        g.gate.set_fairness(g.class("dns"), &vec![f; g.gate.ncpus()]).unwrap();
    };
    limited(&g, (first_ms - 500, first_ms + 500));
    g.run(&dns_from("198.51.100.7"));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 0, "first noted in the window: not known");
    assert_eq!(counter(&g, "dns", SLUICE_CS_UNKNOWN_PKTS), 1);
    limited(&g, (first_ms + 1, first_ms + 500));
    g.run(&dns_from("198.51.100.7"));
    assert_eq!(counter(&g, "dns", SLUICE_CS_KNOWN_PKTS), 1, "first noted before it: known");
}

/// Hardening (issue 35, item 3): re-keying the known map for a new class
/// list writes and deletes its entries in batches (one syscall per 4,096),
/// not one syscall each on the control thread; a batch that meets a key
/// already gone still deletes the rest. The time is printed, not asserted
/// (timed).
#[test]
fn known_entries_are_written_and_deleted_in_batches() {
    let g = gate();
    let n = 59_000u32;
    let entries: Vec<(sluice_src_key, sluice_known)> = (0..n)
        .map(|i| {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&(0x0c00_0000 + i).to_be_bytes());
            let k = sluice_src_key { class_id: (1 + i % 2) as u8, family: 4, plen: 32, addr, ..Default::default() };
            (k, sluice_known { first_ms: 1, last_ms: 2, answers: 3, ..Default::default() })
        })
        .collect();
    let t = std::time::Instant::now();
    g.gate.insert_known(&entries).unwrap();
    let insert = t.elapsed();
    assert_eq!(g.gate.known().unwrap().len(), n as usize, "every entry written, and read back whole");
    // Delete the even ones, one of them twice over (gone before its batch runs).
    let mut gone: Vec<sluice_src_key> = entries.iter().step_by(2).map(|(k, _)| *k).collect();
    g.gate.delete_known(&gone[..1]).unwrap();
    let t = std::time::Instant::now();
    g.gate.delete_known(&gone).unwrap();
    let delete = t.elapsed();
    let left = g.gate.known().unwrap();
    assert_eq!(left.len(), n as usize / 2, "the odd ones are left");
    gone.sort_unstable_by_key(|k| k.addr);
    assert!(left.iter().all(|(k, _)| gone.binary_search_by_key(&k.addr, |g| g.addr).is_err()));
    println!("{n} known entries: written in {insert:?}, half deleted in {delete:?} (printed, not asserted: timed)");
}

/// Issue 49, item 10: the learner took the class of the service's port
/// alone, so where `src` rules split a port, a client of the split-off
/// class was learned into the port's fallback class (and, asked in its own
/// class, was never learned at all). It now takes the class the client's
/// own packets take.
#[test]
fn a_client_is_learned_in_the_class_its_source_prefix_puts_it() {
    let mut g = TestGate::new(&[
        "near:rate=1000000,match=udp:53@198.51.100.0/24,match=udp:53@2001:db8:1::/48",
        "dns:rate=1000000,match=udp:53",
    ]);
    for class in ["near", "dns"] {
        let f = sluice_fair { learn: 1, ..Default::default() };
        g.gate.set_fairness(g.class(class), &vec![f; g.gate.ncpus()]).unwrap();
        g.gate.set_known_room(g.class(class), 100).unwrap();
    }
    clock(&mut g, 1);
    for client in ["198.51.100.7", "203.0.113.7", "2001:db8:1::7", "2001:db8:2::7"] {
        ask(&g, client);
        g.gate.test_run(Prog::Learn, &answer(client, None), 1).unwrap();
    }
    let mut learned: Vec<(u8, u8, u8)> = g
        .gate
        .known()
        .unwrap()
        .into_iter()
        .map(|(k, _)| (k.family, k.addr[if k.family == 4 { 0 } else { 5 }], k.class_id))
        .collect();
    learned.sort();
    let (near, dns) = (g.class("near") as u8, g.class("dns") as u8);
    assert_eq!(learned, vec![(4, 198, near), (4, 203, dns), (6, 1, near), (6, 2, dns)]);
}

/// A UDP socket on loopback (the test run's netns) with a 4 KiB buffer,
/// which `fill` puts past SLUICE_ROOM_UNKNOWN_PCT with datagrams nobody reads.
struct SmallSocket {
    sock: std::net::UdpSocket,
    port: u16,
}

impl SmallSocket {
    fn new() -> SmallSocket {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        let sock: std::net::UdpSocket = sock.into();
        sock.set_nonblocking(true).unwrap();
        let port = sock.local_addr().unwrap().port();
        SmallSocket { sock, port }
    }

    fn fill(&self) {
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..64 {
            tx.send_to(&[0u8; 64], ("127.0.0.1", self.port)).unwrap();
        }
    }

    /// Read it empty; how many datagrams it held.
    fn drain(&self) -> usize {
        let mut buf = [0u8; 128];
        let mut n = 0;
        while self.sock.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }
}

/// Issue 48: the last quarter of a UDP socket's buffer is its known
/// clients'. A real socket on loopback (the test run's netns; the frame's
/// destination) is filled past SLUICE_ROOM_UNKNOWN_PCT by datagrams nobody
/// reads: an unknown source's datagram to it is dropped (DROP_ROOM), a known
/// client's within its rate is admitted, in an unlimited class (the known
/// lookup done by the room check) and a limited one with fairness (told by
/// the tiers). Once the socket is read empty the unknown source is admitted
/// again; a class with the rule off, or holding no known client, admits it
/// into the full socket. A gate
/// without the rule admits all; one that read the wrong socket or the
/// wrong count would drop nothing or everything.
#[test]
fn a_crowded_socket_keeps_its_last_quarter_for_known_clients() {
    let sock = SmallSocket::new();
    let port = sock.port;
    let spec = |name: &str, rate: &str| format!("{name}:rate={rate},burst=1000000,match=udp:{port}");
    let to = |src: &str| Frame::udp(src, "127.0.0.1", 4000, port).build();
    for limited in [false, true] {
        let rate = if limited { "1000000" } else { "100000000" };
        let mut g = TestGate::new(&[&spec("svc", rate)]);
        clock(&mut g, 1);
        let cls = g.class("svc");
        let mut f = sluice_fair { room: 1, ..Default::default() };
        if limited {
            f = sluice_fair {
                unknown: share(1_000_000, 1_000_000),
                on: 1,
                quota: 1_000_000,
                plen4: 32,
                plen6: 64,
                ..f
            };
        }
        g.gate.set_fairness(cls, &vec![f; g.gate.ncpus()]).unwrap();
        known_client(&g, cls, 100_000);
        sock.fill();
        let what = if limited { "limited" } else { "unlimited" };
        g.expect(&format!("{what}: unknown, socket full"), &to("192.0.2.1"), DroppedRoom("svc".into()));
        g.expect(&format!("{what}: known, socket full"), &to("198.51.100.7"), Admitted("svc".into()));
        assert!(sock.drain() > 0, "the datagrams sent were queued");
        g.expect(&format!("{what}: unknown, socket read empty"), &to("192.0.2.1"), Admitted("svc".into()));
        sock.fill();
        g.gate.set_fairness(cls, &vec![sluice_fair { room: 0, ..f }; g.gate.ncpus()]).unwrap();
        g.expect(&format!("{what}: unknown, rule off"), &to("192.0.2.1"), Admitted("svc".into()));
        g.gate.set_fairness(cls, &vec![f; g.gate.ncpus()]).unwrap();
        g.gate.set_known_part(cls, sluice_known_part { room: 100, held: 0 }).unwrap();
        g.expect(&format!("{what}: unknown, no known client held"), &to("192.0.2.1"), Admitted("svc".into()));
        sock.drain();
    }
}

/// Issue 48: a class whose room the daemon armed (surge_pkts, room 0)
/// keeps room on a CPU from a surge that CPU marked itself, before any tick
/// of the daemon: surge_pkts of its packets within SLUICE_SURGE_WINDOW_NS.
/// The test pins itself to one CPU (a class's state is per CPU). Into a
/// crowded socket: the same packets spaced over more than the window mark
/// nothing and are admitted; a burst marks once, and then an unknown
/// source is dropped for the room and a known client admitted; after the
/// hold, the next spaced count lets the mark go; disarmed (surge_pkts 0),
/// a burst marks nothing. A gate that never counted, or one that marked on
/// any count, fails the first or second part.
#[test]
fn an_armed_room_is_kept_from_a_surge_the_gate_marks_itself() {
    sluice::base::netns::pin_thread(0).unwrap();
    let sock = SmallSocket::new();
    let port = sock.port;
    let mut g = TestGate::new(&[&format!("svc:rate=100000000,burst=1000000,match=udp:{port}")]);
    clock(&mut g, 1);
    let cls = g.class("svc");
    let unknown = Frame::udp("192.0.2.1", "127.0.0.1", 4000, port).build();
    let known = Frame::udp("198.51.100.7", "127.0.0.1", 4000, port).build();
    known_client(&g, cls, 100_000);
    const N: u32 = 64;
    let armed = |n: u32| {
        g.gate.set_fairness(cls, &vec![sluice_fair { surge_pkts: n, ..Default::default() }; g.gate.ncpus()]).unwrap()
    };
    let marks = |g: &TestGate| counter(g, "svc", SLUICE_CS_SURGE_MARKS);
    // Each packet 100 us after the last: N of them span 6.4 ms at least.
    let spaced = |g: &TestGate, pkt: &[u8], n: u32| {
        for _ in 0..n {
            std::thread::sleep(std::time::Duration::from_micros(100));
            g.gate.test_run(Prog::Gate, pkt, 1).unwrap();
        }
    };
    armed(N);
    sock.fill();
    let before = counter(&g, "svc", SLUICE_CS_ADMIT_PKTS);
    spaced(&g, &unknown, 3 * N);
    assert_eq!(marks(&g), 0, "{} packets, each 100 us apart, are no surge", 3 * N);
    assert_eq!(counter(&g, "svc", SLUICE_CS_ADMIT_PKTS) - before, u64::from(3 * N), "all admitted");
    g.expect("armed, no surge: unknown into the full socket", &unknown, Admitted("svc".into()));
    // Back to back, in one run: some N of them within 2 ms, however slow the host.
    g.gate.test_run(Prog::Gate, &unknown, 20 * N).unwrap();
    assert_eq!(marks(&g), 1, "a burst marks one surge on this CPU");
    g.expect("marked: unknown, socket full", &unknown, DroppedRoom("svc".into()));
    g.expect("marked: known, socket full", &known, Admitted("svc".into()));
    assert!(sock.drain() > 0, "the datagrams sent were queued");
    g.expect("marked: unknown, socket read empty", &unknown, Admitted("svc".into()));
    sock.fill();
    std::thread::sleep(
        std::time::Duration::from_nanos(u64::from(SLUICE_SURGE_HOLD_NS)) + std::time::Duration::from_millis(10),
    );
    spaced(&g, &unknown, N);
    g.expect("after the hold and a spaced count: unknown, socket full", &unknown, Admitted("svc".into()));
    g.gate.test_run(Prog::Gate, &unknown, 20 * N).unwrap();
    assert_eq!(marks(&g), 2, "a second burst marks again");
    armed(0);
    g.expect("disarmed: unknown, socket full", &unknown, Admitted("svc".into()));
    g.gate.test_run(Prog::Gate, &unknown, 20 * N).unwrap();
    assert_eq!(marks(&g), 2, "disarmed: a burst marks nothing");
    g.expect("disarmed after a burst: unknown, socket full", &unknown, Admitted("svc".into()));
    sock.drain();
}

/// Issue 48: one packet in SLUICE_KNOWN_SAMPLE of a class on a CPU, in any
/// mode (here unlimited: the tiers count nothing), has its source looked
/// up: the known share of the class's arrivals, which a surge of newcomers
/// engages the auto controller by (`controller::newcomers`).
#[test]
fn one_packet_in_sixteen_of_an_unlimited_class_is_sampled_for_its_known_share() {
    let mut g = TestGate::new(&["svc:match=udp:53"]);
    clock(&mut g, 1);
    let cls = g.class("svc");
    known_client(&g, cls, 1000);
    let sampled =
        |g: &TestGate| (counter(g, "svc", SLUICE_CS_SAMPLED_PKTS), counter(g, "svc", SLUICE_CS_SAMPLED_KNOWN));
    // Runs of a multiple of 16 on one CPU each: every 16th packet sampled.
    let n = 10 * SLUICE_KNOWN_SAMPLE;
    g.gate.test_run(Prog::Gate, &dns_from("198.51.100.7"), n).unwrap();
    assert_eq!(sampled(&g), (10, 10), "the known client's packets");
    g.gate.test_run(Prog::Gate, &dns_from("203.0.113.9"), 3 * n).unwrap();
    assert_eq!(sampled(&g), (40, 10), "a newcomer's packets");
    let t = g.counters().classes[cls];
    assert_eq!((t.sampled_pkts, t.sampled_known_pkts), (40, 10), "ClassTotals reads them");
    assert_eq!(t.admitted_pkts, u64::from(4 * n), "sampling drops nothing");
    let share = sluice::policy::controller::unknown_share(t.sampled_pkts, t.sampled_known_pkts);
    assert_eq!(share, Some(0.75));
}

/// Send `pkt` from a thread pinned to each of CPUs 0 and 1 at once, about
/// `secs` of back-to-back test runs each. Returns the monotonic time (the
/// gate's clock) before the first and after the last call.
fn from_both_cpus(g: &TestGate, pkt: &[u8], secs: f64) -> (u64, u64) {
    const CALL: u32 = 20_000;
    let start = sluice::base::clock::now_ns();
    std::thread::scope(|s| {
        for cpu in 0..2 {
            s.spawn(move || {
                sluice::base::netns::pin_thread(cpu).unwrap();
                let until = sluice::base::clock::now_ns() + (secs * 1e9) as u64;
                while sluice::base::clock::now_ns() < until {
                    g.gate.test_run(Prog::Gate, pkt, CALL).unwrap();
                }
            });
        }
    });
    (start, sluice::base::clock::now_ns())
}

/// Issue 51, item 2: one source whose packets arrive on two CPUs at once
/// (RSS spreads a source's flows over queues) is paced at its share, not
/// up to twice it. Each CPU's read and write of the source's pace are two
/// steps; with plain writes a CPU could write back a pace older than the
/// other's step and give the source a packet for free.
/// Bound: the window's packets at its share plus two bursts on each CPU
/// (one may be paced from that CPU's last clock read, src_within_share).
/// On 2 CPUs plain writes stayed within it too (99,300-100,800 of bounds
/// near 101,400, three runs): a miss needs two CPUs to admit the source in
/// the same few ns, and over its share each reads the clock once in
/// SLUICE_CLOCK_SKIP + 1 packets. The misses grow with the CPUs that race.
#[test]
fn an_unknown_source_on_two_cpus_at_once_is_paced_at_one_share() {
    let mut g = gate();
    assert!(g.gate.ncpus() >= 2, "this test needs two CPUs");
    let interval = 10_000u64; // 100,000 packets/s: far below what one CPU sends here
    fair(&g, "dns", interval as u32, 1_000_000_000, 1_000_000, (32, 64));
    clock(&mut g, 1);
    let (start, end) = from_both_cpus(&g, &dns_from("192.0.2.7"), 1.0);
    let per_cpu: Vec<u64> = g
        .gate
        .class_counters_percpu(g.class("dns"))
        .unwrap()
        .iter()
        .map(|c| c[SLUICE_CS_UNDER_PKTS as usize])
        .collect();
    let sent = counter(&g, "dns", SLUICE_CS_UNKNOWN_PKTS);
    let within: u64 = per_cpu.iter().sum();
    let tolerance = (SLUICE_SRC_BURST_PKTS as u64 * interval).max(SLUICE_SRC_BURST_NS as u64);
    let most = (end - start) / interval + 2 * 2 * (tolerance / interval + 1);
    eprintln!(
        "within its share per CPU {per_cpu:?} of {sent} sent in {} ms; at most {most}",
        (end - start) / 1_000_000
    );
    assert!(per_cpu[0] > 0 && per_cpu[1] > 0, "both CPUs saw the source within its share: {per_cpu:?}");
    assert!(sent > 4 * most, "the source must send far over its share to test it: {sent} sent, share {most}");
    assert!(within <= most, "{within} within its share in {} ns from two CPUs, at most {most}", end - start);
}

/// The same for a known client's own rate (`known_within_rate`): on two
/// CPUs at once it gets its rate, not more. Its pace starts at the coarse
/// clock's now (at most a jiffy, 10 ms, before the window) and ends at most
/// its burst (the 100 ms tolerance) past the window's end, so the bound is
/// (window + burst + 10 ms) at its rate, plus one. Measured with plain
/// writes on 2 CPUs: 11,821-12,383 within it against bounds of 11,2xx (a
/// CPU's write-back missed the other's step); atomic steps: 10,760-10,960.
#[test]
fn a_known_client_on_two_cpus_at_once_keeps_to_its_own_rate() {
    let mut g = gate();
    assert!(g.gate.ncpus() >= 2, "this test needs two CPUs");
    let cls = g.class("dns");
    // 2,500 answers/s over 10 s: its own rate SLUICE_KNOWN_HEADROOM times that.
    known_client(&g, cls, 25_000);
    clock(&mut g, 1);
    let interval = 1_000_000_000 / (2_500 * SLUICE_KNOWN_HEADROOM as u64);
    fair(&g, "dns", PACED_NS, 1_000_000_000, 1_000_000, (32, 64));
    let (start, end) = from_both_cpus(&g, &dns_from("198.51.100.7"), 1.0);
    let per_cpu: Vec<u64> =
        g.gate.class_counters_percpu(cls).unwrap().iter().map(|c| c[SLUICE_CS_KNOWN_PKTS as usize]).collect();
    let over = counter(&g, "dns", SLUICE_CS_KNOWN_OVER_PKTS);
    let within: u64 = per_cpu.iter().sum();
    let tolerance = (SLUICE_KNOWN_BURST_MS as u64 * 1_000_000).max(SLUICE_KNOWN_BURST_PKTS as u64 * interval);
    let most = (end - start + tolerance + 10_000_000) / interval + 1;
    eprintln!("within its rate per CPU {per_cpu:?}, {over} over, in {} ms; at most {most}", (end - start) / 1_000_000);
    assert!(per_cpu[0] > 0 && per_cpu[1] > 0, "both CPUs saw the client within its rate: {per_cpu:?}");
    assert!(over > 4 * most, "the client must send far over its rate to test it: {over} over, rate {most}");
    assert!(within <= most, "{within} within its own rate in {} ns from two CPUs, at most {most}", end - start);
}
