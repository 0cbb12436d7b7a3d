//! SYN cookies at the driver, end to end (issue 22): a real TCP server in
//! namespace B behind the running daemon, curl in A, and a SYN flood from
//! spoofed sources (crafted frames on an AF_PACKET socket in A). Needs root
//! (CI is root) and curl.
//!
//! The gate answers SYNs with XDP_TX: on veth a frame sent that way reaches
//! the peer only if the peer has an XDP program too (GRO on was not enough
//! here), so the tests run a second sluice on A's end. A NIC needs nothing
//! of the kind.
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::tcp::{linux_syn_options, Segment, ACK, RST, SYN};
use common::testbed::{in_netns, Testbed};
use common::trace::wait_for_trace;

const PORT: u16 = 8080;
/// A port whose SYNs the kernel always answers (`syn_cookies = "off"`).
const PLAIN_PORT: u16 = 8081;
/// Bytes each response carries (a 10 MB download).
const BODY: usize = 10 << 20;

/// One test at a time: the floods of one test's namespaces fill the
/// per-CPU backlog every namespace's veth shares, so a test beside one lost
/// segments of its own (a refused connection took 11 s, a download's last
/// ACK never came and curl could not bind its port again).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    sluice_testkit::testbed::one_at_a_time(&ONE_AT_A_TIME)
}

/// What the server saw of each connection: (its send and receive window scales).
type Seen = Arc<Mutex<Vec<(u8, u8)>>>;

/// A server on B's `port` that answers each request with BODY bytes, for
/// `secs`; it records each connection's window scales (TCP_INFO).
fn serve(tb: &Testbed, port: u16, secs: f64) -> Seen {
    let listener = in_netns(&tb.b, move || TcpListener::bind(("0.0.0.0", port)).expect("bind the server"));
    serve_on(listener, secs)
}

/// `serve` on a listener already bound.
fn serve_on(listener: TcpListener, secs: f64) -> Seen {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    accept_for(listener, secs, move |mut s| {
        out.lock().unwrap().push(wscales(&s));
        std::thread::spawn(move || {
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req);
            let _ = s.write_all(format!("HTTP/1.0 200 OK\r\nContent-Length: {BODY}\r\n\r\n").as_bytes());
            let _ = s.write_all(&vec![b'x'; BODY]);
        });
    });
    seen
}

/// Accept connections on `listener` for `secs` on a thread of its own,
/// handing each to `each`.
fn accept_for(listener: TcpListener, secs: f64, mut each: impl FnMut(std::net::TcpStream) + Send + 'static) {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    each(s);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
}

/// A connection's (send, receive) window scale from TCP_INFO.
fn wscales(s: &std::net::TcpStream) -> (u8, u8) {
    // SAFETY: tcp_info is plain data; getsockopt fills at most `len` bytes of it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (info.tcpi_snd_rcv_wscale & 0xf, info.tcpi_snd_rcv_wscale >> 4)
    }
}

/// curl from A to B's PORT: the bytes it downloaded, or None if it failed.
fn curl(tb: &Testbed) -> Option<u64> {
    curl_at(tb, PORT).map(|(bytes, _)| bytes)
}

/// curl from A to B's `port`: the bytes it downloaded and its mean speed
/// (bytes/s), or None if it failed (said on stderr). It may take 30 s: a
/// download during a flood that takes both CPUs can stall on a lost
/// segment's backed-off retransmission (one of five took over 10 s in a CI
/// run once); a whole download is what is asserted, not a time.
fn curl_at(tb: &Testbed, port: u16) -> Option<(u64, f64)> {
    curl_from(tb, port, None)
}

/// As `curl_at`, from A's address `from` (None: its own).
fn curl_from(tb: &Testbed, port: u16, from: Option<&str>) -> Option<(u64, f64)> {
    let url = format!("http://{}:{port}/", tb.ip_b);
    let fmt = "%{size_download} %{speed_download}";
    let mut args = vec!["curl", "-s", "-o", "/dev/null", "--max-time", "30", "-w", fmt];
    if let Some(from) = from {
        args.extend(["--interface", from]);
    }
    args.push(&url);
    let out = tb.cmd(&tb.a, &args).output().expect("curl runs (make deps installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    match (out.status.success(), it.next().flatten(), it.next().flatten()) {
        (true, Some(bytes), Some(speed)) => Some((bytes as u64, speed)),
        _ => {
            eprintln!("curl to port {port} failed: {} ({text}) {}", out.status, String::from_utf8_lossy(&out.stderr));
            None
        }
    }
}

/// The addresses `flood` spoofs: 10.200.x.y.
const FLOOD_SOURCES: &str = "10.200.0.0/16";

