//! The known sources' state file: the clients each class's service answered
//! while it was healthy (the gate's "known" map), kept across a restart of
//! the daemon (pure file I/O and conversion; the daemon reads and writes it).
//!
//! One JSON file per interface, `STATE_DIR/known-IFACE.json`, written
//! atomically (a temporary file in the same directory, fsync, rename), so a
//! crash leaves the old file or the new one, never half of one. Entries are
//! stored by class name (class indexes change when services come and go) with
//! wall-clock times, as the gate's map keeps them (`struct sluice_known`):
//! the time the daemon or the host was down ages them, and a reboot does
//! not (monotonic time restarts near 0 at boot; version 1 files kept ages
//! in it). A file that cannot be read or parsed is ignored: the daemon logs
//! why and starts with no known sources.
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bpf_intf::{sluice_known, sluice_known_part, sluice_src_key};
use crate::policy::fair::known_span;

/// Where state files go unless `--state-dir` says otherwise.
pub const STATE_DIR: &str = "/var/lib/sluice";
/// Version of the file's format (2: wall-clock times; 1: ages, read and converted).
pub const VERSION: u32 = 2;

/// One known source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    pub class: String,
    /// The address (IPv4) or the /64 prefix (IPv6, lower 64 bits zero).
    pub addr: IpAddr,
    /// Wall-clock ms (Unix time) of the service's first and last answer to
    /// it (known takes SLUICE_KNOWN_SPAN_MS between them).
    pub first_unix_ms: u64,
    pub last_unix_ms: u64,
    pub answers: u32,
    /// ms of the span when the class's learning was paused and counted none
    /// of its answers (`struct sluice_known`'s paused_ms): its own rate is
    /// its answers over the rest. Files before it have none (0).
    #[serde(default)]
    pub paused_ms: u32,
}

impl Known {
    /// Does the gate take it as a known client (answered over
    /// SLUICE_KNOWN_SPAN_MS at least)? An entry short of that is a candidate:
    /// saved, but given nothing a stranger is not.
    pub fn is_known(&self) -> bool {
        known_span(self.first_unix_ms, self.last_unix_ms)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    /// Unix time the file was written.
    saved_unix: u64,
    sources: Vec<Known>,
}

/// Version 1's entry: ages relative to `saved_unix`.
#[derive(Debug, Deserialize)]
struct KnownV1 {
    class: String,
    addr: IpAddr,
    age_secs: u64,
    #[serde(default)]
    span_secs: u64,
    answers: u32,
}

#[derive(Debug, Deserialize)]
struct StateFileV1 {
    saved_unix: u64,
    sources: Vec<KnownV1>,
}

/// The state file of an interface.
pub fn path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("known-{iface}.json"))
}

/// The gate's known map as entries, with class indexes named by `names`;
/// entries not answered in the last `ttl_ms` before `now_ms` (the gate
/// clock), candidates not answered in the last CANDIDATE_TTL_MS (as
/// `bound` forgets them), and entries of a class that no longer exists are
/// left out.
pub fn from_map(map: &[(sluice_src_key, sluice_known)], names: &[String], now_ms: u64, ttl_ms: u64) -> Vec<Known> {
    map.iter()
        .filter(|(_, v)| age_ms(now_ms, v.last_ms) <= ttl_ms)
        .filter(|(_, v)| known_span(v.first_ms, v.last_ms) || age_ms(now_ms, v.last_ms) <= CANDIDATE_TTL_MS)
        .filter_map(|(k, v)| {
            let class = names.get(k.class_id as usize)?.clone();
            let addr = match k.family {
                4 => IpAddr::V4(Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3])),
                6 => IpAddr::V6(Ipv6Addr::from(k.addr)),
                _ => return None,
            };
            Some(Known {
                class,
                addr,
                first_unix_ms: v.first_ms,
                last_unix_ms: v.last_ms,
                answers: v.answers,
                paused_ms: v.paused_ms,
            })
        })
        .collect()
}

