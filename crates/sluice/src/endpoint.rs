//! The metrics endpoint (`GET /metrics`), built so that it cannot be used
//! against the daemon: a fixed number of threads (one acceptor, WORKERS
//! workers), at most QUEUE connections waiting for a worker (more are closed
//! at once), and each request bounded in size (HEAD_MAX bytes of request
//! head) and in time (DEADLINE for the whole request, however slowly its
//! bytes come). A client that opens connections and sends nothing costs
//! the daemon a slot for DEADLINE, never a thread. (tiny_http, used before,
//! started a thread per open connection: 300 half-open requests took the
//! daemon from 9 threads to 256.) The request head is parsed by httparse.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

/// Workers answering requests (the acceptor is one more thread).
pub const WORKERS: usize = 2;
/// Connections accepted and waiting for a worker; past this they are closed.
pub const QUEUE: usize = 16;
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

/// Serve `/metrics` on `listener` from now on (threads that live as long as the process).
pub fn serve(listener: TcpListener, render: Render) {
    let (tx, rx) = mpsc::sync_channel::<TcpStream>(QUEUE);
    let rx = Arc::new(Mutex::new(rx));
    let named = || std::thread::Builder::new().name(THREAD_NAME.into());
    for _ in 0..WORKERS {
        let (rx, render) = (rx.clone(), render.clone());
        named().spawn(move || work(&rx, &render)).expect("starting a metrics thread");
    }
    named().spawn(move || accept(&listener, &tx)).expect("starting the metrics acceptor");
}

/// The endpoint's threads' name (in /proc/PID/task/*/comm).
pub const THREAD_NAME: &str = "sluice-metrics";

fn accept(listener: &TcpListener, tx: &SyncSender<TcpStream>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        match tx.try_send(conn) {
            Ok(()) => {}
            // Every worker busy and the queue full: close it (dropped here).
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

fn work(rx: &Mutex<Receiver<TcpStream>>, render: &Render) {
    loop {
        let conn = match rx.lock().unwrap().recv() {
            Ok(c) => c,
            Err(_) => return,
        };
        let _ = answer(conn, render);
    }
}

/// Read one request head within DEADLINE and HEAD_MAX, answer it, close.
fn answer(mut conn: TcpStream, render: &Render) -> std::io::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let request = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() >= HEAD_MAX {
            return respond(
                &mut conn,
                deadline,
                "400 Bad Request",
                "text/plain",
                "sluice: request too slow or too long\n",
            );
        }
        conn.set_read_timeout(Some(left))?;
        let n = match conn.read(&mut buf) {
            Ok(n) => n,
            // The deadline passed: answered at the top of the loop.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        match parse(&head) {
            Some(r) => break r,
            None => continue,
        }
    };
    let (status, ctype, body) = match request {
        Parsed::Metrics { openmetrics: true } => {
            ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(true))
        }
        Parsed::Metrics { openmetrics: false } => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(false)),
        Parsed::Elsewhere => ("404 Not Found", "text/plain", "sluice: metrics are at /metrics\n".to_string()),
        Parsed::Bad => ("400 Bad Request", "text/plain", "sluice: not an HTTP request\n".to_string()),
    };
    respond(&mut conn, deadline, status, ctype, &body)
}

/// A request head, once complete.
#[derive(Debug, PartialEq)]
enum Parsed {
    Metrics { openmetrics: bool },
    Elsewhere,
    Bad,
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

fn respond(conn: &mut TcpStream, deadline: Instant, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    conn.set_write_timeout(Some(left))?;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
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
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// This process's metrics threads.
    fn threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == THREAD_NAME))
            .count()
    }

    #[test]
    fn hundreds_of_half_open_requests_cost_no_thread_and_a_scrape_still_answers() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::new(|om| if om { "om\n".into() } else { "text\n".into() }));
        std::thread::sleep(Duration::from_millis(50));
        let before = threads();
        assert!(before > WORKERS, "the endpoint's threads are named {THREAD_NAME}");
        // 300 connections that send half a request and then nothing.
        let idle: Vec<TcpStream> = (0..300)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .map(|mut c| {
                let _ = c.write_all(b"GET /metr");
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(threads(), before, "the endpoint started threads for idle connections");
        // Once the stalled requests time out (DEADLINE each, WORKERS at a time,
        // at most QUEUE of them waiting), a scrape is answered.
        drop(idle);
        let deadline = Instant::now() + DEADLINE * (QUEUE as u32 / WORKERS as u32 + 2);
        let body = loop {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(DEADLINE * 2)).unwrap();
            c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut out = String::new();
            if c.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200") {
                break out;
            }
            assert!(Instant::now() < deadline, "no answer after the stalled requests: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(body.ends_with("\r\n\r\ntext\n"), "{body:?}");
        assert_eq!(threads(), before);
    }

    #[test]
    fn a_slow_client_is_cut_at_the_deadline_and_a_long_head_refused() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::new(|_| "x\n".into()));
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
