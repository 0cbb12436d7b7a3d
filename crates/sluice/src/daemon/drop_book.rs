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
            }
        }
        Ok(())
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
