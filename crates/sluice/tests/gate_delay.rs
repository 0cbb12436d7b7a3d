//! How long a service takes to answer (bpf/gate/delay.h), by
//! BPF_PROG_TEST_RUN: the gate stamps a request it admits, the egress
//! learner times the service's answer to the same flow into the class's
//! delay buckets. The gate offers one admitted packet in SLUICE_DELAY_EVERY
//! of a class on a CPU for a stamp, so a request here is run that many
//! times in one call (one CPU): one of them is offered. Needs root (CI is root).
mod common;

use std::time::Duration;

use common::tcp::{Segment, ACK};
use common::TestGate;
use sluice::bpf_intf::*;
use sluice::dataplane::gate::{Prog, Tiers};
use sluice::policy::config::Limit;
use sluice_testkit::packet::Frame;

const PSH: u8 = 0x08;

fn gate() -> TestGate {
    TestGate::new(&["web:match=tcp:8080", "dns:match=udp:53", "shut:rate=blocked,match=udp:54"])
}

/// A TCP segment with `data` bytes, client to service (`request`) or back.
fn segment(client: &str, data: usize, request: bool) -> Vec<u8> {
    let server = if client.contains(':') { "2001:db8::2" } else { "10.0.0.2" };
    let mut s = if request {
        Segment::new(client, server, 40000, 8080, ACK | PSH)
    } else {
        Segment::new(server, client, 8080, 40000, ACK | PSH)
    };
    s.payload = vec![0x61; data];
    s.build()
}

fn delays(g: &TestGate, class: &str) -> (u64, u64, Vec<u64>) {
    let c = g.gate.class_counters(g.class(class)).unwrap();
    let buckets = (SLUICE_CS_DELAY_BUCKET0..=SLUICE_CS_DELAY_LAST).map(|i| c[i as usize]).collect();
    (c[SLUICE_CS_DELAY_SAMPLES as usize], c[SLUICE_CS_DELAY_NS as usize], buckets)
}

/// Run a request through the gate SLUICE_DELAY_EVERY times in one call: its verdict.
fn request(g: &TestGate, frame: &[u8]) -> u32 {
    g.gate.test_run(Prog::Gate, frame, SLUICE_DELAY_EVERY).unwrap().0
}

fn answer(g: &TestGate, frame: &[u8]) {
    assert_eq!(g.gate.test_run(Prog::Learn, frame, 1).unwrap().0, 0, "TC_ACT_OK: the learner never drops");
}

#[test]
fn a_requests_answer_is_timed_once_into_its_classs_buckets() {
    let g = gate();
    assert_eq!(request(&g, &segment("198.51.100.1", 40, true)), 2, "XDP_PASS: admitted");
    std::thread::sleep(Duration::from_millis(50));
    answer(&g, &segment("198.51.100.1", 200, false));
    let (n, ns, buckets) = delays(&g, "web");
    assert_eq!(n, 1, "one answer timed");
    assert!((3_000_000..1_000_000_000).contains(&ns), "at least the 3 ms slept: {ns} ns");
    // Bucket i holds delays under 2^(SHIFT0 + i) ns, and from 2^(SHIFT0 + i - 1).
    let b = buckets.iter().position(|&x| x == 1).expect("one bucket holds it");
    assert_eq!(buckets.iter().sum::<u64>(), 1);
    assert!(
        ns < 1 << (SLUICE_DELAY_SHIFT0 + b as u32) && ns >= 1 << (SLUICE_DELAY_SHIFT0 + b as u32 - 1),
        "{ns} in bucket {b}"
    );
    // The slot is spent: a second answer with no new request is not timed.
    answer(&g, &segment("198.51.100.1", 200, false));
    assert_eq!(delays(&g, "web").0, 1);
}

