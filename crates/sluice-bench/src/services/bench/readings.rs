//! What a cell reads off a daemon's status (`sluice status --json`).
use super::*;

/// Packets the daemon's gate dropped of every class but the default one
/// (the service's classes), since it started.
pub(crate) fn service_drops(exe: &Path, ns: &str, sock: &Path) -> Result<u64> {
    Ok(dropped_of(&daemon_status(exe, ns, sock)?))
}

pub(in crate::services) fn daemon_status(exe: &Path, ns: &str, sock: &Path) -> Result<Snapshot> {
    Ok(serde_json::from_value(crate::testbed::procs::status_json(exe, ns, sock)?)?)
}

/// Of a daemon's status, since it started: packets its gate dropped and
/// admitted of every class but the default one (the service's classes) ...
pub(super) fn dropped_of(s: &Snapshot) -> u64 {
    s.classes.iter().filter(|c| c.name != "default").map(|c| c.totals.dropped_pkts()).sum()
}

/// ... of those drops, the ones the room for known clients made ...
pub(super) fn room_drops_of(s: &Snapshot) -> u64 {
    s.classes.iter().filter(|c| c.name != "default").map(|c| c.totals.dropped_room_pkts).sum()
}

/// ... of those drops, the ones made while the service had room (its
/// sockets showed no distress: sluice's own harm); None: not counted.
pub(super) fn dropped_with_room_of(s: &Snapshot) -> Option<u64> {
    s.classes.iter().filter(|c| c.name != "default").map(|c| c.dropped_with_room_pkts).sum()
}

/// ... their known clients' packets lost after the gate (None: not counted) ...
pub(super) fn known_lost_of(s: &Snapshot) -> Option<u64> {
    s.classes.iter().filter(|c| c.name != "default").map(|c| c.known_lost_pkts).sum()
}

pub(super) fn admitted_of(s: &Snapshot) -> u64 {
    s.classes.iter().filter(|c| c.name != "default").map(|c| c.totals.admitted_pkts).sum()
}

/// ... SYNs its gate answered with a cookie SYN-ACK, all classes ...
pub(super) fn synacks_of(s: &Snapshot) -> u64 {
    s.classes.iter().map(|c| c.totals.synack_pkts).sum()
}

/// ... and the CPU signal's largest share of any class but the default one
/// (0-1; None: never measured).
pub(super) fn cpu_taken_max(s: &Snapshot) -> Option<f64> {
    s.classes.iter().filter(|c| !c.is_default).filter_map(|c| c.rx_cpu_taken_max).reduce(f64::max)
}
