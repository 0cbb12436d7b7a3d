//! SYN cookies at the driver (issue 22) by BPF_PROG_TEST_RUN: the SYN-ACK
//! the gate builds (addresses, ports, sequence numbers, options,
//! checksums), which SYNs it leaves to the kernel, and the cookie checker's
//! verdict on ACKs (against a real listener in this namespace: the checker
//! looks the listener up). Needs root (CI is root).
mod common;

use std::net::TcpListener;

use common::tcp::{linux_syn_options, parse, ts_options, Parsed, Segment, ACK, FIN, SYN};
use common::TestGate;
use sluice::bpf_intf::*;
use sluice::dataplane::gate::{Clock, Prog, XDP_PASS};
use sluice_testkit::packet::{Ext, Frame};

const XDP_TX: u32 = 3;
const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321];

/// A gate with class "web" on tcp:`port`, its SYN guard answering, the key set and the clock at `now_ms`.
fn guarded(port: u16, now_ms: u64) -> TestGate {
    let mut g = TestGate::new(&[&format!("web:match=tcp:{port}")]);
    g.gate.set_syn_key(KEY, 1500);
    g.gate.set_clock(&Clock { epoch: 1, now_ms, known_ttl_ms: 3_600_000 });
    let guard = sluice_syn_guard { answer: 1, check_until_ms: now_ms + 200_000, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &guard).unwrap();
    g
}

fn counter(g: &TestGate, idx: u32) -> u64 {
    g.gate.class_counters(g.class("web")).unwrap()[idx as usize]
}

/// Run a SYN through the gate: its verdict and the frame it left.
fn answer(g: &TestGate, syn: &Segment) -> (u32, Parsed) {
    let (verdict, out) = g.gate.test_run_out(Prog::Gate, &syn.build()).unwrap();
    (verdict, parse(&out))
}

#[test]
fn a_guarded_ipv4_syn_gets_a_syn_ack_with_a_cookie_and_the_clients_options() {
    let (_l, port) = listener();
    let g = guarded(port, sluice::base::clock::wall_ms());
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(1460, 777);
    let (verdict, sa) = answer(&g, &syn);
    assert_eq!(verdict, XDP_TX, "sent back out of the interface");
    assert_eq!((sa.src.to_string(), sa.dst.to_string()), ("127.0.0.1".into(), "127.0.0.2".into()));
    assert_eq!((sa.sport, sa.dport), (port, 40000));
    assert_eq!(sa.flags, SYN | ACK);
    assert_eq!(sa.ack, syn.seq.wrapping_add(1), "acknowledges the client's ISN");
    assert!(sa.ip_csum_ok && sa.tcp_csum_ok, "checksums: {sa:?}");
    assert_eq!(sa.option(2), Some(&1460u16.to_be_bytes()[..]), "the MSS of a 1500-byte MTU");
    assert_eq!(sa.option(3), Some(&[SLUICE_COOKIE_WSCALE as u8][..]), "window scale offered back");
    assert!(sa.option(4).is_some(), "SACK permitted back");
    let ts = sa.option(8).expect("timestamps back");
    assert_eq!(&ts[4..8], &777u32.to_be_bytes(), "TSecr echoes the client's TSval");
    assert_eq!(sa.payload_len, 0);
    assert_eq!(sa.seq & 0xf, 7, "the cookie keeps the client's window scale");
    assert_eq!((sa.seq >> 6) & 3, 3, "and its MSS (1460: the table's last entry)");
    assert_eq!((counter(&g, SLUICE_CS_SYN_PKTS), counter(&g, SLUICE_CS_SYNACK_PKTS)), (1, 1));
    assert_eq!(counter(&g, SLUICE_CS_ADMIT_PKTS), 0, "not passed to the kernel");
    // One SYN, one cookie: the same SYN again gets the same one; another ISN another.
    assert_eq!(answer(&g, &syn).1.seq, sa.seq);
    syn.seq += 1;
    assert_ne!(answer(&g, &syn).1.seq, sa.seq);
}

