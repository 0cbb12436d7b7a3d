//! The auto loop: takes the signals of the `rate = "auto"` classes with UDP
//! sockets every tick (the tick's `Health`, read once for the budget and for
//! this loop), runs each class's own controller (`controller`) and keeps
//! each class's rate for the tick (`tick`) to write into the gate.
//! `sluice run` and the bench's `auto` configurations both use it. Auto
//! classes with TCP listeners only are governed by the budget alone
//! (`budget`).
//!
//! Each class's signals are its own (issue 21: one service whose socket
//! overflows must not limit another): its sockets' queue, buffer and drops
//! (sock_diag, the sockets bound to its ports), its offered and admitted
//! packets (the gate's class counters) and its delivered rate. The kernel
//! counts datagrams taken by readers only per namespace (Udp InDatagrams), so
//! a class's delivered rate is estimated as what the gate admitted for it
//! less what its sockets dropped, capped by the namespace's InDatagrams
//! (it counts a growing queue as delivered: at most a buffer's worth, which
//! the controller's smoothing absorbs; the cap is read only where it can
//! matter, see `needs_datagrams`). Loss before the sockets (the gate's
//! interface's backlog drops, from the tracer; the host's time squeezes,
//! softnet_stat) belongs to no socket: it is given to a
//! class only while that class carries at least PATH_SHARE of all that
//! arrives at the gate, so a flood elsewhere does not move its limit (the
//! budget throttles lower classes for it).
//!
//! Cost per tick on top of the health read and the class counters the tick
//! reads once for everyone (measured by the bench, reported as the
//! controller's CPU): re-reading /proc/net/snmp and snmp6, while a class
//! is near its knee or its sockets queue or drop.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::base::{fmt, log};
use crate::surface::stats::AutoStatus;

use crate::dataplane::gate::counters::ClassTotals;
use crate::policy::config::{AutoSpec, Config, Limit};
use crate::policy::controller::{decide, Algo, Controller, Engage, TickInput, Tuning, QUEUE_LOW};
use crate::signals::health::Health;
use crate::signals::procfs::{udp_counters, NsFile};
use crate::signals::sock_diag::{SockDiag, SockStats};

/// Ticks kept in the trace (60 s).
const TRACE_LEN: usize = 6_000;
/// Bytes of receive buffer one queued datagram takes at the least (the
/// truesize of a small skb; 4 KiB on veth with XDP): a buffer holds at most
/// its size over this many datagrams. Erring deep is safe: the socket then
/// drops what it cannot hold, as it would without sluice.
pub const DATAGRAM_TRUESIZE_MIN: u64 = 768;
/// Share of all the gate's arrivals a class must carry to be given the
/// loss before the sockets (softnet drops): then it is the flood.
pub const PATH_SHARE: f64 = 0.5;

struct AutoClass {
    id: usize,
    name: String,
    spec: AutoSpec,
    sock: SockStats,
    ctl: Controller,
    /// The rate the controller picked at the last tick; None = unlimited.
    rate: Option<f64>,
    /// Limited, or near its knee at the last tick (`Controller::near_knee`).
    near: bool,
}

/// One class's totals at one tick.
#[derive(Clone, Copy, Default)]
pub struct ClassSample {
    pub seen: u64,
    pub admitted: u64,
    /// Unknown sources' packets the gate dropped to keep the socket's room
    /// for known clients (bpf/gate/room.h).
    pub room_drops: u64,
    /// Packets whose source the gate sampled, and of those the known ones'.
    pub sampled: u64,
    pub sampled_known: u64,
    pub sock: SockStats,
}

/// Totals read at one tick: each auto class's, and the namespace's.
#[derive(Clone)]
pub struct Sample {
    pub at: Instant,
    pub classes: Vec<ClassSample>,
    /// Packets the gate saw over every class (auto or not).
    pub all_seen: u64,
    /// The namespace's Udp InDatagrams (None: not read at this tick).
    pub in_datagrams: Option<u64>,
    pub backlog_drops: u64,
    pub squeeze: u64,
}

