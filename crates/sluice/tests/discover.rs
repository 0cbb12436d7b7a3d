//! Zero configuration and the budget, end to end: `sluice run --iface IFACE`
//! alone, in a namespace this test makes, finds the services listening there
//! and follows them; a service in distress gets the classes below it throttled.
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::testbed::{load, Testbed};
use sluice::surface::stats::{ClassSnapshot, Snapshot};
use sluice_testkit::testbed::one_at_a_time;

/// Poll the daemon's status until `ok` holds (or panic after `secs`).
/// The tests here that flood or hog a CPU take turns (`one_at_a_time`): the
/// harness runs two at once, and a flood beside another test cost that
/// test's service datagrams at its socket (98.7-99.7% received against
/// the 99.9% asserted, in 4 whole-binary runs of 6 of the build that
/// brought this lock and 2 of 3 of the build before) and its CPU backlog
/// drops.
static LOADS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn wait_for(tb: &Testbed, secs: u64, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = tb.status();
        if ok(&s) {
            return s;
        }
        let names: Vec<_> = s.classes.iter().map(|c| (c.name.clone(), c.priority)).collect();
        assert!(Instant::now() < deadline, "{what}: not within {secs} s; classes {names:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn class<'a>(s: &'a Snapshot, suffix: &str) -> Option<&'a ClassSnapshot> {
    s.classes.iter().find(|c| c.name.ends_with(suffix))
}

/// A TCP listener (python3) in namespace `ns` on `port`, for `secs`.
fn tcp_listener(tb: &mut Testbed, port: u16, secs: u32) -> u32 {
    let code = format!(
        "import socket,time\ns=socket.socket(socket.AF_INET6)\ns.bind(('::',{port}))\ns.listen(64)\ntime.sleep({secs})"
    );
    let ns = tb.b.clone();
    tb.spawn_cmd(&ns, &["python3", "-c", &code])
}

#[test]
fn zero_config_gives_each_listening_service_a_class_and_follows_it() {
    let mut tb = Testbed::new();
    tb.start_gate(&[]);
    let s = tb.status();
    assert!(s.discover);
    assert_eq!(s.classes.len(), 1, "an empty namespace has the default class alone: {:?}", s.classes);
    // A UDP service at nice 5 and a TCP listener at nice 0.
    let ns = tb.b.clone();
    let udp = tb.spawn_cmd(
        &ns,
        &["nice", "-n", "5", load(), "serve", "udp-echo", "--port", "7100", "--no-echo", "--duration", "30"],
    );
    let tcp = tcp_listener(&mut tb, 7200, 30);
    let s = wait_for(&tb, 4, "both services discovered", |s| {
        class(s, "/udp:7100").is_some() && class(s, "/tcp:7200").is_some()
    });
    let u = class(&s, "/udp:7100").unwrap();
    assert_eq!(u.name, "sluice-bench/udp:7100");
    assert_eq!(u.priority, 25, "20 + nice 5");
    assert!(u.discovered.as_deref().unwrap().contains("nice 5"), "{:?}", u.discovered);
    assert!(u.limit.starts_with("auto"), "{}", u.limit);
    assert_eq!(class(&s, "/tcp:7200").unwrap().priority, 20);
    // The default class stays last and lowest.
    let d = s.classes.iter().find(|c| c.is_default).unwrap();
    assert_eq!((d.name.as_str(), d.priority), ("default", 255));
    // Traffic to the service lands in its class; to a closed port, in the default class.
    let (to_svc, _) = tb.send(7100, 2_000, 1.0);
    // The closed port answers with ICMP errors, which may cut the sender's count: use what it sent.
    let (to_closed, _) = tb.send(7999, 2_000, 1.0);
    let s = wait_for(&tb, 3, "counted", |s| {
        class(s, "/udp:7100").unwrap().totals.seen_pkts >= to_svc
            && s.classes.iter().find(|c| c.is_default).unwrap().totals.seen_pkts >= to_closed
    });
    assert!(to_svc > 1_000 && to_closed > 0, "sent {to_svc} and {to_closed}");
    let kept = class(&s, "/udp:7100").unwrap().totals.seen_pkts;
    // A change of nice is followed.
    assert!(Command::new("renice")
        .args(["-n", "-5", "-p", &tcp.to_string()])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success());
    wait_for(&tb, 3, "the renice followed", |s| class(s, "/tcp:7200").is_some_and(|c| c.priority == 15));
    // The surviving class kept its counters through the class list changes.
    assert!(class(&tb.status(), "/udp:7100").unwrap().totals.seen_pkts >= kept);
    // A service that goes away loses its class (after the linger time).
    tb.signal(udp, libc::SIGTERM);
    wait_for(&tb, 8, "the closed service's class removed", |s| class(s, "/udp:7100").is_none());
}

#[test]
fn no_discover_turns_discovery_off() {
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    tb.spawn_cmd(&ns, &[load(), "serve", "udp-echo", "--port", "7100", "--no-echo", "--duration", "20"]);
    std::thread::sleep(Duration::from_millis(300));
    tb.start_gate(&["--no-discover"]);
    std::thread::sleep(Duration::from_millis(1500));
    let s = tb.status();
    assert!(!s.discover);
    assert_eq!(s.classes.len(), 1, "{:?}", s.classes);
}

/// A service that binds and closes its port a hundred times a second: the
/// daemon keeps running, the class list does not flap (the linger time), and
/// a steady service's class keeps counting. The port is bound half the time
/// and discovery looks once a second, so one look misses it with odds 1/2:
/// the test waits for up to 12 looks (a miss of all has odds 1/4096).
#[test]
fn a_churning_service_neither_crashes_the_daemon_nor_flaps_its_class() {
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    tb.spawn_cmd(&ns, &[load(), "serve", "udp-echo", "--port", "7100", "--no-echo", "--duration", "30"]);
    let pid = tb.start_gate(&[]);
    let churn = "import socket,time\nend=time.time()+20\nwhile time.time()<end:\n s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n s.bind(('0.0.0.0',7300))\n time.sleep(0.005)\n s.close()\n time.sleep(0.005)";
    tb.spawn_cmd(&ns, &["python3", "-c", churn]);
    wait_for(&tb, 12, "the churning service discovered", |s| class(s, "/udp:7300").is_some());
    let mut last = 0;
    for _ in 0..8 {
        tb.send(7100, 1_000, 0.3);
        let s = tb.status();
        assert!(class(&s, "/udp:7300").is_some(), "the churning class flapped away");
        let seen = class(&s, "/udp:7100").expect("the steady class stays").totals.seen_pkts;
        assert!(seen >= last, "counters went back: {seen} < {last}");
        last = seen;
    }
    // 2,400 sent: all but the last second's are counted once the statistics
    // catch up (a daemon ticking calmly beside steady traffic publishes them
    // once a second).
    let steady = |s: &Snapshot| class(s, "/udp:7100").is_some_and(|c| c.totals.seen_pkts > 2_000);
    wait_for(&tb, 3, "the steady class's packets counted", steady);
    assert!(tb.is_running(pid), "the daemon died");
}

/// Issue 48, item 1: a uid-nobody process on the host sends datagrams over
/// loopback to root's slow UDP service (priority 20), from that service's
/// CPU. Its socket drops all the time and its CPU's softirq time climbs,
/// yet nothing of it crosses the gate: no other class's limit moves, and the
/// UDP service below it (nice 5, priority 25), fed over the gate, keeps its
/// datagrams. The build before this rule throttled the service below to
/// 100/s on the slow service's socket drops.
#[test]
fn a_local_process_flooding_another_users_socket_throttles_no_one() {
    let _turn = one_at_a_time(&LOADS);
    let mut tb = Testbed::new();
    tb.start_gate(&[]);
    let ns = tb.b.clone();
    // 1 ms of CPU per datagram: about 1,000/s at most; it outlives the
    // lower service, so its socket is there to read after the send.
    let slow_secs = (LOWER_SECS + 2.0).to_string();
    let slow_args =
        ["serve", "udp-echo", "--port", "123", "--no-echo", "--work-ns", "1000000", "--duration", &slow_secs];
    let slow = tb.spawn_load(&ns, &slow_args);
    pin(slow, 0);
    let (svc, svc_start) = lower_service(&mut tb);
    // Off the hog's CPU: what the hog's own CPU time costs the lower
    // service is its CPU's, not the gate's.
    pin(svc, 1);
    wait_for(&tb, 4, "both services discovered", |s| {
        class(s, "/udp:7100").is_some_and(|c| c.priority == 25)
            && class(s, "/udp:123").is_some_and(|c| c.priority == 20)
    });
    let drops_before = socket_drops(&tb, 123);
    // Bounded in time (6 s) and sent only to 127.0.0.1 inside B.
    let hog = "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nd=('127.0.0.1',123)\nend=time.time()+6\nwhile time.time()<end:\n for i in range(500): s.sendto(b'x'*18,d)";
    let runas = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
    tb.spawn_cmd(&ns, &[&["taskset", "-c", "0"][..], &runas, &["/usr/bin/python3", "-c", hog]].concat());
    std::thread::sleep(Duration::from_millis(1000));
    // 3,000/s over the gate: enough that a lower class charged with the
    // loopback's softirq work (3,000 x 50 us = 15% of a CPU) would read as distress.
    let (sent, _) = tb.send(7100, 3_000, 3.0);
    let sent_by = sent_in_time(svc_start);
    // Read while both services run.
    let drops = socket_drops(&tb, 123).saturating_sub(drops_before);
    let svc_drops = socket_drops(&tb, 7100);
    let during = wait_for(&tb, 3, "the send counted", |s| class(s, "/udp:7100").unwrap().totals.seen_pkts >= sent);
    let gate_drops = class(&during, "/udp:7100").unwrap().totals.dropped_pkts();
    let got = tb.sink_received(svc);
    let lim = |c: &ClassSnapshot| (c.name.clone(), c.limit.clone(), c.throttle_pps);
    let limits: Vec<_> = during.classes.iter().map(lim).collect();
    eprintln!(
        "sent {sent} (ended {sent_by:.1} s in), received {got}, dropped by the gate {gate_drops}, \
         at port 7100's socket {svc_drops}, port 123 socket drops +{drops}, budget {:?} (last {:?}), limits {limits:?}",
        during.distress, during.last_distress
    );
    assert_eq!(gate_drops, 0, "the gate dropped the lower service's datagrams");
    assert!(drops > 1_000, "the local process did not make port 123 drop ({drops}): the test shows nothing");
    for c in &during.classes {
        assert_eq!(c.throttle_pps, None, "class {} throttled by the budget ({:?})", c.name, during.distress);
    }
    assert_eq!(during.last_distress, None, "nothing crossing the gate caused distress");
    assert!(got as f64 >= 0.999 * sent as f64, "the lower service lost datagrams: {got} of {sent}");
}

/// Issue 49, item 1: a login user or nobody binding 64 UDP ports pushed
/// discovery past its class table, and every class was renamed
/// (`sluice-bench.p20/ports`): a fresh gate id, counters zeroed, its
/// controller and known clients reset. The users' ports now share one
/// class, and root's service keeps its name, gate id and counters.
#[test]
fn a_local_user_binding_many_ports_renames_no_class() {
    let mut tb = Testbed::new();
    tb.start_gate(&[]);
    let ns = tb.b.clone();
    tb.spawn_load(&ns, &["serve", "udp-echo", "--port", "7100", "--no-echo", "--duration", "20"]);
    wait_for(&tb, 4, "the service discovered", |s| class(s, "/udp:7100").is_some());
    let (sent, _) = tb.send(7100, 2_000, 0.5);
    let s = wait_for(&tb, 3, "counted", |s| class(s, "/udp:7100").unwrap().totals.seen_pkts >= sent);
    let before = class(&s, "/udp:7100").unwrap().clone();
    // Bounded: the ports are held for 6 s.
    let binds = "import socket,time\nss=[]\nfor p in range(20000,20064):\n s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n s.bind(('0.0.0.0',p))\n ss.append(s)\ntime.sleep(6)";
    tb.spawn_cmd(
        &ns,
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", binds],
    );
    let s = wait_for(&tb, 4, "the user's 64 ports discovered", |s| {
        s.classes
            .iter()
            .any(|c| c.discovered.as_deref().is_some_and(|d| d.starts_with("64 ports") || d.contains("(64 ports")))
    });
    let names: Vec<_> = s.classes.iter().map(|c| c.name.as_str()).collect();
    let after = class(&s, "/udp:7100").unwrap_or_else(|| panic!("root's service lost its class: {names:?}"));
    assert_eq!(after.gate_id, before.gate_id, "a new gate id: its state reset ({names:?})");
    assert!(after.totals.seen_pkts >= before.totals.seen_pkts, "its counters went back");
    let users = s.classes.iter().find(|c| c.name == sluice::signals::discover::USERS_CLASS).expect("the users' class");
    assert_eq!(users.priority, sluice::signals::discover::UNTRUSTED_PRIORITY);
    assert_eq!(s.classes.len(), 3, "root's service, the users' class and the default class: {names:?}");
}

/// How long the lower service of the two local-trouble tests listens.
/// Discovery, the hog's second and the 3 s send take 5-8 s on a loaded host;
/// a sink that stops first loses the send's tail, and that is what two
/// fresh-clone CI runs saw with a 7 s sink (75 and 40 of 8999 lost, the last
/// 25 and 13 ms of the send, no class throttled).
const LOWER_SECS: f64 = 14.0;

/// The UDP service at nice 5 (priority 25) on B's port 7100, a sink for
/// `LOWER_SECS`; returns its pid and when it started.
fn lower_service(tb: &mut Testbed) -> (u32, Instant) {
    let ns = tb.b.clone();
    let start = Instant::now();
    let secs = LOWER_SECS.to_string();
    let svc = tb.spawn_load(&ns, &["serve", "udp-echo", "--port", "7100", "--no-echo", "--json", "--duration", &secs]);
    renice(svc, 5);
    (svc, start)
}

/// Seconds from the lower service's start to the send's end, checked to
/// leave it a second of listening: a late send is the test's timing, not
/// the gate's loss.
fn sent_in_time(svc_start: Instant) -> f64 {
    let by = svc_start.elapsed().as_secs_f64();
    assert!(by < LOWER_SECS - 1.0, "the send ended {by:.1} s after the sink started, too near its {LOWER_SECS} s");
    by
}

/// Pin a running process (all its threads) to `cpu`.
fn pin(pid: u32, cpu: u32) {
    let mut t = Command::new("taskset");
    t.args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()]).stdout(Stdio::null());
    assert!(t.status().unwrap().success());
}

