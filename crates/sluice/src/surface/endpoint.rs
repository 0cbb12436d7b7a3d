//! The metrics endpoint (`GET /metrics`), built so that it cannot be used
//! against the daemon, nor kept from answering a scrape: one thread, poll(2)
//! over the listener and at most CONNS connections, none of which can hold
//! it. Each request is bounded in size (HEAD_MAX bytes of request head) and
//! in time (DEADLINE from accept to the last byte of the answer, however
//! slowly its bytes come); an answer goes out without blocking (a client
//! that does not read it is cut at its deadline).
//!
//! When all CONNS slots are taken, a new connection takes one from another
//! (`victim`): an untrusted holder's before a trusted one's, one not being
//! answered before one that is, from the holder with the most slots, its
//! oldest. A holder is a local user where the connection comes from this
//! host (its socket's owner, found by sock_diag: every local user shares
//! the address 127.0.0.1, and one user can take any other loopback
//! address), or else the peer's IP address; only a local root, system or
//! systemd dynamic user is trusted (discovery's rule). So connections that
//! send nothing cannot shut a scrape out, a burst from one peer or one
//! local user never evicts another's scrape, and no local user can evict
//! a local scraper run by root or a system user.
//!
//! The request head is parsed by httparse. (tiny_http, used before, started
//! a thread per open connection; a pool of two workers after it was held
//! by any two slow clients.)
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::signals::discover;
use crate::signals::sock_diag::SockDiag;

/// Connections open at once; past this a new one takes the oldest's slot.
pub const CONNS: usize = 64;
/// The longest request head read (a scrape's is a few hundred bytes).
pub const HEAD_MAX: usize = 8192;
/// The whole request, from accept to the last byte of the answer.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// What the endpoint answers: the metrics text for a client that accepts
/// OpenMetrics (true) or not.
pub type Render = Arc<dyn Fn(bool) -> String + Send + Sync>;

/// Bind `addr` (errors name it and the way out).
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        anyhow::anyhow!("cannot serve metrics on {addr}: {e}; set metrics = \"off\" or another address (--metrics)")
    })
}

/// Serve `/metrics` on `listener` from now on (a thread that lives as long as the process).
pub fn serve(listener: TcpListener, render: Render) {
    std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || run(&listener, &render))
        .expect("starting the metrics thread");
}

/// The endpoint's thread's name (in /proc/PID/task/*/comm).
pub const THREAD_NAME: &str = "sluice-metrics";

/// Who holds a connection (the unit `victim` counts slots by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    /// A process of this host, by its socket's owner.
    User(u32),
    /// Anyone else (or a local socket whose owner was not found), by address.
    Addr(IpAddr),
}

/// A connection's holder, and whether it is a trusted local user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Peer {
    holder: Holder,
    trusted: bool,
}

/// Finds who is at the other end of a connection.
struct Peers {
    /// None where sock_diag could not be opened: every peer by address.
    diag: Option<SockDiag>,
    logins: (u32, u32),
}

impl Peers {
    fn new() -> Peers {
        Peers { diag: SockDiag::open(None).ok(), logins: discover::login_uids() }
    }

    /// The peer at `from` of a connection accepted on `to`.
    fn of(&mut self, from: SocketAddr, to: SocketAddr) -> Peer {
        let owner = self.diag.as_mut().and_then(|d| d.tcp_owner(from, to).ok().flatten());
        match owner {
            Some(uid) => Peer { holder: Holder::User(uid), trusted: discover::trusted(uid, self.logins) },
            None => Peer { holder: Holder::Addr(from.ip().to_canonical()), trusted: false },
        }
    }
}

/// One connection: its request head so far, then its answer's unsent bytes.
struct Conn {
    stream: TcpStream,
    peer: Peer,
    deadline: Instant,
    head: Vec<u8>,
    out: Option<(Vec<u8>, usize)>,
}

/// What a connection needs next.
enum Step {
    Wait,
    Done,
}