/// A flood of `flags` segments (SYN, or ACK or RST of no connection) from A
/// to B's PORT for `secs`: 4096 spoofed sources
/// (FLOOD_SOURCES), random ports, as fast as one thread sends on an
/// AF_PACKET socket. Returns the frames sent.
fn flood(tb: &Testbed, flags: u8, secs: f64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let (mac_b, ifindex) = (tb.mac_b, tb.ifindex_a);
    let fd = in_netns(&tb.a, || {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just opened and is ours.
        unsafe { OwnedFd::from_raw_fd(fd) }
    });
    let ip_b = tb.ip_b.clone();
    std::thread::spawn(move || {
        let frames: Vec<Vec<u8>> = (0..4096u32)
            .map(|i| {
                let mut s = Segment::new(&flood_source(i), &ip_b, 1024 + (i * 7919 % 60000) as u16, PORT, flags);
                s.seq = i.wrapping_mul(2_654_435_761);
                s.ack = i.wrapping_mul(40_503).rotate_left(7);
                if flags == SYN {
                    s.options = linux_syn_options(1460, i);
                }
                let mut f = s.build();
                f[0..6].copy_from_slice(&mac_b);
                f
            })
            .collect();
        // SAFETY: sockaddr_ll is plain data.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut sent = 0u64;
        let to_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        'out: loop {
            for chunk in frames.chunks(256) {
                if Instant::now() >= end || stop.load(Ordering::Relaxed) {
                    break 'out;
                }
                for f in chunk {
                    let to_ptr = (&to as *const libc::sockaddr_ll).cast();
                    // SAFETY: f and to outlive the call; the sizes are theirs.
                    let n = unsafe { libc::sendto(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0, to_ptr, to_len) };
                    sent += u64::from(n > 0);
                }
            }
        }
        sent
    })
}

/// The flood's `i`th source address, counted from the start of FLOOD_SOURCES.
fn flood_source(i: u32) -> String {
    let net = FLOOD_SOURCES.split('/').next().expect("an address, then its prefix length");
    std::net::Ipv4Addr::from(u32::from(net.parse::<std::net::Ipv4Addr>().expect("an IPv4 network")) + i).to_string()
}

/// B's route to the flood's sources, as a server's default route is: without
/// one the kernel drops each SYN of the flood it gets (ListenDrops) and its
/// SYN queue never fills.
fn route_to_the_flood(tb: &Testbed) {
    let route = tb.cmd(&tb.b, &["ip", "route", "add", FLOOD_SOURCES, "dev", tb.if_b]).status().unwrap();
    assert!(route.success(), "ip route add {FLOOD_SOURCES} in B");
}

/// Wait up to 10 s for the gate's first answer to class web's SYNs.
fn until_the_gate_answers(tb: &Testbed) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while web(tb).synack_pkts == 0 {
        assert!(Instant::now() < deadline, "the gate never answered the flood: {:?}", web(tb));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An XDP program on A's end of the veth (a second sluice, passing all):
/// without one, the SYN-ACKs the gate sends back never arrive.
fn peer_xdp(tb: &mut Testbed) {
    let (a, sock, state) = (tb.a.clone(), tb.dir.join("a.sock"), tb.dir.join("a-state"));
    tb.start_sluice(&a, tb.if_a, &sock, &state, &[]);
}

/// Class web's totals (after a pause: the daemon publishes every 100 ms).
fn web(tb: &Testbed) -> sluice::surface::stats::ClassTotals {
    class(tb, "web")
}

/// `syn_cookies = "on"`: every SYN is answered by the gate, and the client
/// gets its download over a connection the listener completed from a gate
/// cookie, with window scaling in effect on both sides; status and
/// `sluice trace` say so.
#[test]
fn a_client_downloads_through_a_connection_made_from_a_gate_cookie() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    let seen = serve(&tb, PORT, 30.0);
    let _plain = serve(&tb, PLAIN_PORT, 30.0);
    let web_spec = format!("web:match=tcp:{PORT},syn_cookies=on");
    tb.start_gate(&["--class", &web_spec, "--class", &format!("plain:match=tcp:{PLAIN_PORT},syn_cookies=off")]);
    std::thread::sleep(Duration::from_millis(300));
    let (b, sock) = (tb.b.clone(), tb.socket());
    let tracer =
        tb.spawn(&b, &["trace", "--iface", tb.if_b, "--socket", sock.to_str().unwrap(), "--duration", "4", "--json"]);
    wait_for_trace();
    let got = curl(&tb);
    let traced = tb.wait(tracer);
    assert!(traced.status.success(), "sluice trace: {}", String::from_utf8_lossy(&traced.stderr));
    let report: serde_json::Value = serde_json::from_slice(&traced.stdout).unwrap();
    let t = web(&tb);
    assert_eq!(got, Some(BODY as u64), "the download arrived whole (totals: {t:?})");
    assert_eq!((t.synack_pkts, t.cookies_valid), (1, 1), "one SYN answered by the gate, its cookie came back");
    let table = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout);
    let line =
        "SYN COOKIES: the gate answers its SYNs now for web (syn_cookies = on); totals since start: SYN-ACKs sent 1, \
         valid cookies back 1";
    assert!(table.contains(line), "{table}");
    let traced = report["classes"].as_array().unwrap().iter().find(|c| c["name"] == "web").expect("web in the trace");
    assert_eq!(traced["gate"]["syn_answered"], 1, "the trace counts the gate's SYN-ACK: {traced}");
    assert_eq!(traced["gate"]["cookies_valid"], 1, "{traced}");
    let (snd, rcv) = seen.lock().unwrap()[0];
    assert!(snd > 0, "the client's window scale is in effect (server sends with scale {snd})");
    assert_eq!(rcv, sluice::bpf_intf::SLUICE_COOKIE_WSCALE as u8, "the scale the gate offered is the listener's");
    download_speeds(&tb);
}

