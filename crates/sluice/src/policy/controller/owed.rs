//! What a class's clients owe: clients held back (their CPU taken, the host
//! stalled, an outstanding-query cap reached while their server was slow)
//! send what they missed as soon as they can, at several times their pace.
//! Those packets are no surge: the engage rules judge arrivals less what
//! repaid such a debt ("fresh" arrivals, `Estimate`).
//!
//! The debt is what arrived under the clients' usual pace, at most
//! OWED_SECS of it: a client that fell behind sends at most what it missed,
//! and a flood's excess repays at most OWED_SECS of the usual load before
//! it counts in full.

/// The most a class's clients can owe, in seconds of their usual pace: a
/// VM's stall or a client starved for a moment is over well within it (a
/// calm NSD cell beside busy loops, in observe mode: dnsperf, not yet
/// learned, behind by most of a second, whose catch-up engaged the
/// steady-loss rule: 10,350 would-be drops). A
/// flood after a lull of its clients counts in full once it has brought
/// this much over their pace: at 10 times the pace after 0.11 s.
pub const OWED_SECS: f64 = 1.0;
/// The usual pace follows quiet ticks over about this long (s); over less
/// while fewer quiet seconds have been seen (a running mean), so a daemon
/// knows its clients' pace in its first second.
pub const USUAL_SECS: f64 = 10.0;

/// The clients' pace and what they owe.
#[derive(Debug, Clone, Default)]
pub struct Owed {
    /// Packets/s that arrived over quiet ticks, a mean over USUAL_SECS.
    usual: f64,
    /// Quiet seconds seen, up to USUAL_SECS (the running mean's weight).
    seen_secs: f64,
    /// Packets the clients owe: what arrived under `usual`, at most
    /// OWED_SECS of it.
    owed: f64,
}

impl Owed {
    /// One tick: `arrived` packets over `dt` seconds, of a class that was
    /// `quiet` (no socket drop lately). Returns how many of them repaid a
    /// debt. The pace follows quiet ticks, but not while the clients owe
    /// less than the most they can (a lull, or a catch-up, is not a new
    /// pace; a lull longer than OWED_SECS is).
    pub fn tick(&mut self, arrived: f64, dt: f64, quiet: bool) -> f64 {
        if dt <= 0.0 {
            return 0.0;
        }
        let pace = self.usual * dt;
        let cap = OWED_SECS * self.usual;
        let repaid = if arrived < pace {
            self.owed = (self.owed + pace - arrived).min(cap);
            0.0
        } else {
            let r = self.owed.min(arrived - pace);
            self.owed -= r;
            r
        };
        let settled = self.owed <= 0.0 || self.owed >= cap;
        if quiet && settled {
            self.seen_secs = (self.seen_secs + dt).min(USUAL_SECS);
            self.usual += dt / self.seen_secs * (arrived / dt - self.usual);
            self.owed = self.owed.min(OWED_SECS * self.usual);
        }
        repaid
    }

    /// The clients' usual pace (packets/s).
    pub fn usual(&self) -> f64 {
        self.usual
    }

    /// Packets the clients owe now.
    pub fn owed(&self) -> f64 {
        self.owed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DT: f64 = 0.01;

    fn steady(o: &mut Owed, pps: f64, ticks: usize) -> f64 {
        (0..ticks).map(|_| o.tick(pps * DT, DT, true)).sum()
    }

    #[test]
    fn the_pace_is_a_running_mean_at_first() {
        let mut o = Owed::default();
        steady(&mut o, 20_000.0, 10);
        assert!((o.usual() - 20_000.0).abs() < 1.0, "after 100 ms: {}", o.usual());
        assert_eq!(o.owed(), 0.0);
    }

    /// Clients that stop for 0.6 s owe 0.6 s of their pace; their catch-up
    /// repays it and nothing more; the pace is unchanged by either.
    #[test]
    fn a_lull_is_owed_and_its_catch_up_repays_it() {
        let mut o = Owed::default();
        steady(&mut o, 20_000.0, 300);
        steady(&mut o, 0.0, 60);
        assert!((o.owed() - 12_000.0).abs() < 1.0, "owed {}", o.owed());
        assert!((o.usual() - 20_000.0).abs() < 1.0, "a lull moved the pace to {}", o.usual());
        // 80k/s for 20 ticks: 12,000 over the pace, all of it owed.
        let repaid = steady(&mut o, 80_000.0, 20);
        assert!((repaid - 12_000.0).abs() < 1.0, "repaid {repaid}");
        assert_eq!(o.owed(), 0.0);
        assert_eq!(steady(&mut o, 80_000.0, 10), 0.0, "a debt repaid is not repaid again");
    }

    /// A lull longer than OWED_SECS owes OWED_SECS of the pace, and the
    /// pace then follows the lower load.
    #[test]
    fn what_is_owed_is_capped_and_a_longer_lull_is_a_new_pace() {
        let mut o = Owed::default();
        steady(&mut o, 20_000.0, 300);
        steady(&mut o, 0.0, 150);
        assert!(o.owed() <= OWED_SECS * 20_000.0 + 1.0, "owed {}", o.owed());
        assert!(o.usual() < 20_000.0, "a lull over OWED_SECS left the pace at {}", o.usual());
        assert_eq!(Owed::default().tick(1_000.0, 0.0, true), 0.0, "no time, no debt");
    }
}
