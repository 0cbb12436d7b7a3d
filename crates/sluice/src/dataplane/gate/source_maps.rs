//! The per-source maps: "sources" (unknown sources' counts and pace, a
//! direct-mapped table: sluice.h, `struct sluice_src_slot`) and "known" (the
//! clients the service answered), with each class's part of the known map
//! (`known_part`: the learner's room, and whether the gate looks the class's
//! sources up at all).
use std::os::fd::{AsFd, AsRawFd};

use super::*;
use crate::bpf_intf::sluice_src_slot;

/// The slot of `key` in a "sources" table of `mask` + 1 slots whose seed is
/// `seed`: sources.h's peer_hash (the MurmurHash3 finaliser of the key's
/// class, family and first 8 address bytes, seeded), masked.
pub fn slot_of(key: &sluice_src_key, seed: u64, mask: u32) -> u32 {
    let addr = u64::from_ne_bytes(key.addr[..8].try_into().expect("8 bytes"));
    let mut h = addr ^ ((key.class_id as u64) << 8 | key.family as u64) ^ seed;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51afd7ed558ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ceb9fe1a85ec53);
    h ^= h >> 33;
    h as u32 & mask
}

/// The sources a read of the "sources" table found: its occupied slots
/// (keys by class id, as the gate writes them). The table is mapped
/// read-only (BPF_F_MMAPABLE) for the read and each slot copied out with a
/// volatile read: a walk of memory, where a batched lookup copied every
/// slot through the kernel (1M slots: 250-280 ms). The gate writes a slot
/// while it is read, so a slot may be read half old, half new: its
/// counts are off by a packet, or its key and counts belong to two
/// sources for one scan.
pub fn occupied_sources(map: &dyn MapCore) -> Result<Vec<(sluice_src_key, sluice_src)>> {
    let err = |e: std::io::Error| GateError::Map { map: "sources", err: e.into() };
    let slots = map.max_entries() as usize;
    if map.value_size() as usize != std::mem::size_of::<sluice_src_slot>() {
        return Err(err(std::io::Error::other("value size differs from the header")));
    }
    let mapping = super::maps::Mapping::of(map, "sources", false)?;
    let mut out = Vec::new();
    for i in 0..slots {
        let s: sluice_src_slot = mapping.read(i);
        if s.key.family != 0 {
            out.push((s.key, s.v));
        }
    }
    Ok(out)
}

/// Entries written or deleted in one syscall (the batch calls).
const BATCH: usize = 4096;

/// Entries of the known map.
pub type KnownEntries = Vec<(sluice_src_key, sluice_known)>;

impl Gate {
    /// Slots of the "sources" table: the sources it holds at most.
    pub fn sources_capacity(&self) -> u32 {
        self.skel.maps.sources.max_entries()
    }

    /// Every source the "sources" table holds (`occupied_sources`).
    /// Keys carry class indexes (NO_CLASS: an id no class holds).
    pub fn sources(&self) -> Result<Vec<(sluice_src_key, sluice_src)>> {
        let mut entries = occupied_sources(&self.skel.maps.sources)?;
        self.ids.index().to_classes(&mut entries);
        Ok(entries)
    }

    /// Every entry of the "known" map, keys by class index (NO_CLASS: an id no class holds).
    pub fn known(&self) -> Result<Vec<(sluice_src_key, sluice_known)>> {
        self.dump(&self.skel.maps.known, "known")
    }

    /// The known entries of the classes the last applies removed, taken
    /// out of the map: the entries (their keys' class_id indexes the
    /// names) and the classes' names. Nothing to take: no map read.
    pub fn take_freed_known(&mut self) -> Result<(KnownEntries, Vec<String>)> {
        if self.freed.is_empty() {
            return Ok((vec![], vec![]));
        }
        let freed = std::mem::take(&mut self.freed);
        let raw: KnownEntries = dump_map(&self.skel.maps.known, "known")?;
        let (mut keys, mut taken) = (Vec::new(), Vec::new());
        for (k, v) in raw {
            // An id freed and given again since is a class in force now: its entries stay.
            let Some(id) = GateId::from_key(u32::from(k.class_id)) else { continue };
            if self.ids.class_of(id).is_some() {
                continue;
            }
            if let Some(at) = freed.iter().position(|(freed, _)| *freed == id) {
                keys.push(k);
                taken.push((sluice_src_key { class_id: at as u8, ..k }, v));
            }
        }
        self.delete_raw_known(&keys)?;
        Ok((taken, freed.into_iter().map(|(_, name)| name).collect()))
    }