/// Class `i`'s signals over the time between two samples (see the module
/// comment for how its delivered rate and the path signals are had).
pub fn class_signals(prev: &Sample, now: &Sample, i: usize) -> TickInput {
    let dt = now.at.duration_since(prev.at).as_secs_f64().max(1e-4);
    let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
    let (p, n) = (prev.classes[i], now.classes[i]);
    let offered = d(p.seen, n.seen) / dt;
    let admitted = d(p.admitted, n.admitted) / dt;
    // A restarted service's new socket starts its drop count at 0.
    let sock_drops = n.sock.drops.saturating_sub(p.sock.drops);
    let taken = match (prev.in_datagrams, now.in_datagrams) {
        (Some(a), Some(b)) => d(a, b) / dt,
        _ => f64::INFINITY,
    };
    let delivered = (admitted - sock_drops as f64 / dt).max(0.0).min(taken);
    // The gate's room drops are the socket's overflow made before it: loss
    // to the controller, but never admitted, so not taken from `delivered`.
    let sock_drops = sock_drops + n.room_drops.saturating_sub(p.room_drops);
    let carries_the_flood = offered >= PATH_SHARE * d(prev.all_seen, now.all_seen) / dt && offered > 0.0;
    let path = |a: u64, b: u64| if carries_the_flood { b.saturating_sub(a) } else { 0 };
    TickInput {
        dt,
        present: n.sock.sockets > 0,
        offered,
        admitted,
        delivered,
        queue_start: p.sock.full_queued,
        queue_end: n.sock.full_queued,
        rcvbuf: n.sock.full_rcvbuf,
        sock_drops,
        backlog_drops: path(prev.backlog_drops, now.backlog_drops),
        squeeze: path(prev.squeeze, now.squeeze),
        sampled: n.sampled.saturating_sub(p.sampled),
        sampled_known: n.sampled_known.saturating_sub(p.sampled_known),
    }
}

/// The namespace's UDP counter files, opened by `open`: /proc/net/snmp,
/// and snmp6 if the host has it (a host booted with ipv6.disable=1 has
/// none, and the loop then counts IPv4's datagrams alone).
fn counter_files(open: impl Fn(&str) -> Result<NsFile>) -> Result<(NsFile, Option<NsFile>)> {
    Ok((open("snmp")?, open("snmp6").ok()))
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
    pub state: crate::policy::controller::CtlState,
}

