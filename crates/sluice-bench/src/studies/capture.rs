//! `sluice bench capture`: the capture-cost study's capture experiment, with the gate.
//!
//! A capture program on the victim's interface (`tcpdump` from Debian over
//! AF_PACKET with a `udp dst port` filter, or a plain raw-socket reader,
//! both on the victim CPU of the same-core model) while the generator sends
//! 10,000 frames of the captured class (with no gap: 100 ms of them, about
//! 60,000) mixed with nine times as many other
//! frames, of 64 or 1500 bytes, with no gap (6 Mpps asked in all, about the
//! generator's best here) or a 1 us gap (1 Mpps in all). Counted: the captured class's frames that
//! reached the capture program, the frames the veth ring refused, and from
//! `sluice trace`'s tracer where the rest died and the driver->stack time
//! (mean +- 95% interval); from bpf_stats the gate's ns per frame. Then the
//! same with the gate admitting only the captured class.
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::load::gen::{stream_value, udp_stream, Generator};
use crate::testbed::victim::{link_stats, VictimBed, VictimModel, IF_A, IF_B};
use sluice::dataplane::gate::Gate;
use sluice::surface::trace::fate::{Interval, INTERVALS};
use sluice::{base::netns, dataplane::classify, policy::config};

/// The captured class's frames per run (the capture-cost study's count).
pub const FRAMES: u64 = 10_000;
/// Other frames per captured one.
pub const OTHERS: f64 = 9.0;
const PORT: u16 = 9000;
const OTHER_PORT: u16 = 9001;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureRun {
    pub capturer: String,
    pub frame: u32,
    /// "none" (as fast as the generator goes) or "1us".
    pub gap: String,
    /// "pass-all" (the gate admits everything) or "captured-only".
    pub gate: String,
    pub sent_captured: u64,
    pub sent_other: u64,
    pub secs: f64,
    /// Frames the veth ring refused (all classes).
    pub ring_drops: u64,
    /// Captured-class frames that reached the capture program: read by the
    /// raw reader; for tcpdump, its "packets captured".
    pub captured: u64,
    /// tcpdump only: its "received by filter" (frames its filter passed) and
    /// "dropped by kernel" (of those, the ones its AF_PACKET ring had no room for).
    pub tcpdump_filter_dropped: Option<(u64, u64)>,
    pub captured_share: f64,
    /// Where the tracer saw the captured class die after the gate: (stage, reason, frames).
    pub kernel_drops: Vec<(String, String, u64)>,
    /// The captured class's driver->stack time on sampled frames.
    pub driver_stack: Option<Interval>,
    /// The gate's mean run time per frame (bpf_stats), ns.
    pub gate_ns: Option<f64>,
}

pub struct CaptureOpts {
    pub capturers: Vec<String>,
    pub frames: Vec<u32>,
    pub gaps: Vec<String>,
}

/// A running capture program: stop() returns the captured-class frames it got.
enum Capturer {
    Tcpdump(std::process::Child),
    Raw { stop: Arc<AtomicBool>, count: Arc<AtomicU64>, thread: std::thread::JoinHandle<Result<()>> },
}

fn start_tcpdump(ns: &str, cpu: usize) -> Result<Capturer> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "taskset", "-c", &cpu.to_string(), "tcpdump", "-i", IF_B, "-n", "--immediate-mode"])
        .args(["-w", "/dev/null"])
        .args(["udp", "dst", "port", &PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tcpdump (install it: `make deps`)")?;
    // tcpdump says "listening on vb" once its socket and filter are in place.
    let mut err = child.stderr.take().expect("piped");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("listening on") {
        if Instant::now() > deadline {
            bail!("tcpdump did not start: {}", String::from_utf8_lossy(&seen));
        }
        let n = err.read(&mut buf)?;
        if n == 0 {
            bail!("tcpdump exited: {}", String::from_utf8_lossy(&seen));
        }
        seen.extend_from_slice(&buf[..n]);
    }
    child.stderr = Some(err);
    Ok(Capturer::Tcpdump(child))
}

/// A plain AF_PACKET reader on IF_B counting the captured class's UDP frames.
fn start_raw(ns: &str, cpu: usize) -> Result<Capturer> {
    let (stop, count) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (s, c, ns) = (stop.clone(), count.clone(), ns.to_string());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || -> Result<()> {
        netns::enter(&ns)?;
        netns::pin_thread(cpu)?;
        let fd = raw_socket()?;
        let _ = ready_tx.send(());
        let mut buf = vec![0u8; 2048];
        while !s.load(Ordering::Relaxed) {
            // SAFETY: recv into our buffer; the socket has a 100 ms receive timeout.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 38 && is_captured(&buf[..n as usize]) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        Ok(())
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).context("the raw-socket reader did not start")?;
    Ok(Capturer::Raw { stop, count, thread })
}

fn raw_socket() -> Result<i32> {
    let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
    // SAFETY: plain socket calls; the fd is ours.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto);
        if fd < 0 {
            bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
        }
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = sluice::dataplane::gate::ifindex(IF_B)? as i32;
        if libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of_val(&sll) as u32) < 0 {
            bail!("binding the AF_PACKET socket to {IF_B}: {}", std::io::Error::last_os_error());
        }
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), 16);
        Ok(fd)
    }
}

