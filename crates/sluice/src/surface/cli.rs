//! Helpers the `sluice` and `sluice-bench` commands share: value parsers
//! for clap (a bad value is refused naming its flag, before anything runs)
//! and output.
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

/// A duration in seconds: positive, finite, under 1e6 (fractions allowed).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("\"{s}\" is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0 && v < 1e6) {
        return Err(format!("{s}: a positive number of seconds (under 1e6) is needed"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Packets/s with an optional k/M/G suffix.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    crate::policy::config::parse_count(s).map(|x| x as f64)
}

/// Print `value` as pretty JSON, or as `table` renders it.
pub fn print_json_or<T: Serialize>(json: bool, value: &T, table: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", table(value));
    }
    Ok(())
}

/// A flag set by SIGINT or SIGTERM, for commands that stop cleanly.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone())?;
    }
    Ok(flag)
}