/// TCP Fast Open (issue 50, bad input): a SYN that carries data and a
/// Fast Open option (kind 34, a cookie request, or a cookie) is answered
/// like any other: the SYN-ACK acknowledges the SYN alone (the client sends
/// its data again after the handshake, as after the kernel's own cookies),
/// offers no Fast Open cookie, and carries no data.
#[test]
fn a_fast_open_syn_with_data_is_answered_without_taking_its_data() {
    let (_l, port) = listener();
    let g = guarded(port, sluice::base::clock::wall_ms());
    for tfo in [vec![34, 2], vec![34, 10, 1, 2, 3, 4, 5, 6, 7, 8]] {
        let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
        syn.options = [linux_syn_options(1460, 777), vec![1, 1], tfo.clone()].concat();
        syn.payload = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let (verdict, sa) = answer(&g, &syn);
        assert_eq!(verdict, XDP_TX, "answered (Fast Open option {tfo:?})");
        assert_eq!(sa.flags, SYN | ACK);
        assert_eq!(sa.ack, syn.seq.wrapping_add(1), "the SYN acknowledged, not its {} bytes", syn.payload.len());
        assert_eq!(sa.payload_len, 0, "the SYN-ACK carries none of it");
        assert!(sa.option(34).is_none(), "no Fast Open cookie offered");
        assert!(sa.ip_csum_ok && sa.tcp_csum_ok, "{sa:?}");
    }
}