/// The 10 MB download over gate-cookie connections against normal ones,
/// interleaved, five each: every one arrives whole. The ratio of median
/// speeds is printed, not asserted: single downloads of a few ms on a
/// shared 2-CPU VM move by more than the 10% the target allows.
fn download_speeds(tb: &Testbed) {
    let before = web(tb).cookies_valid;
    let (mut gated, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let g = curl_at(tb, PORT).expect("a download through a gate cookie");
        let p = curl_at(tb, PLAIN_PORT).expect("a download over a normal connection");
        assert_eq!((g.0, p.0), (BODY as u64, BODY as u64));
        gated.push(g.1);
        plain.push(p.1);
    }
    assert_eq!(web(tb).cookies_valid, before + 5, "each of web's downloads came through a gate cookie");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (g, p) = (median(&mut gated), median(&mut plain));
    println!(
        "10 MB download, median of 5 interleaved: gate cookie {:.0} MB/s, normal {:.0} MB/s, ratio {:.2} \
         (not asserted: timed; gate {gated:.0?}, normal {plain:.0?} B/s)",
        g / 1e6,
        p / 1e6,
        g / p
    );
}

/// Zero config for SYN cookies (`auto`): no flood, the kernel answers every
/// SYN; a SYN flood makes the gate answer them, and curl's connections
/// during the flood complete from gate cookies.
#[test]
fn under_a_syn_flood_the_gate_answers_and_clients_still_connect() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    let _seen = serve(&tb, PORT, 60.0);
    tb.start_gate(&["--class", &format!("web:match=tcp:{PORT}")]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(curl(&tb), Some(BODY as u64));
    assert_eq!(web(&tb).synack_pkts, 0, "no flood: the kernel answered");
    let stop = Arc::new(AtomicBool::new(false));
    let sender = flood(&tb, SYN, 20.0, stop.clone());
    until_the_gate_answers(&tb);
    let before = web(&tb);
    let ok = (0..5).filter(|_| curl(&tb) == Some(BODY as u64)).count();
    let after = web(&tb);
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().unwrap();
    println!(
        "flood: {sent} SYNs sent; gate answered {}, valid cookies back {}",
        after.synack_pkts, after.cookies_valid
    );
    assert_eq!(ok, 5, "every download during the flood arrived whole ({after:?})");
    assert!(after.cookies_valid >= before.cookies_valid + 5, "through gate cookies: {before:?} -> {after:?}");
    // The server listens on 0.0.0.0: the flood's SYNs skip the socket lookup (issue 37).
    assert!(after.synack_direct > after.synack_pkts / 2, "most answered without the lookup: {after:?}");
}

