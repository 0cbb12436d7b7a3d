//! The gate's class ids: which id each class of the config in force holds.
//!
//! Everywhere above the gate a class is its index in the config's class
//! list, and that list changes at a reload (discovery finds a service, a
//! file adds a class). The gate's maps are indexed by an id of their own
//! (sluice.h, SLUICE_CLASS_IDS) that a class keeps while it exists, so a
//! reload moves no entry of any map, the known map included:
//!
//! - a class that stays keeps its id: by name, or renamed, by the service
//!   ports it keeps (`policy::remap`: grouping services under a new name
//!   must not reset their counters, buckets and known clients);
//! - a new class takes a free id: one no class in force holds, the one freed
//!   longest ago first (ids never used come first), so packets still on the
//!   old tables never reach a new class through an id their tables name;
//! - a removed class's id is free once the new config is in force.
//!
//! A config has at most SLUICE_MAX_CLASSES classes and there are twice as
//! many ids, so a new class always finds one. `Gate` translates at its
//! boundary: its per-class calls take class indexes, and the keys of the
//! per-source maps it hands out carry class indexes (NO_CLASS: an id no
//! class holds).
use std::collections::VecDeque;

use crate::bpf_intf::{sluice_src_key, SLUICE_CLASS_IDS};
use crate::policy::remap::ClassRemap;

/// A key's class for an id no class in force holds.
pub const NO_CLASS: u8 = u8::MAX;

/// A class's id in the gate's maps (below SLUICE_CLASS_IDS): what a map key
/// or a kernel record carries. Not a class index, which is what every
/// layer above the gate means by a class (its place in the config's list):
/// `ClassIds` turns one into the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GateId(u8);

impl GateId {
    /// The id as the maps' u32 keys take it.
    pub fn key(self) -> u32 {
        u32::from(self.0)
    }

    /// The id as a key's or a cell's u8 `class_id` field holds it.
    pub fn byte(self) -> u8 {
        self.0
    }

    /// The id a kernel record carries (the tracer's counts, a map key),
    /// None past SLUICE_CLASS_IDS.
    pub fn from_key(key: u32) -> Option<GateId> {
        (key < SLUICE_CLASS_IDS).then_some(GateId(key as u8))
    }
}

const IDS: usize = SLUICE_CLASS_IDS as usize;

/// The ids of the classes in force, and the free ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassIds {
    /// By class index: its id.
    ids: Vec<GateId>,
    /// By id: the name of the class that holds it (None: free).
    names: Vec<Option<String>>,
    /// The free ids, the next to give first.
    free: VecDeque<GateId>,
}

impl Default for ClassIds {
    fn default() -> Self {
        ClassIds { ids: vec![], names: vec![None; IDS], free: (0..IDS as u8).map(GateId).collect() }
    }
}

impl ClassIds {
    /// The ids for the class list `names` (no two alike; at most
    /// SLUICE_MAX_CLASSES), where `remap` says which class of the list in
    /// force each one was, and the ids it frees with their classes' names.
    pub fn next(&self, names: &[&str], remap: &ClassRemap) -> (ClassIds, Vec<(GateId, String)>) {
        let mut next = ClassIds { ids: Vec::with_capacity(names.len()), ..self.clone() };
        for (class, name) in names.iter().enumerate() {
            let id = match remap.old_of(class).and_then(|o| self.ids.get(o)) {
                Some(&id) => id,
                None => next.free.pop_front().expect("a config has at most half as many classes as there are ids"),
            };
            next.names[id.0 as usize] = Some(name.to_string());
            next.ids.push(id);
        }
        let mut freed = Vec::new();
        for &id in &self.ids {
            if !next.ids.contains(&id) {
                let name = next.names[id.0 as usize].take().expect("a held id has a name");
                next.free.push_back(id);
                freed.push((id, name));
            }
        }
        (next, freed)
    }

    /// As `next`, matching the classes by name alone.
    pub fn next_by_name(&self, names: &[&str]) -> (ClassIds, Vec<(GateId, String)>) {
        let held: Vec<&str> =
            self.ids.iter().map(|&id| self.names[id.0 as usize].as_deref().unwrap_or_default()).collect();
        self.next(names, &ClassRemap::between(&held, names))
    }

    /// The id of class `class`. An index past the list is its own id: a gate
    /// no config was applied to yet (tests and benchmarks set up its maps
    /// directly).
    pub fn id(&self, class: usize) -> GateId {
        self.ids.get(class).copied().unwrap_or(GateId(class as u8))
    }