#[test]
fn a_guarded_ipv6_syn_behind_a_vlan_tag_is_answered_too() {
    let l = TcpListener::bind("[::1]:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let g = guarded(port, sluice::base::clock::wall_ms());
    let mut syn = Segment::new("::1", "::1", 40000, port, SYN);
    syn.vlan = Some(42);
    syn.options = vec![2, 4, 0x05, 0xa0, 1, 1, 4, 2]; // MSS 1440, NOP NOP SACK-permitted
    let (verdict, sa) = answer(&g, &syn);
    assert_eq!(verdict, XDP_TX);
    assert_eq!(sa.vlan, Some(42), "the tag stays");
    assert_eq!((sa.sport, sa.dport), (port, 40000));
    assert!(sa.tcp_csum_ok, "{sa:?}");
    assert_eq!(sa.option(2), Some(&1440u16.to_be_bytes()[..]), "the IPv6 MSS of a 1500-byte MTU");
    assert!(sa.option(3).is_none() && sa.option(8).is_none(), "no window scale, no timestamps offered");
    assert!(sa.option(4).is_some());
    assert_eq!(sa.seq & 0xf, 0xf, "the cookie says: no window scale");
}

/// Does the gate pass `s` (to the kernel) rather than answer it?
#[track_caller]
/// Where the gate's interface forwards, a SYN the host would route to
/// another machine goes to the kernel, and so does an ACK of that
/// machine's connection, though a wildcard listener on the port matches
/// any destination at the socket lookup. Without the ROUTES bits (a
/// forwarding setting not read) the gate answers the SYN in that machine's
/// name and drops the ACK: what the bits are for. In a namespace of its own
/// with a route to another network (a test run's frame comes in on lo).
#[test]
fn a_segment_the_host_would_route_elsewhere_goes_to_the_kernel_where_the_interface_forwards() {
    use sluice::base::netns::sh;
    const XDP_DROP: u32 = 1;
    let opts = sluice_testkit::testbed::TestbedOpts { prefix: "sl-t", ipv6: true, queues: 1 };
    let tb = sluice_testkit::testbed::Testbed::create(opts, &format!("{}-route", std::process::id())).unwrap();
    sluice::base::netns::in_netns(&tb.b, || {
        // B holds 10.77.0.2 and fd77::2 on its veth; the other machine's networks are routed to A.
        for cmd in ["ip route add 198.51.100.0/24 via 10.77.0.1", "ip -6 route add 2001:db8:7::/64 via fd77::1"] {
            sh(&cmd.split(' ').collect::<Vec<_>>()).unwrap();
        }
        for family in ["ipv4", "ipv6"] {
            std::fs::write(format!("/proc/sys/net/{family}/conf/lo/forwarding"), "1").unwrap();
        }
        let l = TcpListener::bind("[::]:0").unwrap(); // both families
        let port = l.local_addr().unwrap().port();
        let mut g = guarded(port, sluice::base::clock::wall_ms());
        let verdict = |g: &TestGate, s: &Segment| g.gate.test_run(Prog::Gate, &s.build(), 1).unwrap().0;
        let syn = |src: &str, dst: &str| Segment::new(src, dst, 40000, port, SYN);
        let ack = |src: &str, dst: &str| {
            let mut a = Segment::new(src, dst, 40001, port, ACK);
            (a.seq, a.ack) = (0x1111_1111, 0x2222_2222);
            a
        };
        let routes = SLUICE_SYN_ROUTES_V4 | SLUICE_SYN_ROUTES_V6;
        // Attached, the gate reads its interface's forwarding with the TCP settings.
        let vb = sluice_testkit::testbed::IF_B;
        let forwarding = |family: &str, on: &str| {
            std::fs::write(format!("/proc/sys/net/{family}/conf/{vb}/forwarding"), on).unwrap()
        };
        forwarding("ipv4", "1");
        g.gate.attach(vb, sluice::policy::config::XdpMode::Native, false).unwrap();
        assert!(g.gate.answers_syns(), "this kernel takes gate cookies (Linux 6.9), as the checker's tests need");
        assert_eq!(g.gate.syn_allow() & routes, SLUICE_SYN_ROUTES_V4, "{vb} forwards IPv4 only");
        forwarding("ipv6", "1");
        assert_eq!(g.gate.refresh_syn_allow().map(|a| a & routes), Some(routes), "and now IPv6 too");
        g.gate.detach();
        let allow = g.gate.syn_allow() & !routes;
        g.gate.set_syn_allow(allow | routes);
        for (src, away, here) in [("10.77.0.1", "198.51.100.7", "10.77.0.2"), ("fd77::1", "2001:db8:7::7", "fd77::2")] {
            assert_eq!(verdict(&g, &syn(src, away)), XDP_PASS, "a SYN routed on to {away}: the kernel forwards it");
            assert_eq!(verdict(&g, &ack(src, away)), XDP_PASS, "an ACK routed on to {away}: not the gate's to drop");
            assert_eq!(verdict(&g, &syn(src, here)), XDP_TX, "a SYN for this host ({here}) is answered");
            assert_eq!(verdict(&g, &ack(src, here)), XDP_DROP, "an ACK of no connection here is dropped");
        }
        assert_eq!(counter(&g, SLUICE_CS_SYNACK_PKTS), 2, "the two SYNs for this host");
        g.gate.set_syn_allow(allow);
        assert_eq!(verdict(&g, &syn("10.77.0.1", "198.51.100.7")), XDP_TX, "the bit not set: answered in its name");
        assert_eq!(verdict(&g, &ack("10.77.0.1", "198.51.100.7")), XDP_DROP, "and its connection's ACK dropped");
        drop(l);
    });
}

fn pass(g: &TestGate, what: &str, s: &Segment) {
    assert_eq!(g.gate.test_run(Prog::Gate, &s.build(), 1).unwrap().0, XDP_PASS, "{what}");
}

#[test]
fn what_the_gate_leaves_to_the_kernel() {
    let now = sluice::base::clock::wall_ms();
    let (l, port) = listener();
    let g = guarded(port, now);
    let syn = |flags: u8| Segment::new("127.0.0.2", "127.0.0.1", 40000, port, flags);
    pass(&g, "SYN+FIN", &syn(SYN | FIN));
    // An ACK of no connection is dropped while the guard answers: see the last test.
    pass(&g, "a SYN to another port", &Segment::new("127.0.0.2", "127.0.0.1", 40000, port ^ 1, SYN));
    // A SYN of a 4-tuple the kernel holds a socket for (a connection in
    // TIME_WAIT whose port a client reuses; here one still open): only the
    // kernel can retire the old socket.
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (served, _) = l.accept().unwrap();
    let cport = client.local_addr().unwrap().port();
    pass(&g, "a SYN of a connection the kernel holds", &Segment::new("127.0.0.1", "127.0.0.1", cport, port, SYN));
    drop((client, served));
    assert_eq!(counter(&g, SLUICE_CS_SYNACK_PKTS), 0);
    // A SYN with data is answered, without its data (the client sends it again).
    let mut s = syn(SYN);
    s.payload = vec![7; 100];
    let (verdict, sa) = answer(&g, &s);
    assert_eq!((verdict, sa.payload_len), (XDP_TX, 0));
    assert!(sa.tcp_csum_ok);
    // Options cut short (a length past the header) are not taken; the SYN is still answered.
    let mut s = syn(SYN);
    s.options = vec![2, 4, 0x05, 0xb4, 3, 9, 7, 0];
    let (verdict, sa) = answer(&g, &s);
    assert_eq!(verdict, XDP_TX);
    assert_eq!(sa.option(2), Some(&1460u16.to_be_bytes()[..]));
    assert!(sa.option(3).is_none(), "the window scale option ran past the header");
    // The guard off, no key, no gate clock: the normal way.
    let off = sluice_syn_guard { answer: 0, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &off).unwrap();
    pass(&g, "guard off", &syn(SYN));
    let mut g = guarded(port, now);
    g.gate.set_syn_key([0, 0], 1500);
    pass(&g, "no key yet", &syn(SYN));
    g.gate.set_syn_key(KEY, 1500);
    g.gate.set_clock(&Clock::default());
    pass(&g, "no gate clock yet", &syn(SYN));
    g.gate.set_clock(&Clock { epoch: 1, now_ms: now, known_ttl_ms: 3_600_000 });
    assert_eq!(answer(&g, &syn(SYN)).0, XDP_TX, "all set again: answered");
    drop(l);
    pass(&g, "a SYN to a closed port: the kernel's RST, as before", &syn(SYN));
}

/// Hardening (issue 35, item 1): the SYN-ACK offers only the options the
/// namespace's TCP settings allow (`settings.syn_allow`), and the cookie
/// keeps only those; with `tcp_syncookies = 0`, or for an MPTCP listener,
/// the gate answers no SYN (the kernel would refuse the cookie).
#[test]
fn the_syn_ack_offers_only_what_the_namespace_allows() {
    let (_l, port) = listener();
    let mut g = guarded(port, sluice::base::clock::wall_ms());
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(1460, 777);
    let all = SLUICE_SYN_COOKIES | SLUICE_SYN_SACK | SLUICE_SYN_TS | SLUICE_SYN_WSCALE;
    g.gate.set_syn_allow(all & !SLUICE_SYN_SACK);
    let (verdict, sa) = answer(&g, &syn);
    assert_eq!(verdict, XDP_TX);
    assert!(sa.option(4).is_none(), "no SACK offered where tcp_sack = 0");
    assert_eq!(sa.seq & (1 << 4), 0, "the cookie says: no SACK (syncookie.h: bit 4)");
    assert!(sa.option(3).is_some() && sa.option(8).is_some(), "window scale and timestamps still offered");
    g.gate.set_syn_allow(all & !SLUICE_SYN_TS & !SLUICE_SYN_WSCALE);
    let (_, sa) = answer(&g, &syn);
    assert!(sa.option(8).is_none() && sa.option(3).is_none(), "neither timestamps nor window scale: {sa:?}");
    assert_eq!(sa.seq & 0xf, 0xf, "the cookie says: no window scale");
    assert!(sa.option(4).is_some() && sa.tcp_csum_ok);
    g.gate.set_syn_allow(all & !SLUICE_SYN_COOKIES);
    pass(&g, "tcp_syncookies = 0: the listener would ignore the cookie", &syn);
    g.gate.set_syn_allow(all);
    assert_eq!(answer(&g, &syn).0, XDP_TX);
    // An MPTCP listener: bpf_sk_assign_tcp_reqsk refuses it.
    let mptcp = mptcp_listener();
    let port = mptcp.local_addr().unwrap().port();
    let g = guarded(port, sluice::base::clock::wall_ms());
    pass(&g, "a SYN to an MPTCP listener", &Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN));
    assert_eq!(counter(&g, SLUICE_CS_SYNACK_PKTS), 0);
}

