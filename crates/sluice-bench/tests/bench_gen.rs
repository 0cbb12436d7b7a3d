//! The bench generator's rate accuracy, checked against the victim's XDP
//! counters (see src/bench/gencheck.rs), and its IPv6 frames. One test at a
//! time: each makes a same-core testbed that owns both CPUs.
use std::time::Duration;

use sluice::base::netns;
use sluice_bench::load::gen::{stream_value, udp_stream, Generator};
use sluice_bench::load::gencheck::counting_gate;
use sluice_bench::testbed::cpu_plan;
use sluice_bench::testbed::victim::{link_stats, queue_xdp_packets, VictimBed, VictimModel, IF_A, IF_B};

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
    let gate = counting_gate(&tb).unwrap();
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

/// The bench's CPU plan gives each veth end a queue per CPU, and a sender
/// enters on its own CPU's queue, as RSS gives each flow a queue: the
/// generator's live frames (the kernel's cpu % queues) and a client's
/// socket (XPS) on two CPUs land on two queues, so the client does not
/// share the flood's ring or its NAPI. Checked by hand: without the XPS
/// setting the client's datagrams went to queue 0 with the flood in 3 of 3
/// runs, and the test failed.
#[test]
fn each_sender_enters_on_its_own_cpus_queue() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let plan = cpu_plan::here();
    let (flood_cpu, client_cpu) = (plan.generator(), plan.service);
    let tb = VictimBed::create("queues", VictimModel::Nic).unwrap();
    assert_eq!(tb.queues, cpu_plan::queues());
    let gate = counting_gate(&tb).unwrap();
    tb.apply_model().unwrap();
    let before = queue_xdp_packets(&tb.net.b, IF_B).unwrap();
    assert_eq!(before.len(), tb.queues as usize, "ethtool shows every queue");
    let ring_before = link_stats(&tb.net.a, IF_A).unwrap().tx_dropped;
    // The flood: live frames from the generator CPU for a second.
    let s = udp_stream("flood", 200_000.0, 64, tb.net.ip_a, 20000, tb.net.ip_b, 9);
    let v = stream_value(&s, tb.net.mac_b, tb.net.mac_a).unwrap();
    let (a, ifx) = (tb.net.a.clone(), tb.net.ifindex_a);
    let flood = std::thread::spawn(move || {
        netns::run_in(&a, move || {
            netns::pin_thread(flood_cpu)?;
            let mut g = Generator::load()?;
            g.set_streams(&[v])?;
            g.run(ifx, Duration::from_secs(1), sluice_bench::load::gen::DEFAULT_BATCH)
        })
    });
    // The client: datagrams from a socket on the other CPU, during the flood.
    const SENT: u64 = 2000;
    let (a, dst) = (tb.net.a.clone(), std::net::SocketAddr::new(tb.net.ip_b, 9));
    netns::run_in(&a, move || {
        netns::pin_thread(client_cpu)?;
        std::thread::sleep(Duration::from_millis(200));
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..SENT {
            sock.send_to(&[0u8; 32], dst)?;
        }
        Ok(())
    })
    .unwrap();
    let (counts, _) = flood.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let after = queue_xdp_packets(&tb.net.b, IF_B).unwrap();
    let ring = link_stats(&tb.net.a, IF_A).unwrap().tx_dropped - ring_before;
    let got: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("queues {got:?}: flood sent {} on CPU {flood_cpu} ({ring} refused by full rings), client {SENT} on CPU {client_cpu}", counts[0].sent);
    // The client's queue saw its datagrams and none of the flood's frames
    // (a few of the kernel's own IPv6 control packets may add).
    let client_q = got[client_cpu % got.len()];
    assert!((SENT..=SENT + 20).contains(&client_q), "the client's queue {client_cpu}: {got:?}");
    // The flood's queue saw its frames (less those a full ring refused).
    let flood_q = got[flood_cpu % got.len()];
    assert!(
        flood_q + ring + 20 >= counts[0].sent && flood_q <= counts[0].sent + 20,
        "the flood's queue {flood_cpu}: {got:?}"
    );
    drop(gate);
}
