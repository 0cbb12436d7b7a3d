//! `sluice bench demo`: the daemon a user runs, protecting a real DNS server.
//! Debian's NSD in namespace B (pinned to CPU 1, the `nic` victim model:
//! the IP/UDP stack runs in softirq on the service's CPU) answers dnsperf at
//! a steady rate plus a low-rate probe that times every answer, both from
//! namespace A. First a calibration: the flood alone for CALIBRATE_SECS,
//! counting what the victim's stack takes of it (B's Udp NoPorts: datagrams
//! that reached UDP), its capacity for flood packets. Then three phases: no
//! flood (the reference latency), the flood without sluice, and the same
//! flood with `sluice run --iface vb` and no configuration at all (it finds
//! NSD by itself); "without sluice" has a gate on vb that passes everything
//! (the generator's live frames reach a veth peer only if it runs an XDP
//! program, LINUX-NOTES), as the `off` cells of the scenarios; midway through the protected flood it prints `sluice
//! status`. The flood is the `dns` scenario's closed-v4 one: the bench's
//! BPF generator (live frames) at its top rate from 16 spoofed sources to a
//! closed port, so it is as far above the victim's capacity as this machine
//! allows (the aim: at least MIN_RATIO times; a shortfall is printed). It
//! runs on CPU 0 at nice 19 with the clients: with two CPUs the clients
//! cannot have a CPU of their own, and a run where dnsperf could not send
//! its asked rate is marked. Everything runs inside the one testbed;
//! dropping it removes it all. Traffic stays inside the two namespaces.
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::load::gen::{stream_value, DEFAULT_BATCH};
use crate::load::workers::{GenDone, GenWorker};
use crate::services::dns;
use crate::services::{attach_client_filter, flood_stream, service_drops, Flood, Service};
use crate::testbed::procs::{start_daemon, status_after, Proc};
use crate::testbed::rig::{add_flood_neighbours, attach_gate};
use crate::testbed::victim::{VictimBed, VictimModel, IF_B};
use sluice::signals::procfs::{proc_counter, NsFile};

/// Seconds of the calibration (the flood alone).
const CALIBRATE_SECS: f64 = 2.0;
/// The flood should be at least this many times what the victim takes.
pub const MIN_RATIO: f64 = 5.0;

pub struct DemoOpts {
    /// The sluice binary (its `run` and `status`).
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
    /// Flood packets/s the generator sent (None: no flood).
    pub flood_pps: Option<f64>,
    /// Packets of NSD's classes the gate dropped (None: no gate).
    pub gate_drops: Option<u64>,
    pub perf: dns::Dnsperf,
    pub probe: dns::Probe,
}

/// The calibration: the flood alone, no sluice.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// Packets/s the generator sent.
    pub sent_pps: f64,
    /// Packets/s of it the victim's stack took (reached UDP), its CPU full.
    pub taken_pps: f64,
}

impl Calibration {
    /// How many times what the victim takes a flood of `pps` is (None if it took nothing).
    pub fn times(&self, pps: f64) -> Option<f64> {
        (self.taken_pps > 0.0).then(|| pps / self.taken_pps)
    }
}

/// "N.Nx what the victim takes", or "n/a ...", with the shortfall said when under MIN_RATIO.
fn times_text(t: Option<f64>) -> String {
    match t {
        None => "n/a what the victim takes".into(),
        Some(r) if r < MIN_RATIO => format!("{r:.1}x what the victim takes; under the {MIN_RATIO}x aimed for"),
        Some(r) => format!("{r:.1}x what the victim takes"),
    }
}

impl Phase {
    /// dnsperf's answered share (None if it sent nothing).
    pub fn answered(&self) -> Option<f64> {
        (self.perf.sent > 0).then(|| self.perf.completed as f64 / self.perf.sent as f64)
    }
    fn pct(&self, p: f64) -> Option<f64> {
        sluice_testkit::summary::percentile(&self.probe.rtt_ms, p)
    }
}