/// Entries as the gate's map wants them, for the classes `names` has. The
/// others are returned apart (their class may appear later, when discovery
/// finds its service).
pub fn to_map(entries: Vec<Known>, names: &[String]) -> (Vec<(sluice_src_key, sluice_known)>, Vec<Known>) {
    let mut later = Vec::new();
    let mut map = Vec::new();
    for e in entries {
        let Some(id) = names.iter().position(|n| *n == e.class) else {
            later.push(e);
            continue;
        };
        let mut key = sluice_src_key { class_id: id as u8, ..Default::default() };
        match e.addr {
            IpAddr::V4(a) => {
                (key.family, key.plen) = (4, 32);
                key.addr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                (key.family, key.plen) = (6, 64);
                key.addr[..8].copy_from_slice(&a.octets()[..8]);
            }
        }
        let value = sluice_known {
            first_ms: e.first_unix_ms,
            last_ms: e.last_unix_ms,
            answers: e.answers,
            paused_ms: e.paused_ms,
            ..Default::default()
        };
        map.push((key, value));
    }
    (map, later)
}

/// Write the entries atomically.
pub fn save(file: &Path, sources: &[Known]) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = file.with_extension("json.tmp");
    let saved_unix = crate::base::clock::wall_ms() / 1000;
    let state = StateFile { version: VERSION, saved_unix, sources: sources.to_vec() };
    let write = || -> std::io::Result<()> {
        // The file holds client addresses: mode 0600 from its creation, and
        // never written through whatever a link at the temporary path points
        // to (a stale one is removed; O_EXCL | O_NOFOLLOW refuse a new one).
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(&state)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    };
    write().with_context(|| format!("writing {}", file.display()))
}

/// Writes the state file on a thread of its own, so the control thread
/// never waits for the disk (the write ends in fsync). One write at a time:
/// an offer while one is under way is skipped (the next carries newer
/// entries). A failed write is logged at the 1st, 2nd, 4th, ... time.
pub struct Saver {
    tx: Option<std::sync::mpsc::SyncSender<Vec<Known>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Saver {
    pub fn start(file: PathBuf) -> Saver {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Known>>(0);
        let thread = std::thread::Builder::new()
            .name("sluice-save".into())
            .spawn(move || {
                let mut errors = 0u64;
                for entries in rx {
                    if let Err(e) = save(&file, &entries) {
                        errors += 1;
                        if errors.is_power_of_two() {
                            crate::base::log::warn(format_args!(
                                "known sources: not saved ({errors} times so far): {e:#}"
                            ));
                        }
                    }
                }
            })
            .expect("starting the state file's writer");
        Saver { tx: Some(tx), thread: Some(thread) }
    }

    /// Hand `entries` to the writer; false if it is still busy with the last ones.
    pub fn offer(&self, entries: Vec<Known>) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.try_send(entries).is_ok())
    }

    /// Wait for the write under way, if any, and end the thread.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Entries waiting for a class that is not in force (class names carry
/// process names a user picks, so classes come and go): those answered
/// within `ttl_ms` of `now_ms` (wall clock), the `max` most recently
/// answered of them. Without this, entries of churned classes piled up in
/// memory and in the state file for good.
pub fn prune_pending(mut pending: Vec<Known>, now_ms: u64, ttl_ms: u64, max: usize) -> Vec<Known> {
    pending.retain(|k| age_ms(now_ms, k.last_unix_ms) <= ttl_ms);
    if pending.len() > max {
        pending.sort_unstable_by_key(|k| std::cmp::Reverse(k.last_unix_ms));
        pending.truncate(max);
    }
    pending
}

/// A state file larger than this is not read: a full known map and as many
/// entries waiting for their classes are about 20 MiB of JSON.
pub const MAX_FILE_BYTES: u64 = 32 << 20;
/// Entries a state file may hold: the known map's and as many waiting.
pub const MAX_ENTRIES: usize = 2 * crate::bpf_intf::SLUICE_KNOWN_ENTRIES as usize;
/// An entry's last answer may be dated this far past the gate clock (two
/// hosts' clocks, a save racing a tick); further, it is from another clock
/// (a wall clock stepped back between two runs, a crafted file).
pub const FUTURE_SLACK_MS: u64 = 60_000;
/// No client is answered faster than this on average over its span (ten
/// times what NSD answers on a core here): the learned rate is answers over
/// span, and a count beyond it (u32::MAX in a crafted file) would lift the
/// client's own cap in the known tier.
pub const MAX_ANSWER_PPS: f64 = 1_000_000.0;