    /// Add (or overwrite) known sources: the daemon restoring its state
    /// file, or re-keying the map for a new class list. BATCH entries a
    /// syscall (bpf_map_update_batch): 59k entries were 59k syscalls on the
    /// control thread.
    pub fn insert_known(&self, entries: &[(sluice_src_key, sluice_known)]) -> Result<()> {
        // By class index, as given (the map's keys carry the ids).
        let mut added = std::collections::BTreeMap::<usize, u64>::new();
        for (k, _) in entries {
            *added.entry(k.class_id as usize).or_default() += 1;
        }
        let entries: Vec<_> = entries.iter().map(|(k, v)| (self.key_by_id(k), *v)).collect();
        for chunk in entries.chunks(BATCH) {
            let keys: Vec<u8> = chunk.iter().flat_map(|(k, _)| bytes_of(k).to_vec()).collect();
            let values: Vec<u8> = chunk.iter().flat_map(|(_, v)| bytes_of(v).to_vec()).collect();
            self.skel
                .maps
                .known
                .update_batch(&keys, &values, chunk.len() as u32, MapFlags::ANY, MapFlags::ANY)
                .map_err(|err| GateError::Map { map: "known", err })?;
        }
        // Count them in held at once, so the gate looks them up before the
        // next scan writes the exact count (a replaced entry counts twice
        // until then: held only says whether to look).
        for (class, n) in added {
            let p = self.known_part(class)?;
            self.set_known_part(class, sluice_known_part { held: p.held + n, ..p })?;
        }
        Ok(())
    }

    /// Write `n` IPv4 sources of `class` (11.0.0.0 and up, counted in
    /// `epoch`) into their slots of the sources table, as the gate would
    /// (a later one takes the slot of an earlier one it shares it with):
    /// the benchmark of a table under a spoofed flood. Returns how many
    /// slots they hold.
    pub fn fill_sources(&self, class: u8, n: u32, epoch: u32) -> Result<u32> {
        let (seed, mask) = self.slot_hash();
        let class_id = self.ids.id(class as usize).byte();
        // Which slots hold a source (a bit each): the count returned.
        let mut taken = vec![0u64; (mask as usize + 1).div_ceil(64)];
        for start in (0..n).step_by(65_536) {
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for i in start..n.min(start + 65_536) {
                let mut addr = [0u8; 16];
                addr[..4].copy_from_slice(&(0x0b00_0000u32 + i).to_be_bytes());
                let key = sluice_src_key { class_id, family: 4, plen: 32, addr, ..Default::default() };
                let slot = slot_of(&key, seed, mask);
                taken[slot as usize / 64] |= 1 << (slot % 64);
                let v = sluice_src { epoch, pkts: 1, ..Default::default() };
                keys.extend_from_slice(&slot.to_ne_bytes());
                values.extend_from_slice(bytes_of(&sluice_src_slot { key, v, ..Default::default() }));
            }
            // In order: a later source in a batch takes the slot of an earlier one.
            self.skel
                .maps
                .sources
                .update_batch(&keys, &values, (keys.len() / 4) as u32, MapFlags::ANY, MapFlags::ANY)
                .map_err(|err| GateError::Map { map: "sources", err })?;
        }
        Ok(taken.iter().map(|w| w.count_ones()).sum())
    }

