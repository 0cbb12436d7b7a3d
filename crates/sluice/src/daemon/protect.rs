//! CPU protection in the daemon (`crate::policy::protect`: while a service is in
//! distress, the classes with `cpu = "away"` and the napi kthreads go to
//! another CPU; back after the hold), and the napi kthreads' scheduling
//! policy (`napi = "idle"`), put back at a stop.
use std::collections::HashSet;

use crate::base::iface::Iface;
use crate::base::log;
use crate::base::netns::affinity;
use crate::daemon::sched::{apply_napi, set_napi};
use crate::dataplane::gate::Gate;
use crate::policy::config::{Config, NapiSched, Proto};
use crate::policy::protect;
use crate::signals::discover::{each_listener, socket_holders, L4};
use crate::signals::sock_diag::SockDiag;

#[derive(Default)]
pub(super) struct Protection {
    hold: protect::Hold,
    /// Where each class goes while the hold lasts (None: nowhere).
    to: Vec<Option<u32>>,
    /// Each class's target as written to the gate (empty: all None).
    applied: Vec<Option<u32>>,
    /// The napi kthreads moved away, and their CPU masks before.
    napi: Vec<crate::daemon::sched::SavedAffinity>,
    /// This daemon put the interface's napi kthreads at SCHED_IDLE (to put
    /// back at a stop or a reload to `napi = "keep"`).
    napi_idle: bool,
}

impl Protection {
    /// `napi_idle`: the start put the napi kthreads at SCHED_IDLE.
    pub fn new(napi_idle: bool) -> Protection {
        Protection { napi_idle, ..Default::default() }
    }

    /// Is the host held overloaded (classes away, or about to come back)?
    pub fn holding(&self) -> bool {
        self.hold.until.is_some()
    }

    /// What is away now, for `status`; None while nothing is.
    pub fn describe(&self, cfg: &Config, iface: &Iface) -> Option<String> {
        let classes: Vec<String> = self
            .applied
            .iter()
            .enumerate()
            .filter_map(|(id, t)| Some(format!("{} to CPU {}", cfg.classes.get(id)?.name, (*t)?)))
            .collect();
        if classes.is_empty() && self.napi.is_empty() {
            return None;
        }
        let napi = if self.napi.is_empty() { String::new() } else { format!("{iface}'s napi kthreads moved; ") };
        Some(format!("{napi}{}", if classes.is_empty() { "no class redirected".into() } else { classes.join(", ") }))
    }

    /// One tick: the hold follows `distress` (a service in distress now);
    /// the classes' targets in the gate follow the hold.
    pub fn step(&mut self, tick: u64, distress: bool, cfg: &Config, gate: &Gate, iface: &Iface) {
        if !cfg.classes.iter().any(|c| c.away) {
            return;
        }
        let was = self.hold.until.is_some();
        let on = self.hold.step(tick, distress);
        if on && !was {
            self.to = targets(cfg, gate, iface);
            self.move_napi(iface);
        } else if !on && was && !self.napi.is_empty() {
            crate::daemon::sched::restore_affinity(&std::mem::take(&mut self.napi));
            log::info(format_args!("cpu away: the napi kthreads of {iface} are back"));
        }
        let want = protect::targets(cfg, on, &self.to);
        if want == self.applied {
            return;
        }
        for (id, t) in want.iter().enumerate() {
            if self.applied.get(id) != Some(t) {
                if let Err(e) = gate.set_away(id, *t) {
                    log::warn(format_args!("cpu away: class {}: {e:#}", cfg.classes[id].name));
                }
            }
        }
        self.applied = want;
    }

    /// The gate itself runs where the napi kthreads run: move them with the classes.
    fn move_napi(&mut self, iface: &Iface) {
        let Some(cpu) = self.to.iter().flatten().next() else { return };
        match crate::daemon::sched::move_napi(iface, *cpu as usize) {
            Ok(saved) if !saved.is_empty() => {
                log::info(format_args!("cpu away: {} napi kthread(s) of {iface} moved to CPU {cpu}", saved.len()));
                self.napi = saved;
            }
            Ok(_) => {}
            Err(e) => log::warn(format_args!("cpu away: {e:#}")),
        }
    }

