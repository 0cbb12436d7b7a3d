//! The daemon's life as an operator drives it: a SIGHUP reload (and a
//! refused one), `napi = "idle"` put back, the log lines, the capabilities
//! it keeps. Real `sluice run` on a veth pair between two network
//! namespaces each test creates (and always removes). Needs root (CI is root).
mod common;

use common::testbed::{in_netns, Testbed, BIN};
use std::time::Duration;

/// Admitted by a bucket over a window: rate x time (3% under allowed: the
/// window's edges), up to the burst more (how much of it was spent in the
/// window depends on its per-CPU split) and 1% over.
fn bounded(what: &str, got: f64, rate_x_time: f64, burst: f64) {
    eprintln!("{what}: got {got:.0}, rate x time {rate_x_time:.0}, burst {burst:.0}");
    assert!(
        got >= 0.97 * rate_x_time && got <= 1.01 * (rate_x_time + burst),
        "{what}: got {got:.0}, want rate x time {rate_x_time:.0} (-3%) to + burst {burst:.0} (+1%)"
    );
}

mod reload {
    use super::*;

    #[test]
    fn sighup_changes_the_limit_without_detaching_and_refuses_a_bad_config() {
        let mut tb = Testbed::new();
        let cfg = |rate: &str| {
            // A burst of 50 ms at 10k/s: a sender the scheduler pauses for a few ms loses no tokens.
            format!("[[class]]\nname = \"svc\"\nrate = \"{rate}\"\nburst = 500\nmatch = [{{ proto = \"udp\", port = 7000 }}]\n")
        };
        let path = tb.write("sluice.toml", &cfg("5k"));
        let pid = tb.start_gate(&["--config", path.to_str().unwrap()]);
        let prog = tb.attached_prog();

        // What the gate admitted (what the sink reads also depends on how
        // fast this machine runs it: a busy host read 4% less).
        let admitted = |tb: &Testbed| {
            std::thread::sleep(Duration::from_millis(300)); // the statistics refresh every 100 ms
            tb.status().classes[0].totals.admitted_pkts as f64
        };
        let a0 = admitted(&tb);
        let (sent, secs) = tb.send(7000, 25_000, 2.0);
        assert!(sent as f64 > 1.5 * 5_000.0 * secs, "the sender must exceed the limit: {sent} in {secs:.2} s");
        bounded("before reload, 5k limit", admitted(&tb) - a0, 5_000.0 * secs, 500.0);

        std::fs::write(&path, cfg("10k")).unwrap();
        tb.signal(pid, libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(500));
        let s = tb.status();
        assert_eq!(s.reloads, 1);
        assert_eq!(s.classes[0].rate_pps, Some(10_000));
        assert_eq!(tb.attached_prog(), prog, "same program, never detached");
        let a0 = admitted(&tb);
        let (sent, secs) = tb.send(7000, 25_000, 2.0);
        assert!(sent as f64 > 1.5 * 10_000.0 * secs, "the sender must exceed the limit: {sent} in {secs:.2} s");
        bounded("after reload, 10k limit", admitted(&tb) - a0, 10_000.0 * secs, 500.0);

        // A bad config is refused: the old one stays, the error is visible.
        std::fs::write(&path, cfg("fast")).unwrap();
        tb.signal(pid, libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(500));
        let s = tb.status();
        assert_eq!(s.reloads, 1);
        assert_eq!(s.classes[0].rate_pps, Some(10_000));
        let err = s.last_reload_error.expect("the refused reload is reported");
        assert!(err.contains("sluice.toml:3") && err.contains("rate"), "{err}");
        assert_eq!(tb.attached_prog(), prog);
    }

