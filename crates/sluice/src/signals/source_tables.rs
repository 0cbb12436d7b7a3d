//! What `status`, the metrics and `sluice sources` show of source fairness
//! (pure: the daemon feeds it the gate's maps and counters).
//!
//! The counts per tick come from the class counters (cheap, every refresh);
//! the table of sources comes from reading the whole "sources" and "known"
//! maps, which the daemon does every SCAN_EVERY, on a thread of its own
//! (`daemon::source_scan`), while some class counts
//! sources.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::bpf_intf::{sluice_known, sluice_src, sluice_src_key};

/// The heaviest droppers kept per class.
pub const TOP_SOURCES: usize = 10;
/// Time between two scans of the maps.
pub const SCAN_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Source fairness of one class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassSources {
    /// The egress learner records the class's answered clients (the class
    /// has been healthy for a second).
    pub learning: bool,
    /// While the class is limited: packets one unknown source may send per
    /// 10 ms epoch (None: not limited, or one unknown source alone, which
    /// has nobody to share with and is not paced).
    pub quota: Option<u32>,
    /// The prefix length IPv4 sources are counted at.
    pub plen4: u8,
    /// The prefix length IPv6 sources are counted at.
    pub plen6: u8,
    /// Distinct unknown sources per epoch, mean over the last second.
    pub active_per_epoch: f64,
    /// Packets/s from known sources.
    pub known_pps: f64,
    /// Packets/s dropped over a source's quota.
    pub share_dropped_pps: f64,
    /// Known sources of the class at the last scan (None: not scanned yet).
    pub known: Option<u64>,
    /// Entries of the sources map the class holds, at the last scan (None: not scanned yet).
    pub tracked: Option<u64>,
    /// The heaviest droppers at the last scan, most drops first.
    pub top: Vec<TopSource>,
    /// The class's entries in the known map at the last scan, known clients
    /// and candidates alike (None: not scanned yet); against `known_part`,
    /// how full its cache is.
    #[serde(default)]
    pub known_held: Option<u64>,
    /// The class's part of the known map: the entries it may hold (`known::bound`; None: not scanned yet).
    #[serde(default)]
    pub known_part: Option<u64>,
}

/// One source prefix and what it lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopSource {
    /// "ADDR/LEN".
    pub prefix: String,
    /// Packets dropped over its quota since its entry was made (exact up
    /// to 64, then sampled: counted 16 at a time, one packet in 16 on
    /// average, so that a source spread over CPUs does not have each of
    /// them write its slot for every packet).
    pub drops: u64,
    /// Its packets in the last epoch it sent in (exact up to 64, then
    /// sampled as `drops` is).
    pub pkts: u32,
    /// The epoch of those packets (10 ms epochs since the gate was loaded).
    pub epoch: u32,
}

/// The sources map as a whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SourcesMap {
    /// Entries the map holds at most.
    pub capacity: u32,
    /// Entries held at the last scan (None: not scanned yet).
    pub entries: Option<u64>,
    /// Slots taken since the gate was loaded, every class: empty ones, or
    /// held by a source quiet in that epoch (collisions of live sources
    /// are not counted).
    pub inserts: u64,
    /// Entries evicted, as of the last scan (`evictions`; None: not scanned yet).
    pub evictions: Option<u64>,
    /// Known sources (every class), at the last scan.
    pub known: Option<u64>,
    /// How long the last scan took (ms).
    pub scan_ms: Option<f64>,
}

/// The prefix of a map key, as text.
pub fn prefix(k: &sluice_src_key) -> String {
    let ip = match k.family {
        4 => IpAddr::V4(Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3])),
        _ => IpAddr::V6(Ipv6Addr::from(k.addr)),
    };
    format!("{ip}/{}", k.plen)
}

/// Entries evicted from the full map so far, counted at a scan: the
/// inserts (every class, read at the scan) less the entries the map holds,
/// and never fewer than `before` (a removed class takes its inserts along).
pub fn evictions(before: u64, inserts: u64, entries: u64) -> u64 {
    before.max(inserts.saturating_sub(entries))
}

