//! Where each class's service runs: the CPUs its threads ran on lately, for
//! the CPU signal (`rx_cpu`). A class's service is the processes holding
//! its UDP sockets and TCP listeners (sock_diag, then the /proc fd scan that
//! discovery uses, redone only when a socket appears that no scan has seen);
//! a thread counts when it is runnable or used CPU time since the last look,
//! and its CPU is the one it last ran on (/proc/PID/task/TID/stat field 39).
//! An idle service has no CPUs: receive work on a CPU where nothing of it
//! runs takes nothing from it.
//!
//! The same look says how busy the CPUs it ran on were since the last look
//! (/proc/stat: the service's own time, and the receive work for its
//! packets that softirq runs there; `ServiceLoad::busy`). A TCP service
//! whose answers are late while it is busy is late for its load, which a
//! limit can shed; one that is late while idle waits on something else (a
//! backend, a disk), and shedding its clients would not bring its answers
//! back (policy/late.rs).
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use anyhow::Result;

use crate::policy::config::Config;
use crate::signals::discover::{Listeners, SocketOwners, L4};
use crate::signals::health::class_of;
use crate::signals::procfs::{cpu_times, stat_cpu_ticks, stat_fields, CpuTimes};

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

/// Looks further apart than this (s) say nothing of how busy a service is
/// now: a calm daemon looks every 10 s, and a flood's first second is a
/// tenth of that look's span.
pub const BUSY_SPAN_SECS: f64 = 1.0;

/// How busy the `cpus` CPUs a service's `threads` ran on (`busy_cpus`)
/// were: their busy time over their time between two reads of
/// /proc/stat (`times`: before and now), whoever kept them busy (the
/// service, the receive work for its packets in softirq, which its
/// threads' own times leave out, or a neighbour). With no read in the
/// last BUSY_SPAN_SECS (the first look after a calm spell, when a flood
/// woke the daemon), the share of those CPUs a thread of it is runnable
/// on now: a flooded service's worker is caught running, one waiting on a
/// backend is caught asleep. 0 where no thread ran (idle); None where no
/// thread was read (no socket, no owner visible).
pub fn busy_share(threads: &[(u32, ThreadStat)], cpus: &[usize], times: Option<(&CpuTimes, &CpuTimes)>) -> Option<f64> {
    if threads.is_empty() {
        return None;
    }
    if cpus.is_empty() {
        return Some(0.0);
    }
    let delta = |(before, now): (&CpuTimes, &CpuTimes)| {
        let (busy, total) = cpus
            .iter()
            .filter_map(|c| {
                let ((b0, t0), (b1, t1)) = (before.get(c)?, now.get(c)?);
                Some((b1.saturating_sub(*b0), t1.saturating_sub(*t0)))
            })
            .fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        (total > 0).then(|| busy as f64 / total as f64)
    };
    times.and_then(delta).or_else(|| {
        let running: BTreeSet<usize> = threads.iter().filter(|(_, t)| t.runnable).map(|(_, t)| t.cpu).collect();
        Some(running.len() as f64 / cpus.len() as f64)
    })
}

/// One class's service at one look.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceLoad {
    /// The CPUs its busy threads ran on (`busy_cpus`).
    pub cpus: Vec<usize>,
    /// How busy those CPUs were, whoever kept them so (`busy_share`;
    /// None: no thread read).
    pub busy: Option<f64>,
}

/// The reader, kept by the daemon between looks.
pub struct ServiceCpus {
    listeners: Listeners,
    owners: SocketOwners,
    /// Each thread's CPU time at the last look, and the CPUs' times then
    /// (/proc/stat) with when they were read.
    ticks: HashMap<u32, u64>,
    cpu_times: Option<(Instant, CpuTimes)>,
}

impl ServiceCpus {
    /// For the services `listeners` (a handle others share) finds.
    pub fn new(listeners: Listeners) -> ServiceCpus {
        ServiceCpus { listeners, owners: SocketOwners::default(), ticks: HashMap::new(), cpu_times: None }
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
        let now = (Instant::now(), std::fs::read_to_string("/proc/stat").map(|s| cpu_times(&s)).ok());
        let fresh = |(at, _): &(Instant, CpuTimes)| now.0.duration_since(*at).as_secs_f64() <= BUSY_SPAN_SECS;
        let times = self.cpu_times.as_ref().filter(|t| fresh(t)).zip(now.1.as_ref()).map(|((_, b), n)| (b, n));
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
                let busy = busy_share(&threads, &cpus, times);
                ServiceLoad { cpus, busy }
            })
            .collect();
        self.ticks = ticks;
        self.cpu_times = now.1.map(|t| (now.0, t));
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
    fn a_services_busy_share_is_its_cpus_busy_time_over_their_time() {
        let t = |cpu| ThreadStat { runnable: false, cpu_ticks: 10, cpu };
        let before: CpuTimes = [(0, (100, 1000)), (1, (500, 1000)), (2, (0, 0))].into();
        // CPU 0: 45 of 50 ticks busy (the service's time and its softirq work alike); CPU 1: 5 of 50.
        let now: CpuTimes = [(0, (145, 1050)), (1, (505, 1050)), (2, (0, 0))].into();
        let threads = [(1, t(0)), (2, t(1))];
        let share = |cpus: &[usize]| busy_share(&threads, cpus, Some((&before, &now))).unwrap();
        assert!((share(&[0]) - 0.9).abs() < 1e-9);
        assert!((share(&[0, 1]) - 0.5).abs() < 1e-9, "over both CPUs");
        assert_eq!(busy_share(&threads, &[], Some((&before, &now))), Some(0.0), "no thread ran: idle");
        assert_eq!(busy_share(&[], &[], Some((&before, &now))), None, "no thread read: not known");
        // No read in the last second (a calm 10 s, or none), or no time passed: the CPUs a thread runs on now.
        let run = |cpu| ThreadStat { runnable: true, cpu_ticks: 900, cpu };
        assert_eq!(busy_share(&threads, &[0], None), Some(0.0), "caught asleep");
        assert_eq!(busy_share(&[(1, run(1)), (2, t(0))], &[0, 1], None), Some(0.5), "one of its two CPUs");
        assert_eq!(busy_share(&[(1, run(2))], &[2], Some((&before, &now))), Some(1.0), "CPU 2's time did not move");
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