    /// The class index holding `id`, if any.
    pub fn class_of(&self, id: GateId) -> Option<usize> {
        self.ids.iter().position(|&i| i == id)
    }

    /// The class names by id ("" where no class holds the id).
    pub fn names_by_id(&self) -> Vec<String> {
        self.names.iter().map(|n| n.clone().unwrap_or_default()).collect()
    }

    /// Id to class index, for readers without the list (NO_CLASS: none).
    pub fn index(&self) -> IdIndex {
        let mut to = [NO_CLASS; IDS];
        for (class, &id) in self.ids.iter().enumerate() {
            to[id.0 as usize] = class as u8;
        }
        // Before any config, an id is its own index (as `id`).
        if self.ids.is_empty() {
            to.iter_mut().enumerate().for_each(|(i, c)| *c = i as u8);
        }
        IdIndex(to)
    }
}

/// Id to class index (NO_CLASS: no class holds the id), by value: the source
/// scan's thread carries it with the config it scans for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdIndex([u8; IDS]);

impl IdIndex {
    /// Rewrite each key's class id as its class index.
    pub fn to_classes<V>(&self, entries: &mut [(sluice_src_key, V)]) {
        for (k, _) in entries {
            k.class_id = self.0.get(k.class_id as usize).copied().unwrap_or(NO_CLASS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_keeps_its_id_and_a_new_one_takes_a_free_id() {
        let (a, freed) = ClassIds::default().next_by_name(&["x", "y", "z"]);
        assert!(freed.is_empty());
        assert_eq!((a.id(0).key(), a.id(1).key(), a.id(2).key()), (0, 1, 2), "the first config's ids are its indexes");
        // "w" comes first, "y" goes: x and z keep their ids though their indexes move.
        let (b, freed) = a.next_by_name(&["w", "x", "z"]);
        assert_eq!(freed, vec![(GateId(1), "y".to_string())]);
        assert_eq!((b.id(1).key(), b.id(2).key()), (0, 2));
        assert_eq!(b.id(0).key(), 3, "a new class takes an id no class of the old config held");
        assert_eq!(b.class_of(GateId(2)), Some(2));
        assert_eq!(b.class_of(GateId(1)), None);
        // The freed id is given only after the never-used ones.
        let (c, _) = b.next_by_name(&["w", "x", "z", "v"]);
        assert_eq!(c.id(3).key(), 4);
    }

    #[test]
    fn a_renamed_class_keeps_its_id() {
        let flags =
            |f: &[&str]| crate::policy::config::from_flags(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let old = flags(&["x:match=udp:1", "y:match=udp:2"]).unwrap();
        let (a, _) = ClassIds::default().next_by_name(&old.names());
        // "y" is now "y2" with the same port; "x" went.
        let new = flags(&["fresh:match=udp:3", "y2:match=udp:2"]).unwrap();
        let (b, freed) = a.next(&new.names(), &ClassRemap::of(&old, &new));
        assert_eq!(freed, vec![(GateId(0), "x".to_string())]);
        assert_eq!(b.id(1).key(), 1, "the renamed class holds y's id");
        assert_eq!(b.names_by_id()[1], "y2");
        assert_eq!(b.id(0).key(), 3, "a new class takes a never-used id");
    }

    #[test]
    fn ids_never_run_out_while_classes_churn() {
        let mut ids = ClassIds::default();
        let max = crate::bpf_intf::SLUICE_MAX_CLASSES as usize;
        for round in 0..10 {
            let names: Vec<String> = (0..max).map(|i| format!("c{round}-{i}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let (next, freed) = ids.next_by_name(&refs);
            assert_eq!(freed.len(), if round == 0 { 0 } else { max });
            let old: Vec<u32> = (0..ids.ids.len()).map(|c| ids.id(c).key()).collect();
            assert!((0..max).all(|c| !old.contains(&next.id(c).key())), "no new class takes an id in force");
            ids = next;
        }
    }

    #[test]
    fn keys_are_translated_to_class_indexes() {
        let (a, _) = ClassIds::default().next_by_name(&["x", "y"]);
        let (b, _) = a.next_by_name(&["y", "new"]);
        let key = |class_id| sluice_src_key { class_id, ..Default::default() };
        let mut entries = vec![(key(0), ()), (key(1), ()), (key(2), ())];
        b.index().to_classes(&mut entries);
        let classes: Vec<u8> = entries.iter().map(|(k, _)| k.class_id).collect();
        assert_eq!(classes, vec![NO_CLASS, 0, 1], "x's id is free, y is class 0, new class 1 took id 2");
    }
}
