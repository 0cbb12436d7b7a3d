//! A TCP service taken whole by a flood of real connections (issue 50,
//! item 2): a server in namespace B that answers one request at a time on
//! one CPU (a single worker, as nginx's), a light client from A's own
//! address, and keep-alive connections from four more of A's addresses,
//! each pipelining requests. Nothing queues in a socket: the service is
//! behind on its CPU, and only its answers' delay shows it. With the
//! kernel alone, the light client waits behind every pipelined request;
//! with sluice, its class (a TCP auto class) is judged late and its known
//! client goes first (`policy::late`). And a server whose answers are late
//! because it waits (a slow backend, its CPU idle), or because a neighbour
//! (another process) takes its CPU, is not cut for them.
//! Needs root (CI is root).
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::testbed::{in_netns, Testbed};
use sluice::base::netns::pin_thread;
use sluice::surface::stats::LateStatus;

const PORT: u16 = 8090;
/// CPU time the server spends on each request (its one worker takes them
/// one at a time: about 3,300 a second at most).
const WORK: Duration = Duration::from_micros(300);
/// The light client's requests per second (a sixth of what the server takes).
const LIGHT_RPS: f64 = 500.0;
/// The flood: this many connections from each of FLOOD_ADDRS, each with
/// PIPELINE requests in flight.
const FLOOD_ADDRS: [u8; 4] = [100, 101, 102, 103];
const FLOOD_CONNS: usize = 16;
const PIPELINE: usize = 8;
/// How long a read waits before it looks at the clock again.
const READ_WAIT: Duration = Duration::from_millis(100);

/// The server's one worker: a request holds it for WORK.
static WORKER: Mutex<()> = Mutex::new(());
/// The tests one at a time: the daemon reads how busy the server's process
/// (this one) keeps its CPUs, and one test's load is not another's.
static SERIAL: Mutex<()> = Mutex::new(());

/// How the server spends a request: WORK on the worker (its CPU busy),
/// asleep for the backend's delay in us (its CPU idle), or handed to a
/// backend process (`BackendProcess`), which spends WORK on it.
#[derive(Clone)]
enum Work {
    Cpu,
    Backend(Arc<AtomicU64>),
    Remote(Arc<Mutex<BufReader<UnixStream>>>),
}

impl Work {
    fn spend(&self) {
        match self {
            Work::Cpu => {
                let _worker = WORKER.lock().unwrap_or_else(|e| e.into_inner());
                let t = Instant::now();
                while t.elapsed() < WORK {
                    std::hint::spin_loop();
                }
            }
            Work::Backend(us) => std::thread::sleep(Duration::from_micros(us.load(Ordering::Relaxed))),
            Work::Remote(backend) => {
                // A backend gone (at the test's end) answers at once.
                let mut backend = backend.lock().unwrap_or_else(|e| e.into_inner());
                if backend.get_mut().write_all(b"r\n").is_ok() {
                    let _ = backend.read_line(&mut String::new());
                }
            }
        }
    }
}

/// Until when the server runs: `end`, or its `Server` dropped.
#[derive(Clone)]
struct Until {
    end: Instant,
    stopped: Arc<AtomicBool>,
}

impl Until {
    fn on(&self) -> bool {
        Instant::now() < self.end && !self.stopped.load(Ordering::Relaxed)
    }
}

/// A running server: dropped at its test's end, it stops (within
/// READ_WAIT), so that a later test's daemon, which reads this process's
/// CPUs, does not find its threads (its accept loop, unpinned, woke on CPU
/// 0 every 2 ms and put CPU 0, half idle, among the neighbour test's).
struct Server(Arc<AtomicBool>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Answer each line on `s` with "ok" after `work`, while `until` is on.
fn answer(s: TcpStream, until: Until, work: Work) {
    let _ = pin_thread(1);
    s.set_read_timeout(Some(READ_WAIT)).unwrap();
    let mut out = s.try_clone().unwrap();
    let mut lines = BufReader::new(s);
    let mut line = String::new();
    while until.on() {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                work.spend();
                if out.write_all(b"ok\n").is_err() {
                    return;
                }
            }
            Err(_) => {}
        }
    }
}