/// Calibrate, run the three phases; prints as it goes, then the verdict and
/// the table, which it returns for the report.
pub fn run(o: &DemoOpts) -> Result<crate::report::DnsDemo> {
    sluice::dataplane::gate::check_privileges()?;
    let bed = VictimBed::create("demo", VictimModel::Nic)?;
    // The nic model's receive side: the stack on the victim CPU (RPS), beside the service.
    bed.steer_rps()?;
    add_flood_neighbours(&bed, 64)?;
    let _filter = attach_client_filter(&bed)?;
    let dir = std::env::temp_dir().join(format!("{}-files", bed.net.b));
    std::fs::create_dir_all(&dir)?;
    // At nice 19: the clients on its CPU send what they ask; the flood takes the rest.
    let gen = GenWorker::start(&bed.net.a, &[bed.gen_cpu], bed.net.ifindex_a, 19)?;
    let demo = Demo { o, bed: &bed, dir: &dir, gen };
    println!(
        "== testbed: namespaces {} (clients and the flood's generator, CPU {}) and {} (NSD, CPU {}), veth va <-> vb",
        bed.net.a, bed.gen_cpu, bed.net.b, bed.victim_cpu
    );
    let result = (|| -> Result<(Calibration, Vec<Phase>)> {
        let _nsd = demo.start_nsd()?;
        let cal = demo.calibrate()?;
        let calm = demo.phase("no flood, no sluice", false, false)?;
        let off = demo.phase("flood, without sluice", true, false)?;
        let zero = demo.phase("flood, sluice run --iface vb (no config)", true, true)?;
        Ok((cal, vec![calm, off, zero]))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (cal, phases) = result?;
    let text = summary(&cal, &phases, o.qps);
    print!("{text}");
    Ok(split_verdict(&text))
}

/// The summary as the report shows it: its verdict line, and the rest.
fn split_verdict(text: &str) -> crate::report::DnsDemo {
    let mut verdict = String::from("n/a: the phases did not all run");
    let mut table = String::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        match line.strip_prefix("verdict: ") {
            Some(v) => verdict = format!("DNS: {v}"),
            None => table += &format!("{line}\n"),
        }
    }
    crate::report::DnsDemo { verdict, table }
}

/// The verdict line, then one line per phase.
pub fn summary(cal: &Calibration, p: &[Phase], qps: u64) -> String {
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.2}%", 100.0 * v));
    let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2} ms"));
    let mut s = String::from("\n");
    if let [calm, off, zero] = p {
        s += &format!(
            "verdict: under a {} pkt/s flood to a closed port ({}), NSD answered {} of its clients' queries with `sluice run --iface vb` alone, {} without sluice (p99 {} vs {} unflooded)\n",
            off.flood_pps.map_or("n/a".into(), sluice::base::fmt::human),
            times_text(off.flood_pps.and_then(|f| cal.times(f))),
            pct(zero.answered()),
            pct(off.answered()),
            ms(zero.pct(0.99)),
            ms(calm.pct(0.99)),
        );
    }
    s += &format!(
        "calibration: the flood alone, {}/s sent; the victim's stack took {}/s of it (Udp NoPorts on B, its CPU full): {}\n",
        sluice::base::fmt::human(cal.sent_pps),
        sluice::base::fmt::human(cal.taken_pps),
        times_text(cal.times(cal.sent_pps)),
    );
    if cal.times(cal.sent_pps).is_some_and(|r| r < MIN_RATIO) {
        s += "  (the generator's CPU is the limit: it also runs vb's receive work and the clients; with two CPUs it has no core of its own)\n";
    }
    s += &format!(
        "{:<42} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>10}\n",
        "phase", "flood/s", "dnsperf/s", "answered", "probe p50", "probe p99", "probe ok", "gate drops"
    );
    for ph in p {
        let short = if ph.perf.sent_qps < 0.95 * qps as f64 { " (!)" } else { "" };
        s += &format!(
            "{:<42} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>10}\n",
            ph.label,
            ph.flood_pps.map_or("-".into(), sluice::base::fmt::human),
            format!("{}{short}", sluice::base::fmt::human(ph.perf.sent_qps)),
            pct(ph.answered()),
            ms(ph.pct(0.50)),
            ms(ph.pct(0.99)),
            pct(ph.probe.answered_share()),
            ph.gate_drops.map_or("-".into(), |d| d.to_string()),
        );
    }
    s += &format!("(!) = dnsperf sent under 95% of the asked {qps}/s (its CPU is shared with the flood's generator)\n");
    s += "answered = dnsperf's completed/sent; probe = a separate 200 queries/s client timing each answer;\n";
    s += "gate drops = packets of NSD's classes the gate dropped (all legitimate: the flood goes to another port)\n";
    s
}

struct Demo<'a> {
    o: &'a DemoOpts,
    bed: &'a VictimBed,
    dir: &'a Path,
    gen: GenWorker,
}

