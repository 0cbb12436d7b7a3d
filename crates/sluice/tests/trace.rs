//! `sluice trace` on real traffic in namespaces each test makes: the ledger
//! closes for drops whose cause the test made (a closed port, a socket
//! nobody reads, a blocked class), the JSON keeps its schema, and a trace
//! leaves no program behind, whether it ends by itself or by Ctrl-C.
mod common;

use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::testbed::{in_netns, Testbed};
use common::trace::{trace_programs, wait_for_trace};
use serde_json::Value;

/// The checks on loaded programs see every test's programs: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Wait up to 10 s for the kernel to free a finished trace's programs (it
/// frees them after an RCU grace period, not at the process's exit).
fn none_left() -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !trace_programs().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    trace_programs()
}

fn class<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no class {name}"))
}

fn drops_of(c: &Value, reason: &str) -> u64 {
    c["drops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == reason)
        .map(|d| d["packets"].as_u64().unwrap())
        .sum()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

#[test]
fn the_ledger_closes_for_a_closed_port_a_full_socket_and_a_gate_drop() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut tb = Testbed::new();
    // A socket nobody reads, with a small buffer: it fills, then the kernel drops.
    let ip = tb.ip_b.clone();
    let full: UdpSocket = in_netns(&tb.b, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.bind(&format!("{ip}:7000").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        UdpSocket::from(s)
    });
    let sink = tb.start_sink(7003, 12.0);
    tb.start_gate(&[
        "--no-discover",
        "--class",
        "full:priority=1,match=udp:7000",
        "--class",
        "closed:priority=1,match=udp:7001",
        "--class",
        "blk:rate=blocked,match=udp:7002",
        "--class",
        "served:priority=0,match=udp:7003",
    ]);
    let sock = tb.socket();
    let b = tb.b.clone();
    let args = ["trace", "--iface", tb.if_b, "--socket", sock.to_str().unwrap(), "--duration", "6", "--json"];
    let tracer = tb.spawn(&b, &args);
    wait_for_trace();
    let (sent_full, _) = tb.send(7000, 5000, 1.0);
    let (sent_closed, _) = tb.send(7001, 5000, 1.0);
    let (sent_blk, _) = tb.send(7002, 5000, 1.0);
    let (sent_served, _) = tb.send(7003, 5000, 1.0);
    let out = tb.wait(tracer);
    assert!(out.status.success(), "sluice trace failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["gate"].as_str().unwrap().starts_with("daemon pid"), "{}", r["gate"]);
    // Counts the gate saw: every packet admitted (blk: every packet dropped).
    for (name, sent) in [("full", sent_full), ("closed", sent_closed), ("served", sent_served)] {
        let c = class(&r, name);
        assert_eq!(c["gate"]["admitted"].as_u64().unwrap(), sent, "{name}: {c}");
        let pct = c["ledger"]["unaccounted_pct"].as_f64().unwrap();
        assert!(pct.abs() <= 1.0, "{name}: ledger does not close: {}", c["ledger"]);
    }
    let blk = class(&r, "blk");
    assert_eq!(blk["gate"]["dropped"].as_u64().unwrap(), sent_blk);
    assert_eq!(blk["stages"]["driver"].as_u64().unwrap(), 0, "the gate dropped them: the stack never saw one");
    // The closed port: every packet dies in UDP for NO_SOCKET.
    let closed = class(&r, "closed");
    assert_eq!(drops_of(closed, "NO_SOCKET"), sent_closed, "{closed}");
    assert!(closed["drops"][0]["stage"] == "transport");
    // The full socket: a few queued, the rest dropped at the socket.
    let f = class(&r, "full");
    let queued = f["stages"]["queued"].as_u64().unwrap();
    assert!(queued > 0 && queued < 100, "a 4 KiB buffer holds a few datagrams, not {queued}");
    assert_eq!(drops_of(f, "SOCKET_RCVBUFF") + queued, sent_full, "{f}");
    assert_eq!(f["stages"]["read"].as_u64().unwrap(), 0, "nobody read it");
    // The served port: queued, read, and timed.
    let s = class(&r, "served");
    assert_eq!(s["stages"]["queued"].as_u64().unwrap(), sent_served, "{s}");
    let received = tb.sink_received(sink);
    assert!(s["stages"]["read"].as_u64().unwrap() >= sent_served.min(received));
    let queue_to_read = &s["latency"][2];
    assert_eq!(queue_to_read["name"], "queued->read");
    assert!(queue_to_read["samples"].as_u64().unwrap() > 0, "{queue_to_read}");
    assert!(queue_to_read["p50_ns"].as_f64().unwrap() > 0.0);
    assert!(queue_to_read["ci95_ns"].as_f64().is_some());
    // The daemon counts the same drops for `sluice status` and /metrics.
    std::thread::sleep(Duration::from_millis(300));
    let snap = tb.status();
    let c = snap.classes.iter().find(|c| c.name == "closed").unwrap();
    let no_socket: u64 = c.kernel_drops.iter().filter(|d| d.reason == "NO_SOCKET").map(|d| d.packets).sum();
    assert_eq!(no_socket, sent_closed, "{:?}", c.kernel_drops);
    drop(full);
}

#[test]
fn the_json_report_keeps_its_schema() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut tb = Testbed::new();
    tb.start_gate(&["--no-discover", "--class", "closed:match=udp:7001"]);
    let sock = tb.socket();
    let b = tb.b.clone();
    let args = ["trace", "--iface", tb.if_b, "--socket", sock.to_str().unwrap(), "--duration", "3", "--json"];
    let tracer = tb.spawn(&b, &args);
    wait_for_trace();
    tb.send(7001, 2000, 0.5);
    let out = tb.wait(tracer);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        keys(&r),
        ["classes", "duration_secs", "gate", "interface", "notes", "sample_every", "unclassified_drops", "version"]
    );
    assert_eq!(r["version"], 1);
    assert_eq!(r["interface"], tb.if_b);
    let c = class(&r, "closed");
    assert_eq!(keys(c), ["drops", "gate", "id", "latency", "ledger", "name", "stages"]);
    assert_eq!(
        keys(&c["gate"]),
        ["admitted", "cookies_invalid", "cookies_valid", "dropped", "dropped_noconn", "syn_answered"]
    );
    assert_eq!(keys(&c["stages"]), ["driver", "queued", "read", "stack"]);
    assert_eq!(keys(&c["ledger"]), ["applied", "dropped", "queued", "unaccounted", "unaccounted_pct"]);
    assert_eq!(keys(&c["drops"][0]), ["packets", "reason", "stage"]);
    let names: Vec<&str> = c["latency"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["driver->stack", "stack->queued", "queued->read"]);
    assert_eq!(keys(&c["latency"][0]), ["ci95_ns", "hist", "mean_ns", "name", "p50_ns", "p99_ns", "samples"]);
    // Nothing was read, so no queued->read sample: missing, not 0.
    assert!(c["latency"][2]["mean_ns"].is_null());
}