/// An answer to a known client is counted in the class's buckets and in
/// its known clients' (what the late-answers judge reads: a flood's own
/// answers can hide what they wait); an answer to anyone else only in the
/// first.
#[test]
fn a_known_clients_answer_is_also_counted_as_a_known_clients() {
    let mut g = gate();
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[198, 51, 100, 7]);
    let key = sluice_src_key { class_id: g.class("web") as u8, family: 4, plen: 32, addr, ..Default::default() };
    let last_ms = sluice::base::clock::wall_ms();
    let entry = sluice_known { first_ms: last_ms - 10_000, last_ms, answers: 10, ..Default::default() };
    g.gate.insert_known(&[(key, entry)]).unwrap();
    g.gate.set_clock(&sluice::dataplane::gate::Clock { epoch: 1, now_ms: last_ms, known_ttl_ms: 3_600_000 });
    let known = |g: &TestGate| {
        let c = g.gate.class_counters(g.class("web")).unwrap();
        let buckets: u64 = (SLUICE_CS_DELAY_KNOWN_BUCKET0..=SLUICE_CS_DELAY_KNOWN_LAST).map(|i| c[i as usize]).sum();
        (c[SLUICE_CS_DELAY_KNOWN_SAMPLES as usize], c[SLUICE_CS_DELAY_KNOWN_NS as usize] > 0, buckets)
    };
    for client in ["198.51.100.1", "198.51.100.7"] {
        request(&g, &segment(client, 40, true));
        answer(&g, &segment(client, 200, false));
    }
    assert_eq!(delays(&g, "web").0, 2, "both timed");
    assert_eq!(known(&g), (1, true, 1), "the known client's answer alone, in one bucket");
}

/// An answer more than SLUICE_DELAY_STALE_NS after its stamp is not
/// counted: the stamped request may be one the service never answered.
#[test]
fn an_answer_long_after_its_stamp_is_not_counted() {
    let g = gate();
    request(&g, &Frame::udp("198.51.100.9", "10.0.0.2", 4000, 53).build());
    std::thread::sleep(Duration::from_nanos(u64::from(SLUICE_DELAY_STALE_NS)) + Duration::from_millis(20));
    answer(&g, &Frame::udp("10.0.0.2", "198.51.100.9", 53, 4000).build());
    assert_eq!(delays(&g, "dns").0, 0, "not counted");
    // The slot is free again: the next request and its answer are timed.
    request(&g, &Frame::udp("198.51.100.9", "10.0.0.2", 4000, 53).build());
    answer(&g, &Frame::udp("10.0.0.2", "198.51.100.9", 53, 4000).build());
    assert_eq!(delays(&g, "dns").0, 1);
}

#[test]
fn a_flows_first_waiting_request_is_the_one_timed() {
    let g = gate();
    request(&g, &segment("2001:db8::1", 40, true));
    std::thread::sleep(Duration::from_millis(5));
    // The client's next requests (pipelined) do not move the stamp.
    request(&g, &segment("2001:db8::1", 40, true));
    answer(&g, &segment("2001:db8::1", 200, false));
    let (n, ns, _) = delays(&g, "web");
    assert_eq!(n, 1);
    assert!(ns >= 5_000_000, "timed from the first request: {ns} ns");
}

/// One admitted packet of a class in SLUICE_DELAY_EVERY on a CPU is
/// offered a stamp (each one while the daemon asks): distinct flows' requests run one at a time, each
/// answered, on one CPU (the test thread pinned: each CPU counts its own).
#[test]
fn one_admitted_packet_in_delay_every_is_offered_a_stamp_or_each_while_slow() {
    sluice::base::netns::pin_thread(0).unwrap();
    let g = gate();
    for i in 0..2 * SLUICE_DELAY_EVERY {
        let client = format!("198.51.100.{}", 10 + i);
        g.run(&segment(&client, 40, true));
        answer(&g, &segment(&client, 200, false));
    }
    assert_eq!(delays(&g, "web").0, 2, "two of {} requests timed", 2 * SLUICE_DELAY_EVERY);
    // While the daemon says the class's answers are slow, every request is
    // offered one (`Tiers::time_all`, written the way the tick writes it).
    let tiers = sluice::dataplane::gate::Tiers { time_all: true, ..Tiers::plain(Limit::Unlimited) };
    g.gate.rebalance(g.class("web"), &tiers, &mut Default::default()).unwrap();
    for i in 0..SLUICE_DELAY_EVERY {
        let client = format!("198.51.101.{}", 10 + i);
        g.run(&segment(&client, 40, true));
        answer(&g, &segment(&client, 200, false));
    }
    assert_eq!(delays(&g, "web").0, 2 + u64::from(SLUICE_DELAY_EVERY), "each of {SLUICE_DELAY_EVERY} more timed");
    // And back to one in SLUICE_DELAY_EVERY.
    g.gate.rebalance(g.class("web"), &Tiers::plain(Limit::Unlimited), &mut Default::default()).unwrap();
    for i in 0..SLUICE_DELAY_EVERY {
        let client = format!("198.51.102.{}", 10 + i);
        g.run(&segment(&client, 40, true));
        answer(&g, &segment(&client, 200, false));
    }
    assert_eq!(delays(&g, "web").0, 3 + u64::from(SLUICE_DELAY_EVERY));
}

