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

/// The controller limits a flood to what the service takes, status shows its
/// view, and when the service goes away the rate is held, then falls back.
#[test]
fn auto_limits_a_flood_then_holds_and_falls_back_when_the_service_goes() {
    let mut tb = Testbed::new();
    // 20 us per datagram: the service takes about 50k/s, far below the flood.
    let b = tb.b.clone();
    let sink = tb.spawn(
        &b,
        &["serve", "udp-echo", "--port", "7000", "--no-echo", "--work-ns", "20000", "--duration", "6", "--json"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let cfg = tb.write(
        "auto.toml",
        "[auto]\nhold = 1.0\n\n[[class]]\nname = \"api\"\nrate = \"auto\"\nfallback = 5000\nmatch = [{ proto = \"udp\", port = 7000 }]\n",
    );
    tb.start_gate(&["--config", cfg.to_str().unwrap()]);
    let (sent, secs) = tb.send(7000, 0, 3.0);
    let s = tb.status();
    let api = s.classes.iter().find(|c| c.name == "api").unwrap();
    let a = api.auto.clone().expect("an auto class has a controller view");
    eprintln!("flood {:.0}/s; {:?}; totals {:?}", sent as f64 / secs, a, api.totals);
    assert_eq!((a.algo.as_str(), a.sockets), ("knee", 1));
    assert!(a.capacity_pps > 0.0, "no capacity estimate: {a:?}");
    let rate = a.rate_pps.expect("a rate while the service is there");
    assert!(rate < 0.5 * sent as f64 / secs, "the rate {rate} does not limit a flood of {:.0}/s", sent as f64 / secs);
    assert!(
        api.totals.dropped_rate_pkts > 0 && api.totals.admitted_pkts < api.totals.seen_pkts / 2,
        "{:?}",
        api.totals
    );

    // The service exits (its --duration): the rate is held, then the fallback applies.
    tb.wait(sink);
    let gone = Instant::now();
    let auto_of = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "api").unwrap().auto.unwrap();
    let held = loop {
        // The served snapshot is refreshed every 100 ms.
        let now = auto_of(&tb);
        if now.state == "holding" || gone.elapsed() > Duration::from_millis(800) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(held.state, "holding", "{held:?}");
    assert_eq!(held.sockets, 0);
    assert!(held.rate_pps.is_some(), "holding keeps a rate, not unlimited: {held:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = auto_of(&tb);
        if now.state == "fallback" {
            assert_eq!(now.rate_pps, Some(5000.0), "{now:?}");
            assert!(now.lost_secs >= 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "no fallback after the hold time: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
