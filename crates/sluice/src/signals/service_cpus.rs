//! Where each class's service runs: the CPUs its threads ran on lately, for
//! the CPU signal (`rx_cpu`). A class's service is the processes holding
//! its UDP sockets and TCP listeners (sock_diag, then the /proc fd scan that
//! discovery uses, redone only when a socket appears that no scan has seen);
//! a thread counts when it is runnable or used CPU time since the last look,
//! and its CPU is the one it last ran on (/proc/PID/task/TID/stat field 39).
//! An idle service has no CPUs: receive work on a CPU where nothing of it
//! runs takes nothing from it.
//!
//! The same look says how hard the service worked: the CPU time its
//! threads used since the last look, as a share of the time of the CPUs
//! they ran on (`ServiceLoad::busy`). A TCP service whose answers are late
//! while it is busy is late for its load, which a limit can shed; one that
//! is late while idle waits on something else (a backend, a disk), and
//! shedding its clients would not bring its answers back (policy/late.rs).
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use anyhow::Result;

use crate::policy::config::Config;
use crate::signals::discover::{Listeners, SocketOwners, L4};
use crate::signals::health::class_of;
use crate::signals::procfs::{stat_cpu_ticks, stat_fields};

/// One thread at one look: runnable, its CPU time (clock ticks), its last CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadStat {
    pub runnable: bool,
    pub cpu_ticks: u64,
    pub cpu: usize,
}

/// Parse a /proc/PID/task/TID/stat text (None: not one).
pub fn thread_stat(stat: &str) -> Option<ThreadStat> {
    let f = stat_fields(stat)?;
    Some(ThreadStat { runnable: *f.first()? == "R", cpu_ticks: stat_cpu_ticks(stat)?, cpu: f.get(36)?.parse().ok()? })
}

/// The CPUs of the threads that count: runnable now, or whose CPU time
/// moved since `before` (by thread id; a thread not seen before counts only if runnable).
pub fn busy_cpus(threads: &[(u32, ThreadStat)], before: &HashMap<u32, u64>) -> Vec<usize> {
    let busy = |(tid, t): &&(u32, ThreadStat)| t.runnable || before.get(tid).is_some_and(|&b| t.cpu_ticks > b);
    let set: BTreeSet<usize> = threads.iter().filter(busy).map(|(_, t)| t.cpu).collect();
    set.into_iter().collect()
}

/// Clock ticks a second in /proc's CPU times (USER_HZ: fixed at 100 in
/// the kernel's ABI, whatever its own HZ).
const USER_HZ: f64 = 100.0;

/// Looks further apart than this (s) say nothing of how busy a service is
/// now: a calm daemon looks every 10 s, and a flood's first second is a
/// tenth of that look's span.
pub const BUSY_SPAN_SECS: f64 = 1.0;

/// How busy `threads` kept the `cpus` CPUs they ran on (`busy_cpus`): the
/// CPU time the threads seen `before` used in the `secs` since, as a share
/// of those CPUs' time. With no look in the last BUSY_SPAN_SECS (the first
/// look after a calm spell, when a flood woke the daemon), the share of
/// those CPUs a thread is runnable on now: a flooded service's worker is
/// caught running, one waiting on a backend is caught asleep. 0 where no
/// thread ran (idle); None where no thread was read (no socket, no owner
/// visible).
pub fn busy_share(threads: &[(u32, ThreadStat)], before: &HashMap<u32, u64>, cpus: usize, secs: f64) -> Option<f64> {
    if threads.is_empty() {
        return None;
    }
    if cpus == 0 {
        return Some(0.0);
    }
    if secs <= 0.0 || secs > BUSY_SPAN_SECS {
        let running: BTreeSet<usize> = threads.iter().filter(|(_, t)| t.runnable).map(|(_, t)| t.cpu).collect();
        return Some(running.len() as f64 / cpus as f64);
    }
    let used: u64 = threads.iter().filter_map(|(tid, t)| before.get(tid).map(|&b| t.cpu_ticks.saturating_sub(b))).sum();
    Some(used as f64 / USER_HZ / (secs * cpus as f64))
}