/// TcpExt counters of B (the server's namespace), by name.
fn tcp_ext(tb: &Testbed, names: [&str; 3]) -> [u64; 3] {
    let out = tb.cmd(&tb.b, &["cat", "/proc/net/netstat"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    names.map(|n| sluice::signals::procfs::proc_counter(&text, "TcpExt:", n))
}

/// Zero config, from the flood's first SYNs: the gate answers once the
/// listener's SYN queue holds half its backlog (bpf/sluice.h,
/// SLUICE_SYN_CHECK_MS), not at the daemon's next tick, so the kernel never
/// sends a cookie of its own nor drops a SYN; downloads during the flood
/// arrive whole. Before (208d568), the queue of 128 (std's listen backlog)
/// overflowed before the daemon engaged the guard: the kernel sent cookies.
#[test]
fn a_syn_flood_is_answered_by_the_gate_from_its_first_syns() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    route_to_the_flood(&tb);
    let _seen = serve(&tb, PORT, 60.0);
    tb.start_gate(&["--class", &format!("web:match=tcp:{PORT}")]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(curl(&tb), Some(BODY as u64));
    assert_eq!(web(&tb).synack_pkts, 0, "no flood: the kernel answered");
    let names = ["SyncookiesSent", "ListenOverflows", "ListenDrops"];
    let before = tcp_ext(&tb, names);
    let stop = Arc::new(AtomicBool::new(false));
    let sender = flood(&tb, SYN, 20.0, stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let ok = (0..3).filter(|_| curl(&tb) == Some(BODY as u64)).count();
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().unwrap();
    let after = tcp_ext(&tb, names);
    let t = web(&tb);
    println!(
        "flood: {sent} SYNs sent; the gate answered {} ({} before its guard engaged); kernel {names:?} {before:?} -> {after:?}",
        t.synack_pkts, t.synack_early
    );
    assert!(t.synack_pkts > sent / 2, "the gate answered the flood: {t:?}");
    assert!(t.synack_early > 0, "the first ones before its guard engaged, counted early: {t:?}");
    assert_eq!(after[..2], before[..2], "the kernel sent no cookie of its own, its queue never overflowed: {names:?}");
    // A few the kernel drops on its own (a SYN racing its request socket's expiry): not the queue's.
    assert!(after[2] - before[2] <= sent / 1000, "ListenDrops {before:?} -> {after:?} of {sent} SYNs");
    assert_eq!(ok, 3, "every download during the flood arrived whole ({t:?})");
}

/// A listener that goes away and comes back while the guard answers a SYN
/// flood (a service restarting mid-flood): with no listener a client is
/// refused (the gate leaves its SYN, or the ACK of a cookie it answered
/// without the lookup, to the kernel, which resets it), and the restarted
/// listener serves again.
#[test]
fn a_listener_that_restarts_mid_flood_refuses_then_serves_again() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    route_to_the_flood(&tb);
    let _first = serve(&tb, PORT, 4.0);
    tb.start_gate(&["--class", &format!("web:match=tcp:{PORT}")]);
    std::thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = flood(&tb, SYN, 30.0, stop.clone());
    until_the_gate_answers(&tb);
    assert_eq!(curl(&tb), Some(BODY as u64), "served during the flood");
    // The first listener's accept thread ends 4 s after it started: the listener closes.
    std::thread::sleep(Duration::from_secs(5));
    let t = Instant::now();
    let gone = curl(&tb);
    let refused_in = t.elapsed();
    let _second = serve(&tb, PORT, 30.0);
    let before = web(&tb);
    let back = curl(&tb);
    let after = web(&tb);
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    assert_eq!(gone, None, "no listener: no download");
    // Not asserted: under the test's own flood a SYN or its RST may be lost
    // and retried (1, 3, 7 s: a CI run took 11.3 s).
    println!("refused after {refused_in:?} (not asserted)");
    assert_eq!(back, Some(BODY as u64), "the restarted listener serves ({after:?})");
    // Through a gate cookie or the kernel's path, by timing: a refusal that
    // took over 5 s lets the guard go (nothing answered), and the new
    // listener's empty queue takes the next SYN itself. Printed, not asserted.
    println!("gate cookies taken during the second download: {}", after.cookies_valid - before.cookies_valid);
}

/// Zero config: a flood of ACKs (then, on a fresh testbed, of RSTs) of no
/// connection to the open port, with no SYN flood at all, engages the guard
/// from the kernel's drops (TCP_FLAGS, TCP_RESET); the gate then drops them
/// itself, and curl's downloads during the flood arrive whole.
#[test]
fn an_ack_or_rst_flood_alone_is_dropped_at_the_gate_and_clients_still_connect() {
    let _one = one_at_a_time();
    for (name, flags) in [("ACK", ACK), ("RST", RST)] {
        let mut tb = Testbed::new();
        peer_xdp(&mut tb);
        let _seen = serve(&tb, PORT, 60.0);
        tb.start_gate(&["--class", &format!("web:match=tcp:{PORT}")]);
        std::thread::sleep(Duration::from_millis(300));
        let stop = Arc::new(AtomicBool::new(false));
        let sender = flood(&tb, flags, 20.0, stop.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while web(&tb).dropped_noconn_pkts == 0 {
            assert!(Instant::now() < deadline, "{name} flood: the gate never took it: {:?}", web(&tb));
        }
        let before = web(&tb);
        let ok = (0..3).filter(|_| curl(&tb) == Some(BODY as u64)).count();
        let after = web(&tb);
        stop.store(true, Ordering::Relaxed);
        let sent = sender.join().unwrap();
        let guard = tb.status().classes.into_iter().find(|c| c.name == "web").and_then(|c| c.syn_guard);
        let cost = guard.and_then(|g| g.stray_ns).map_or("not measured".into(), |ns| format!("{ns:.0} ns"));
        println!(
            "{name} flood: {sent} sent; the gate dropped {} of no connection; a stray's cost to the kernel \
             when it engaged: {cost} (printed, not asserted: timed)",
            after.dropped_noconn_pkts
        );
        assert_eq!(ok, 3, "{name} flood: every download arrived whole ({after:?})");
        assert!(after.dropped_noconn_pkts > before.dropped_noconn_pkts, "{name}: still dropped at the gate: {after:?}");
    }
}

/// Another address on A's interface, in A's /24, ending in `last`; returned.
fn fresh_address_in_a(tb: &Testbed, last: u8) -> String {
    let mut o = tb.ip_a.parse::<std::net::Ipv4Addr>().expect("A's IPv4 address").octets();
    o[3] = last;
    let addr = std::net::Ipv4Addr::from(o).to_string();
    let st = tb.cmd(&tb.a, &["ip", "addr", "add", &format!("{addr}/24"), "dev", tb.if_a]).status().unwrap();
    assert!(st.success(), "adding {addr} in A");
    addr
}

/// Write `value` to `/proc/sys/net/ipv4/NAME` inside B (the server's namespace).
fn sysctl_b(tb: &Testbed, name: &str, value: u32) {
    let path = format!("/proc/sys/net/ipv4/{name}");
    let st = tb.cmd(&tb.b, &["sh", "-c", &format!("echo {value} > {path}")]).status().unwrap();
    assert!(st.success(), "writing {path} in B");
}

/// Hardening (issue 35, item 1): the kernel's bpf_sk_assign_tcp_reqsk
/// refuses a request socket with an option the listener's namespace has
/// turned off. The gate's SYN-ACKs offer only what the namespace takes, the
/// daemon notices a change while it runs, and every download through a gate
/// cookie arrives. Before, with `tcp_sack = 0` curl fetched none of them
/// while status counted each cookie valid.
#[test]
fn gate_cookies_offer_only_the_options_the_namespace_takes() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    let _seen = serve(&tb, PORT, 90.0);
    tb.start_gate(&["--class", &format!("web:match=tcp:{PORT},syn_cookies=on")]);
    std::thread::sleep(Duration::from_millis(300));
    for (i, name) in ["tcp_sack", "tcp_timestamps", "tcp_window_scaling"].into_iter().enumerate() {
        sysctl_b(&tb, name, 0);
        // Each round's client is new to the gate: one answered over a second
        // becomes a known client, whose SYNs take the kernel's path, not a
        // cookie (one run in five failed so, the third round counting 1).
        let from = fresh_address_in_a(&tb, 200 + i as u8);
        // The daemon reads the namespace's TCP settings once a second.
        std::thread::sleep(Duration::from_millis(1500));
        let before = web(&tb);
        let ok = (0..3).filter(|_| curl_from(&tb, PORT, Some(&from)).map(|(b, _)| b) == Some(BODY as u64)).count();
        let after = web(&tb);
        sysctl_b(&tb, name, 1);
        assert_eq!(ok, 3, "{name} = 0: every download through a gate cookie arrived ({after:?})");
        assert_eq!(after.cookies_valid - before.cookies_valid, 3, "{name} = 0: three valid cookies, taken");
        assert_eq!(after.cookies_refused, 0, "{name} = 0: the kernel refused none");
    }
}

/// Set the IPPROTO_TCP option `opt` of socket `fd` to `value` (`what` names it in a failure).
fn set_tcp_int(fd: i32, opt: libc::c_int, value: libc::c_int, what: &str) {
    // SAFETY: setsockopt with an int that outlives the call, and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            opt,
            &value as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "{what}: {}", std::io::Error::last_os_error());
}

/// TCP Fast Open (issue 50, bad input): a client that sends its request
/// in the SYN. The gate answers that SYN with a cookie that acknowledges the
/// SYN alone, the client sends its request again after the handshake, and
/// the download arrives over a connection made from the gate's cookie. On a
/// port whose SYNs the kernel answers, the same client's data is taken in
/// the SYN (TcpExt TCPFastOpenActive moves in A): the client did send SYN
/// data, so the first half is no accident of a client that never tried.
#[test]
fn a_fast_open_client_is_served_through_a_gate_cookie() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    // A: Fast Open on for clients, data in the SYN without a cookie (0x1 | 0x4);
    // B: on for servers, data taken without a cookie (0x2 | 0x200).
    let set = |ns: &str, v: u32| {
        let st = tb.cmd(ns, &["sysctl", "-qw", &format!("net.ipv4.tcp_fastopen={v}")]).status().unwrap();
        assert!(st.success(), "tcp_fastopen in {ns}");
    };
    set(&tb.a.clone(), 0x5);
    set(&tb.b.clone(), 0x202);
    let fast_open_listener = |port: u16| {
        in_netns(&tb.b, move || {
            let l = TcpListener::bind(("0.0.0.0", port)).expect("bind the server");
            set_tcp_int(l.as_raw_fd(), libc::TCP_FASTOPEN, 16, "TCP_FASTOPEN on the listener");
            l
        })
    };
    let _gated = serve_on(fast_open_listener(PORT), 30.0);
    let _plain = serve_on(fast_open_listener(PLAIN_PORT), 30.0);
    let web_spec = format!("web:match=tcp:{PORT},syn_cookies=on");
    tb.start_gate(&["--class", &web_spec, "--class", &format!("plain:match=tcp:{PLAIN_PORT},syn_cookies=off")]);
    std::thread::sleep(Duration::from_millis(300));
    let fast_open_get = |port: u16| -> usize {
        let to: std::net::SocketAddr = format!("{}:{port}", tb.ip_b).parse().unwrap();
        in_netns(&tb.a, move || {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            set_tcp_int(s.as_raw_fd(), libc::TCP_FASTOPEN_CONNECT, 1, "TCP_FASTOPEN_CONNECT");
            // With TCP_FASTOPEN_CONNECT the SYN waits for the first write, and carries it.
            s.connect(&to.into()).unwrap();
            let mut c: std::net::TcpStream = s.into();
            c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            let mut got = Vec::new();
            let _ = c.read_to_end(&mut got);
            got.len()
        })
    };
    let fast_open_acked = || {
        let mut f = sluice::signals::procfs::NsFile::open(&tb.a, "netstat").unwrap();
        sluice::signals::procfs::proc_counter(&f.read().unwrap(), "TcpExt:", "TCPFastOpenActive")
    };
    let header = format!("HTTP/1.0 200 OK\r\nContent-Length: {BODY}\r\n\r\n").len();
    let acked0 = fast_open_acked();
    assert_eq!(fast_open_get(PLAIN_PORT), header + BODY, "the plain port's download arrived whole");
    let acked1 = fast_open_acked();
    assert_eq!(acked1, acked0 + 1, "the kernel took the client's SYN data on the plain port");
    assert_eq!(fast_open_get(PORT), header + BODY, "the download through a gate cookie arrived whole");
    let t = web(&tb);
    assert_eq!((t.synack_pkts, t.cookies_valid), (1, 1), "the SYN answered by the gate, its cookie back: {t:?}");
    assert_eq!(fast_open_acked(), acked1, "the gate's SYN-ACK took none of the SYN's data");
}