    /// A reload refused after it would have turned discovery on leaves
    /// discovery off (issue 23, item 10): it used to start discovering
    /// before the new config was in force, and the old config then grew
    /// discovered classes.
    #[test]
    fn a_refused_reload_leaves_discovery_as_it_was() {
        let mut tb = Testbed::new();
        let fixed = "discover = false\n[[class]]\nname = \"svc\"\nmatch = [{ proto = \"udp\", port = 7000 }]\n";
        let path = tb.write("sluice.toml", fixed);
        let pid = tb.start_gate(&["--config", path.to_str().unwrap()]);
        let _service = tb.start_sink(7100, 8.0); // what discovery would find
                                                 // Discovery on, and an auto class whose service is not running: refused.
        let refused =
            "discover = true\n[[class]]\nname = \"svc\"\nrate = \"auto\"\nmatch = [{ proto = \"udp\", port = 7200 }]\n";
        std::fs::write(&path, refused).unwrap();
        tb.signal(pid, libc::SIGHUP);
        std::thread::sleep(Duration::from_millis(2500)); // past a rediscovery (every second)
        let s = tb.status();
        assert_eq!(s.reloads, 0);
        assert!(s.last_reload_error.is_some(), "the reload was refused");
        let names: Vec<&str> = s.classes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["svc", "default"], "no discovered class after a refused reload");
    }
}

/// `napi = "idle"` is put back (issue 23, item 8): a reload to "keep" and a
/// stop return the interface's napi kthreads to SCHED_OTHER (they stayed
/// at SCHED_IDLE for good).
mod napi {
    use super::*;
    use std::time::Instant;

    /// The policies of B's interface's napi kthreads (found from inside B,
    /// as the daemon finds them).
    fn policies(tb: &Testbed) -> Vec<i32> {
        let pids = in_netns(&tb.b, || {
            sluice::daemon::sched::napi_threads(&sluice::base::iface::Iface::resolve(tb.if_b).expect(tb.if_b))
        });
        // SAFETY: sched_getscheduler on kthread pids; an exited one gives -1.
        pids.into_iter().map(|p| unsafe { libc::sched_getscheduler(p) }).collect()
    }

    /// Linux 6.8 or later lists an interface's NAPI instances with their
    /// kthreads' pids (generic netlink, "netdev" family).
    fn kernel_lists_napi_pids() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release.trim().split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 8)
    }

    fn wait_for(tb: &Testbed, policy: i32, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let p = policies(tb);
            if !p.is_empty() && p.iter().all(|&x| x == policy) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: napi kthreads' policies {p:?}, want {policy}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn idle_napi_is_put_back_by_a_reload_to_keep_and_by_a_stop() {
        let mut tb = Testbed::new();
        let threaded = format!("/sys/class/net/{}/threaded", tb.if_b);
        // A veth has NAPI (and so can thread it) only with GRO on or an XDP program.
        let gro = format!("ethtool -K {} gro on && echo 1 > {threaded}", tb.if_b);
        let on = tb.cmd(&tb.b, &["sh", "-c", &gro]).output().unwrap();
        assert!(on.status.success(), "threaded NAPI on: {}", String::from_utf8_lossy(&on.stderr));
        let cfg = |napi: &str| {
            format!(
                "[auto]\nnapi = \"{napi}\"\n[[class]]\nname = \"svc\"\nmatch = [{{ proto = \"udp\", port = 7000 }}]\n"
            )
        };
        let path = tb.write("sluice.toml", &cfg("idle"));
        let pid = tb.start_gate(&["--config", path.to_str().unwrap(), "--no-discover"]);
        wait_for(&tb, libc::SCHED_IDLE, "napi = idle");
        // Hardening (issue 35, item 12): the kthreads are the ones the kernel
        // lists for the interface, each a kernel thread named for it.
        if kernel_lists_napi_pids() {
            let list = || sluice::signals::netdev::napis(sluice::dataplane::gate::ifindex(tb.if_b).unwrap());
            let napis = in_netns(&tb.b, list).expect("the netdev family lists the interface's NAPI instances");
            let pids: Vec<i32> = napis.iter().filter_map(|n| n.pid).collect();
            assert!(!pids.is_empty(), "threaded NAPI: the kernel lists a kthread ({napis:?})");
            for pid in pids {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                assert!(comm.starts_with(&format!("napi/{}-", tb.if_b)), "pid {pid} is {comm:?}");
            }
        }
        std::fs::write(&path, cfg("keep")).unwrap();
        tb.signal(pid, libc::SIGHUP);
        wait_for(&tb, libc::SCHED_OTHER, "reloaded to keep");
        // Idle again, then a stop.
        std::fs::write(&path, cfg("idle")).unwrap();
        tb.signal(pid, libc::SIGHUP);
        wait_for(&tb, libc::SCHED_IDLE, "reloaded to idle");
        tb.signal(pid, libc::SIGTERM);
        let out = tb.wait(pid);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let left = policies(&tb);
        assert!(left.iter().all(|&p| p != libc::SCHED_IDLE), "after the stop: {left:?}");
    }
}

