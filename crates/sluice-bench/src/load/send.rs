//! A paced UDP sender over ordinary sockets: the demo's flood and the
//! integration tests' known-rate traffic. It reaches a few hundred thousand
//! packets/s from one core; the bench's generator (BPF live frames) is the
//! high-rate tool. Every run is bounded by its duration.
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Datagrams per sendmmsg call at most (a burst the victim's backlog absorbs).
const BATCH: usize = 32;
/// A wait shorter than this is spun, not slept (a sleep overshoots by tens of us).
const SLEEP_MIN: Duration = Duration::from_micros(100);

#[derive(Debug, Clone)]
pub struct SendOpts {
    pub dst: SocketAddr,
    /// Local address to send from (None: the kernel's choice).
    pub src: Option<std::net::IpAddr>,
    /// Packets/s; 0 = as fast as the socket goes.
    pub rate: u64,
    pub duration: Duration,
    /// UDP payload bytes.
    pub payload: usize,
    /// Source ports to rotate over (one socket each), so traffic has several flows.
    pub flows: u16,
    /// Datagrams sent back to back each time (1: evenly paced); the rate
    /// is kept on average, so a burst of N comes every N / rate seconds.
    pub burst: u64,
    /// Count the datagrams that come back on the sending sockets (an echo
    /// service's answers), read between sends and for ANSWER_WAIT after the last.
    pub answers: bool,
}

/// How long after its last datagram the sender still counts answers.
pub const ANSWER_WAIT: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SendReport {
    pub sent: u64,
    /// Datagrams the kernel refused (ENOBUFS/EAGAIN): not sent.
    pub refused: u64,
    pub secs: f64,
    /// CLOCK_MONOTONIC (the gate's bpf_ktime_get_ns clock) when sending began, ns.
    pub start_ns: u64,
    /// Datagrams that came back (None: not counted, `SendOpts::answers` off).
    pub answered: Option<u64>,
}

impl SendReport {
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.secs.max(1e-9)
    }
}

/// Send at `rate` for `duration`; returns what was sent.
pub fn send_udp(o: &SendOpts) -> io::Result<SendReport> {
    let any: SocketAddr = if o.dst.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
    let bind = o.src.map_or(any, |a| SocketAddr::new(a, 0));
    let socks: Vec<UdpSocket> = (0..o.flows.max(1))
        .map(|_| {
            let s = UdpSocket::bind(bind)?;
            s.connect(o.dst)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<io::Result<_>>()?;
    let payload = vec![0x5au8; o.payload];
    let mut iov: Vec<libc::iovec> =
        (0..BATCH).map(|_| libc::iovec { iov_base: payload.as_ptr() as *mut _, iov_len: payload.len() }).collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let start = Instant::now();
    let mut rep =
        SendReport { start_ns: sluice::base::clock::now_ns(), answered: o.answers.then_some(0), ..Default::default() };
    let mut flow = 0usize;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= o.duration {
            break;
        }
        let b = o.burst.max(1);
        let due = if o.rate == 0 { u64::MAX } else { (o.rate as f64 * elapsed.as_secs_f64()) as u64 / b * b };
        let behind = due.saturating_sub(rep.sent + rep.refused);
        if behind == 0 {
            // Sleep until the next datagram (burst) is due, unless that is too
            // close for the scheduler: a low rate must not take a whole CPU.
            let next_burst = (rep.sent + rep.refused + 1).div_ceil(b) * b;
            let next = Duration::from_secs_f64(next_burst as f64 / o.rate as f64);
            let wait = next.saturating_sub(start.elapsed());
            if wait > SLEEP_MIN {
                std::thread::sleep(wait - SLEEP_MIN / 2);
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        if let Some(a) = rep.answered.as_mut() {
            *a += take_answers(&socks);
        }
        let n = behind.min(BATCH as u64) as usize;
        let fd = socks[flow].as_raw_fd();
        flow = (flow + 1) % socks.len();
        // SAFETY: msgs holds n valid headers pointing at `payload`, which outlives the call.
        let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as u32, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::ECONNREFUSED) => rep.refused += n as u64,
                _ => return Err(e),
            }
        } else {
            rep.sent += r as u64;
            rep.refused += (n - r as usize) as u64;
        }
    }
    rep.secs = start.elapsed().as_secs_f64();
    if let Some(a) = rep.answered.as_mut() {
        let end = Instant::now() + ANSWER_WAIT;
        while Instant::now() < end {
            *a += take_answers(&socks);
            std::thread::sleep(SLEEP_MIN);
        }
    }
    Ok(rep)
}

/// Read every datagram waiting on `socks` (non-blocking); how many there were.
fn take_answers(socks: &[UdpSocket]) -> u64 {
    let mut buf = [0u8; 2048];
    socks.iter().map(|s| std::iter::from_fn(|| s.recv(&mut buf).ok()).count() as u64).sum()
}
