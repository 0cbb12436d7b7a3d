//! The statistics client: finds a daemon's socket and fetches its snapshot
//! (`sluice status`, `sluice sources`, `sluice trace`, the tests and the bench).
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::surface::stats::Snapshot;

/// Directory of the statistics sockets.
pub const SOCKET_DIR: &str = "/run/sluice";

/// Default statistics socket of an interface.
pub fn default_socket(iface: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{iface}.sock"))
}

/// Is a daemon serving on `path` yet? Its socket accepts connections from
/// the moment it is bound, before the gate is attached; a snapshot is
/// written only once it is (the start is over), so wait for a byte.
pub fn serving(path: &Path) -> bool {
    let Ok(mut conn) = UnixStream::connect(path) else { return false };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let mut byte = [0u8; 1];
    matches!(conn.read(&mut byte), Ok(1))
}

/// Client side: fetch a snapshot from a daemon's socket.
pub fn fetch_snapshot(path: &Path) -> Result<Snapshot> {
    let mut conn = UnixStream::connect(path).with_context(|| {
        format!(
            "cannot reach a sluice daemon at {} (is `sluice run` running? pass --socket or --iface)",
            path.display()
        )
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = String::new();
    conn.read_to_string(&mut buf)?;
    serde_json::from_str(&buf).with_context(|| format!("the daemon at {} sent an unreadable snapshot", path.display()))
}

/// The socket `sluice status` should use.
pub fn find_socket(socket: Option<&Path>, iface: Option<&str>) -> Result<PathBuf> {
    if let Some(s) = socket {
        return Ok(s.to_path_buf());
    }
    if let Some(i) = iface {
        return Ok(default_socket(i));
    }
    let socks: Vec<PathBuf> = std::fs::read_dir(SOCKET_DIR)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "sock")).collect())
        .unwrap_or_default();
    match socks.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no sluice daemon found (no socket in {SOCKET_DIR}); start one with `sluice run --iface IFACE`"),
        many => bail!(
            "several sluice daemons run ({}); pick one with --iface or --socket",
            many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}
