//! The CPU signal: receive work done for lower classes on the CPUs a
//! service runs on is that service's distress, queues or not (the
//! priority-receive study: keep lower-priority receive work off the CPU of a
//! higher-priority process while load is high). A keep-alive web server
//! whose CPU is half taken by softirq work for a closed-port flood has
//! empty queues: no socket signal sees it, this one does.
//!
//! Measured over windows of at least WINDOW: each CPU's share of time in
//! NET_RX softirq (the daemon's tracer) times the gate's interface's share
//! of the packets that CPU's stack took in (`gate_share`: a local process
//! sending to 127.0.0.1 from that CPU raises its softirq time too, and no
//! gate can relieve it), and each class's share of the packets the gate
//! admitted. A class's taken share is the busiest of its
//! service's CPUs (`service_cpus`) times the share of admitted packets that
//! belong to classes of lower priority (larger number), at most their
//! packets/s times MAX_PKT_NS (the softirq time is any interface's). The packets' costs
//! are taken as equal: a lower class's packet to a closed port costs less
//! than a TCP segment of the service's own, so the share is an estimate, and
//! one that leans towards the service's own work (never the other way for
//! traffic to no service). The service's own packets, and those of classes
//! at its priority or above, never count against it: its own load is not
//! a reason to throttle anyone.
//!
//! Nobody configured anything: every class with a running service reads
//! it (pure logic here; the daemon feeds it).
use std::time::{Duration, Instant};

use crate::signals::health::RxWork;

/// The most receive work one admitted packet of a lower class is taken to
/// cost: the lower classes' part of a CPU is at most their packets/s times
/// this. The softirq time a CPU spends is its whole NET_RX work, any
/// interface's (a local process flooding loopback from the service's CPU
/// raises it too); this bound keeps a lower class that sends little from
/// being charged with it. In this VM, RPS to another CPU cost about 25 us a
/// packet at 10k/s (each one an inter-processor interrupt); twice that.
pub const MAX_PKT_NS: f64 = 50_000.0;
/// Shares are measured over windows at least this long (the softirq work
/// comes in bursts of a NAPI poll; 10 ms holds only a few).
pub const WINDOW: Duration = Duration::from_millis(50);
/// The measurement runs (the tracer's softirq pair is attached) while the
/// classes below some running service admit more than this many packets/s,
/// or a budget throttle stands, and for ARM_HOLD after. Below it no class
/// can take a tenth of a CPU: in a VM the costliest receive path seen here
/// (RPS to another CPU) took a quarter of a CPU for 10k packets/s, so
/// 1000/s is about 2.5%.
pub const ARM_PPS: f64 = 1000.0;
pub const ARM_HOLD: Duration = Duration::from_secs(5);

/// The counters at the start of a window.
#[derive(Debug, Clone)]
struct Mark {
    at: Instant,
    softirq_ns: Vec<u64>,
    stack_pkts: Vec<u64>,
    iface_pkts: Vec<u64>,
    admitted: Vec<u64>,
}

/// The CPU signal's state between ticks.
#[derive(Debug, Clone, Default)]
pub struct RxCpu {
    mark: Option<Mark>,
    /// By class index: the share of its busiest CPU that receive work for
    /// lower classes took in the last window (None: not measured: no
    /// tracer, no busy thread of its service seen, or no window closed yet).
    pub taken: Vec<Option<f64>>,
    /// By class index, the largest `taken` since the class list last changed.
    pub max: Vec<Option<f64>>,
    /// By class index, over the last window: the share of its service's
    /// busiest CPU in receive work (None: not measured), and its admitted
    /// packets/s (the SYN guard weighs stray ACKs with these).
    pub busiest: Vec<Option<f64>>,
    pub admitted_pps: Vec<f64>,
    /// The measurement is wanted until then (`arm`).
    armed_until: Option<Instant>,
}

