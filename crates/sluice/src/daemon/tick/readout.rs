//! What the tick shows of itself, for status, the metrics and the pace:
//! each class's source fairness, answer judge, distress time, drops with
//! room, offered and seen rates, slow marks, and the budget's view.
use super::*;

/// A class's source fairness as the tick last wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairStatus {
    /// The egress learner records the class's clients.
    pub learning: bool,
    /// Packets per unknown source and epoch, while the class is limited
    /// (`policy::fair::UNPACED`: one source alone).
    pub quota: Option<u32>,
    /// Prefix lengths unknown sources are counted at (IPv4, IPv6).
    pub plens: (u8, u8),
}

impl Ticker {
    /// Whether some class counts its sources now (limited, with source
    /// fairness on): the gate writes the sources map only then.
    pub fn counts_sources(&self) -> bool {
        self.classes.iter().any(|c| c.tiers.as_ref().is_some_and(|t| t.fair.is_some()))
    }

    /// Is some class judged on its answers (a TCP auto class)? Only its
    /// judge reads how busy its service is (`late::busy`).
    pub fn judges_answers(&self) -> bool {
        self.classes.iter().any(|c| c.late.is_some())
    }

    /// Each TCP auto class's judge of its answers (for status; None: not such a class).
    pub fn late_status(&self) -> Vec<Option<crate::surface::stats::LateStatus>> {
        let status = |c: &TickClass| {
            c.late.as_ref().map(|l| {
                let ((window_p90_ms, known_window_p90_ms), (calm_p90_ms, known_calm_p90_ms)) =
                    (l.last_ms(), l.calm_ms());
                crate::surface::stats::LateStatus {
                    window_p90_ms,
                    calm_p90_ms,
                    known_window_p90_ms,
                    known_calm_p90_ms,
                    late: l.late(),
                    slow: l.slow(),
                    rate_pps: c.late_out.rate,
                    known_share: c.fair.calm_known_share(),
                    busy: c.busy(),
                    cpus_busy: c.load.map(|b| b.cpus),
                    own_share: c.load.map(|b| b.own),
                    engagements: Some(l.engagements()),
                }
            })
        };
        self.classes.iter().map(status).collect()
    }

    /// Each class's source fairness as the tick last wrote it (for status).
    pub fn fair_status(&self) -> Vec<FairStatus> {
        self.classes
            .iter()
            .map(|c| match &c.tiers {
                Some(t) => FairStatus {
                    learning: t.learn.is_some(),
                    quota: t.fair.as_ref().map(|f| f.quota),
                    plens: t.fair.as_ref().map_or(crate::policy::fair::PLENS[0], |f| f.plens),
                },
                None => FairStatus { learning: false, quota: None, plens: crate::policy::fair::PLENS[0] },
            })
            .collect()
    }

    /// Seconds each class's service has been in distress (by class index;
    /// None for a class whose health the tick does not read).
    pub fn distress_secs(&self) -> Vec<Option<f64>> {
        let read = self.health.as_ref().map(|h| h.watched()).unwrap_or_default();
        let tick = crate::policy::controller::TICK.as_secs_f64();
        self.classes
            .iter()
            .enumerate()
            .map(|(id, c)| read.contains(&id).then_some(c.distress_ticks as f64 * tick))
            .collect()
    }

    /// Packets the gate dropped while each class's service had room (by
    /// class index; None for a class without UDP sockets the tick reads).
    pub fn dropped_with_room(&self) -> Vec<Option<u64>> {
        let read = self.health.as_ref().map(|h| h.watched()).unwrap_or_default();
        self.classes.iter().enumerate().map(|(id, c)| read.contains(&id).then_some(c.dropped_with_room.total)).collect()
    }

    /// Each class's packets/s offered at the last tick, by class index.
    pub fn offered(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.offered).collect()
    }

    /// Each class's slow mark for the learner's wake (us; 0: none), by
    /// class index: a TCP auto class's `LateAnswers::slow_mark_ms` once it
    /// has a calm.
    pub fn slow_marks_us(&self) -> Vec<u32> {
        let us = |c: &TickClass| {
            c.late.as_ref().and_then(crate::policy::late::LateAnswers::slow_mark_ms).map_or(0, |ms| (ms * 1e3) as u32)
        };
        self.classes.iter().map(us).collect()
    }

    /// Each class's packets seen so far (all CPUs) as of the last tick, by class index.
    pub fn seen(&self) -> Vec<u64> {
        self.classes.iter().map(|c| c.totals.map_or(0, |t| t.seen_pkts)).collect()
    }

    /// The budget's view for status: the highest distressed priority and why,
    /// and each class's throttle by class index.
    pub fn budget_status(&self) -> (Option<(u8, &'static str)>, &[Option<f64>]) {
        (self.budget.distress, &self.budget.limits)
    }

    /// The budget's last distress and how long ago it was seen (None: never).
    pub fn last_distress(&self) -> Option<((u8, &'static str), std::time::Duration)> {
        self.last_distress.map(|(d, at)| (d, at.elapsed()))
    }
}
