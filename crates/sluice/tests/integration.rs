//! Integration tests: real UDP traffic between two network namespaces each
//! test creates (and always removes), through `sluice run` on a veth pair.
//! Needs root (CI is root).
mod common;

use common::testbed::{in_netns, Testbed};
use std::time::{Duration, Instant};

fn within(what: &str, got: f64, want: f64, tol: f64) {
    let err = (got - want) / want;
    eprintln!("{what}: got {got:.0}, expected {want:.0} ({:+.2}%)", err * 100.0);
    assert!(
        err.abs() <= tol,
        "{what}: got {got:.0}, expected {want:.0}, off by {:+.2}% (tolerance {}%)",
        err * 100.0,
        tol * 100.0
    );
}

mod limits {
    use super::*;

    /// Offered 30k pkt/s against a 10k limit: the service receives the limit.
    #[test]
    fn service_receives_the_limit_within_5_percent() {
        let mut tb = Testbed::new();
        tb.start_gate(&["--class", "svc:rate=10k,burst=100,match=udp:7000"]);
        let sink = tb.start_sink(7000, 4.5);
        let (sent, secs) = tb.send(7000, 30_000, 3.0);
        let got = tb.sink_received(sink) as f64;
        assert!(sent as f64 > 2.5 * 10_000.0 * secs, "the sender must offer well over the limit: {sent} in {secs:.1}s");
        within("service received at a 10k limit", got, 10_000.0 * secs + 100.0, 0.05);
    }

    /// A high-priority unlimited class keeps all its traffic beside a limited flood.
    #[test]
    fn unlimited_priority_class_is_unaffected_by_a_limited_flood() {
        let mut tb = Testbed::new();
        tb.start_gate(&[
            "--class",
            "hi:priority=0,match=udp:7001",
            "--class",
            "flood:priority=5,rate=5k,match=udp:7000",
        ]);
        // 4 MiB buffers: a VM stall of a few ms overflows the default one (~50
        // datagrams at XDP's 4 KiB truesize; LINUX-NOTES), and hi's socket
        // drops then read as its distress, which throttles lo below its limit.
        let hi = tb.start_sink_with(7001, 4.5, &["--rcvbuf", "4194304"]);
        let lo = tb.start_sink_with(7000, 4.5, &["--rcvbuf", "4194304"]);
        let flood = tb.send_on_thread(0, 7000, 60_000, 3.0);
        let (hi_sent, _) = tb.send(7001, 5_000, 3.0);
        let out = flood.join().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (flood_sent, flood_secs) = (v["sent"].as_u64().unwrap(), v["secs"].as_f64().unwrap());
        let (hi_got, lo_got) = (tb.sink_received(hi), tb.sink_received(lo));
        eprintln!("hi: sent {hi_sent} got {hi_got}; flood: sent {flood_sent} got {lo_got}");
        assert!(hi_got as f64 >= 0.99 * hi_sent as f64, "high-priority class lost packets: {hi_got} of {hi_sent}");
        // At most its 5k limit. Not exactly the limit: the budget may throttle
        // the lower class further while `hi` or the receive path shows distress
        // (softnet backlog drops are counted host-wide, so floods of tests
        // running beside this one count too: see docs/limits.md).
        let cap = 5_000.0 * flood_secs + 50.0;
        assert!(
            lo_got as f64 <= cap * 1.05 && lo_got as f64 >= cap * 0.5,
            "flood class: {lo_got} against a cap of {cap:.0}"
        );
        let s = tb.status();
        let hi_c = s.classes.iter().find(|c| c.name == "hi").unwrap();
        assert_eq!(hi_c.totals.dropped_pkts(), 0);
    }
}

mod serve {
    use super::*;

    /// `serve udp-echo --readers 2`: two SO_REUSEPORT sockets together get every datagram.
    #[test]
    fn readers_share_one_port() {
        let mut tb = Testbed::new();
        let b = tb.b.clone();
        let pid = tb.spawn_load(
            &b,
            &["serve", "udp-echo", "--port", "7000", "--readers", "2", "--no-echo", "--json", "--duration", "2.5"],
        );
        std::thread::sleep(Duration::from_millis(300));
        let (sent, _) = tb.send(7000, 5_000, 1.0);
        assert_eq!(tb.sink_received(pid), sent);
    }
}

