//! BPF_PROG_TEST_RUN tests of what the host needs from its default class
//! (bpf/gate/host.h, issue 49 item 9): with the default class limited to
//! nothing, replies to the host's own connections (sockets these tests
//! open on loopback, found by the kernel's lookup), IPv6 neighbour
//! discovery and PMTU messages are passed, and nothing else is. On a gate
//! without the rule each of them is dropped. Needs root (CI is root).
mod common;

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Instant;

use common::{Landed::*, TestGate};
use sluice::dataplane::gate::Prog;
use sluice::dataplane::share::share;
use sluice_testkit::packet::{non_ip, Ext, Frame, ETH_P_ARP, ETH_P_LLDP, IPPROTO_ICMP, IPPROTO_ICMPV6, L4};

/// A gate whose default class admits nothing (rate 0), beside one class
/// `svc` for `svc_port` (UDP) limited to nothing too.
fn gate(svc_port: u16) -> TestGate {
    let g = TestGate::new(&[&format!("svc:rate=1,burst=1,match=udp:{svc_port}")]);
    for c in ["default", "svc"] {
        g.gate.set_shares(g.class(c), &vec![share(0, 1); g.gate.ncpus()]).unwrap();
    }
    g
}

/// A UDP socket on `local` connected to `peer`, and its port.
fn connected(local: &str, peer: &str) -> (UdpSocket, u16) {
    let client = UdpSocket::bind(local).unwrap();
    client.connect(peer).unwrap();
    let port = client.local_addr().unwrap().port();
    (client, port)
}

fn host(g: &TestGate) -> (u64, u64) {
    let c = g.counters().global;
    (c.host_reply, c.host_icmp)
}

/// A TCP frame with these flags (the builder makes a SYN).
fn tcp(src: &str, dst: &str, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let (mut b, offs) = Frame::tcp(src, dst, sport, dport).build_with_offsets();
    let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
    b[l4 + 13] = flags;
    b
}

/// An ICMP or ICMPv6 message of this type and code (8 bytes of header, then
/// 40 of the packet it is about), with this IPv6 hop limit.
fn icmp(src: &str, dst: &str, type_code: (u8, u8), hop_limit: u8) -> Vec<u8> {
    let v6 = src.contains(':');
    let mut bytes = vec![type_code.0, type_code.1, 0, 0, 0, 0, 5, 0xdc];
    bytes.resize(48, 0);
    let proto = if v6 { IPPROTO_ICMPV6 } else { IPPROTO_ICMP };
    let (mut b, offs) = Frame::new(src, dst, L4::Raw { proto, bytes }).build_with_offsets();
    if v6 {
        b[offs.iter().find(|o| o.0 == "ip").unwrap().1 + 7] = hop_limit;
    }
    b
}

/// A connected UDP socket's replies are passed, counted HOST_REPLY; a
/// datagram from another peer, to a socket that is only bound, or outside
/// the ephemeral range is dropped; another class's limit is its own.
#[test]
fn replies_to_a_connected_udp_socket_pass_a_default_class_limited_to_nothing() {
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect("127.0.0.2:5353").unwrap();
    let port = client.local_addr().unwrap().port();
    let bound = UdpSocket::bind("127.0.0.1:0").unwrap();
    let bound_port = bound.local_addr().unwrap().port();
    let mut g = gate(1);
    let reply = Frame::udp("127.0.0.2", "127.0.0.1", 5353, port).build();
    g.expect("a reply to the connected socket", &reply, Admitted("default".into()));
    assert_eq!(host(&g), (1, 0), "counted as a reply");
    g.expect(
        "from another peer",
        &Frame::udp("127.0.0.3", "127.0.0.1", 5353, port).build(),
        DroppedRate("default".into()),
    );
    g.expect(
        "from another port",
        &Frame::udp("127.0.0.2", "127.0.0.1", 5354, port).build(),
        DroppedRate("default".into()),
    );
    g.expect(
        "to a socket only bound",
        &Frame::udp("127.0.0.2", "127.0.0.1", 5353, bound_port).build(),
        DroppedRate("default".into()),
    );
    g.gate.set_ephemeral(Some((1, 2)));
    g.expect("outside the ephemeral range", &reply, DroppedRate("default".into()));
    g.gate.set_ephemeral(Some((port, port)));
    g.expect("inside it", &reply, Admitted("default".into()));
    assert_eq!(host(&g), (2, 0));
    // The same reply in a class of its own: its limit holds.
    let g = gate(port);
    g.expect("a reply in a class of its own", &reply, DroppedRate("svc".into()));
    assert_eq!(host(&g), (0, 0));
}