pub struct AutoLoop {
    classes: Vec<AutoClass>,
    snmp: NsFile,
    /// None: the host has no /proc/net/snmp6 (booted with ipv6.disable=1):
    /// IPv4's counters alone are the delivered rate.
    snmp6: Option<NsFile>,
    last: Option<Sample>,
    started: Instant,
    /// CPU time the loop's ticks took (ns, thread CPU clock).
    pub cpu_ns: u64,
    pub ticks: u64,
    /// The first auto class's controller, tick by tick (the bench's step
    /// and oscillation figures: its scenarios have one auto class).
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
        let tuning = Tuning {
            pno_step: cfg.auto.pno_step as f64,
            hold_secs: cfg.auto.hold_ms as f64 / 1000.0,
            ..Default::default()
        };
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
            let ctl = Controller::new(spec.algo, tuning);
            classes.push(AutoClass { id, name: c.name.clone(), spec, sock, ctl, rate: None, near: false });
        }
        let (snmp, snmp6) = counter_files(|name| match ns {
            Some(ns) => NsFile::open(ns, name),
            None => NsFile::open_here(name),
        })?;
        Ok(Some(AutoLoop {
            classes,
            snmp,
            snmp6,
            last: None,
            started: Instant::now(),
            cpu_ns: 0,
            ticks: 0,
            trace: VecDeque::new(),
        }))
    }

    /// A signal source this host lacks, said once in the start-up log.
    pub fn missing(&self) -> Option<&'static str> {
        self.snmp6.is_none().then_some(
            "/proc/net/snmp6 is missing (IPv6 disabled at boot?): auto classes count the datagrams IPv4 delivered only",
        )
    }

    /// The algorithm of the first auto class (for the start-up log line).
    pub fn algo(&self) -> Algo {
        self.classes[0].ctl.algo
    }

    /// Keep what `old` learnt: each class's controller and rate (classes
    /// matched by name; a class's algorithm is the new config's), the trace
    /// and the CPU account.
    pub fn carry_from(&mut self, old: AutoLoop, remap: &crate::policy::remap::ClassRemap) {
        for c in &mut self.classes {
            if let Some(o) = remap.old_of(c.id).and_then(|i| old.classes.iter().find(|o| o.id == i)) {
                let algo = c.ctl.algo;
                (c.ctl, c.rate) = (o.ctl.clone(), o.rate);
                c.ctl.algo = algo;
            }
        }
        (self.trace, self.started, self.cpu_ns, self.ticks) = (old.trace, old.started, old.cpu_ns, old.ticks);
    }

    fn sample(&mut self, totals: &[ClassTotals], health: &Health) -> Result<Sample> {
        let mut classes = Vec::with_capacity(self.classes.len());
        for c in &mut self.classes {
            c.sock = health.classes.get(c.id).map(|h| h.udp).unwrap_or_default();
            let t = totals.get(c.id).copied().unwrap_or_default();
            classes.push(ClassSample {
                seen: t.seen_pkts,
                admitted: t.admitted_pkts,
                room_drops: t.dropped_room_pkts,
                sampled: t.sampled_pkts,
                sampled_known: t.sampled_known_pkts,
                sock: c.sock,
            });
        }
        let in_datagrams = match self.needs_datagrams(&classes) {
            true => {
                let v6 = self.snmp6.as_mut().map(NsFile::read).transpose()?;
                Some(udp_counters(&self.snmp.read()?, v6.as_deref().unwrap_or("")).in_datagrams)
            }
            false => None,
        };
        Ok(Sample {
            at: Instant::now(),
            classes,
            all_seen: totals.iter().map(|t| t.seen_pkts).sum(),
            in_datagrams,
            // The gate's interface's own backlog drops (the tracer): another
            // interface's, which a local user can cause, are not this class's.
            backlog_drops: health.rx.as_ref().map_or(0, |r| r.backlog_drops),
            squeeze: health.softnet.time_squeeze,
        })
    }

    /// Are the namespace's UDP counters worth reading at this tick (the two
    /// files cost more than the rest of the auto loop)? Only to cap the
    /// delivered rate of a class near its knee, or one whose sockets
    /// dropped or hold a queue now; elsewhere the rate is what was admitted
    /// less the sockets' drops, and with nothing arriving it is 0 anyway.
    fn needs_datagrams(&self, now: &[ClassSample]) -> bool {
        let Some(prev) = &self.last else { return false };
        let low = |s: &SockStats| s.fuller_than(QUEUE_LOW);
        self.classes
            .iter()
            .zip(prev.classes.iter().zip(now))
            .any(|(c, (p, n))| n.seen != p.seen && (c.near || n.sock.drops > p.sock.drops || low(&n.sock)))
    }

    /// One tick: sample the counters, and for each class take its signals
    /// since the last tick and decide its rate ([`AutoLoop::rates`]); trace
    /// the first class. The first tick only samples. A class `held` (by
    /// class index: observe mode, while a lower class would be throttled) keeps
    /// its controller and rate as they were: its service's health is not
    /// what enforcing would give it.
    pub fn tick(&mut self, totals: &[ClassTotals], health: &Health, held: &[bool]) -> Result<()> {
        let cpu0 = thread_cpu_ns();
        let now = self.sample(totals, health)?;
        if let Some(prev) = self.last.take() {
            for (i, c) in self.classes.iter_mut().enumerate() {
                let sig = class_signals(&prev, &now, i);
                if !held.get(c.id).copied().unwrap_or(false) {
                    let fallback = c.spec.fallback_pps.map(|p| p as f64);
                    let was = c.ctl.engaged;
                    c.rate = decide(&mut c.ctl, &sig, fallback).map(|r| r.round().max(1.0));
                    c.near = c.rate.is_some() || c.ctl.near_knee(sig.offered);
                    log_engage(&c.name, was, &c.ctl, &sig);
                }
                if i == 0 {
                    let point = trace_point(now.at.duration_since(self.started), &c.ctl, &sig);
                    if self.trace.len() == TRACE_LEN {
                        self.trace.pop_front();
                    }
                    self.trace.push_back(point);
                }
            }
        }
        self.last = Some(now);
        self.ticks += 1;
        self.cpu_ns += thread_cpu_ns().saturating_sub(cpu0);
        Ok(())
    }

    /// Each auto class's rate from the last tick (None: unlimited) and the
    /// least depth of its bucket (packets: what its sockets' buffers hold
    /// at most, so the gate never drops a burst the service could queue), by
    /// class index.
    pub fn rates(&self) -> impl Iterator<Item = (usize, Option<f64>, u64)> + '_ {
        self.classes.iter().map(|c| (c.id, c.rate, c.sock.rcvbuf / DATAGRAM_TRUESIZE_MIN))
    }

    /// The rate below which the budget may not throttle each auto class:
    /// its minimum share of its capacity estimate, by class index.
    pub fn floors(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.classes.iter().map(|c| (c.id, c.spec.min_share() * c.ctl.capacity()))
    }

    /// Class `id`'s capacity estimate, if it is an auto class with one.
    pub fn capacity_of(&self, id: usize) -> Option<f64> {
        self.classes.iter().find(|c| c.id == id).map(|c| c.ctl.capacity()).filter(|&c| c > 0.0)
    }

    /// Each auto class's controller as status shows it, by class index.
    pub fn status(&self) -> Vec<(usize, AutoStatus)> {
        self.classes
            .iter()
            .map(|c| {
                (
                    c.id,
                    AutoStatus {
                        algo: c.ctl.algo.name().into(),
                        state: c.ctl.state.name().into(),
                        capacity_pps: c.ctl.capacity(),
                        target_pps: c.ctl.target,
                        rate_pps: c.rate,
                        engaged_by: c.ctl.engaged.map(|e| e.name().into()),
                        min_share: c.spec.min_share(),
                        sockets: c.sock.sockets,
                        queued_bytes: c.sock.full_queued,
                        rcvbuf_bytes: c.sock.full_rcvbuf,
                        lost_secs: c.ctl.lost_secs,
                    },
                )
            })
            .collect()
    }

    /// Does no auto class need the fast tick: each unlimited and not near
    /// its knee at the last tick (`Controller::near_knee`)?
    pub fn calm(&self) -> bool {
        self.classes.iter().all(|c| !c.near)
    }

    /// Names of the auto classes, for logs.
    pub fn class_names(&self) -> Vec<String> {
        self.classes.iter().map(|c| c.name.clone()).collect()
    }
}

