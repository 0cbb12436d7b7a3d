//! When the gate answers a TCP class's SYNs itself (SYN cookies at the
//! driver; bpf/syncookie.h has the mechanism). With `syn_cookies = "auto"`
//! (the default) a class's guard engages while its listeners are under SYN
//! pressure and SYNs arrive fast, and lets go once the SYNs it answers come
//! back as connections again (or stop) for RELEASE_SECS; "on" answers
//! always, "off" never. Nobody configured anything: every TCP class is
//! "auto", and a host whose listeners never overflow never sees the gate
//! answer a SYN.
//!
//! Pressure is what the kernel shows for the class's listeners: it sent
//! SYN cookies (TcpExt SyncookiesSent), a listen queue overflowed or dropped
//! (ListenOverflows, ListenDrops), or an accept queue stands
//! (`health::syn_pressure`). Once the gate answers, the kernel sees no SYN
//! and shows no pressure; the gate's own counters then say whether the flood
//! goes on: a flood's SYNs (spoofed) never come back with a valid cookie.
use crate::bpf_intf::{
    sluice_syn_guard, SLUICE_COOKIE_SLOT_MS, SLUICE_CS_COOKIE_OK, SLUICE_CS_SYNACK_PKTS, SLUICE_CS_SYN_PKTS,
};
use crate::config::{Config, SynCookies};
use crate::gate::ClassCounters;

/// A class whose listeners are under pressure has the gate answer its SYNs
/// once they arrive at least this fast: a listener's SYN queue holds its
/// backlog (128 to 4096), so slower SYNs are a busy service, not a flood.
pub const ENGAGE_SYNS_PER_SEC: f64 = 1000.0;
/// While answering, a tick is a flood's if the gate answered at least
/// ENGAGE_SYNS_PER_SEC and fewer than one SYN in FLOOD_RATIO came back as a
/// connection (an ACK with a valid cookie).
pub const FLOOD_RATIO: u64 = 2;
/// The guard lets go after this long with neither pressure nor a flood.
pub const RELEASE_SECS: f64 = 5.0;
/// The checker keeps looking at ACKs this long after the last answer: a
/// cookie is valid in its slot and the next.
pub const CHECK_MS: u64 = 2 * SLUICE_COOKIE_SLOT_MS as u64;

/// What one tick saw of a class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GuardTick {
    /// SYNs that reached the class, SYNs the gate answered, valid cookies back.
    pub syns: u64,
    pub answered: u64,
    pub valid: u64,
    /// The kernel showed SYN pressure on the class's listeners.
    pub pressure: bool,
    /// The tick's length, s.
    pub dt: f64,
}

/// One class's guard.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassGuard {
    pub name: String,
    policy: SynCookies,
    /// The class matches TCP ports ("auto" guards only those).
    tcp: bool,
    answering: bool,
    /// Seconds with neither pressure nor a flood while answering.
    calm_secs: f64,
    /// The gate's counters at the last tick: SYNs, answered, valid.
    last: Option<[u64; 3]>,
    /// What was last written to the gate: (answer, check_until_ms).
    written: Option<(bool, u64)>,
}

impl ClassGuard {
    pub fn new(name: &str, policy: SynCookies, tcp: bool) -> ClassGuard {
        ClassGuard { name: name.into(), policy, tcp, answering: false, calm_secs: 0.0, last: None, written: None }
    }

    pub fn answering(&self) -> bool {
        self.answering
    }

    /// One tick: whether the gate answers the class's SYNs from now on.
    pub fn step(&mut self, t: &GuardTick) -> bool {
        self.answering = match self.policy {
            SynCookies::On => true,
            SynCookies::Off => false,
            SynCookies::Auto if !self.tcp => false,
            SynCookies::Auto => self.auto(t),
        };
        self.answering
    }