impl Demo<'_> {
    /// NSD in B on the victim CPU; returns once it answers.
    fn start_nsd(&self) -> Result<Proc> {
        let ip = self.bed.net.ip_b.to_string();
        let p = dns::start_nsd(
            self.dir,
            &self.bed.net.b,
            self.bed.victim_cpu,
            std::slice::from_ref(&ip),
            (&self.bed.net.a, self.bed.gen_cpu),
        )?;
        println!("== NSD answers on {ip}:53 (one server process, rrl off), pinned to CPU {}", self.bed.victim_cpu);
        Ok(p)
    }

    /// Start the flood (the `dns` scenario's closed-v4) for `secs`.
    fn flood(&self, secs: f64) -> Result<mpsc::Receiver<GenDone>> {
        let spec = flood_stream(&self.bed.net, Service::Dns, &Flood::parse("closed-v4")?);
        let v = stream_value(&spec, self.bed.net.mac_b, self.bed.net.mac_a)?;
        self.gen.set_streams(&[v])?;
        Ok(self.gen.send_for(Duration::from_secs_f64(secs), DEFAULT_BATCH))
    }

    /// Packets/s the generator sent in a finished run.
    fn flood_rate(rx: mpsc::Receiver<GenDone>) -> Result<f64> {
        let (counts, secs) = rx.recv().context("the generator thread ended")??;
        Ok(counts[0].sent as f64 / secs.max(1e-9))
    }

    /// A gate on vb that passes everything: "without sluice".
    fn pass_all(&self) -> Result<sluice::dataplane::gate::Gate> {
        attach_gate(&self.bed.net.b, IF_B, vec!["nsd:match=udp:53,match=tcp:53".into()])
    }

    /// The flood alone: what the victim's stack takes of it (B's Udp NoPorts).
    fn calibrate(&self) -> Result<Calibration> {
        let _pass = self.pass_all()?;
        let mut snmp = NsFile::open(&self.bed.net.b, "snmp")?;
        let rx = self.flood(CALIBRATE_SECS + 0.5)?;
        std::thread::sleep(Duration::from_millis(500));
        let (n0, t0) = (proc_counter(&snmp.read()?, "Udp:", "NoPorts"), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(CALIBRATE_SECS - 0.2));
        let taken =
            proc_counter(&snmp.read()?, "Udp:", "NoPorts").saturating_sub(n0) as f64 / t0.elapsed().as_secs_f64();
        let cal = Calibration { sent_pps: Self::flood_rate(rx)?, taken_pps: taken };
        println!(
            "== calibration: the flood alone, {}/s sent, the victim took {}/s: {}",
            sluice::base::fmt::human(cal.sent_pps),
            sluice::base::fmt::human(cal.taken_pps),
            times_text(cal.times(cal.sent_pps))
        );
        Ok(cal)
    }

    /// One phase: dnsperf and the probe for `secs`, with or without the
    /// flood, with or without `sluice run --iface vb` and nothing else.
    fn phase(&self, label: &str, flood: bool, gate: bool) -> Result<Phase> {
        let secs = self.o.secs;
        let sock = self.dir.join("sluice.sock");
        let pass = (!gate).then(|| self.pass_all()).transpose()?;
        let gate = if gate {
            println!("== sluice run --iface {IF_B}");
            Some(start_daemon(
                &self.o.exe,
                (&self.bed.net.b, None),
                IF_B,
                &sock,
                &[],
                &self.dir.join("sluice-run.log"),
            )?)
        } else {
            None
        };
        let sender = flood.then(|| self.flood(secs + 1.5)).transpose()?;
        std::thread::sleep(Duration::from_millis(500));
        let half = Duration::from_secs_f64(secs / 2.0);
        let status = gate.is_some().then(|| status_after(&self.o.exe, &self.bed.net.b, &sock, half));
        let (perf, probe) =
            dns::clients(&self.bed.net.a, self.bed.gen_cpu, self.dir, self.bed.net.ip_b, self.o.qps, secs)?;
        if let Some(st) = status.and_then(|t| t.join().ok()).transpose()? {
            println!("== sluice status, during the flood");
            print!("{st}");
        }
        let flood_pps = sender.map(Self::flood_rate).transpose()?;
        let gate_drops = match gate {
            Some(g) => {
                let drops = service_drops(&self.o.exe, &self.bed.net.b, &sock)?;
                g.terminate("sluice run")?;
                Some(drops)
            }
            None => None,
        };
        drop(pass);
        let ph = Phase { label: label.into(), flood_pps, gate_drops, perf, probe };
        println!(
            "{label:<42} dnsperf answered {}   probe p99 {}",
            ph.answered().map_or("n/a".into(), |a| format!("{:.2}%", 100.0 * a)),
            ph.pct(0.99).map_or("n/a".into(), |v| format!("{v:.2} ms"))
        );
        Ok(ph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(label: &str, flood: Option<f64>, completed: u64) -> Phase {
        let perf = dns::Dnsperf { sent: 1000, completed, sent_qps: 5000.0 };
        Phase { label: label.into(), flood_pps: flood, perf, ..Default::default() }
    }

    #[test]
    fn the_verdict_comes_first_with_how_far_above_capacity_the_flood_was() {
        let p = [phase("calm", None, 1000), phase("off", Some(2e6), 30), phase("zero", Some(2e6), 999)];
        let s = summary(&Calibration { sent_pps: 2e6, taken_pps: 250e3 }, &p, 5000);
        let first = s.trim_start().lines().next().unwrap();
        assert!(
            first.starts_with("verdict: under a 2.00M pkt/s flood") && first.contains("(8.0x what the victim takes)"),
            "{first}"
        );
        assert!(first.contains("answered 99.90%") && first.contains("3.00% without"), "{first}");
        assert!(!s.contains("aimed for"), "{s}");
        let s = summary(&Calibration { sent_pps: 1e6, taken_pps: 500e3 }, &p, 5000);
        assert!(
            s.contains("2.0x what the victim takes; under the 5x aimed for")
                && s.contains("the generator's CPU is the limit"),
            "{s}"
        );
        let s = summary(&Calibration { sent_pps: 1e6, taken_pps: 0.0 }, &p, 5000);
        assert!(s.contains("(n/a what the victim takes)"), "nothing taken is no ratio, not infinity: {s}");
    }
}