mod log {
    use super::*;

    /// With --log-format json every line the daemon writes is one JSON
    /// object, and a reload that changes a class's rate writes one rate
    /// line naming the class, both rates and the cause.
    #[test]
    fn json_lines_and_a_rate_change_by_reload() {
        let mut tb = Testbed::new();
        let cfg = |rate: &str| {
            format!("[[class]]\nname = \"svc\"\nrate = \"{rate}\"\nmatch = [{{ proto = \"udp\", port = 7000 }}]\n")
        };
        let path = tb.write("sluice.toml", &cfg("5k"));
        let pid = tb.start_gate(&["--config", path.to_str().unwrap(), "--log-format", "json", "--no-discover"]);
        // Let the tick decide the first rate (a reload before the first tick changes no decided rate).
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&path, cfg("10k")).unwrap();
        tb.signal(pid, libc::SIGHUP);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while tb.status().reloads != 1 {
            assert!(std::time::Instant::now() < deadline, "no reload");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(100));
        tb.signal(pid, libc::SIGTERM);
        let out = tb.wait(pid);
        assert!(out.status.success());
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        assert!(lines.len() >= 4, "{lines:?}");
        for l in &lines {
            assert!(l["ts"].as_f64().unwrap() > 1.6e9 && l["level"].is_string() && l["msg"].is_string(), "{l}");
        }
        let rates: Vec<_> = lines.iter().filter(|l| l["event"] == "rate").collect();
        assert_eq!(rates.len(), 1, "one line for the one change: {lines:?}");
        let r = rates[0];
        assert_eq!(
            (r["class"].as_str(), r["from_pps"].as_u64(), r["to_pps"].as_u64()),
            (Some("svc"), Some(5000), Some(10_000))
        );
        assert_eq!(r["cause"], "config");
        assert!(lines.iter().any(|l| l["msg"].as_str().unwrap().starts_with("reloaded the config")));
    }

    #[test]
    fn a_bad_log_format_is_named() {
        let o = std::process::Command::new(BIN).args(["run", "--iface", "lo", "--log-format", "xml"]).output().unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("--log-format") && e.contains("human and json"), "{e}");
    }

    /// An error that stops `sluice run` is a JSON line too.
    #[test]
    fn a_fatal_error_is_a_json_line() {
        let o = std::process::Command::new(BIN)
            .args(["run", "--iface", "no-such-if0", "--log-format", "json"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let v: serde_json::Value = serde_json::from_slice(o.stderr.trim_ascii()).unwrap();
        assert_eq!(v["level"], "error");
        assert!(v["msg"].as_str().unwrap().contains("no-such-if0"), "{v}");
    }
}

/// Hardening (issue 35, item 12): started by root with every capability
/// (outside systemd), the daemon keeps only those the unit grants it
/// (CapabilityBoundingSet in sluice@.service), in every thread, the
/// metrics thread included, and still serves. Before, it kept full root
/// for its life.
mod privileges {
    use super::*;

    /// A /proc status line's capability mask ("CapEff:\t000001ffffffffff").
    fn mask(status: &str, key: &str) -> u64 {
        let line = status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{key} in {status}"));
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    #[test]
    fn the_daemon_drops_every_capability_it_does_not_need() {
        let mut tb = Testbed::new();
        let pid = tb.start_gate(&["--metrics", "127.0.0.1:0"]);
        std::thread::sleep(Duration::from_millis(300));
        let kept: u64 = sluice::daemon::privileges::KEPT.iter().map(|(c, _)| 1u64 << c).sum();
        let mut threads = 0;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            if status.is_empty() {
                continue; // a thread that ended
            }
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            for key in ["CapEff:", "CapPrm:", "CapBnd:", "CapInh:", "CapAmb:"] {
                let m = mask(&status, key);
                assert_eq!(
                    m & !kept,
                    0,
                    "thread {} ({}) {key} {m:x}: more than {kept:x}",
                    task.path().display(),
                    comm.trim()
                );
            }
            assert_ne!(mask(&status, "CapEff:") & (1 << 39), 0, "CAP_BPF kept in {}", comm.trim());
            threads += 1;
        }
        assert!(threads >= 2, "the daemon's threads were read ({threads})");
        assert!(tb.status().attached, "the daemon still serves, attached");
    }
}

/// Issue 49, item 4: a daemon stopped (SIGSTOP here; a cgroup freeze or a
/// long reclaim stall is the same to the gate) left its limits in force on a
/// frozen clock. Past its deadline (ALIVE_NS, 2 s after its last tick) the
/// gate fails open: a blocked class's datagrams reach the service, counted
/// as stale passes; once the daemon runs again, its next tick blocks them.
#[test]
fn a_stopped_daemon_leaves_the_gate_open_after_its_deadline() {
    let mut tb = Testbed::new();
    let pid = tb.start_gate(&["--no-discover", "--class", "shut:rate=blocked,match=udp:7000"]);
    let sink = tb.start_sink(7000, 7.0);
    let (before, _) = tb.send(7000, 1_000, 0.5);
    tb.signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(3_000));
    let (stalled, _) = tb.send(7000, 1_000, 1.0);
    tb.signal(pid, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(500));
    let (after, _) = tb.send(7000, 1_000, 0.5);
    let s = tb.status();
    let got = tb.sink_received(sink);
    eprintln!(
        "sent {before} alive, {stalled} stopped, {after} back; received {got}; stale passes {}",
        s.global.stale_pass
    );
    assert!(before > 0 && after > 0, "nothing sent");
    // The gate reads its clock once every SLUICE_STALE_EVERY drops of a class
    // on a CPU (the sender is pinned to one): so many may go before it sees the stall.
    let late = u64::from(sluice::bpf_intf::SLUICE_STALE_EVERY);
    assert!(got + late >= stalled, "the stopped daemon's block held: {got} of {stalled}");
    assert!(got <= stalled, "datagrams passed while the daemon ran: {got} > {stalled}");
    assert!(s.global.stale_pass >= got, "counted: {} < {got}", s.global.stale_pass);
    assert!(tb.is_running(pid), "the daemon died");
}