/// Read the entries. A missing file is no error (Ok of nothing); a file
/// that cannot be read or parsed, one over MAX_FILE_BYTES or with over
/// MAX_ENTRIES entries is, and says why. A version 1 file's ages are taken
/// back to wall-clock times from the time it was written. Each entry is
/// checked by `validate` after.
pub fn load(file: &Path) -> Result<Vec<Known>, String> {
    use std::io::Read as _;
    let mut text = Vec::new();
    match std::fs::File::open(file) {
        Ok(f) => f.take(MAX_FILE_BYTES + 1).read_to_end(&mut text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => Err(e),
    }
    .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} is over {} MiB, more than sluice ever writes: not read (remove it)",
            file.display(),
            MAX_FILE_BYTES >> 20
        ));
    }
    let not_ours = |e: serde_json::Error| format!("{} is not a sluice state file: {e}", file.display());
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let entries = match serde_json::from_slice::<Version>(&text).map_err(not_ours)?.version {
        VERSION => serde_json::from_slice::<StateFile>(&text).map_err(not_ours)?.sources,
        1 => from_v1(serde_json::from_slice(&text).map_err(not_ours)?),
        v => return Err(format!("{} has version {v}, this sluice reads {VERSION} and 1", file.display())),
    };
    if entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{} holds {} entries, more than sluice ever writes ({MAX_ENTRIES}): not read (remove it)",
            file.display(),
            entries.len()
        ));
    }
    Ok(entries)
}

/// Entries of a state file refused one by one, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The last answer dated before the first, or pauses longer than the span.
    pub backwards: usize,
    /// The last answer dated over FUTURE_SLACK_MS past the gate clock.
    pub future: usize,
    /// More answers than MAX_ANSWER_PPS over the span.
    pub answers: usize,
}

impl Refused {
    pub fn total(&self) -> usize {
        self.backwards + self.future + self.answers
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} entries refused: {} with the last answer dated before the first (or paused longer than \
             their span), {} dated over {} s in the future, {} with more answers than {} a second",
            self.total(),
            self.backwards,
            self.future,
            FUTURE_SLACK_MS / 1000,
            self.answers,
            MAX_ANSWER_PPS
        )
    }
}

/// The entries a loaded file may give the gate at gate clock `now_ms`, and
/// what was refused: dates in order and not from the future, an answer
/// count a client could have had.
pub fn validate(entries: Vec<Known>, now_ms: u64) -> (Vec<Known>, Refused) {
    let mut refused = Refused::default();
    let kept = entries
        .into_iter()
        .filter(|k| {
            // Its answers were counted over its span less its pauses.
            let span_ms =
                k.last_unix_ms.checked_sub(k.first_unix_ms).and_then(|s| s.checked_sub(u64::from(k.paused_ms)));
            let bad = if span_ms.is_none() {
                &mut refused.backwards
            } else if k.last_unix_ms > now_ms.saturating_add(FUTURE_SLACK_MS) {
                &mut refused.future
            } else if f64::from(k.answers) > MAX_ANSWER_PPS * (span_ms.unwrap_or(0) as f64 / 1000.0).max(1.0) {
                &mut refused.answers
            } else {
                return true;
            };
            *bad += 1;
            false
        })
        .collect();
    (kept, refused)
}

/// How long ago `last_ms` was at `now_ms`, on the gate clock; a date over
/// FUTURE_SLACK_MS ahead is from another clock and counts as older than
/// anything (it would otherwise never age out).
pub fn age_ms(now_ms: u64, last_ms: u64) -> u64 {
    if last_ms > now_ms.saturating_add(FUTURE_SLACK_MS) {
        u64::MAX
    } else {
        now_ms.saturating_sub(last_ms)
    }
}

fn from_v1(state: StateFileV1) -> Vec<Known> {
    let saved_ms = state.saved_unix.saturating_mul(1000);
    let at = |ago_secs: u64| saved_ms.saturating_sub(ago_secs.saturating_mul(1000));
    state
        .sources
        .into_iter()
        .map(|k| Known {
            first_unix_ms: at(k.age_secs.saturating_add(k.span_secs)),
            last_unix_ms: at(k.age_secs),
            class: k.class,
            addr: k.addr,
            answers: k.answers,
            paused_ms: 0,
        })
        .collect()
}

