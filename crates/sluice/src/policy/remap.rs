//! Class identity across a config switch. A class's id is its index in the
//! class list, and a reload or a discovered service changes the list: every
//! part that keeps state per class (the gate's counters and buckets, the
//! tick's controller, budget and fairness, the statistics' history) carries
//! it over through one `ClassRemap`, built once per switch: by class name,
//! and a class renamed (services grouped once there are too many for a class
//! each, a config that renames a class) by the service ports it keeps, so
//! state follows the service (protocol and port), not the name.
use crate::policy::config::{Config, Proto, Rule};

/// Where each class of a new list was in the old one (None: a new class).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassRemap {
    old_of: Vec<Option<usize>>,
}

impl ClassRemap {
    /// Match the new names to the old by name.
    pub fn between<A: AsRef<str>, B: AsRef<str>>(old: &[A], new: &[B]) -> ClassRemap {
        let old_of = new.iter().map(|n| old.iter().position(|o| o.as_ref() == n.as_ref())).collect();
        ClassRemap { old_of }
    }

    /// The remap from one config's classes to another's: by name, then each
    /// new class no old one names takes the state of the old class, no
    /// longer named, whose port rules it shares most (the default classes
    /// match only each other, by name).
    pub fn of(old: &Config, new: &Config) -> ClassRemap {
        let mut remap = ClassRemap::between(&old.names(), &new.names());
        let mut heirless: Vec<usize> =
            (0..old.classes.len()).filter(|&o| o != old.default_class && !remap.old_of.contains(&Some(o))).collect();
        for (n, c) in new.classes.iter().enumerate() {
            if remap.old_of[n].is_some() || n == new.default_class {
                continue;
            }
            let shared = |o: &usize| shared_rules(&old.classes[*o].rules, &c.rules);
            let best = heirless.iter().copied().filter(|o| shared(o) > 0).max_by_key(|o| (shared(o), usize::MAX - o));
            if let Some(o) = best {
                remap.old_of[n] = Some(o);
                heirless.retain(|&h| h != o);
            }
        }
        remap
    }

    /// The old id of new class `new` (None: new, or out of range).
    pub fn old_of(&self, new: usize) -> Option<usize> {
        self.old_of.get(new).copied().flatten()
    }

    /// Classes in the new list.
    pub fn len(&self) -> usize {
        self.old_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.old_of.is_empty()
    }

    /// Each new class's item from `old` (taken, by old id), a default one for new classes.
    pub fn carry<T: Default>(&self, mut old: Vec<T>) -> Vec<T> {
        self.old_of.iter().map(|o| o.and_then(|i| old.get_mut(i)).map(std::mem::take).unwrap_or_default()).collect()
    }

    /// As `carry`, by reference: each new class's item cloned from `old`, `new` for new classes.
    pub fn carry_or<T: Clone>(&self, old: &[T], new: impl Fn() -> T) -> Vec<T> {
        self.old_of.iter().map(|o| o.and_then(|i| old.get(i)).cloned().unwrap_or_else(&new)).collect()
    }
}

/// How many pairs of rules, one from each list, take packets of a port in
/// common (same protocol, overlapping port ranges, the same source prefix).
/// Rules for any port match nothing here: they say nothing of a service.
fn shared_rules(a: &[Rule], b: &[Rule]) -> usize {
    let overlap = |x: &Rule, y: &Rule| {
        let proto = x.proto == y.proto || x.proto == Proto::Any || y.proto == Proto::Any;
        let ports = matches!((x.ports, y.ports), (Some((a, b)), Some((c, d))) if a <= d && c <= b);
        proto && ports && x.src == y.src
    };
    a.iter().map(|x| b.iter().filter(|y| overlap(x, y)).count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::from_flags;

    /// Issue 49, item 1: services grouped under a new name (too many for a
    /// class each) keep their state: it follows the ports, not the name.
    #[test]
    fn a_renamed_class_is_matched_by_the_ports_it_keeps() {
        let old = from_flags(&["nsd:match=udp:53".into(), "web:match=tcp:80".into()]).unwrap();
        let new = from_flags(&[
            "ssh:match=tcp:22".into(),
            "nsd_all:match=udp:53,match=udp:5353".into(),
            "web:match=tcp:80".into(),
        ])
        .unwrap();
        let r = ClassRemap::of(&old, &new);
        assert_eq!((0..4).map(|i| r.old_of(i)).collect::<Vec<_>>(), [None, Some(0), Some(1), Some(2)]);
        // Nothing in common, or another protocol: a new class.
        let other = from_flags(&["dns:match=tcp:53".into()]).unwrap();
        assert_eq!(ClassRemap::of(&old, &other).old_of(0), None);
        // An old class is heir to one new class at most, the first that shares most.
        let split = from_flags(&["a:match=udp:53".into(), "b:match=udp:53".into()]).unwrap();
        let r = ClassRemap::of(&old, &split);
        assert_eq!((r.old_of(0), r.old_of(1)), (Some(0), None));
    }

    #[test]
    fn classes_are_matched_by_name_and_new_ones_start_empty() {
        let r = ClassRemap::between(&["a", "b", "default"], &["b", "new", "a", "default"]);
        assert_eq!((0..4).map(|i| r.old_of(i)).collect::<Vec<_>>(), [Some(1), None, Some(0), Some(2)]);
        assert_eq!(r.old_of(9), None);
        assert_eq!(r.carry(vec![10, 20, 30]), [20, 0, 10, 30]);
        assert_eq!(r.carry_or(&[10, 20, 30], || 7), [20, 7, 10, 30]);
        assert_eq!(r.carry(vec![10]), [0, 0, 10, 0], "an old list shorter than the names");
    }
}
