//! Fuzz test: a million random and mutated packets through BPF_PROG_TEST_RUN.
//! Each packet is also classified here by `reference`, a parser written from
//! the verdict table (docs/config.md, gate.bpf.c's header comment) and not from the
//! BPF code: every packet's verdict must be the one the reference predicts,
//! and every counter must equal the reference's count of packets for it.
mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::TestGate;
use rand::{Rng, SeedableRng};
use sluice::bpf_intf::{SLUICE_SLOT_PORTLESS, SLUICE_SLOT_TCP, SLUICE_SLOT_UDP};
use sluice::dataplane::classify::{first_match, Probe};
use sluice::dataplane::gate::{Prog, XDP_DROP, XDP_PASS};
use sluice::policy::config::Limit;
use sluice_testkit::packet::{non_ip, v6, Ext, Frame, ETH_P_8021AD, ETH_P_8021Q, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6};

/// What the verdict table says becomes of a frame.
#[derive(Debug, Clone, Copy)]
enum Fate {
    NonIp,
    Malformed,
    /// Headers past the parse depth: malformed (counted as such too).
    Depth,
    Classified {
        probe: Probe,
        fragment: bool,
        /// The datagram a first (true) or non-first (false) fragment is of.
        datagram: Option<(Datagram, bool)>,
    },
}

/// A fragmented datagram as the gate keys it (family, sender, IP id, and
/// IPv4's protocol; docs/protection.md "Fragments"): its first fragment's
/// class is its other fragments' (when the gate saw the first).
type Datagram = (u8, IpAddr, u32, u8);

fn be16(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

/// The documented parse: Ethernet and up to 2 VLAN tags, IPv4 (options,
/// non-first fragments by protocol, or by their first fragment's class
/// where it was seen: the caller's `first_classes`) or IPv6 (up to 6
/// extension headers),
/// then enough of UDP (8 bytes), TCP (20), ICMP (8) or ICMPv6 (4) to be whole.
fn reference(p: &[u8]) -> Fate {
    if p.len() < 14 {
        return Fate::Malformed;
    }
    let (mut proto, mut at) = (be16(p, 12), 14);
    for _ in 0..2 {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        if at + 4 > p.len() {
            return Fate::Malformed;
        }
        proto = be16(p, at + 2);
        at += 4;
    }
    match proto {
        ETH_P_8021Q | ETH_P_8021AD => Fate::Depth,
        ETH_P_IP => reference_v4(p, at),
        ETH_P_IPV6 => reference_v6(p, at),
        _ => Fate::NonIp,
    }
}

fn reference_v4(p: &[u8], at: usize) -> Fate {
    if at + 20 > p.len() || p[at] >> 4 != 4 || p[at] & 0xf < 5 {
        return Fate::Malformed;
    }
    let hlen = (p[at] & 0xf) as usize * 4;
    if at + hlen > p.len() {
        return Fate::Malformed;
    }
    // The packet's own length (0: unset, the frame's): shorter than its header is malformed.
    let tot = be16(p, at + 2) as usize;
    if tot != 0 && tot < hlen {
        return Fate::Malformed;
    }
    let lim = if tot != 0 { at + tot } else { usize::MAX };
    let src = IpAddr::V4(Ipv4Addr::new(p[at + 12], p[at + 13], p[at + 14], p[at + 15]));
    let proto = p[at + 9];
    let (frag, id) = (be16(p, at + 6), be16(p, at + 4) as u32);
    let datagram = (4, src, id, proto);
    if frag & 0x1fff != 0 {
        return Fate::Classified {
            probe: Probe { slot: SLUICE_SLOT_PORTLESS, port: proto as u16, src },
            fragment: true,
            datagram: Some((datagram, false)),
        };
    }
    with_datagram(reference_l4(p, at + hlen, lim, proto, src), (frag & 0x2000 != 0).then_some(datagram))
}

/// A first fragment's fate carries its datagram.
fn with_datagram(fate: Fate, first_of: Option<Datagram>) -> Fate {
    match fate {
        Fate::Classified { probe, fragment, .. } => {
            Fate::Classified { probe, fragment, datagram: first_of.map(|d| (d, true)) }
        }
        other => other,
    }
}

fn reference_v6(p: &[u8], at: usize) -> Fate {
    if at + 40 > p.len() || p[at] >> 4 != 6 {
        return Fate::Malformed;
    }
    let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&p[at + 8..at + 24]).unwrap()));
    let plen = be16(p, at + 4) as usize;
    let lim = if plen != 0 { at + 40 + plen } else { usize::MAX };
    let (mut next, mut at) = (p[at + 6], at + 40);
    // The last fragment header's id and more-fragments flag (offset 0).
    let mut first_of: Option<Datagram> = None;
    for _ in 0..6 {
        match next {
            0 | 43 | 60 | 51 => {
                if at + 2 > p.len() {
                    return Fate::Malformed;
                }
                let len = if next == 51 { (p[at + 1] as usize + 2) * 4 } else { (p[at + 1] as usize + 1) * 8 };
                next = p[at];
                at += len;
            }
            44 => {
                if at + 8 > p.len() {
                    return Fate::Malformed;
                }
                next = p[at];
                let id = u32::from_be_bytes(<[u8; 4]>::try_from(&p[at + 4..at + 8]).unwrap());
                if be16(p, at + 2) & 0xfff8 != 0 {
                    let probe = Probe { slot: SLUICE_SLOT_PORTLESS, port: next as u16, src };
                    return Fate::Classified { probe, fragment: true, datagram: Some(((6, src, id, 0), false)) };
                }
                first_of = (be16(p, at + 2) & 1 != 0).then_some((6, src, id, 0));
                at += 8;
            }
            _ => return with_datagram(reference_l4(p, at, lim, next, src), first_of),
        }
    }
    match next {
        0 | 43 | 60 | 51 | 44 => Fate::Depth,
        _ => with_datagram(reference_l4(p, at, lim, next, src), first_of),
    }
}

