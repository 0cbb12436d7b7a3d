//! Where each class's service runs: the CPUs its threads ran on lately, for
//! the CPU signal (`rx_cpu`). A class's service is the processes holding
//! its UDP sockets and TCP listeners (sock_diag, then the /proc fd scan that
//! discovery uses, redone only when a socket appears that no scan has seen);
//! a thread counts when it is runnable or used CPU time since the last look,
//! and its CPU is the one it last ran on (/proc/PID/task/TID/stat field 39).
//! An idle service has no CPUs: receive work on a CPU where nothing of it
//! runs takes nothing from it.
//!
//! The same look says how busy the CPUs it ran on were since the last
//! reading, and how much of that busy time was the service's
//! (`ServiceLoad::busy`): its processes' own CPU time (/proc/PID/stat), its
//! backends' (the local processes it connected to, `backends`: php-fpm
//! behind nginx; their CPUs count among its CPUs) and the interrupt and
//! softirq time of those CPUs (the receive work for its packets, which
//! its processes' times leave out: /proc/stat). A TCP
//! service whose answers are late while its CPUs are full, mostly of its
//! own work, is late for its load, which a limit can shed; one that is late
//! while idle waits on something else (a backend, a disk), and one late
//! because a neighbour took most of its CPUs was not made late by its
//! traffic: shedding its clients would not bring its answers back
//! (policy/late.rs, `busy`).
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use anyhow::Result;

use crate::policy::config::Config;
use crate::signals::backends::Backends;
use crate::signals::discover::{Listeners, SocketOwners, L4};
use crate::signals::health::class_of;
use crate::signals::procfs::{cpu_times, stat_cpu_ticks, stat_fields, CpuTime, CpuTimes};

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

/// A CPU counts among those a service's work ran on (`work_cpus`) where its
/// threads spent at least this share of the time they spent on the CPU
/// where they spent the most.
pub const WORK_CPU_SHARE: f64 = 0.1;

/// The CPUs a service's work ran on, for how busy it is: those where its
/// threads' CPU time moved since `before` (each thread's on its last CPU)
/// at least WORK_CPU_SHARE of the most on one CPU; where no time moved,
/// the runnable threads' (`busy_cpus`). A thread that woke for a moment
/// on an idle CPU (a timer, a client thread of a test's own process) so
/// does not average the CPU the service fills down to half busy (a
/// server on CPU 1 with its test's clients on CPU 0 read 0.52 busy in 2
/// runs of 3, and was not cut). A service spread evenly keeps every CPU.
pub fn work_cpus(threads: &[(u32, ThreadStat)], before: &HashMap<u32, u64>) -> Vec<usize> {
    let mut on: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
    for (tid, t) in threads {
        let moved = before.get(tid).map_or(0, |&b| t.cpu_ticks.saturating_sub(b));
        if moved > 0 {
            *on.entry(t.cpu).or_default() += moved;
        }
    }
    let Some(&most) = on.values().max() else { return busy_cpus(threads, before) };
    on.into_iter().filter(|&(_, n)| n as f64 >= WORK_CPU_SHARE * most as f64).map(|(cpu, _)| cpu).collect()
}

/// Readings further apart than this (s) say nothing of how busy a service
/// is now: a calm daemon looks where the services run every 10 s, and a
/// flood's first second is a tenth of that span. Calm, the CPUs' and the
/// processes' times are read again every second (`ServiceCpus::mark`, at
/// the calm tick: 1-1.5 s apart), so the look a flood wakes has a reading
/// within this span to start from.
pub const BUSY_SPAN_SECS: f64 = 2.5;
/// ... and closer than this (s), too few clock ticks (10 ms) to judge by:
/// the reading before is taken. The daemon looks again this long after the
/// look a wake runs (whose span is mostly calm). Ten ticks: a service that
/// kept its CPU all busy reads at least 0.82 at a tick's error each way.
pub const BUSY_MIN_SPAN_SECS: f64 = 0.1;
/// A reading younger than this (s) is fresh enough for `ServiceCpus::mark`
/// to keep it: a look that ran since the last mark stands for the next.
/// Under the calm tick's second (the duty is due every 1 s, run at the
/// 500 ms tick after), so that calm readings come 1-1.5 s apart, not 2.
pub const MARK_FRESH_SECS: f64 = 0.5;

