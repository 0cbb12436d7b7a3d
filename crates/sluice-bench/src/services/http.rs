//! A real HTTP service for the `http` scenario: Debian's nginx (one worker)
//! answering a fixed 200 from memory, and wrk as its legitimate clients,
//! all inside the testbed's namespaces. wrk is closed-loop (each connection
//! sends its next request when the answer came): it has no asked rate, so
//! its figure is the requests/s it got. Every request opens a connection
//! (`Connection: close`), so the listen queue and SYN handling are in the
//! legitimate path, as they are for a site's many short-lived clients.
//!
//! Beside wrk, [`start_probe`] times new connections (connect p50/p99) and
//! keeps one connection open for the whole cell, asking a request every
//! KEPT_INTERVAL over it: the clients a SYN flood must not touch. The probe
//! is a light client on a host of its own (LIGHT_CLIENT_V4/V6): wrk, a
//! closed loop that keeps nginx's CPU busy alone, is a heavy client, and
//! no rule that tells clients apart by address could tell the light one
//! from it on one address.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::testbed::procs::{in_ns, Proc};

pub const PORT: u16 = 80;

/// nginx.conf: foreground, one worker, port 80 on both families, no logs,
/// no files served. The worker runs as www-data, as Debian's own nginx.conf
/// has it: without a `user` line nginx's worker is nobody's, and sluice's
/// discovery puts a service of nobody's in the untrusted `users/ports` class,
/// which no packaged nginx lands in.
///
/// With `php`, every request goes to php-fpm over its unix socket
/// (`fastcgi_pass`, a connection per request as nginx's default), which
/// runs PHP_SCRIPT: a PHP site, whose work is mostly its backend's.
pub fn nginx_conf(dir: &Path, php: bool) -> String {
    let d = dir.display();
    let location = if php {
        format!(
            "location / {{ fastcgi_pass unix:{d}/php.sock; fastcgi_param SCRIPT_FILENAME {d}/work.php; \
             fastcgi_param REQUEST_METHOD $request_method; }}"
        )
    } else {
        "location / { return 200 \"sluice bench\\n\"; }".to_string()
    };
    format!(
        "daemon off;\nmaster_process on;\nuser www-data;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log error;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 300s;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         server {{\n    listen {PORT};\n    listen [::]:{PORT};\n    \
         {location}\n  }}\n}}\n"
    )
}

/// The PHP page of `nginx_conf`'s php mode: a little arithmetic, then the
/// body the clients look for (BODY), with its length (without it nginx
/// would send the answer chunked, and the clients would not find BODY at
/// its end).
pub const PHP_SCRIPT: &str = "<?php $x = 0; for ($i = 0; $i < 2000; $i++) { $x += $i % 7; }\n\
    header(\"X-Sum: $x\"); header(\"Content-Length: 13\"); echo \"sluice bench\\n\";\n";

/// php-fpm's configuration for `start_php`: foreground, one static worker
/// (as nginx's one worker), listening on a unix socket in `dir` that
/// nginx's worker (www-data) may use, no php.ini.
pub fn php_fpm_conf(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "[global]\npid = {d}/php-fpm.pid\nerror_log = {d}/php-fpm.log\ndaemonize = no\n\
         [www]\nuser = www-data\ngroup = www-data\nlisten = {d}/php.sock\nlisten.owner = www-data\n\
         listen.group = www-data\nlisten.mode = 0660\npm = static\npm.max_children = 1\n"
    )
}

/// Debian's php-fpm (php-fpmX.Y in /usr/sbin) in namespace `ns` pinned to
/// `cpu`, its files in `dir`; returns once its socket is there.
pub fn start_php(dir: &Path, ns: &str, cpu: usize) -> Result<Proc> {
    let fpm = std::fs::read_dir("/usr/sbin")?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("php-fpm")))
        .context("php-fpm is not installed in /usr/sbin (make deps installs it)")?;
    let conf = dir.join("php-fpm.conf");
    std::fs::write(&conf, php_fpm_conf(dir))?;
    std::fs::write(dir.join("work.php"), PHP_SCRIPT)?;
    let sock = dir.join("php.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = in_ns(ns, Some(cpu));
    c.arg(&fpm).args(["-F", "-n", "-y"]).arg(&conf);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let p = Proc::spawn_server(c, "php-fpm (is it installed? make deps installs it)")?;
    p.wait_ready("php-fpm", &format!("its socket {}", sock.display()), Duration::from_secs(10), || Ok(sock.exists()))
}