/// The server on B's PORT for `secs` at most, a thread per connection.
fn serve(tb: &Testbed, secs: f64, work: Work) -> Server {
    let listener = in_netns(&tb.b, || TcpListener::bind(("0.0.0.0", PORT)).expect("bind the server"));
    listener.set_nonblocking(true).unwrap();
    let stopped = Arc::new(AtomicBool::new(false));
    let until = Until { end: Instant::now() + Duration::from_secs_f64(secs), stopped: stopped.clone() };
    std::thread::spawn(move || {
        while until.on() {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let (work, until) = (work.clone(), until.clone());
                    std::thread::spawn(move || answer(s, until, work));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    Server(stopped)
}

/// A connection from A (from `src`, or A's own address) to the server.
fn connect(tb: &Testbed, src: Option<String>) -> TcpStream {
    let dst: SocketAddr = format!("{}:{PORT}", tb.ip_b).parse().unwrap();
    in_netns(&tb.a, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(src) = src {
            s.bind(&format!("{src}:0").parse::<SocketAddr>().unwrap().into()).expect("bind the flood's address");
        }
        s.connect_timeout(&dst.into(), Duration::from_secs(5)).expect("connect to the server");
        TcpStream::from(s)
    })
}

/// The light client: a request every 1/LIGHT_RPS s (the next one once its
/// answer came), for `secs`; when each answer came, in seconds from its start.
fn light(tb: &Testbed, secs: f64) -> std::thread::JoinHandle<Vec<f64>> {
    client(tb, None, LIGHT_RPS, 0, secs)
}

/// A client from `src` (None: A's own address) on `cpu`: a request every
/// 1/`rps` s (the next one once its answer came), for `secs`; when each
/// answer came, in seconds from its start.
fn client(tb: &Testbed, src: Option<String>, rps: f64, cpu: usize, secs: f64) -> std::thread::JoinHandle<Vec<f64>> {
    let s = connect(tb, src);
    std::thread::spawn(move || {
        let _ = pin_thread(cpu);
        s.set_read_timeout(Some(READ_WAIT)).unwrap();
        let mut out = s.try_clone().unwrap();
        let mut lines = BufReader::new(s);
        let (t0, every) = (Instant::now(), Duration::from_secs_f64(1.0 / rps));
        let end = t0 + Duration::from_secs_f64(secs);
        let (mut next, mut answered, mut line) = (t0, vec![], String::new());
        while Instant::now() < end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next = (next + every).max(Instant::now());
            out.write_all(b"r\n").unwrap();
            loop {
                line.clear();
                match lines.read_line(&mut line) {
                    Ok(0) => return answered,
                    Ok(_) => break answered.push(t0.elapsed().as_secs_f64()),
                    Err(_) if Instant::now() >= end => return answered,
                    Err(_) => {}
                }
            }
        }
        answered
    })
}

/// The flood's connections, each pipelining PIPELINE requests, until `stop`.
fn flood(tb: &Testbed, addrs: &[String], stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = vec![];
    for a in addrs {
        for _ in 0..FLOOD_CONNS {
            let s = connect(tb, Some(a.clone()));
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let _ = pin_thread(0);
                s.set_read_timeout(Some(READ_WAIT)).unwrap();
                let mut out = s.try_clone().unwrap();
                let mut lines = BufReader::new(s);
                let (batch, mut line) = ("r\n".repeat(PIPELINE), String::new());
                'conn: while !stop.load(Ordering::Relaxed) {
                    if out.write_all(batch.as_bytes()).is_err() {
                        return;
                    }
                    let mut got = 0;
                    while got < PIPELINE {
                        line.clear();
                        match lines.read_line(&mut line) {
                            Ok(0) => return,
                            Ok(_) => got += 1,
                            Err(_) if stop.load(Ordering::Relaxed) => break 'conn,
                            Err(_) => {}
                        }
                    }
                }
            }));
        }
    }
    threads
}

/// The light client's answers from `from` to `to` s, as a share of what it asked for.
fn share(answers: &[f64], from: f64, to: f64) -> f64 {
    answers.iter().filter(|&&t| t >= from && t < to).count() as f64 / ((to - from) * LIGHT_RPS)
}