/// How busy a service's CPUs were between two readings, and how much of
/// that was the service's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Busy {
    /// The CPUs' busy time over their time, whoever kept them busy.
    pub cpus: f64,
    /// Of that busy time, the service's: its processes' and its backends'
    /// own time and those CPUs' interrupt and softirq time (the receive work for its packets,
    /// which its processes' times leave out); at most 1 (softirq work that
    /// ran in the service's own context counts in both).
    pub own: f64,
}

/// How busy the `cpus` CPUs a service ran on (`busy_cpus`) were between two
/// readings (`times`: before and now), with `own` ticks of its processes'
/// CPU time between them. No CPU (an idle service): all 0. None where no
/// time passed.
pub fn busy_of(own: u64, cpus: &[usize], (before, now): (&CpuTimes, &CpuTimes)) -> Option<Busy> {
    if cpus.is_empty() {
        return Some(Busy::default());
    }
    let (busy, irq, total) = cpus
        .iter()
        .filter_map(|c| {
            let (b, n): (&CpuTime, &CpuTime) = (before.get(c)?, now.get(c)?);
            Some((n.busy.saturating_sub(b.busy), n.irq.saturating_sub(b.irq), n.total.saturating_sub(b.total)))
        })
        .fold((0, 0, 0), |a, x| (a.0 + x.0, a.1 + x.1, a.2 + x.2));
    let own = if busy == 0 { 0.0 } else { ((own + irq) as f64 / busy as f64).min(1.0) };
    (total > 0).then(|| Busy { cpus: busy as f64 / total as f64, own })
}

/// The CPU time (clock ticks) of `pids` between two readings of each
/// process's (a process read only once adds nothing).
pub fn own_ticks(pids: &[u32], before: &HashMap<u32, u64>, now: &HashMap<u32, u64>) -> u64 {
    pids.iter().filter_map(|p| Some(now.get(p)?.saturating_sub(*before.get(p)?))).sum()
}

/// One reading of the times busy is judged from.
struct Reading {
    at: Instant,
    cpus: CpuTimes,
    /// Each service process's CPU time (utime + stime of all its threads).
    procs: HashMap<u32, u64>,
}

impl Reading {
    /// /proc/stat and each of `pids`' /proc/PID/stat now (one that cannot
    /// be read is left out; None: /proc/stat could not be).
    fn now(pids: &[u32]) -> Option<Reading> {
        let cpus = cpu_times(&std::fs::read_to_string("/proc/stat").ok()?);
        let procs = pids
            .iter()
            .filter_map(|&p| Some((p, stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?)?)))
            .collect();
        Some(Reading { at: Instant::now(), cpus, procs })
    }
}

/// One class's service at one look.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceLoad {
    /// The CPUs its busy threads ran on (`busy_cpus`).
    pub cpus: Vec<usize>,
    /// How busy those CPUs were, and how much of it was the service's
    /// (`busy_of`; None: not asked for, no thread read, or no reading
    /// within BUSY_SPAN_SECS to judge from).
    pub busy: Option<Busy>,
}

/// The reader, kept by the daemon between looks.
pub struct ServiceCpus {
    listeners: Listeners,
    owners: SocketOwners,
    /// Each thread's CPU time at the last look.
    ticks: HashMap<u32, u64>,
    /// The services' processes at the last look, and the last two
    /// readings of their times and the CPUs' (the older first).
    pids: Vec<u32>,
    readings: Vec<Reading>,
    backends: Backends,
}

impl ServiceCpus {
    /// For the services `listeners` (a handle others share) finds.
    pub fn new(listeners: Listeners) -> ServiceCpus {
        ServiceCpus {
            listeners,
            owners: SocketOwners::default(),
            ticks: HashMap::new(),
            pids: vec![],
            readings: vec![],
            backends: Backends::default(),
        }
    }

    /// Read the CPUs' and the services' processes' times again, unless the
    /// last reading is younger than MARK_FRESH_SECS: cheap (one file, and
    /// one a process), for the calm daemon to run every second.
    pub fn mark(&mut self) {
        if self.readings.last().is_none_or(|r| r.at.elapsed().as_secs_f64() >= MARK_FRESH_SECS) {
            self.keep(Reading::now(&self.pids));
        }
    }

