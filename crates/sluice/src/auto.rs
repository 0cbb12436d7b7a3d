//! The auto loop: takes the signals of the `rate = "auto"` classes with UDP
//! sockets every tick (the tick's `Health`, read once for the budget and for
//! this loop), runs the controller (`controller`) and keeps each class's rate
//! for the tick (`tick`) to write into the gate. `sluice run` and the
//! bench's `auto` configurations both use it. Auto classes with TCP
//! listeners only are governed by the budget alone (`budget`).
//!
//! Cost per tick on top of the health read and the class counters the tick
//! reads once for everyone (measured by the bench, reported as the
//! controller's CPU): re-reading /proc/net/snmp and snmp6.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::config::{AutoSpec, Config, Limit};
use crate::controller::{decide, Algo, ClassDemand, Controller, Signals, Tuning, TICK_HZ};
use crate::health::Health;
use crate::signals::{udp_counters, NsFile, SockDiag, SockStats};
use crate::stats::{AutoStatus, ClassTotals};

/// The controller's tick: 100 Hz, the rate Macpherson's perturb-and-observe
/// selector ran at ("Performing Under Overload", UNSW).
pub const TICK: Duration = Duration::from_millis((1000.0 / TICK_HZ) as u64);
/// Ticks kept in the trace (60 s).
const TRACE_LEN: usize = 6_000;

struct AutoClass {
    id: usize,
    name: String,
    priority: u8,
    spec: AutoSpec,
    sock: SockStats,
    /// The rate the controller picked at the last tick; None = unlimited.
    rate: Option<f64>,
}

/// Totals read at one tick.
#[derive(Clone)]
struct Sample {
    at: Instant,
    seen: Vec<u64>,
    admitted: Vec<u64>,
    in_datagrams: u64,
    sock_drops: u64,
    backlog_drops: u64,
    squeeze: u64,
    queued: u64,
    rcvbuf: u64,
    present: bool,
}

/// The controller's signals over the time between two samples, and each
/// class's offered rate (packets/s).
fn delta(prev: &Sample, now: &Sample) -> (Signals, Vec<f64>) {
    let dt = now.at.duration_since(prev.at).as_secs_f64().max(1e-4);
    let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
    let offered: Vec<f64> = prev.seen.iter().zip(&now.seen).map(|(a, b)| d(*a, *b) / dt).collect();
    let sig = Signals {
        dt,
        present: now.present,
        offered: offered.iter().sum(),
        admitted: prev.admitted.iter().zip(&now.admitted).map(|(a, b)| d(*a, *b)).sum::<f64>() / dt,
        delivered: d(prev.in_datagrams, now.in_datagrams) / dt,
        queue_start: prev.queued,
        queue_end: now.queued,
        rcvbuf: now.rcvbuf,
        // A restarted service's new socket starts its drop count at 0.
        sock_drops: now.sock_drops.saturating_sub(prev.sock_drops),
        backlog_drops: now.backlog_drops.saturating_sub(prev.backlog_drops),
        squeeze: now.squeeze.saturating_sub(prev.squeeze),
    };
    (sig, offered)
}

/// One tick of the loop, for the bench's step and oscillation figures.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct TracePoint {
    /// Seconds since the loop started.
    pub t: f64,
    pub offered_pps: f64,
    pub admitted_pps: f64,
    pub delivered_pps: f64,
    pub target_pps: f64,
    pub capacity_pps: f64,
    pub queued_bytes: u64,
    pub sock_drops: u64,
    pub backlog_drops: u64,
    pub state: crate::controller::CtlState,
}

pub struct AutoLoop {
    classes: Vec<AutoClass>,
    pub ctl: Controller,
    snmp: NsFile,
    snmp6: NsFile,
    last: Option<Sample>,
    started: Instant,
    /// CPU time the loop's ticks took (ns, thread CPU clock).
    pub cpu_ns: u64,
    pub ticks: u64,
    pub trace: VecDeque<TracePoint>,
}