/// Say in the daemon's log when a class's controller engages (and by which
/// rule) or lets go: at most once a second a class (RELEASE_TICKS).
fn log_engage(name: &str, was: Option<Engage>, ctl: &Controller, sig: &TickInput) {
    match (was, ctl.engaged) {
        (None, Some(why)) => log::info(format_args!(
            "auto: {name} limited at {}/s ({}: {}; capacity estimate {}/s; in its tick of {:.0} ms {}/s admitted, {}/s delivered, queue {} -> {} bytes)",
            fmt::human(ctl.target),
            why.name(),
            why.describe(),
            fmt::human(ctl.capacity()),
            sig.dt * 1e3,
            fmt::human(sig.admitted),
            fmt::human(sig.delivered),
            sig.queue_start,
            sig.queue_end,
        )),
        (Some(_), None) => {
            log::info(format_args!("auto: {name} unlimited again (a second with what arrived under the limit)"))
        }
        _ => {}
    }
}

/// One tick of a class's controller, for the trace.
fn trace_point(since_start: Duration, ctl: &Controller, sig: &TickInput) -> TracePoint {
    TracePoint {
        t: since_start.as_secs_f64(),
        offered_pps: sig.offered,
        admitted_pps: sig.admitted,
        delivered_pps: sig.delivered,
        target_pps: ctl.target,
        capacity_pps: ctl.capacity(),
        queued_bytes: sig.queue_end,
        sock_drops: sig.sock_drops,
        backlog_drops: sig.backlog_drops,
        state: ctl.state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hardening: a host booted with ipv6.disable=1 has no /proc/net/snmp6.
    /// The loop starts without it (before, opening it failed the start of
    /// any auto UDP class) and names it once; snmp it still needs.
    #[test]
    fn a_missing_snmp6_is_optional_and_snmp_is_not() {
        let no_v6 = |name: &str| match name {
            "snmp6" => Err(anyhow::anyhow!("opening /proc/thread-self/net/snmp6: No such file or directory")),
            n => NsFile::open_here(n),
        };
        let (_, v6) = counter_files(no_v6).expect("starts without snmp6");
        assert!(v6.is_none());
        let no_v4 = |name: &str| match name {
            "snmp" => Err(anyhow::anyhow!("opening /proc/thread-self/net/snmp: No such file or directory")),
            n => NsFile::open_here(n),
        };
        assert!(counter_files(no_v4).is_err(), "snmp is required");
        let snmp = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\nUdp: 7 0 0 0 0\n";
        assert_eq!(crate::signals::procfs::udp_counters(snmp, "").in_datagrams, 7, "IPv4's alone");
    }
}