/// An IPv4 UDP frame to PORT (Ethernet + IPv4 without options + UDP).
fn is_captured(f: &[u8]) -> bool {
    f[12] == 0x08 && f[13] == 0x00 && f[23] == 17 && u16::from_be_bytes([f[36], f[37]]) == PORT
}

/// The number before `what` on a line of tcpdump's summary.
fn tcpdump_count(text: &str, what: &str) -> Result<u64> {
    let line = text.lines().find(|l| l.contains(what)).with_context(|| format!("tcpdump's \"{what}\" line"))?;
    line.split_whitespace().next().and_then(|n| n.parse().ok()).with_context(|| format!("tcpdump's {what} count"))
}

impl Capturer {
    /// Stop; the captured-class frames that reached it, and tcpdump's (received by filter, dropped by kernel).
    fn stop(self) -> Result<(u64, Option<(u64, u64)>)> {
        match self {
            Capturer::Tcpdump(child) => {
                // SAFETY: kill(2) on our child (ip netns exec execs taskset, which execs tcpdump).
                unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
                let out = child.wait_with_output()?;
                let text = String::from_utf8_lossy(&out.stderr);
                let filter = (tcpdump_count(&text, "received by filter")?, tcpdump_count(&text, "dropped by kernel")?);
                Ok((tcpdump_count(&text, "packets captured")?, Some(filter)))
            }
            Capturer::Raw { stop, count, thread } => {
                stop.store(true, Ordering::Relaxed);
                thread.join().map_err(|_| anyhow::anyhow!("the raw-socket reader panicked"))??;
                Ok((count.load(Ordering::Relaxed), None))
            }
        }
    }
}

/// The gate's (run_time_ns, run_cnt) from bpf_stats.
fn gate_stats(gate: &Gate) -> Option<(u64, u64)> {
    libbpf_rs::query::ProgInfoIter::default().find(|p| p.id == gate.prog_id()).map(|p| (p.run_time_ns, p.run_cnt))
}

struct Bed {
    tb: VictimBed,
    gate: Gate,
    gen: Arc<Mutex<Generator>>,
}

impl Bed {
    fn start() -> Result<Bed> {
        let tb = VictimBed::create("capture", VictimModel::SameCore)?;
        let gate = netns::run_in(&tb.net.b, || {
            let mut g = Gate::load()?;
            g.attach(IF_B, config::XdpMode::Native, false)?;
            Ok(g)
        })?;
        tb.apply_model()?;
        Ok(Bed { tb, gate, gen: Arc::new(Mutex::new(Generator::load()?)) })
    }

    fn set_gate(&mut self, captured_only: bool) -> Result<()> {
        let other = if captured_only { "rate=blocked" } else { "priority=1" };
        let flags = [format!("cap:priority=0,match=udp:{PORT}"), format!("default:{other}")];
        let cfg = config::from_flags(&flags)?;
        self.gate.apply(&cfg, &classify::compile(&cfg)?)?;
        self.tb.apply_model() // re-pin the napi kthread (the gate stays attached)
    }

