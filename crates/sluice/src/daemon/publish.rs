//! Publishing: the snapshot the statistics socket and the metrics endpoint
//! serve, the per-second rates it carries (a window of the class counters),
//! the daemon's own CPU, and the two servers.
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::dataplane::gate::Gate;
use crate::policy::remap::ClassRemap;
use crate::surface::stats::{prometheus_text, prometheus_text_004, ClassRates, ClassTotals, GlobalTotals, Snapshot};

/// Window of the per-second rates in the statistics, in refreshes.
const RATE_WINDOW: usize = 10;

/// Everything the statistics threads read.
pub(super) struct Shared {
    pub snapshot: Mutex<Snapshot>,
}

/// A class's totals at the last RATE_WINDOW + 1 statistics refreshes, oldest
/// first (for the per-second rates).
type History = std::collections::VecDeque<(Instant, ClassTotals)>;

/// The served snapshot and what its rates and CPU figures are computed from.
pub(super) struct Publisher {
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
            shared: Arc::new(Shared { snapshot: Mutex::new(snapshot) }),
            history: vec![History::new(); classes],
            last_cpu: (Instant::now(), process_cpu_secs()),
            last_softirq: None,
            started: Instant::now(),
        }
    }

    /// Read the gate's counters into the snapshot: totals, rates over the
    /// window, the daemon's CPU and memory.
    pub fn counters(&mut self, gate: &Gate) -> Result<()> {
        let now = Instant::now();
        let mut classes = Vec::with_capacity(self.history.len());
        for (id, history) in self.history.iter_mut().enumerate() {
            let totals = ClassTotals::from(gate.class_counters(id)?);
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
        let mut snap = self.shared.snapshot.lock().unwrap();
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
    pub fn softirq(&mut self, snap: &mut Snapshot, secs: Option<f64>) {
        let now = Instant::now();
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
        let mut snap = self.shared.snapshot.lock().unwrap();
        for (new, c) in classes.iter_mut().enumerate() {
            if let Some(o) = remap.old_of(new).and_then(|i| snap.classes.get(i)) {
                (c.totals, c.rates) = (o.totals, o.rates);
            }
        }
        snap.classes = classes;
    }

    /// The served snapshot, to read or change (a handle of its own: the
    /// caller may borrow the rest of the daemon while it holds the lock).
    pub fn snapshot(&self) -> Arc<Shared> {
        self.shared.clone()
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
                let json = serde_json::to_string(&*shared.snapshot.lock().unwrap()).unwrap_or_default();
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
            let snap = shared.snapshot.lock().unwrap();
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