/// The share of the known map the classes' parts add up to: the LRU map
/// evicts a little before it is full, and the rest is headroom for what the
/// learner inserts between two scans past a part (two CPUs at the last room).
pub const PARTS_OF_MAP: f64 = 0.9;
/// A class's part is held as a cache: at each scan, past this share of it,
/// its entries are cut back to this share (room for new clients until the
/// next scan, never none).
pub const KEEP_OF_PART: f64 = 0.9;
/// A candidate (answered over less than SLUICE_KNOWN_SPAN_MS) not answered
/// for this long is forgotten at the next scan: a client that comes back
/// within a minute is known by then; a source answered once (a one-off, or
/// a query from a spoofed address) does not hold a place in the part.
pub const CANDIDATE_TTL_MS: u64 = 60_000;

/// The share of PARTS_OF_MAP the untrusted classes (at the untrusted
/// priority: a discovered service of a login user or of nobody) have
/// between them while trusted classes learn too: a local user who binds 60
/// ports makes 60 classes, and they must not shrink a trusted service's
/// part (issue 35, item 3: NSD's part fell from 58,982 to about 930).
pub const UNTRUSTED_SHARE: f64 = 0.25;

/// Each class's part of the known map, by class index (`classes` of them):
/// bit i of `learns` says class i learns (every class but the default one),
/// bit i of `untrusted` that it is untrusted. The trusted classes share
/// 1 - UNTRUSTED_SHARE of PARTS_OF_MAP of `capacity` equally, the untrusted
/// ones UNTRUSTED_SHARE; a group alone has it all. A class that does not
/// learn has none.
pub fn parts(capacity: u32, classes: usize, learns: u64, untrusted: u64) -> Vec<u64> {
    let bit = |mask: u64, i: usize| i < 64 && mask & (1u64 << i) != 0;
    let n_untrusted = (0..classes).filter(|&i| bit(learns, i) && bit(untrusted, i)).count();
    let n_trusted = (0..classes).filter(|&i| bit(learns, i) && !bit(untrusted, i)).count();
    let all = capacity as f64 * PARTS_OF_MAP;
    let (to_trusted, to_untrusted) = match (n_trusted, n_untrusted) {
        (0, _) => (0.0, all),
        (_, 0) => (all, 0.0),
        _ => (all * (1.0 - UNTRUSTED_SHARE), all * UNTRUSTED_SHARE),
    };
    (0..classes)
        .map(|i| match (bit(learns, i), bit(untrusted, i)) {
            (false, _) => 0,
            (true, false) => (to_trusted / n_trusted.max(1) as f64) as u64,
            (true, true) => (to_untrusted / n_untrusted.max(1) as f64) as u64,
        })
        .collect()
}

