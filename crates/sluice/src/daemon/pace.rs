//! The control loop's pace: a tick every 10 ms while something needs
//! control, every CALM once the ticker has found all calm for CALM_AFTER.
//! While calm, the gate wakes the loop at once when a class's arrivals on a
//! CPU pass either mark this arms at each calm tick:
//! - a count: twice the packets the class took in a calm tick, at least
//!   WAKE_FLOOR (a flood on an idle class wakes it within a few hundred
//!   packets);
//! - a rate: SLUICE_WAKE_BATCH packets on a CPU faster than WAKE_RATE times
//!   the class's calm rate, at least WAKE_RATE_FLOOR (a flood on a class
//!   with calm traffic wakes it within two batches, where the count alone
//!   waits for most of a calm tick's traffic).
//!
//! Without the wake ring (a kernel without BPF ring buffers) the loop stays
//! at 10 ms.
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::base::log;
use crate::bpf_intf::{SLUICE_CS_SEEN_PKTS, SLUICE_WAKE_BATCH};
use crate::daemon::tick::Ticker;
use crate::dataplane::gate::{Gate, Woken};
use crate::policy::controller::TICK;

/// The tick while all is calm.
pub const CALM: Duration = Duration::from_millis(500);
/// How long all must be calm before the tick slows down.
pub const CALM_AFTER: Duration = Duration::from_secs(1);
/// Packets a class may see on one CPU in a calm tick, at the least, without waking the loop.
const WAKE_FLOOR: u64 = 256;
/// The rate mark: this many times the class's calm rate (all CPUs: a CPU's
/// share is at most that) ...
const WAKE_RATE: f64 = 4.0;
/// ... and at least this many packets/s (a batch in one 10 ms tick: below it,
/// the count mark is the one that wakes).
const WAKE_RATE_FLOOR: f64 = SLUICE_WAKE_BATCH as f64 / 0.010;

pub(super) struct Pace {
    ring: Option<libbpf_rs::RingBuffer<'static>>,
    /// Wake records the ring delivered so far.
    woke: Arc<Woken>,
    calm_since: Option<Instant>,
    calm: bool,
    /// Each class's seen packets (all CPUs) when its marks were armed in
    /// this calm spell (None: not armed yet).
    armed: Vec<Option<u64>>,
    /// Wakes that ended a calm spell.
    pub wakes: u64,
    /// The last of those: how long the gate's call took to reach the loop,
    /// and the longest so far.
    pub wake_last: Option<Duration>,
    pub wake_max: Option<Duration>,
    /// The gate's clock at the last of those wakes (CLOCK_MONOTONIC ns).
    pub wake_at_ns: Option<u64>,
    /// Ticks run.
    pub ticks: u64,
}

