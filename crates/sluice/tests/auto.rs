//! `rate = "auto"` in the daemon, on a testbed each test creates (and always
//! removes): the service is found by its socket, a flood is limited by the
//! controller, and lost signals are held, then fall back. Needs root.
mod common;

use common::testbed::Testbed;
use std::time::{Duration, Instant};

/// No socket on the class's port: `sluice run` refuses to start, names the
/// class and the port, and leaves no program attached.
#[test]
fn auto_without_a_service_socket_names_the_class() {
    let tb = Testbed::new();
    let sock = tb.socket();
    let out = tb.sluice(
        &tb.b,
        &[
            "run",
            "--iface",
            tb.if_b,
            "--socket",
            sock.to_str().unwrap(),
            "--metrics",
            "off",
            "--class",
            "api:rate=auto,match=udp:7000",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without a service socket: {err}");
    assert!(err.contains("\"api\"") && err.contains("7000") && err.contains("no UDP socket"), "{err}");
    assert_eq!(tb.attached_prog(), 0, "a failed start must leave no XDP program");
}

/// A service on udp:7000 for 8 s that spends 20 us per datagram: it takes
/// about 50k/s, far below a flood. (6 s ended before the status read of a
/// test whose daemon took over 1.7 s to start, in a fresh-clone CI run on
/// a loaded machine.)
fn slow_service(tb: &mut Testbed) -> u32 {
    let b = tb.b.clone();
    tb.spawn_load(
        &b,
        &["serve", "udp-echo", "--port", "7000", "--no-echo", "--work-ns", "20000", "--duration", "8", "--json"],
    )
}

/// The controller limits a flood to what the service takes, status shows its
/// view, and when the service goes away the rate is held, then falls back.
#[test]
fn auto_limits_a_flood_then_holds_and_falls_back_when_the_service_goes() {
    let mut tb = Testbed::new();
    let sink = slow_service(&mut tb);
    std::thread::sleep(Duration::from_millis(300));
    let cfg = tb.write(
        "auto.toml",
        "[auto]\nhold = 3.0\n\n[[class]]\nname = \"api\"\nrate = \"auto\"\nfallback = 5000\nmatch = [{ proto = \"udp\", port = 7000 }]\n",
    );
    tb.start_gate(&["--config", cfg.to_str().unwrap()]);
    // A calm second first, as a daemon that runs always sees before a
    // flood: with none, only an unbroken 300 ms loss run engages the class,
    // and where the flood sender and the tests beside it starve the
    // service, its queue dips under half now and then and the class stayed
    // unlimited for the 3 s (fresh-clone CI, 2 runs in about 9: 597,832 of
    // 597,832 admitted). Engaging such a start on steady loss weighed
    // against what the service reads was tried and taken back (the bench's
    // calm cells dropped in both runs with it): a known limit, not tested.
    tb.send(7000, 5_000, 1.0);
    let (sent, secs) = tb.send(7000, 0, 3.0);
    let s = tb.status();
    let api = s.classes.iter().find(|c| c.name == "api").unwrap();
    let a = api.auto.clone().expect("an auto class has a controller view");
    eprintln!(
        "flood {:.0}/s; {:?}; totals {:?}; stale passes {} (printed, not asserted: a stalled daemon's gate passes all)",
        sent as f64 / secs,
        a,
        api.totals,
        s.global.stale_pass
    );
    assert_eq!((a.algo.as_str(), a.sockets), ("capacity", 1));
    assert!(a.capacity_pps > 0.0, "no capacity estimate: {a:?}");
    let rate = a.rate_pps.expect("a rate while the service is there");
    assert!(rate < 0.5 * sent as f64 / secs, "the rate {rate} does not limit a flood of {:.0}/s", sent as f64 / secs);
    // And not to nothing: at least 2% of what 20 us of work a datagram allows
    // (50k/s), so a machine 10x slower passes and a controller stuck near
    // zero (issue 23, item 14: 1/s passed) does not.
    assert!(rate >= 0.02 * 50_000.0, "the rate {rate} starves the service: {a:?}");
    assert!(
        api.totals.dropped_rate_pkts > 0 && api.totals.admitted_pkts < api.totals.seen_pkts / 2,
        "{:?}",
        api.totals
    );

    // The service exits (its --duration) while the flood goes on (a flood
    // that ended would have released the limit a second later): the rate
    // is held, then the fallback applies. The hold is 3 s: in a fresh-clone
    // CI run the wait for the service's exit returned 1.8 s after the
    // daemon saw its socket go (the other auto test ran beside it), and
    // with a hold of 1 s the first look found the fallback already.
    let (a_ns, dst) = (tb.a.clone(), format!("{}:7000", tb.ip_b));
    tb.spawn_load(&a_ns, &["send", "--dst", &dst, "--rate", "200000", "--duration", "10"]);
    tb.wait(sink);
    let gone = Instant::now();
    let auto_of = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "api").unwrap().auto.unwrap();
    let held = loop {
        // The served snapshot is refreshed every 100 ms.
        let now = auto_of(&tb);
        if now.state == "holding" || gone.elapsed() > Duration::from_millis(2500) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(held.state, "holding", "{held:?}");
    assert_eq!(held.sockets, 0);
    assert!(held.rate_pps.is_some(), "holding keeps a rate, not unlimited: {held:?}");
    let deadline = Instant::now() + Duration::from_secs(7);
    loop {
        let now = auto_of(&tb);
        if now.state == "fallback" {
            assert_eq!(now.rate_pps, Some(5000.0), "{now:?}");
            assert!(now.lost_secs >= 3.0, "fell back before the hold: {now:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no fallback after the hold time: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Do no harm (issue 21): a service that keeps up with its load, fed in
/// bursts of 100 datagrams (5k/s on average), is never limited: the gate
/// drops none of its packets. Before, the controller capped it near the
/// load it saw (1.05-2x) with a bucket 1/100 s of that deep, and dropped
/// part of each burst.
#[test]
fn a_healthy_auto_class_fed_bursts_drops_nothing() {
    let mut tb = Testbed::new();
    let sink = tb.start_sink_with(7000, 8.0, &["--rcvbuf", "4194304"]);
    tb.start_gate(&["--no-discover", "--class", "api:rate=auto,match=udp:7000"]);
    let dst = format!("{}:7000", tb.ip_b);
    let a = tb.a.clone();
    let out = tb
        .cmd(
            &a,
            &[common::testbed::load(), "send", "--dst", &dst, "--rate", "5000", "--burst", "100", "--duration", "4"],
        )
        .args(["--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "send failed: {}", String::from_utf8_lossy(&out.stderr));
    // A healthy class lets the daemon tick calmly, publishing its
    // statistics once a second: wait for them to count what was sent.
    let sent = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["sent"].as_u64().unwrap();
    let api = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "api").unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while api(&tb).totals.seen_pkts < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let api = api(&tb);
    let t = api.totals;
    eprintln!("sent {}; totals {t:?}; auto {:?}", String::from_utf8_lossy(&out.stdout).trim(), api.auto);
    assert!(t.seen_pkts >= 15_000, "the bursts did not reach the gate: {t:?}");
    assert_eq!(t.seen_pkts, t.admitted_pkts, "the gate dropped packets of a healthy service: {t:?}");
    assert_eq!(api.dropped_with_room_pkts, Some(0), "status counts no self-inflicted loss");
    assert_eq!(api.auto.and_then(|a| a.rate_pps), None, "a healthy service is left unlimited");
    tb.signal(sink, libc::SIGTERM);
}

/// Do no harm (issue 21): a local process whose socket never reads (a 2 KiB
/// buffer, filled over loopback: nothing of it crosses the gate) is in
/// distress for as long as it runs. Another auto class of the same priority
/// must not pay for it. Before, all auto classes shared one controller whose
/// socket drops were summed, and the healthy one was cut to 1000/s.
#[test]
fn one_services_full_socket_limits_no_other_auto_class() {
    let mut tb = Testbed::new();
    let b = tb.b.clone();
    let sink = tb.start_sink_with(7000, 8.0, &["--rcvbuf", "4194304"]);
    let hog = "import socket, time\n\
               s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
               s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)\n\
               s.bind(('0.0.0.0', 7001))\n\
               time.sleep(8)\n";
    tb.spawn_cmd(&b, &["python3", "-c", hog]);
    std::thread::sleep(Duration::from_millis(500));
    tb.start_gate(&[
        "--no-discover",
        "--class",
        "api:rate=auto,match=udp:7000",
        "--class",
        "hog:rate=auto,match=udp:7001",
    ]);
    let filler = tb.spawn_load(&b, &["send", "--dst", "127.0.0.1:7001", "--rate", "20000", "--duration", "5"]);
    std::thread::sleep(Duration::from_millis(500));
    let (sent, _) = tb.send(7000, 5000, 3.0);
    let snap = tb.status();
    let class = |n: &str| snap.classes.iter().find(|c| c.name == n).unwrap().clone();
    let (api, hog) = (class("api"), class("hog"));
    eprintln!("api sent {sent}: {:?} {:?}\nhog: {:?}", api.totals, api.auto, hog.auto);
    assert!(hog.auto.as_ref().is_some_and(|a| a.sockets == 1), "the hog's socket is its class's: {:?}", hog.auto);
    assert!(api.totals.seen_pkts >= sent * 9 / 10, "{:?}", api.totals);
    assert_eq!(
        api.totals.seen_pkts, api.totals.admitted_pkts,
        "the healthy class paid for the full socket: {:?}",
        api.totals
    );
    assert_eq!(api.dropped_with_room_pkts, Some(0));
    tb.wait(filler);
    tb.signal(sink, libc::SIGTERM);
}

/// A service with an idle IPv6 socket beside its flooded IPv4 one (NSD, and
/// most dual-stack daemons) is limited like one with a single socket. The
/// queue test read the sums of the two: a full IPv4 socket showed as half
/// of the two buffers, never "over half", so no loss run was seen, the
/// class stayed unlimited and admitted 9x what NSD took.
#[test]
fn a_flooded_socket_beside_an_idle_one_is_limited() {
    let mut tb = Testbed::new();
    let b = tb.b.clone();
    let sink = slow_service(&mut tb);
    let v6 = "import socket, time\n\
              s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
              s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n\
              s.bind(('::', 7000))\n\
              time.sleep(7)\n";
    tb.spawn_cmd(&b, &["python3", "-c", v6]);
    std::thread::sleep(Duration::from_millis(500));
    tb.start_gate(&["--no-discover", "--class", "api:rate=auto,match=udp:7000"]);
    // A calm second first, as in the test above (a flood from the daemon's
    // first tick engages only on an unbroken loss run: in one fresh-clone
    // CI run on a loaded machine the class stayed unlimited for the 3 s).
    tb.send(7000, 5_000, 1.0);
    let (sent, secs) = tb.send(7000, 0, 3.0);
    let flood = sent as f64 / secs;
    let s = tb.status();
    let api = s.classes.iter().find(|c| c.name == "api").unwrap();
    let a = api.auto.clone().expect("an auto class has a controller view");
    eprintln!("flood {flood:.0}/s; {a:?}; totals {:?}; with room {:?}", api.totals, api.dropped_with_room_pkts);
    assert_eq!(a.sockets, 2, "both sockets are the class's: {a:?}");
    let rate = a.rate_pps.expect("the flooded class is limited");
    assert!(rate < 0.5 * flood, "the rate {rate} does not limit a flood of {flood:.0}/s");
    assert!(api.totals.admitted_pkts < api.totals.seen_pkts / 2, "{:?}", api.totals);
    // The gate held the class at what the service takes: none of its drops
    // were with room (the limit's first ticks, which admit under it while
    // its buckets fill, are not a stretch with room).
    assert_eq!(api.dropped_with_room_pkts, Some(0), "SELF-INFLICTED misfired: {a:?}");
    tb.wait(sink);
}
