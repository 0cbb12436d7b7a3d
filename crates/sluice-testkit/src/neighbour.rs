//! A neighbour: another process that spins on one CPU until dropped, at a
//! nice of its own. What a service shares its CPUs with, for the tests that
//! check a neighbour's CPU time is not read as the service's load; and,
//! holding the accepted end of a connection the service made, a backend
//! the service hands its work to, whose time is the service's.
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
    /// a backend, where `socket` is the accepted end of a connection the
    /// service made.
    pub fn holding(cpu: usize, nice: i32, socket: std::os::fd::OwnedFd) -> Result<Spinner> {
        Self::start(cpu, nice, Some(socket))
    }

    fn start(cpu: usize, nice: i32, socket: Option<std::os::fd::OwnedFd>) -> Result<Spinner> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("nice");
        cmd.args(["-n", &nice.to_string(), "sh", "-c", "while :; do :; done"]);
        if let Some(fd) = socket.as_ref().map(AsRawFd::as_raw_fd) {
            // SAFETY: dup2(2) in the child before exec (async-signal-safe):
            // the socket as descriptor 3, which exec keeps open.
            unsafe {
                cmd.pre_exec(move || match libc::dup2(fd, 3) {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                });
            }
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
