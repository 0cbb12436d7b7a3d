//! A paced UDP echo client with round trips: FLOWS flows from a namespace,
//! each datagram carrying its send time, the echoes timed on arrival. The
//! `readers` and `cpu` scenarios' legitimate load. Between sends it sleeps in
//! ppoll on its sockets (woken by an echo or the next send time), so it
//! leaves its CPU to the generator and the stages that share it; it runs at
//! nice -10, so it sends on time whatever else shares the CPU.
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use anyhow::Result;

/// Flows (source ports) the client sends from.
pub const FLOWS: usize = 16;
/// Replies later than this after the last send are counted lost.
const DRAIN: Duration = Duration::from_millis(300);

/// What the clients saw.
pub struct Load {
    pub sent: u64,
    pub answered: u64,
    /// Round trips of the answered requests (NSD: of the probe's queries only).
    pub rtts_us: Vec<u32>,
}

/// Send `rate` datagrams/s over FLOWS flows for `secs` from namespace `ns`
/// (pinned to `cpu`), each carrying its send time; the echoes give the RTTs.
pub fn client(ns: &str, cpu: usize, dst: &str, rate: u64, secs: f64) -> Result<Load> {
    let (ns, dst) = (ns.to_string(), dst.to_string());
    sluice::base::netns::run_in(&ns, move || {
        sluice::base::netns::pin_thread(cpu)?;
        // Ahead of the other tasks on its CPU: it sleeps between sends, so it
        // takes only what it needs, and sends on time whatever else runs there.
        // SAFETY: setpriority on this thread's own id.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10) };
        let socks = (0..FLOWS)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.set_nonblocking(true)?;
                s.connect(&dst)?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let gap = Duration::from_secs_f64(FLOWS as f64 / rate as f64);
        let (mut sent, mut rtts, mut next) = (0u64, Vec::with_capacity((rate as f64 * secs) as usize), start);
        while Instant::now() < end + DRAIN {
            let now = Instant::now();
            if now >= next && now < end {
                let t = now.duration_since(start).as_nanos() as u64;
                for s in &socks {
                    if s.send(&t.to_ne_bytes()).is_ok() {
                        sent += 1;
                    }
                }
                next += gap;
            }
            receive(&socks, start, &mut rtts);
            let until = if Instant::now() < end { next } else { end + DRAIN };
            wait(&socks, until.saturating_duration_since(Instant::now()));
        }
        Ok(Load { sent, answered: rtts.len() as u64, rtts_us: rtts })
    })
}

/// Sleep until a socket has an echo or `d` passed.
fn wait(socks: &[UdpSocket], d: Duration) {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<libc::pollfd> =
        socks.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
    // SAFETY: fds and ts are valid for the call; a signal or error only ends the wait early.
    unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
}

/// Take every echo waiting on the sockets.
fn receive(socks: &[UdpSocket], start: Instant, rtts: &mut Vec<u32>) {
    let mut buf = [0u8; 64];
    for s in socks {
        while let Ok(8) = s.recv(&mut buf) {
            let t = u64::from_ne_bytes(buf[..8].try_into().expect("8 bytes"));
            let now = start.elapsed().as_nanos() as u64;
            rtts.push((now.saturating_sub(t) / 1_000).min(u32::MAX as u64) as u32);
        }
    }
}

/// The p-quantile of the RTTs; None without any.
pub fn percentile(v: &[u32], p: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    s.sort_by(f64::total_cmp);
    sluice_testkit::summary::percentile(&s, p)
}