/// The L4 header at `at` must end within the frame and within the IP
/// packet (`lim`, from its length field: past it is the frame's padding).
fn reference_l4(p: &[u8], at: usize, lim: usize, proto: u8, src: IpAddr) -> Fate {
    let need = match proto {
        17 => 8,
        6 => 20,
        1 => 8,
        58 => 4,
        _ => 0,
    };
    if at + need > p.len().min(lim) {
        return Fate::Malformed;
    }
    let probe = match proto {
        17 => Probe { slot: SLUICE_SLOT_UDP, port: be16(p, at + 2), src },
        6 => Probe { slot: SLUICE_SLOT_TCP, port: be16(p, at + 2), src },
        _ => Probe { slot: SLUICE_SLOT_PORTLESS, port: proto as u16, src },
    };
    Fate::Classified { probe, fragment: false, datagram: None }
}

/// The reference's counts, to compare with the gate's counters.
#[derive(Debug, Default)]
struct Expected {
    seen: Vec<u64>,
    non_ip: u64,
    malformed: u64,
    depth: u64,
    fragments: u64,
}

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
        // First fragments whose datagrams the non-first ones above and
        // below are of (same sender, id 1, and IPv4's protocol).
        Frame::udp("10.0.0.1", "10.0.0.2", 1, 53).fragment(0, true).build(),
        Frame::udp("2001:db8:1::1", &v6(2), 1, 9).ext(Ext::Fragment { offset: 20, more: false }).build(),
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
                let i = *[12usize, 13, 14, 16, 18, 20, 23, 54, 55].get(rng.gen_range(0..9)).unwrap();
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

/// Source fairness on for the limited classes (unknown sources paced, a
/// small per-source map of theirs) and learning on for every class but the
/// default, the gate clock set: the fuzz also walks the source, known and
/// asked paths (issue 23, item 14: it never turned them on).
fn fairness_and_learning_on(g: &mut TestGate) {
    use sluice::bpf_intf::sluice_fair;
    use sluice::dataplane::gate::Clock;
    for (id, class) in g.cfg.classes.iter().enumerate() {
        let limited = matches!(class.limit, Limit::Rate { .. });
        let f = sluice_fair {
            unknown: sluice::dataplane::share::share(500, 8),
            on: u32::from(limited),
            quota: 1,
            src_interval_ns: 1_000_000,
            plen4: 32,
            plen6: 64,
            learn: u8::from(id != g.cfg.default_class),
            ..Default::default()
        };
        g.gate.set_fairness(id, &vec![f; g.gate.ncpus()]).unwrap();
        g.gate.set_known_room(id, 64).unwrap();
    }
    g.gate.set_clock(&Clock { epoch: 1, now_ms: sluice::base::clock::wall_ms(), known_ttl_ms: 3_600_000 });
}