/// nginx in namespace `ns` pinned to `cpu`, its files in `dir`; returns once
/// a connection from `client_ns` to `addr` port 80 is accepted. The client
/// namespace may reuse its TIME_WAIT ports (`clients_reuse_ports`).
pub fn start_nginx(
    dir: &Path,
    ns: &str,
    cpu: usize,
    client_ns: &str,
    addr: std::net::IpAddr,
    php: bool,
) -> Result<Proc> {
    clients_reuse_ports(client_ns)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, php))?;
    let mut c = in_ns(ns, Some(cpu));
    c.args(["nginx", "-p"]).arg(dir).arg("-e").arg(dir.join("error.log")).arg("-c").arg(&conf);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let to = SocketAddr::new(addr, PORT);
    let p = Proc::spawn_server(c, "nginx (is it installed? make deps installs it)")?;
    p.wait_ready("nginx", &format!("accepting connections on {to}"), Duration::from_secs(10), || {
        let connect = move || Ok(TcpStream::connect_timeout(&to, Duration::from_millis(200))?);
        Ok(sluice::base::netns::run_in(client_ns, connect).is_ok())
    })
}

/// Let the clients of namespace `ns` reuse a port whose last connection
/// waits in TIME_WAIT (`net.ipv4.tcp_tw_reuse = 1`; per namespace). Without
/// it (the kernel's default 2: loopback only) every closed connection holds
/// its ephemeral port for 60 s, so new connections are capped at about
/// 28,232 ports / 60 s = 470/s once the first 28k are spent: wrk with
/// `Connection: close` got 10.6k requests/s for its first 3 s and then
/// 460-476/s, with or without RPS (this was the `nic` model's "new
/// connections wait" finding; docs/bench.md). With it: 14.3-14.9k/s with
/// RPS, 18.4-18.8k/s without, run after run. Timestamps (on by default)
/// keep the reuse safe.
pub fn clients_reuse_ports(ns: &str) -> Result<()> {
    let out = in_ns(ns, None).args(["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"]).output()?;
    if !out.status.success() {
        bail!("setting net.ipv4.tcp_tw_reuse in {ns}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// What wrk reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Wrk {
    pub requests: u64,
    pub rps: f64,
    /// Connect, read and write errors and timeouts, and answers other than 2xx/3xx.
    pub errors: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// A wrk duration ("250.12us", "1.5ms", "2.00s", "1.2m") in ms.
fn wrk_ms(v: &str) -> Option<f64> {
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n / 1e3,
        "ms" => n,
        "s" => n * 1e3,
        "m" => n * 60e3,
        _ => return None,
    })
}

/// Parse wrk's report (with --latency).
pub fn parse_wrk(text: &str) -> Result<Wrk> {
    let line = |key: &str| text.lines().map(str::trim).find_map(|l| l.strip_prefix(key)).map(str::trim);
    let rps = line("Requests/sec:").and_then(|v| v.parse().ok());
    let requests = text.lines().find_map(|l| l.trim().split_once(" requests in ")?.0.parse().ok());
    let (Some(rps), Some(requests)) = (rps, requests) else {
        bail!("wrk's report has no 'requests in' / 'Requests/sec:' lines:\n{text}");
    };
    let mut errors = 0;
    if let Some(e) = line("Socket errors:") {
        // "connect 0, read 0, write 0, timeout 5"
        errors += e.split(',').filter_map(|p| p.split_whitespace().nth(1)?.parse::<u64>().ok()).sum::<u64>();
    }
    errors += line("Non-2xx or 3xx responses:").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let pct = |p: &str| line(p).and_then(wrk_ms);
    Ok(Wrk { requests, rps, errors, p50_ms: pct("50%"), p99_ms: pct("99%") })
}

/// Run wrk from namespace `ns` on `cpu` against `addr`: `conns` connections
/// from one thread for `secs`, each request on a new connection unless `keep_alive`.
pub fn run_wrk(
    ns: &str,
    cpu: usize,
    addr: std::net::IpAddr,
    (conns, keep_alive): (u32, bool),
    secs: f64,
) -> Result<Wrk> {
    let url = format!("http://{}/", SocketAddr::new(addr, PORT));
    let mut c = in_ns(ns, Some(cpu));
    c.args(["wrk", "-t1", "-c", &conns.to_string(), "-d", &format!("{}s", secs.round().max(1.0))]);
    c.args(["--latency", "--timeout", "2s"]);
    if !keep_alive {
        c.args(["-H", "Connection: close"]);
    }
    c.arg(&url);
    let out = c.output().context("running wrk (is it installed? make deps installs it)")?;
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

/// The probe's new connections: one every CONNECT_INTERVAL, each given
/// CONNECT_TIMEOUT (past the kernel's first SYN retransmit at 1 s).
const CONNECT_INTERVAL: Duration = Duration::from_millis(10);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The long-lived connection asks a request this often (500/s): a client
/// whose demand the service meets with no flood, so a flood's harm shows as
/// requests it did not get.
pub const KEPT_INTERVAL: Duration = Duration::from_millis(2);
/// nginx's fixed answer's body: a response ends with it.
const BODY: &[u8] = b"sluice bench\n";
/// A keep-alive request.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n";

/// What the probe saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// Each completed connect's time, ms; connects that failed or timed out.
    pub connect_ms: Vec<f64>,
    pub connect_failed: u64,
    /// Each request answered over the long-lived connection, in
    /// `kept_secs`: its time, ms (the write to the whole answer); and how
    /// often the connection broke (reopened).
    pub kept_ms: Vec<f64>,
    pub kept_secs: f64,
    pub kept_broken: u64,
}

impl Probe {
    /// The long-lived connection's answered requests/s.
    pub fn kept_rps(&self) -> Option<f64> {
        (self.kept_secs > 0.0).then(|| self.kept_ms.len() as f64 / self.kept_secs)
    }
}

/// Start the probe from namespace `ns` on `cpu`, from `from`, against `addr` for `secs`.
pub fn start_probe(
    ns: &str,
    cpu: usize,
    (from, addr): (std::net::IpAddr, std::net::IpAddr),
    secs: f64,
) -> JoinHandle<Result<Probe>> {
    let (ns, to, end) = (ns.to_string(), SocketAddr::new(addr, PORT), Instant::now() + Duration::from_secs_f64(secs));
    std::thread::spawn(move || {
        let kept_ns = ns.clone();
        let kept = std::thread::spawn(move || {
            sluice::base::netns::run_in(&kept_ns, move || {
                sluice::base::netns::pin_thread(cpu)?;
                Ok(keep_asking(from, to, end))
            })
        });
        let connects = sluice::base::netns::run_in(&ns, move || {
            sluice::base::netns::pin_thread(cpu)?;
            Ok(time_connects(from, to, end))
        })?;
        let (kept_ms, kept_secs, kept_broken) =
            kept.join().map_err(|_| anyhow::anyhow!("the long-lived client panicked"))??;
        Ok(Probe { connect_ms: connects.0, connect_failed: connects.1, kept_ms, kept_secs, kept_broken })
    })
}

/// A connection from `src` to `to` within CONNECT_TIMEOUT (None: failed).
fn connect_from(src: std::net::IpAddr, to: SocketAddr) -> Option<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::for_address(to), socket2::Type::STREAM, None).ok()?;
    s.bind(&SocketAddr::new(src, 0).into()).ok()?;
    s.connect_timeout(&to.into(), CONNECT_TIMEOUT).ok()?;
    Some(s.into())
}

