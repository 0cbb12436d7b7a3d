//! SYN cookies at the driver, the gate's side (bpf/syncookie.h has the
//! mechanism and why): the key and MSS the gate's SYN-ACKs carry, each
//! class's guard, the cookie checker's tcx ingress link, and whether this
//! kernel can complete a connection from a gate cookie.
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags};

use super::{bytes_of, from_bytes, Gate, GateError, Result};
use crate::bpf_intf::{sluice_syn_guard, SLUICE_MAX_CLASSES};

/// Can this kernel complete a connection from a gate cookie? The loaded
/// cookie checker found the bpf_sk_assign_tcp_reqsk kfunc (Linux 6.9): it
/// says so when run once. Without it the daemon never turns answering on
/// and the kernel answers every SYN, as before.
fn kernel_takes_cookies(gate: &Gate) -> bool {
    // Any frame will do: the checker notes the kfunc before it parses.
    let frame = [0u8; 64];
    if gate.test_run(super::Prog::CookieAck, &frame, 1).is_err() {
        return false;
    }
    gate.skel.maps.bss_data.as_deref().is_some_and(|d| d.cookie_kfunc == 1)
}

/// 128 random bits for the cookies' SipHash key (getrandom; never all zero,
/// which the gate takes as "no key").
fn random_key() -> std::io::Result<[u64; 2]> {
    let mut key = [0u64; 2];
    // SAFETY: key is 16 writable bytes.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), 16, 0) };
    if n != 16 {
        return Err(std::io::Error::last_os_error());
    }
    if key == [0, 0] {
        key[0] = 1;
    }
    Ok(key)
}

/// The interface's MTU (/sys/class/net/IFACE/mtu); 1500 if unreadable.
fn mtu(iface: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500)
}

impl Gate {
    /// The cookies' key, and the MSS the SYN-ACKs offer (from the MTU).
    pub fn set_syn_key(&mut self, key: [u64; 2], mtu: u32) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.syn_key = key;
        data.settings.syn_mss4 = mtu.saturating_sub(40).clamp(536, 65_495) as u16;
        data.settings.syn_mss6 = mtu.saturating_sub(60).clamp(1220, 65_475) as u16;
    }

    /// Does the gate answer SYNs where a guard says so: its cookie checker is
    /// attached (the kernel takes gate cookies) and the key set?
    pub fn answers_syns(&self) -> bool {
        self.cookie_link.is_some()
    }

    /// Write a class's SYN guard, and the latest check time of any class's
    /// (`syn_guard_any`: while it is past, the checker parses no packet).
    pub fn set_syn_guard(&self, class: usize, guard: &sluice_syn_guard) -> Result<()> {
        let map = |err| GateError::Map { map: "syn_guard", err };
        let guards = &self.skel.maps.syn_guard;
        guards.update(&(class as u32).to_ne_bytes(), bytes_of(guard), MapFlags::ANY).map_err(map)?;
        let mut latest = 0u64;
        for c in 0..SLUICE_MAX_CLASSES {
            if let Some(v) = guards.lookup(&c.to_ne_bytes(), MapFlags::ANY).map_err(map)? {
                latest = latest.max(from_bytes::<sluice_syn_guard>(&v).check_until_ms);
            }
        }
        self.skel
            .maps
            .syn_guard_any
            .update(&0u32.to_ne_bytes(), &latest.to_ne_bytes(), MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "syn_guard_any", err })
    }

    /// Draw the key, read the MTU and attach the cookie checker (tcx
    /// ingress), where the kernel can take gate cookies; elsewhere nothing
    /// (no key: the gate answers no SYN). On failure the gate and the
    /// learner are detached again: they go together.
    pub(super) fn attach_cookie_checker(&mut self, iface: &str, ifidx: i32) -> Result<()> {
        if !kernel_takes_cookies(self) {
            return Ok(());
        }
        let fail = |gate: &mut Gate, err: std::io::Error| {
            gate.detach();
            Err(GateError::AttachCookies { iface: iface.into(), err })
        };
        match random_key() {
            Ok(key) => self.set_syn_key(key, mtu(iface)),
            Err(err) => return fail(self, err),
        }
        match super::attach::tcx_link(&self.skel.progs.sluice_cookie_ack, ifidx, libbpf_sys::BPF_TCX_INGRESS) {
            Ok(link) => self.cookie_link = Some(link),
            Err(err) => return fail(self, err),
        }
        Ok(())
    }
}