    fn auto(&mut self, t: &GuardTick) -> bool {
        let dt = t.dt.max(1e-4);
        if !self.answering {
            self.calm_secs = 0.0;
            return t.pressure && t.syns as f64 / dt >= ENGAGE_SYNS_PER_SEC;
        }
        let flood = t.answered as f64 / dt >= ENGAGE_SYNS_PER_SEC && t.answered > FLOOD_RATIO * t.valid;
        if flood || t.pressure {
            self.calm_secs = 0.0;
            return true;
        }
        self.calm_secs += dt;
        self.calm_secs + 1e-9 < RELEASE_SECS // 1e-9: a sum of ticks falls short of a whole second
    }

    /// This tick's SYNs, answers and valid cookies from the gate's counters.
    fn counts(&mut self, raw: &ClassCounters) -> (u64, u64, u64) {
        let now = [SLUICE_CS_SYN_PKTS, SLUICE_CS_SYNACK_PKTS, SLUICE_CS_COOKIE_OK].map(|i| raw[i as usize]);
        let last = self.last.replace(now).unwrap_or(now);
        (now[0].saturating_sub(last[0]), now[1].saturating_sub(last[1]), now[2].saturating_sub(last[2]))
    }

    /// The guard to write to the gate at `now_ms`, if it changed: answering
    /// refreshes the checking time at most once a second.
    fn due_write(&mut self, now_ms: u64) -> Option<sluice_syn_guard> {
        let until = match (self.answering, self.written) {
            (true, Some((true, until))) if until >= now_ms + CHECK_MS - 1000 => return None,
            (true, _) => now_ms + CHECK_MS,
            (false, Some((false, _))) => return None,
            (false, Some((true, until))) => until,
            (false, None) => 0,
        };
        self.written = Some((self.answering, until));
        Some(sluice_syn_guard { answer: u32::from(self.answering), check_until_ms: until, ..Default::default() })
    }
}

/// Every class's guard, by class id.
#[derive(Debug, Clone, Default)]
pub struct SynGuards {
    pub classes: Vec<ClassGuard>,
}

impl SynGuards {
    pub fn new(cfg: &Config) -> SynGuards {
        let classes = cfg.classes.iter().map(|c| ClassGuard::new(&c.name, c.syn_cookies, !c.tcp_ports().is_empty()));
        SynGuards { classes: classes.collect() }
    }

    /// Each class's guard for status (by class id): those with TCP ports or
    /// `syn_cookies = "on"`. `available`: the gate can answer SYNs.
    pub fn status(&self, available: bool) -> Vec<Option<crate::stats::SynGuardStatus>> {
        self.classes
            .iter()
            .map(|c| {
                (c.tcp || c.policy == SynCookies::On).then(|| crate::stats::SynGuardStatus {
                    policy: c.policy.name().into(),
                    answering: c.answering && available,
                    available,
                })
            })
            .collect()
    }

    /// Take over `old`'s state by class name; every guard is written again
    /// (class ids may have moved in the gate's map).
    pub fn carry_from(&mut self, old: &SynGuards) {
        for c in &mut self.classes {
            if let Some(o) = old.classes.iter().find(|o| o.name == c.name) {
                c.answering = o.answering;
                c.calm_secs = o.calm_secs;
                c.last = o.last;
            }
        }
    }

