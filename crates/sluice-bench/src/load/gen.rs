//! The bench's traffic generator: BPF live frames from the generator's
//! namespace, paced inside one long BPF_PROG_RUN call (see the design comment
//! in `bpf/gen.bpf.c`), ended by a thread-directed timer signal.
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};
use serde::{Deserialize, Serialize};

use crate::gen_intf::{
    sluice_gen_state, sluice_gen_stream, SLUICE_GEN_FP_SHIFT, SLUICE_GEN_MAX_FRAME, SLUICE_GEN_MAX_STREAMS,
    SLUICE_GEN_MIN_FRAME, SLUICE_GEN_STAMP_LEN, SLUICE_GEN_TMPL,
};
use crate::gen_skel::{GenSkel, GenSkelBuilder};
use sluice::dataplane::gate::Owned;
use sluice_testkit::packet::{Frame, L4};

/// One stream of UDP frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSpec {
    pub name: String,
    /// Packets per second.
    pub rate: f64,
    /// Frame length in bytes (Ethernet header included, FCS not), 60..1514.
    pub frame_len: u32,
    /// Source address and first source port; `flows` ports from there.
    pub src: SocketAddr,
    pub flows: u32,
    /// Source addresses: `src`'s and the next srcs - 1 (IPv4: on the last
    /// 32 bits; IPv6: on bits 32-63, so each is a /64 of its own).
    #[serde(default = "one")]
    pub srcs: u32,
    /// Draw each frame's source at random from those (else in turn).
    #[serde(default)]
    pub random_srcs: bool,
    /// Destination address and first destination port; `dports` ports from there.
    pub dst: SocketAddr,
    pub dports: u32,
    /// Carry a send-time stamp (for round trips through an echo service).
    pub stamp: bool,
    /// TCP SYNs instead of UDP datagrams (a SYN flood; no stamp).
    #[serde(default)]
    pub syn: bool,
    /// With `syn`: TCP segments with these flags instead of a SYN (0x10 an
    /// ACK, 0x04 a RST: floods of no connection); None: SYN.
    #[serde(default)]
    pub tcp_flags: Option<u8>,
    /// UDP over IPv4: the payload is this message (a DNS query, say) rather
    /// than zeros, and `frame_len` is exactly its headers and it: a flood
    /// the service must work on, not junk it drops cheaply.
    #[serde(default)]
    pub payload: Option<Vec<u8>>,
}

