//! The kernel's drops after the gate as the daemon reports them: running
//! totals by class name and drop reason, from the tracer's drop counter,
//! and of the known clients' packets lost for want of room (`known_lost`).
use std::collections::BTreeMap;

use anyhow::Result;

use crate::dataplane::trace::Tracer;
use crate::surface::stats::KernelDrop;

/// The daemon's running totals of kernel drops by class name: each read's
/// increase is booked under the names the gate's ids have at that read (an
/// id no class holds: under "", which no class is named).
#[derive(Default)]
pub struct DropBook {
    last: BTreeMap<(u32, u32), u64>,
    totals: BTreeMap<(String, u32), u64>,
    /// The tracer's known_lost counts at the last read (by gate id), and
    /// the totals booked by class name.
    known_last: BTreeMap<u32, u64>,
    known_lost: BTreeMap<String, u64>,
    /// The log of those losses, a line per class at most every KNOWN_LOST_LOG_EVERY.
    known_log: KnownLostLog,
}

/// A class's known clients losing datagrams after the gate is the one
/// loss sluice exists to prevent: the log says when it happens (the
/// journal's time on each line), at most this often per class, with the
/// count since the class's last line.
pub const KNOWN_LOST_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Known-lost counts waiting for their class's next line.
#[derive(Default)]
pub struct KnownLostLog {
    /// By class name: datagrams not yet in a line, and when its last line was.
    pending: BTreeMap<String, (u64, Option<std::time::Instant>)>,
}

impl KnownLostLog {
    /// Note `n` more lost of `class`.
    pub fn note(&mut self, class: &str, n: u64) {
        if n > 0 {
            self.pending.entry(class.to_string()).or_default().0 += n;
        }
    }

    /// The classes due a line at `now` and their counts since their last
    /// line: a class's first loss at once, then at most one line per
    /// KNOWN_LOST_LOG_EVERY.
    pub fn due(&mut self, now: std::time::Instant) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (class, (n, last)) in self.pending.iter_mut() {
            if *n > 0 && last.is_none_or(|t| now.duration_since(t) >= KNOWN_LOST_LOG_EVERY) {
                out.push((class.clone(), std::mem::take(n)));
                *last = Some(now);
            }
        }
        out
    }
}

impl DropBook {
    /// Book what the tracer counted since the last call under `names` (by gate id).
    pub fn update(&mut self, tracer: &Tracer, names: &[String]) -> Result<()> {
        let now = tracer.drop_counts()?;
        for (&(class, reason), &n) in &now {
            let grew = n.saturating_sub(self.last.get(&(class, reason)).copied().unwrap_or(0));
            let name = names.get(class as usize).cloned().unwrap_or_else(|| "unclassified".to_string());
            if grew > 0 {
                *self.totals.entry((name, reason)).or_default() += grew;
            }
        }
        self.last = now;
        let ids = names.iter().enumerate().filter(|(_, n)| !n.is_empty()).map(|(id, _)| id as u32);
        for (id, n) in tracer.known_lost(ids)? {
            let grew = n.saturating_sub(self.known_last.get(&id).copied().unwrap_or(0));
            self.known_last.insert(id, n);
            if grew > 0 {
                *self.known_lost.entry(names[id as usize].clone()).or_default() += grew;
                self.known_log.note(&names[id as usize], grew);
            }
        }
        Ok(())
    }

    /// The known-lost lines due now (`KnownLostLog::due`).
    pub fn known_lost_due(&mut self, now: std::time::Instant) -> Vec<(String, u64)> {
        self.known_log.due(now)
    }

    /// A class's known clients' packets lost for want of room so far.
    pub fn known_lost_of(&self, name: &str) -> u64 {
        self.known_lost.get(name).copied().unwrap_or(0)
    }

    /// A class's drops so far, largest first.
    pub fn of(&self, tracer: &Tracer, name: &str) -> Vec<KernelDrop> {
        let mut v: Vec<KernelDrop> = self
            .totals
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, r), &packets)| KernelDrop::new(tracer.reason_name(*r), packets))
            .collect();
        v.sort_by_key(|d| std::cmp::Reverse(d.packets));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn known_losses_get_a_line_at_once_then_at_most_one_a_second_with_the_count_since() {
        let mut log = KnownLostLog::default();
        let t0 = Instant::now();
        assert!(log.due(t0).is_empty(), "nothing lost: no line");
        log.note("nsd/udp:53", 3);
        assert_eq!(log.due(t0), vec![("nsd/udp:53".to_string(), 3)], "the first loss at once");
        log.note("nsd/udp:53", 2);
        log.note("nsd/udp:53", 4);
        log.note("other", 0);
        assert!(log.due(t0 + Duration::from_millis(500)).is_empty(), "within the second: held");
        assert_eq!(log.due(t0 + Duration::from_secs(1)), vec![("nsd/udp:53".to_string(), 6)], "then the count since");
        assert!(log.due(t0 + Duration::from_secs(5)).is_empty(), "nothing new: no line");
    }
}