mod status {
    use super::*;
    use libbpf_rs::libbpf_sys;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// Per-class counters read straight from the kernel: the daemon's
    /// class_state map found through its program id (maps are not per namespace).
    fn kernel_class_admitted(prog_id: u32, class: u32) -> (u64, u64) {
        unsafe {
            let pfd = OwnedFd::from_raw_fd(libbpf_sys::bpf_prog_get_fd_by_id(prog_id));
            let mut ids = [0u32; 64];
            let mut info =
                libbpf_sys::bpf_prog_info { nr_map_ids: 64, map_ids: ids.as_mut_ptr() as u64, ..Default::default() };
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            assert_eq!(libbpf_sys::bpf_prog_get_info_by_fd(pfd.as_raw_fd(), &mut info, &mut len), 0);
            // The kernel says how many maps the program uses; it filled at most 64 ids.
            for &id in &ids[..(info.nr_map_ids as usize).min(ids.len())] {
                let mfd = OwnedFd::from_raw_fd(libbpf_sys::bpf_map_get_fd_by_id(id));
                let mut mi = libbpf_sys::bpf_map_info::default();
                let mut ml = std::mem::size_of::<libbpf_sys::bpf_map_info>() as u32;
                libbpf_sys::bpf_map_get_info_by_fd(mfd.as_raw_fd(), &mut mi, &mut ml);
                let name = std::ffi::CStr::from_ptr(mi.name.as_ptr()).to_string_lossy().into_owned();
                if name != "class_state" {
                    continue;
                }
                let ncpus = libbpf_rs::num_possible_cpus().unwrap();
                let vsize = mi.value_size as usize;
                let (mut seen, mut admitted) = (0, 0);
                let counters = std::mem::offset_of!(sluice::bpf_intf::sluice_class_state, cnt);
                // One entry per CPU and class (bpf/gate/maps.h).
                for cpu in 0..ncpus {
                    let mut cpu_buf = vec![0u8; vsize];
                    let key = sluice::dataplane::gate::state_key(cpu, class).to_ne_bytes();
                    assert_eq!(
                        libbpf_sys::bpf_map_lookup_elem(
                            mfd.as_raw_fd(),
                            key.as_ptr().cast(),
                            cpu_buf.as_mut_ptr().cast()
                        ),
                        0
                    );
                    let cpu = &cpu_buf;
                    let word = |i: usize| {
                        let at = counters + i * 8;
                        u64::from_ne_bytes(cpu[at..at + 8].try_into().unwrap())
                    };
                    seen += word(sluice::bpf_intf::SLUICE_CS_SEEN_PKTS as usize);
                    admitted += word(sluice::bpf_intf::SLUICE_CS_ADMIT_PKTS as usize);
                }
                return (seen, admitted);
            }
            panic!("class_state map not found for prog {prog_id}");
        }
    }

