//! CPU protection (the priority-receive study): a class with `cpu = "away"` has its admitted
//! packets sent to another CPU while the host is overloaded (a service in
//! distress, at any priority: the budget's signals), so their receive work
//! (skb, IP, UDP/TCP, the socket) runs on that CPU's cpumap kthread instead
//! of the CPU the gate runs on, away from the services of higher priority.
//!
//! Which CPU: when the overload starts, the daemon looks, for each such
//! class, at the processes holding the listening sockets of the classes of
//! higher priority, and takes their allowed CPUs (sched_getaffinity) as the
//! protected set; the target is the first online CPU outside it. No class
//! above it, or no CPU outside the set (the services may run anywhere):
//! the class stays, and the log says so. The packets go back to where they
//! arrive HOLD_TICKS after the last distress.
//!
//! Two levers, both while the overload lasts:
//! - the interface's napi kthreads (threaded NAPI: where the gate and all
//!   the receive work run, as a NIC queue's interrupt would) are moved to
//!   the target CPU (the priority-receive study's "stop interrupting the high-priority CPU");
//!   this is the one that helped in `bench run --scenario cpu` (same-core
//!   model), as it also takes the gate's drops and the veth ring off the
//!   protected CPU;
//! - the class's admitted packets are redirected to the target CPU's
//!   cpumap kthread when the gate runs elsewhere (not threaded NAPI, or the
//!   kthreads could not move): only their work after the gate moves. Where
//!   the stack work reaches the protected CPU through RPS (the `nic` model),
//!   the cpumap kthread hands the packet to RPS again and it lands there
//!   anyway.
//!
//! Unconfigured, a class stays (`cpu = "stay"`): nothing is sent away.
//!
//! This is the pure half; reading the protected set from the sockets and
//! moving the kthreads is the daemon's (`daemon/protect.rs`, the same feature's I/O).
use std::collections::HashSet;

use crate::policy::config::Config;

/// Ticks (10 ms) a class stays away after the last distress above it.
pub const HOLD_TICKS: u64 = 200;

/// The overload, with a hold.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Hold {
    /// The tick until which the host counts as overloaded.
    pub until: Option<u64>,
}

impl Hold {
    /// Whether a service is in distress this tick in; whether away classes go away now out.
    pub fn step(&mut self, tick: u64, distress: bool) -> bool {
        if distress {
            self.until = Some(tick + HOLD_TICKS);
        } else if self.until.is_some_and(|end| tick >= end) {
            self.until = None;
        }
        self.until.is_some()
    }
}

/// The target for a class sent away: the first of `online` CPUs not in `protected`.
pub fn target(protected: &HashSet<usize>, online: usize) -> Option<u32> {
    (0..online).find(|c| !protected.contains(c)).map(|c| c as u32)
}

/// Each class's target now: its `to` while `on`, for the classes with `cpu = "away"`.
pub fn targets(cfg: &Config, on: bool, to: &[Option<u32>]) -> Vec<Option<u32>> {
    cfg.classes
        .iter()
        .enumerate()
        .map(|(i, c)| if c.away && on { to.get(i).copied().flatten() } else { None })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config;

    #[test]
    fn distress_turns_it_on_and_a_hold_brings_the_classes_back() {
        let mut h = Hold::default();
        assert!(!h.step(0, false), "nothing to protect");
        assert!(h.step(1, true));
        assert!(h.step(2, false), "held");
        assert!(h.step(3, true), "renewed");
        assert!(h.step(3 + HOLD_TICKS - 1, false));
        assert!(!h.step(3 + HOLD_TICKS, false), "back after the hold");
    }

    #[test]
    fn only_away_classes_go_and_only_while_on() {
        let cfg = config::from_flags(&[
            "hi:priority=0,match=udp:53".into(),
            "lo:priority=5,cpu=away,match=udp:7000".into(),
            "mid:priority=3,match=udp:7001".into(),
        ])
        .unwrap();
        let to = [Some(0), Some(0), Some(0), None];
        assert_eq!(targets(&cfg, true, &to)[..3], [None, Some(0), None], "lo goes, mid (not away) and hi stay");
        assert_eq!(targets(&cfg, false, &to)[1], None);
        assert_eq!(targets(&cfg, true, &[])[1], None, "no target: stays");
    }

    #[test]
    fn the_target_is_the_first_cpu_outside_the_protected_set() {
        assert_eq!(target(&HashSet::from([1]), 2), Some(0));
        assert_eq!(target(&HashSet::from([0, 2]), 4), Some(1));
        assert_eq!(target(&HashSet::from([0, 1]), 2), None, "nowhere to go");
    }
}