/// The reply's socket must be the host's own (issue 49, item 9's gap): a
/// connected UDP socket that nobody (uid 65534) made, as a login user's
/// process could connect one to an accomplice whose datagrams then passed
/// the throttle at any rate, is not; root's, a system user's and a systemd
/// dynamic user's are. Before, each was.
#[test]
fn a_reply_to_a_socket_a_login_user_or_nobody_made_is_not_the_hosts_own() {
    // The socket's owner (sk_uid) is the fsuid of the thread that makes it,
    // a thread's own (setfsuid is not broadcast to the process).
    let made_by = |uid: u32| {
        std::thread::spawn(move || {
            unsafe { libc::setfsuid(uid) };
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect("127.0.0.2:5353").unwrap();
            s
        })
        .join()
        .unwrap()
    };
    let (login_min, login_max) = sluice::signals::discover::login_uids();
    let g = gate(1);
    for (who, uid, passes) in [
        ("root", 0, true),
        ("a system user", login_min - 1, true),
        ("a systemd dynamic user", sluice::bpf_intf::SLUICE_DYNAMIC_UID_LO, true),
        ("a login user", login_min, false),
        ("the last login user", login_max, false),
        ("nobody", 65534, false),
    ] {
        let s = made_by(uid);
        let reply = Frame::udp("127.0.0.2", "127.0.0.1", 5353, s.local_addr().unwrap().port()).build();
        let want = if passes { Admitted("default".into()) } else { DroppedRate("default".into()) };
        g.expect(&format!("a reply to a socket {who} (uid {uid}) made"), &reply, want);
    }
    assert_eq!(host(&g), (3, 0));
}

/// A datagram in IPv4 fragments: its first fragment, a reply to the
/// connected socket, passes, and then so do its other fragments (same
/// sender, protocol and IP id); a non-first fragment of another
/// datagram does not.
#[test]
fn the_fragments_of_a_reply_pass_with_their_first() {
    let (_client, port) = connected("127.0.0.1:0", "127.0.0.2:5353");
    let g = gate(1);
    let d = || DroppedRate("default".into());
    let rest = Frame::udp("127.0.0.2", "127.0.0.1", 5353, port).fragment(185, false).build();
    g.expect("a non-first fragment before its first", &rest, d());
    let first = Frame::udp("127.0.0.2", "127.0.0.1", 5353, port).fragment(0, true).payload(1472).build();
    g.expect("the first fragment of a reply", &first, Admitted("default".into()));
    g.expect("its second fragment", &rest, Admitted("default".into()));
    g.expect("and its last again (a retransmission)", &rest, Admitted("default".into()));
    assert_eq!(host(&g), (3, 0));
    g.expect(
        "a fragment of another sender",
        &Frame::udp("127.0.0.3", "127.0.0.1", 5353, port).fragment(185, false).build(),
        d(),
    );
    let other_first = Frame::udp("127.0.0.3", "127.0.0.1", 5353, port).fragment(0, true).build();
    g.expect("the first fragment of a datagram from another peer", &other_first, d());
    assert_eq!(host(&g), (3, 0));
}

/// The same in IPv6 fragments (issue 49, item 9), the fragment header
/// right after the fixed one: before, neither the first fragment nor the
/// rest were looked at, and a limited default class dropped them all.
#[test]
fn the_ipv6_fragments_of_a_reply_pass_with_their_first() {
    let (_client, port) = connected("[::1]:0", "[::1]:5353");
    let g = gate(1);
    let d = || DroppedRate("default".into());
    let frag = |id: u32, offset: u16, more: bool| {
        Frame::udp("::1", "::1", 5353, port).frag_id(id).ext(Ext::Fragment { offset, more }).payload(64)
    };
    g.expect("a non-first fragment before its first", &frag(7, 185, false).build(), d());
    g.expect("the first fragment of a reply", &frag(7, 0, true).payload(1400).build(), Admitted("default".into()));
    g.expect("its second fragment", &frag(7, 185, false).build(), Admitted("default".into()));
    assert_eq!(host(&g), (2, 0));
    g.expect("a fragment of another datagram", &frag(8, 185, false).build(), d());
    let stranger = Frame::udp("::1", "::1", 5354, port).frag_id(9).ext(Ext::Fragment { offset: 0, more: true });
    g.expect("the first fragment of a datagram from a port the socket is not connected to", &stranger.build(), d());
    assert_eq!(host(&g), (2, 0));
}

