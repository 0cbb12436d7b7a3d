//! The control loop's pace: a tick every 10 ms while something needs
//! control, every CALM once the ticker has found all calm for CALM_AFTER.
//! While calm, the gate wakes the loop at once when a class's arrivals on a
//! CPU pass the mark this arms at each calm tick (twice the packets the class
//! took in a calm tick, at least WAKE_FLOOR): a flood on an idle host is
//! ticked at 10 ms from its first few hundred packets on, not a calm tick
//! later. Without the wake ring (a kernel without BPF ring buffers) the loop
//! stays at 10 ms.
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bpf_intf::SLUICE_CS_SEEN_PKTS;
use crate::daemon::tick::Ticker;
use crate::dataplane::gate::{Gate, Woken};
use crate::policy::controller::TICK;
use crate::surface::log;

/// The tick while all is calm.
pub const CALM: Duration = Duration::from_millis(500);
/// How long all must be calm before the tick slows down.
pub const CALM_AFTER: Duration = Duration::from_secs(1);
/// Packets a class may see on one CPU in a calm tick, at the least, without waking the loop.
const WAKE_FLOOR: u64 = 256;

pub(super) struct Pace {
    ring: Option<libbpf_rs::RingBuffer<'static>>,
    /// Wake records the ring delivered so far.
    woke: Arc<Woken>,
    calm_since: Option<Instant>,
    calm: bool,
    /// Each class's seen packets (all CPUs) and allowance when its marks
    /// were armed in this calm spell (None: not armed yet).
    armed: Vec<Option<(u64, u64)>>,
    /// Wakes that ended a calm spell.
    pub wakes: u64,
    /// The last of those: how long the gate's call took to reach the loop,
    /// and the longest so far.
    pub wake_last: Option<Duration>,
    pub wake_max: Option<Duration>,
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
        let (wake_last, wake_max) = (None, None);
        Pace { ring, woke, calm_since: None, calm: false, armed: vec![], wakes: 0, wake_last, wake_max, ticks: 0 }
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
            self.arm(gate, &ticker.offered(), &ticker.seen())?;
        }
        Ok(())
    }

    /// Tick fast from now on (woken, or a new class list: the marks were armed by the old ids).
    pub fn fast(&mut self) {
        (self.calm, self.calm_since) = (false, None);
        self.armed.clear();
    }

    /// Arm each class's wake mark on every CPU: its seen packets now plus
    /// what it may take in a calm tick (twice its offered rate's worth, at
    /// least WAKE_FLOOR). A class whose packets (`seen`, all CPUs) used less
    /// than half its allowance since it was armed keeps its marks: an idle
    /// class costs no map access.
    fn arm(&mut self, gate: &Gate, offered: &[f64], seen: &[u64]) -> Result<()> {
        self.armed.resize(offered.len(), None);
        for (id, (&pps, &now)) in offered.iter().zip(seen).enumerate() {
            if self.armed[id].is_some_and(|(at, allowance)| now.saturating_sub(at) < allowance / 2) {
                continue;
            }
            let allowance = WAKE_FLOOR.max((2.0 * pps * CALM.as_secs_f64()) as u64);
            let at: Vec<u64> =
                gate.class_counters_percpu(id)?.iter().map(|c| c[SLUICE_CS_SEEN_PKTS as usize] + allowance).collect();
            gate.arm_wake(id, &at)?;
            self.armed[id] = Some((now, allowance));
        }
        Ok(())
    }
}
