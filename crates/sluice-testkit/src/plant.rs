//! A simulated victim for the controller's unit tests: a gate (token bucket
//! per class), a receive stage that runs before the service on the same CPU
//! (softirq or napi kthread) with a backlog in front of it, a per-packet stack
//! cost that grows as the backlog fills, one socket queue per class and a
//! service that dequeues round robin at a per-packet cost. Driving it past
//! `1 / (stack + service cost)` reproduces livelock: the stack takes the CPU
//! and the service starves. Time advances in 20 µs steps; [`Plant::tick`]
//! returns the controller's [`TickInput`] over one 10 ms tick. Two ways to make
//! it less tidy than a model: a reader that pauses (`pause`: it reads
//! nothing for a part of every period, as a service collecting garbage or
//! writing a log does) and steal (`steal`: a share of the 20 µs steps, drawn
//! at random from a fixed seed, in which the CPU runs someone else, as a
//! VM's host does).
use sluice::policy::controller::TickInput;

const SUB_NS: f64 = 20_000.0;
/// Bytes a queued datagram charges to the socket (truesize of a small skb).
pub const TRUESIZE: u64 = 1024;

/// One traffic class of the plant.
#[derive(Debug, Clone, Default)]
pub struct PlantClass {
    /// Packets/s offered to the gate.
    pub offered: f64,
    /// The gate's rate for the class (packets/s); `f64::INFINITY` = unlimited.
    pub rate: f64,
    /// Its sources are the class's known clients (default: they are not,
    /// as a flood's are not).
    pub known: bool,
    tokens: f64,
    carry: f64,
    queue: u64,
    // Totals.
    pub seen: u64,
    pub admitted: u64,
    pub delivered: u64,
    pub sock_drops: u64,
}

#[derive(Debug, Clone)]
pub struct Plant {
    pub classes: Vec<PlantClass>,
    /// Victim-CPU cost of the gate per arriving packet (ns): 0 when the gate
    /// runs on another CPU (the bench's `nic` model), ~300 on veth same-core.
    pub xdp_ns: f64,
    /// Stack cost per admitted packet (ns) with an empty backlog; it grows by
    /// `degrade` times as the backlog fills.
    pub stack_ns: f64,
    pub degrade: f64,
    /// Service cost per datagram (ns).
    pub service_ns: f64,
    pub backlog_max: u64,
    /// Socket receive buffer (bytes); a datagram charges TRUESIZE.
    pub rcvbuf: u64,
    /// False while the service's socket is gone (restart).
    pub socket_present: bool,
    /// The service reads nothing in the first `.1` seconds of every `.0`
    /// seconds (0, 0: it never pauses).
    pub pause: (f64, f64),
    /// Share of the 20 µs steps stolen from the CPU (0 to 1).
    pub steal: f64,
    rng: u64,
    backlog: std::collections::VecDeque<usize>,
    debt_ns: f64,
    rr: usize,
    pub backlog_drops: u64,
    pub time_s: f64,
}

impl Plant {
    /// A victim of the `nic` kind: receive stage and service on one CPU, the gate elsewhere.
    pub fn new(n_classes: usize) -> Plant {
        Plant {
            classes: vec![PlantClass { rate: f64::INFINITY, ..Default::default() }; n_classes],
            xdp_ns: 0.0,
            stack_ns: 1_500.0,
            degrade: 0.5,
            service_ns: 2_000.0,
            backlog_max: 1_000,
            rcvbuf: 212_992,
            socket_present: true,
            pause: (0.0, 0.0),
            steal: 0.0,
            rng: 0x9e37_79b9_7f4a_7c15,
            backlog: Default::default(),
            debt_ns: 0.0,
            rr: 0,
            backlog_drops: 0,
            time_s: 0.0,
        }
    }

    /// The highest delivered rate the plant can reach: everything admitted is
    /// delivered, nothing queues in the backlog.
    pub fn peak(&self) -> f64 {
        1e9 / (self.stack_ns + self.service_ns + self.xdp_ns)
    }

    fn queued(&self) -> u64 {
        self.classes.iter().map(|c| c.queue).sum::<u64>() * TRUESIZE
    }

