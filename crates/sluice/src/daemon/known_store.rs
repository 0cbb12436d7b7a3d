//! The known sources across restarts and reloads: the state file (read at
//! start, written every minute by the saver's thread and at a stop), the
//! entries of classes not there yet, and each class's part of the gate's
//! known map.
use std::path::PathBuf;

use anyhow::Result;

use crate::base::log;
use crate::bpf_intf::{sluice_known, sluice_known_part, sluice_src_key};
use crate::daemon::tick::KNOWN_TTL_SECS;
use crate::dataplane::gate::{Gate, IdIndex};
use crate::policy::config::{Config, DEFAULT_CLASS};
use crate::signals::known::{self, Known};

/// The config a scan works for: its generation (one per switch), its class
/// count, the classes that learn clients (every class but the default) and
/// those of them that are untrusted (at the untrusted priority), as bits by
/// class index, the known map's capacity, and the gate's ids (the maps'
/// keys carry gate ids: the scan reads them as class indexes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub generation: u64,
    pub classes: usize,
    pub learns: u64,
    pub untrusted: u64,
    pub known_capacity: u32,
    pub ids: IdIndex,
}

impl Shape {
    /// The shape of `cfg`, the `generation`th config in force.
    pub fn of(cfg: &Config, generation: u64, gate: &Gate) -> Shape {
        let mask = |f: &dyn Fn(&crate::policy::config::Class) -> bool| {
            cfg.classes.iter().enumerate().filter(|(_, c)| f(c)).fold(0u64, |m, (i, _)| m | 1u64 << i)
        };
        let untrusted = crate::signals::discover::UNTRUSTED_PRIORITY;
        Shape {
            generation,
            classes: cfg.classes.len(),
            learns: mask(&|c| c.name != DEFAULT_CLASS),
            untrusted: mask(&|c| c.name != DEFAULT_CLASS && c.priority >= untrusted),
            known_capacity: gate.known_capacity(),
            ids: gate.class_ids().index(),
        }
    }

    /// Each class's part of the known map (`known::parts`), by class index.
    pub fn parts(&self) -> Vec<u64> {
        crate::signals::known::parts(self.known_capacity, self.classes, self.learns, self.untrusted)
    }
}

pub(super) struct KnownStore {
    file: PathBuf,
    /// Entries of the state file whose class is not in force (yet).
    pending: Vec<Known>,
    /// Failed writes at a stop (logged at the 1st, 2nd, 4th, ...).
    errors: u64,
    /// Writes the state file off the control thread.
    saver: known::Saver,
}

impl KnownStore {
    /// Read the state file (a file that cannot be read or parsed: none, said in the log).
    pub fn open(file: PathBuf) -> KnownStore {
        let loaded = match known::load(&file) {
            Ok(k) => {
                let (k, refused) = known::validate(k, crate::base::clock::gate_ms());
                log::info(format_args!("known sources: {} read from {}", k.len(), file.display()));
                if refused.total() > 0 {
                    log::warn(format_args!("known sources in {}: {refused}", file.display()));
                }
                k
            }
            Err(e) => {
                log::info(format_args!("known sources: {e}; starting with none"));
                vec![]
            }
        };
        KnownStore { saver: known::Saver::start(file.clone()), file, pending: pending(loaded), errors: 0 }
    }

    /// Entries the state file gave at the start not yet in the gate (all of
    /// them until the first `restore`): none on a first start.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Put known sources in the gate's map for the classes `names` (the
    /// class list in force): the entries of classes the gate removed come
    /// out of its map and wait (`pending`); the pending entries go in once
    /// their class exists. A class that stays keeps its gate id, so its
    /// entries are not touched. Then every class is held to its part (`shape`).
    pub fn restore(&mut self, gate: &mut Gate, names: &[String], shape: Shape) {
        let mut entries = std::mem::take(&mut self.pending);
        let result = (|| -> Result<()> {
            let (removed, removed_names) = gate.take_freed_known()?;
            entries.extend(known::from_map(
                &removed,
                &removed_names,
                crate::base::clock::gate_ms(),
                KNOWN_TTL_SECS * 1000,
            ));
            let (map, later) = known::to_map(std::mem::take(&mut entries), names);
            gate.insert_known(&map)?;
            self.pending = pending(later);
            hold_to_parts(gate, shape)
        })();
        if let Err(e) = result {
            log::warn(format_args!("known sources: could not restore them: {e:#}"));
        }
    }

    /// The entries to save: a read of the gate's known map by class name,
    /// and the pending ones.
    fn entries(&self, map: &[(sluice_src_key, sluice_known)], names: &[String]) -> Vec<Known> {
        let mut all = known::from_map(map, names, crate::base::clock::gate_ms(), KNOWN_TTL_SECS * 1000);
        all.extend(pending(self.pending.clone()));
        all
    }

    /// Hand a read of the known map to the saver's thread (the write and its
    /// fsync happen off the control thread).
    pub fn offer(&mut self, map: &[(sluice_src_key, sluice_known)], names: &[String]) {
        let all = self.entries(map, names);
        _ = self.saver.offer(all);
    }

    /// Write the state file now, on this thread (at a stop, after the
    /// saver's last write; a failure is logged: the gate goes on without it).
    pub fn save(&mut self, gate: &Gate, names: &[String]) {
        self.saver.finish();
        let result = gate
            .known()
            .map_err(anyhow::Error::from)
            .and_then(|map| known::save(&self.file, &self.entries(&map, names)));
        if let Err(e) = result {
            self.errors += 1;
            if self.errors.is_power_of_two() {
                log::warn(format_args!("known sources: not saved ({} times so far): {e:#}", self.errors));
            }
        }
    }
}

/// Pending entries (of classes not in force) as they are kept: within the
/// known TTL, at most as many as the gate's known map holds.
fn pending(entries: Vec<Known>) -> Vec<Known> {
    let max = crate::bpf_intf::SLUICE_KNOWN_ENTRIES as usize;
    known::prune_pending(entries, crate::base::clock::gate_ms(), KNOWN_TTL_SECS * 1000, max)
}

/// Hold every class's part of the known map as a cache (`known::bound`):
/// the entries to delete (aged out, or past the part: candidates, then the
/// known clients answered over the shortest span), and each class's part
/// (room, held).
pub(super) fn bound(
    map: &[(sluice_src_key, sluice_known)],
    shape: Shape,
) -> (Vec<sluice_src_key>, Vec<sluice_known_part>) {
    known::bound(map, &shape.parts(), crate::base::clock::gate_ms(), KNOWN_TTL_SECS * 1000)
}

/// Hold the gate's known map to the parts of `shape` now: delete what is
/// past them, and tell the gate each class's room. The learner adds a
/// client only to a class whose part has room, and only this (at a
/// restore) and a scan's bound write it: a gate whose classes were never
/// held learns nobody. The daemon's start does it; so must anything else
/// that runs the tick on a gate of its own (the bench's rig), once per
/// config.
pub fn hold_to_parts(gate: &Gate, shape: Shape) -> Result<()> {
    let (delete, parts) = bound(&gate.known()?, shape);
    apply_bound(gate, &delete, parts)
}

/// Delete the known entries past their class's part; tell the gate each
/// class's part (the learner's room, and whether to look sources up at all).
pub(super) fn apply_bound(gate: &Gate, delete: &[sluice_src_key], parts: Vec<sluice_known_part>) -> Result<()> {
    gate.delete_known(delete)?;
    for (class, p) in parts.into_iter().enumerate() {
        gate.set_known_part(class, p)?;
    }
    Ok(())
}