/// Issue 37: a guard with a direct family answers that family's SYNs
/// without the socket lookup (counted SLUICE_CS_SYNACK_DIRECT), except
/// from a client address whose bit is set in syn_peers: by the daemon's
/// reader (every socket on the class's ports when the guard starts
/// answering), or by the gate itself (a segment of the class that finds
/// its own socket). Open or in TIME_WAIT, such a 4-tuple's SYN goes on to
/// the kernel, as with the lookup. The reader also names the ports with an
/// MPTCP listener.
#[test]
fn a_direct_guard_skips_the_lookup_except_for_a_client_holding_a_socket() {
    use sluice::signals::discover::Listeners;
    use sluice::signals::syn_peers::{direct_bits, peer_bit, peer_key, SynPeers};
    let now = sluice::base::clock::wall_ms();
    let (l, port) = listener();
    let g = guarded(port, now);
    let direct =
        |bits| sluice_syn_guard { answer: 1, check_until_ms: now + 200_000, direct: bits, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &direct(SLUICE_SYN_DIRECT_V4)).unwrap();
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (served, _) = l.accept().unwrap();
    let cport = client.local_addr().unwrap().port();
    let held = Segment::new("127.0.0.1", "127.0.0.1", cport, port, SYN);
    let answers = |g: &TestGate| (counter(g, SLUICE_CS_SYNACK_PKTS), counter(g, SLUICE_CS_SYNACK_DIRECT));
    // Before the reader: answered, the connection the kernel holds unseen (what the reader is for).
    assert_eq!(answer(&g, &held).0, XDP_TX);
    assert_eq!(answers(&g), (1, 1));
    let mut peers = SynPeers::new(Listeners::new(0).unwrap()).unwrap();
    let holding = peers.holding(&[(port, port)]).unwrap();
    let me = peer_key("127.0.0.1".parse().unwrap());
    assert!(holding.contains(&me), "the client's address: {holding:?}");
    g.gate.set_syn_peer_words(&peers.add(&holding)).unwrap();
    pass(&g, "an open connection's 4-tuple, its client's bit set by the daemon", &held);
    let other = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    assert_eq!(answer(&g, &other).0, XDP_TX, "another address: answered");
    assert_eq!(answers(&g), (2, 2));
    // Cleared: a segment of the connection sets the bit again, the gate's own.
    g.gate.clear_syn_peers().unwrap();
    assert!(g.gate.syn_peer_words().unwrap().is_empty());
    let mut ack = Segment::new("127.0.0.1", "127.0.0.1", cport, port, ACK);
    ack.ack = 1;
    pass(&g, "an ACK of the open connection", &ack);
    let bit = peer_bit(me);
    let want = (SLUICE_SYN_PEER_WORDS + bit / 64, 1u64 << (bit % 64));
    assert_eq!(g.gate.syn_peer_words().unwrap(), vec![want], "the gate's half holds the client's bit");
    pass(&g, "an open connection's 4-tuple, its client's bit set by the gate", &held);
    // The server closes first: its side of the 4-tuple goes to TIME_WAIT; the reader finds it too.
    drop(served);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut &client, &mut rest).unwrap();
    drop(client);
    std::thread::sleep(std::time::Duration::from_millis(50));
    g.gate.clear_syn_peers().unwrap();
    peers.release();
    let holding = peers.holding(&[(port, port)]).unwrap();
    assert!(holding.contains(&me), "TIME_WAIT is a socket too");
    g.gate.set_syn_peer_words(&peers.add(&holding)).unwrap();
    pass(&g, "a TIME_WAIT 4-tuple, its client's bit set", &held);
    // IPv6 only direct: an IPv4 SYN is looked up (and answered: the listener is there).
    g.gate.set_syn_guard(g.class("web"), &direct(SLUICE_SYN_DIRECT_V6)).unwrap();
    assert_eq!(answer(&g, &other).0, XDP_TX);
    assert_eq!(answers(&g), (3, 2));
    // The listener is on 127.0.0.1, not a wildcard: the daemon makes no such class direct.
    let mptcp = mptcp_listener();
    let mport = mptcp.local_addr().unwrap().port();
    let read = peers.listeners(true).unwrap().expect("read when asked");
    assert_eq!(direct_bits(&[(port, port)], &read.listeners, read.mptcp.as_ref()), 0);
    assert!(read.mptcp.as_ref().is_some_and(|m| m.contains(&mport)), "the MPTCP listener's port: {:?}", read.mptcp);
}