/// One class's service at one look.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceLoad {
    /// The CPUs its busy threads ran on (`busy_cpus`).
    pub cpus: Vec<usize>,
    /// How busy its threads kept those CPUs (`busy_share`; None: no
    /// thread read).
    pub busy: Option<f64>,
}

/// The reader, kept by the daemon between looks.
pub struct ServiceCpus {
    listeners: Listeners,
    owners: SocketOwners,
    /// Each thread's CPU time at the last look, and when that was.
    ticks: HashMap<u32, u64>,
    at: Option<Instant>,
}

impl ServiceCpus {
    /// For the services `listeners` (a handle others share) finds.
    pub fn new(listeners: Listeners) -> ServiceCpus {
        ServiceCpus { listeners, owners: SocketOwners::default(), ticks: HashMap::new(), at: None }
    }

    /// Look once: by class index of `cfg`, the CPUs its service's busy
    /// threads ran on (empty: no socket, no owner visible, or idle), and how
    /// busy they kept them.
    pub fn look(&mut self, cfg: &Config) -> Result<Vec<ServiceLoad>> {
        let udp: Vec<_> = cfg.classes.iter().map(|c| c.udp_ports()).collect();
        let tcp: Vec<_> = cfg.classes.iter().map(|c| c.tcp_ports()).collect();
        let mut inodes: Vec<Vec<u32>> = vec![vec![]; cfg.classes.len()];
        for l in self.listeners.now()? {
            if let Some(c) = class_of(if l.l4 == L4::Udp { &udp } else { &tcp }, l.port) {
                inodes[c].push(l.inode);
            }
        }
        self.owners.follow(&inodes.concat());
        let now = Instant::now();
        let secs = self.at.map_or(0.0, |a| now.duration_since(a).as_secs_f64());
        let mut ticks = HashMap::new();
        let loads = inodes
            .iter()
            .map(|socks| {
                let mut pids: Vec<u32> =
                    socks.iter().filter_map(|i| self.owners.owners.get(i)).flatten().copied().collect();
                pids.sort_unstable();
                pids.dedup();
                let threads: Vec<(u32, ThreadStat)> = pids.iter().flat_map(|&p| threads_of(p)).collect();
                ticks.extend(threads.iter().map(|(tid, t)| (*tid, t.cpu_ticks)));
                let cpus = busy_cpus(&threads, &self.ticks);
                let busy = busy_share(&threads, &self.ticks, cpus.len(), secs);
                ServiceLoad { cpus, busy }
            })
            .collect();
        (self.ticks, self.at) = (ticks, Some(now));
        Ok(loads)
    }
}

