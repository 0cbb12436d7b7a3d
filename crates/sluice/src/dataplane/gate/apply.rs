//! Putting a config in force: the other tables generation written, then
//! one switch (see `Gate::apply`), with the class ids kept by name.
use super::*;
use crate::policy::remap::ClassRemap;

/// The prefix-trie keys of one generation's tables, as bytes.
#[derive(Default)]
pub(super) struct TrieKeys {
    v4: HashSet<Vec<u8>>,
    v6: HashSet<Vec<u8>>,
}

/// A config the gate runs.
pub(super) struct Applied {
    cfg: Config,
}

/// `tables` as generation `gen` of the gate holds them: class ids for class
/// indexes, and the generation in each prefix group.
fn tables_for(tables: &Tables, ids: &ClassIds, gen: u32) -> Tables {
    let group = |g: u32| (u32::from_be(g) | gen << SLUICE_GEN_GROUP_SHIFT).to_be();
    Tables {
        cells: tables
            .cells
            .iter()
            .map(|c| sluice_cell { class_id: ids.id(c.class_id as usize).byte(), ..*c })
            .collect(),
        v4: tables
            .v4
            .iter()
            .map(|(k, c)| (sluice_v4_key { group: group(k.group), ..*k }, ids.id(*c as usize).key()))
            .collect(),
        v6: tables
            .v6
            .iter()
            .map(|(k, c)| (sluice_v6_key { group: group(k.group), ..*k }, ids.id(*c as usize).key()))
            .collect(),
        groups: tables.groups,
    }
}

impl Gate {
    /// Put a config in force: settings, tables, and each class's shares
    /// (even split until arrivals are known). Safe to call again on a
    /// running gate, and atomic for packets:
    ///
    /// - the new tables and settings are written into the generation not in
    ///   force, then one write of `tables_gen` switches to them: a packet is
    ///   classified by the old config or by the new one, never a mix;
    /// - a class keeps its gate id by name, or renamed by its ports
    ///   (`ids.rs`, `policy::remap`), so its counters,
    ///   bucket, fairness, SYN guard and known clients stay where they are,
    ///   wherever the class moves in the list; a new class takes a fresh id
    ///   (zeroed before the switch), a removed class's id is zeroed after it;
    /// - a failure before the switch (a map update refused, for example the
    ///   prefix tries full with both generations' entries) leaves the
    ///   previous config in force, untouched: `GateError::NotApplied`;
    /// - a class whose configured limit is unchanged keeps the limit in force
    ///   (an auto class's controller rate, a budget throttle) until the next
    ///   tick writes it again: a reload does not open it for a tick. A class
    ///   whose limit changed gets its new shares just after the switch (as
    ///   every tick writes them).
    pub fn apply(&mut self, cfg: &Config, tables: &Tables) -> Result<()> {
        let names = cfg.names();
        let remap = match &self.applied {
            Some(old) => ClassRemap::of(&old.cfg, cfg),
            None => ClassRemap::between::<&str, _>(&[], &names),
        };
        let (ids, freed) = self.ids.next(&names, &remap);
        let next = 1 - self.gen;
        // Each class's index in the config in force (None: a new class).
        let was: Vec<Option<usize>> = (0..names.len()).map(|c| self.ids.class_of(ids.id(c))).collect();
        let written = (|| {
            for (class, c) in cfg.classes.iter().enumerate().filter(|(class, _)| was[*class].is_none()) {
                self.reset_id(ids.id(class), &self.fresh_shares(&c.limit))?;
            }
            self.write_generation(next, cfg, &ids, tables)
        })();
        if let Err(err) = written.and_then(|()| self.switch_to(next)) {
            return Err(GateError::NotApplied(Box::new(err)));
        }
        // In force from here on.
        let old = self.applied.replace(Applied { cfg: cfg.clone() });
        self.ids = ids;
        self.freed.extend(freed.iter().cloned());
        let mut after = Ok(());
        for (class, c) in cfg.classes.iter().enumerate() {
            let limit_changed = match (&old, was[class]) {
                (Some(o), Some(at)) => o.cfg.classes[at].limit != c.limit,
                _ => false,
            };
            if limit_changed {
                after = after.and(self.set_shares(class, &self.fresh_shares(&c.limit)));
            }
        }
        let none = vec![sluice_share::default(); self.ncpus];
        for (id, _) in &freed {
            after = after.and(self.reset_id(*id, &none));
        }
        after.map_err(|err| GateError::AfterSwitch(Box::new(err)))
    }

