//! Publishing: the snapshot the statistics socket and the metrics endpoint
//! serve, the per-second rates it carries (a window of the class counters),
//! the daemon's own CPU, and the two servers.
//!
//! The control thread (SCHED_FIFO) fills its own snapshot and hands a copy
//! over (`Publisher::publish`); the servers render the copy they took, off
//! any lock. The lock around the handed-over copy is held only to clone or
//! replace one `Arc`, and the control thread only tries it: if a server
//! holds it that instant, the copy goes over at the next tick. A render,
//! however long, never keeps the control thread waiting.
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::dataplane::gate::{ClassCounters, Gate};
use crate::policy::remap::ClassRemap;
use crate::surface::stats::{prometheus_text, prometheus_text_004, ClassRates, ClassTotals, GlobalTotals, Snapshot};

/// Window of the per-second rates in the statistics, in refreshes.
const RATE_WINDOW: usize = 10;

/// What the statistics threads read: the last snapshot handed over.
pub(super) struct Shared {
    current: Mutex<Arc<Snapshot>>,
}

impl Shared {
    /// The last snapshot handed over (the lock is held for one `Arc` clone).
    pub fn current(&self) -> Arc<Snapshot> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Hand `snap` over unless a reader holds the lock this instant (the
    /// control thread never waits on it); false: not handed over.
    fn offer(&self, snap: &Arc<Snapshot>) -> bool {
        match self.current.try_lock() {
            Ok(mut cur) => *cur = snap.clone(),
            Err(TryLockError::Poisoned(e)) => *e.into_inner() = snap.clone(),
            Err(TryLockError::WouldBlock) => return false,
        }
        true
    }
}

/// A class's totals at the last RATE_WINDOW + 1 statistics refreshes, oldest
/// first (for the per-second rates).
type History = std::collections::VecDeque<(Instant, ClassTotals)>;

/// The daemon's snapshot, what its rates and CPU figures are computed from,
/// and the copy the servers read.
pub(super) struct Publisher {
    /// The control thread's own snapshot: changed freely, served once handed over.
    pub snap: Snapshot,
    /// A newer snapshot than the servers have waits to be handed over.
    pending: bool,
    pub shared: Arc<Shared>,
    history: Vec<History>,
    last_cpu: (Instant, f64),
    /// The last softirq total read (see `softirq`).
    last_softirq: Option<(Instant, f64)>,
    started: Instant,
}

impl Publisher {
    /// Publish `snapshot` (for `classes` classes) from now on.
    pub fn new(snapshot: Snapshot, classes: usize) -> Publisher {
        Publisher {
            shared: Arc::new(Shared { current: Mutex::new(Arc::new(snapshot.clone())) }),
            snap: snapshot,
            pending: false,
            history: vec![History::new(); classes],
            last_cpu: (Instant::now(), process_cpu_secs()),
            last_softirq: None,
            started: Instant::now(),
        }
    }

    /// Put the classes' `counters` (by class index, summed over CPUs) and
    /// the gate's global counters into the snapshot: totals, rates over the
    /// window, the daemon's CPU and memory.
    pub fn counters(&mut self, gate: &Gate, counters: &[ClassCounters]) -> Result<()> {
        let now = Instant::now();
        let mut classes = Vec::with_capacity(self.history.len());
        for (history, &counters) in self.history.iter_mut().zip(counters) {
            let totals = ClassTotals::from(counters);
            history.push_back((now, totals));
            if history.len() > RATE_WINDOW + 1 {
                history.pop_front();
            }
            let (t0, old) = history.front().copied().unwrap();
            classes.push((totals, ClassRates::between(&old, &totals, now.duration_since(t0).as_secs_f64())));
        }
        let global = GlobalTotals::from(gate.global_counters()?);
        let cpu = process_cpu_secs();
        let (t0, c0) = std::mem::replace(&mut self.last_cpu, (now, cpu));
        let snap = &mut self.snap;
        snap.uptime_secs = self.started.elapsed().as_secs_f64();
        snap.global = global;
        snap.daemon_cpu_secs = cpu;
        snap.daemon_cpu_pct = pct_of_a_cpu(cpu - c0, t0, now);
        snap.daemon_rss_bytes = crate::surface::stats::rss_bytes();
        for (c, (totals, rates)) in snap.classes.iter_mut().zip(classes) {
            c.totals = totals;
            c.rates = rates;
        }
        Ok(())
    }

    /// The softirq time charged to the daemon's threads so far (None: not
    /// counted), and its share since the last call, % of one CPU.
    pub fn softirq(&mut self, secs: Option<f64>) {
        let (now, snap) = (Instant::now(), &mut self.snap);
        snap.daemon_softirq_secs = secs;
        snap.daemon_softirq_pct = match (secs, self.last_softirq) {
            (Some(s), Some((t0, s0))) => Some(pct_of_a_cpu((s - s0).max(0.0), t0, now)),
            _ => None,
        };
        self.last_softirq = secs.map(|s| (now, s));
    }

    /// A new class list: each class keeps its history and its last totals
    /// and rates by name (`remap`); `classes` are the new list's snapshots.
    pub fn follow(&mut self, remap: &ClassRemap, mut classes: Vec<crate::surface::stats::ClassSnapshot>) {
        self.history = remap.carry(std::mem::take(&mut self.history));
        let snap = &mut self.snap;
        for (new, c) in classes.iter_mut().enumerate() {
            if let Some(o) = remap.old_of(new).and_then(|i| snap.classes.get(i)) {
                (c.totals, c.rates) = (o.totals, o.rates);
            }
        }
        snap.classes = classes;
    }