/// An MPTCP listener (IPPROTO_MPTCP) on 127.0.0.1.
fn mptcp_listener() -> TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2)/bind(2)/listen(2); the fd is owned by the listener returned.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_MPTCP);
        assert!(fd >= 0, "an MPTCP socket (net.mptcp.enabled): {}", std::io::Error::last_os_error());
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as u16;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        assert_eq!(libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len), 0);
        assert_eq!(libc::listen(fd, 16), 0);
        TcpListener::from_raw_fd(fd)
    }
}

/// A listener on 127.0.0.1 (the checker looks it up in this namespace) and a gate guarding its port.
fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// The client's ACK to a SYN-ACK: seq = ISN + 1, ack = cookie + 1, echoing its TSval.
fn ack_for(syn: &Segment, sa: &Parsed) -> Segment {
    let mut a = Segment::new("127.0.0.2", "127.0.0.1", syn.sport, syn.dport, ACK);
    a.seq = syn.seq.wrapping_add(1);
    a.ack = sa.seq.wrapping_add(1);
    let tsval = sa.option(8).map_or(0, |t| u32::from_be_bytes(t[0..4].try_into().unwrap()));
    a.options = ts_options(778, tsval);
    a
}

#[test]
fn the_checker_takes_a_valid_cookie_and_refuses_a_wrong_or_expired_one() {
    let (_l, port) = listener();
    let now = sluice::base::clock::wall_ms();
    let mut g = guarded(port, now);
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(65495, 777);
    let (verdict, sa) = answer(&g, &syn);
    assert_eq!(verdict, XDP_TX);
    // A test run's packet is not at tc ingress, so bpf_sk_assign_tcp_reqsk
    // refuses every request socket here: a valid cookie counts as refused
    // (tests/syn_cookies.rs sees them taken on a real interface).
    let valid = |g: &TestGate| counter(g, SLUICE_CS_COOKIE_OK) + counter(g, SLUICE_CS_COOKIE_REFUSED);
    let check = |g: &TestGate, a: &Segment| {
        let before = (valid(g), counter(g, SLUICE_CS_COOKIE_BAD));
        assert_eq!(g.gate.test_run(Prog::CookieAck, &a.build(), 1).unwrap().0, 0, "TC_ACT_OK: never dropped");
        (valid(g) - before.0, counter(g, SLUICE_CS_COOKIE_BAD) - before.1)
    };
    let good = ack_for(&syn, &sa);
    assert_eq!(check(&g, &good), (1, 0), "the cookie the gate made");
    let mut wrong = good.clone();
    wrong.ack = wrong.ack.wrapping_add(1 << 9);
    assert_eq!(check(&g, &wrong), (0, 1), "a cookie off by one hash bit");
    let mut other_port = good.clone();
    other_port.sport += 1;
    assert_eq!(check(&g, &other_port), (0, 1), "a cookie for another connection");
    let mut other_isn = good.clone();
    other_isn.seq += 1;
    assert_eq!(check(&g, &other_isn), (0, 1), "a cookie for another ISN");
    // A cookie lives in its slot and the next: at least one slot, at most two.
    g.gate.set_clock(&Clock { epoch: 2, now_ms: now + SLUICE_COOKIE_SLOT_MS as u64, known_ttl_ms: 3_600_000 });
    assert_eq!(check(&g, &good), (1, 0), "one slot later");
    g.gate.set_clock(&Clock { epoch: 3, now_ms: now + 2 * SLUICE_COOKIE_SLOT_MS as u64, known_ttl_ms: 3_600_000 });
    assert_eq!(check(&g, &good), (0, 1), "two slots later: expired");
    // Another key (a restarted daemon): the old cookie is refused.
    g.gate.set_clock(&Clock { epoch: 4, now_ms: now, known_ttl_ms: 3_600_000 });
    g.gate.set_syn_key([KEY[0] ^ 1, KEY[1]], 1500);
    assert_eq!(check(&g, &good), (0, 1), "a cookie of another key");
}