    /// One tick: `raw` the gate's counters and `pressure` the kernel's, by
    /// class id. Returns the guards to write to the gate.
    pub fn tick(
        &mut self,
        raw: &[ClassCounters],
        pressure: &[bool],
        dt: f64,
        now_ms: u64,
    ) -> Vec<(usize, sluice_syn_guard)> {
        let mut writes = Vec::new();
        for (id, c) in self.classes.iter_mut().enumerate() {
            let Some(r) = raw.get(id) else { continue };
            let (syns, answered, valid) = c.counts(r);
            let pressure = pressure.get(id).copied().unwrap_or(false);
            c.step(&GuardTick { syns, answered, valid, pressure, dt });
            if let Some(g) = c.due_write(now_ms) {
                writes.push((id, g));
            }
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: f64 = 0.01;

    fn tick(syns: u64, answered: u64, valid: u64, pressure: bool) -> GuardTick {
        GuardTick { syns, answered, valid, pressure, dt: TICK }
    }

    #[test]
    fn auto_engages_on_pressure_with_fast_syns_only() {
        let mut g = ClassGuard::new("web", SynCookies::Auto, true);
        assert!(!g.step(&tick(1000, 0, 0, false)), "fast SYNs, listeners fine: the kernel answers");
        assert!(!g.step(&tick(5, 0, 0, true)), "pressure at 500 SYNs/s: a busy service, not a flood");
        assert!(g.step(&tick(10, 0, 0, true)), "pressure at 1000 SYNs/s: the gate answers");
        let mut udp = ClassGuard::new("dns", SynCookies::Auto, false);
        assert!(!udp.step(&tick(1000, 0, 0, true)), "a class without TCP ports never");
    }

    #[test]
    fn auto_holds_through_a_flood_and_lets_go_after_calm() {
        let mut g = ClassGuard::new("web", SynCookies::Auto, true);
        g.step(&tick(100, 0, 0, true));
        // The kernel sees no SYN now (no pressure); the gate answers a flood.
        for _ in 0..1000 {
            assert!(g.step(&tick(1000, 1000, 10, false)), "a flood: held");
        }
        // Clients only: most SYNs come back as connections.
        let calm_ticks = (RELEASE_SECS / TICK) as usize;
        for i in 0..calm_ticks - 1 {
            assert!(g.step(&tick(50, 50, 45, false)), "calm for {i} ticks: held");
        }
        assert!(!g.step(&tick(50, 50, 45, false)), "calm for RELEASE_SECS: released");
        assert!(!g.step(&tick(50, 0, 0, false)), "and stays off without pressure");
    }

    #[test]
    fn on_and_off_ignore_the_signals() {
        let mut on = ClassGuard::new("a", SynCookies::On, false);
        let mut off = ClassGuard::new("b", SynCookies::Off, true);
        assert!(on.step(&tick(0, 0, 0, false)));
        assert!(!off.step(&tick(100_000, 0, 0, true)));
    }

    #[test]
    fn the_gate_is_written_on_changes_and_keeps_checking_after_a_release() {
        let mut g = ClassGuard::new("web", SynCookies::Auto, true);
        assert_eq!(g.due_write(1000).map(|w| (w.answer, w.check_until_ms)), Some((0, 0)), "first tick: off");
        assert_eq!(g.due_write(1010), None, "unchanged");
        g.answering = true;
        let w = g.due_write(2000).unwrap();
        assert_eq!((w.answer, w.check_until_ms), (1, 2000 + CHECK_MS));
        assert_eq!(g.due_write(2500), None, "refreshed at most once a second");
        assert_eq!(g.due_write(3001).map(|w| w.check_until_ms), Some(3001 + CHECK_MS));
        g.answering = false;
        let w = g.due_write(4000).unwrap();
        assert_eq!((w.answer, w.check_until_ms), (0, 3001 + CHECK_MS), "cookies out there stay checkable");
    }

    #[test]
    fn counts_are_deltas_of_the_gate_counters() {
        let mut g = ClassGuard::new("web", SynCookies::Auto, true);
        let mut raw: ClassCounters = [0; crate::bpf_intf::SLUICE_CS_NR as usize];
        raw[SLUICE_CS_SYN_PKTS as usize] = 100;
        assert_eq!(g.counts(&raw), (0, 0, 0), "the first read is the baseline");
        raw[SLUICE_CS_SYN_PKTS as usize] = 130;
        raw[SLUICE_CS_SYNACK_PKTS as usize] = 20;
        raw[SLUICE_CS_COOKIE_OK as usize] = 5;
        assert_eq!(g.counts(&raw), (30, 20, 5));
    }
}
