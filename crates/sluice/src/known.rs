//! The known sources' state file: the clients each class's service answered
//! while it was healthy (the gate's "known" map), kept across a restart of
//! the daemon (pure file I/O and conversion; the daemon reads and writes it).
//!
//! One JSON file per interface, `STATE_DIR/known-IFACE.json`, written
//! atomically (a temporary file in the same directory, fsync, rename), so a
//! crash leaves the old file or the new one, never half of one. Entries are
//! stored by class name (class ids change when services come and go) with
//! their age in seconds; the time the daemon was down ages them too. A file
//! that cannot be read or parsed is ignored: the daemon logs why and starts
//! with no known sources.
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bpf_intf::{sluice_known, sluice_src_key};
use crate::gate::Clock;

/// Where state files go unless `--state-dir` says otherwise.
pub const STATE_DIR: &str = "/var/lib/sluice";
/// Version of the file's format.
pub const VERSION: u32 = 1;

/// One known source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    pub class: String,
    /// The address (IPv4) or the /64 prefix (IPv6, lower 64 bits zero).
    pub addr: IpAddr,
    /// Seconds since the service last answered it, and over how many
    /// seconds it answered it (known takes SLUICE_KNOWN_SPAN).
    pub age_secs: u64,
    #[serde(default)]
    pub span_secs: u64,
    pub answers: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    /// Unix time the file was written.
    saved_unix: u64,
    sources: Vec<Known>,
}

/// The state file of an interface.
pub fn path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("known-{iface}.json"))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The gate's known map as entries, with class ids named by `names`;
/// entries older than `ttl_secs` or of a class that no longer exists are left out.
pub fn from_map(map: &[(sluice_src_key, sluice_known)], names: &[String], now: u32, ttl_secs: u64) -> Vec<Known> {
    map.iter()
        .filter_map(|(k, v)| {
            let class = names.get(k.class_id as usize)?.clone();
            let age_secs = Clock::secs(now.saturating_sub(v.last));
            let addr = match k.family {
                4 => IpAddr::V4(Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3])),
                6 => IpAddr::V6(Ipv6Addr::from(k.addr)),
                _ => return None,
            };
            let span_secs = Clock::secs(v.last.saturating_sub(v.first));
            (age_secs <= ttl_secs).then_some(Known { class, addr, age_secs, span_secs, answers: v.answers })
        })
        .collect()
}

/// Entries as the gate's map wants them, for the classes `names` has;
/// `now` is the gate's coarse time. The others are returned apart (their
/// class may appear later, when discovery finds its service).
pub fn to_map(entries: Vec<Known>, names: &[String], now: u32) -> (Vec<(sluice_src_key, sluice_known)>, Vec<Known>) {
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
        let last = now.saturating_sub(Clock::coarse(e.age_secs));
        let first = last.saturating_sub(Clock::coarse(e.span_secs));
        map.push((key, sluice_known { first, last, answers: e.answers, ..Default::default() }));
    }
    (map, later)
}

/// Write the entries atomically.
pub fn save(file: &Path, sources: &[Known]) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = file.with_extension("json.tmp");
    let state = StateFile { version: VERSION, saved_unix: unix_now(), sources: sources.to_vec() };
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&state)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    };
    write().with_context(|| format!("writing {}", file.display()))
}

/// Read the entries, aged by the time since the file was written. A missing
/// file is no error (Ok of nothing); a file that cannot be read or parsed
/// is, and says why.
pub fn load(file: &Path) -> Result<Vec<Known>, String> {
    let text = match std::fs::read(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    let state: StateFile =
        serde_json::from_slice(&text).map_err(|e| format!("{} is not a sluice state file: {e}", file.display()))?;
    if state.version != VERSION {
        return Err(format!("{} has version {}, this sluice reads {VERSION}", file.display(), state.version));
    }
    let down = unix_now().saturating_sub(state.saved_unix);
    Ok(state.sources.into_iter().map(|k| Known { age_secs: k.age_secs.saturating_add(down), ..k }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["default".into(), "udp-53".into()]
    }

    fn entries() -> Vec<Known> {
        vec![
            Known {
                class: "udp-53".into(),
                addr: "198.51.100.7".parse().unwrap(),
                age_secs: 60,
                span_secs: 30,
                answers: 9,
            },
            Known {
                class: "udp-53".into(),
                addr: "2001:db8:1:2::".parse().unwrap(),
                age_secs: 3600,
                span_secs: 5,
                answers: 1,
            },
        ]
    }

    #[test]
    fn the_map_and_the_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "vb");
        save(&file, &entries()).unwrap();
        let back = load(&file).unwrap();
        assert_eq!(back.len(), 2);
        for (a, b) in back.iter().zip(entries()) {
            assert_eq!((&a.class, a.addr, a.answers), (&b.class, b.addr, b.answers));
            assert!(a.age_secs >= b.age_secs && a.age_secs <= b.age_secs + 5, "aged by the write-read gap only");
        }
        let now = 1_000_000;
        let (map, later) = to_map(back, &names(), now);
        assert!(later.is_empty());
        assert_eq!((map[0].0.class_id, map[0].0.family, map[0].0.plen), (1, 4, 32));
        let again = from_map(&map, &names(), now, 7 * 86400);
        for (a, b) in again.iter().zip(entries()) {
            assert_eq!((&a.class, a.addr), (&b.class, b.addr));
            assert!(a.age_secs.abs_diff(b.age_secs) <= 2, "{} vs {}", a.age_secs, b.age_secs);
            assert!(a.span_secs.abs_diff(b.span_secs) <= 2, "{} vs {}", a.span_secs, b.span_secs);
        }
        assert!(!dir.path().join("known-vb.json.tmp").exists(), "the temporary file is renamed");
    }

    #[test]
    fn entries_of_classes_not_there_yet_wait_and_old_ones_are_dropped() {
        let (map, later) = to_map(entries(), &["default".to_string()], 1_000_000);
        assert!(map.is_empty());
        assert_eq!(later.len(), 2);
        let (map, _) = to_map(entries(), &names(), 1_000_000);
        assert_eq!(from_map(&map, &names(), 1_000_000, 600).len(), 1, "the hour-old one is past a 10-minute ttl");
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
}
