//! What the bench reads off the victim, cheaply, at the edges of each
//! measurement window: its CPU's idle time (the idle-thread method of Macpherson's "Performing
//! Under Overload",
//! cross-checked with /proc/stat), the kernel's UDP and softnet counters, and
//! interface counters.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::load::gen::mono_ns;
use sluice::base::netns;
pub use sluice::signals::{
    procfs::parse_snmp_udp, procfs::parse_softnet, procfs::softnet, procfs::udp_counters, procfs::NsFile,
    procfs::UdpCounters,
};

/// A loop iteration longer than this means the idle thread was not running
/// (pre-empted by anything else on the CPU): that gap is not idle time.
pub const IDLE_GAP_NS: u64 = 1_000;

/// The idle-time measurement of Macpherson's "Performing Under Overload": a SCHED_IDLE thread pinned to the victim
/// CPU reads the clock in a loop and adds up the small deltas. Whenever
/// anything else wants the CPU it runs instead, and the loop sees one large
/// delta, which it skips. Idle time / elapsed time = the CPU's idle fraction.
pub struct IdleMeter {
    /// The idle thread's id, to take its own CPU time out of /proc/stat's busy time.
    pub tid: i32,
    idle_ns: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// While set, the thread sleeps instead of spinning: a SCHED_IDLE napi
    /// kthread (the `auto-idle` configuration) would share the idle time
    /// with it and starve.
    paused: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl IdleMeter {
    pub fn start(cpu: usize) -> Result<IdleMeter> {
        let idle_ns = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let (i, s, p) = (idle_ns.clone(), stop.clone(), paused.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let setup = (|| -> Result<()> {
                netns::pin_thread(cpu)?;
                // SAFETY: sched_setscheduler on this thread with a zeroed param (SCHED_IDLE takes priority 0).
                let param: libc::sched_param = unsafe { std::mem::zeroed() };
                if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
                    anyhow::bail!("SCHED_IDLE: {}", std::io::Error::last_os_error());
                }
                Ok(())
            })();
            let ok = setup.is_ok();
            // SAFETY: gettid has no preconditions.
            let _ = tx.send(setup.map(|_| unsafe { libc::gettid() }));
            if !ok {
                return;
            }
            let mut prev = mono_ns();
            let mut local = 0u64;
            let mut n = 0u32;
            while !s.load(Ordering::Relaxed) {
                if p.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    prev = mono_ns();
                    continue;
                }
                let now = mono_ns();
                let d = now - prev;
                if d < IDLE_GAP_NS {
                    local += d;
                }
                prev = now;
                n += 1;
                if n.is_multiple_of(1024) {
                    i.fetch_add(local, Ordering::Relaxed);
                    local = 0;
                }
            }
        });
        let tid = rx.recv().context("idle meter thread")??;
        Ok(IdleMeter { tid, idle_ns, stop, paused, thread: Some(thread) })
    }

    /// Stop (true) or resume (false) measuring.
    pub fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::Relaxed);
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Idle ns so far (read it at both edges of a window).
    pub fn idle_ns(&self) -> u64 {
        self.idle_ns.load(Ordering::Relaxed)
    }
}

/// The meters' readings of one CPU at one edge of a window.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    pub t_ns: u64,
    /// Idle ns the idle thread counted so far.
    pub idle_ns: u64,
    /// /proc/stat busy and total clock ticks of the CPU.
    pub busy_ticks: u64,
    pub total_ticks: u64,
    /// The idle thread's own CPU time (clock ticks), which /proc/stat counts as busy.
    pub idle_thread_ticks: u64,
}

/// A CPU's busy fraction over a window, by each meter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuBusy {
    /// 1 - idle-thread time / wall time. None while the meter was paused.
    pub idle_thread: Option<f64>,
    /// /proc/stat busy ticks (less the idle thread's own) / total ticks.
    pub procstat: f64,
}

impl IdleMeter {
    /// Read both meters of `cpu` (the CPU this meter runs on).
    pub fn sample(&self, cpu: usize) -> Result<CpuSample> {
        let (busy_ticks, total_ticks) = proc_stat_cpu(cpu)?;
        Ok(CpuSample {
            t_ns: mono_ns(),
            idle_ns: self.idle_ns(),
            busy_ticks,
            total_ticks,
            idle_thread_ticks: thread_ticks(self.tid),
        })
    }

    /// The busy fraction between two samples; the idle-thread figure is
    /// None if the meter is paused now.
    pub fn busy_between(&self, a: &CpuSample, b: &CpuSample) -> CpuBusy {
        let d = |x: u64, y: u64| y.saturating_sub(x);
        let wall = d(a.t_ns, b.t_ns).max(1) as f64;
        let idle_thread = (1.0 - d(a.idle_ns, b.idle_ns) as f64 / wall).clamp(0.0, 1.0);
        let total = d(a.total_ticks, b.total_ticks);
        let busy = d(a.busy_ticks, b.busy_ticks).saturating_sub(d(a.idle_thread_ticks, b.idle_thread_ticks));
        let procstat = if total > 0 { (busy as f64 / total as f64).clamp(0.0, 1.0) } else { 0.0 };
        CpuBusy { idle_thread: (!self.is_paused()).then_some(idle_thread), procstat }
    }
}

impl Drop for IdleMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// CPU time (utime + stime, clock ticks) of a thread of this process.
pub fn thread_ticks(tid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    sluice::signals::procfs::stat_cpu_ticks(&s).unwrap_or(0)
}