/// A new connection from `from` every CONNECT_INTERVAL until `end`: (times in ms, failures).
fn time_connects(from: std::net::IpAddr, to: SocketAddr, end: Instant) -> (Vec<f64>, u64) {
    let (mut times, mut failed) = (Vec::new(), 0);
    let mut next = Instant::now();
    while next < end {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let t = Instant::now();
        match connect_from(from, to) {
            Some(_) => times.push(t.elapsed().as_secs_f64() * 1e3),
            None => failed += 1,
        }
        next = (next + CONNECT_INTERVAL).max(Instant::now());
    }
    (times, failed)
}

/// One keep-alive connection from `from` asking a request every
/// KEPT_INTERVAL until `end` (reopened if it breaks): (each answered
/// request's time in ms, seconds, times broken).
fn keep_asking(from: std::net::IpAddr, to: SocketAddr, end: Instant) -> (Vec<f64>, f64, u64) {
    let (start, mut answered, mut broken) = (Instant::now(), Vec::new(), 0);
    let mut conn: Option<TcpStream> = None;
    let mut next = Instant::now();
    while next < end {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += KEPT_INTERVAL;
        if conn.is_none() {
            conn = connect_from(from, to);
            if let Some(c) = &conn {
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            }
        }
        let asked = Instant::now();
        match conn.as_mut().map(ask) {
            Some(true) => answered.push(asked.elapsed().as_secs_f64() * 1e3),
            Some(false) => {
                broken += 1;
                conn = None;
            }
            None => {}
        }
        next = next.max(Instant::now());
    }
    (answered, start.elapsed().as_secs_f64(), broken)
}

