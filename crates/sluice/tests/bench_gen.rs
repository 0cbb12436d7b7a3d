//! The bench generator's rate accuracy, checked against the victim's XDP
//! counters. The `same-core` model gives the generator a CPU of its own, and
//! the victim's gate drops everything (its cheapest work). What arrived is
//! what the victim's XDP counted plus what the full veth ring refused (the
//! kernel's TX drop counter on the generator's end): both kernel counts,
//! independent of the generator's own.
use std::time::Duration;

use sluice::bench::gen::{stream_value, udp_stream, Generator};
use sluice::bench::testbed::{link_stats, Testbed, VictimModel, IF_A, IF_B};
use sluice::gate::Gate;
use sluice::{classify, config, netns};

#[test]
fn generator_rates_match_the_victims_xdp_counters_within_2_percent() {
    let tb = Testbed::create("gen", VictimModel::SameCore, 0, 1).unwrap();
    let b = tb.b.clone();
    let gate = netns::run_in(&b, || {
        let cfg = config::from_flags(&["default:rate=blocked".into()])?;
        let mut g = Gate::load()?;
        g.apply(&cfg, &classify::compile(&cfg)?)?;
        g.attach(IF_B, config::XdpMode::Native, false)?;
        Ok(g)
    })
    .unwrap();
    tb.apply_model().unwrap();
    let gen = Generator::load().unwrap();
    let gen = std::sync::Arc::new(std::sync::Mutex::new(gen));
    for rate in [10_000.0, 100_000.0, 500_000.0] {
        gate.reset_counters().unwrap();
        let before = link_stats(&tb.a, IF_A).unwrap();
        let s = udp_stream("flood", rate, 64, tb.ip_a, 4000, tb.ip_b, 9);
        let v = stream_value(&s, tb.mac_b, tb.mac_a).unwrap();
        let (a, ifx, g) = (tb.a.clone(), tb.ifindex_a, gen.clone());
        let (counts, secs) = netns::run_in(&a, move || {
            netns::pin_thread(0)?;
            let mut g = g.lock().unwrap();
            g.set_streams(&[v])?;
            g.run(ifx, Duration::from_secs(2))
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let seen = gate.class_counters(0).unwrap()[0] as f64;
        let ring = (link_stats(&tb.a, IF_A).unwrap().tx_dropped - before.tx_dropped) as f64;
        let err = (seen + ring) / (rate * secs) - 1.0;
        eprintln!(
            "asked {rate} pps for {secs:.3} s: sent {}, late {}, ring drops {ring}, victim XDP saw {seen} ({:+.2}%)",
            counts[0].sent,
            counts[0].late,
            err * 100.0
        );
        assert!(err.abs() <= 0.02, "at {rate} pps the victim saw {seen} (+{ring} ring drops) in {secs:.3} s: {:+.2}%", err * 100.0);
        // Every frame sent is either seen by the victim's XDP or refused by the
        // full veth ring (a few IPv6 control packets of the kernel's may add).
        assert!((seen + ring - counts[0].sent as f64).abs() <= 20.0, "sent {} vs seen {seen} + ring drops {ring}", counts[0].sent);
        assert!(ring <= 0.05 * seen, "the victim's XDP saw nearly everything: {ring} ring drops");
    }
    // IPv6, full-size frames, several flows and destination ports: all arrive.
    gate.reset_counters().unwrap();
    let before = link_stats(&tb.a, IF_A).unwrap();
    let mut s = udp_stream("v6", 50_000.0, 1514, tb.ip6_a, 30000, tb.ip6_b, 9000);
    s.flows = 16;
    s.dports = 4;
    let v = stream_value(&s, tb.mac_b, tb.mac_a).unwrap();
    let (a, ifx, g) = (tb.a.clone(), tb.ifindex_a, gen.clone());
    let (counts, secs) = netns::run_in(&a, move || {
        netns::pin_thread(0)?;
        let mut g = g.lock().unwrap();
        g.set_streams(&[v])?;
        g.run(ifx, Duration::from_secs(1))
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let c = gate.class_counters(0).unwrap();
    let ring = link_stats(&tb.a, IF_A).unwrap().tx_dropped - before.tx_dropped;
    eprintln!("IPv6 1514-byte frames at 50k for {secs:.3} s: sent {}, seen {} ({} bytes)", counts[0].sent, c[0], c[1]);
    assert!((c[0] + ring).abs_diff(counts[0].sent) <= 20);
    assert_eq!(c[1] / c[0].max(1), 1514, "full-size frames");
    assert_eq!(gate.global_counters().unwrap()[1], 0, "no frame was malformed");
    drop(gen);
}