    /// Hand a copy of the snapshot to the servers (now, or at a later
    /// `retry` if a server holds the lock this instant).
    pub fn publish(&mut self) {
        self.pending = !self.shared.offer(&Arc::new(self.snap.clone()));
    }

    /// Every tick: hand over a snapshot that could not go earlier.
    pub fn retry(&mut self) {
        if self.pending {
            self.publish();
        }
    }
}

/// CPU time of this process (user + system), seconds.
fn process_cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The statistics socket, bound but not yet served: dropping it (a start
/// that failed after binding) removes the file again.
pub(super) struct SocketFile {
    listener: Option<UnixListener>,
    /// Removed on drop unless taken by `serve`.
    path: Option<PathBuf>,
}

impl SocketFile {
    /// Bind, mode 0600 from the start (the umask is 0177 around the bind, so
    /// the socket is never reachable with a wider mode). A live daemon on
    /// the path is an error; a stale socket is replaced; anything else there
    /// (a file, a link, a directory) is an error and left alone.
    pub fn bind(path: &Path) -> Result<SocketFile> {
        use std::os::unix::fs::FileTypeExt;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                bail!(
                    "{} exists and is not a socket (sluice removes only a stale socket of its own): \
                     remove it or pass --socket PATH",
                    path.display()
                );
            }
            if UnixStream::connect(path).is_ok() {
                bail!("another sluice daemon serves {} already; stop it or pass --socket PATH", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        // SAFETY: umask(2) only swaps the process's file mode mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above, putting the old mask back.
        unsafe { libc::umask(old) };
        let listener = bound.with_context(|| format!("binding the statistics socket {}", path.display()))?;
        let file = SocketFile { listener: Some(listener), path: Some(path.to_path_buf()) };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(file)
    }

    /// Serve snapshots on a thread: each connection gets the current snapshot
    /// as JSON, then the socket closes. Returns the path (the daemon removes
    /// the file when it stops).
    pub fn serve(mut self, shared: Arc<Shared>) -> PathBuf {
        let (listener, path) = (self.listener.take().expect("bound"), self.path.take().expect("bound"));
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let json = serde_json::to_string(&*shared.current()).unwrap_or_default();
                let _ = conn.write_all(json.as_bytes());
            }
        });
        path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `secs` of CPU time between `t0` and `now`, as % of one CPU.
fn pct_of_a_cpu(secs: f64, t0: Instant, now: Instant) -> f64 {
    100.0 * secs / now.duration_since(t0).as_secs_f64().max(1e-3)
}

pub(super) fn bind_metrics(addr: SocketAddr) -> Result<std::net::TcpListener> {
    crate::surface::endpoint::bind(addr)
}

/// Serve /metrics: OpenMetrics to those who ask for it (Prometheus does), the
/// 0.0.4 text format to the rest (src/surface/endpoint.rs bounds the connections).
pub(super) fn serve_metrics(listener: std::net::TcpListener, shared: Arc<Shared>) {
    crate::surface::endpoint::serve(
        listener,
        Arc::new(move |openmetrics| {
            let snap = shared.current();
            if openmetrics {
                prometheus_text(&snap)
            } else {
                prometheus_text_004(&snap)
            }
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// Hardening (issue 35, item 13): a server holding the lock never keeps
    /// the control thread waiting (before, a render held the snapshot's
    /// lock while the SCHED_FIFO loop waited for it at its next refresh);
    /// the copy goes over at the next try, and a render in progress keeps
    /// the copy it took.
    #[test]
    fn a_reader_never_keeps_the_publisher_waiting() {
        let mut p = Publisher::new(Snapshot::default(), 0);
        let rendering = p.shared.current();
        let shared = p.shared.clone();
        let held = shared.current.lock().unwrap();
        p.snap.reloads = 1;
        p.publish(); // would deadlock here if it waited on the lock held just above
        assert!(p.pending, "not handed over while a reader holds the lock");
        drop(held);
        p.retry();
        assert!(!p.pending);
        assert_eq!(p.shared.current().reloads, 1, "handed over at the next try");
        assert_eq!(rendering.reloads, 0, "a render in progress keeps the copy it took");
    }

    #[test]
    fn the_statistics_socket_is_0600_whatever_the_umask() {
        let d = dir();
        let path = d.path().join("s.sock");
        // SAFETY: umask(2); a test's own process.
        let old = unsafe { libc::umask(0) };
        let bound = SocketFile::bind(&path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let _file = bound.unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn only_a_stale_socket_is_replaced() {
        let d = dir();
        let stale = d.path().join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap()); // the file stays, nobody listens
        let _f = SocketFile::bind(&stale).expect("a stale socket is replaced");
        let live = d.path().join("live.sock");
        let _other = UnixListener::bind(&live).unwrap();
        let e = SocketFile::bind(&live).err().expect("a live daemon's socket");
        assert!(format!("{e:#}").contains("another sluice daemon serves"), "{e:#}");
    }

    #[test]
    fn a_file_or_a_link_at_the_socket_path_is_an_error_and_left_alone() {
        let d = dir();
        let file = d.path().join("file");
        std::fs::write(&file, "keep me").unwrap();
        let e = SocketFile::bind(&file).err().expect("a regular file");
        assert!(format!("{e:#}").contains("exists and is not a socket"), "{e:#}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(SocketFile::bind(&link).is_err(), "a link");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is left alone");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    }
}