impl Conn {
    fn new(stream: TcpStream, peer: Peer) -> std::io::Result<Conn> {
        stream.set_nonblocking(true)?;
        Ok(Conn { stream, peer, deadline: Instant::now() + DEADLINE, head: Vec::with_capacity(1024), out: None })
    }

    /// Read what came, answer once the head is whole (or too long), send
    /// what the socket takes.
    fn step(&mut self, render: &Render) -> Step {
        if self.out.is_none() {
            let mut buf = [0u8; 1024];
            loop {
                match self.stream.read(&mut buf) {
                    Ok(0) => return Step::Done,
                    Ok(n) => self.head.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => return Step::Done,
                }
                if self.head.len() >= HEAD_MAX {
                    break;
                }
            }
            let parsed = if self.head.len() >= HEAD_MAX { Some(Parsed::TooLong) } else { parse(&self.head) };
            match parsed {
                Some(p) => self.out = Some((answer(p, render), 0)),
                None => return Step::Wait,
            }
        }
        let (bytes, sent) = self.out.as_mut().expect("set above");
        while *sent < bytes.len() {
            match self.stream.write(&bytes[*sent..]) {
                Ok(n) => *sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Wait,
                Err(_) => return Step::Done,
            }
        }
        Step::Done
    }

    /// Cut at the deadline: a 400 if nothing was answered yet (best effort).
    fn expire(self) {
        self.cut("400 Bad Request", "sluice: request too slow\n");
    }

    /// Cut to make room for another: a 503 if nothing was answered yet.
    fn evict(self) {
        self.cut("503 Service Unavailable", "sluice: too many connections, try again\n");
    }

    fn cut(mut self, status: &str, why: &str) {
        if self.out.is_none() {
            let _ = self.stream.write(&reply(status, "text/plain", why));
        }
    }
}

/// The poll loop: the listener, then each connection; expired ones cut.
fn run(listener: &TcpListener, render: &Render) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut conns: Vec<Conn> = Vec::new();
    let mut peers = Peers::new();
    loop {
        // A connection waits to read its request, or to write its answer.
        let wants = |c: &Conn| if c.out.is_some() { libc::POLLOUT } else { libc::POLLIN };
        let mut fds: Vec<libc::pollfd> = std::iter::once((listener.as_raw_fd(), libc::POLLIN))
            .chain(conns.iter().map(|c| (c.stream.as_raw_fd(), wants(c))))
            .map(|(fd, events)| libc::pollfd { fd, events, revents: 0 })
            .collect();
        let now = Instant::now();
        let wait = conns.iter().map(|c| c.deadline.saturating_duration_since(now)).min().unwrap_or(DEADLINE);
        // SAFETY: fds is a live array of fds.len() pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait.as_millis() as libc::c_int + 1) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut keep = Vec::with_capacity(conns.len());
        for (mut c, r) in conns.into_iter().zip(ready) {
            match (r, Instant::now() >= c.deadline) {
                (_, true) => c.expire(),
                (true, false) => {
                    if let Step::Wait = c.step(render) {
                        keep.push(c);
                    }
                }
                (false, false) => keep.push(c),
            }
        }
        conns = keep;
        if fds[0].revents != 0 {
            accept_all(listener, &mut peers, &mut conns);
        }
    }
}

/// Take every waiting connection; when CONNS are open, one makes room
/// (`victim`).
fn accept_all(listener: &TcpListener, peers: &mut Peers, conns: &mut Vec<Conn>) {
    while let Ok((stream, from)) = listener.accept() {
        let peer = match stream.local_addr() {
            Ok(to) => peers.of(from, to),
            Err(_) => Peer { holder: Holder::Addr(from.ip()), trusted: false },
        };
        let Ok(c) = Conn::new(stream, peer) else { continue };
        if conns.len() >= CONNS {
            let slots: Vec<Slot> = conns.iter().map(|c| (c.peer, c.out.is_some(), c.deadline)).collect();
            conns.swap_remove(victim(&slots)).evict();
        }
        conns.push(c);
    }
}