/// The light client `calm` s alone (`mid` runs at its end, before the
/// flood starts), then beside the flood for `flooded` s: its answered share
/// in the flood's last `judged` s.
fn run(tb: &Testbed, addrs: &[String], calm: f64, flooded: f64, judged: f64, mid: impl FnOnce()) -> f64 {
    let client = light(tb, calm + flooded);
    std::thread::sleep(Duration::from_secs_f64(calm));
    mid();
    let stop = Arc::new(AtomicBool::new(false));
    let threads = flood(tb, addrs, &stop);
    let answers = client.join().expect("the light client");
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    share(&answers, calm + flooded - judged, calm + flooded)
}

#[test]
fn a_flood_of_real_connections_is_cut_where_the_answers_come_late_and_the_known_client_goes_first() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut tb = Testbed::new();
    let addrs: Vec<String> = FLOOD_ADDRS.iter().map(|&last| tb.add_host_a(last)).collect();
    let _server = serve(&tb, 40.0, Work::Cpu);
    // The kernel alone: the light client waits behind the pipelined requests.
    let alone = run(&tb, &addrs, 1.0, 3.0, 2.0, || {});
    std::thread::sleep(Duration::from_secs(1));

    tb.start_gate(&["--no-discover", "--class", &format!("web:rate=auto,match=tcp:{PORT}")]);
    let web = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "web").expect("class web").totals;
    let mut calm_drops = None;
    // Five calm seconds: its client answered while calm is known (a calm
    // second, then a second's span: fair::LEARN_CALM_SECS,
    // SLUICE_KNOWN_SPAN_MS), and the class has its calm answer delay.
    let with = run(&tb, &addrs, 5.0, 5.0, 3.0, || calm_drops = Some(web(&tb).dropped_pkts()));
    let after = web(&tb);
    // How the class was judged at the flood's end (its busy reading, its
    // engagements): what a failure of the limit below is read from.
    let late = tb.status().classes.into_iter().find(|c| c.name == "web").and_then(|c| c.late);
    eprintln!(
        "light client's answered share in the flood: {:.1}% with the kernel alone, {:.1}% with sluice; \
         the gate dropped {} of the class's packets ({} before the flood); answer delays: {:?}; judged: {late:?}",
        alone * 100.0,
        with * 100.0,
        after.dropped_pkts(),
        calm_drops.unwrap(),
        after.answer_delays
    );
    assert_eq!(calm_drops, Some(0), "no flood, no drop");
    assert!(
        alone < 0.5,
        "the flood did not take the service ({:.1}% answered): the test measures nothing",
        alone * 100.0
    );
    assert!(after.dropped_pkts() > 0, "the late class was never limited");
    assert!(
        with >= 0.7 && with >= 2.0 * alone,
        "answered {:.1}% with sluice against {:.1}% alone",
        with * 100.0,
        alone * 100.0
    );
}

/// Do no harm: a server whose answers turn late because it waits on a slow
/// backend (60 ms a request, its threads asleep) while new clients come is
/// not cut for them, though its known client gives it a known lane: its
/// CPU idles, and shedding the new clients would not bring the answers
/// back. Its late answers are seen (the test measures something), and
/// nothing of the class is limited or dropped.
#[test]
fn a_service_late_for_a_slow_backend_is_not_cut() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut tb = Testbed::new();
    let addrs: Vec<String> = FLOOD_ADDRS.iter().map(|&last| tb.add_host_a(last)).collect();
    let backend = Arc::new(AtomicU64::new(0));
    let _server = serve(&tb, 30.0, Work::Backend(backend.clone()));
    tb.start_gate(&["--no-discover", "--class", &format!("web:rate=auto,match=tcp:{PORT}")]);
    let web = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "web").expect("class web");
    // Five calm seconds make the light client known; then the backend
    // slows and new clients (the flood's addresses and connections, each
    // waiting on the backend like the light client) come for 4 s.
    run(&tb, &addrs, 5.0, 4.0, 2.0, || backend.store(60_000, Ordering::Relaxed));
    let c = web(&tb);
    let late = c.late.clone().expect("a TCP auto class is judged on its answers");
    eprintln!("the class at the end: {late:?}, dropped {}", c.totals.dropped_pkts());
    assert!(late.window_p90_ms.is_some_and(|ms| ms >= 32.0), "the answers were not late: {late:?}");
    assert!(late.known_share.is_some_and(|k| k >= 0.1), "no known lane: the test measures nothing: {late:?}");
    assert_eq!(late.busy, Some(false), "the server's process waits: {late:?}");
    assert_eq!(late.rate_pps, None, "limited for answers a cut would not bring back");
    assert_eq!(c.totals.dropped_pkts(), 0, "the gate dropped the class's packets");
}

