//! `sluice bench demo`: the daemon a user runs, protecting a real DNS server.
//! Debian's NSD in namespace B (pinned to CPU 1, the `nic` victim model:
//! the IP/UDP stack runs in softirq on the service's CPU) answers dnsperf at
//! a steady rate plus a low-rate probe that times every answer, both from
//! namespace A. Three phases: no flood (the reference latency), a flood to a
//! closed UDP port without sluice, and the same flood with `sluice run --iface
//! vb` and no configuration at all (it finds NSD by itself). Midway through
//! the protected flood it prints `sluice status`. The flood is `sluice send`
//! (one socket sender, as fast as it goes) on CPU 0, where the clients run
//! too: with two CPUs the clients cannot have a CPU of their own, and a run
//! where dnsperf could not send its asked rate is marked. Everything runs as
//! child processes inside the one testbed; dropping it removes it all.
//! Traffic stays inside the two namespaces.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::dns;
use crate::procs::{in_ns, json_of, start_daemon, status_after, Proc};
use crate::victim::{VictimBed, VictimModel, IF_B};

/// The closed port the flood goes to (nothing listens there).
pub const FLOOD_PORT: u16 = 9;
const GEN_CPU: usize = 0;
const VICTIM_CPU: usize = 1;

pub struct DemoOpts {
    /// The sluice binary (its `send`, `run` and `status`).
    pub exe: PathBuf,
    /// Seconds per phase.
    pub secs: f64,
    /// dnsperf's rate, queries/s.
    pub qps: u64,
}

/// One phase's figures.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub label: String,
    /// Flood packets/s the sender managed (None: no flood).
    pub flood_pps: Option<f64>,
    pub perf: dns::Dnsperf,
    pub probe: dns::Probe,
}

impl Phase {
    /// dnsperf's answered share (None if it sent nothing).
    pub fn answered(&self) -> Option<f64> {
        (self.perf.sent > 0).then(|| self.perf.completed as f64 / self.perf.sent as f64)
    }
    fn pct(&self, p: f64) -> Option<f64> {
        sluice::summary::percentile(&self.probe.rtt_ms, p)
    }
}

/// Run the three phases; prints as it goes, then the verdict and the table.
pub fn run(o: &DemoOpts) -> Result<Vec<Phase>> {
    sluice::gate::check_privileges()?;
    let bed = VictimBed::create("demo", VictimModel::Nic, GEN_CPU, VICTIM_CPU)?;
    // The nic model's receive side: the IP/UDP stack on the victim CPU (RPS),
    // beside the service.
    bed.net.write_in_b(&format!("/sys/class/net/{IF_B}/queues/rx-0/rps_cpus"), &format!("{:x}", 1u64 << VICTIM_CPU))?;
    let dir = std::env::temp_dir().join(format!("{}-files", bed.net.b));
    std::fs::create_dir_all(&dir)?;
    let demo = Demo { o, bed: &bed, dir: &dir };
    println!(
        "== testbed: namespaces {} (clients and flood, CPU {GEN_CPU}) and {} (NSD, CPU {VICTIM_CPU}), veth va <-> vb",
        bed.net.a, bed.net.b
    );
    let result = (|| -> Result<Vec<Phase>> {
        let _nsd = demo.start_nsd()?;
        let calm = demo.phase("no flood, no sluice", false, false)?;
        let off = demo.phase("flood, without sluice", true, false)?;
        let zero = demo.phase("flood, sluice run --iface vb (no config)", true, true)?;
        Ok(vec![calm, off, zero])
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let phases = result?;
    print!("{}", summary(&phases, o.qps));
    Ok(phases)
}

/// The verdict line, then one line per phase.
pub fn summary(p: &[Phase], qps: u64) -> String {
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.2}%", 100.0 * v));
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2} ms"));
    let mut s = String::from("\n");
    if let [calm, off, zero] = p {
        s += &format!(
            "verdict: under a {} pkt/s flood to a closed port, NSD answered {} of its clients' queries with `sluice run --iface vb` alone, {} without sluice (p99 {} vs {} unflooded)\n",
            off.flood_pps.map_or("n/a".into(), sluice::stats::human),
            pct(zero.answered()),
            pct(off.answered()),
            ms(zero.pct(0.99)),
            ms(calm.pct(0.99)),
        );
    }
    s += &format!(
        "{:<42} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}\n",
        "phase", "flood/s", "dnsperf/s", "answered", "probe p50", "probe p99", "probe ok"
    );
    for ph in p {
        let short = if ph.perf.sent_qps < 0.95 * qps as f64 { " (!)" } else { "" };
        s += &format!(
            "{:<42} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}\n",
            ph.label,
            ph.flood_pps.map_or("-".into(), sluice::stats::human),
            format!("{}{short}", sluice::stats::human(ph.perf.sent_qps)),
            pct(ph.answered()),
            ms(ph.pct(0.50)),
            ms(ph.pct(0.99)),
            pct(ph.probe.answered_share()),
        );
    }
    s += &format!("(!) = dnsperf sent under 95% of the asked {qps}/s (its CPU is shared with the flood's sender)\n");
    s += "answered = dnsperf's completed/sent; probe = a separate 200 queries/s client timing each answer\n";
    s
}