    /// Take every class back (class indexes move with a new class list; the
    /// next tick sends away again) and the napi kthreads too.
    pub fn take_back(&mut self, gate: &Gate) -> anyhow::Result<()> {
        let was = std::mem::take(self);
        self.napi_idle = was.napi_idle;
        crate::daemon::sched::restore_affinity(&was.napi);
        for (id, _) in was.applied.iter().enumerate().filter(|(_, t)| t.is_some()) {
            gate.set_away(id, None)?;
        }
        Ok(())
    }

    /// Keep the napi kthreads at the config's `napi`: SCHED_IDLE for "idle"
    /// (re-applied: a kthread may be new); for "keep", back to SCHED_OTHER if
    /// this daemon had put them at SCHED_IDLE (a reload from "idle").
    pub fn sync_napi(&mut self, cfg: &Config, iface: &Iface) {
        let result = match (cfg.auto.napi, self.napi_idle) {
            (NapiSched::Idle, _) => apply_napi(iface, NapiSched::Idle).map(|_| self.napi_idle = true),
            (NapiSched::Keep, true) => set_napi(iface, NapiSched::Keep).map(|_| self.napi_idle = false),
            (NapiSched::Keep, false) => Ok(()),
        };
        if let Err(e) = result {
            log::warn(format_args!("{e:#}"));
        }
    }

    /// At a stop: the napi kthreads' CPUs and policy as they were.
    pub fn restore(&mut self, iface: &Iface) {
        crate::daemon::sched::restore_affinity(&self.napi);
        if self.napi_idle {
            if let Err(e) = set_napi(iface, NapiSched::Keep) {
                log::warn(format_args!("the napi kthreads of {iface} stay at SCHED_IDLE: {e:#}"));
            }
        }
    }
}

/// Each class's CPU to go to while the host is overloaded (logged), or None.
fn targets(cfg: &Config, gate: &Gate, iface: &Iface) -> Vec<Option<u32>> {
    let ifindex = iface.index;
    let online = gate.ncpus();
    cfg.classes
        .iter()
        .map(|c| {
            if !c.away {
                return None;
            }
            let to = match protected_cpus(cfg, c.priority, ifindex) {
                Ok(None) => Err("no class has a higher priority".to_string()),
                Ok(Some(p)) => {
                    let mut cpus: Vec<_> = p.iter().copied().collect();
                    cpus.sort_unstable();
                    protect::target(&p, online)
                        .ok_or(format!("the services above it may run on every CPU ({cpus:?})"))
                        .map(|t| (t, cpus))
                }
                Err(e) => Err(format!("the services' CPUs could not be read: {e:#}")),
            };
            match to {
                Ok((t, cpus)) => {
                    log::info(format_args!(
                        "cpu away: a service is in distress; class {} goes to CPU {t} (the services above it run on {cpus:?})",
                        c.name
                    ));
                    Some(t)
                }
                Err(why) => {
                    log::info(format_args!("cpu away: a service is in distress; class {} stays: {why}", c.name));
                    None
                }
            }
        })
        .collect()
}

/// The CPUs the processes behind the classes of priority above `p` (a
/// smaller number) may run on; None if no class is above `p`.
fn protected_cpus(cfg: &Config, p: u8, ifindex: u32) -> anyhow::Result<Option<HashSet<usize>>> {
    if !cfg.classes.iter().any(|c| c.priority < p) {
        return Ok(None);
    }
    let ports: Vec<(Proto, u16, u16)> = cfg
        .classes
        .iter()
        .filter(|c| c.priority < p)
        .flat_map(|c| &c.rules)
        .filter_map(|r| r.ports.map(|(lo, hi)| (r.proto, lo, hi)))
        .collect();
    let covers = |l4: L4, port: u16| {
        ports.iter().any(|(proto, lo, hi)| {
            let p_ok = matches!((proto, l4), (Proto::Any, _) | (Proto::Udp, L4::Udp) | (Proto::Tcp, L4::Tcp));
            p_ok && (*lo..=*hi).contains(&port)
        })
    };
    let mut inodes = HashSet::new();
    each_listener(&mut SockDiag::open(None)?, ifindex, &[L4::Udp, L4::Tcp], &mut |l4, s| {
        if covers(l4, s.sport) {
            inodes.insert(s.inode);
        }
    })?;
    let holders = socket_holders();
    let pids: HashSet<u32> = inodes.iter().filter_map(|i| holders.get(i)).flatten().map(|(pid, _)| *pid).collect();
    Ok(Some(pids.into_iter().flat_map(affinity).collect()))
}