/// Do no harm: a server whose answers turn late because a neighbour (a
/// process spinning on its CPU at nice -15) takes most of that CPU, while
/// its known client and a few new ones ask for under half of what it
/// serves alone, is not cut: the neighbour's time is not its load, and
/// shedding its new clients would not give it its CPU back. Everything of
/// the test (server, clients) runs on CPU 1 beside the neighbour, the
/// daemon on the other; with the service's load read as its CPUs' busy
/// time, the class engaged and its new clients' packets were dropped.
#[test]
fn a_service_late_because_a_neighbour_takes_its_cpu_is_not_cut() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = pin_thread(1);
    let mut tb = Testbed::new();
    let addrs: Vec<String> = FLOOD_ADDRS.iter().map(|&last| tb.add_host_a(last)).collect();
    let _server = serve(&tb, 30.0, Work::Cpu);
    tb.start_gate(&["--no-discover", "--class", &format!("web:rate=auto,match=tcp:{PORT}")]);
    let web = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "web").expect("class web");
    // Five calm seconds make the light client known; then the neighbour
    // comes, and with it two new clients from each of the flood's
    // addresses, 125 requests/s each (with the known client's 500, 1,500
    // a second: the server alone takes 3,300).
    let known = client(&tb, None, LIGHT_RPS, 1, 9.0);
    std::thread::sleep(Duration::from_secs(5));
    let calm_drops = web(&tb).totals.dropped_pkts();
    let neighbour = sluice_testkit::neighbour::Spinner::on(1, -15).expect("a neighbour on CPU 1");
    let others: Vec<_> = addrs.iter().chain(&addrs).map(|a| client(&tb, Some(a.clone()), 125.0, 1, 4.0)).collect();
    // How the class was judged is read all along, not at the end only: a
    // look whose span saw the starved server use no clock tick (10 ms)
    // finds it on no CPU, and reads its CPUs 0 busy (a fresh-clone CI run
    // read 0.0 at the end, judged right: not busy, nothing dropped).
    let mut seen: Vec<LateStatus> = vec![];
    while others.iter().any(|c| !c.is_finished()) {
        seen.extend(web(&tb).late);
        std::thread::sleep(Duration::from_millis(250));
    }
    let answered: usize = others.into_iter().map(|c| c.join().expect("a new client").len()).sum();
    let c = web(&tb);
    drop(neighbour);
    let known = known.join().expect("the known client");
    let late = c.late.clone().expect("a TCP auto class is judged on its answers");
    eprintln!(
        "the class at the end: {late:?}, dropped {} ({calm_drops} calm); the new clients' answers: {answered}, \
         the known client's: {}",
        c.totals.dropped_pkts(),
        known.len()
    );
    assert_eq!(late.busy, Some(false), "a neighbour's time read as the server's load: {late:?}");
    let fullest = seen.iter().filter_map(|l| l.cpus_busy).fold(0.0, f64::max);
    eprintln!("{} reads during the neighbour's 4 s: its CPUs at most {fullest} busy", seen.len());
    let read_busy = seen.iter().filter(|l| l.busy == Some(true)).count();
    assert_eq!(read_busy, 0, "a neighbour's time read as the server's load in {read_busy} of {} reads", seen.len());
    assert!(fullest >= 0.9, "the neighbour did not fill the CPU in any of {} reads (at most {fullest})", seen.len());
    assert_eq!(late.engagements, Some(0), "engaged for a neighbour's CPU time: {late:?}");
    assert_eq!(late.rate_pps, None, "limited for a neighbour's CPU time");
    assert_eq!(c.totals.dropped_pkts(), 0, "the gate dropped the class's packets");
    // And the test measured something: the answers were late, with a known lane to engage.
    assert!(late.window_p90_ms.is_some_and(|ms| ms >= 8.0), "the answers were not late: {late:?}");
    assert!(late.known_share.is_some_and(|k| k >= 0.1), "no known lane: {late:?}");
}