struct Demo<'a> {
    o: &'a DemoOpts,
    bed: &'a VictimBed,
    dir: &'a Path,
}

impl Demo<'_> {
    /// `sluice ARGS` in namespace `ns` on `cpu`, stdout piped.
    fn sluice(&self, ns: &str, cpu: Option<usize>, args: &[&str]) -> Command {
        let mut c = in_ns(ns, cpu);
        c.arg(&self.o.exe).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// NSD in B on the victim CPU; returns once it answers.
    fn start_nsd(&self) -> Result<Proc> {
        let ip = self.bed.net.ip_b.to_string();
        let p = dns::start_nsd(
            self.dir,
            &self.bed.net.b,
            VICTIM_CPU,
            std::slice::from_ref(&ip),
            (&self.bed.net.a, GEN_CPU),
        )?;
        println!("== NSD answers on {ip}:53 (one server process, rrl off), pinned to CPU {VICTIM_CPU}");
        Ok(p)
    }

    /// One phase: dnsperf and the probe for `secs`, with or without the
    /// flood, with or without `sluice run --iface vb` and nothing else.
    fn phase(&self, label: &str, flood: bool, gate: bool) -> Result<Phase> {
        let secs = self.o.secs;
        let sock = self.dir.join("sluice.sock");
        let gate = if gate {
            println!("== sluice run --iface {IF_B}");
            Some(start_daemon(&self.o.exe, &self.bed.net.b, IF_B, &sock, &[], &self.dir.join("sluice-run.log"))?)
        } else {
            None
        };
        let dst = format!("{}:{FLOOD_PORT}", self.bed.net.ip_b);
        let flood_args =
            ["send", "--dst", &dst, "--rate", "0", "--duration", &(secs + 1.0).to_string(), "--flows", "16", "--json"];
        let sender = flood
            .then(|| Proc::spawn(self.sluice(&self.bed.net.a, Some(GEN_CPU), &flood_args), "the flood"))
            .transpose()?;
        std::thread::sleep(Duration::from_millis(500));
        let half = Duration::from_secs_f64(secs / 2.0);
        let status = gate.is_some().then(|| status_after(&self.o.exe, &self.bed.net.b, &sock, half));
        let (perf, probe) = dns::clients(&self.bed.net.a, GEN_CPU, self.dir, self.bed.net.ip_b, self.o.qps, secs)?;
        if let Some(st) = status.and_then(|t| t.join().ok()).transpose()? {
            println!("== sluice status, during the flood");
            print!("{st}");
        }
        let flood_pps = match sender {
            Some(s) => {
                let v = json_of(s.into_output()?, "the flood")?;
                Some(
                    v["sent"].as_f64().context("the flood's count")?
                        / v["secs"].as_f64().context("the flood's seconds")?,
                )
            }
            None => None,
        };
        if let Some(g) = gate {
            g.terminate("sluice run")?;
        }
        let ph = Phase { label: label.into(), flood_pps, perf, probe };
        println!(
            "{label:<42} dnsperf answered {}   probe p99 {}",
            ph.answered().map_or("n/a".into(), |a| format!("{:.2}%", 100.0 * a)),
            ph.pct(0.99).map_or("n/a".into(), |v| format!("{v:.2} ms"))
        );
        Ok(ph)
    }
}
