//! Child processes inside the testbed: a killed-on-drop handle, `ip netns
//! exec` with a CPU pin, and the daemon (`sluice run`) started and stopped as
//! a user would. The demo and the real-service scenarios run through these.
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use sluice::signals::procfs::{stat_cpu_ticks, stat_fields};

/// A child process, killed (if still running) when dropped.
pub struct Proc(Option<Child>, bool);

impl Proc {
    pub fn spawn(mut c: Command, what: &str) -> Result<Proc> {
        Ok(Proc(Some(c.spawn().with_context(|| format!("starting {what}"))?), false))
    }

    /// A server with worker processes (nginx, NSD): dropping it sends SIGTERM
    /// and waits up to 3 s for it to stop its workers, then kills it. (A
    /// killed nginx master leaves its workers running, and they keep the
    /// testbed's namespace alive.)
    pub fn spawn_server(c: Command, what: &str) -> Result<Proc> {
        let mut p = Proc::spawn(c, what)?;
        p.1 = true;
        Ok(p)
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    pub fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.0.as_mut().map(Child::try_wait).transpose()?.flatten())
    }

    /// Wait for the process and take its output.
    pub fn into_output(mut self) -> Result<std::process::Output> {
        Ok(self.0.take().context("a process waited for twice")?.wait_with_output()?)
    }

    /// Poll `ready` until it says yes, for at most `within`: the process, or
    /// an error if it exits first (with its stderr, if piped) or time runs
    /// out (`waiting` says for what: "answering on ...").
    pub fn wait_ready(
        mut self,
        what: &str,
        waiting: &str,
        within: Duration,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<Proc> {
        let deadline = Instant::now() + within;
        loop {
            if ready()? {
                return Ok(self);
            }
            if let Some(status) = self.try_wait()? {
                bail!("{what} exited ({status}): {}", String::from_utf8_lossy(&self.into_output()?.stderr));
            }
            if Instant::now() > deadline {
                bail!("{what} was not {waiting} within {} s", within.as_secs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then wait; an error if it then exits unsuccessfully.
    pub fn terminate(self, what: &str) -> Result<std::process::Output> {
        // SAFETY: kill(2) on our own child's pid.
        if unsafe { libc::kill(self.id() as i32, libc::SIGTERM) } != 0 {
            bail!("stopping {what}: {}", std::io::Error::last_os_error());
        }
        let out = self.into_output()?;
        if !out.status.success() {
            bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(out)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let Some(c) = &mut self.0 else { return };
        if self.1 {
            // Its workers, found before they are orphaned: a master may exit
            // before them (NSD with 2+ servers), and a worker left behind
            // keeps the testbed's namespace, and a port, busy.
            let workers = children_of(c.id());
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            while workers.iter().any(|p| is_alive(*p)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            for p in workers.iter().filter(|p| is_alive(**p)) {
                // SAFETY: kill(2) on a worker of our child, seen alive just now.
                unsafe { libc::kill(*p as i32, libc::SIGKILL) };
            }
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The pids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            stat_fields(&stat).and_then(|f| f.get(1).and_then(|pp| pp.parse::<u32>().ok())) == Some(pid)
        })
        .collect()
}

/// Is process `pid` still there (and not a zombie)?
fn is_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_fields(&stat).and_then(|f| f.first().copied()).is_some_and(|state| state != "Z")
}

/// `ip netns exec NS [taskset -c CPU]`, to which the command is appended.
pub fn in_ns(ns: &str, cpu: Option<usize>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]);
    if let Some(cpu) = cpu {
        c.args(["taskset", "-c", &cpu.to_string()]);
    }
    c
}

/// `sluice run --iface IFACE --socket SOCK --metrics off ARGS` in `ns`
/// (pinned to `cpu` if one is given: the CPU plan's control), as a user runs it, its output to `log` (a file: a pipe nobody reads could fill
/// and stop it); returns once its statistics socket answers (the gate is attached then).
/// Its state directory (known sources) is SOCK.state, emptied first: every
/// start begins with no client known, so cells do not inherit each other's.
pub fn start_daemon(
    exe: &Path,
    (ns, cpu): (&str, Option<usize>),
    iface: &str,
    sock: &Path,
    args: &[String],
    log: &Path,
) -> Result<Proc> {
    let state = sock.with_extension("state");
    let _ = std::fs::remove_dir_all(&state);
    let mut c = in_ns(ns, cpu);
    c.arg(exe).args(["run", "--iface", iface, "--metrics", "off", "--socket"]).arg(sock);
    c.arg("--state-dir").arg(&state).args(args);
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    c.stdout(file.try_clone()?).stderr(file);
    let _ = std::fs::remove_file(sock);
    let waiting = format!("serving {}", sock.display());
    Proc::spawn(c, "sluice run")?
        .wait_ready("sluice run", &waiting, Duration::from_secs(10), || Ok(sluice::surface::client::serving(sock)))
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", std::fs::read_to_string(log).unwrap_or_default()))
}

/// `sluice status --socket SOCK` in `ns`: its text.
fn daemon_status(exe: &Path, ns: &str, sock: &Path) -> Result<String> {
    let out = in_ns(ns, None).arg(exe).args(["status", "--socket"]).arg(sock).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `sluice status --json --socket SOCK` in `ns`, as JSON (untyped: an
/// older build's snapshot, given to `bench idle --compare`, reads too).
pub fn status_json(exe: &Path, ns: &str, sock: &Path) -> Result<serde_json::Value> {
    let out = in_ns(ns, None).arg(exe).args(["status", "--json", "--socket"]).arg(sock).output()?;
    json_of(out, "sluice status --json")
}

/// The daemon's softirq time so far (`daemon_softirq_secs`; None: not
/// reported or not counted).
pub fn daemon_softirq_secs(exe: &Path, ns: &str, sock: &Path) -> Option<f64> {
    status_json(exe, ns, sock).ok()?["daemon_softirq_secs"].as_f64()
}

/// `sluice status` in `ns` after `after`, on a thread of its own (to show the
/// daemon's view in the middle of a measurement).
pub fn status_after(exe: &Path, ns: &str, sock: &Path, after: Duration) -> std::thread::JoinHandle<Result<String>> {
    let (exe, ns, sock) = (exe.to_path_buf(), ns.to_string(), sock.to_path_buf());
    std::thread::spawn(move || {
        std::thread::sleep(after);
        daemon_status(&exe, &ns, &sock)
    })
}

/// A finished child's stdout as JSON.
pub fn json_of(out: std::process::Output, what: &str) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{what}'s JSON report"))
}

/// CPU seconds (user + system) used so far by process `pid` and its
/// descendants (a server's workers); processes that ended are not counted.
pub fn tree_cpu_secs(pid: u32) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut stats = vec![];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
                    stats.push((p, s));
                }
            }
        }
    }
    // (ppid: field 4, CPU ticks).
    let fields =
        |s: &str| -> Option<(u32, f64)> { Some((stat_fields(s)?.get(1)?.parse().ok()?, stat_cpu_ticks(s)? as f64)) };
    let procs: Vec<(u32, u32, f64)> =
        stats.iter().filter_map(|(p, s)| fields(s).map(|(ppid, t)| (*p, ppid, t))).collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(procs.iter().filter(|(_, pp, _)| *pp == parent).map(|(p, _, _)| *p));
        i += 1;
    }
    procs.iter().filter(|(p, _, _)| tree.contains(p)).map(|(_, _, t)| t / tick).sum()
}
