//! The clocks sluice reads: the kernel's monotonic one (what
//! `bpf_ktime_get_ns()` reads in the gate), the wall clock, and the gate
//! clock made of both (the known clients' dates and the SYN cookies' slots,
//! which must survive a restart of the daemon and must not step back).

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

/// The gate clock, ms since the Unix epoch: the wall clock as the daemon
/// (this process) first read it, moved on by the monotonic clock since. A
/// wall clock stepped back or forth while the daemon runs (an NTP step, an
/// operator's `date -s`) does not move it, so the learner never dates a last
/// answer before the first; across a restart it takes the wall clock again
/// (the known clients' file is in wall-clock time, and what it holds from
/// the future is refused: `signals::known`).
pub fn gate_ms() -> u64 {
    static START: std::sync::OnceLock<GateClock> = std::sync::OnceLock::new();
    START.get_or_init(|| GateClock::anchored(wall_ms(), now_ns())).at(now_ns())
}

/// The gate clock's anchor: the wall clock (ms) and the monotonic one (ns)
/// read together once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateClock {
    wall_ms: u64,
    mono_ns: u64,
}

impl GateClock {
    pub fn anchored(wall_ms: u64, mono_ns: u64) -> GateClock {
        GateClock { wall_ms, mono_ns }
    }

    /// The gate clock at monotonic time `mono_ns` (never before the anchor).
    pub fn at(&self, mono_ns: u64) -> u64 {
        self.wall_ms + mono_ns.saturating_sub(self.mono_ns) / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49, item 5: the learner's dates followed the wall clock, so a
    /// step back made a last answer older than the first.
    #[test]
    fn the_gate_clock_follows_the_monotonic_clock_from_one_wall_reading() {
        let c = GateClock::anchored(1_700_000_000_000, 5_000_000_000);
        assert_eq!(c.at(5_000_000_000), 1_700_000_000_000);
        assert_eq!(c.at(6_500_000_000), 1_700_000_001_500, "1.5 s on");
        assert_eq!(c.at(4_000_000_000), 1_700_000_000_000, "never before its anchor");
        let (a, b) = (gate_ms(), gate_ms());
        assert!(b >= a && a > 1_000_000_000_000, "{a} {b}");
    }
}