#[test]
fn a_million_packets_get_the_verdicts_and_counts_the_reference_predicts() {
    let mut g = TestGate::new(&[
        "dns:match=udp:53",
        "web:rate=50k,burst=100,match=tcp:80-443",
        "trusted:match=udp:5000-5999@10.1.0.0/16",
        "blocked:rate=blocked,match=tcp:6000,match=icmp",
        "slow:rate=1k,burst=10,match=udp",
    ]);
    fairness_and_learning_on(&mut g);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x51u64);
    let templates = templates();
    let mut want = Expected { seen: vec![0; g.cfg.classes.len()], ..Default::default() };
    let (mut pass, mut drop) = (0u64, 0u64);
    // The class each datagram's first fragment took (the gate's `frags` map).
    let mut first_classes: std::collections::HashMap<Datagram, usize> = Default::default();
    // Non-first fragments the reference put in another class than their protocol's.
    let mut followed = 0u64;
    for i in 0..PACKETS {
        let p = if i % 4 == 0 {
            let n = rng.gen_range(14..300);
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let t = templates[rng.gen_range(0..templates.len())].clone();
            mutate(&mut rng, t)
        };
        let (verdict, _) = g.gate.test_run(Prog::Gate, &p, 1).unwrap_or_else(|e| panic!("packet {i} ({p:02x?}): {e}"));
        if i % 8 == 0 {
            // The same frame leaving: the egress learner passes everything.
            let (tc, _) = g.gate.test_run(Prog::Learn, &p, 1).unwrap_or_else(|e| panic!("learner, packet {i}: {e}"));
            assert_eq!(tc, 0, "the learner returned {tc}, not TC_ACT_OK, for packet {i}: {p:02x?}");
        }
        let fate = reference(&p);
        let class = match fate {
            Fate::NonIp => None,
            Fate::Malformed => None,
            Fate::Depth => None,
            Fate::Classified { probe, datagram, .. } => {
                let by_probe = first_match(&g.cfg, &probe);
                Some(match datagram {
                    Some((d, true)) => *first_classes.entry(d).insert_entry(by_probe).get(),
                    Some((d, false)) => match first_classes.get(&d) {
                        Some(&c) => {
                            followed += u64::from(c != by_probe);
                            c
                        }
                        None => by_probe,
                    },
                    None => by_probe,
                })
            }
        };
        match fate {
            Fate::NonIp => want.non_ip += 1,
            Fate::Malformed => want.malformed += 1,
            Fate::Depth => (want.depth, want.malformed) = (want.depth + 1, want.malformed + 1),
            Fate::Classified { fragment, .. } => want.fragments += fragment as u64,
        }
        let expected_verdict = match (fate, class.map(|c| g.cfg.classes[c].limit)) {
            (Fate::NonIp, _) => Some(XDP_PASS),
            (Fate::Malformed | Fate::Depth, _) => Some(XDP_DROP),
            (_, Some(Limit::Blocked)) => Some(XDP_DROP),
            (_, Some(Limit::Rate { .. })) => None, // admitted or dropped, by the bucket
            _ => Some(XDP_PASS),
        };
        if let Some(c) = class {
            want.seen[c] += 1;
        }
        if let Some(v) = expected_verdict {
            assert_eq!(verdict, v, "packet {i}: {fate:?} in class {class:?}: {p:02x?}");
        }
        match verdict {
            XDP_PASS => pass += 1,
            XDP_DROP => drop += 1,
            v => panic!("packet {i} got verdict {v}, the gate only returns PASS or DROP: {p:02x?}"),
        }
    }
    let c = g.counters();
    for (id, t) in c.classes.iter().enumerate() {
        let name = &g.cfg.classes[id].name;
        assert_eq!(t.seen_pkts, want.seen[id], "class {name}: seen by the gate vs the reference");
        assert_eq!(t.seen_pkts, t.admitted_pkts + t.dropped_pkts(), "class {name}: one verdict per packet");
        match g.cfg.classes[id].limit {
            Limit::Blocked => assert_eq!(t.dropped_blocked_pkts, t.seen_pkts, "class {name}: all dropped"),
            Limit::Rate { .. } => assert_eq!(t.dropped_blocked_pkts, 0, "class {name}"),
            _ => assert_eq!(t.admitted_pkts, t.seen_pkts, "class {name}: all admitted"),
        }
    }
    assert_eq!(c.global.non_ip_pass, want.non_ip, "non-IP");
    assert_eq!(c.global.malformed_drop, want.malformed, "malformed");
    assert_eq!(c.global.depth_exceeded, want.depth, "past the parse depth");
    assert_eq!(c.global.fragments, want.fragments, "non-first fragments");
    let admitted: u64 = c.classes.iter().map(|t| t.admitted_pkts).sum();
    let dropped: u64 = c.classes.iter().map(|t| t.dropped_pkts()).sum();
    assert_eq!(pass, admitted + c.global.non_ip_pass + c.global.malformed_pass, "PASS verdicts = PASS counters");
    assert_eq!(drop, dropped + c.global.malformed_drop + c.global.non_ip_drop, "DROP verdicts = DROP counters");
    assert_eq!(c.global.non_ip_drop, 0, "the default class is unlimited: non-IP frames pass");
    // Every path was exercised.
    for (i, t) in c.classes.iter().enumerate() {
        assert!(t.seen_pkts > 0, "class {} saw no packet", g.cfg.classes[i].name);
    }
    assert!(c.classes[g.class("blocked")].dropped_blocked_pkts > 0);
    assert!(c.classes[g.class("slow")].dropped_rate_pkts > 0);
    assert!(c.global.non_ip_pass > 0 && c.global.malformed_drop > 0);
    assert!(c.global.depth_exceeded > 0 && c.global.fragments > 0);
    assert!(followed > 0, "the fuzz sent non-first fragments that follow their first fragment's class");
    let inserts: u64 = c.classes.iter().map(|t| t.source_inserts).sum();
    assert!(inserts > 0, "the fuzz walked the per-source path");
    assert_eq!(c.global.malformed_pass, 0, "malformed = drop");
    eprintln!("{PACKETS} packets: {pass} passed, {drop} dropped, {followed} fragments in their first's class; {c:?}");
}