    #[test]
    fn status_json_totals_equal_the_bpf_counters() {
        let mut tb = Testbed::new();
        tb.start_gate(&["--class", "svc:rate=2k,burst=10,match=udp:7000"]);
        let sink = tb.start_sink(7000, 2.5);
        tb.send(7000, 10_000, 1.0);
        tb.sink_received(sink);
        std::thread::sleep(Duration::from_millis(400)); // a few daemon ticks after the traffic
        let s = tb.status();
        let svc = s.classes.iter().find(|c| c.name == "svc").unwrap();
        let (seen, admitted) = kernel_class_admitted(s.prog_id, svc.id as u32);
        assert!(seen > 5_000, "traffic reached the gate: {seen}");
        assert_eq!((svc.totals.seen_pkts, svc.totals.admitted_pkts), (seen, admitted), "status vs kernel");
        assert_eq!(svc.totals.seen_pkts, svc.totals.admitted_pkts + svc.totals.dropped_pkts());
        assert_eq!(s.xdp_mode, "native");
        assert_eq!(tb.attached_prog(), s.prog_id as u64, "status names the attached program");
        // The table form works too.
        let out = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("svc") && text.contains("2000 pps"), "{text}");
    }

    /// Prometheus metrics on the documented address (127.0.0.1:9786, inside B's namespace).
    #[test]
    fn metrics_are_served() {
        let mut tb = Testbed::new();
        let sock = tb.socket();
        let b = tb.b.clone();
        let pid = tb.spawn(
            &b,
            &["run", "--iface", tb.if_b, "--socket", sock.to_str().unwrap(), "--class", "svc:rate=3k,match=udp:7000"],
        );
        let body = in_netns(&b, || {
            use std::io::{Read, Write};
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(mut c) = std::net::TcpStream::connect("127.0.0.1:9786") {
                    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
                    let mut s = String::new();
                    c.read_to_string(&mut s).unwrap();
                    let mut om = String::new();
                    let mut c = std::net::TcpStream::connect("127.0.0.1:9786").unwrap();
                    c.write_all(
                        b"GET /metrics HTTP/1.0\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
                    )
                    .unwrap();
                    c.read_to_string(&mut om).unwrap();
                    return (s, om);
                }
                assert!(std::time::Instant::now() < deadline, "metrics never came up");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (body, openmetrics) = body;
        assert!(body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("sluice_class_rate_limit_packets_per_second{class=\"svc\"} 3000"), "{body}");
        assert!(body.contains("sluice_class_packets_total{class=\"svc\",verdict=\"admitted\"}"), "{body}");
        assert!(openmetrics.contains("application/openmetrics-text") && openmetrics.contains("# EOF"), "{openmetrics}");
        // The 0.0.4 text passes promtool's rules, and its families are docs/metrics.md's table.
        let text = body.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
        let families = sluice_testkit::promlint::lint_004(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let kind = |n: &str| families.iter().find(|f| f.0 == n).map(|f| f.1.clone());
        assert_eq!(kind("sluice_class_packets_total").as_deref(), Some("counter"));
        assert_eq!(kind("sluice_daemon_cpu_seconds_total").as_deref(), Some("counter"));
        assert_eq!(kind("sluice_start_time_seconds").as_deref(), Some("gauge"));
        let mut served: Vec<String> = families.into_iter().map(|f| f.0).collect();
        served.sort();
        let reference = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md")).unwrap();
        let mut documented: Vec<String> = reference
            .lines()
            .filter_map(|l| l.strip_prefix("| `sluice_")?.split_once('`').map(|(n, _)| format!("sluice_{n}")))
            .collect();
        documented.sort();
        assert_eq!(served, documented, "served metric families vs docs/metrics.md's table");
        promtool_is_clean(text);
        deployed_metrics_are_served(&served);
        tb.signal(pid, libc::SIGTERM);
        assert!(tb.wait(pid).status.success());
    }

    /// 300 half-open requests to the metrics endpoint (regression: they took
    /// the daemon from 9 threads to 256): the daemon's thread count does not
    /// move, and once they are gone a scrape is answered.
    #[test]
    fn half_open_metrics_requests_cost_the_daemon_no_thread() {
        let mut tb = Testbed::new();
        let sock = tb.socket();
        let b = tb.b.clone();
        let pid = tb.spawn(&b, &["run", "--iface", tb.if_b, "--socket", sock.to_str().unwrap(), "--no-discover"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !sluice::surface::client::serving(&sock) {
            assert!(std::time::Instant::now() < deadline, "sluice run did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
        std::thread::sleep(Duration::from_millis(500));
        let before = threads();
        let (during, answer) = in_netns(&b, move || {
            use std::io::{Read, Write};
            let idle: Vec<std::net::TcpStream> = (0..300)
                .filter_map(|_| std::net::TcpStream::connect("127.0.0.1:9786").ok())
                .map(|mut c| {
                    let _ = c.write_all(b"GET /met");
                    c
                })
                .collect();
            std::thread::sleep(Duration::from_millis(500));
            let during = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
            drop(idle);
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let mut c = std::net::TcpStream::connect("127.0.0.1:9786").unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
                let mut s = String::new();
                if c.read_to_string(&mut s).is_ok() && s.starts_with("HTTP/1.1 200") {
                    return (during, s);
                }
                assert!(std::time::Instant::now() < deadline, "no scrape answered after the half-open requests");
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        assert_eq!(during, before, "threads before and with 300 half-open requests");
        assert!(answer.contains("sluice_start_time_seconds"), "{answer}");
        tb.signal(pid, libc::SIGTERM);
        assert!(tb.wait(pid).status.success());
    }

    /// Every sluice_* metric the Grafana dashboard and the alert rules in
    /// deploy/ name is a family the daemon serves (a renamed metric would
    /// leave a panel empty and an alert silent).
    fn deployed_metrics_are_served(served: &[String]) {
        let top = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/");
        for file in ["grafana/sluice-dashboard.json", "prometheus/sluice-alerts.yml"] {
            let text = std::fs::read_to_string(format!("{top}{file}")).unwrap();
            let mut used: Vec<&str> = text
                .match_indices("sluice_")
                .map(|(i, _)| {
                    let rest = &text[i..];
                    &rest[..rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len())]
                })
                .filter(|n| n.len() > "sluice_".len())
                .collect();
            used.sort();
            used.dedup();
            assert!(used.len() >= 4, "{file} names {used:?}");
            for name in used {
                assert!(served.iter().any(|s| s == name), "{file} uses {name}, which /metrics does not serve");
            }
        }
    }

    /// `promtool check metrics` (Debian's prometheus package) on the text, where it
    /// is installed; `lint_004` above checks the same rules everywhere.
    fn promtool_is_clean(text: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("promtool: {e} (install it with `make deps`: Debian package prometheus)"));
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let o = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");
    }

    /// A link detached behind the daemon's back (bpftool link detach) is
    /// seen: status says GATE DETACHED and the snapshot (so the
    /// sluice_gate_attached metric) says false.
    #[test]
    fn a_gate_detached_behind_the_daemons_back_is_reported() {
        use libbpf_rs::libbpf_sys;
        let mut tb = Testbed::new();
        let pid = tb.start_gate(&["--no-discover"]);
        let s = tb.status();
        assert!(s.attached);
        let link =
            libbpf_rs::query::LinkInfoIter::default().find(|l| l.prog_id == s.prog_id).expect("the daemon's XDP link");
        // SAFETY: plain syscalls on an fd this test owns.
        unsafe {
            let fd = libbpf_sys::bpf_link_get_fd_by_id(link.id);
            assert!(fd >= 0, "link fd");
            assert_eq!(libbpf_sys::bpf_link_detach(fd), 0, "detach");
            libc::close(fd);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while tb.status().attached {
            assert!(std::time::Instant::now() < deadline, "the detach was not noticed");
            std::thread::sleep(Duration::from_millis(50));
        }
        let table = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
        assert!(String::from_utf8_lossy(&table.stdout).contains("GATE DETACHED"));
        tb.signal(pid, libc::SIGTERM);
        tb.wait(pid);
    }

    /// The gate times each class's answers (bpf/gate/delay.h): an echo
    /// service that answers at once and one that spends 20 ms of CPU on
    /// each datagram (40 a second: it keeps up), side by side; status's
    /// delays tell them apart, and the table says so.
    #[test]
    fn status_says_how_long_each_service_takes_to_answer() {
        let mut tb = Testbed::new();
        tb.start_gate(&["--no-discover", "--class", "fast:match=udp:7000", "--class", "slow:match=udp:7001"]);
        let b = tb.b.clone();
        tb.spawn_load(&b, &["serve", "udp-echo", "--port", "7000", "--duration", "6"]);
        tb.spawn_load(&b, &["serve", "udp-echo", "--port", "7001", "--work-ns", "20000000", "--duration", "6"]);
        std::thread::sleep(Duration::from_millis(300));
        let (fast, slow) = (tb.send_on_thread(1, 7000, 200, 3.0), tb.send_on_thread(0, 7001, 40, 3.0));
        for t in [fast, slow] {
            assert!(t.join().unwrap().status.success());
        }
        std::thread::sleep(Duration::from_millis(300));
        let s = tb.status();
        let delays = |name: &str| s.classes.iter().find(|c| c.name == name).unwrap().totals.answer_delays;
        let (fast, slow) = (delays("fast"), delays("slow"));
        println!("fast: {fast:?}\nslow: {slow:?}");
        // One admitted packet in SLUICE_DELAY_EVERY (16) is offered a stamp:
        // about 37 of the fast service's 600 requests, 7 of the slow one's 120.
        assert!(fast.samples >= 20, "fast: {} of 600 timed", fast.samples);
        assert!(slow.samples >= 3, "slow: {} of 120 timed", slow.samples);
        // 20 ms of work: its median's bucket is 2^24-2^25 ns or later; an
        // echo with none answers in a fraction of that.
        let (f50, s50) = (fast.quantile_ms(0.5).unwrap(), slow.quantile_ms(0.5).unwrap());
        assert!(s50 > 20.0, "the slow service's median delay is at least its 20 ms of work: under {s50} ms");
        assert!(f50 * 4.0 <= s50, "the fast one answers in under a quarter of that: under {f50} ms");
        assert_eq!(delays("default").samples, 0, "the default class is not timed");
        let table = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
        assert!(String::from_utf8_lossy(&table.stdout).contains("ANSWERED IN"), "the table shows them");
    }

    #[test]
    fn sigterm_detaches_and_prints_totals() {
        let mut tb = Testbed::new();
        let pid = tb.start_gate(&["--class", "svc:match=udp:7000"]);
        assert_ne!(tb.attached_prog(), 0);
        tb.signal(pid, libc::SIGTERM);
        let out = tb.wait(pid);
        assert!(out.status.success(), "clean exit: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("svc"), "totals printed");
        assert_eq!(tb.attached_prog(), 0, "detached");
        assert!(!tb.socket().exists(), "socket removed");
    }
}

mod known {
    use super::*;

    /// The state file as the daemon writes it, with two known sources: one
    /// of the configured class, one of a class that does not exist (yet).
    fn state(tb: &Testbed) -> std::path::PathBuf {
        let dir = tb.dir.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        let file = sluice::signals::known::path(&dir, tb.if_b);
        let now = sluice::base::clock::wall_ms();
        let known = |class: &str, addr: &str| sluice::signals::known::Known {
            class: class.into(),
            addr: addr.parse().unwrap(),
            first_unix_ms: now - 40_000,
            last_unix_ms: now - 10_000,
            answers: 5,
            paused_ms: 0,
        };
        sluice::signals::known::save(&file, &[known("svc", "10.77.0.1"), known("later", "10.77.0.9")]).unwrap();
        file
    }

    /// The daemon gives each class its part of the known map (issue 23, item
    /// 4): a client an echo service answers over a few seconds is learned
    /// live (the learner learns nothing until the daemon writes the room).
    #[test]
    fn a_client_answered_for_seconds_is_learned_by_the_running_daemon() {
        let mut tb = Testbed::new();
        tb.start_gate(&["--no-discover", "--class", "svc:match=udp:7000"]);
        let echo = tb.start_echo(7000, 8.0);
        tb.send(7000, 200, 3.0);
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let snap = tb.status();
            let svc = snap.classes.iter().find(|c| c.name == "svc").unwrap();
            if svc.sources.as_ref().and_then(|s| s.known).is_some_and(|k| k >= 1) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the answered client was not learned in 15 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        tb.wait(echo);
    }

    /// Issue 49 item 3: a daemon restarted with its known sources kept (the
    /// state file) learns no new client for its first
    /// LEARN_HOLD_AFTER_RESTART_SECS: a client its echo service answers for
    /// 4 s right after the start is not known. A first start learns such a
    /// client within 3 s (the test above); so did a restart before.
    #[test]
    fn a_restarted_daemon_learns_no_client_in_its_first_seconds() {
        let mut tb = Testbed::new();
        state(&tb);
        tb.start_gate(&["--no-discover", "--class", "svc:match=udp:7000"]);
        let echo = tb.start_echo(7000, 8.0);
        let newcomer = tb.add_host_a(78);
        let out = tb.send_from_on_thread(1, &newcomer, 7000, 200, 4.0).join().unwrap();
        assert!(out.status.success(), "send: {}", String::from_utf8_lossy(&out.stderr));
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut known = None;
        while Instant::now() < deadline {
            known = svc(&tb).sources.as_ref().and_then(|s| s.known);
            assert!(known.is_none_or(|k| k <= 1), "the newcomer was learned in the hold: {known:?} known");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(known, Some(1), "the state file's client only");
        tb.signal(echo, libc::SIGTERM);
    }

    /// Issue 48: a known client's datagrams that a full socket drops after
    /// the gate admitted them are counted (`known_lost_pkts`, target 0):
    /// none while the service keeps up, and about as many as the socket
    /// dropped once the same client sends ten times what the service reads.
    #[test]
    fn a_known_clients_datagrams_lost_at_a_full_socket_are_counted() {
        let mut tb = Testbed::new();
        // Answered at 2,000/s: known up to four times that (its own rate).
        let (echo, gate) = echo_with_known_client(&mut tb, 2_000, "svc:match=udp:7000");
        // While it keeps up the socket drops nothing and nothing is lost; a
        // host busy elsewhere may stall it even at this rate (17 lost once,
        // beside a build on both CPUs): lost never exceeds what the socket
        // dropped, and the flood's part is counted from here.
        let (calm, dropped_calm) = (svc(&tb).known_lost_pkts.expect("counted"), rcvbuf_errors(&tb));
        assert!(calm <= dropped_calm, "known lost {calm} while calm, the socket dropped {dropped_calm}");
        let (sent, _) = tb.send(7000, 50_000, 1.0);
        std::thread::sleep(Duration::from_millis(1500));
        let lost = svc(&tb).known_lost_pkts.expect("counted (the daemon's tracer runs)") - calm;
        let dropped = rcvbuf_errors(&tb) - dropped_calm;
        eprintln!(
            "calm: lost {calm} of {dropped_calm} drops; sent {sent}, the socket dropped {dropped}, known lost {lost}"
        );
        // Over its own rate its packets are a stranger's, and the gate keeps
        // the socket's last quarter from them: what overflows is known.
        assert!(dropped > 500, "the socket did not overflow ({dropped} of {sent}): the test shows nothing");
        assert!(lost > dropped / 2 && lost <= dropped, "known lost {lost} against {dropped} socket drops");
        tb.signal(echo, libc::SIGTERM);
        // The daemon's log says so, with the class's limit.
        tb.signal(gate, libc::SIGTERM);
        let log = String::from_utf8_lossy(&tb.wait(gate).stderr).to_string();
        let line =
            log.lines().find(|l| l.contains("known lost: ")).unwrap_or_else(|| panic!("no known-lost line:\n{log}"));
        assert!(line.contains("of svc's known clients' datagrams") && line.contains("the class unlimited"), "{line}");
    }

    fn svc(tb: &Testbed) -> sluice::surface::stats::ClassSnapshot {
        tb.status().classes.into_iter().find(|c| c.name == "svc").unwrap()
    }

    /// The gate with `class` (svc, on udp:7000), an echo service there that
    /// reads in batches and spends 200 us of CPU a datagram (about 5,000/s
    /// at most) for 30 s (the tests stop it), and A's address answered at
    /// `rate` in 3 s sends until the daemon knows it, three at most: the
    /// learner records clients only after a healthy second, and a fresh-clone
    /// CI run beside the binary's other tests once did not learn the client
    /// of one send in 10 s (3 of 3 alone and 2 of 2 whole-binary runs did).
    /// Returns the echo service's pid and the daemon's.
    fn echo_with_known_client(tb: &mut Testbed, rate: u64, class: &str) -> (u32, u32) {
        let gate = tb.start_gate(&["--no-discover", "--class", class]);
        let b = tb.b.clone();
        let echo =
            tb.spawn_load(&b, &["serve", "udp-echo", "--port", "7000", "--work-ns", "200000", "--duration", "30"]);
        std::thread::sleep(Duration::from_millis(300));
        for send in 1..=3 {
            tb.send(7000, rate, 3.0);
            if wait_known(tb, Duration::from_secs(3)) {
                return (echo, gate);
            }
            eprintln!("send {send}: the client is not known yet: {:?}", svc(tb).sources);
        }
        panic!("the answered client was not learned after three sends");
    }

    /// Does the svc class hold a known client within `wait`?
    fn wait_known(tb: &Testbed, wait: Duration) -> bool {
        let deadline = std::time::Instant::now() + wait;
        while svc(tb).sources.as_ref().and_then(|s| s.known).is_none_or(|k| k < 1) {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        true
    }

    /// B's UDP RcvbufErrors: datagrams its sockets dropped, full.
    fn rcvbuf_errors(tb: &Testbed) -> u64 {
        let out = tb.cmd(&tb.b, &["cat", "/proc/net/snmp"]).output().unwrap();
        sluice::signals::procfs::proc_counter(&String::from_utf8_lossy(&out.stdout), "Udp:", "RcvbufErrors")
    }

    /// Issue 48: a service that reads in batches (recvmmsg, 64 at a time:
    /// the echo service) flooded by a stranger while a known client goes on
    /// at its usual rate loses none of the known client's datagrams at its
    /// socket after the flood's first ticks: the gate keeps the socket's last quarter for known clients
    /// (bpf/gate/room.h). Before, the socket was one FIFO and dropped the
    /// known client's datagrams with the flood's.
    #[test]
    fn a_batch_reader_flooded_by_a_stranger_loses_no_known_datagram() {
        let mut tb = Testbed::new();
        let (echo, _) = echo_with_known_client(&mut tb, 200, "svc:match=udp:7000");
        let stranger = tb.add_host_a(77);
        let flood = tb.send_from_on_thread(1, &stranger, 7000, 50_000, 2.0);
        let (sent, _) = tb.send(7000, 200, 2.0);
        let flood = flood.join().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let c = svc(&tb);
        let lost = c.known_lost_pkts.expect("counted (the daemon's tracer runs)");
        let (dropped, room) = (rcvbuf_errors(&tb), c.totals.dropped_room_pkts);
        eprintln!(
            "known client sent {sent}; flood: {}; the socket dropped {dropped}, the gate {} (room {room}, surges the gate marked {}); known lost {lost}",
            String::from_utf8_lossy(&flood.stdout).trim(),
            c.totals.dropped_pkts(),
            c.totals.surge_marks
        );
        assert!(c.totals.dropped_pkts() + dropped > 10_000, "the flood did not overfill the service: shows nothing");
        // The gate marks the surge itself (the class's room armed: 64
        // packets within 2 ms on a CPU) and keeps room from then, before a
        // tick of the daemon sees it. Without the mark the room came after
        // such a tick, and a known datagram sent in the flood's first ticks
        // could be lost with the flood's (a CI run: 1 of 399, the socket's
        // 3 drops in all); with it, 0 lost and 0 socket drops in each run
        // here. The allowance stays at the known client's datagrams of two
        // 10 ms ticks, for a host slow enough to deliver the flood's first
        // packets slower than the mark counts. Before the room: 357 of 399.
        assert!(c.totals.surge_marks >= 1, "the gate marked no surge: the room came only with a tick");
        let onset = (200.0_f64 * 2.0 / sluice::policy::controller::TICK_HZ).ceil() as u64;
        assert!(lost <= onset, "known client's datagrams lost at the socket: {lost} (onset allowance {onset})");
        tb.signal(echo, libc::SIGTERM);
    }

    /// Issue 51: a known client whose datagrams enter on another CPU than a
    /// stranger's flood (on veth the gate runs on the sender's CPU, as RSS
    /// puts two flows on two queues) keeps its answers: the known tier is
    /// split over CPUs by the known clients' own arrivals. Split by all of
    /// the class's arrivals, the flood's CPU took all of it but a floor
    /// (the run: 51.5% answered). The class is held at 3,000/s,
    /// under what the service reads, so the split, not the room in its
    /// socket, decides what passes.
    #[test]
    fn a_known_client_on_another_cpu_than_the_flood_keeps_its_answers() {
        let mut tb = Testbed::new();
        let (echo, _) = echo_with_known_client(&mut tb, 200, "svc:rate=3000,match=udp:7000");
        let stranger = tb.add_host_a(78);
        // The client goes on at its usual rate; the flood comes 300 ms into it.
        let (sent, answered, flood) = std::thread::scope(|s| {
            let flood = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                tb.send_from_on_thread(0, &stranger, 7000, 50_000, 2.0).join().unwrap()
            });
            let (sent, answered) = tb.send_answered(1, 7000, 200, 2.5);
            (sent, answered, flood.join().unwrap())
        });
        let c = svc(&tb);
        eprintln!(
            "known client on CPU 1: sent {sent}, answered {answered} (known {}, admitted {}, over its own rate {}); flood on CPU 0: {}; the gate dropped {} (share {}, room {}), the socket {}",
            c.totals.known_pkts,
            c.totals.known_admitted_pkts,
            c.totals.known_over_pkts,
            String::from_utf8_lossy(&flood.stdout).trim(),
            c.totals.dropped_pkts(),
            c.totals.dropped_share_pkts,
            c.totals.dropped_room_pkts,
            rcvbuf_errors(&tb)
        );
        assert!(
            c.totals.dropped_rate_pkts + c.totals.dropped_share_pkts > 10_000,
            "the flood was not limited: shows nothing"
        );
        assert!(answered * 100 >= sent * 99, "the known client got {answered} of {sent} answered (< 99%)");
        tb.signal(echo, libc::SIGTERM);
    }

    /// Known sources are read at start by class name, held in the gate (the
    /// status counts them after the first scan), and written back at exit
    /// with the ones whose class is not there kept; a corrupt file is refused
    /// with a log line, the daemon runs and writes a good one at exit.
    #[test]
    fn known_sources_survive_a_restart_and_a_corrupt_state_file_is_ignored() {
        let mut tb = Testbed::new();
        let file = state(&tb);
        let pid = tb.start_gate(&["--no-discover", "--class", "svc:match=udp:7000"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let known = loop {
            let snap = tb.status();
            let svc = snap.classes.iter().find(|c| c.name == "svc").unwrap();
            if let Some(k) = svc.sources.as_ref().and_then(|s| s.known) {
                break k;
            }
            assert!(std::time::Instant::now() < deadline, "no scan of the known sources in 15 s");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(known, 1, "the svc class's known source is in the gate");
        tb.signal(pid, libc::SIGTERM);
        let out = tb.wait(pid);
        assert!(String::from_utf8_lossy(&out.stderr).contains("known sources: 2 read from"));
        let saved = sluice::signals::known::load(&file).unwrap();
        let addrs: Vec<String> = saved.iter().map(|k| format!("{} {}", k.class, k.addr)).collect();
        assert_eq!(addrs, vec!["svc 10.77.0.1", "later 10.77.0.9"], "written back at exit");

        std::fs::write(&file, b"{\"version\":1,\"saved_unix\":").unwrap();
        let pid = tb.start_gate(&["--no-discover", "--class", "svc:match=udp:7000"]);
        tb.signal(pid, libc::SIGTERM);
        let out = tb.wait(pid);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", out.status);
        assert!(err.contains("is not a sluice state file") && err.contains("starting with none"), "{err}");
        assert_eq!(sluice::signals::known::load(&file), Ok(vec![]), "a good (empty) file replaces the corrupt one");
    }
}

/// Issue 49 item 9: what the host needs from its default class, with real
/// traffic through the daemon.
mod host {
    use super::*;

    /// A resolver's queries to its upstream, the default class (where their
    /// answers land, on the query socket's ephemeral port) limited to 200/s
    /// and flooded at a closed port: every answer comes back, counted as a
    /// reply to the host's own connection, also those large enough to come
    /// in two fragments. On a gate without the rule the answers share the
    /// 200/s with the flood (about 1 in 100 comes back).
    #[test]
    fn a_flooded_default_class_passes_the_answers_to_the_hosts_own_queries() {
        let mut tb = Testbed::new();
        tb.start_gate(&["--class", "default:rate=200,burst=20"]);
        let a = tb.a.clone();
        tb.spawn_load(&a, &["serve", "udp-echo", "--port", "5300", "--json", "--duration", "8"]);
        std::thread::sleep(Duration::from_millis(300));
        let flood = tb.send_on_thread(0, 9, 50_000, 3.0);
        std::thread::sleep(Duration::from_millis(300));
        let upstream = format!("{}:5300", tb.ip_a);
        let (asked, answered) = in_netns(&tb.b, move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(&upstream).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let (mut asked, mut answered, mut buf) = (0u64, 0u64, [0u8; 4096]);
            // 400 small queries, then 100 of 1,800 bytes: their answers come
            // back in two IPv4 fragments each (the veth's MTU is 1,500).
            let end = Instant::now() + Duration::from_secs(2);
            while Instant::now() < end && asked < 500 {
                asked += 1;
                let query = vec![asked as u8; if asked > 400 { 1800 } else { 8 }];
                s.send(&query).unwrap();
                if s.recv(&mut buf).is_ok_and(|n| n == query.len()) {
                    answered += 1;
                }
            }
            (asked, answered)
        });
        let out = flood.join().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = tb.status();
        let d = s.classes.iter().find(|c| c.name == "default").unwrap();
        eprintln!(
            "asked {asked}, answered {answered}; flood sent {}; default class dropped {}, host replies {}",
            v["sent"],
            d.totals.dropped_pkts(),
            s.global.host_reply
        );
        assert!(d.totals.dropped_pkts() > 10 * asked, "the flood was limited: {} dropped", d.totals.dropped_pkts());
        assert!(answered as f64 >= 0.99 * asked as f64, "answered {answered} of {asked}");
        assert!(asked >= 50, "asked {asked} in 2 s");
        assert!(s.global.host_reply > 0, "counted as replies to the host's connections");
    }
}

/// Issue 25: an always-on daemon with nothing to control ticks slowly, and
/// the first packets of a flood wake it through the gate: it ticks at 10 ms
/// again at once (a calm loop runs about 2 ticks a second).
mod pace {
    use super::*;

    #[test]
    fn an_idle_daemon_ticks_slowly_and_the_first_flooded_packets_wake_it() {
        let mut tb = Testbed::new();
        tb.start_gate(&[]);
        let deadline = Instant::now() + Duration::from_secs(8);
        let calm = loop {
            let s = tb.status();
            if s.tick_ms.is_some_and(|t| t >= 100.0) {
                break s;
            }
            assert!(Instant::now() < deadline, "never calm: tick {:?} ms", s.tick_ms);
            std::thread::sleep(Duration::from_millis(100));
        };
        // A calm second: the loop ticks at the calm pace (status refreshes every second).
        std::thread::sleep(Duration::from_millis(2100));
        let still = tb.status();
        let calm_rate = (still.ticks - calm.ticks) as f64 / (still.uptime_secs - calm.uptime_secs);
        assert!(calm_rate < 8.0, "calm ticks {calm_rate:.1}/s");
        // 2,000 packets in 50 ms to a closed port (the default class): far
        // over the wake mark on any CPU they land on.
        tb.send(9999, 40_000, 0.05);
        std::thread::sleep(Duration::from_millis(1500));
        let after = tb.status();
        assert!(after.wakes > still.wakes, "the gate did not wake the loop: {} wakes", after.wakes);
        let rate = (after.ticks - still.ticks) as f64 / (after.uptime_secs - still.uptime_secs);
        assert!(rate > 3.0 * calm_rate.max(1.0), "ticks {rate:.1}/s after the flood, {calm_rate:.1}/s calm");
        // The wake's time from the gate's call to the loop is measured, and
        // under a calm tick (a record without the gate's clock, or one read
        // against another clock, would be hours or missing). What it is on
        // this machine is `sluice bench idle`'s figure, not asserted here.
        let took = after.wake_ms.expect("the wake's time is reported");
        assert!((0.0..500.0).contains(&took), "a wake reached the loop {took} ms after the gate's call");
        assert!(after.wake_max_ms >= after.wake_ms);
        eprintln!("wake to loop: {took:.3} ms (not asserted beyond < 500 ms: the machine's figure)");
        // The daemon's CPU with softirq separated (issue 25, item 4): the tracer's
        // softirq pair is attached for this process (it runs in the root PID
        // namespace here), and what it counted is part of the daemon's CPU time.
        let softirq = after.daemon_softirq_secs.expect("softirq time is counted");
        assert!(softirq <= after.daemon_cpu_secs, "softirq {softirq} s of {} s", after.daemon_cpu_secs);
        eprintln!(
            "daemon CPU {:.3} s, softirq in its threads {softirq:.4} s (not asserted: the machine's)",
            after.daemon_cpu_secs
        );
    }

    /// The status once the loop ticks calmly after a second and more of the
    /// clients' packets to port 7100.
    fn wait_calm(tb: &Testbed) -> sluice::surface::stats::Snapshot {
        let deadline = Instant::now() + Duration::from_secs(6);
        loop {
            let st = tb.status();
            let seen: u64 = st.classes.iter().filter(|c| c.name.contains("7100")).map(|c| c.totals.seen_pkts).sum();
            if st.tick_ms.is_some_and(|t| t >= 100.0) && seen > 3000 {
                return st;
            }
            assert!(Instant::now() < deadline, "never calm with 2000 packets/s: tick {:?} ms", st.tick_ms);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A service with a steady load it keeps up with costs the slow tick
    /// too: its auto class is not near its knee however its first ticks
    /// estimated the capacity (it used to keep the loop at 10 ms for good);
    /// and a flood of that class far faster than its calm rate wakes the
    /// loop before it reaches the count mark.
    #[test]
    fn a_service_with_steady_clients_lets_the_daemon_tick_slowly() {
        let mut tb = Testbed::new();
        tb.start_sink(7100, 16.0);
        tb.start_gate(&[]);
        std::thread::scope(|s| {
            let tb = &tb;
            let sender = s.spawn(move || tb.send(7100, 2000, 14.0));
            let calm = wait_calm(tb);
            let class = calm.classes.iter().find(|c| c.name.contains("7100")).expect("the sink's class");
            assert!(class.auto.is_some(), "discovered as an auto class: {class:?}");
            // 600 packets at 80k/s on the clients' CPU (a whole batch of 256
            // among them): under the count mark (twice a calm tick's 1,000,
            // armed at every calm tick: 1,000 left at the least), over the
            // rate mark (a batch in under 10 ms): the rate wakes it. A burst
            // the sender could not get out in time (tests share 2 CPUs: a
            // preempted sender stops at its deadline with fewer packets), or
            // one sent while the loop was not calm, proves nothing either
            // way: it is tried again, up to 3 bursts in all.
            let mut tries = Vec::new();
            let woke = (0..3).any(|_| {
                let before = wait_calm(tb);
                let (n, secs) = tb.send(7100, 80_000, 0.0075);
                std::thread::sleep(Duration::from_millis(1200));
                let after = tb.status();
                tries.push(format!("{n} packets in {:.1} ms", secs * 1e3));
                after.wakes > before.wakes
            });
            assert!(woke, "a burst at 40 times the calm rate did not wake the loop: {tries:?}");
            let (sent, _) = sender.join().unwrap();
            assert!(sent > 0);
        });
    }
}
