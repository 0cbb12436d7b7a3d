//! Network namespace helpers: run code on a thread inside a named namespace
//! (`ip netns add NAME` makes /var/run/netns/NAME), and run `ip` commands.
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where `ip netns add NAME` puts namespace NAME.
fn path(ns: &str) -> std::path::PathBuf {
    Path::new("/var/run/netns").join(ns)
}

/// Enter namespace `ns` on the calling thread (for good: use a thread of its own).
pub fn enter(ns: &str) -> Result<()> {
    let path = path(ns);
    let f = std::fs::File::open(&path).with_context(|| format!("opening network namespace {}", path.display()))?;
    // SAFETY: setns on this thread with a namespace fd we hold open.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("entering network namespace {ns}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The inode of namespace `ns` (what BPF programs see as its `ns.inum`).
pub fn inode(ns: &str) -> Result<u64> {
    let path = path(ns);
    Ok(std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.ino())
}

/// The inode of the calling thread's network namespace.
pub fn current_inode() -> Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net").context("reading /proc/thread-self/ns/net")?.ino())
}

/// Run `f` on a new thread inside namespace `ns` and return its result.
pub fn run_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a thread in namespace panicked"))?
}

/// Run `f` on a thread inside namespace `ns` and return what it returns
/// (panics if the namespace cannot be entered: for tests).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    run_in(ns, move || Ok(f())).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Run a command; an error carries its stderr.
pub fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("running {}", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Pin the calling thread to one CPU.
pub fn pin_thread(cpu: usize) -> Result<()> {
    pin_task(0, cpu)
}

/// The CPUs process `pid` may run on (0: this one; empty if it cannot be read).
pub fn affinity(pid: u32) -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, with its size.
    let r = unsafe { libc::sched_getaffinity(pid as libc::pid_t, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return vec![];
    }
    // SAFETY: CPU_ISSET reads the set we own.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pin the thread or process `tid` (0: the calling thread) to `cpu`.
pub fn pin_task(tid: i32, cpu: usize) -> Result<()> {
    // SAFETY: plain cpu_set_t; affinity of one task.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("pinning {tid} to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}
