//! Fuzz test: a million random and mutated packets through BPF_PROG_TEST_RUN.
//! Every one gets a verdict, and the counters balance exactly: each packet is
//! in exactly one verdict counter, and PASS/DROP totals match the counters.
mod common;

use common::TestGate;
use rand::{Rng, SeedableRng};
use sluice::gate::{Prog, XDP_DROP, XDP_PASS};
use sluice::packet::{non_ip, v6, Ext, Frame, ETH_P_8021Q, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6};

const PACKETS: u64 = 1_000_000;

fn templates() -> Vec<Vec<u8>> {
    vec![
        Frame::udp("10.0.0.1", "10.0.0.2", 1, 53).build(),
        Frame::udp("10.1.2.3", "10.0.0.2", 1, 5001).vlan(3).options(12).build(),
        Frame::tcp("10.0.0.1", "10.0.0.2", 1, 80).vlan(1).vlan(2).build(),
        Frame::icmp("10.0.0.1", "10.0.0.2").fragment(0, true).build(),
        Frame::udp("10.0.0.1", "10.0.0.2", 1, 7000).fragment(64, false).build(),
        Frame::udp(&v6(1), &v6(2), 1, 53).ext(Ext::HopByHop).ext(Ext::Auth).build(),
        Frame::tcp("2001:db8:1::1", &v6(2), 1, 6000).ext(Ext::Fragment { offset: 0, more: true }).build(),
        Frame::icmp(&v6(1), &v6(2)).ext(Ext::Routing).build(),
        non_ip(ETH_P_ARP),
    ]
}

fn mutate(rng: &mut impl Rng, mut p: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..6) {
            0 => {
                let i = rng.gen_range(0..p.len());
                p[i] = rng.gen();
            }
            1 => {
                let n = rng.gen_range(14..=p.len());
                p.truncate(n);
            }
            2 => {
                // A header field that drives parsing: EtherType, IP version/ihl, next header, ext length.
                let i = *[12usize, 13, 14, 16, 18, 20, 23, 54, 55].iter().nth(rng.gen_range(0..9)).unwrap();
                if i < p.len() {
                    p[i] = rng.gen();
                }
            }
            3 => {
                let t = [ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q, 0x88a8][rng.gen_range(0..4)];
                p[12..14].copy_from_slice(&t.to_be_bytes());
            }
            4 => p.extend((0..rng.gen_range(0..64)).map(|_| rng.gen::<u8>())),
            _ => {
                let i = rng.gen_range(14..p.len().max(15)).min(p.len() - 1);
                p[i] ^= 1 << rng.gen_range(0..8);
            }
        }
    }
    p
}

#[test]
fn a_million_packets_all_get_a_verdict_and_counters_balance() {
    let g = TestGate::new(&[
        "dns:match=udp:53",
        "web:rate=50k,burst=100,match=tcp:80-443",
        "trusted:match=udp:5000-5999@10.1.0.0/16",
        "blocked:rate=blocked,match=tcp:6000,match=icmp",
        "slow:rate=1k,burst=10,match=udp",
    ]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x51u64);
    let templates = templates();
    let (mut pass, mut drop) = (0u64, 0u64);
    for i in 0..PACKETS {
        let p = if i % 4 == 0 {
            let n = rng.gen_range(14..300);
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let t = templates[rng.gen_range(0..templates.len())].clone();
            mutate(&mut rng, t)
        };
        let (verdict, _) = g.gate.test_run(Prog::Gate, &p, 1).unwrap_or_else(|e| panic!("packet {i} ({p:02x?}): {e}"));
        match verdict {
            XDP_PASS => pass += 1,
            XDP_DROP => drop += 1,
            v => panic!("packet {i} got verdict {v}, the gate only returns PASS or DROP: {p:02x?}"),
        }
    }
    let c = g.counters();
    let admitted: u64 = c.classes.iter().map(|t| t.admitted_pkts).sum();
    let dropped: u64 = c.classes.iter().map(|t| t.dropped_pkts()).sum();
    let seen: u64 = c.classes.iter().map(|t| t.seen_pkts).sum();
    assert_eq!(seen, admitted + dropped, "every classified packet has one class verdict");
    assert_eq!(pass, admitted + c.global.non_ip_pass + c.global.malformed_pass, "PASS verdicts = PASS counters");
    assert_eq!(drop, dropped + c.global.malformed_drop, "DROP verdicts = DROP counters");
    assert_eq!(pass + drop, PACKETS);
    // Every path was exercised.
    for (i, t) in c.classes.iter().enumerate() {
        assert!(t.seen_pkts > 0, "class {} saw no packet", g.cfg.classes[i].name);
    }
    assert!(c.classes[g.class("blocked")].dropped_blocked_pkts > 0);
    assert!(c.classes[g.class("slow")].dropped_rate_pkts > 0);
    assert!(c.global.non_ip_pass > 0 && c.global.malformed_drop > 0);
    assert!(c.global.depth_exceeded > 0 && c.global.fragments > 0);
    assert_eq!(c.global.malformed_pass, 0, "malformed = drop");
    eprintln!("{PACKETS} packets: {pass} passed, {drop} dropped; {c:?}");
}