/// Hold every class's part of the map as a cache, at `now_ms` (the gate
/// clock): the entries to delete and, per class index, its part as the gate
/// reads it (the new entries it may still make, and the entries it holds;
/// none: the gate skips the known lookup). An entry goes when it is past
/// `ttl_ms` since its last answer, or a candidate past CANDIDATE_TTL_MS;
/// then, past KEEP_OF_PART of the part, until KEEP_OF_PART is left:
/// candidates, the least recently answered first; then known clients,
/// those answered over the shortest span first (issue 49 item 3). By last
/// answer alone, addresses a spoofer keeps answered (refreshed every
/// second) evicted the real clients that were merely quiet for a while;
/// a real client answered over days outlasts a wave learned in an hour.
/// The price: while a part is full, its newest known clients go first.
pub fn bound(
    map: &[(sluice_src_key, sluice_known)],
    parts: &[u64],
    now_ms: u64,
    ttl_ms: u64,
) -> (Vec<sluice_src_key>, Vec<sluice_known_part>) {
    let mut per_class: Vec<Vec<(bool, u64, u64, sluice_src_key)>> = vec![vec![]; parts.len()];
    let mut delete = vec![];
    for (k, v) in map {
        let Some(c) = per_class.get_mut(k.class_id as usize) else { continue };
        let (age, known) = (age_ms(now_ms, v.last_ms), known_span(v.first_ms, v.last_ms));
        if age > ttl_ms || (!known && age > CANDIDATE_TTL_MS) {
            delete.push(*k);
        } else {
            // The order of eviction: a candidate's last answer, a known client's span.
            let rank = if known { v.last_ms - v.first_ms } else { v.last_ms };
            c.push((known, rank, v.last_ms, *k));
        }
    }
    let mut out = vec![];
    for (mut entries, &part) in per_class.into_iter().zip(parts) {
        let keep = (part as f64 * KEEP_OF_PART) as usize;
        if entries.len() > keep {
            // Candidates (false) first, then known clients, each by rank.
            entries.sort_unstable_by_key(|&(known, rank, last, _)| (known, rank, last));
            let cut = entries.len() - keep;
            delete.extend(entries.drain(..cut).map(|(_, _, _, k)| k));
        }
        let held = entries.len() as u64;
        out.push(sluice_known_part { room: part as i64 - held as i64, held });
    }
    (delete, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(class_id: u8, i: u32) -> sluice_src_key {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&i.to_be_bytes());
        sluice_src_key { class_id, family: 4, plen: 32, addr, ..Default::default() }
    }

    /// Issue 23, item 4: one class's clients (or whoever it answers) never
    /// take another class's part of the known map.
    #[test]
    fn a_class_past_its_part_of_the_known_map_loses_its_oldest_entries_only() {
        assert_eq!(parts(65_536, 3, 0b110, 0), [0, 29_491, 29_491], "the default class (0) learns nothing");
        assert_eq!(parts(65_536, 1, 0, 0), [0], "no learning class: never a division by zero");
        let mut map = vec![];
        for i in 0..150u32 {
            map.push((key(1, i), sluice_known { last_ms: 1_000 + i as u64, ..Default::default() }));
        }
        for i in 0..10u32 {
            map.push((key(2, 1_000 + i), sluice_known { last_ms: 5, ..Default::default() }));
        }
        map.push((key(63, 7), sluice_known::default())); // a class index past the config: left alone
        let (delete, room) = bound(&map, &[100, 100, 100], 2_000, 3_600_000);
        assert_eq!(delete.len(), 60, "class 1 keeps 90 of its part of 100");
        assert!(delete.iter().all(|k| k.class_id == 1), "only the class past its part loses entries");
        let oldest_kept = 1_000 + 60;
        assert!(
            delete.iter().all(|k| u32::from_be_bytes(k.addr[..4].try_into().unwrap()) < oldest_kept),
            "the oldest go"
        );
        assert_eq!(room.iter().map(|p| p.room).collect::<Vec<_>>(), vec![100, 10, 90]);
        assert_eq!(
            room.iter().map(|p| p.held).collect::<Vec<_>>(),
            vec![0, 90, 10],
            "what the gate's lookup skip reads"
        );
    }

    /// Issue 49 item 3: a part filled by a wave of addresses a spoofer
    /// keeps answered (each refreshed a second ago, answered over the last
    /// 10 minutes) loses the wave, not the real clients answered over days
    /// and quiet for the last hour. Evicting by last answer alone (before)
    /// kept the wave and lost every real client.
    #[test]
    fn a_wave_of_refreshed_entries_does_not_evict_clients_known_for_days() {
        let (day, now) = (86_400_000u64, 10 * 86_400_000u64);
        let mut map = vec![];
        for i in 0..50u32 {
            let real = sluice_known {
                first_ms: now - 3 * day,
                last_ms: now - 3_600_000,
                answers: 5_000,
                ..Default::default()
            };
            map.push((key(1, i), real));
        }
        for i in 0..100u32 {
            let wave =
                sluice_known { first_ms: now - 600_000, last_ms: now - 1_000, answers: 600, ..Default::default() };
            map.push((key(1, 1_000 + i), wave));
        }
        let (delete, room) = bound(&map, &[0, 100], now, 7 * day);
        assert_eq!(delete.len(), 60, "the part keeps 90 of 150");
        assert!(
            delete.iter().all(|k| u32::from_be_bytes(k.addr[..4].try_into().unwrap()) >= 1_000),
            "only the wave goes"
        );
        assert_eq!(room[1].held, 90);
    }

    /// Hardening (issue 35, item 2): a class's part filled with one-answer
    /// sources (valid queries from spoofed addresses) is held as a cache:
    /// the scan makes room again, one-answer candidates and the least
    /// recently answered going first, and a known client stays though its
    /// last answer is older than theirs. Before, the gate stopped learning
    /// at the part and the scan deleted only past it: full for good.
    #[test]
    fn a_full_part_is_a_cache_and_makes_room_for_new_clients() {
        let mut map = vec![];
        // A known client: answered 500 times over 30 s, last 2 s ago.
        let known = sluice_known { first_ms: 1_000, last_ms: 31_000, answers: 500, ..Default::default() };
        map.push((key(1, 0), known));
        // 99 one-answer sources, each answered once in the last second.
        for i in 1..100u32 {
            let one = sluice_known {
                first_ms: 32_000 + u64::from(i),
                last_ms: 32_000 + u64::from(i),
                answers: 1,
                ..Default::default()
            };
            map.push((key(1, i), one));
        }
        let (delete, parts) = bound(&map, &[100, 100], 33_000, 3_600_000);
        assert!(parts[1].room >= 10, "room for new clients after the scan: {:?}", parts[1]);
        assert!(!delete.contains(&key(1, 0)), "the known client stays");
        assert!(delete.iter().all(|k| k.class_id == 1));
        assert_eq!(parts[1], sluice_known_part { room: 10, held: 90 });
        // A minute on, the candidates are forgotten; past the TTL, the known client too.
        let (delete, parts) = bound(&map, &[100, 100], 33_000 + CANDIDATE_TTL_MS + 1_000, 3_600_000);
        assert_eq!((delete.len(), parts[1].held), (99, 1), "only the known client is left");
        let (_, parts) = bound(&map, &[100, 100], 31_000 + 3_600_001, 3_600_000);
        assert_eq!(parts[1].held, 0, "past the TTL nothing is left");
        // The state file keeps what the cache keeps: not the stale candidates.
        let names = ["default".to_string(), "dns".to_string()];
        let saved = from_map(&map, &names, 33_000 + CANDIDATE_TTL_MS + 1_000, 3_600_000);
        assert_eq!(saved.len(), 1, "only the known client is saved");
        assert_eq!(from_map(&map, &names, 33_000, 3_600_000).len(), 100, "fresh candidates are saved");
    }

    /// Hardening (issue 35, item 3): a local user who binds 60 ports makes 60
    /// untrusted classes; they share UNTRUSTED_SHARE of the map, and a
    /// trusted service's part stays most of it. Before, every learning class
    /// had an equal part: NSD's fell to 966 of 65,536 entries.
    #[test]
    fn untrusted_classes_cannot_shrink_a_trusted_part() {
        // Class 0 the default, 1 NSD (trusted), 2..=61 a local user's.
        let (learns, untrusted) = ((1u64 << 62) - 2, ((1u64 << 62) - 1) & !0b11);
        let p = parts(65_536, 62, learns, untrusted);
        assert_eq!(p[1], (65_536.0 * PARTS_OF_MAP * (1.0 - UNTRUSTED_SHARE)) as u64, "NSD keeps three quarters");
        assert_eq!(p[2], (65_536.0 * PARTS_OF_MAP * UNTRUSTED_SHARE / 60.0) as u64);
        assert!(p.iter().sum::<u64>() <= (65_536.0 * PARTS_OF_MAP) as u64);
        // Alone, the untrusted classes have it all between them.
        assert_eq!(parts(65_536, 3, 0b110, 0b110)[1], 29_491);
    }

    /// A wall-clock time to test with: 2026-11-23.
    const NOW_MS: u64 = 1_795_000_000_000;

    fn names() -> Vec<String> {
        vec!["default".into(), "udp-53".into()]
    }

    #[test]
    fn the_saver_writes_off_thread_and_finishes_its_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known-x.json");
        let mut saver = Saver::start(file.clone());
        let sources = vec![entry("192.0.2.1", 10, 5, 3)];
        // A write may be under way from an earlier offer: offer until taken.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !saver.offer(sources.clone()) {
            assert!(std::time::Instant::now() < deadline, "the saver never took an offer");
        }
        saver.finish();
        assert_eq!(load(&file).unwrap(), sources, "the write ended before finish returned");
        assert!(!saver.offer(sources), "a finished saver takes nothing");
    }

    fn entry(addr: &str, ago_secs: u64, span_secs: u64, answers: u32) -> Known {
        let last_unix_ms = NOW_MS - ago_secs * 1000;
        let first_unix_ms = last_unix_ms - span_secs * 1000;
        Known {
            class: "udp-53".into(),
            addr: addr.parse().unwrap(),
            first_unix_ms,
            last_unix_ms,
            answers,
            paused_ms: 0,
        }
    }

    fn entries() -> Vec<Known> {
        vec![Known { paused_ms: 4_000, ..entry("198.51.100.7", 60, 30, 9) }, entry("2001:db8:1:2::", 3600, 5, 1)]
    }

    /// Hardening: pending entries (of a class not in force) age out like
    /// the rest and are bounded, the most recently answered kept.
    #[test]
    fn pending_entries_expire_and_are_bounded() {
        let ttl = 3_600_000;
        let pending = vec![
            entry("198.51.100.1", 10, 5, 3),
            entry("198.51.100.2", 7_200, 5, 3),
            entry("198.51.100.3", 20, 5, 3),
            entry("198.51.100.4", 30, 5, 3),
        ];
        let kept = prune_pending(pending, NOW_MS, ttl, 2);
        let addrs: Vec<String> = kept.iter().map(|k| k.addr.to_string()).collect();
        assert_eq!(addrs, ["198.51.100.1", "198.51.100.3"], "two hours old goes; of the rest the newest two");
    }

    /// Known as the gate counts it: a span of a second at least, whatever
    /// the answers (one answer is a candidate).
    #[test]
    fn an_entry_is_known_from_a_second_of_answers() {
        assert!(!entry("198.51.100.7", 0, 0, 1).is_known());
        assert!(!Known { first_unix_ms: NOW_MS - 999, ..entry("198.51.100.7", 0, 0, 50) }.is_known());
        assert!(entry("198.51.100.7", 0, 1, 2).is_known());
    }

    #[test]
    fn the_map_and_the_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        save(&file, &entries()).unwrap();
        let back = load(&file).unwrap();
        assert_eq!(back, entries(), "wall-clock times are kept as they are");
        let (map, later) = to_map(back, &names());
        assert!(later.is_empty());
        assert_eq!((map[0].0.class_id, map[0].0.family, map[0].0.plen), (1, 4, 32));
        assert_eq!((map[0].1.first_ms, map[0].1.last_ms), (NOW_MS - 90_000, NOW_MS - 60_000));
        assert_eq!(map[0].1.paused_ms, 4_000, "a pause of learning stays out of its span after a restart");
        assert_eq!(from_map(&map, &names(), NOW_MS, 7 * 86_400_000), entries());
        assert!(!dir.path().join("known-vb.json.tmp").exists(), "the temporary file is renamed");
    }

    /// Regression (issue 23, item 1): the gate's known map was kept in
    /// CLOCK_MONOTONIC seconds, where "two hours ago" saturates to 0 on a
    /// host booted a minute ago, and a reboot made every entry unknown. The
    /// map and the file now hold wall-clock times: nothing depends on the
    /// uptime, and an entry restored after a reboot keeps its age.
    #[test]
    fn a_host_booted_a_minute_ago_restores_old_entries_with_their_age() {
        let old = vec![entry("198.51.100.8", 7200, 10, 3)];
        let (map, _) = to_map(old.clone(), &names());
        assert_eq!(map[0].1.last_ms, NOW_MS - 7_200_000, "two hours before now, whatever the uptime");
        assert_eq!(map[0].1.last_ms - map[0].1.first_ms, 10_000);
        assert_eq!(from_map(&map, &names(), NOW_MS, 3_600_000), vec![], "past a one-hour ttl: dropped");
        assert_eq!(from_map(&map, &names(), NOW_MS, 86_400_000), old, "saved again with the same times");
    }

    #[test]
    fn entries_of_classes_not_there_yet_wait_and_old_ones_are_dropped() {
        let (map, later) = to_map(entries(), &["default".to_string()]);
        assert!(map.is_empty());
        assert_eq!(later.len(), 2);
        let (map, _) = to_map(entries(), &names());
        assert_eq!(from_map(&map, &names(), NOW_MS, 600_000).len(), 1, "the hour-old one is past a 10-minute ttl");
    }

    #[test]
    fn a_version_1_file_is_read_with_its_ages_taken_from_its_write_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        let v1 = r#"{"version":1,"saved_unix":1795000000,"sources":[
            {"class":"udp-53","addr":"198.51.100.7","age_secs":60,"span_secs":30,"answers":9}]}"#;
        std::fs::write(&file, v1).unwrap();
        assert_eq!(load(&file).unwrap(), vec![entry("198.51.100.7", 60, 30, 9)]);
    }

    /// Hardening (issue 23, item 13): the file is 0600 whatever the umask,
    /// and a symlink planted at the temporary path is replaced, not
    /// followed (before, the save wrote the addresses into its target).
    #[test]
    fn the_state_file_is_private_and_a_planted_link_is_not_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        let victim = dir.path().join("elsewhere");
        std::fs::write(&victim, b"untouched").unwrap();
        std::os::unix::fs::symlink(&victim, file.with_extension("json.tmp")).unwrap();
        save(&file, &entries()).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"untouched", "the link's target was written");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load(&file).unwrap(), entries());
    }

    #[test]
    fn a_corrupt_truncated_or_foreign_file_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        assert_eq!(load(&file), Ok(vec![]), "no file: nothing known, no error");
        save(&file, &entries()).unwrap();
        let full = std::fs::read(&file).unwrap();
        std::fs::write(&file, &full[..full.len() / 2]).unwrap();
        assert!(load(&file).unwrap_err().contains("is not a sluice state file"));
        std::fs::write(&file, b"\x00\xff garbage").unwrap();
        assert!(load(&file).unwrap_err().contains("is not a sluice state file"));
        std::fs::write(&file, br#"{"version":99,"saved_unix":0,"sources":[]}"#).unwrap();
        assert!(load(&file).unwrap_err().contains("version 99"));
    }

    /// Issue 49, item 5: a load checked nothing. A file too large or with
    /// too many entries is refused whole and says so.
    #[test]
    fn an_oversized_file_or_one_with_too_many_entries_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        let big = std::fs::File::create(&file).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        let why = load(&file).unwrap_err();
        assert!(why.contains("over 32 MiB") && why.contains("remove it"), "{why}");
        let many: Vec<Known> =
            (0..=MAX_ENTRIES as u32).map(|i| entry(&std::net::Ipv4Addr::from(i).to_string(), 1, 1, 1)).collect();
        save(&file, &many).unwrap();
        let why = load(&file).unwrap_err();
        assert!(why.contains(&format!("holds {} entries", MAX_ENTRIES + 1)), "{why}");
    }

    /// Issue 49, item 5: an entry dated backwards, one from the future (it
    /// would never age out) and one with u32::MAX answers (no cap of its
    /// own in the known tier) are refused one by one; the rest is kept.
    #[test]
    fn entries_a_client_could_not_have_are_refused_one_by_one() {
        let good = entry("198.51.100.7", 60, 30, 9);
        let mut backwards = entry("198.51.100.8", 60, 30, 9);
        std::mem::swap(&mut backwards.first_unix_ms, &mut backwards.last_unix_ms);
        let mut future = entry("198.51.100.9", 0, 30, 9);
        future.last_unix_ms = NOW_MS + FUTURE_SLACK_MS + 1;
        let mut slightly_ahead = entry("198.51.100.10", 0, 30, 9);
        slightly_ahead.last_unix_ms = NOW_MS + 1_000;
        let greedy = entry("198.51.100.11", 60, 1, u32::MAX);
        let busy = entry("198.51.100.12", 60, 2, 2_000_000);
        // Its pauses are no part of its span: longer than it, or leaving
        // too short a span for its answers, refused.
        let paused_past = Known { paused_ms: 30_001, ..entry("198.51.100.13", 60, 30, 9) };
        let paused_busy = Known { paused_ms: 1_000, ..busy.clone() };
        let all = vec![
            good.clone(),
            backwards,
            future,
            slightly_ahead.clone(),
            greedy,
            busy.clone(),
            paused_past,
            paused_busy,
        ];
        let (kept, refused) = validate(all, NOW_MS);
        assert_eq!(kept, vec![good, slightly_ahead, busy]);
        assert_eq!(refused, Refused { backwards: 2, future: 1, answers: 2 });
        assert!(refused.to_string().starts_with("5 entries refused"), "{refused}");
    }

    /// Issue 49, item 5: an entry dated in the future never aged out of
    /// the map (its age saturated at 0); now it goes at the next scan.
    #[test]
    fn an_entry_from_the_future_ages_out_of_the_map() {
        let key = |a: u8| {
            let mut k = sluice_src_key { class_id: 0, family: 4, plen: 32, ..Default::default() };
            k.addr[0] = a;
            k
        };
        let v = |last_ms: u64| sluice_known { first_ms: last_ms - 5_000, last_ms, answers: 5, ..Default::default() };
        let map = [(key(1), v(NOW_MS - 1_000)), (key(2), v(NOW_MS + 3_600_000))];
        let (delete, _) = bound(&map, &[1000], NOW_MS, 3_600_000);
        assert_eq!(delete, vec![key(2)]);
        assert_eq!(from_map(&map, &["c".into()], NOW_MS, 3_600_000).len(), 1);
        assert_eq!(age_ms(NOW_MS, NOW_MS + 1_000), 0, "a second ahead: two clocks, not another one");
    }
}