impl RxCpu {
    /// One tick: `rx` the tracer's counts (None: no tracer), `admitted` each
    /// class's packets admitted so far, `priorities` and `cpus` by class index.
    /// A window closes once WINDOW has passed; `taken` then holds its shares
    /// until the next one closes.
    pub fn step(&mut self, at: Instant, rx: Option<&RxWork>, admitted: &[u64], priorities: &[u8], cpus: &[Vec<usize>]) {
        let Some(rx) = rx else {
            (self.mark, self.taken, self.busiest) = (None, vec![None; admitted.len()], vec![None; admitted.len()]);
            return;
        };
        let restart = || Mark {
            at,
            softirq_ns: rx.softirq_ns.clone(),
            stack_pkts: rx.stack_pkts.clone(),
            iface_pkts: rx.iface_pkts.clone(),
            admitted: admitted.to_vec(),
        };
        let Some(m) = &self.mark else {
            self.mark = Some(restart());
            (self.taken, self.busiest) = (vec![None; admitted.len()], vec![None; admitted.len()]);
            return;
        };
        if m.admitted.len() != admitted.len() || m.softirq_ns.len() != rx.softirq_ns.len() {
            // A new class list (or CPU count): start a new window.
            self.mark = Some(restart());
            (self.taken, self.max) = (vec![None; admitted.len()], vec![None; admitted.len()]);
            self.busiest = vec![None; admitted.len()];
            return;
        }
        let dt = at.duration_since(m.at);
        if dt < WINDOW {
            return;
        }
        let diff = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(n, o)| n.saturating_sub(*o)).collect::<Vec<u64>>();
        let gate = gate_share(&diff(&rx.stack_pkts, &m.stack_pkts), &diff(&rx.iface_pkts, &m.iface_pkts));
        let cpu_share: Vec<f64> = diff(&rx.softirq_ns, &m.softirq_ns)
            .iter()
            .enumerate()
            .map(|(cpu, &ns)| (ns as f64 / dt.as_nanos() as f64).min(1.0) * gate.get(cpu).copied().unwrap_or(1.0))
            .collect();
        let window = diff(admitted, &m.admitted);
        self.taken = taken(&cpu_share, &window, priorities, cpus, dt.as_secs_f64());
        self.busiest = busiest(&cpu_share, cpus, window.len());
        self.admitted_pps = window.iter().map(|&n| n as f64 / dt.as_secs_f64()).collect();
        self.max.resize(self.taken.len(), None);
        for (m, t) in self.max.iter_mut().zip(&self.taken) {
            *m = match (*m, *t) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        self.mark = Some(restart());
    }

    /// Note at `at` whether the measurement is needed now (`busy`: lower
    /// classes over ARM_PPS beside a running service, or a throttle stands);
    /// true while it is, or was within ARM_HOLD.
    pub fn arm(&mut self, at: Instant, busy: bool) -> bool {
        if busy {
            self.armed_until = Some(at + ARM_HOLD);
        }
        self.armed_until.is_some_and(|u| at < u)
    }

    /// The share of class `id`'s service's busiest CPU that lower classes'
    /// receive work took over the last window (None: not measured).
    pub fn taken_of(&self, id: usize) -> Option<f64> {
        self.taken.get(id).copied().flatten()
    }
}

/// By CPU number: the share of its receive work that is the gate's
/// interface's, taken as its share of the packets the CPU's stack took in
/// over a window (`stack`: all; `iface`: the gate's interface's). A CPU
/// whose stack took in nothing spent its softirq time in the driver (an
/// XDP program's drops, or its own): counted whole, as before the packets
/// were counted. Packets of both kinds are taken to cost the same.
pub fn gate_share(stack: &[u64], iface: &[u64]) -> Vec<f64> {
    stack
        .iter()
        .zip(iface)
        .map(|(&all, &ours)| if all == 0 { 1.0 } else { (ours as f64 / all as f64).min(1.0) })
        .collect()
}

/// By class index (`n` classes), the share of the busiest of its service's
/// CPUs in receive work (None: no CPU of its service known).
pub fn busiest(cpu_share: &[f64], cpus: &[Vec<usize>], n: usize) -> Vec<Option<f64>> {
    (0..n).map(|i| cpus.get(i)?.iter().filter_map(|&c| cpu_share.get(c)).copied().reduce(f64::max)).collect()
}