    /// Keep `r` as the newest reading (None: keep what was read before).
    fn keep(&mut self, r: Option<Reading>) {
        if let Some(r) = r {
            if self.readings.len() >= 2 {
                self.readings.remove(0);
            }
            self.readings.push(r);
        }
    }

    /// The newest reading from BUSY_MIN_SPAN_SECS to BUSY_SPAN_SECS old, to
    /// judge from.
    fn base(&self) -> Option<&Reading> {
        let span = |r: &&Reading| (BUSY_MIN_SPAN_SECS..=BUSY_SPAN_SECS).contains(&r.at.elapsed().as_secs_f64());
        self.readings.iter().rev().find(span)
    }

    /// Look once: by class index of `cfg`, the CPUs its service's busy
    /// threads ran on (empty: no socket, no owner visible, or idle), and,
    /// where `busy` asks, how busy they were (the times are read only then:
    /// /proc/stat grows with the CPUs and the interrupts).
    pub fn look(&mut self, cfg: &Config, busy: bool) -> Result<Vec<ServiceLoad>> {
        let udp: Vec<_> = cfg.classes.iter().map(|c| c.udp_ports()).collect();
        let tcp: Vec<_> = cfg.classes.iter().map(|c| c.tcp_ports()).collect();
        let mut inodes: Vec<Vec<u32>> = vec![vec![]; cfg.classes.len()];
        for l in self.listeners.now()? {
            if let Some(c) = class_of(if l.l4 == L4::Udp { &udp } else { &tcp }, l.port) {
                inodes[c].push(l.inode);
            }
        }
        self.owners.follow(&inodes.concat());
        let pids: Vec<Vec<u32>> = inodes
            .iter()
            .map(|socks| {
                let mut pids: Vec<u32> =
                    socks.iter().filter_map(|i| self.owners.owners.get(i)).flatten().copied().collect();
                pids.sort_unstable();
                pids.dedup();
                pids
            })
            .collect();
        // Judged busy or not, a service's work is its processes' and its
        // backends' (`backends`: the local processes it connected to).
        let backends = if busy { self.backends.of(&pids) } else { vec![vec![]; pids.len()] };
        let all: Vec<u32> = pids.iter().chain(&backends).flatten().copied().collect();
        let now = if busy { Reading::now(&all) } else { None };
        let span = self.base().zip(now.as_ref());
        let mut ticks = HashMap::new();
        let mut read = |pids: &[u32]| {
            let threads: Vec<(u32, ThreadStat)> = pids.iter().flat_map(|&p| threads_of(p)).collect();
            ticks.extend(threads.iter().map(|(tid, t)| (*tid, t.cpu_ticks)));
            threads
        };
        let loads = pids
            .iter()
            .zip(&backends)
            .map(|(pids, backends)| {
                let threads = read(pids);
                let cpus = busy_cpus(&threads, &self.ticks);
                let busy = span.filter(|_| !threads.is_empty()).and_then(|(b, n)| {
                    // Where its work ran: its threads' and its backends' time.
                    let mut all = threads.clone();
                    all.extend(read(backends));
                    let work: Vec<u32> = pids.iter().chain(backends).copied().collect();
                    busy_of(own_ticks(&work, &b.procs, &n.procs), &work_cpus(&all, &self.ticks), (&b.cpus, &n.cpus))
                });
                ServiceLoad { cpus, busy }
            })
            .collect();
        self.ticks = ticks;
        self.pids = all;
        self.keep(now);
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

    /// The CPUs a service's work ran on: where its threads spent a tenth
    /// of the most they spent on one CPU.
    #[test]
    fn a_services_work_is_where_its_threads_spent_their_time() {
        let t = |runnable, cpu_ticks, cpu| ThreadStat { runnable, cpu_ticks, cpu };
        let before: HashMap<u32, u64> = [(1, 100), (2, 50), (3, 7), (4, 0)].into();
        // A worker's 40 ticks on CPU 1 and a helper's 1 on CPU 0: CPU 1.
        let now = [(1, t(false, 140, 1)), (2, t(false, 51, 0)), (3, t(false, 7, 2))];
        assert_eq!(work_cpus(&now, &before), [1]);
        assert_eq!(busy_cpus(&now, &before), [0, 1], "where any time moved");
        // Two workers on CPUs 1 and 3 (40 and 5 ticks), a helper's 2 on CPU 0.
        let now = [(1, t(false, 140, 1)), (2, t(false, 52, 0)), (4, t(false, 5, 3))];
        assert_eq!(work_cpus(&now, &before), [1, 3]);
        // Spread evenly over four CPUs: all four.
        let now = [(1, t(false, 110, 0)), (2, t(false, 60, 1)), (3, t(false, 17, 2)), (4, t(false, 10, 3))];
        assert_eq!(work_cpus(&now, &before), [0, 1, 2, 3]);
        // Nothing moved: the runnable ones' CPUs, as busy_cpus.
        let now = [(1, t(false, 100, 0)), (3, t(true, 7, 2))];
        assert_eq!(work_cpus(&now, &before), [2]);
    }

    #[test]
    fn a_services_cpus_busy_time_and_its_own_part_of_it_are_read_between_two_readings() {
        let c = |busy, irq, total| CpuTime { busy, irq, total };
        let before: CpuTimes = [(0, c(100, 10, 1000)), (1, c(500, 0, 1000)), (2, c(0, 0, 0))].into();
        // CPU 0: 50 ticks, all busy, 10 of them softirq; CPU 1: 50 ticks, 5 busy.
        let now: CpuTimes = [(0, c(150, 20, 1050)), (1, c(505, 0, 1050)), (2, c(0, 0, 0))].into();
        let busy = |own, cpus: &[usize]| busy_of(own, cpus, (&before, &now)).unwrap();
        let near = |b: Busy, cpus: f64, own: f64| (b.cpus - cpus).abs() < 1e-9 && (b.own - own).abs() < 1e-9;
        // The service ran 35 ticks on CPU 0: with its softirq work, 45 of its 50 busy ones.
        assert!(near(busy(35, &[0]), 1.0, 0.9), "{:?}", busy(35, &[0]));
        assert!(near(busy(35, &[0, 1]), 0.55, 45.0 / 55.0), "over both CPUs: {:?}", busy(35, &[0, 1]));
        // A neighbour spun on CPU 0, the service ran 5 ticks: full, 15 of 50 its own.
        assert!(near(busy(5, &[0]), 1.0, 0.3), "a neighbour's time is not the service's");
        // Softirq work in the service's own context counts in both: at most 1.
        assert_eq!(busy(50, &[0]).own, 1.0);
        assert_eq!(busy_of(35, &[], (&before, &now)), Some(Busy::default()), "no thread ran: idle");
        assert_eq!(busy_of(35, &[2], (&before, &now)), None, "no time passed");
    }

    #[test]
    fn a_services_own_time_is_its_processes_time_between_two_readings() {
        let before: HashMap<u32, u64> = [(10, 100), (11, 50)].into();
        let now: HashMap<u32, u64> = [(10, 130), (11, 55), (12, 900)].into();
        assert_eq!(own_ticks(&[10, 11], &before, &now), 35);
        assert_eq!(own_ticks(&[12], &before, &now), 0, "a process read once: its time is not known to be since");
        assert_eq!(own_ticks(&[11, 13], &before, &now), 5, "a process gone is left out");
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
        let loads = r.look(&cfg, true).unwrap();
        assert_eq!(loads.len(), cfg.classes.len());
        // SAFETY: sched_getcpu(3) has no arguments.
        let here = unsafe { libc::sched_getcpu() } as usize;
        assert!(loads[0].cpus.contains(&here), "this thread runs on CPU {here}: {loads:?}");
        assert_eq!(loads[0].busy, None, "nothing read before the first look to judge from: {loads:?}");
        // Spinning 300 ms: some CPU time used between two looks (how much
        // depends on who else runs here; a clock tick of /proc is 10 ms).
        let end = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < end {}
        let loads = r.look(&cfg, true).unwrap();
        assert!(loads[0].busy.is_some_and(|b| b.cpus > 0.0 && b.own > 0.0), "{loads:?}");
        // Not asked for (no class judged on its answers): where it runs, not how busy.
        let loads = r.look(&cfg, false).unwrap();
        assert!(!loads[0].cpus.is_empty() && loads[0].busy.is_none(), "{loads:?}");
        drop(l);
    }

    /// The calm duty marks every second: a reading a second old is
    /// replaced (calm readings come a second apart, not two), one that a
    /// look took a moment ago stands, and the last two are kept.
    #[test]
    fn a_mark_reads_again_unless_the_last_reading_is_fresh() {
        let mut r = ServiceCpus::new(crate::signals::discover::Listeners::new(0).unwrap());
        r.mark();
        assert_eq!(r.readings.len(), 1, "the first mark reads");
        r.mark();
        assert_eq!(r.readings.len(), 1, "a fresh reading stands");
        let age = |r: &mut ServiceCpus, s: f64| {
            for x in &mut r.readings {
                x.at -= std::time::Duration::from_secs_f64(s);
            }
        };
        age(&mut r, 1.0);
        r.mark();
        assert_eq!(r.readings.len(), 2, "a reading a second old is read again");
        age(&mut r, 1.0);
        r.mark();
        assert_eq!(r.readings.len(), 2, "two kept");
        assert!(
            r.base().is_some_and(|b| b.at.elapsed() >= std::time::Duration::from_millis(900)),
            "the newest aged 0.1 s or more"
        );
    }

    /// The tests that spin processes on every CPU, one at a time: one's
    /// spinners are the other's neighbours.
    static SPINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The class of a service on `l`'s port read by the daemon's reader
    /// while this process works a millisecond in every 5 ms: 3 looks 300 ms
    /// apart, then the last one (printed with the one before).
    fn look_while_serving(l: &std::net::TcpListener) -> Busy {
        let port = l.local_addr().unwrap().port();
        let cfg = crate::policy::config::from_flags(&[format!("web:match=tcp:{port}")]).unwrap();
        let mut r = ServiceCpus::new(crate::signals::discover::Listeners::new(0).unwrap());
        let mut loads = vec![];
        for _ in 0..3 {
            loads = r.look(&cfg, true).unwrap();
            let end = Instant::now() + std::time::Duration::from_millis(300);
            while Instant::now() < end {
                let work = Instant::now() + std::time::Duration::from_millis(1);
                while Instant::now() < work {}
                std::thread::sleep(std::time::Duration::from_millis(4));
            }
        }
        let loads_end = r.look(&cfg, true).unwrap();
        eprintln!("before: {loads:?}, at the end: {loads_end:?}");
        assert!(!loads_end[0].cpus.is_empty(), "the service ran: {loads_end:?}");
        loads_end[0].busy.expect("a reading 300 ms before")
    }

    /// Do no harm: a neighbour (another process) that spins on every CPU
    /// the service runs on leaves its CPUs all busy, and the service's
    /// answers late, but the service is not busy: its own time (this
    /// process's, which a neighbour takes from) is what counts. Read by the
    /// daemon's reader; with busy read as the CPUs' busy time, as before,
    /// it read 1.0.
    #[test]
    fn a_neighbour_spinning_on_the_services_cpus_does_not_make_it_busy() {
        let _spinning = SPINNING.lock().unwrap_or_else(|e| e.into_inner());
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let spinners = sluice_testkit::neighbour::Spinner::everywhere(0).unwrap();
        let b = look_while_serving(&l);
        drop(spinners);
        assert!(b.cpus >= crate::policy::late::BUSY_SHARE, "the neighbours did not fill the CPUs: {b:?}");
        assert!(!crate::policy::late::busy(b.cpus, b.own), "read busy ({b:?}) for a neighbour's time");
    }

    /// The same spinners, each holding a unix listener this process has a
    /// connection to (its backends, as php-fpm's workers are nginx's):
    /// their time is the service's work, and the service is busy.
    /// Read as a neighbour's, as before backends were followed, the service
    /// doing a millisecond's work in 5 ms was idle for it.
    #[test]
    fn a_backend_spinning_on_the_services_cpus_makes_it_busy() {
        let _spinning = SPINNING.lock().unwrap_or_else(|e| e.into_inner());
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let (backend, client, accepted) = sluice_testkit::neighbour::unix_connection("backend");
        let spinners: Vec<_> = crate::base::netns::affinity(0)
            .into_iter()
            .map(|cpu| {
                let listener = backend.try_clone().unwrap();
                sluice_testkit::neighbour::Spinner::holding(cpu, 0, listener.into()).unwrap()
            })
            .collect();
        drop(backend);
        let b = look_while_serving(&l);
        drop((spinners, client, accepted));
        assert!(b.cpus >= crate::policy::late::BUSY_SHARE, "the backends did not fill the CPUs: {b:?}");
        assert!(crate::policy::late::busy(b.cpus, b.own), "its backends' time not read as its work: {b:?}");
    }
}