#[test]
fn the_checker_leaves_acks_alone_outside_a_guard_or_without_a_listener() {
    let now = sluice::base::clock::wall_ms();
    let (l, port) = listener();
    let g = guarded(port, now);
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(65495, 777);
    let (_, sa) = answer(&g, &syn);
    let good = ack_for(&syn, &sa);
    let counted = |g: &TestGate| {
        counter(g, SLUICE_CS_COOKIE_OK) + counter(g, SLUICE_CS_COOKIE_BAD) + counter(g, SLUICE_CS_COOKIE_REFUSED)
    };
    let past = sluice_syn_guard { answer: 0, check_until_ms: now - 1, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &past).unwrap();
    g.gate.test_run(Prog::CookieAck, &good.build(), 1).unwrap();
    assert_eq!(counted(&g), 0, "the guard's checking time is over: not looked at");
    let on = sluice_syn_guard { answer: 1, check_until_ms: now + 1000, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &on).unwrap();
    drop(l);
    g.gate.test_run(Prog::CookieAck, &good.build(), 1).unwrap();
    assert_eq!(counted(&g), 0, "no listener: the kernel answers (a RST), nothing to count");
}

/// Issue 22, item 3: while the guard answers, an ACK or RST that finds only
/// the listener (no connection) and carries no valid cookie is dropped,
/// counted; a valid cookie's ACK, a connection's own packets and anything
/// while the guard is off pass.
#[test]
fn acks_and_rsts_of_no_connection_are_dropped_while_the_guard_answers() {
    const XDP_DROP: u32 = 1;
    let (l, port) = listener();
    let g = guarded(port, sluice::base::clock::wall_ms());
    let verdict = |s: &Segment| g.gate.test_run(Prog::Gate, &s.build(), 1).unwrap().0;
    let mut junk = Segment::new("127.0.0.2", "127.0.0.1", 40001, port, ACK);
    (junk.seq, junk.ack) = (0x1111_1111, 0x2222_2222);
    assert_eq!(verdict(&junk), XDP_DROP, "an ACK of no connection with a random cookie");
    let rst = Segment::new("127.0.0.2", "127.0.0.1", 40002, port, common::tcp::RST);
    assert_eq!(verdict(&rst), XDP_DROP, "an RST of no connection");
    assert_eq!(counter(&g, SLUICE_CS_DROP_NOCONN_PKTS), 2);
    // The ACK of a SYN the gate answered passes (the checker opens the connection).
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(65495, 777);
    let (_, sa) = answer(&g, &syn);
    assert_eq!(verdict(&ack_for(&syn, &sa)), XDP_PASS, "a valid gate cookie");
    // A connection's own packets find its socket.
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (_served, _) = l.accept().unwrap();
    let cport = client.local_addr().unwrap().port();
    let mut own = Segment::new("127.0.0.1", "127.0.0.1", cport, port, ACK);
    (own.seq, own.ack) = (5, 6);
    assert_eq!(verdict(&own), XDP_PASS, "a packet of an open connection (whatever its numbers)");
    let off = sluice_syn_guard { answer: 0, check_until_ms: 0, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &off).unwrap();
    assert_eq!(verdict(&junk), XDP_PASS, "the guard off: the kernel's RST, as before");
    assert_eq!(counter(&g, SLUICE_CS_DROP_NOCONN_PKTS), 2);
}