/// One request over `c`; true when the whole answer came back.
fn ask(c: &mut TcpStream) -> bool {
    if c.write_all(REQUEST).is_err() {
        return false;
    }
    let (mut buf, mut got) = ([0u8; 1024], 0);
    while got < buf.len() {
        match c.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
        if buf[..got].ends_with(BODY) {
            return true;
        }
    }
    false
}

/// Floods of real connections (the `http` scenario's `conns-v4` and
/// `newconns-v4`): clients behind A on addresses of their own, asking as
/// fast as their CPU share lets them. Real TCP from real addresses:
/// handshakes complete, every segment is acknowledged; only the volume is
/// hostile. Each source holds HEAVY_CONNS connections at a time.
pub const HEAVY_CONNS: usize = 16;
/// A keep-alive flood's requests in flight per connection (HTTP/1.1
/// pipelining: one write carries them, so a request costs its sender a
/// fraction of a syscall and one small segment's share, and nginx a whole
/// request's work).
pub const HEAVY_PIPELINE: usize = 8;

/// How a connection flood's clients ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heaviness {
    /// HEAVY_CONNS keep-alive connections per source, HEAVY_PIPELINE requests in flight on each.
    KeepAlive,
    /// A new connection per request (`Connection: close`), HEAVY_CONNS at a time per source.
    NewConns,
}

/// What a connection flood's clients got: answered requests and the seconds they ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Heavy {
    pub answered: u64,
    pub secs: f64,
}

/// Start a connection flood from namespace `ns`, one thread per source in
/// `srcs`, pinned to `cpu` at `nice`, against `addr` until `secs` pass.
pub fn start_heavy(
    ns: &str,
    (cpu, nice): (usize, i32),
    (srcs, how): (&[std::net::IpAddr], Heaviness),
    addr: std::net::IpAddr,
    secs: f64,
) -> JoinHandle<Result<Heavy>> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let to = SocketAddr::new(addr, PORT);
    let threads: Vec<_> = srcs
        .iter()
        .map(|&src| {
            let ns = ns.to_string();
            std::thread::spawn(move || {
                sluice::base::netns::run_in(&ns, move || {
                    sluice::base::netns::pin_thread(cpu)?;
                    crate::load::workers::set_thread_nice(nice)?;
                    Ok(heavy_source(src, to, how, end))
                })
            })
        })
        .collect();
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut answered = 0;
        for t in threads {
            answered += t.join().map_err(|_| anyhow::anyhow!("a flooding client panicked"))??;
        }
        Ok(Heavy { answered, secs: start.elapsed().as_secs_f64() })
    })
}