/// Per class: (entries, known, top droppers) from the two maps.
pub fn scan(
    sources: &[(sluice_src_key, sluice_src)],
    known: &[(sluice_src_key, sluice_known)],
    classes: usize,
) -> Vec<(u64, u64, Vec<TopSource>)> {
    combine(scan_sources(sources, classes), &count_known(known, classes))
}

/// Per class: the sources map's entries and its top droppers.
pub fn scan_sources(sources: &[(sluice_src_key, sluice_src)], classes: usize) -> Vec<(u64, Vec<TopSource>)> {
    let mut out: Vec<(u64, Vec<TopSource>)> = vec![(0, vec![]); classes];
    for (k, v) in sources {
        let Some(c) = out.get_mut(k.class_id as usize) else { continue };
        c.0 += 1;
        if v.drops > 0 {
            c.1.push(TopSource { prefix: prefix(k), drops: v.drops, pkts: v.pkts, epoch: v.epoch });
        }
    }
    for c in &mut out {
        c.1.sort_by(|a, b| b.drops.cmp(&a.drops).then_with(|| a.prefix.cmp(&b.prefix)));
        c.1.truncate(TOP_SOURCES);
    }
    out
}

/// Per class: known sources as the gate counts them (answered over
/// SLUICE_KNOWN_SPAN_MS at least).
pub fn count_known(known: &[(sluice_src_key, sluice_known)], classes: usize) -> Vec<u64> {
    let mut out = vec![0; classes];
    for (k, _) in known.iter().filter(|(_, v)| crate::policy::fair::known_span(v.first_ms, v.last_ms)) {
        if let Some(c) = out.get_mut(k.class_id as usize) {
            *c += 1;
        }
    }
    out
}

/// The sources map's summary and the known counts, per class.
pub fn combine(sources: Vec<(u64, Vec<TopSource>)>, known: &[u64]) -> Vec<(u64, u64, Vec<TopSource>)> {
    sources.into_iter().zip(known).map(|((n, top), &k)| (n, k, top)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn evictions_never_go_down() {
        assert_eq!(super::evictions(0, 100, 60), 40);
        assert_eq!(super::evictions(40, 90, 70), 40, "a class (and its inserts) gone: not fewer evictions");
        assert_eq!(super::evictions(40, 200, 100), 100);
    }

    use super::*;

    fn key(class: u8, a: [u8; 4], plen: u8) -> sluice_src_key {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&a);
        sluice_src_key { class_id: class, family: 4, plen, addr, ..Default::default() }
    }

    #[test]
    fn the_scan_counts_per_class_and_keeps_the_heaviest_droppers_first() {
        let mut sources: Vec<_> = (0..30u8)
            .map(|i| {
                (
                    key(1, [10, 0, 0, i], 32),
                    sluice_src { epoch: 5, pkts: 3, drops: i as u64 * 10, ..Default::default() },
                )
            })
            .collect();
        sources.push((key(2, [192, 0, 2, 0], 24), sluice_src { epoch: 5, pkts: 1, ..Default::default() }));
        sources.push((key(63, [1, 2, 3, 4], 32), sluice_src::default()));
        let known = vec![
            (key(1, [198, 51, 100, 1], 32), sluice_known { first_ms: 10_000, last_ms: 12_000, ..Default::default() }),
            (key(1, [198, 51, 100, 2], 32), sluice_known { first_ms: 12_000, last_ms: 12_500, ..Default::default() }),
        ];
        let s = scan(&sources, &known, 3);
        assert_eq!((s[1].0, s[1].1, s[2].0, s[2].1), (30, 1, 1, 0));
        assert_eq!(s[1].2.len(), TOP_SOURCES);
        assert_eq!(s[1].2[0].prefix, "10.0.0.29/32");
        assert_eq!(s[1].2[0].drops, 290);
        assert!(s[2].2.is_empty(), "a source that lost nothing is not a top dropper");
        assert_eq!(prefix(&key(0, [192, 0, 2, 0], 24)), "192.0.2.0/24");
    }
}