/// What `victim` weighs of a connection: its peer, whether it is being
/// answered, its deadline (the oldest's is the soonest).
type Slot = (Peer, bool, Instant);

/// The slot that is given up: an untrusted peer's before a trusted one's,
/// one not being answered before one that is, the holder's with the most
/// slots, its oldest.
fn victim(slots: &[Slot]) -> usize {
    let mut held: std::collections::HashMap<Holder, usize> = std::collections::HashMap::new();
    for (peer, ..) in slots {
        *held.entry(peer.holder).or_default() += 1;
    }
    (0..slots.len())
        .min_by_key(|&i| {
            let (peer, answering, deadline) = slots[i];
            (peer.trusted, answering, std::cmp::Reverse(held[&peer.holder]), deadline)
        })
        .expect("CONNS > 0")
}

/// The answer to a whole request head.
fn answer(p: Parsed, render: &Render) -> Vec<u8> {
    match p {
        Parsed::Metrics { openmetrics: true } => {
            reply("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", &render(true))
        }
        Parsed::Metrics { openmetrics: false } => {
            reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", &render(false))
        }
        Parsed::Elsewhere => reply("404 Not Found", "text/plain", "sluice: metrics are at /metrics\n"),
        Parsed::Bad => reply("400 Bad Request", "text/plain", "sluice: not an HTTP request\n"),
        Parsed::TooLong => reply("400 Bad Request", "text/plain", "sluice: request head too long\n"),
    }
}

fn reply(status: &str, ctype: &str, body: &str) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body.as_bytes()].concat()
}

/// A request head, once complete.
#[derive(Debug, PartialEq)]
enum Parsed {
    Metrics { openmetrics: bool },
    Elsewhere,
    Bad,
    TooLong,
}