    /// The sources table's seed and mask (`slot_of`), as the gate holds them.
    pub fn slot_hash(&self) -> (u64, u32) {
        let data = self.skel.maps.data_data.as_deref().expect(".data is mmap'ed after load");
        (data.settings.slot_seed, data.settings.sources_mask)
    }

    /// Kernel memory a map of the gate takes (its fdinfo's memlock), bytes.
    pub fn map_memlock(&self, name: &str) -> Option<u64> {
        let map = match name {
            "sources" => &self.skel.maps.sources,
            "known" => &self.skel.maps.known,
            _ => return None,
        };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", map.as_fd().as_raw_fd())).ok()?;
        info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
    }

    /// Entries the "known" map holds at most.
    pub fn known_capacity(&self) -> u32 {
        self.skel.maps.known.max_entries()
    }

    /// `class`'s part of the known map: how many new known clients it may
    /// still make (the learner takes one per new client; 0 or less: it
    /// learns no new one), and how many entries it holds (0: the gate does
    /// not look its sources up).
    pub fn set_known_part(&self, class: usize, part: sluice_known_part) -> Result<()> {
        self.skel
            .maps
            .known_part
            .update(&self.ids.id(class).key().to_ne_bytes(), bytes_of(&part), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "known_part", err })
    }

    /// `class`'s part of the known map as the gate holds it now.
    pub fn known_part(&self, class: usize) -> Result<sluice_known_part> {
        let v = self
            .skel
            .maps
            .known_part
            .lookup(&self.ids.id(class).key().to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "known_part", err })?;
        Ok(v.map(|b| from_bytes(&b)).unwrap_or_default())
    }

    /// Set only the room of `class`'s part (its held count stays).
    pub fn set_known_room(&self, class: usize, room: i64) -> Result<()> {
        let held = self.known_part(class)?.held;
        self.set_known_part(class, sluice_known_part { room, held })
    }

    /// Remove these known sources (a class past its part of the map; keys
    /// by class index, as `known` gives them: NO_CLASS keys are skipped).
    pub fn delete_known(&self, keys: &[sluice_src_key]) -> Result<()> {
        let keys: Vec<sluice_src_key> =
            keys.iter().filter(|k| k.class_id != NO_CLASS).map(|k| self.key_by_id(k)).collect();
        self.delete_raw_known(&keys)
    }

    /// A key by class index as the gate's map keys it (by gate id).
    fn key_by_id(&self, k: &sluice_src_key) -> sluice_src_key {
        sluice_src_key { class_id: self.ids.id(k.class_id as usize).byte(), ..*k }
    }

    /// Remove known entries by their keys in the map (by class id).
    fn delete_raw_known(&self, keys: &[sluice_src_key]) -> Result<()> {
        let map = &self.skel.maps.known;
        for chunk in keys.chunks(BATCH) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|k| bytes_of(k).to_vec()).collect();
            // A batch stops at a key that is gone (ENOENT): then one by one.
            if map.delete_batch(&bytes, chunk.len() as u32, MapFlags::ANY, MapFlags::ANY).is_err() {
                for k in chunk {
                    delete_present(map, bytes_of(k)).map_err(|err| GateError::Map { map: "known", err })?;
                }
            }
        }
        Ok(())
    }

    /// Handles of the "sources" and "known" maps (their own fds), for a
    /// reader on another thread (the daemon's source scan).
    pub fn source_maps(&self) -> Result<(libbpf_rs::MapHandle, libbpf_rs::MapHandle)> {
        let handle = |map: &libbpf_rs::Map, name| {
            libbpf_rs::MapHandle::try_from(map).map_err(|err| GateError::Map { map: name, err })
        };
        Ok((handle(&self.skel.maps.sources, "sources")?, handle(&self.skel.maps.known, "known")?))
    }

    /// A per-source map's entries, keys by class index.
    fn dump<V: Pod>(&self, map: &libbpf_rs::Map, name: &'static str) -> Result<Vec<(sluice_src_key, V)>> {
        let mut entries = dump_map(map, name)?;
        self.ids.index().to_classes(&mut entries);
        Ok(entries)
    }
}