/// An established TCP connection's segments are passed (the SYN-ACK of a
/// connect() too, where its socket waits in SYN_SENT); a SYN, a segment to
/// a listener and one of no connection are dropped.
#[test]
fn segments_of_the_hosts_own_tcp_connection_pass() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let lport = listener.local_addr().unwrap().port();
    let conn = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    let cport = conn.local_addr().unwrap().port();
    let _accepted = listener.accept().unwrap();
    let g = gate(1);
    let d = || DroppedRate("default".into());
    g.expect(
        "an ACK of the connection",
        &tcp("127.0.0.1", "127.0.0.1", lport, cport, 0x10),
        Admitted("default".into()),
    );
    g.expect("a PSH-ACK of it", &tcp("127.0.0.1", "127.0.0.1", lport, cport, 0x18), Admitted("default".into()));
    assert_eq!(host(&g), (2, 0));
    g.expect("a SYN to the connection's port", &tcp("127.0.0.1", "127.0.0.1", lport, cport, 0x02), d());
    g.expect("an ACK to the listener", &tcp("127.0.0.9", "127.0.0.1", 4000, lport, 0x10), d());
    g.expect("an ACK of no connection", &tcp("127.0.0.9", "127.0.0.1", lport, cport, 0x10), d());
    assert_eq!(host(&g), (2, 0));
}

/// Neighbour discovery (hop limit 255) and PMTU messages pass, counted
/// HOST_ICMP; an echo request, an NS with a lower hop limit (not from the
/// link) do not; and they pass at most SLUICE_HOST_ICMP_PPS per CPU
/// beyond the burst (bounded from the time the test took).
#[test]
fn neighbour_discovery_and_pmtu_pass_within_their_own_bucket() {
    let g = gate(1);
    let (a6, b6) = ("fe80::1", "fe80::2");
    let d = || DroppedRate("default".into());
    let adm = || Admitted("default".into());
    g.expect("a neighbour solicitation", &icmp(a6, b6, (135, 0), 255), adm());
    g.expect("a neighbour advertisement", &icmp(a6, b6, (136, 0), 255), adm());
    g.expect("a router advertisement", &icmp(a6, b6, (134, 0), 255), adm());
    g.expect("an ICMPv6 packet too big", &icmp("2001:db8::1", "2001:db8::2", (2, 0), 64), adm());
    g.expect("an ICMP fragmentation needed", &icmp("192.0.2.1", "192.0.2.2", (3, 4), 0), adm());
    assert_eq!(host(&g), (0, 5));
    g.expect("an NS from off the link", &icmp(a6, b6, (135, 0), 64), d());
    g.expect("an ICMPv6 echo request", &icmp(a6, b6, (128, 0), 255), d());
    g.expect("an ICMP port unreachable", &icmp("192.0.2.1", "192.0.2.2", (3, 3), 0), d());
    assert_eq!(host(&g), (0, 5));

    let ns = icmp(a6, b6, (135, 0), 255);
    let (burst, pps) = (sluice::bpf_intf::SLUICE_HOST_ICMP_BURST as f64, sluice::bpf_intf::SLUICE_HOST_ICMP_PPS as f64);
    let (before, t) = (host(&g).1, Instant::now());
    let runs = 400;
    for _ in 0..runs {
        g.run(&ns);
    }
    let (passed, secs) = ((host(&g).1 - before) as f64, t.elapsed().as_secs_f64());
    let most = burst + pps * secs + 1.0;
    eprintln!("{passed} of {runs} NS passed in {secs:.3} s (at most {most:.0})");
    assert!(passed <= most, "{passed} passed in {secs:.3} s: over the bucket's {most:.0}");
    assert!(passed >= (burst - 5.0).min(runs as f64), "{passed} passed: the burst is {burst}");
}