/// Issue 49, item 4: the unit is `Type=notify` with `WatchdogSec=`: the
/// daemon says READY=1 once attached and pings the watchdog from its tick
/// loop (here every 100 ms asked, so at every tick: 500 ms while calm).
#[test]
fn the_daemon_tells_systemd_it_is_ready_and_alive() {
    use std::os::unix::net::UnixDatagram;
    let tb = Testbed::new();
    let path = tb.dir.join("notify.sock");
    let listen = UnixDatagram::bind(&path).unwrap();
    listen.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let (sock, state) = (tb.socket(), tb.dir.join("state"));
    let mut c = tb.cmd(&tb.b, &[BIN]);
    c.args(["run", "--iface", tb.if_b, "--no-discover", "--metrics", "off"]);
    c.args(["--socket", sock.to_str().unwrap(), "--state-dir", state.to_str().unwrap()]);
    c.env("NOTIFY_SOCKET", &path).env("WATCHDOG_USEC", "100000").env_remove("WATCHDOG_PID");
    let mut child = c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let mut said = Vec::new();
    let mut buf = [0u8; 512];
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < end && said.iter().filter(|m: &&String| m.contains("WATCHDOG=1")).count() < 3 {
        if let Ok(n) = listen.recv(&mut buf) {
            said.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
    }
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert_eq!(said.first().map(|m| m.trim()), Some("READY=1"), "{said:?}");
    assert!(said.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 3, "{said:?}");
}