    /// A uniform draw in [0, 1) (xorshift64: the same run every time).
    fn draw(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Run 20 µs.
    fn sub_step(&mut self) {
        let stolen = self.steal > 0.0 && self.draw() < self.steal;
        let mut budget = if stolen { 0.0 } else { SUB_NS } - self.debt_ns;
        // Arrivals at the gate.
        for (i, c) in self.classes.iter_mut().enumerate() {
            c.carry += c.offered * SUB_NS / 1e9;
            let n = c.carry.floor();
            c.carry -= n;
            let burst = (c.rate / 100.0).max(8.0);
            c.tokens = (c.tokens + c.rate * SUB_NS / 1e9).min(burst);
            for _ in 0..n as u64 {
                c.seen += 1;
                budget -= self.xdp_ns;
                if c.tokens >= 1.0 {
                    c.tokens -= 1.0;
                    c.admitted += 1;
                    if (self.backlog.len() as u64) < self.backlog_max {
                        self.backlog.push_back(i);
                    } else {
                        self.backlog_drops += 1;
                    }
                }
            }
        }
        // The receive stage runs first (softirq pre-empts the service).
        let fill = self.backlog.len() as f64 / self.backlog_max as f64;
        let stack_cost = self.stack_ns * (1.0 + self.degrade * fill);
        while budget >= stack_cost {
            let Some(i) = self.backlog.pop_front() else { break };
            budget -= stack_cost;
            let room = self.rcvbuf.saturating_sub(self.queued());
            let c = &mut self.classes[i];
            if self.socket_present && room >= TRUESIZE {
                c.queue += 1;
            } else {
                c.sock_drops += 1;
            }
        }
        // The service takes what is left, round robin over the sockets.
        let (period, paused) = self.pause;
        let reading = period <= 0.0 || self.time_s % period >= paused;
        while reading && budget >= self.service_ns && self.classes.iter().any(|c| c.queue > 0) {
            let n = self.classes.len();
            while self.classes[self.rr % n].queue == 0 {
                self.rr += 1;
            }
            let c = &mut self.classes[self.rr % n];
            c.queue -= 1;
            c.delivered += 1;
            self.rr += 1;
            budget -= self.service_ns;
        }
        // Time left over while work waits carries into the next step (the CPU
        // kept working); idle time does not; an overdraft (gate cost) does.
        // (A paused reader's time is idle, not carried.)
        let work_left = !self.backlog.is_empty() || (reading && self.classes.iter().any(|c| c.queue > 0));
        self.debt_ns = if work_left { -budget } else { (-budget).max(0.0) }.min(SUB_NS);
        self.time_s += SUB_NS / 1e9;
    }

    /// Packets the classes saw since `before` (`known`: only those whose
    /// sources are known, or not; None: all).
    fn seen_by(&self, before: &[PlantClass], known: Option<bool>) -> u64 {
        let counted = self.classes.iter().zip(before).filter(|(n, _)| known.is_none_or(|k| n.known == k));
        counted.map(|(n, o)| n.seen - o.seen).sum()
    }

    /// Run one tick of `dt` seconds and return what the daemon would measure.
    pub fn tick(&mut self, dt: f64) -> TickInput {
        let before: Vec<PlantClass> = self.classes.clone();
        let (bl0, q0) = (self.backlog_drops, self.queued());
        let steps = (dt * 1e9 / SUB_NS).round() as usize;
        for _ in 0..steps {
            self.sub_step();
        }
        let rate = |f: &dyn Fn(&PlantClass) -> u64| -> f64 {
            self.classes.iter().zip(&before).map(|(n, o)| (f(n) - f(o)) as f64).sum::<f64>() / dt
        };
        TickInput {
            dt,
            present: self.socket_present,
            offered: rate(&|c| c.seen),
            admitted: rate(&|c| c.admitted),
            delivered: rate(&|c| c.delivered),
            queue_start: q0,
            queue_end: self.queued(),
            rcvbuf: self.rcvbuf,
            sock_drops: self.classes.iter().zip(&before).map(|(n, o)| n.sock_drops - o.sock_drops).sum(),
            backlog_drops: self.backlog_drops - bl0,
            squeeze: 0,
            // The gate samples one packet in 16.
            sampled: self.seen_by(&before, None) / 16,
            sampled_known: self.seen_by(&before, Some(true)) / 16,
        }
    }
}