/// The calling thread's CPU time, ns (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl AutoLoop {
    /// Set up the loop for `cfg`'s auto classes with UDP ports, reading the
    /// service's namespace `ns` (None: the current one). None if there are
    /// none. With `require_sockets` (configured classes), an error naming
    /// the class if its sockets are not found; discovered classes found them
    /// a moment ago, and one that just closed is held like a lost signal.
    pub fn new(cfg: &Config, ns: Option<&str>, require_sockets: bool) -> Result<Option<AutoLoop>> {
        let ids: Vec<usize> =
            cfg.auto_classes().into_iter().filter(|&id| !cfg.classes[id].udp_ports().is_empty()).collect();
        if ids.is_empty() {
            return Ok(None);
        }
        let mut diag = SockDiag::open(ns)?;
        let mut classes = vec![];
        for id in ids {
            let c = &cfg.classes[id];
            let Limit::Auto(spec) = c.limit else { unreachable!() };
            let ports = c.udp_ports();
            let sock = diag.udp(&ports)?;
            if sock.sockets == 0 && require_sockets && c.tcp_ports().is_empty() {
                bail!(
                    "class \"{}\" has rate = \"auto\" but no UDP socket is bound to its ports {} in {}: the controller \
                     reads the service's socket queue; start the service first, or give the class a packets/s rate",
                    c.name,
                    ports.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect::<Vec<_>>().join(","),
                    ns.map_or("this network namespace".to_string(), |n| format!("namespace {n}"))
                );
            }
            classes.push(AutoClass { id, name: c.name.clone(), priority: c.priority, spec, sock, rate: None });
        }
        let algo = classes[0].spec.algo;
        let tuning = Tuning {
            pno_step: cfg.auto.pno_step as f64,
            hold_secs: cfg.auto.hold_ms as f64 / 1000.0,
            ..Default::default()
        };
        let (snmp, snmp6) = match ns {
            Some(ns) => (NsFile::open(ns, "snmp")?, NsFile::open(ns, "snmp6")?),
            None => (NsFile::open_here("snmp")?, NsFile::open_here("snmp6")?),
        };
        Ok(Some(AutoLoop {
            classes,
            ctl: Controller::new(algo, tuning),
            snmp,
            snmp6,
            last: None,
            started: Instant::now(),
            cpu_ns: 0,
            ticks: 0,
            trace: VecDeque::new(),
        }))
    }

    pub fn algo(&self) -> Algo {
        self.ctl.algo
    }

    /// Keep what `old` learnt: the controller, its trace and CPU account,
    /// and the rates of the classes that are in both (by name).
    pub fn carry_from(&mut self, old: AutoLoop) {
        for c in &mut self.classes {
            c.rate = old.classes.iter().find(|o| o.name == c.name).and_then(|o| o.rate);
        }
        let algo = self.ctl.algo;
        (self.ctl, self.trace, self.started, self.cpu_ns, self.ticks) =
            (old.ctl, old.trace, old.started, old.cpu_ns, old.ticks);
        self.ctl.algo = algo;
    }

    fn sample(&mut self, totals: &[ClassTotals], health: &Health) -> Result<Sample> {
        let mut s = Sample {
            at: Instant::now(),
            seen: vec![],
            admitted: vec![],
            in_datagrams: 0,
            sock_drops: 0,
            backlog_drops: 0,
            squeeze: 0,
            queued: 0,
            rcvbuf: 0,
            present: true,
        };
        for c in &mut self.classes {
            c.sock = health.classes.get(c.id).map(|h| h.udp).unwrap_or_default();
            s.present &= c.sock.sockets > 0;
            s.sock_drops += c.sock.drops;
            s.queued += c.sock.queued;
            s.rcvbuf += c.sock.rcvbuf;
            let t = totals.get(c.id).copied().unwrap_or_default();
            s.seen.push(t.seen_pkts);
            s.admitted.push(t.admitted_pkts);
        }
        s.in_datagrams = udp_counters(&self.snmp.read()?, &self.snmp6.read()?).in_datagrams;
        (s.backlog_drops, s.squeeze) = (health.softnet.dropped, health.softnet.time_squeeze);
        Ok(s)
    }

    /// One tick: sample the counters, take the deltas since the last tick,
    /// decide each class's rate ([`AutoLoop::rates`]), and trace. The first
    /// tick only samples.
    pub fn tick(&mut self, totals: &[ClassTotals], health: &Health) -> Result<()> {
        let cpu0 = thread_cpu_ns();
        let now = self.sample(totals, health)?;
        if let Some(prev) = self.last.take() {
            let (sig, offered) = delta(&prev, &now);
            let demand: Vec<ClassDemand> = self
                .classes
                .iter()
                .zip(&offered)
                .map(|(c, &o)| ClassDemand { priority: c.priority, min_share: c.spec.min_share(), offered: o })
                .collect();
            let fallbacks: Vec<Option<f64>> =
                self.classes.iter().map(|c| c.spec.fallback_pps.map(|p| p as f64)).collect();
            let d = decide(&mut self.ctl, &sig, &demand, &fallbacks);
            for (c, r) in self.classes.iter_mut().zip(&d.rates) {
                c.rate = r.map(|r| r.round().max(1.0));
            }
            self.trace(&now, &sig, d.target);
        }
        self.last = Some(now);
        self.ticks += 1;
        self.cpu_ns += thread_cpu_ns().saturating_sub(cpu0);
        Ok(())
    }

    /// Each auto class's rate from the last tick, by class id (None: unlimited).
    pub fn rates(&self) -> impl Iterator<Item = (usize, Option<f64>)> + '_ {
        self.classes.iter().map(|c| (c.id, c.rate))
    }

    fn trace(&mut self, now: &Sample, sig: &Signals, target: f64) {
        if self.trace.len() == TRACE_LEN {
            self.trace.pop_front();
        }
        self.trace.push_back(TracePoint {
            t: now.at.duration_since(self.started).as_secs_f64(),
            offered_pps: sig.offered,
            admitted_pps: sig.admitted,
            delivered_pps: sig.delivered,
            target_pps: target,
            capacity_pps: self.ctl.capacity,
            queued_bytes: now.queued,
            sock_drops: sig.sock_drops,
            backlog_drops: sig.backlog_drops,
            state: self.ctl.state,
        });
    }

    /// The controller's view of each auto class, by class id.
    pub fn status(&self) -> Vec<(usize, AutoStatus)> {
        self.classes
            .iter()
            .map(|c| {
                (
                    c.id,
                    AutoStatus {
                        algo: self.ctl.algo.name().into(),
                        state: self.ctl.state.name().into(),
                        capacity_pps: self.ctl.capacity,
                        target_pps: self.ctl.target,
                        rate_pps: c.rate,
                        min_share: c.spec.min_share(),
                        sockets: c.sock.sockets,
                        queued_bytes: c.sock.queued,
                        rcvbuf_bytes: c.sock.rcvbuf,
                        lost_secs: self.ctl.lost_secs,
                    },
                )
            })
            .collect()
    }

    /// Names of the auto classes, for logs.
    pub fn class_names(&self) -> Vec<String> {
        self.classes.iter().map(|c| c.name.clone()).collect()
    }
}
