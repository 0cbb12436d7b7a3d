//! Scheduling knobs: the control loop's thread at SCHED_FIFO, and the
//! interface's napi kthreads (threaded NAPI): at SCHED_IDLE or back to
//! normal (the `napi` setting), moved to another CPU and back (`cpu = "away"`).
use anyhow::{bail, Result};

use crate::base::iface::Iface;
use crate::policy::config::NapiSched;
use crate::signals::netdev;

/// Run the calling thread at SCHED_FIFO priority 1: the control loop's tick
/// takes tens of microseconds, but a sample cut in two by a pre-emption mixes
/// counters read milliseconds apart, and a 10 ms rate estimate goes wrong by
/// tens of percent. Returns false (and changes nothing) if not permitted.
pub fn realtime_thread() -> bool {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a param we own.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

/// The napi kthreads of an interface in threaded-NAPI mode: the pids the
/// kernel gives for the interface's NAPI instances (`netdev::napis`; call it
/// from the interface's network namespace). A kernel without that listing
/// (before 6.8): the kernel threads named "napi/IFACE-ID", a name a process
/// can take but a kernel thread it cannot be (another namespace's interface
/// of the same name has such threads too).
pub fn napi_threads(iface: &Iface) -> Vec<i32> {
    let listed = netdev::napis(iface.index).ok();
    if let Some(napis) = listed {
        return napis.into_iter().filter_map(|n| n.pid).collect();
    }
    let prefix = format!("napi/{iface}-");
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end().starts_with(&prefix))
                && is_kthread(*pid)
        })
        .collect()
}

/// PF_KTHREAD in a task's flags (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Is `pid` a kernel thread (its flags, the 9th field of /proc/PID/stat)?
fn is_kthread(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // After the name's closing parenthesis (a name may hold any byte): state, ppid, pgrp, session, tty, tpgid, flags.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_KTHREAD != 0)
}

/// A thread's CPU mask, to put back.
pub type SavedAffinity = (i32, libc::cpu_set_t);

/// Move the interface's napi kthreads to `cpu` (all of an interface's
/// receive work, the gate's included, runs in them: where a NIC queue's
/// interrupt would be). Returns the masks to put back with
/// `restore_affinity`; none if the interface is not in threaded NAPI.
pub fn move_napi(iface: &Iface, cpu: usize) -> Result<Vec<SavedAffinity>> {
    let mut saved = vec![];
    for pid in napi_threads(iface) {
        // SAFETY: zeroed cpu_set_t is valid; get/set affinity of a pid with sets we own.
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
                continue; // gone
            }
            let mut new: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut new);
            if libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &new) != 0 {
                bail!("moving napi kthread {pid} to CPU {cpu}: {}", std::io::Error::last_os_error());
            }
            saved.push((pid, old));
        }
    }
    Ok(saved)
}

/// Put threads' CPU masks back (a thread that is gone is skipped).
pub fn restore_affinity(saved: &[SavedAffinity]) {
    for (pid, set) in saved {
        // SAFETY: set the affinity of a pid with a set we own.
        unsafe { libc::sched_setaffinity(*pid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    }
}

/// Put the interface's napi kthreads under `policy` (`Keep` meaning the
/// normal policy, SCHED_OTHER); a missing kthread is not an error. Returns how
/// many kthreads changed policy. The bench uses this to switch the knob
/// between configurations.
pub fn set_napi(iface: &Iface, policy: NapiSched) -> Result<usize> {
    let want = if policy == NapiSched::Idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    let mut changed = 0;
    for pid in napi_threads(iface) {
        // SAFETY: sched_getscheduler/sched_setscheduler on a pid, with a param we own.
        if unsafe { libc::sched_getscheduler(pid) } == want {
            continue;
        }
        let p = libc::sched_param { sched_priority: 0 };
        // SAFETY: as above; a pid that exited only makes the call fail.
        if unsafe { libc::sched_setscheduler(pid, want, &p) } != 0 {
            bail!("setting the policy of napi kthread {pid}: {}", std::io::Error::last_os_error());
        }
        changed += 1;
    }
    Ok(changed)
}

/// The daemon's `napi` setting: `Keep` touches nothing; `Idle` puts the
/// interface's napi kthreads at SCHED_IDLE and is an error if it has none (not
/// threaded). Returns how many were changed.
pub fn apply_napi(iface: &Iface, policy: NapiSched) -> Result<usize> {
    if policy == NapiSched::Keep {
        return Ok(0);
    }
    check_napi(iface, policy)?;
    set_napi(iface, policy)
}

/// Is threaded NAPI on for `iface`? Changes nothing (the daemon checks this
/// before it attaches). Threaded NAPI switched on counts even before its
/// kthreads exist: a veth has NAPI, and so kthreads, only once an XDP
/// program (the gate) is attached.
pub fn check_napi(iface: &Iface, policy: NapiSched) -> Result<()> {
    let threaded =
        std::fs::read_to_string(format!("/sys/class/net/{}/threaded", iface.name)).is_ok_and(|t| t.trim() == "1");
    if policy != NapiSched::Keep && !threaded && napi_threads(iface).is_empty() {
        bail!(
            "napi = \"idle\": {iface} has no napi kthreads; threaded NAPI is off \
             (enable it with `echo 1 > /sys/class/net/{iface}/threaded`, or set napi = \"keep\")"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hardening: a process that names itself like a
    /// napi kthread ("napi/lo-9") is not taken for one. Before, the name
    /// alone was matched, and the daemon would have set its policy and CPUs.
    #[test]
    fn a_process_named_like_a_napi_kthread_is_not_one() {
        let name = "open('/proc/self/comm', 'w').write('napi/lo-9'); import time; time.sleep(5)";
        let mut fake = std::process::Command::new("python3").args(["-c", name]).spawn().expect("python3 runs");
        let pid = fake.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).map_or(true, |c| c.trim() != "napi/lo-9") {
            assert!(std::time::Instant::now() < deadline, "the process never took the name");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let found = napi_threads(&Iface::resolve("lo").expect("lo"));
        let _ = fake.kill();
        let _ = fake.wait();
        assert!(!found.contains(&pid), "a user process taken for a napi kthread: {found:?}");
        assert!(!is_kthread(std::process::id() as i32) && is_kthread(2), "kthreadd (pid 2) is a kernel thread");
    }
}