/// The drops so far of the UDP sockets bound to `port` in the test's server
/// namespace (`ss`'s skmem `d` field).
fn socket_drops(tb: &Testbed, port: u16) -> u64 {
    let out = tb.cmd(&tb.b, &["ss", "-uamnH", "sport", "=", &format!(":{port}")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(|c: char| c == ',' || c == '(' || c == ')' || c.is_whitespace())
        .filter_map(|f| f.strip_prefix('d').and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// A process of an unprivileged user that listens with backlog 0 on
/// loopback, never accepts and keeps connecting to itself: its listen queue
/// overflows all the time (the namespace's ListenOverflows climbs by tens of
/// thousands a second), and nothing of it crosses the gate. That is its own
/// listener's trouble: no other class's limit moves, and a UDP service of
/// lower priority than root's idle TCP listener keeps its datagrams.
#[test]
fn a_local_listener_that_never_accepts_throttles_no_one() {
    let _turn = one_at_a_time(&LOADS);
    let mut tb = Testbed::new();
    tb.start_gate(&[]);
    let ns = tb.b.clone();
    // Root's TCP listener at nice 0 (priority 20) serves nothing; the UDP
    // service at nice 5 (priority 25) is below it.
    tcp_listener(&mut tb, 7200, 30);
    let (svc, svc_start) = lower_service(&mut tb);
    wait_for(&tb, 4, "both services discovered", |s| {
        class(s, "/udp:7100").is_some_and(|c| c.priority == 25) && class(s, "/tcp:7200").is_some()
    });
    let hog = "import socket,time\nl=socket.socket()\nl.bind(('127.0.0.1',0))\nl.listen(0)\nport=l.getsockname()[1]\nheld=[]\nend=time.time()+8\nwhile time.time()<end:\n c=socket.socket()\n c.setblocking(False)\n try: c.connect(('127.0.0.1',port))\n except BlockingIOError: pass\n held.append(c)\n if len(held)>200: held.pop(0).close()";
    let before = listen_overflows(&tb);
    tb.spawn_cmd(&ns, &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", hog]);
    std::thread::sleep(Duration::from_millis(1000));
    let (sent, _) = tb.send(7100, 2_000, 3.0);
    sent_in_time(svc_start);
    let during = tb.status();
    let got = tb.sink_received(svc);
    let grew = listen_overflows(&tb) - before;
    eprintln!("sent {sent}, received {got}, ListenOverflows +{grew}, budget {:?}", during.distress);
    assert!(grew > 1_000, "the hog did not overflow its listen queue ({grew}): the test shows nothing");
    for c in &during.classes {
        assert_eq!(c.throttle_pps, None, "class {} throttled by the budget ({:?})", c.name, during.distress);
    }
    assert!(got as f64 >= 0.999 * sent as f64, "the lower service lost datagrams: {got} of {sent}");
}

/// Set a running process's nice value.
fn renice(pid: u32, nice: i32) {
    let mut renice = Command::new("renice");
    renice.args(["-n", &nice.to_string(), "-p", &pid.to_string()]).stdout(Stdio::null());
    assert!(renice.status().unwrap().success());
}

/// TcpExt ListenOverflows of the test's server namespace.
fn listen_overflows(tb: &Testbed) -> u64 {
    let out = tb.cmd(&tb.b, &["cat", "/proc/net/netstat"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    sluice::signals::procfs::proc_counter(&text, "TcpExt:", "ListenOverflows")
}

/// The CPU signal: a TCP service that keeps its CPU busy and never lets a
/// queue stand, on the CPU where the receive path's stack work lands (RPS,
/// as a NIC's queue would), beside a UDP flood to a closed port. No socket
/// of it shows distress; the flood's softirq work on its CPU does, and the
/// budget throttles the default class for it. Status names the signal.
#[test]
fn receive_work_on_a_services_cpu_is_its_distress() {
    let _turn = one_at_a_time(&LOADS);
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    // The stack work of everything B receives runs on CPU 0, where the service runs.
    let rps = format!("/sys/class/net/{}/queues/rx-0/rps_cpus", tb.if_b);
    assert!(tb.cmd(&ns, &["sh", "-c", &format!("echo 1 > {rps}")]).status().unwrap().success());
    let busy = "import socket,time\ns=socket.socket()\ns.bind(('0.0.0.0',7200))\ns.listen(64)\nend=time.time()+25\nwhile time.time()<end: pass";
    tb.spawn_cmd(&ns, &["taskset", "-c", "0", "python3", "-c", busy]);
    tb.start_gate(&[]);
    wait_for(&tb, 4, "the service discovered", |s| class(s, "/tcp:7200").is_some());
    let before = tb.status();
    assert!(before.rx_measured, "the daemon reads the receive work per CPU (its tracer loaded)");
    assert_eq!((before.distress, before.last_distress), (None, None), "no flood: no distress");
    // The flood from A's CPU 1: B's stack work for it lands on CPU 0 by RPS.
    // Status is read while it lasts (the signal is the present's).
    let flood = flood_closed_port(&tb, 1, 200_000, 3);
    std::thread::sleep(Duration::from_millis(2000));
    let s = tb.status();
    assert!(flood.join().unwrap().status.success());
    let d = s.classes.iter().find(|c| c.is_default).unwrap();
    let svc = class(&s, "/tcp:7200").unwrap();
    eprintln!(
        "default {:?}; distress {:?} (last {:?}); service taken {:?}, at most {:?}",
        d.totals, s.distress, s.last_distress, svc.rx_cpu_taken, svc.rx_cpu_taken_max
    );
    assert!(d.totals.seen_pkts > 50_000, "the flood arrived: {:?}", d.totals);
    assert!(
        (d.totals.admitted_pkts as f64) < 0.5 * d.totals.seen_pkts as f64,
        "the default class was not throttled for the busy service: {:?}",
        d.totals
    );
    assert!(d.throttle_pps.is_some(), "the budget throttles it");
    // The CPU signal crossed its mark. Status names the last distress seen:
    // that is the CPU signal, or where CPU 0 could not keep up (a busy CI
    // host, the other tests of this file running beside it) the backlog's
    // drops the same flood caused after it (one run in 17 fresh clones).
    let taken = svc.rx_cpu_taken_max.unwrap_or(0.0);
    assert!(taken > sluice::policy::budget::CPU_TAKEN, "the flood's receive work took {taken} of the service's CPU");
    let named = s.distress.as_ref().or(s.last_distress.as_ref().map(|(d, _)| d));
    assert!(
        named.is_some_and(|w| w.contains(sluice::policy::budget::CPU_REASON) || w.contains("backlog drops")),
        "status names the CPU signal: {:?} (last {:?})",
        s.distress,
        s.last_distress
    );
    assert!(svc.distress_secs.is_some_and(|d| d > 0.0), "the service's distress is counted: {:?}", svc.distress_secs);
}

/// The CPU signal's bad input: a service that appears in the middle of a
/// flood is protected once discovery and the look at its CPUs find it (a
/// second or two), and one that goes away mid-flood is no longer measured
/// (its threads are gone: no CPU), so nothing is cut for it any more.
#[test]
fn a_service_that_appears_and_goes_mid_flood_is_followed_by_the_cpu_signal() {
    let _turn = one_at_a_time(&LOADS);
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    let rps = format!("/sys/class/net/{}/queues/rx-0/rps_cpus", tb.if_b);
    assert!(tb.cmd(&ns, &["sh", "-c", &format!("echo 1 > {rps}")]).status().unwrap().success());
    tb.start_gate(&[]);
    let flood = flood_closed_port(&tb, 1, 200_000, 11);
    std::thread::sleep(Duration::from_millis(1000));
    let alone = tb.status();
    assert_eq!(alone.distress, None, "no service yet: the flood to a closed port is nobody's distress");
    // 6 s of work, found and protected within as long: discovery looks once
    // a second, and a loaded CI host (this file's other tests run beside it)
    // took over the 4 s once given 3.
    let busy = "import socket,time\ns=socket.socket()\ns.bind(('0.0.0.0',7200))\ns.listen(64)\nend=time.time()+6\nwhile time.time()<end: pass";
    let svc = tb.spawn_cmd(&ns, &["taskset", "-c", "0", "python3", "-c", busy]);
    let s = wait_for(&tb, 6, "the new service protected", |s| {
        class(s, "/tcp:7200")
            .is_some_and(|c| c.rx_cpu_taken_max.is_some_and(|t| t >= sluice::policy::budget::CPU_TAKEN))
            && s.classes.iter().find(|c| c.is_default).is_some_and(|d| d.throttle_pps.is_some())
    });
    eprintln!("appeared: taken max {:?}", class(&s, "/tcp:7200").unwrap().rx_cpu_taken_max);
    // The service ends (its 6 s are up): no thread, no CPU, no measurement.
    assert!(tb.wait(svc).status.success());
    wait_for(&tb, 3, "the gone service no longer measured", |s| {
        class(s, "/tcp:7200").is_none_or(|c| c.rx_cpu_taken.is_none())
    });
    assert!(flood.join().unwrap().status.success());
}

/// A UDP flood from A (the sender pinned to `cpu`) to B's closed port 7999
/// at `rate` for `secs`, on a thread; join it for the sender's output.
fn flood_closed_port(tb: &Testbed, cpu: u32, rate: u64, secs: u32) -> std::thread::JoinHandle<std::process::Output> {
    tb.send_on_thread(cpu, 7999, rate, f64::from(secs))
}

/// One run of `observe_predicts_enforcing`'s scenario: (the service
/// class's drops / its packets, the default class's), counted by the gate
/// (in observe mode: what it would have dropped).
fn service_beside_a_closed_port_flood(observe: bool) -> (f64, f64) {
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    // The stack work of everything B receives runs on CPU 0, where the service runs.
    let rps = format!("/sys/class/net/{}/queues/rx-0/rps_cpus", tb.if_b);
    assert!(tb.cmd(&ns, &["sh", "-c", &format!("echo 1 > {rps}")]).status().unwrap().success());
    let svc = ["taskset", "-c", "0", load(), "serve", "udp-echo", "--port", "7100", "--no-echo"];
    tb.spawn_cmd(&ns, &[&svc[..], &["--work-ns", "20000", "--duration", "12"]].concat());
    std::thread::sleep(Duration::from_millis(300));
    let mut args = vec!["--no-discover", "--class", "svc:priority=0,rate=auto,match=udp:7100"];
    if observe {
        args.push("--observe");
    }
    tb.start_gate(&args);
    let flood = flood_closed_port(&tb, 1, 1_000_000, 4);
    tb.send(7100, 30_000, 4.0);
    assert!(flood.join().unwrap().status.success());
    let s = tb.status();
    let share =
        |c: &sluice::surface::stats::ClassSnapshot| c.totals.dropped_pkts() as f64 / c.totals.seen_pkts.max(1) as f64;
    let (svc, d) = (class(&s, "svc").unwrap(), s.classes.iter().find(|c| c.is_default).unwrap());
    eprintln!(
        "observe {observe}: svc {:?}\n  default {:?}\n  distress {:?} last {:?}",
        svc.totals, d.totals, s.distress, s.last_distress
    );
    assert!(svc.totals.seen_pkts > 20_000, "the clients' datagrams arrived: {:?}", svc.totals);
    (share(svc), share(d))
}

/// Hardening (issue 35, item 15): observe mode predicts what enforcing
/// does. A service pinned to the CPU where a closed-port flood's stack work
/// lands: enforcing, the budget throttles the flood's (default) class and
/// the service keeps its clients; observing, the flood still reaches the
/// stack and the service stays in distress, but its own class must not be
/// shown dropping its clients (the budget's throttles of lower classes come
/// first). The issue saw observe show NSD's class dropping 48% of its
/// queries where enforcing dropped none. On the code before the fix this
/// test failed in one fresh-clone run of eight (observe 35.2% against 0.0%):
/// the flood's class was held at the floor, so the rule that passes a
/// starved service's rate while lower classes get traffic no longer held,
/// and the controller's rate for the unprotected service was counted. The
/// unit tests `observing_a_class_whose_lower_classes_would_be_throttled_*`
/// (tick) and `observing_the_next_level_is_not_cut_*` (budget) fail on it
/// every time.
#[test]
fn observe_mode_predicts_what_enforcing_drops() {
    let _turn = one_at_a_time(&LOADS);
    let (svc_enforced, flood_enforced) = service_beside_a_closed_port_flood(false);
    let (svc_observed, flood_observed) = service_beside_a_closed_port_flood(true);
    println!(
        "service's class dropped {:.1}% enforcing, {:.1}% observed; the flood's {:.1}% enforcing, {:.1}% observed",
        100.0 * svc_enforced,
        100.0 * svc_observed,
        100.0 * flood_enforced,
        100.0 * flood_observed
    );
    assert!(flood_enforced > 0.5 && flood_observed > 0.5, "the flood's class is throttled, and shown so");
    assert!(
        svc_observed <= svc_enforced + 0.02,
        "observe shows the service's class dropping {:.1}% where enforcing dropped {:.1}%",
        100.0 * svc_observed,
        100.0 * svc_enforced
    );
}

/// Merged configs are valid and classify as merged (compiled into the
/// gate's tables and looked up: no kernel needed).
#[test]
fn a_merged_config_compiles_and_sends_each_service_its_packets() {
    use sluice::bpf_intf::SLUICE_SLOT_UDP;
    use sluice::dataplane::classify::{compile, Probe};
    use sluice::signals::discover::{merge, Family, Owner, Service, L4};
    let svc = |l4, port, family, pid: u32, comm: &str, uid| Service {
        l4,
        port,
        owners: vec![Owner { pid, comm: comm.into(), nice: Ok(0), uid }],
        family,
    };
    let base = sluice::policy::config::from_flags(&[]).unwrap();
    let probe = |port, src: &str| Probe { slot: SLUICE_SLOT_UDP, port, src: src.parse().unwrap() };
    // One service a port: port 53 goes to nsd's class.
    let (cfg, _) = merge(
        &base,
        &[svc(L4::Udp, 53, Family::Both, 1, "nsd", Some(0)), svc(L4::Tcp, 22, Family::Both, 2, "sshd", Some(0))],
    );
    let id =
        |cfg: &sluice::policy::config::Config, name: &str| cfg.classes.iter().position(|c| c.name == name).unwrap();
    assert_eq!(compile(&cfg).unwrap().lookup(&probe(53, "10.0.0.1")), id(&cfg, "nsd/udp:53"));
    // A thousand ports, grouped: the tables still hold them.
    let many: Vec<Service> = (0..1000u16)
        .map(|i| {
            svc(L4::Udp, 10_000 + i, Family::Both, 100 + u32::from(i % 3), ["a", "b", "c"][usize::from(i % 3)], Some(0))
        })
        .collect();
    let (cfg, note) = merge(&base, &many);
    assert!(note.grouped);
    compile(&cfg).unwrap();
    // A v6-only bind beside an IPv4 service: each family to its own class.
    let (cfg, _) = merge(
        &base,
        &[svc(L4::Udp, 53, Family::V4, 100, "nsd", Some(0)), svc(L4::Udp, 53, Family::V6, 200, "mine", Some(1000))],
    );
    let t = compile(&cfg).unwrap();
    assert_eq!(t.lookup(&probe(53, "192.0.2.1")), id(&cfg, "nsd/udp4:53"), "IPv4 goes to the IPv4 service");
    assert_eq!(
        t.lookup(&probe(53, "2001:db8::1")),
        id(&cfg, sluice::signals::discover::USERS_CLASS),
        "IPv6 to the v6-only one"
    );
}