/// A backend process: this test binary again, running `backend_process`
/// alone, on CPU 1: it holds a unix listener (its descriptor 3), accepts
/// the server's one connection and answers each line on it after WORK of
/// its CPU, as a php-fpm worker. The server's `Work::Remote` talks to it;
/// killed on drop.
struct BackendProcess(std::process::Child);

impl BackendProcess {
    /// Start it; the server's end of the connection, made in `tb`'s B (a
    /// unix socket belongs to the namespace it was made in, and the
    /// daemon in B dumps B's).
    fn start(tb: &Testbed) -> (BackendProcess, Work) {
        let path = std::env::temp_dir().join(format!("sluice-late-backend-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let at = path.clone();
        let listener = in_netns(&tb.b, move || UnixListener::bind(&at).expect("bind the backend's socket"));
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "backend_process", "--ignored", "--test-threads=1"]).env("SLUICE_LATE_BACKEND", "1");
        sluice_testkit::neighbour::pass_as_fd3(&mut cmd, &listener);
        let child = cmd.stdout(std::process::Stdio::null()).spawn().expect("start the backend process");
        drop(listener);
        let at = path.clone();
        let client = in_netns(&tb.b, move || UnixStream::connect(&at).expect("connect to the backend"));
        let _ = std::fs::remove_file(&path);
        (BackendProcess(child), Work::Remote(Arc::new(Mutex::new(BufReader::new(client)))))
    }
}

impl Drop for BackendProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The backend process's body (`BackendProcess`); a no-op as a test.
#[test]
#[ignore = "the backend process of a_flood_to_a_service_whose_backend_does_its_work_is_cut"]
fn backend_process() {
    use std::os::fd::FromRawFd;
    if std::env::var_os("SLUICE_LATE_BACKEND").is_none() {
        return;
    }
    let _ = pin_thread(1);
    // SAFETY: descriptor 3 is the listener BackendProcess put there, owned here alone.
    let listener = unsafe { UnixListener::from_raw_fd(3) };
    let (s, _) = listener.accept().expect("the server's connection");
    let mut out = s.try_clone().unwrap();
    let mut lines = BufReader::new(s);
    let mut line = String::new();
    while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
        Work::Cpu.spend();
        if out.write_all(b"ok\n").is_err() {
            return;
        }
    }
}

/// The flood of real connections again, to a server that hands each
/// request to a backend process over a unix socket (as nginx to php-fpm)
/// and spends nearly nothing itself: the backend's CPU time is the
/// service's work (`signals::backends`), the service is busy, and its
/// late class is cut as the first test's. With the backend's time read as
/// a neighbour's, the service was not busy and nothing was cut.
#[test]
fn a_flood_to_a_service_whose_backend_does_its_work_is_cut() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut tb = Testbed::new();
    let addrs: Vec<String> = FLOOD_ADDRS.iter().map(|&last| tb.add_host_a(last)).collect();
    let (_backend, work) = BackendProcess::start(&tb);
    let _server = serve(&tb, 40.0, work);
    let alone = run(&tb, &addrs, 1.0, 3.0, 2.0, || {});
    std::thread::sleep(Duration::from_secs(1));
    tb.start_gate(&["--no-discover", "--class", &format!("web:rate=auto,match=tcp:{PORT}")]);
    let web = |tb: &Testbed| tb.status().classes.into_iter().find(|c| c.name == "web").expect("class web");
    let with = run(&tb, &addrs, 5.0, 5.0, 3.0, || {});
    let c = web(&tb);
    eprintln!(
        "light client's answered share in the flood: {:.1}% with the kernel alone, {:.1}% with sluice; \
         the gate dropped {}; judged: {:?}",
        alone * 100.0,
        with * 100.0,
        c.totals.dropped_pkts(),
        c.late
    );
    assert!(alone < 0.5, "the flood did not take the service ({:.1}% answered)", alone * 100.0);
    let late = c.late.expect("a TCP auto class is judged on its answers");
    assert!(late.engagements.is_some_and(|n| n > 0), "never engaged: {late:?}");
    assert!(c.totals.dropped_pkts() > 0, "the late class was never limited");
    assert!(
        with >= 0.7 && with >= 2.0 * alone,
        "answered {:.1}% with sluice against {:.1}% alone",
        with * 100.0,
        alone * 100.0
    );
}
