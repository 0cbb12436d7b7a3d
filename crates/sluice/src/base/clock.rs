//! The two clocks sluice reads: the kernel's monotonic one (what
//! `bpf_ktime_get_ns()` reads in the gate) and the wall clock (the gate
//! clock of the known clients, which must survive a restart).

/// CLOCK_MONOTONIC (the clock bpf_ktime_get_ns() reads), ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall-clock time (CLOCK_REALTIME), ms since the Unix epoch: the gate
/// clock. Before 1970 (a clock not set at all) reads as 1 ms, never 0,
/// which the gate takes as "not set yet".
pub fn wall_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(1, |d| d.as_millis() as u64).max(1)
}