#[test]
fn a_trace_leaves_no_program_attached_when_it_ends_or_is_interrupted() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(none_left(), Vec::<String>::new(), "a trace program is loaded before the test");
    let mut tb = Testbed::new();
    // No daemon: the tracer makes its own class tables, and says there is no gate.
    let out = tb.sluice(&tb.b, &["trace", "--iface", tb.if_b, "--duration", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["gate"].is_null());
    assert_eq!(none_left(), Vec::<String>::new(), "programs left after a trace ended");
    let b = tb.b.clone();
    let tracer = tb.spawn(&b, &["trace", "--iface", tb.if_b, "--duration", "60"]);
    wait_for_trace();
    tb.signal(tracer, libc::SIGINT);
    let out = tb.wait(tracer);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("trace of vb"));
    assert_eq!(none_left(), Vec::<String>::new(), "programs left after Ctrl-C");
}

#[test]
fn bad_arguments_get_errors_that_name_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::new();
    let out = tb.sluice(&tb.b, &["trace", "--iface", "nosuch0", "--duration", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch0"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = tb.sluice(&tb.b, &["trace", "--iface", tb.if_b, "--class", "nope", "--duration", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--class nope") && err.contains("default"), "{err}");
    let out = tb.sluice(&tb.b, &["trace", "--iface", tb.if_b, "--duration", "soon"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
}