/// Set a valid TCP segment's flags (byte 13 of its header) and fix its
/// checksum for the change (RFC 1624: HC' = ~(~HC + ~m + m'), the 16-bit
/// word at bytes 12-13 being m).
fn set_tcp_flags(frame: &mut [u8], l4: usize, flags: u8) {
    let word = |f: &[u8]| u16::from_be_bytes([f[l4 + 12], f[l4 + 13]]);
    let old = word(frame);
    frame[l4 + 13] = flags;
    let new = word(frame);
    let hc = u16::from_be_bytes([frame[l4 + 16], frame[l4 + 17]]);
    let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[l4 + 16..l4 + 18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

fn one() -> u32 {
    1
}

/// What one stream did in a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamCount {
    pub sent: u64,
    /// Frames given up because the generator fell behind by more than 64 frames.
    pub late: u64,
    pub errors: u64,
}

/// The map value of a stream: the template with valid checksums and the pacing.
/// The interval between frames of a stream at `rate`, in fixed point.
fn interval_fp(rate: f64) -> u64 {
    ((1e9 / rate) * (1u64 << SLUICE_GEN_FP_SHIFT) as f64).round() as u64
}

pub fn stream_value(s: &StreamSpec, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Result<sluice_gen_stream> {
    ensure!(s.rate > 0.0 && s.rate <= 20e6, "stream {}: rate {} out of range (0 to 20M packets/s)", s.name, s.rate);
    ensure!(
        (SLUICE_GEN_MIN_FRAME..=SLUICE_GEN_MAX_FRAME).contains(&s.frame_len),
        "stream {}: frame size {} out of range ({SLUICE_GEN_MIN_FRAME}..{SLUICE_GEN_MAX_FRAME} bytes)",
        s.name,
        s.frame_len
    );
    ensure!(s.src.is_ipv4() == s.dst.is_ipv4(), "stream {}: source and destination families differ", s.name);
    ensure!(
        s.flows >= 1 && s.dports >= 1 && s.srcs >= 1,
        "stream {}: flows, dports and srcs must be at least 1",
        s.name
    );
    ensure!(
        s.src.port() as u32 + s.flows <= 65536 && s.dst.port() as u32 + s.dports <= 65536,
        "stream {}: port range passes 65535",
        s.name
    );
    let mut f = Frame::new(
        &s.src.ip().to_string(),
        &s.dst.ip().to_string(),
        if s.syn {
            L4::Tcp { sport: s.src.port(), dport: s.dst.port() }
        } else {
            L4::Udp { sport: s.src.port(), dport: s.dst.port() }
        },
    );
    f.macs = (dst_mac, src_mac);
    f.fill = 0;
    f.payload = 0;
    let f = f.frame_len(s.frame_len as usize);
    let (_, offs) = f.build_with_offsets();
    let mut bytes = f.build_valid();
    let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
    if let Some(flags) = s.tcp_flags.filter(|_| s.syn) {
        set_tcp_flags(&mut bytes, l4, flags);
    }
    let ip = offs.iter().find(|o| o.0 == "ip").unwrap().1;
    if let Some(p) = &s.payload {
        // IPv4 UDP leaves its checksum 0 (none), so the bytes need no sum.
        ensure!(!s.syn && s.src.is_ipv4() && !s.stamp, "stream {}: a payload is for unstamped UDP over IPv4", s.name);
        ensure!(
            l4 + 8 + p.len() == s.frame_len as usize && s.frame_len <= SLUICE_GEN_TMPL,
            "stream {}: a {}-byte payload needs frame_len {} (at most {SLUICE_GEN_TMPL})",
            s.name,
            p.len(),
            l4 + 8 + p.len()
        );
        bytes[l4 + 8..].copy_from_slice(p);
    }
    let stamp_off = l4 + 8;
    ensure!(!(s.syn && s.stamp), "stream {}: a SYN carries no stamp", s.name);
    let stamp =
        s.stamp && stamp_off + SLUICE_GEN_STAMP_LEN as usize <= (s.frame_len as usize).min(SLUICE_GEN_TMPL as usize);
    ensure!(
        stamp || !s.stamp,
        "stream {}: a stamped frame needs at least {} bytes",
        s.name,
        stamp_off + SLUICE_GEN_STAMP_LEN as usize
    );
    let mut v = sluice_gen_stream {
        interval_fp: interval_fp(s.rate),
        len: s.frame_len,
        flows: s.flows,
        dports: s.dports,
        sport_base: s.src.port(),
        dport_base: s.dst.port(),
        sport_off: l4 as u16,
        csum_off: match (s.syn, s.src.is_ipv6()) {
            (true, _) => (l4 + 16) as u16,
            (false, true) => (l4 + 6) as u16,
            (false, false) => 0,
        },
        stamp_off: if stamp { stamp_off as u16 } else { 0 },
        // IPv4's source address, or bytes 4-7 of IPv6's (both at IP header + 12).
        saddr_off: (ip + 12) as u16,
        ipcsum_off: if s.src.is_ipv4() { (ip + 10) as u16 } else { 0 },
        srcs: s.srcs,
        random: s.random_srcs as u32,
        ..Default::default()
    };
    let n = bytes.len().min(SLUICE_GEN_TMPL as usize);
    v.tmpl[..n].copy_from_slice(&bytes[..n]);
    Ok(v)
}

/// Default frames per flush: bursts never exceed it.
pub const DEFAULT_BATCH: u32 = 64;

/// SIGALRM ends the generator's BPF_PROG_RUN call: a handler that does
/// nothing, installed without SA_RESTART so the call returns EINTR.
extern "C" fn on_alarm(_: libc::c_int) {}

fn install_alarm_handler() -> Result<()> {
    // SAFETY: sigaction with a no-op handler; sa_flags 0 = no SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()) != 0 {
            bail!("installing the SIGALRM handler: {}", std::io::Error::last_os_error());
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGALRM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    Ok(())
}

/// A one-shot timer that sends SIGALRM to the calling thread.
struct ThreadTimer(libc::timer_t);

impl ThreadTimer {
    fn arm(after: Duration) -> Result<ThreadTimer> {
        // SAFETY: plain C structs; the timer is deleted on drop.
        unsafe {
            let mut sev: libc::sigevent = std::mem::zeroed();
            sev.sigev_notify = libc::SIGEV_THREAD_ID;
            sev.sigev_signo = libc::SIGALRM;
            sev.sigev_notify_thread_id = libc::gettid();
            let mut t: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut t) != 0 {
                bail!("timer_create: {}", std::io::Error::last_os_error());
            }
            let spec = libc::itimerspec {
                it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
                it_value: libc::timespec { tv_sec: after.as_secs() as _, tv_nsec: after.subsec_nanos() as _ },
            };
            if libc::timer_settime(t, 0, &spec, std::ptr::null_mut()) != 0 {
                libc::timer_delete(t);
                bail!("timer_settime: {}", std::io::Error::last_os_error());
            }
            Ok(ThreadTimer(t))
        }
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: a timer we created.
        unsafe { libc::timer_delete(self.0) };
    }
}

// SAFETY: the generator's header structs: integers with explicit padding fields.
unsafe impl sluice::dataplane::gate::Pod for sluice_gen_stream {}
// SAFETY: as above.
unsafe impl sluice::dataplane::gate::Pod for sluice_gen_state {}

/// The loaded generator program.
pub struct Generator {
    skel: Owned<GenSkel<'static>>,
    streams: usize,
    values: Vec<sluice_gen_stream>,
}

impl Generator {
    pub fn load() -> Result<Generator> {
        let skel = Owned::new(|storage| GenSkelBuilder::default().open(storage)?.load())
            .context("loading the generator program")?;
        Ok(Generator { skel, streams: 0, values: vec![] })
    }

    /// Run the object's no-op XDP program on `packet` `repeat` times
    /// (BPF_PROG_TEST_RUN): the floor `sluice bench gate` subtracts. Its
    /// verdict and the kernel's mean time per run.
    pub fn noop_run(&self, packet: &[u8], repeat: u32) -> Result<(u32, std::time::Duration)> {
        let input = libbpf_rs::ProgramInput { data_in: Some(packet), repeat, ..Default::default() };
        let out = self.skel.progs.bench_noop.test_run(input).context("test-running the no-op program")?;
        Ok((out.return_value, out.duration))
    }

    /// Set the streams (at most SLUICE_GEN_MAX_STREAMS) and reset their state.
    pub fn set_streams(&mut self, streams: &[sluice_gen_stream]) -> Result<()> {
        self.values = streams.to_vec();
        ensure!(streams.len() <= SLUICE_GEN_MAX_STREAMS as usize, "at most {SLUICE_GEN_MAX_STREAMS} streams");
        for i in 0..SLUICE_GEN_MAX_STREAMS as usize {
            let v = streams.get(i).copied().unwrap_or_default();
            let key = (i as u32).to_ne_bytes();
            self.skel.maps.gen_streams.update(&key, sluice::dataplane::gate::bytes_of(&v), MapFlags::ANY)?;
            let zero = sluice_gen_state::default();
            self.skel.maps.gen_state.update(&key, sluice::dataplane::gate::bytes_of(&zero), MapFlags::ANY)?;
        }
        self.streams = streams.len();
        Ok(())
    }

    /// Change stream `i`'s rate while a run is going (0 pauses it); its pacing
    /// state is kept, so the change takes effect at the next frame.
    pub fn set_rate_live(&self, i: usize, rate: f64) -> Result<()> {
        let mut v = *self.values.get(i).context("no such stream")?;
        v.interval_fp = if rate <= 0.0 { 0 } else { interval_fp(rate) };
        self.skel.maps.gen_streams.update(
            &(i as u32).to_ne_bytes(),
            sluice::dataplane::gate::bytes_of(&v),
            MapFlags::ANY,
        )?;
        Ok(())
    }

    fn states(&self) -> Result<Vec<sluice_gen_state>> {
        (0..self.streams)
            .map(|i| {
                let v = self.skel.maps.gen_state.lookup(&(i as u32).to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
                Ok(sluice::dataplane::gate::from_bytes(&v))
            })
            .collect()
    }

    /// Per-stream counts so far.
    pub fn counts(&self) -> Result<Vec<StreamCount>> {
        Ok(self.states()?.iter().map(|s| StreamCount { sent: s.sent, late: s.late, errors: s.errors }).collect())
    }

    /// CLOCK_MONOTONIC ns of the first frame of the run: each stream's due time
    /// started there and moved one interval per frame sent or given up.
    fn first_frame_ns(&self, streams: &[sluice_gen_stream]) -> Result<Option<u64>> {
        let states = self.states()?;
        let firsts =
            states.iter().zip(streams).filter_map(|(s, st)| first_due_fp(s.due_fp, s.sent + s.late, st.interval_fp));
        Ok(firsts.min().map(|fp| fp >> SLUICE_GEN_FP_SHIFT))
    }

    /// Send for `duration` out of interface `ifindex`. Call it on a thread that
    /// is inside the generator's namespace and pinned to the generator CPU.
    /// Returns the counts and the seconds from the first frame to the end of
    /// the sending (the call's ~20 ms of setup and teardown excluded).
    ///
    /// `batch` is how many program runs the kernel makes before it flushes the
    /// frames out (1..=256): no more than that many frames ever leave
    /// together. 64 keeps bursts within 64 frames; on a VM with stalls, 128
    /// keeps 2-3M pkt/s within 2% at the price of catch-up bursts up to ~100.
    pub fn run(&self, ifindex: u32, duration: Duration, batch: u32) -> Result<(Vec<StreamCount>, f64)> {
        ensure!((1..=256).contains(&batch), "generator batch {batch} out of range 1..=256");
        install_alarm_handler()?;
        let data = vec![0u8; SLUICE_GEN_MAX_FRAME as usize];
        let ctx = libbpf_sys::xdp_md { data_end: data.len() as u32, ingress_ifindex: ifindex, ..Default::default() };
        let mut opts = libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
            data_in: data.as_ptr().cast(),
            data_size_in: data.len() as u32,
            ctx_in: (&ctx as *const libbpf_sys::xdp_md).cast(),
            ctx_size_in: std::mem::size_of::<libbpf_sys::xdp_md>() as u32,
            repeat: i32::MAX,
            flags: libbpf_sys::BPF_F_TEST_XDP_LIVE_FRAMES,
            batch_size: batch,
            ..Default::default()
        };
        let fd = self.skel.progs.sluice_gen.as_fd().as_raw_fd();
        let start = Instant::now();
        let expiry = mono_ns() + duration.as_nanos() as u64;
        let timer = ThreadTimer::arm(duration)?;
        // SAFETY: opts points at buffers that live until the call returns.
        let r = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, &mut opts) };
        let end = mono_ns().min(expiry);
        drop(timer);
        let secs = match self.first_frame_ns(&self.values)? {
            Some(first) if first < end => (end - first) as f64 / 1e9,
            _ => start.elapsed().as_secs_f64(),
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) && -r != libc::EINTR {
                bail!("the generator's BPF_PROG_RUN failed: {e} (live frames need kernel 5.18+ and an XDP program on the peer)");
            }
        }
        Ok((self.counts()?, secs))
    }
}