/// One CPU's line of /proc/stat: (busy, total) in clock ticks (the
/// daemon's reading, `procfs::cpu_times`).
pub fn proc_stat_cpu(cpu: usize) -> Result<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat")?;
    let t = sluice::signals::procfs::cpu_times(&s).get(&cpu).copied();
    t.map(|t| (t.busy, t.total)).with_context(|| format!("no cpu{cpu} in /proc/stat"))
}

/// The packet counters of one nftables table, read through one `nft -i -j`
/// process kept running in the namespace: a query is a netlink dump that
/// answers in well under a millisecond, where starting `nft` for each read took
/// 5-20 ms on a loaded machine (a skew of thousands of packets at 500k pkt/s
/// between the nft count and the others at a window's edge).
pub struct NftCounter {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    table: String,
}

impl NftCounter {
    pub fn start(ns: &str, table: &str) -> Result<NftCounter> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "-i", "-j"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting `nft -i` (is nftables installed? `make deps`)")?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(NftCounter { child, stdin, lines, table: table.to_string() })
    }

    /// The sum of the table's rule counters (packets).
    pub fn packets(&mut self) -> Result<u64> {
        use std::io::Write;
        while self.lines.try_recv().is_ok() {}
        writeln!(self.stdin, "list table inet {}", self.table).context("writing to `nft -i`")?;
        self.stdin.flush()?;
        let line = self
            .lines
            .recv_timeout(std::time::Duration::from_secs(2))
            .with_context(|| format!("`nft -i` gave no answer for table inet {}", self.table))?;
        nft_counter_packets(&line).with_context(|| format!("reading the counters of table inet {}", self.table))
    }
}

impl Drop for NftCounter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The packets of every counter in `nft -j` output, added up. Output that is
/// not a JSON ruleset with at least one counter (an error message, a table
/// without its counter rule) is an error, not 0 drops.
pub fn nft_counter_packets(json: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(json)
        .with_context(|| format!("`nft -j` printed something that is not JSON: {:.200}", json.trim()))?;
    let objects =
        v["nftables"].as_array().with_context(|| format!("no \"nftables\" list in `nft -j` output: {json:.200}"))?;
    let counters: Vec<u64> = objects
        .iter()
        .filter_map(|o| o["rule"]["expr"].as_array())
        .flatten()
        .filter_map(|e| e["counter"].as_object())
        .map(|c| c.get("packets").and_then(|p| p.as_u64()).context("a counter without a packet count"))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!counters.is_empty(), "no counter in the table: {json:.200}");
    Ok(counters.iter().sum())
}

/// The TX drops of an interface from a /proc/net/dev text.
pub fn dev_tx_dropped(dev: &str, ifname: &str) -> u64 {
    dev.lines()
        .find_map(|l| l.trim_start().strip_prefix(&format!("{ifname}:")).map(str::to_string))
        .and_then(|rest| rest.split_whitespace().nth(11).and_then(|x| x.parse().ok()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_counters_add_up_across_rules() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "inet", "name": "t"}},
            {"rule": {"chain": "c", "expr": [{"match": {}}, {"counter": {"packets": 7, "bytes": 700}}]}},
            {"rule": {"chain": "c", "expr": [{"counter": {"packets": 5, "bytes": 1}}, {"drop": null}]}}]}"#;
        assert_eq!(nft_counter_packets(json).unwrap(), 12);
        // Regression: unparseable output counted as 0 drops.
        assert!(nft_counter_packets("Error: No such file or directory").is_err());
        assert!(nft_counter_packets(r#"{"nftables": [{"table": {"name": "t"}}]}"#).is_err(), "no counter: error");
    }

    #[test]
    fn snmp_and_softnet_parse() {
        let snmp = "Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 10 2 3 4 5 6\n";
        let c = parse_snmp_udp(snmp);
        assert_eq!((c.in_datagrams, c.no_ports, c.in_errors, c.out_datagrams, c.rcvbuf_errors), (10, 2, 3, 4, 5));
        let sn = "0000000a 00000001 00000002 00000000\n00000010 00000000 00000001 00000000\n";
        let sn = parse_softnet(sn);
        assert_eq!((sn.processed, sn.dropped, sn.time_squeeze), (26, 1, 3));
        let dev = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    va: 100 2 0 0 0 0 0 0 640 10 0 7 0 0 0 0\n";
        assert_eq!(dev_tx_dropped(dev, "va"), 7);
    }

    /// The idle thread agrees with /proc/stat over the same window, however
    /// busy the CPU is (a loaded CI host: the CPU need not be idle). A broken
    /// meter reads ~0 idle on an idle CPU, or more than the wall time.
    #[test]
    fn idle_meter_agrees_with_proc_stat() {
        let m = IdleMeter::start(0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let a = m.sample(0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let b = m.sample(0).unwrap();
        let busy = m.busy_between(&a, &b);
        let by_thread = busy.idle_thread.unwrap();
        // /proc/stat counts in 10 ms ticks: 100 in the window, give or take a few,
        // and the busy-time split is sampled: 0.15 apart at most.
        assert!((by_thread - busy.procstat).abs() <= 0.15, "{busy:?}");
        assert!((b.idle_ns - a.idle_ns) <= b.t_ns - a.t_ns + 1_000_000, "idle time within the wall time");
    }
}