/// None while the head is incomplete.
fn parse(head: &[u8]) -> Option<Parsed> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(Parsed::Bad),
        Ok(httparse::Status::Complete(_)) => {
            if req.method != Some("GET") || req.path.map(|p| p.split('?').next() != Some("/metrics")).unwrap_or(true) {
                return Some(Parsed::Elsewhere);
            }
            let openmetrics = req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("accept")
                    && String::from_utf8_lossy(h.value).contains("application/openmetrics-text")
            });
            Some(Parsed::Metrics { openmetrics })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_read_whole_and_routed() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None, "incomplete: wait for more");
        assert_eq!(parse(b"GET /metrics HTTP/1.0\r\n\r\n"), Some(Parsed::Metrics { openmetrics: false }));
        let om = b"GET /metrics?x=1 HTTP/1.1\r\naccept: application/openmetrics-text; version=1.0.0\r\n\r\n";
        assert_eq!(parse(om), Some(Parsed::Metrics { openmetrics: true }));
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Some(Parsed::Elsewhere));
        assert_eq!(parse(b"POST /metrics HTTP/1.1\r\n\r\n"), Some(Parsed::Elsewhere));
        assert_eq!(parse(b"\x16\x03\x01 binary junk\r\n\r\n"), Some(Parsed::Bad));
    }

    /// The tests start endpoints (whose threads live on): one at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// This process's metrics threads.
    fn threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == THREAD_NAME))
            .count()
    }

    /// A scrape over a fresh connection: the answer, or what came.
    fn scrape(addr: SocketAddr) -> String {
        scrape_over(TcpStream::connect(addr).unwrap())
    }

    /// A new endpoint on loopback, answering "x": its address.
    fn serving_x() -> SocketAddr {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::new(|_| "x\n".into()));
        addr
    }

    /// A scrape over the connection `c`: the answer, or what came.
    fn scrape_over(mut c: TcpStream) -> String {
        c.set_read_timeout(Some(DEADLINE * 2)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    /// Issue 23, item 11: with two workers and a queue of 16, about 18 slow
    /// connections every 2 s refused every scrape. Now hundreds held open
    /// neither start threads nor delay a scrape, which is answered at once.
    #[test]
    fn hundreds_of_half_open_requests_cost_no_thread_and_never_delay_a_scrape() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::new(|om| if om { "om\n".into() } else { "text\n".into() }));
        std::thread::sleep(Duration::from_millis(50));
        let before = threads();
        assert!(before >= 1, "the endpoint's thread is named {THREAD_NAME}");
        // 300 connections that send half a request and then nothing, kept open.
        let idle: Vec<TcpStream> = (0..300)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .map(|mut c| {
                let _ = c.write_all(b"GET /metr");
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(threads(), before, "the endpoint started threads for idle connections");
        for i in 0..5 {
            let t = Instant::now();
            let body = scrape(addr);
            assert!(body.starts_with("HTTP/1.1 200") && body.ends_with("\r\n\r\ntext\n"), "scrape {i}: {body:?}");
            assert!(t.elapsed() < DEADLINE, "scrape {i} waited {:?} behind the idle connections", t.elapsed());
        }
        assert_eq!(threads(), before);
        drop(idle);
    }

    /// Connections to `addr` made by `uid` (a socket's owner is the fsuid
    /// of the thread that made it), one from each of `from` (a loopback
    /// address, port 0: any), a pause every 32 so that the endpoint's
    /// accept queue (128) keeps up on a slow host.
    fn connect_as(uid: u32, addr: SocketAddr, from: Vec<[u8; 4]>) -> Vec<TcpStream> {
        std::thread::spawn(move || {
            // SAFETY: setfsuid changes this thread's file-system uid only.
            unsafe { libc::setfsuid(uid) };
            let one = |ip: [u8; 4]| -> Option<TcpStream> {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
                s.bind(&SocketAddr::from((ip, 0)).into()).ok()?;
                s.connect(&addr.into()).ok()?;
                Some(s.into())
            };
            let mut made = Vec::with_capacity(from.len());
            for chunk in from.chunks(32) {
                made.extend(chunk.iter().filter_map(|&ip| one(ip)));
                std::thread::sleep(Duration::from_millis(2));
            }
            made
        })
        .join()
        .unwrap()
    }

    /// The scrape over `scraper`, connected at `since`, sent once a burst
    /// of `burst` connections is in: not evicted (a 503). Answered, or, on
    /// a host so slow that the burst took the whole deadline, cut at its
    /// deadline (a 400, said: not evicted either).
    fn scrape_after_burst(scraper: TcpStream, since: Instant, burst: usize) {
        std::thread::sleep(Duration::from_millis(200));
        let out = scrape_over(scraper);
        assert!(!out.starts_with("HTTP/1.1 503"), "evicted by a burst of {burst}: {out:?}");
        if !out.starts_with("HTTP/1.1 200") {
            assert!(out.starts_with("HTTP/1.1 400") && since.elapsed() >= DEADLINE, "{out:?}");
            eprintln!("not evicted, cut at its deadline: the burst of {burst} took {:?}", since.elapsed());
        }
    }

    /// Hardening (issue 35, item 13): a burst of connections from one peer,
    /// past CONNS, makes room from that peer's own connections: a scrape
    /// that connected before the burst and sends its request after it is
    /// not evicted. Before, the oldest connection went first: the scrape.
    /// Both are untrusted local users here (nobody's burst, a login user's
    /// scrape), so only the count of slots held decides.
    #[test]
    fn a_burst_from_one_peer_never_evicts_another_peers_scrape() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let addr = serving_x();
        let since = Instant::now();
        let scraper = connect_as(discover::login_uids().0, addr, vec![[127, 0, 0, 1]]).pop().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let burst = connect_as(65534, addr, vec![[127, 0, 0, 1]; 3 * CONNS]);
        scrape_after_burst(scraper, since, burst.len());
    }

    /// Issue 49, item 11: every local user connects from 127.0.0.1 (and can
    /// take any other loopback address), so when slots were counted by
    /// address, a local user's burst of connections, spread over 200
    /// loopback addresses or not, made room by evicting root's scrape,
    /// the oldest. Now a local connection's holder is its socket's owner,
    /// and an untrusted one's slots go before a trusted one's.
    #[test]
    fn a_local_users_connections_never_evict_a_scrape_root_runs() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let addr = serving_x();
        let since = Instant::now();
        let scraper = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // nobody's, from 127.0.0.1, then one from each of 127.0.1.1-200.
        let mut from = vec![[127, 0, 0, 1]; CONNS];
        from.extend((1..=200).map(|i| [127, 0, 1, i]));
        let burst = connect_as(65534, addr, from);
        assert!(burst.len() > 2 * CONNS, "the burst made {} connections", burst.len());
        scrape_after_burst(scraper, since, burst.len());
    }

    /// The order slots are given up in, on made-up peers.
    #[test]
    fn the_untrusted_the_unanswered_and_the_largest_holders_oldest_go_first() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let user = |uid, trusted| Peer { holder: Holder::User(uid), trusted };
        let remote = |last: u8| Peer { holder: Holder::Addr(IpAddr::from([192, 0, 2, last])), trusted: false };
        let root = user(0, true);
        // A trusted holder of many slots keeps them while anyone else has one.
        let slots = [(root, false, at(1)), (root, false, at(2)), (root, false, at(3)), (remote(1), false, at(9))];
        assert_eq!(victim(&slots), 3);
        // Among the untrusted: the unanswered, then the holder of the most, then the oldest.
        let slots = [
            (user(1000, false), true, at(1)),
            (remote(1), false, at(5)),
            (remote(2), false, at(6)),
            (remote(2), false, at(7)),
            (root, false, at(0)),
        ];
        assert_eq!(victim(&slots), 2, "remote 2 holds two unanswered slots; its oldest");
        let slots = [(user(1000, false), true, at(1)), (remote(1), false, at(5)), (remote(2), false, at(4))];
        assert_eq!(victim(&slots), 2, "one slot each: the oldest unanswered");
        let slots = [(user(1000, false), true, at(1)), (root, false, at(0))];
        assert_eq!(victim(&slots), 0, "an untrusted slot being answered goes before a trusted one");
    }

    /// The peer of a connection from this host is its socket's owner; the
    /// owner of a closed connection's address is not found.
    #[test]
    fn a_local_connections_peer_is_the_user_that_made_its_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut peers = Peers::new();
        assert!(peers.diag.is_some(), "sock_diag opens (as any user)");
        let mine = TcpStream::connect(addr).unwrap();
        let (_, from) = listener.accept().unwrap();
        let me = unsafe { libc::geteuid() };
        let trusted = discover::trusted(me, discover::login_uids());
        assert_eq!(peers.of(from, addr), Peer { holder: Holder::User(me), trusted });
        let nobodys = connect_as(65534, addr, vec![[127, 0, 0, 1]]);
        let (_, from) = listener.accept().unwrap();
        if me == 0 {
            assert_eq!(peers.of(from, addr), Peer { holder: Holder::User(65534), trusted: false });
        }
        drop((mine, nobodys));
        std::thread::sleep(Duration::from_millis(50));
        let gone = SocketAddr::from(([127, 0, 0, 1], 9));
        assert_eq!(peers.of(gone, addr), Peer { holder: Holder::Addr(gone.ip()), trusted: false });
    }

    #[test]
    fn a_slow_client_is_cut_at_the_deadline_and_a_long_head_refused() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let addr = serving_x();
        // One byte every 300 ms: the request never completes before DEADLINE.
        let mut slow = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        slow.set_read_timeout(Some(DEADLINE * 3)).unwrap();
        let mut out = String::new();
        for b in b"GET /metrics HTTP/1.1\r\n" {
            if slow.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            if started.elapsed() > DEADLINE + Duration::from_millis(500) {
                break;
            }
        }
        let _ = slow.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 400"), "{out:?}");
        assert!(started.elapsed() < DEADLINE * 3);
        let mut long = TcpStream::connect(addr).unwrap();
        let mut req = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        req.extend(std::iter::repeat_n(b'a', HEAD_MAX + 10));
        let _ = long.write_all(&req);
        let mut out = String::new();
        let _ = long.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 400"), "{out:?}");
    }
}
