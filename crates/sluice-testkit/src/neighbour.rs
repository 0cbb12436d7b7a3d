//! A neighbour: another process that spins on one CPU until dropped, at a
//! nice of its own. What a service shares its CPUs with, for the tests that
//! check a neighbour's CPU time is not read as the service's load.
use std::process::{Child, Command};

use anyhow::{Context, Result};

/// A `sh` busy loop pinned to one CPU, killed on drop.
pub struct Spinner(Child);

impl Spinner {
    /// Spin on `cpu` at `nice` (a negative one needs root).
    pub fn on(cpu: usize, nice: i32) -> Result<Spinner> {
        let child = Command::new("nice")
            .args(["-n", &nice.to_string(), "sh", "-c", "while :; do :; done"])
            .spawn()
            .context("starting a spinner (nice, sh)")?;
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