/// Each class's taken share over a window of `secs`: the busiest of its
/// CPUs' softirq share times the lower classes' share of the admitted
/// packets, at most their packets/s times MAX_PKT_NS (None: no CPU known).
pub fn taken(
    cpu_share: &[f64],
    admitted: &[u64],
    priorities: &[u8],
    cpus: &[Vec<usize>],
    secs: f64,
) -> Vec<Option<f64>> {
    let total: u64 = admitted.iter().sum();
    let busiest = busiest(cpu_share, cpus, admitted.len());
    (0..admitted.len())
        .map(|i| {
            let busiest = busiest[i]?;
            let p = priorities.get(i).copied().unwrap_or(u8::MAX);
            let lower: u64 = admitted.iter().zip(priorities).filter(|(_, &q)| q > p).map(|(a, _)| a).sum();
            let bound = lower as f64 / secs.max(1e-9) * MAX_PKT_NS / 1e9;
            Some(if total == 0 { 0.0 } else { (busiest * lower as f64 / total as f64).min(bound) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lower_classes_work_on_the_services_cpus_counts() {
        // CPU 1 half in softirq; the service (priority 20) runs there; one second.
        let shares = [0.05, 0.5];
        let prio = [20, 255];
        let cpus = vec![vec![1], vec![]];
        let t = |admitted: &[u64], prio: &[u8], cpus: &[Vec<usize>]| taken(&shares, admitted, prio, cpus, 1.0);
        // Nine packets in ten are the default class's flood.
        let v = t(&[100_000, 900_000], &prio, &cpus);
        assert!((v[0].unwrap() - 0.45).abs() < 1e-9, "{v:?}");
        assert_eq!(v[1], None, "no service: not measured");
        // The service's own traffic: nothing taken, whatever the softirq share.
        assert_eq!(t(&[1000, 0], &prio, &cpus)[0], Some(0.0));
        // Nothing admitted (all dropped at the gate): nothing taken.
        assert_eq!(t(&[0, 0], &prio, &cpus)[0], Some(0.0));
        // A class of the same priority is not below it.
        assert_eq!(t(&[100_000, 900_000], &[20, 20], &cpus)[0], Some(0.0));
        // Its busiest CPU counts; a CPU number past the tracer's is ignored.
        assert_eq!(t(&[0, 100_000], &prio, &[vec![0, 1, 7], vec![]])[0], Some(0.5));
        assert_eq!(t(&[0, 100_000], &prio, &[vec![7], vec![]])[0], None);
    }

    /// A lower class that sends little is not charged with a CPU's whole
    /// softirq time (which a local loopback flood can raise): at most its
    /// packets/s times MAX_PKT_NS.
    #[test]
    fn a_lower_class_is_charged_at_most_its_packets_worth() {
        let (prio, cpus) = ([20u8, 255], vec![vec![1], vec![]]);
        // The service sends little itself; 100 lower packets/s; CPU 1 60% in softirq.
        let v = taken(&[0.0, 0.6], &[10, 100], &prio, &cpus, 1.0)[0].unwrap();
        assert!((v - 100.0 * MAX_PKT_NS / 1e9).abs() < 1e-12, "{v}");
        assert!(v < crate::policy::budget::CPU_TAKEN, "no distress from 100 packets/s");
        // A real flood is not bound by it.
        let v = taken(&[0.0, 0.6], &[10, 500_000], &prio, &cpus, 1.0)[0].unwrap();
        assert!(v > 0.59, "{v}");
    }

    fn rx(ns: [u64; 2]) -> RxWork {
        RxWork { softirq_ns: ns.to_vec(), ..RxWork::default() }
    }

    /// Softirq time that the stack spent on other interfaces' packets
    /// (loopback's, from a local process on the service's CPU) is not the
    /// gate's: only the gate's interface's share of the CPU's packets counts.
    /// What the budget makes of class 0's CPU signal.
    fn cpu_cause(s: &RxCpu) -> Option<&'static str> {
        crate::policy::budget::cause(s.taken_of(0), None, true)
    }

    #[test]
    fn receive_work_for_loopback_is_not_charged_to_the_gates_classes() {
        assert_eq!(gate_share(&[0, 1000, 1000], &[0, 250, 1000]), [1.0, 0.25, 1.0]);
        let t0 = Instant::now();
        let (prio, cpus) = ([20u8, 25], vec![vec![1], vec![]]);
        let work = |ns: u64, stack: u64, iface: u64| RxWork {
            softirq_ns: vec![0, ns],
            stack_pkts: vec![0, stack],
            iface_pkts: vec![0, iface],
            ..RxWork::default()
        };
        let mut s = RxCpu::default();
        s.step(t0, Some(&work(0, 0, 0)), &[0, 0], &prio, &cpus);
        // CPU 1 60% in softirq over the window; 5k/s of the lower class
        // crossed the gate; the stack took in 19 loopback packets for each
        // of the gate's (a twentieth of its work is the gate's).
        let w = WINDOW.as_secs_f64();
        let lower = (5_000.0 * w) as u64;
        s.step(t0 + WINDOW, Some(&work(30_000_000, 20 * lower, lower)), &[0, lower], &prio, &cpus);
        let taken = s.taken[0].unwrap();
        assert!((taken - 0.6 / 20.0).abs() < 1e-6, "{taken}");
        assert_eq!(cpu_cause(&s), None, "the loopback work is not the lower class's doing");
        // The same softirq time, all of it the gate's packets: distress.
        s.step(t0 + 2 * WINDOW, Some(&work(60_000_000, 21 * lower, 2 * lower)), &[0, 2 * lower], &prio, &cpus);
        assert!((s.taken[0].unwrap() - 0.25).abs() < 1e-6, "bound by 5k/s x MAX_PKT_NS: {:?}", s.taken);
        assert_eq!(cpu_cause(&s), Some(crate::policy::budget::CPU_REASON));
    }

    #[test]
    fn the_signal_needs_a_closed_window_and_holds_until_the_next() {
        let t0 = Instant::now();
        let (prio, cpus) = ([20u8, 255], vec![vec![1], vec![]]);
        let mut s = RxCpu::default();
        s.step(t0, Some(&rx([0, 0])), &[0, 0], &prio, &cpus);
        assert_eq!(s.taken, [None, None], "no window yet");
        // 10 ms later: too short a window, nothing said.
        s.step(t0 + Duration::from_millis(10), Some(&rx([0, 5_000_000])), &[10, 90], &prio, &cpus);
        assert_eq!(cpu_cause(&s), None);
        // 50 ms in: CPU 1 spent 30 ms in softirq, 90% of the packets were the flood's.
        s.step(t0 + WINDOW, Some(&rx([0, 30_000_000])), &[100, 900], &prio, &cpus);
        assert!((s.taken[0].unwrap() - 0.54).abs() < 1e-6, "{:?}", s.taken);
        assert_eq!(cpu_cause(&s), Some(crate::policy::budget::CPU_REASON));
        // A quiet window: released; the largest share is kept.
        s.step(t0 + 2 * WINDOW, Some(&rx([0, 31_000_000])), &[200, 900], &prio, &cpus);
        assert_eq!(cpu_cause(&s), None, "{:?}", s.taken);
        assert!((s.max[0].unwrap() - 0.54).abs() < 1e-6, "{:?}", s.max);
    }

    #[test]
    fn the_measurement_is_armed_while_needed_and_for_the_hold_after() {
        let t0 = Instant::now();
        let mut s = RxCpu::default();
        assert!(!s.arm(t0, false), "nothing below a service: not measured");
        assert!(s.arm(t0, true));
        assert!(s.arm(t0 + ARM_HOLD / 2, false), "held");
        assert!(!s.arm(t0 + ARM_HOLD, false), "released after the hold");
    }

    #[test]
    fn without_the_tracer_or_after_a_class_change_nothing_is_said() {
        let t0 = Instant::now();
        let (prio, cpus) = ([20u8, 255], vec![vec![1], vec![]]);
        let mut s = RxCpu::default();
        s.step(t0, Some(&rx([0, 0])), &[0, 0], &prio, &cpus);
        s.step(t0 + WINDOW, None, &[100, 900], &prio, &cpus);
        assert_eq!(s.taken, [None, None], "no tracer: falls back to the queues");
        s.step(t0 + 2 * WINDOW, Some(&rx([0, 0])), &[100, 900], &prio, &cpus);
        // Three classes now: a new window starts, no share from mixed ids.
        s.step(t0 + 3 * WINDOW, Some(&rx([0, 50_000_000])), &[100, 900, 5], &[20, 255, 30], &[vec![1], vec![], vec![]]);
        assert_eq!(s.taken, [None, None, None]);
    }
}
