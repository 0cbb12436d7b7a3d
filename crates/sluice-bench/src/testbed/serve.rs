//! `sluice-bench serve udp-echo`: a victim service. It echoes each datagram after
//! spending `work_ns` of CPU on it (a stand-in for a real service's cost),
//! reading and writing in batches with recvmmsg/sendmmsg. With `readers` > 1,
//! each reader has its own socket in one SO_REUSEPORT group (the kernel
//! spreads datagrams over them by flow hash, or sluice's steering does);
//! `threads` threads read each socket (the shared-socket study's experiment); with `stall`,
//! the first reader stops for a while every period. SIGUSR1 doubles the
//! per-request work (or sets it to the number in `work_file`) and SIGUSR2
//! restores it: the bench's capacity step.
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 64;
const BUF: usize = 2048;

#[derive(Debug, Clone)]
pub struct ServeOpts {
    pub bind: SocketAddr,
    pub work_ns: u64,
    /// Stop after this long (None: until stopped).
    pub duration: Option<Duration>,
    /// Do not send replies (a sink).
    pub no_echo: bool,
    /// Reader sockets, in one SO_REUSEPORT group when 2 or more.
    pub readers: usize,
    /// Threads reading each socket.
    pub threads: usize,
    /// The first socket's first thread sleeps `.0` every `.1`.
    pub stall: Option<(Duration, Duration)>,
    /// SO_RCVBUF of each socket (None: the kernel's default).
    pub rcvbuf: Option<usize>,
    /// Where SIGUSR1 reads the new work (ns) from; None: SIGUSR1 doubles it.
    pub work_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ServeReport {
    pub received: u64,
    pub echoed: u64,
    pub secs: f64,
}

/// Spin for `ns` nanoseconds of CPU (the emulated per-request work).
fn spin(ns: u64) {
    if ns == 0 {
        return;
    }
    let t = Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

/// A UDP socket bound to `addr`, in a SO_REUSEPORT group when `shared`.
fn bind(addr: SocketAddr, shared: bool, rcvbuf: Option<usize>) -> io::Result<UdpSocket> {
    let s =
        socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    if let Some(bytes) = rcvbuf {
        // SO_RCVBUFFORCE passes net.core.rmem_max (needs CAP_NET_ADMIN); else SO_RCVBUF, capped.
        let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
        // SAFETY: setsockopt with an int we own, on a socket we own.
        let forced = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&v as *const libc::c_int).cast(),
                4,
            )
        } == 0;
        if !forced {
            s.set_recv_buffer_size(bytes)?;
        }
    }
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    if shared {
        s.set_reuse_port(true)?;
    }
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// The work after SIGUSR1: the ns in the work file, else twice the base
/// (saturating: a base past half of u64 must not wrap to a small number).
fn stepped_work(file_text: Option<&str>, base: u64) -> u64 {
    file_text.and_then(|t| t.trim().parse().ok()).unwrap_or(base.saturating_mul(2))
}

/// Serve until `stop` is set or the duration ends; the readers' counts added up.
pub fn udp_echo(o: &ServeOpts, stop: Arc<AtomicBool>) -> io::Result<ServeReport> {
    let readers = o.readers.max(1);
    // The work per request, changed by SIGUSR1 (x2) and SIGUSR2 (back).
    let work = Arc::new(AtomicU64::new(o.work_ns));
    {
        let (work, base, file) = (work.clone(), o.work_ns, o.work_file.clone());
        let mut sig =
            signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1, signal_hook::consts::SIGUSR2])?;
        std::thread::spawn(move || {
            for s in sig.forever() {
                let text = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
                let w = if s == signal_hook::consts::SIGUSR1 { stepped_work(text.as_deref(), base) } else { base };
                work.store(w, Ordering::Relaxed);
            }
        });
    }
    let socks = (0..readers).map(|_| bind(o.bind, readers > 1, o.rcvbuf)).collect::<io::Result<Vec<_>>>()?;
    let mut threads = Vec::new();
    for (i, sock) in socks.into_iter().enumerate() {
        for t in 0..o.threads.max(1) {
            let sock = sock.try_clone()?;
            let stall = if i == 0 && t == 0 { o.stall } else { None };
            let (o, stop, work) = (o.clone(), stop.clone(), work.clone());
            threads.push(std::thread::spawn(move || reader(sock, &o, stop, &work, stall)));
        }
    }
    let mut total = ServeReport::default();
    for t in threads {
        let r = t.join().map_err(|_| io::Error::other("a reader thread panicked"))??;
        total.received += r.received;
        total.echoed += r.echoed;
        total.secs = total.secs.max(r.secs);
    }
    Ok(total)
}

fn reader(
    sock: UdpSocket,
    o: &ServeOpts,
    stop: Arc<AtomicBool>,
    work: &AtomicU64,
    stall: Option<(Duration, Duration)>,
) -> io::Result<ServeReport> {
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let fd = sock.as_raw_fd();
    let mut bufs = vec![[0u8; BUF]; BATCH];
    // SAFETY: plain C structs, zeroed is valid; pointers set below stay valid for the loop.
    let mut addrs: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut iov: Vec<libc::iovec> =
        bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: BUF }).collect();
    // SAFETY: as above: a zeroed mmsghdr is valid; its pointers are set before each call.
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let start = Instant::now();
    let mut rep = ServeReport::default();
    let mut next_stall = stall.map(|(_, every)| start + every);
    while !stop.load(Ordering::Relaxed) && o.duration.is_none_or(|d| start.elapsed() < d) {
        if let (Some(at), Some((pause, every))) = (next_stall, stall) {
            if Instant::now() >= at {
                std::thread::sleep(pause);
                next_stall = Some(at + every);
            }
        }
        for i in 0..BATCH {
            msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            iov[i].iov_len = BUF;
        }
        // SAFETY: msgs/iov/addrs are valid for BATCH entries.
        let n =
            unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), BATCH as u32, libc::MSG_WAITFORONE, std::ptr::null_mut()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        rep.received += n as u64;
        let work_ns = work.load(Ordering::Relaxed);
        for m in msgs.iter_mut().take(n) {
            spin(work_ns);
            // Echo exactly what arrived.
            // SAFETY: msg_iov points into iov, set above.
            unsafe { (*m.msg_hdr.msg_iov).iov_len = m.msg_len as usize };
        }
        if !o.no_echo {
            // SAFETY: the first n headers hold the peers' addresses and the received lengths.
            let s = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
            if s > 0 {
                rep.echoed += s as u64;
            }
        }
    }
    rep.secs = start.elapsed().as_secs_f64();
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `base * 2` wrapped for a base past half of u64.
    #[test]
    fn stepped_work_doubles_without_wrapping() {
        assert_eq!(stepped_work(None, 2_000), 4_000);
        assert_eq!(stepped_work(Some(" 7000\n"), 2_000), 7_000);
        assert_eq!(stepped_work(Some("garbage"), 2_000), 4_000);
        assert_eq!(stepped_work(None, u64::MAX / 2 + 1), u64::MAX);
    }
}