/// While the daemon ticks slowly, SLUICE_SLOW_WAKE_ANSWERS answers timed
/// over the class's slow mark on a CPU wake it (struct sluice_share's
/// slow_wake_us); answers under the mark, or with no mark armed, do not.
#[test]
fn slow_answers_wake_a_calm_daemon() {
    sluice::base::netns::pin_thread(0).unwrap();
    let g = gate();
    let web = g.class("web");
    let woke = std::sync::Arc::new(sluice::dataplane::gate::Woken::default());
    let ring = g.gate.wake_ring(woke.clone()).unwrap();
    let at = vec![u64::MAX; g.gate.ncpus()];
    // `n` requests of distinct flows, each answered `wait` later.
    let ask = |from: u32, n: u32, wait: Duration| {
        for i in from..from + n {
            let client = format!("198.51.100.{i}");
            request(&g, &segment(&client, 40, true));
            std::thread::sleep(wait);
            answer(&g, &segment(&client, 200, false));
        }
    };
    let polled = |ring: &libbpf_rs::RingBuffer| {
        ring.poll(Duration::from_millis(5)).unwrap();
        woke.count()
    };
    // Armed at 40 ms: answers 0.1 ms after their request never wake it
    // (a test run of the learner may wait out an RCU grace period first:
    // the mark leaves room for it).
    g.gate.arm_wake(web, &at, 0, 40_000).unwrap();
    ask(10, 2 * SLUICE_SLOW_WAKE_ANSWERS, Duration::from_micros(100));
    assert_eq!(polled(&ring), 0, "answers in time");
    // Armed again (the count starts at 0): on a loaded host one of the
    // answers above may have been timed over 40 ms (CI saw one), and
    // counted, it made the next step's seventh slow answer the eighth.
    g.gate.arm_wake(web, &at, 0, 40_000).unwrap();
    // Slow ones: the SLUICE_SLOW_WAKE_ANSWERS-th wakes it, once.
    ask(40, SLUICE_SLOW_WAKE_ANSWERS - 1, Duration::from_millis(50));
    assert_eq!(polled(&ring), 0, "one short of the count");
    ask(60, 1, Duration::from_millis(50));
    assert_eq!(polled(&ring), 1, "the count reached");
    ask(70, 2, Duration::from_millis(50));
    assert_eq!(polled(&ring), 1, "once per arming");
    // No slow mark (a class not judged on its answers): never.
    g.gate.arm_wake(web, &at, 0, 0).unwrap();
    ask(100, SLUICE_SLOW_WAKE_ANSWERS, Duration::from_millis(50));
    assert_eq!(polled(&ring), 1);
}

#[test]
fn segments_without_data_other_flows_drops_and_the_default_class_are_not_timed() {
    let g = gate();
    // A bare ACK in is no request, and a bare ACK out no answer.
    request(&g, &segment("198.51.100.2", 0, true));
    answer(&g, &segment("198.51.100.2", 200, false));
    request(&g, &segment("198.51.100.3", 40, true));
    answer(&g, &segment("198.51.100.3", 0, false));
    // An answer to another client, or from another port, does not match.
    answer(&g, &segment("198.51.100.4", 200, false));
    assert_eq!(delays(&g, "web").0, 0, "nothing timed yet");
    answer(&g, &segment("198.51.100.3", 200, false));
    assert_eq!(delays(&g, "web").0, 1, "the request with data, answered with data");
    // A request the gate drops never reaches the service: not stamped.
    assert_eq!(request(&g, &Frame::udp("198.51.100.5", "10.0.0.2", 4000, 54).build()), 1, "XDP_DROP: blocked");
    answer(&g, &Frame::udp("10.0.0.2", "198.51.100.5", 54, 4000).build());
    assert_eq!(delays(&g, "shut").0, 0);
    // UDP: a datagram is a request, the reply an answer.
    request(&g, &Frame::udp("198.51.100.6", "10.0.0.2", 4000, 53).build());
    answer(&g, &Frame::udp("10.0.0.2", "198.51.100.6", 53, 4000).build());
    assert_eq!(delays(&g, "dns").0, 1);
    // The default class's "requests" are replies to the host's own connections.
    request(&g, &Frame::udp("198.51.100.7", "10.0.0.2", 443, 5555).build());
    answer(&g, &Frame::udp("10.0.0.2", "198.51.100.7", 5555, 443).build());
    assert_eq!(delays(&g, "default").0, 0);
}