/// Every thread of a process that can be read now (a process gone, or a
/// thread that ends between the listing and the read, is left out).
fn threads_of(pid: u32) -> Vec<(u32, ThreadStat)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return vec![] };
    dir.flatten()
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((tid, thread_stat(&stat)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(state: &str, utime: u64, cpu: usize) -> String {
        // Fields 3.. of proc(5): state, then 10 fields, utime (14), stime (15), ..., processor (39).
        let mut f: Vec<String> = vec![state.to_string()];
        f.extend((4..=13).map(|_| "0".to_string()));
        f.push(utime.to_string());
        f.push("1".to_string());
        f.extend((16..=38).map(|_| "0".to_string()));
        f.push(cpu.to_string());
        f.extend((40..=52).map(|_| "0".to_string()));
        format!("42 (a (weird) name) {}", f.join(" "))
    }

    #[test]
    fn a_threads_state_cpu_time_and_last_cpu_are_read_from_its_stat() {
        assert_eq!(thread_stat(&stat("S", 10, 3)), Some(ThreadStat { runnable: false, cpu_ticks: 11, cpu: 3 }));
        assert_eq!(thread_stat(&stat("R", 0, 1)).map(|t| t.runnable), Some(true));
        assert_eq!(thread_stat("garbage"), None);
        assert_eq!(thread_stat("1 (x) S 0"), None, "a truncated stat");
    }

    #[test]
    fn a_service_runs_where_its_busy_threads_ran_and_follows_a_move() {
        let t = |runnable, cpu_ticks, cpu| ThreadStat { runnable, cpu_ticks, cpu };
        let before: HashMap<u32, u64> = [(1, 100), (2, 50), (3, 7)].into();
        // Thread 1 worked on CPU 1, thread 2 slept on CPU 0, thread 3 is runnable on CPU 2.
        let now = [(1, t(false, 120, 1)), (2, t(false, 50, 0)), (3, t(true, 7, 2))];
        assert_eq!(busy_cpus(&now, &before), [1, 2]);
        // The worker moved to CPU 0: the service is there now.
        let moved = [(1, t(false, 140, 0)), (2, t(false, 50, 0))];
        assert_eq!(busy_cpus(&moved, &[(1, 120), (2, 50)].into()), [0]);
        // An idle service (nothing ran, nothing runnable) has no CPU; nor a new sleeping thread.
        assert!(busy_cpus(&[(1, t(false, 140, 0)), (9, t(false, 5, 1))], &[(1, 140)].into()).is_empty());
        assert!(busy_cpus(&[], &before).is_empty(), "no thread readable (a process gone)");
    }

    #[test]
    fn a_services_busy_share_is_its_threads_cpu_time_over_its_cpus_time() {
        let t = |cpu_ticks| ThreadStat { runnable: false, cpu_ticks, cpu: 0 };
        let before: HashMap<u32, u64> = [(1, 100), (2, 50)].into();
        // Thread 1 used 45 ticks (0.45 s) and thread 2 none in half a second on one CPU: 90%.
        let now = [(1, t(145)), (2, t(50))];
        assert!((busy_share(&now, &before, 1, 0.5).unwrap() - 0.9).abs() < 1e-9);
        // The same time over two CPUs: 45%.
        assert!((busy_share(&now, &before, 2, 0.5).unwrap() - 0.45).abs() < 1e-9);
        // A thread not seen before counts nothing (its time is not since the last look).
        assert!((busy_share(&[(1, t(145)), (3, t(900))], &before, 1, 0.5).unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(busy_share(&now, &before, 0, 0.5), Some(0.0), "no thread ran: idle");
        assert_eq!(busy_share(&[], &before, 0, 0.5), None, "no thread read: not known");
        // No look in the last second (a calm 10 s, or none): the CPUs a thread runs on now.
        let run = |cpu| ThreadStat { runnable: true, cpu_ticks: 900, cpu };
        assert_eq!(busy_share(&now, &before, 1, 10.0), Some(0.0), "caught asleep");
        assert_eq!(busy_share(&[(1, run(1)), (2, t(50))], &before, 2, 10.0), Some(0.5), "one of its two CPUs");
        assert_eq!(busy_share(&[(1, run(1))], &HashMap::new(), 1, 0.0), Some(1.0), "the first look");
    }

    /// This test process holds a listener and is running: its class's CPUs
    /// hold the CPU this thread runs on.
    #[test]
    fn the_reader_finds_a_running_listeners_cpu() {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("web:match=tcp:{port}")]).unwrap();
        let mut r = ServiceCpus::new(crate::signals::discover::Listeners::new(0).unwrap());
        let end = std::time::Instant::now() + std::time::Duration::from_millis(30);
        while std::time::Instant::now() < end {}
        let loads = r.look(&cfg).unwrap();
        assert_eq!(loads.len(), cfg.classes.len());
        // SAFETY: sched_getcpu(3) has no arguments.
        let here = unsafe { libc::sched_getcpu() } as usize;
        assert!(loads[0].cpus.contains(&here), "this thread runs on CPU {here}: {loads:?}");
        assert!(loads[0].busy.is_some_and(|b| b > 0.0), "caught running at the first look: {loads:?}");
        // Spinning 100 ms: some CPU time used between two looks (how much
        // depends on who else runs here; a clock tick of /proc is 10 ms).
        let end = std::time::Instant::now() + std::time::Duration::from_millis(100);
        while std::time::Instant::now() < end {}
        let loads = r.look(&cfg).unwrap();
        assert!(loads[0].busy.is_some_and(|b| b > 0.0), "{loads:?}");
        drop(l);
    }
}