/// Hardening (issue 35, item 1): a namespace with `tcp_syncookies = 0`
/// ignores the request socket the checker hands over, and an MPTCP listener
/// is refused one: the gate leaves their SYNs to the kernel, and every
/// connection completes.
#[test]
fn the_gate_leaves_syns_to_the_kernel_where_it_would_refuse_a_cookie() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    let _seen = serve(&tb, PORT, 60.0);
    let _mptcp = serve_mptcp(&tb, PLAIN_PORT, 60.0);
    let classes = [format!("web:match=tcp:{PORT},syn_cookies=on"), format!("mp:match=tcp:{PLAIN_PORT},syn_cookies=on")];
    tb.start_gate(&["--class", &classes[0], "--class", &classes[1]]);
    std::thread::sleep(Duration::from_millis(300));
    let ok = (0..3).filter(|_| curl_at(&tb, PLAIN_PORT).is_some_and(|(b, _)| b == BODY as u64)).count();
    let mp = class(&tb, "mp");
    assert_eq!(ok, 3, "an MPTCP listener's connections complete ({mp:?})");
    assert_eq!(mp.synack_pkts, 0, "the gate answered no SYN of the MPTCP listener");
    sysctl_b(&tb, "tcp_syncookies", 0);
    std::thread::sleep(Duration::from_millis(1500));
    let ok = (0..3).filter(|_| curl(&tb) == Some(BODY as u64)).count();
    let w = web(&tb);
    assert_eq!(ok, 3, "tcp_syncookies = 0: every connection completes ({w:?})");
    assert_eq!(w.synack_pkts, 0, "tcp_syncookies = 0: the gate answered no SYN");
    let table = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("SYN COOKIES: unavailable (net.ipv4.tcp_syncookies = 0"), "status says why: {table}");
    // Conntrack that takes up no connection it did not see begin (issue 35,
    // item 7): a cookie's connection would be INVALID to it.
    sysctl_b(&tb, "tcp_syncookies", 1);
    let loose = "echo 0 > /proc/sys/net/netfilter/nf_conntrack_tcp_loose";
    assert!(tb.cmd(&tb.b, &["sh", "-c", loose]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(1500));
    let ok = (0..3).filter(|_| curl(&tb) == Some(BODY as u64)).count();
    let w = web(&tb);
    assert_eq!((ok, w.synack_pkts), (3, 0), "nf_conntrack_tcp_loose = 0: the kernel answered every SYN ({w:?})");
    let table = tb.sluice(&tb.b, &["status", "--socket", tb.socket().to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("nf_conntrack_tcp_loose = 0"), "status says why: {table}");
}

/// A server on B's `port` that answers each connection with BODY bytes
/// and no length, then closes: the client reads to the end, so the server
/// closes first and holds the connection's 4-tuple in TIME_WAIT.
fn serve_to_close(tb: &Testbed, port: u16, secs: f64) {
    let listener = in_netns(&tb.b, move || TcpListener::bind(("0.0.0.0", port)).expect("bind the server"));
    accept_for(listener, secs, |mut s| {
        let mut req = [0u8; 1024];
        let _ = s.read(&mut req);
        let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\n");
        let _ = s.write_all(&vec![b'x'; BODY]);
    });
}

/// Issue 37: a class with a wildcard listener has the gate answer SYNs
/// without its socket lookup, except from a client address that may hold
/// a socket on the port: read by the daemon when the guard starts
/// answering, or marked by the gate since. A client that opens a
/// connection again from the port of one the server closed (its 4-tuple in
/// TIME_WAIT on the server) must reach the kernel, which alone retires the
/// old socket; answered by the gate, the cookie's ACK would meet the
/// TIME_WAIT socket and the download would never come.
#[test]
fn a_syn_that_reuses_a_time_wait_4_tuple_goes_to_the_kernel_while_the_gate_answers_directly() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    // A second address in A: the daemon cannot have learnt it.
    let early = "10.77.0.3";
    let add = tb.cmd(&tb.a, &["ip", "addr", "add", &format!("{early}/24"), "dev", tb.if_a]).status().unwrap();
    let mac_a = sluice_testkit::testbed::format_mac(tb.mac_a);
    let neigh = ["ip", "neigh", "replace", early, "lladdr", &mac_a, "dev", tb.if_b, "nud", "permanent"];
    assert!(add.success() && tb.cmd(&tb.b, &neigh).status().unwrap().success(), "a second address in A");
    serve_to_close(&tb, PORT, 60.0);
    let cfg = |on: &str| {
        format!("[[class]]\nname = \"web\"\nsyn_cookies = \"{on}\"\nmatch = [{{ proto = \"tcp\", port = {PORT} }}]\n")
    };
    let path = tb.write("sluice.toml", &cfg("off"));
    let pid = tb.start_gate(&["--config", path.to_str().unwrap(), "--no-discover"]);
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("http://{}:{PORT}/", tb.ip_b);
    // 30 s, as curl_at: this test's own downloads are unflooded, but the
    // tests beside it flood both CPUs (a CI run once failed this at 10 s;
    // the gate answering a TIME_WAIT 4-tuple's SYN never completes at all).
    let fetch = |from: &str, port: u16| {
        let port = port.to_string();
        let args = ["curl", "-s", "-o", "/dev/null", "--max-time", "30", "--interface", from, "--local-port", &port];
        let out = tb.cmd(&tb.a, &[&args[..], &["-w", "%{size_download}", &url]].concat()).output().unwrap();
        let got = String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().ok().filter(|_| out.status.success());
        if got.is_none() {
            eprintln!("curl from {from}:{port} failed: {} {}", out.status, String::from_utf8_lossy(&out.stdout));
        }
        got
    };
    let in_time_wait = |from: &str, port: u16| {
        let ss = tb.cmd(&tb.b, &["ss", "-Htan", "state", "time-wait"]).output().unwrap();
        String::from_utf8_lossy(&ss.stdout).contains(&format!("{from}:{port}"))
    };
    // Before the guard answers: a connection the kernel makes, and leaves in TIME_WAIT.
    assert_eq!(fetch(early, 40123), Some(BODY as u64), "the first download");
    assert!(in_time_wait(early, 40123), "the server holds the 4-tuple in TIME_WAIT");
    std::fs::write(&path, cfg("on")).unwrap();
    tb.signal(pid, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    // The daemon's read: the SYN that reuses it goes to the kernel; another from the client is looked up.
    assert_eq!(fetch(early, 40123), Some(BODY as u64), "from the same port while the guard answers: whole");
    assert_eq!(web(&tb).synack_pkts, 0, "the gate left that SYN to the kernel");
    assert_eq!(fetch(early, 40125), Some(BODY as u64));
    let w = web(&tb);
    assert_eq!((w.synack_pkts, w.synack_direct), (1, 0), "the client holds a socket: looked up, answered: {w:?}");
    // A client new to the server: answered without the lookup; the gate marks it at its cookie's ACK.
    let new = tb.ip_a.clone();
    assert_eq!(fetch(&new, 40200), Some(BODY as u64));
    let w = web(&tb);
    assert_eq!((w.synack_pkts, w.synack_direct, w.cookies_valid), (2, 1, 2), "answered without the lookup: {w:?}");
    assert!(in_time_wait(&new, 40200));
    assert_eq!(fetch(&new, 40200), Some(BODY as u64), "from the same port again: whole");
    assert_eq!(web(&tb).synack_pkts, 2, "the gate left that SYN to the kernel");
}

/// Class `name`'s totals (after a pause: the daemon publishes every 100 ms).
fn class(tb: &Testbed, name: &str) -> sluice::surface::stats::ClassTotals {
    std::thread::sleep(Duration::from_millis(250));
    tb.status().classes.into_iter().find(|c| c.name == name).expect("the class").totals
}

/// `serve` over an MPTCP listening socket (IPPROTO_MPTCP): curl's plain TCP
/// connections fall back to TCP on it.
fn serve_mptcp(tb: &Testbed, port: u16, secs: f64) -> Seen {
    let fd = in_netns(&tb.b, move || {
        // SAFETY: plain socket(2)/bind(2)/listen(2) on a fd owned below.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_MPTCP);
            assert!(fd >= 0, "an MPTCP socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as u16;
            addr.sin_port = port.to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            assert_eq!(libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len), 0, "bind the MPTCP server");
            assert_eq!(libc::listen(fd, 128), 0);
            OwnedFd::from_raw_fd(fd)
        }
    });
    serve_on(TcpListener::from(fd), secs)
}

