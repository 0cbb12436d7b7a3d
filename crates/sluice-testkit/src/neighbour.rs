//! A neighbour: another process that spins on one CPU until dropped, at a
//! nice of its own. What a service shares its CPUs with, for the tests that
//! check a neighbour's CPU time is not read as the service's load; and,
//! holding a listener the service is connected to, a backend the service
//! hands its work to, whose time is the service's.
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command};

use anyhow::{Context, Result};

/// A `sh` busy loop pinned to one CPU, killed on drop.
pub struct Spinner(Child);

impl Spinner {
    /// Spin on `cpu` at `nice` (a negative one needs root).
    pub fn on(cpu: usize, nice: i32) -> Result<Spinner> {
        Self::start(cpu, nice, None)
    }

    /// Spin on `cpu` at `nice`, holding `socket` (as its descriptor 3):
    /// a backend, where `socket` is a listener the service connected to.
    pub fn holding(cpu: usize, nice: i32, socket: std::os::fd::OwnedFd) -> Result<Spinner> {
        Self::start(cpu, nice, Some(socket))
    }

    fn start(cpu: usize, nice: i32, socket: Option<std::os::fd::OwnedFd>) -> Result<Spinner> {
        let mut cmd = Command::new("nice");
        cmd.args(["-n", &nice.to_string(), "sh", "-c", "while :; do :; done"]);
        if let Some(fd) = &socket {
            pass_as_fd3(&mut cmd, fd);
        }
        let child = cmd.spawn().context("starting a spinner (nice, sh)")?;
        drop(socket);
        let spinner = Spinner(child);
        sluice::base::netns::pin_task(spinner.0.id() as i32, cpu)?;
        Ok(spinner)
    }

    /// One spinner on each CPU this process may run on.
    pub fn everywhere(nice: i32) -> Result<Vec<Spinner>> {
        sluice::base::netns::affinity(0).into_iter().map(|c| Spinner::on(c, nice)).collect()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Have `cmd`'s process hold `fd` as its descriptor 3 (it stays open over
/// exec; the caller's copy is its own to close).
pub fn pass_as_fd3(cmd: &mut Command, fd: &impl std::os::fd::AsRawFd) {
    use std::os::unix::process::CommandExt;
    let fd = fd.as_raw_fd();
    // SAFETY: dup2(2) and fcntl(2) in the child before exec (both
    // async-signal-safe). Where `fd` is 3 already, dup2 is a no-op that
    // leaves its close-on-exec flag set: cleared instead.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
            match r {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            }
        });
    }
}

/// A unix listener (at a path under the temp directory named by `tag` and
/// this process, removed once used), a connection to it and the connection's
/// accepted end: a service's connection to a backend, for the tests that
/// hand the listener to a `Spinner` or another child.
pub fn unix_connection(tag: &str) -> (UnixListener, UnixStream, UnixStream) {
    let path = std::env::temp_dir().join(format!("sluice-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind a unix listener");
    let client = UnixStream::connect(&path).expect("connect to it");
    let accepted = listener.accept().expect("accept the connection").0;
    let _ = std::fs::remove_file(&path);
    (listener, client, accepted)
}