/// A stream's first due time (fixed point) from its due time now, the frames
/// it sent or gave up, and its interval. None when that cannot be traced back:
/// the stream never ran, or its rate changed during the run (`set_rate_live`,
/// the step bench), so the frames were not all one interval apart and the
/// subtraction would go below zero or overflow.
fn first_due_fp(due_fp: u64, frames: u64, interval_fp: u64) -> Option<u64> {
    if due_fp == 0 {
        return None;
    }
    due_fp.checked_sub(frames.checked_mul(interval_fp)?)
}

/// CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns().
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Shorthand for tests and scenarios.
pub fn udp_stream(
    name: &str,
    rate: f64,
    frame_len: u32,
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
) -> StreamSpec {
    StreamSpec {
        name: name.into(),
        rate,
        frame_len,
        src: SocketAddr::new(src, sport),
        flows: 1,
        dst: SocketAddr::new(dst, dport),
        dports: 1,
        srcs: 1,
        random_srcs: false,
        stamp: false,
        syn: false,
        tcp_flags: None,
        payload: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ACK or RST template keeps a valid TCP checksum (the generator only
    /// adjusts it for the fields it rewrites): the sum over the pseudo-header
    /// and the segment folds to zero, and setting SYN back gives the SYN frame.
    #[test]
    fn tcp_flags_are_set_with_a_valid_checksum() {
        use sluice_testkit::packet::{checksum, Frame};
        let f = Frame::tcp("10.0.0.1", "10.0.0.2", 1024, 80).frame_len(64);
        let (_, offs) = f.build_with_offsets();
        let (ip, l4) = (offs.iter().find(|o| o.0 == "ip").unwrap().1, offs.iter().find(|o| o.0 == "l4").unwrap().1);
        let syn = f.build_valid();
        let valid = |b: &[u8]| {
            let seg = &b[l4..ip + usize::from(u16::from_be_bytes([b[ip + 2], b[ip + 3]]))];
            let pseudo: Vec<u8> = [&b[ip + 12..ip + 20], &[0, 6], &(seg.len() as u16).to_be_bytes()[..]].concat();
            checksum(&[pseudo, seg.to_vec()].concat(), 0) == 0
        };
        assert!(valid(&syn), "the SYN template is valid to begin with");
        for flags in [0x10, 0x04] {
            let mut b = syn.clone();
            set_tcp_flags(&mut b, l4, flags);
            assert_eq!(b[l4 + 13], flags);
            assert!(valid(&b), "flags {flags:#x}: checksum");
            set_tcp_flags(&mut b, l4, 0x02);
            assert_eq!(b, syn, "back to SYN: the same frame");
        }
    }

    /// Regression: after a live rate change the frames sent times the start
    /// interval can exceed the due time, and the subtraction underflowed.
    #[test]
    fn first_due_time_of_a_stream_whose_rate_changed_is_unknown() {
        assert_eq!(first_due_fp(1_000, 10, 50), Some(500));
        assert_eq!(first_due_fp(1_000, 30, 50), None, "more frames than the start interval allows");
        assert_eq!(first_due_fp(0, 0, 50), None, "never ran");
        assert_eq!(first_due_fp(u64::MAX, u64::MAX, 2), None, "overflow");
    }
}