/// One source's connections, each kept busy until `end`: answered requests.
/// Each round writes on every connection, then reads every answer, so the
/// HEAVY_CONNS connections' requests are in flight together.
fn heavy_source(src: std::net::IpAddr, to: SocketAddr, how: Heaviness, end: Instant) -> u64 {
    let open = || -> Option<TcpStream> {
        let c = connect_from(src, to)?;
        c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        Some(c)
    };
    let (asks, per_write) = match how {
        Heaviness::KeepAlive => (REQUEST.repeat(HEAVY_PIPELINE), HEAVY_PIPELINE),
        Heaviness::NewConns => (b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".to_vec(), 1),
    };
    let mut conns: Vec<Option<TcpStream>> = (0..HEAVY_CONNS).map(|_| None).collect();
    let mut answered = 0;
    while Instant::now() < end {
        let mut asked = vec![false; conns.len()];
        for (c, a) in conns.iter_mut().zip(&mut asked) {
            if c.is_none() {
                *c = open();
            }
            *a = c.as_mut().is_some_and(|c| c.write_all(&asks).is_ok());
        }
        for (c, a) in conns.iter_mut().zip(asked) {
            match c.as_mut().filter(|_| a).map(|c| answers(c, per_write)) {
                Some(Some(n)) => answered += n,
                _ => *c = None,
            }
            if how == Heaviness::NewConns {
                *c = None;
            }
        }
    }
    answered
}

/// Read `n` answers from `r` (each ends with BODY): Some(n), or None if the
/// connection broke or stalled first.
fn answers(r: &mut impl Read, n: usize) -> Option<u64> {
    let (mut buf, mut seen, mut tail) = ([0u8; 4096], 0, Vec::<u8>::new());
    while seen < n {
        let got = match r.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(g) => g,
        };
        // An answer may end across two reads: keep the last bytes of each
        // (fewer than BODY's, so no answer is counted twice).
        tail.extend_from_slice(&buf[..got]);
        seen += tail.windows(BODY.len()).filter(|w| *w == BODY).count();
        tail.drain(..tail.len() - tail.len().min(BODY.len() - 1));
    }
    Some(n as u64)
}

/// How long `settle_listener` waits at most (s): Linux retries a SYN-ACK
/// 5 times (`tcp_synack_retries`), about 63 s in all.
pub const SETTLE_MAX_SECS: f64 = 70.0;