/// A blocked default class (an operator's config) stays blocked.
#[test]
fn a_blocked_default_class_passes_nothing_the_host_needs() {
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect("127.0.0.2:5353").unwrap();
    let port = client.local_addr().unwrap().port();
    let g = TestGate::new(&["default:rate=blocked"]);
    let reply = Frame::udp("127.0.0.2", "127.0.0.1", 5353, port).build();
    g.expect("a reply", &reply, DroppedBlocked("default".into()));
    g.expect("an NS", &icmp("fe80::1", "fe80::2", (135, 0), 255), DroppedBlocked("default".into()));
    assert_eq!(host(&g), (0, 0));
}

/// `n` frames back to back on one CPU (BPF_PROG_TEST_RUN's repeat): how
/// many passed and were dropped as non-IP, and the seconds the run took.
fn non_ip_run(g: &TestGate, frame: &[u8], n: u32) -> (u64, u64, f64) {
    let (b, t) = (g.counters().global, Instant::now());
    g.gate.test_run(Prog::Gate, frame, n).expect("test run");
    let (a, secs) = (g.counters().global, t.elapsed().as_secs_f64());
    assert_eq!(a.malformed_drop + a.malformed_pass, b.malformed_drop + b.malformed_pass);
    (a.non_ip_pass - b.non_ip_pass, a.non_ip_drop - b.non_ip_drop, secs)
}

/// Issue 49, item 8: frames that are not IPv4/IPv6 passed unmetered, so an
/// ARP flood went past a default class throttled to nothing. While the
/// default class is limited (here to nothing) or blocked, they pass at most
/// SLUICE_HOST_LINK_PPS per CPU beyond a burst (bounded from the time the
/// run took) and the rest are dropped, counted NON_IP_DROP; while it is
/// unlimited (always with no flood) every one passes, as before.
#[test]
fn non_ip_frames_pass_within_the_link_bucket_while_the_default_class_is_limited() {
    let (burst, pps) = (sluice::bpf_intf::SLUICE_HOST_LINK_BURST as f64, sluice::bpf_intf::SLUICE_HOST_LINK_PPS as f64);
    let n = 5 * burst as u32;
    let limited = gate(1);
    let blocked = TestGate::new(&["default:rate=blocked"]);
    for (what, g) in [("limited to nothing", &limited), ("blocked", &blocked)] {
        let start = Instant::now();
        let (passed, dropped, secs) = non_ip_run(g, &non_ip(ETH_P_ARP), n);
        let most = burst + pps * secs + 1.0;
        eprintln!("default class {what}: {passed} of {n} ARP frames passed in {secs:.4} s (at most {most:.0})");
        assert_eq!(passed + dropped, u64::from(n), "{what}: one verdict each");
        assert!(passed as f64 <= most, "{what}: {passed} passed in {secs:.4} s: over the bucket's {most:.0}");
        assert!(passed as f64 >= burst - 5.0, "{what}: {passed} passed: the burst is {burst}");
        // LLDP shares the spent bucket: of a burst's worth, only what the
        // bucket refilled since the ARP run began may pass (one token per
        // 1/pps s; a single frame would pass after a 100 us preemption).
        let (lldp_passed, lldp_dropped, _) = non_ip_run(g, &non_ip(ETH_P_LLDP), burst as u32);
        let refill = pps * start.elapsed().as_secs_f64() + 1.0;
        eprintln!("default class {what}: {lldp_passed} of {burst} LLDP frames passed after it (at most {refill:.0})");
        assert!(lldp_dropped > 0, "{what}: LLDP, the bucket spent: none dropped");
        assert!(
            lldp_passed as f64 <= refill,
            "{what}: {lldp_passed} LLDP frames passed: over the {refill:.0} refilled"
        );
    }
    let unlimited = TestGate::new(&["svc:rate=1,burst=1,match=udp:1"]);
    assert_eq!(non_ip_run(&unlimited, &non_ip(ETH_P_ARP), n).1, 0, "an unlimited default class drops none");
}
