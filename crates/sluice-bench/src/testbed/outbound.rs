//! The NAPI study's two side measurements of every level, beside the service:
//! - a steady outbound flow from the victim's namespace (10 Mb/s of
//!   1470-byte UDP payloads, `sluice-bench send`), measured where it arrives: a
//!   socket in A counting bytes. The sender runs on the generator's CPU:
//!   pinned to the victim CPU it stalled the same-core model's napi kthread
//!   (the victim then received nothing; not understood, see docs/results/),
//!   so the flow measures the victim's network path, not its CPU;
//! - `ping` from A to the victim (100 a second) over the window: the network
//!   subsystem's own response time.
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::testbed::victim::VictimBed;

/// The outbound flow's destination port in A.
pub const OUT_PORT: u16 = 40001;
/// 850 datagrams/s of 1470 bytes: 10 Mb/s of payload.
pub const OUT_RATE: u32 = 850;
pub const OUT_PAYLOAD: u32 = 1470;

/// The outbound flow: its sender in B and its receiver in A.
pub struct Outbound {
    sender: Child,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Outbound {
    pub fn start(tb: &VictimBed, exe: &Path) -> Result<Outbound> {
        let (bytes, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let bind = SocketAddr::new(tb.net.ip_a, OUT_PORT);
        let b = bytes.clone();
        let thread = crate::load::workers::receive_in(&tb.net.a, bind, stop.clone(), move |d| {
            b.fetch_add(d.len() as u64, Ordering::Relaxed);
        })
        .context("the outbound flow's receiver")?;
        let sender = Command::new("ip")
            .args(["netns", "exec", &tb.net.b, "taskset", "-c", &tb.gen_cpu.to_string()])
            .arg(crate::load_exe(exe))
            .args(["send", "--dst", &bind.to_string(), "--rate", &OUT_RATE.to_string()])
            .args(["--payload", &OUT_PAYLOAD.to_string(), "--flows", "1", "--duration", "86400"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the outbound flow (sluice-bench send)")?;
        Ok(Outbound { sender, bytes, stop, thread: Some(thread) })
    }

    /// Payload bytes received so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Outbound {
    /// Stop the sender and the receiver (again: a no-op).
    pub fn stop(&mut self) {
        let _ = self.sender.kill();
        let _ = self.sender.wait();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `ping` running in A for one window.
pub struct Ping(Child);

/// What a ping run saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingResult {
    pub sent: u64,
    pub received: u64,
    /// Mean round trip; None when no reply came.
    pub avg_us: Option<f64>,
}

impl Ping {
    /// 100 echo requests a second from A to `dst` for `secs`.
    pub fn start(ns_a: &str, dst: &str, secs: f64) -> Result<Ping> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns_a, "ping", "-q", "-n", "-i", "0.01", "-W", "1"])
            .args(["-w", &format!("{}", secs.ceil().max(1.0) as u64), dst])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ping (iputils-ping)")?;
        Ok(Ping(child))
    }

    pub fn finish(self) -> Result<PingResult> {
        let out = self.0.wait_with_output()?;
        parse_ping(&String::from_utf8_lossy(&out.stdout))
    }
}

/// ping's summary: "N packets transmitted, M received, ..." and
/// "rtt min/avg/max/mdev = a/b/c/d ms" (absent when nothing came back).
pub fn parse_ping(text: &str) -> Result<PingResult> {
    let line = text.lines().find(|l| l.contains("packets transmitted")).context("ping printed no summary")?;
    let num = |word: &str| -> Result<u64> {
        let i = line.find(word).with_context(|| format!("ping's summary has no \"{word}\""))?;
        line[..i].split_whitespace().last().and_then(|n| n.parse().ok()).context("a count in ping's summary")
    };
    let avg_us = text
        .lines()
        .find(|l| l.starts_with("rtt ") || l.starts_with("round-trip"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|ms| ms * 1e3);
    Ok(PingResult { sent: num("packets transmitted")?, received: num("received")?, avg_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_summaries_with_and_without_replies() {
        let ok = "--- 10.77.0.2 ping statistics ---\n300 packets transmitted, 298 received, 0.666667% packet loss, time 2990ms\nrtt min/avg/max/mdev = 0.020/0.045/0.512/0.030 ms\n";
        let r = parse_ping(ok).unwrap();
        assert_eq!((r.sent, r.received), (300, 298));
        assert!((r.avg_us.unwrap() - 45.0).abs() < 1e-9);
        let none = "300 packets transmitted, 0 received, 100% packet loss, time 3000ms\n";
        assert_eq!(parse_ping(none).unwrap().avg_us, None);
        assert!(parse_ping("ping: connect: Network is unreachable").is_err());
    }
}