/// Wait until nginx's listener in namespace `ns` holds no half-open
/// connection (SYN_RECV) left from the last cell, at most SETTLE_MAX_SECS.
/// After a SYN flood the kernel keeps the flood's half-open connections
/// until their SYN-ACKs time out. A cell started meanwhile met a SYN queue
/// in use (results/2026-11-29-tcp-under-floods.md, round nine: a no-flood
/// cell after a SYN flood had its gate answer wrk's SYNs and drop 2-3 of
/// its packets). Says what it waits for, and goes on at the limit.
pub fn settle_listener(ns: &str) -> Result<()> {
    let start = Instant::now();
    let mut said = false;
    loop {
        let n = half_open(ns)?;
        if n == 0 {
            if said {
                eprintln!("== nginx's listener is clear after {:.0} s", start.elapsed().as_secs_f64());
            }
            return Ok(());
        }
        if start.elapsed().as_secs_f64() >= SETTLE_MAX_SECS {
            eprintln!(
                "== nginx's listener still holds {n} half-open connections after {SETTLE_MAX_SECS:.0} s: going on"
            );
            return Ok(());
        }
        if !said {
            eprintln!(
                "== waiting for nginx's listener to drop {n} half-open connections left by the last cell (at most {SETTLE_MAX_SECS:.0} s)"
            );
            said = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Half-open connections (request sockets) to nginx's port in namespace
/// `ns`, as the daemon counts a listener's SYN queue (sock_diag).
fn half_open(ns: &str) -> Result<usize> {
    use sluice::signals::sock_diag::{SockDiag, TCP_SYN_RECV};
    let mut diag = SockDiag::open(Some(ns))?;
    let mut n = 0;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        diag.dump_ports(family, libc::IPPROTO_TCP as u8, 1 << TCP_SYN_RECV, &[(PORT, PORT)], &mut |_| n += 1)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "Running 8s test @ http://10.77.0.2/\n  1 threads and 16 connections\n  \
        Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   1.23ms  200.00us  15.00ms   90.00%\n  \
        Latency Distribution\n     50%  250.50us\n     75%    1.00ms\n     90%    1.20ms\n     99%    1.50s\n  \
        80000 requests in 8.00s, 12.00MB read\n  Socket errors: connect 3, read 0, write 1, timeout 5\n  \
        Non-2xx or 3xx responses: 2\nRequests/sec:  10000.50\nTransfer/sec:      1.50MB\n";

    #[test]
    fn wrk_report_is_parsed_with_units_and_errors() {
        let w = parse_wrk(REPORT).unwrap();
        assert_eq!(w.requests, 80_000);
        assert_eq!(w.rps, 10_000.5);
        assert_eq!(w.errors, 3 + 1 + 5 + 2);
        assert_eq!(w.p50_ms, Some(0.2505));
        assert_eq!(w.p99_ms, Some(1500.0));
    }

    #[test]
    fn a_report_without_totals_is_an_error_and_missing_percentiles_stay_missing() {
        assert!(parse_wrk("unable to connect to 10.77.0.2:80 Connection refused").is_err());
        let w = parse_wrk("  0 requests in 8.00s, 0B read\nRequests/sec:      0.00\n").unwrap();
        assert_eq!((w.requests, w.p50_ms, w.p99_ms), (0, None, None));
    }

    #[test]
    fn nginx_conf_listens_on_both_families_without_logs() {
        let c = nginx_conf(Path::new("/tmp/x"), false);
        assert!(nginx_conf(Path::new("/tmp/x"), true).contains("fastcgi_pass unix:/tmp/x/php.sock;"));
        assert!(c.contains("listen 80;") && c.contains("listen [::]:80;"));
        assert!(c.contains("access_log off;") && c.contains("worker_processes 1;"));
        assert!(c.contains("user www-data;"), "the worker runs as Debian's nginx does, not as nobody");
        assert!(c.contains("keepalive_requests 1000000;"), "the probe's long-lived connection stays one");
    }

    /// A reader that hands out its bytes in the given pieces.
    struct Pieces(Vec<Vec<u8>>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let p = self.0.remove(0);
            buf[..p.len()].copy_from_slice(&p);
            Ok(p.len())
        }
    }

    #[test]
    fn answers_are_counted_once_across_reads_and_a_short_stream_is_none() {
        let one = [b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n".as_slice(), BODY].concat();
        let three = one.repeat(3);
        // Split inside the second answer's body, and after the third's first byte.
        let (cut1, cut2) = (one.len() + one.len() - 5, 2 * one.len() + 1);
        let pieces = vec![three[..cut1].to_vec(), three[cut1..cut2].to_vec(), three[cut2..].to_vec()];
        assert_eq!(answers(&mut Pieces(pieces), 3), Some(3));
        assert_eq!(answers(&mut Pieces(vec![one.clone(), one[..20].to_vec()]), 2), None, "the stream ended");
    }

    #[test]
    fn a_probe_without_time_has_no_long_lived_rate() {
        assert_eq!(Probe::default().kept_rps(), None);
        let p = Probe { kept_ms: vec![0.5; 500], kept_secs: 2.0, ..Probe::default() };
        assert_eq!(p.kept_rps(), Some(250.0));
    }
}
