//! The daemon's privileges. Under systemd the unit (sluice@.service) grants
//! only the capabilities below; started by hand as root it would hold every
//! capability for its life, in every thread, the metrics endpoint's
//! included. `drop_to_kept` puts it where the unit does once the gate is
//! attached (taking over or naming another XDP program, with --replace,
//! may need more), before any thread of the daemon's exists:
//! capabilities are per thread, and a thread started later inherits them.
use anyhow::{bail, Result};

/// The capabilities the daemon keeps (the unit's CapabilityBoundingSet,
/// which explains each): number and name.
pub const KEPT: [(u32, &str); 6] = [
    (39, "CAP_BPF"),
    (38, "CAP_PERFMON"),
    (12, "CAP_NET_ADMIN"),
    (19, "CAP_SYS_PTRACE"),
    (2, "CAP_DAC_READ_SEARCH"),
    (23, "CAP_SYS_NICE"),
];

/// The kept set as a mask.
pub fn kept_mask() -> u64 {
    KEPT.iter().fold(0, |m, (c, _)| m | 1u64 << c)
}

// linux/capability.h: the 64-bit interface and its two 32-bit halves.
const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// This thread's (effective, permitted, inheritable) sets.
fn capget() -> Result<[u64; 3]> {
    let mut h = CapHeader { version: CAP_V3, pid: 0 };
    let mut d = [CapData::default(); 2];
    // SAFETY: capget(2) with a v3 header and the two data structs it fills.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } != 0 {
        bail!("capget: {}", std::io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    Ok([
        join(d[0].effective, d[1].effective),
        join(d[0].permitted, d[1].permitted),
        join(d[0].inheritable, d[1].inheritable),
    ])
}

/// Set this thread's sets (effective = permitted = `keep`, no inheritable).
fn capset(keep: u64) -> Result<()> {
    let mut h = CapHeader { version: CAP_V3, pid: 0 };
    let half = |i: u32| CapData { effective: (keep >> i) as u32, permitted: (keep >> i) as u32, inheritable: 0 };
    let d = [half(0), half(32)];
    // SAFETY: capset(2) with a v3 header and two data structs we own.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        bail!("capset: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The highest capability this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
}

/// The capabilities in `mask` outside the kept set, by number ("cap 21").
fn dropped_names(mask: u64) -> Vec<String> {
    (0..64).filter(|c| mask & !kept_mask() & (1u64 << c) != 0).map(|c| format!("cap {c}")).collect()
}

/// Drop every capability outside KEPT from this thread's effective,
/// permitted, inheritable, ambient and bounding sets. Returns what was
/// dropped (empty: the daemon held no more than KEPT, as under the unit).
pub fn drop_to_kept() -> Result<Vec<String>> {
    let [eff, prm, _] = capget()?;
    let extra = (eff | prm) & !kept_mask();
    // The bounding set first: dropping from it needs CAP_SETPCAP, which goes next.
    for cap in 0..=last_cap() {
        if kept_mask() & (1u64 << cap) == 0 {
            // SAFETY: prctl(2) with integer arguments; EINVAL for a cap this kernel lacks, EPERM without CAP_SETPCAP.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        }
    }
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    capset(prm & kept_mask())?;
    Ok(dropped_names(extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept set is the unit's, word for word (one list for both).
    #[test]
    fn the_kept_set_is_the_units() {
        let unit = include_str!("../../../../packaging/systemd/sluice@.service");
        let line = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit's set");
        let mut unit_caps: Vec<&str> = line.split_whitespace().collect();
        let mut kept: Vec<&str> = KEPT.iter().map(|(_, n)| *n).collect();
        unit_caps.sort_unstable();
        kept.sort_unstable();
        assert_eq!(unit_caps, kept);
        assert_eq!(kept_mask().count_ones(), 6);
        assert_eq!(dropped_names(kept_mask() | 1 << 21), ["cap 21"], "CAP_SYS_ADMIN (21) is not kept");
    }
}