/// Hardening (issue 35, item 7): a port the namespace DNATs elsewhere (a
/// published container port: the host's docker-proxy listens on it, the
/// connections go to the container's socket). Its established connections'
/// segments find only the host's listener at the gate's lookup (their
/// socket is the NAT target's), so while the SYN guard answers they looked
/// like ACKs of no connection and were dropped. Conntrack knows them: the
/// gate asks it (bpf_xdp_ct_lookup) before it drops one. An upload over a
/// DNATed connection goes on whole across the guard turning on.
#[test]
fn a_dnat_connection_goes_on_while_the_guard_answers() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    peer_xdp(&mut tb);
    let nat = format!(
        "add table ip sl_nat\nadd chain ip sl_nat pre {{ type nat hook prerouting priority -100; }}\n\
         add rule ip sl_nat pre tcp dport 8082 dnat to {}:8083\n",
        tb.ip_b
    );
    let rules = tb.write("nat.nft", &nat);
    let out = tb.cmd(&tb.b, &["nft", "-f", rules.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
    // The host's own listener on the published port (docker-proxy's part): never accepts.
    let _proxy = in_netns(&tb.b, || TcpListener::bind(("0.0.0.0", 8082)).expect("bind 8082"));
    let target = in_netns(&tb.b, || TcpListener::bind(("0.0.0.0", 8083)).expect("bind 8083"));
    target.set_nonblocking(true).unwrap();
    let received = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match target.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("no connection reached the DNAT target: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 4096];
        let mut n = 0u64;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    });
    let cfg = |on: &str| {
        format!("[[class]]\nname = \"web\"\nsyn_cookies = \"{on}\"\nmatch = [{{ proto = \"tcp\", port = 8082 }}]\n")
    };
    let path = tb.write("sluice.toml", &cfg("off"));
    let pid = tb.start_gate(&["--config", path.to_str().unwrap(), "--no-discover"]);
    let ip_b = tb.ip_b.clone();
    let mut client = in_netns(&tb.a, move || std::net::TcpStream::connect((ip_b.as_str(), 8082)).expect("connect"));
    // Dropped segments fill the send buffer: a write that waits 3 s ends the upload.
    client.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let (chunk, mut sent) = ([7u8; 1000], 0u64);
    for i in 0..300 {
        if i == 50 {
            std::fs::write(&path, cfg("on")).unwrap();
            tb.signal(pid, libc::SIGHUP);
        }
        if client.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len() as u64;
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(client);
    let got = received.join().unwrap();
    let w = web(&tb);
    let guard = tb.status().classes.into_iter().find(|c| c.name == "web").and_then(|c| c.syn_guard);
    assert!(guard.is_some_and(|g| g.answering), "the guard answers after the reload: {w:?}");
    assert_eq!(got, sent, "every byte of the DNATed upload arrived ({w:?})");
    assert_eq!(w.dropped_noconn_pkts, 0, "none of its segments taken for no connection");
}

/// Hardening (issue 49, item 8): where B's interface strips VLAN tags
/// before XDP and carries VLANs the gate answers no SYN (its SYN-ACKs would
/// leave untagged; `cookies::tests` has that rule). This kernel has neither
/// 802.1Q devices nor bridge VLAN filtering to show it end to end; what runs
/// here is the other side, read from the real interface each second: B's
/// veth strips tags (`rx-vlan-offload: on`, veth's default) under a bridge
/// that carries no VLAN, and the gate goes on answering SYNs.
#[test]
fn a_bridge_without_vlans_over_a_stripping_interface_keeps_the_gate_answering() {
    let _one = one_at_a_time();
    let mut tb = Testbed::new();
    tb.start_gate(&["--class", &format!("web:match=tcp:{PORT},syn_cookies=on")]);
    let guard = |tb: &Testbed| {
        let s = tb.status();
        s.classes.iter().find(|c| c.name == "web").and_then(|c| c.syn_guard.clone()).expect("web's guard")
    };
    let steps: [&[&str]; 3] = [
        &["ethtool", "-K", tb.if_b, "rxvlan", "on"],
        &["ip", "link", "add", "slvb", "type", "bridge"],
        &["ip", "link", "set", tb.if_b, "master", "slvb"],
    ];
    for s in steps {
        assert!(tb.cmd(&tb.b, s).status().unwrap().success(), "{s:?}");
    }
    // The daemon reads the settings once a second.
    std::thread::sleep(Duration::from_millis(1500));
    let g = guard(&tb);
    assert!(g.available && g.why_unavailable.is_none(), "a bridge without VLANs: the gate answers ({g:?})");
}