    /// Shares for a class whose arrivals are not known yet.
    fn fresh_shares(&self, limit: &Limit) -> Vec<sluice_share> {
        shares_for(limit, &vec![0; self.ncpus], false)
    }

    /// Zero everything the gate keeps for `id` (a new class's, or a freed
    /// one), and give it `shares`.
    fn reset_id(&self, id: GateId, shares: &[sluice_share]) -> Result<()> {
        let id = id.key();
        self.set_class_state(id, &sluice_class_state::default())?;
        self.states.set_fairness(id, &vec![sluice_fair::default(); self.ncpus]);
        self.states.set_shares(id, shares);
        let key = id.to_ne_bytes();
        let map_err = |map| move |err| GateError::Map { map, err };
        self.skel.maps.away.update(&key, &0u32.to_ne_bytes(), MapFlags::ANY).map_err(map_err("away"))?;
        let part = sluice_known_part::default();
        self.skel.maps.known_part.update(&key, bytes_of(&part), MapFlags::ANY).map_err(map_err("known_part"))?;
        // syn_guard_any stays: a later check time than any guard's only has
        // the checker parse ACKs until then, and the next guard write sets it.
        let guard = sluice_syn_guard::default();
        self.skel.maps.syn_guard.update(&key, bytes_of(&guard), MapFlags::ANY).map_err(map_err("syn_guard"))?;
        // The gate's early check time of the id's old class; the latest of all stays, as syn_guard_any.
        self.skel.maps.syn_early.update(&key, &0u64.to_ne_bytes(), MapFlags::ANY).map_err(map_err("syn_early"))
    }

    /// Write generation `gen` (not in force): `cfg`'s settings and `tables`
    /// with the class ids `ids`. Its trie keys from the last time it was
    /// written go first.
    fn write_generation(&mut self, gen: u32, cfg: &Config, ids: &ClassIds, tables: &Tables) -> Result<()> {
        let tables = tables_for(tables, ids, gen);
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        let v = &mut data.settings.verdicts[gen as usize];
        v.malformed_verdict = match cfg.malformed {
            Verdict::Drop => XDP_DROP,
            Verdict::Pass => XDP_PASS,
        };
        v.default_class = ids.id(cfg.default_class).key();
        v.observe = u32::from(cfg.observe);
        let map_err = |map| move |err| GateError::Map { map, err };
        let stale = std::mem::take(&mut self.tries[gen as usize]);
        for k in &stale.v4 {
            delete_present(&self.skel.maps.prefix_v4, k).map_err(map_err("prefix_v4"))?;
        }
        for k in &stale.v6 {
            delete_present(&self.skel.maps.prefix_v6, k).map_err(map_err("prefix_v6"))?;
        }
        // Recorded before the inserts, so a failure part-way leaves none unrecorded.
        let keys = &mut self.tries[gen as usize];
        keys.v4.extend(tables.v4.iter().map(|(k, _)| bytes_of(k).to_vec()));
        keys.v6.extend(tables.v6.iter().map(|(k, _)| bytes_of(k).to_vec()));
        for (k, class) in &tables.v4 {
            self.skel
                .maps
                .prefix_v4
                .update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("prefix_v4"))?;
        }
        for (k, class) in &tables.v6 {
            self.skel
                .maps
                .prefix_v6
                .update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("prefix_v6"))?;
        }
        self.write_cells(gen, &tables.cells)
    }

    /// Put generation `gen` in force: one write, which every program reads once a packet.
    fn switch_to(&mut self, gen: u32) -> Result<()> {
        self.skel
            .maps
            .tables_gen
            .update(&0u32.to_ne_bytes(), &gen.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "tables_gen", err })?;
        self.gen = gen;
        Ok(())
    }

    /// The gate's ids of the classes in force (`ids.rs`).
    pub fn class_ids(&self) -> &ClassIds {
        &self.ids
    }

    fn write_cells(&self, gen: u32, cells: &[sluice_cell]) -> Result<()> {
        assert_eq!(cells.len(), SLUICE_CELLS as usize);
        let keys: Vec<u8> = (gen * SLUICE_CELLS..(gen + 1) * SLUICE_CELLS).flat_map(u32::to_ne_bytes).collect();
        let values: Vec<u8> = cells.iter().flat_map(|c| bytes_of(c).to_vec()).collect();
        self.skel
            .maps
            .cells
            .update_batch(&keys, &values, SLUICE_CELLS, MapFlags::ANY, MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "cells", err })
    }
}