    fn one(&mut self, capturer: &str, frame: u32, gap: &str, captured_only: bool) -> Result<CaptureRun> {
        self.set_gate(captured_only)?;
        // No gap: about the generator's best on this machine (6 Mpps, ../LINUX-NOTES).
        let total_pps = if gap == "1us" { 1e6 } else { 6e6 };
        let cap_pps = total_pps / (1.0 + OTHERS);
        let net = &self.tb.net;
        let streams = [
            udp_stream("captured", cap_pps, frame, net.ip_a, 4000, net.ip_b, PORT),
            udp_stream("other", cap_pps * OTHERS, frame, net.ip_a, 5000, net.ip_b, OTHER_PORT),
        ];
        let values: Vec<_> = streams.iter().map(|s| stream_value(s, net.mac_b, net.mac_a)).collect::<Result<_>>()?;
        self.gen.lock().unwrap().set_streams(&values)?;
        let ifindex = netns::run_in(&net.b, || Ok(sluice::dataplane::gate::ifindex(IF_B)?))?;
        let topts = sluice::dataplane::trace::Options {
            ifindex,
            netns: sluice::base::netns::inode(&net.b)?,
            default_class: 1,
            drops_only: false,
            tgid: None,
        };
        let mut tracer = sluice::dataplane::trace::Tracer::start(
            &topts,
            sluice::dataplane::trace::Tables::Gate(self.gate.shared_maps()?),
        )?;
        tracer.set_sample_every(10);
        let capture = match capturer {
            "tcpdump" => start_tcpdump(&net.b, self.tb.victim_cpu)?,
            _ => start_raw(&net.b, self.tb.victim_cpu)?,
        };
        let ring0 = link_stats(&net.a, IF_A)?.tx_dropped;
        let stats0 = gate_stats(&self.gate);
        // FRAMES captured-class frames at the asked rate, but at least 100 ms:
        // a generator run of a few ms sends erratically (its start costs
        // about 20 ms). The share is of what the generator really sent.
        let secs = (FRAMES as f64 / cap_pps).max(0.1);
        let (a, ifx, gen, cpu) = (net.a.clone(), net.ifindex_a, self.gen.clone(), self.tb.gen_cpu);
        let (counts, run_secs) = netns::run_in(&a, move || {
            netns::pin_thread(cpu)?;
            gen.lock().unwrap().run(ifx, Duration::from_secs_f64(secs), 64)
        })?;
        std::thread::sleep(Duration::from_millis(1000));
        let (captured, tcpdump_filter_dropped) = capture.stop()?;
        let ring_drops = link_stats(&net.a, IF_A)?.tx_dropped - ring0;
        let gate_ns = stats0
            .zip(gate_stats(&self.gate))
            .and_then(|((t0, n0), (t1, n1))| (n1 > n0 && t1 > t0).then(|| (t1 - t0) as f64 / (n1 - n0) as f64));
        let c = tracer.counts()?;
        let kernel_drops = sluice::surface::trace::drops_of(&tracer, &c, 0)
            .into_iter()
            .map(|d| (d.stage, d.reason, d.packets))
            .collect();
        let driver_stack = Some(Interval::of(INTERVALS[0], &c.latency[0][0]));
        let sent_captured = counts[0].sent;
        Ok(CaptureRun {
            capturer: capturer.to_string(),
            frame,
            gap: gap.to_string(),
            gate: if captured_only { "captured-only" } else { "pass-all" }.to_string(),
            sent_captured,
            sent_other: counts[1].sent,
            secs: run_secs,
            ring_drops,
            captured,
            tcpdump_filter_dropped,
            captured_share: captured as f64 / sent_captured.max(1) as f64,
            kernel_drops,
            driver_stack,
            gate_ns,
        })
    }
}

pub fn run(o: &CaptureOpts) -> Result<Vec<CaptureRun>> {
    sluice::dataplane::gate::check_privileges()?;
    let stats_were = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").context("switching on kernel.bpf_stats_enabled")?;
    let result = (|| {
        let mut bed = Bed::start()?;
        let n = o.capturers.len() * o.frames.len() * o.gaps.len() * 2;
        let bar = indicatif::ProgressBar::new(n as u64);
        let mut runs = Vec::new();
        for capturer in &o.capturers {
            for &frame in &o.frames {
                for gap in &o.gaps {
                    for captured_only in [false, true] {
                        bar.set_message(format!("{capturer} {frame} B gap {gap}"));
                        runs.push(bed.one(capturer, frame, gap, captured_only)?);
                        bar.inc(1);
                    }
                }
            }
        }
        bar.finish_and_clear();
        Ok(runs)
    })();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_were.trim());
    result
}

pub fn summary(runs: &[CaptureRun]) -> String {
    let mut o = format!(
        "capture on the victim CPU (same-core model): {FRAMES} frames of the captured class with {OTHERS} times as many others\n"
    );
    o += &format!(
        "  {:<8} {:>5} {:>4} {:<14} {:>9} {:>9} {:>10} {:>9} {:>22} {:>7}  {}\n",
        "capture",
        "frame",
        "gap",
        "gate",
        "sent",
        "captured",
        "share",
        "ring drop",
        "driver->stack mean",
        "gate ns",
        "died after the gate"
    );
    for r in runs {
        let ds = r.driver_stack.as_ref().and_then(|i| Some(format!("{:.0} +- {:.0} ns", i.mean_ns?, i.ci95_ns?)));
        let died: Vec<String> = r.kernel_drops.iter().map(|(s, why, n)| format!("{s}/{why} {n}")).collect();
        o += &format!(
            "  {:<8} {:>5} {:>4} {:<14} {:>9} {:>9} {:>9.2}% {:>9} {:>22} {:>7}  {}\n",
            r.capturer,
            r.frame,
            r.gap,
            r.gate,
            r.sent_captured,
            r.captured,
            r.captured_share * 100.0,
            r.ring_drops,
            ds.unwrap_or_else(|| "n/a".into()),
            r.gate_ns.map_or("n/a".into(), |g| format!("{g:.0}")),
            if died.is_empty() { "-".to_string() } else { died.join(", ") }
        );
        if let Some((filter, dropped)) = r.tcpdump_filter_dropped {
            o += &format!("  {:<8} (tcpdump: {filter} received by filter, {dropped} of them dropped by kernel: its ring was full)\n", "");
        }
    }
    o
}