/// A TCP segment (the testkit's frame: a SYN) with its flags set to `flags`.
fn with_flags(frame: Frame, flags: u8) -> Vec<u8> {
    let (mut b, offs) = frame.build_with_offsets();
    let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
    b[l4 + 13] = flags;
    b
}

/// Issue 49, item 6: the cookie paths take IPv4 without options and IPv6
/// with TCP first, and anything else went to the kernel unanswered and
/// undropped, so one IPv4 option or a destination-options header took a SYN
/// or ACK flood past the guard. While the guard answers they are dropped and
/// counted; with the guard off they pass, as before.
#[test]
fn syns_and_acks_the_cookie_paths_cannot_check_are_dropped_while_the_guard_answers() {
    const XDP_DROP: u32 = 1;
    let (_l, port) = listener();
    let l6 = TcpListener::bind("[::1]:0").unwrap();
    let port6 = l6.local_addr().unwrap().port();
    let mut g = TestGate::new(&[&format!("web:match=tcp:{port},match=tcp:{port6}")]);
    g.gate.set_syn_key(KEY, 1500);
    let now_ms = sluice::base::clock::wall_ms();
    g.gate.set_clock(&Clock { epoch: 1, now_ms, known_ttl_ms: 3_600_000 });
    let guard = sluice_syn_guard { answer: 1, check_until_ms: now_ms + 200_000, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &guard).unwrap();
    let verdict = |f: &[u8]| g.gate.test_run(Prog::Gate, f, 1).unwrap().0;
    let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 40000, port, SYN);
    syn.options = linux_syn_options(1460, 777);
    assert_eq!(verdict(&syn.build()), XDP_TX, "a plain SYN is answered");
    let odd4 = |flags| with_flags(Frame::tcp("127.0.0.2", "127.0.0.1", 40001, port).options(4), flags);
    assert_eq!(verdict(&odd4(SYN)), XDP_DROP, "a SYN with an IPv4 option");
    assert_eq!(verdict(&odd4(ACK)), XDP_DROP, "an ACK with an IPv4 option");
    let mut syn6 = Segment::new("::1", "::1", 40000, port6, SYN);
    syn6.options = linux_syn_options(1440, 777);
    assert_eq!(verdict(&syn6.build()), XDP_TX, "a plain IPv6 SYN is answered");
    let odd6 = |flags| with_flags(Frame::tcp("::1", "::1", 40001, port6).ext(Ext::DestOpts), flags);
    assert_eq!(verdict(&odd6(SYN)), XDP_DROP, "an IPv6 SYN after destination options");
    assert_eq!(verdict(&odd6(ACK)), XDP_DROP, "an IPv6 ACK after destination options");
    assert_eq!(counter(&g, SLUICE_CS_DROP_NOCONN_PKTS), 4);
    assert_eq!(g.counters().global.odd_l3_drop, 4);
    // The guard off: they pass, as before.
    let off = sluice_syn_guard { answer: 0, check_until_ms: 0, ..Default::default() };
    g.gate.set_syn_guard(g.class("web"), &off).unwrap();
    assert_eq!(verdict(&odd4(SYN)), XDP_PASS);
    assert_eq!(verdict(&odd6(ACK)), XDP_PASS);
    assert_eq!(g.counters().global.odd_l3_drop, 4);
}

