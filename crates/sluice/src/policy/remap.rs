//! Class identity across a config switch. A class's id is its index in the
//! class list, and a reload or a discovered service changes the list: every
//! part that keeps state per class (the gate's counters and buckets, the
//! tick's controller, budget and fairness, the statistics' history) carries
//! it over by class name through one `ClassRemap`, built once per switch.
use crate::policy::config::Config;

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

    /// The remap from one config's classes to another's.
    pub fn of(old: &Config, new: &Config) -> ClassRemap {
        ClassRemap::between(&old.names(), &new.names())
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

#[cfg(test)]
mod tests {
    use super::*;

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
