//! The bench generator's rate accuracy, checked against the victim's XDP
//! counters (see src/bench/gencheck.rs), and its IPv6 frames. One test at a
//! time: each makes a same-core testbed that owns both CPUs.
use std::time::Duration;

use sluice::dataplane::gate::Gate;
use sluice::{base::netns, dataplane::classify, policy::config};
use sluice_bench::load::gen::{stream_value, udp_stream, Generator};
use sluice_bench::testbed::victim::{link_stats, VictimBed, VictimModel, IF_A, IF_B};

static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn generator_rates_match_the_victims_xdp_counters_within_2_percent() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let rates = [10_000.0, 100_000.0, 500_000.0];
    let check = |rates: &[f64]| {
        sluice_bench::load::gencheck::check(rates, 2.0, sluice_bench::load::gen::DEFAULT_BATCH).unwrap()
    };
    let mut checks = check(&rates);
    // A host that stops the generator's CPU for a while (a VM's steal, a
    // hiccup) makes frames late at any rate: one fresh-clone CI run arrived
    // 8.33% short at the lowest rate (its other fields were not kept). A
    // lowest rate that misses is tried once more and judged on the second
    // try; a generator that cannot keep 10k/s misses both.
    let keeps_up = |c: &sluice_bench::load::gencheck::GenCheck| {
        c.error.abs() <= 0.02 && c.late as f64 <= 0.01 * c.sent as f64 && c.ring_drops as f64 <= 0.01 * c.sent as f64
    };
    if !keeps_up(&checks[0]) {
        eprintln!("the lowest rate missed, tried again (the host may have stalled the generator): {:?}", checks[0]);
        checks[0] = check(&rates[..1])[0];
    }
    for c in checks {
        eprintln!("{c:?}");
        // The generator keeps its schedule or says how far it fell behind:
        // frames sent plus frames it counted late are the asked rate.
        let scheduled = (c.sent + c.late) as f64 / (c.asked_pps * c.secs) - 1.0;
        assert!(
            scheduled.abs() <= 0.02,
            "at {} pps: sent + late {:+.2}% off the schedule",
            c.asked_pps,
            scheduled * 100.0
        );
        // What it says it sent arrived: seen by the victim's XDP or refused by
        // the full veth ring (a few IPv6 control packets of the kernel's may add).
        assert!((c.xdp_seen + c.ring_drops).abs_diff(c.sent) <= 20, "{c:?}");
        if c.asked_pps == rates[0] {
            // At the lowest rate any machine keeps up: nothing late, the
            // victim's XDP saw every frame, arrivals within 2% of asked.
            assert!(c.error.abs() <= 0.02, "at {} pps: {:+.2}%", c.asked_pps, c.error * 100.0);
            assert!(c.late as f64 <= 0.01 * c.sent as f64, "late at the lowest rate: {c:?}");
            assert!(c.ring_drops as f64 <= 0.01 * c.sent as f64, "the victim's XDP saw nearly everything: {c:?}");
        }
        // At higher rates `error`, `late` and `ring_drops` are the machine's
        // (how fast this VM's CPU 0 sends and its NAPI drains): printed above,
        // not asserted. CI saw 9% ring drops at 500k in a slow hour.
    }
}

#[test]
fn ipv6_full_size_frames_with_flows_arrive_intact() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let tb = VictimBed::create("gen6", VictimModel::SameCore).unwrap();
    let b = tb.net.b.clone();
    let gate = netns::run_in(&b, || {
        let cfg = config::from_flags(&["default:rate=blocked".into()])?;
        let mut g = Gate::load()?;
        g.apply(&cfg, &classify::compile(&cfg)?)?;
        g.attach(IF_B, config::XdpMode::Native, false)?;
        Ok(g)
    })
    .unwrap();
    tb.apply_model().unwrap();
    let gen = std::sync::Arc::new(std::sync::Mutex::new(Generator::load().unwrap()));
    // IPv6, full-size frames, several flows and destination ports: all arrive.
    gate.reset_counters().unwrap();
    let before = link_stats(&tb.net.a, IF_A).unwrap();
    let mut s = udp_stream("v6", 50_000.0, 1514, tb.net.ip6_a, 30000, tb.net.ip6_b, 9000);
    s.flows = 16;
    s.dports = 4;
    let v = stream_value(&s, tb.net.mac_b, tb.net.mac_a).unwrap();
    let (a, ifx, g) = (tb.net.a.clone(), tb.net.ifindex_a, gen.clone());
    let (counts, secs) = netns::run_in(&a, move || {
        netns::pin_thread(0)?;
        let mut g = g.lock().unwrap();
        g.set_streams(&[v])?;
        g.run(ifx, Duration::from_secs(1), sluice_bench::load::gen::DEFAULT_BATCH)
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let c = gate.class_counters(0).unwrap();
    let ring = link_stats(&tb.net.a, IF_A).unwrap().tx_dropped - before.tx_dropped;
    eprintln!("IPv6 1514-byte frames at 50k for {secs:.3} s: sent {}, seen {} ({} bytes)", counts[0].sent, c[0], c[1]);
    assert!((c[0] + ring).abs_diff(counts[0].sent) <= 20);
    // Full-size frames (the kernel's own few IPv6 control packets are smaller).
    assert!(c[1] as f64 / c[0].max(1) as f64 > 1510.0, "full-size frames: {} bytes in {} frames", c[1], c[0]);
    assert_eq!(gate.global_counters().unwrap()[1], 0, "no frame was malformed");
    drop(gen);
}