/// Issue 49, item 6: a known client's SYNs skipped the cookies with no rate
/// check, so a SYN flood spoofing one known address (or any address of a
/// known IPv6 /64) reached the listener whole. Within its own rate a known
/// client's SYN goes to the kernel; past it, it is answered with a cookie.
#[test]
fn a_known_clients_syns_skip_the_cookies_only_within_its_own_rate() {
    let (_l, port) = listener();
    let now_ms = sluice::base::clock::wall_ms();
    let g = guarded(port, now_ms);
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&[127, 0, 0, 2]);
    let key = sluice_src_key { class_id: g.class("web") as u8, family: 4, plen: 32, addr, ..Default::default() };
    // Answered 10 times over 10 s: 1/s, at least SLUICE_KNOWN_MIN_PPS (10) x
    // SLUICE_KNOWN_HEADROOM (4) = 40/s, bursts of 100 ms (at least 8 intervals): 9 back to back.
    let entry = sluice_known { first_ms: now_ms - 10_000, last_ms: now_ms, answers: 10, ..Default::default() };
    g.gate.insert_known(&[(key, entry)]).unwrap();
    let mut verdicts = Vec::new();
    for i in 0..20u16 {
        let mut syn = Segment::new("127.0.0.2", "127.0.0.1", 41000 + i, port, SYN);
        syn.options = linux_syn_options(1460, 777);
        verdicts.push(answer(&g, &syn).0);
    }
    let passed = verdicts.iter().filter(|&&v| v == XDP_PASS).count();
    assert_eq!(passed, 9, "within its own rate: the kernel's path ({verdicts:?})");
    assert!(verdicts[9..].iter().all(|&v| v == XDP_TX), "past it: cookies ({verdicts:?})");
}