impl Pace {
    /// Fast, with the gate's wake ring (or without, said in the log: always fast).
    pub fn new(gate: &Gate) -> Pace {
        let woke = Arc::new(Woken::default());
        let ring = match gate.wake_ring(woke.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                log::warn(format_args!("the gate cannot wake the control loop ({e:#}): it ticks every 10 ms"));
                None
            }
        };
        Pace {
            ring,
            woke,
            calm_since: None,
            calm: false,
            armed: vec![],
            wakes: 0,
            wake_last: None,
            wake_max: None,
            wake_at_ns: None,
            ticks: 0,
        }
    }

    /// The time between two ticks now.
    pub fn interval(&self) -> Duration {
        if self.calm {
            CALM
        } else {
            TICK
        }
    }

    pub fn is_calm(&self) -> bool {
        self.calm
    }

    /// Wait up to `timeout`, or until the gate wakes the loop: true if it did
    /// (then the loop is fast from now on).
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let Some(ring) = &self.ring else {
            std::thread::sleep(timeout);
            return false;
        };
        let before = self.woke.count();
        // The ring waits in whole milliseconds: round up, or the loop would
        // wake just early and spin through the last fraction.
        let _ = ring.poll(Duration::from_millis(timeout.as_micros().div_ceil(1000) as u64));
        let woke = self.woke.count() > before;
        if woke && self.calm {
            self.wakes += 1;
            self.wake_last = self.woke.last();
            self.wake_at_ns = self.woke.last_at();
            self.wake_max = self.wake_max.max(self.wake_last);
        }
        if woke {
            self.fast();
        }
        woke
    }

    /// After a tick: calm if the ticker found nothing to control and CPU
    /// protection is not `holding`. Slow down once that held for CALM_AFTER
    /// (and arm the gate's wake marks at calm ticks, from each class's
    /// offered packets/s and seen packets); any tick that is not calm makes
    /// the loop fast at once.
    pub fn after_tick(&mut self, ticker: &Ticker, holding: bool, gate: &Gate) -> Result<()> {
        self.ticks += 1;
        let now = Instant::now();
        if holding || self.ring.is_none() || !ticker.calm() {
            self.fast();
            return Ok(());
        }
        let since = *self.calm_since.get_or_insert(now);
        if now.duration_since(since) >= CALM_AFTER {
            self.calm = true;
            self.arm(gate, &ticker.offered(), &ticker.seen(), &ticker.slow_marks_us())?;
        }
        Ok(())
    }

    /// Tick fast from now on (woken, or a new class list: the marks were armed by the old ids).
    pub fn fast(&mut self) {
        (self.calm, self.calm_since) = (false, None);
        self.armed.clear();
    }

    /// Arm each class's wake marks on every CPU: the count, its seen packets
    /// now plus what it may take in a calm tick (twice its offered rate's
    /// worth, at least WAKE_FLOOR), and the rate (`wake_gap_ns`). A class
    /// that saw no packet (`seen`, all CPUs) since it was armed keeps its
    /// marks: an idle class costs no map access. One that did is armed again
    /// at every calm tick, so its count mark is always at least half a calm
    /// tick of its traffic ahead. A class judged on its answers gets its
    /// slow mark too (`slow_us`, by class index: a flood of real connections
    /// brings no jump of arrivals, only late answers).
    fn arm(&mut self, gate: &Gate, offered: &[f64], seen: &[u64], slow_us: &[u32]) -> Result<()> {
        self.armed.resize(offered.len(), None);
        for (id, (&pps, &now)) in offered.iter().zip(seen).enumerate() {
            if self.armed[id] == Some(now) {
                continue;
            }
            let allowance = WAKE_FLOOR.max((2.0 * pps * CALM.as_secs_f64()) as u64);
            let at: Vec<u64> =
                gate.class_counters_percpu(id)?.iter().map(|c| c[SLUICE_CS_SEEN_PKTS as usize] + allowance).collect();
            gate.arm_wake(id, &at, wake_gap_ns(pps), slow_us.get(id).copied().unwrap_or(0))?;
            self.armed[id] = Some(now);
        }
        Ok(())
    }
}

/// The rate mark of a class offered `pps` while calm: the most nanoseconds a
/// batch of SLUICE_WAKE_BATCH packets on one CPU may take and still wake the loop.
pub fn wake_gap_ns(pps: f64) -> u64 {
    let mark = (WAKE_RATE * pps).max(WAKE_RATE_FLOOR);
    (SLUICE_WAKE_BATCH as f64 * 1e9 / mark) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rate_mark_is_four_times_the_calm_rate_and_at_least_a_batch_a_tick() {
        // Idle or light: a batch in under 10 ms wakes.
        assert_eq!(super::wake_gap_ns(0.0), 10_000_000);
        assert_eq!(super::wake_gap_ns(5_000.0), 10_000_000);
        // 10k/s calm: a batch at over 40k/s (6.4 ms) wakes; a 100k/s flood's
        // batch takes about 2.3 ms with the calm traffic.
        assert_eq!(super::wake_gap_ns(10_000.0), 6_400_000);
    }
}
