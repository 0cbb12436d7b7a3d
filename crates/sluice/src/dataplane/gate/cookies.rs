//! SYN cookies at the driver, the gate's side (bpf/syncookie.h has the
//! mechanism and why): the key and MSS the gate's SYN-ACKs carry, each
//! class's guard, the cookie checker's tcx ingress link, whether this
//! kernel can complete a connection from a gate cookie, and what the
//! namespace's TCP settings let a cookie carry.
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags};

use super::{bytes_of, from_bytes, Gate, GateError, Result};
use crate::bpf_intf::{
    sluice_syn_guard, SLUICE_CLASS_IDS, SLUICE_SYN_COOKIES, SLUICE_SYN_PEER_WORDS, SLUICE_SYN_ROUTES_V4,
    SLUICE_SYN_ROUTES_V6, SLUICE_SYN_SACK, SLUICE_SYN_TS, SLUICE_SYN_WSCALE,
};

/// The namespace's TCP settings a gate cookie depends on (net.ipv4.NAME,
/// per network namespace), each with the bit of `settings.syn_allow` it
/// gives while it is not 0. bpf_sk_assign_tcp_reqsk refuses a request
/// socket with SACK, timestamps or window scaling where the namespace has
/// them off, and a listener ignores the request socket with
/// `tcp_syncookies = 0`.
pub const TCP_SETTINGS: [(&str, u32); 4] = [
    ("tcp_syncookies", SLUICE_SYN_COOKIES),
    ("tcp_sack", SLUICE_SYN_SACK),
    ("tcp_timestamps", SLUICE_SYN_TS),
    ("tcp_window_scaling", SLUICE_SYN_WSCALE),
];

/// Conntrack's setting (net.netfilter, present with nf_conntrack): at 0,
/// conntrack takes up no connection it did not see the SYN of, and a gate
/// cookie's connection is one (the gate answered its SYN): its ACK is
/// INVALID to conntrack, and a firewall that drops those drops it. The gate
/// then answers no SYN.
pub const CONNTRACK_LOOSE: &str = "nf_conntrack_tcp_loose";

/// `settings.syn_allow` from the TCP settings as `read` finds them (None:
/// unreadable, taken as off: a kernel without CONFIG_SYN_COOKIES has no
/// tcp_syncookies, and the gate then answers no SYN) and conntrack's
/// (`conntrack_loose`: None where nf_conntrack is absent), with why the
/// gate answers no SYN, if it does not.
pub fn syn_allow_of(read: impl Fn(&str) -> Option<u32>, conntrack_loose: Option<u32>) -> (u32, Option<&'static str>) {
    let bits =
        TCP_SETTINGS.iter().filter(|(name, _)| read(name).is_some_and(|v| v != 0)).fold(0, |b, (_, bit)| b | bit);
    if bits & SLUICE_SYN_COOKIES == 0 {
        return (bits, Some("net.ipv4.tcp_syncookies = 0 here: the kernel ignores a cookie's connection"));
    }
    match conntrack_loose {
        Some(0) => (
            bits & !SLUICE_SYN_COOKIES,
            Some("net.netfilter.nf_conntrack_tcp_loose = 0 here: conntrack takes a cookie's connection for INVALID"),
        ),
        _ => (bits, None),
    }
}

/// The number a sysctl or sysfs file holds (None: absent or unreadable).
fn read_number(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The TCP settings of this process's network namespace (the gate's: the
/// daemon runs in its interface's namespace).
fn read_tcp_setting(name: &str) -> Option<u32> {
    read_number(&format!("/proc/sys/net/ipv4/{name}"))
}

/// Conntrack's loose setting in this namespace (None: no nf_conntrack).
fn read_conntrack_loose() -> Option<u32> {
    read_number(&format!("/proc/sys/net/netfilter/{CONNTRACK_LOOSE}"))
}

/// The SLUICE_SYN_ROUTES_* bits of an interface whose forwarding setting
/// `read` finds for a family ("ipv4", "ipv6"; None: unreadable, taken as
/// off, as the kernel then has no such device or family to forward).
pub fn routes_of(read: impl Fn(&str) -> Option<u32>) -> u32 {
    [("ipv4", SLUICE_SYN_ROUTES_V4), ("ipv6", SLUICE_SYN_ROUTES_V6)]
        .iter()
        .filter(|(family, _)| read(family).is_some_and(|v| v != 0))
        .fold(0, |bits, (_, bit)| bits | bit)
}

/// net.FAMILY.conf.IFACE.forwarding in this process's namespace: what
/// bpf_fib_lookup checks on the device a packet came in on.
fn read_forwarding(iface: &str, family: &str) -> Option<u32> {
    read_number(&format!("/proc/sys/net/{family}/conf/{iface}/forwarding"))
}

/// Why a SYN-ACK the gate sends back from XDP would leave on the wrong VLAN
/// (None: it would not). A NIC that strips 802.1Q tags before XDP
/// (`rx-vlan-offload` on; the tag goes to the descriptor, where an XDP
/// program cannot read it without a driver's metadata kfunc) hands the gate
/// a tagged SYN as an untagged frame, and XDP_TX sends the answer untagged:
/// onto the native VLAN, not the client's. That matters only where the
/// interface carries VLANs: a VLAN device on it, or a bridge over it that
/// filters by VLAN (`uppers`: its upper devices, each with its kind). With
/// tags left in the frame, the answer keeps them (it is built in place).
/// `stripped`: None where the driver cannot say (taken as stripping).
pub fn vlan_untagged_why(iface: &str, stripped: Option<bool>, uppers: &[(String, UpperKind)]) -> Option<String> {
    let carried: Vec<&str> = uppers.iter().filter(|(_, k)| *k != UpperKind::Other).map(|(n, _)| n.as_str()).collect();
    if carried.is_empty() || stripped == Some(false) {
        return None;
    }
    let how = match stripped {
        Some(_) => "strips VLAN tags before XDP (rx-vlan-offload on)",
        None => "may strip VLAN tags before XDP (its driver does not say)",
    };
    Some(format!(
        "{iface} {how} and carries VLANs ({}): a SYN-ACK sent back from XDP would leave untagged; \
         `ethtool -K {iface} rxvlan off` lets the gate answer",
        carried.join(", ")
    ))
}

/// What an upper device of the gate's interface is, for `vlan_untagged_why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpperKind {
    /// An 802.1Q/802.1ad VLAN device on it.
    Vlan,
    /// A bridge over it that filters by VLAN (`vlan_filtering` 1).
    VlanBridge,
    /// Anything else (a bridge without VLANs, a bond, macvlan).
    Other,
}

/// The upper devices of `iface` (/sys/class/net/IFACE/upper_NAME), each with its kind.
fn uppers_of(iface: &str) -> Vec<(String, UpperKind)> {
    let Ok(dir) = std::fs::read_dir(format!("/sys/class/net/{iface}")) else { return Vec::new() };
    let names = dir.filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_prefix("upper_").map(String::from));
    names
        .map(|n| {
            let uevent = std::fs::read_to_string(format!("/sys/class/net/{n}/uevent")).unwrap_or_default();
            let kind = if uevent.lines().any(|l| l == "DEVTYPE=vlan") {
                UpperKind::Vlan
            } else if uevent.lines().any(|l| l == "DEVTYPE=bridge")
                && read_number(&format!("/sys/class/net/{n}/bridge/vlan_filtering")) == Some(1)
            {
                UpperKind::VlanBridge
            } else {
                UpperKind::Other
            };
            (n, kind)
        })
        .collect()
}

/// Does `iface` strip 802.1Q tags on receive (ETHTOOL_GFLAGS' ETH_FLAG_RXVLAN,
/// which the kernel reads from the NETIF_F_HW_VLAN_CTAG_RX feature)? None:
/// the ioctl failed.
pub fn rx_vlan_stripped(iface: &str) -> Option<bool> {
    const ETHTOOL_GFLAGS: u32 = 0x25;
    const ETH_FLAG_RXVLAN: u32 = 1 << 8;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let name = std::ffi::CString::new(iface).ok()?;
    if name.as_bytes_with_nul().len() > libc::IFNAMSIZ {
        return None;
    }
    let mut value = EthtoolValue { cmd: ETHTOOL_GFLAGS, data: 0 };
    // SAFETY: an ifreq whose name is a NUL-terminated string of at most
    // IFNAMSIZ bytes and whose data points at `value`, which outlives the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes_with_nul()) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        let rc = libc::ioctl(fd, libc::SIOCETHTOOL, &mut req);
        libc::close(fd);
        (rc == 0).then_some(value.data & ETH_FLAG_RXVLAN != 0)
    }
}

/// Every SLUICE_SYN_* bit: a namespace with the kernel's defaults.
pub fn syn_allow_all() -> u32 {
    TCP_SETTINGS.iter().fold(0, |bits, (_, bit)| bits | bit)
}

/// What the gate's SYN-ACKs offer with these settings (`why`: why it
/// answers no SYN, if it does not), for the log.
pub fn describe_syn_allow(syn_allow: u32, why: Option<&str>) -> String {
    if let Some(why) = why {
        return format!("the gate answers no SYN ({why})");
    }
    let on: Vec<&str> = TCP_SETTINGS[1..].iter().filter(|(_, bit)| syn_allow & bit != 0).map(|(n, _)| *n).collect();
    let off: Vec<&str> = TCP_SETTINGS[1..].iter().filter(|(_, bit)| syn_allow & bit == 0).map(|(n, _)| *n).collect();
    let offer = match off.is_empty() {
        true => "the gate's SYN-ACKs may offer SACK, timestamps and window scaling".into(),
        false => format!("the gate's SYN-ACKs offer only what is on ({}; off: {})", on.join(", "), off.join(", ")),
    };
    let routes: Vec<&str> = [(SLUICE_SYN_ROUTES_V4, "IPv4"), (SLUICE_SYN_ROUTES_V6, "IPv6")]
        .iter()
        .filter(|(bit, _)| syn_allow & bit != 0)
        .map(|(_, f)| *f)
        .collect();
    match routes.is_empty() {
        true => offer,
        false => format!(
            "{offer}; the interface forwards {}: a SYN or ACK the host would route to another machine goes to the kernel",
            routes.join(" and ")
        ),
    }
}

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
    let mut key = super::random_words::<2>()?;
    if key == [0, 0] {
        key[0] = 1;
    }
    Ok(key)
}

/// The interface's MTU (/sys/class/net/IFACE/mtu); 1500 if unreadable.
fn mtu(iface: &str) -> u32 {
    read_number(&format!("/sys/class/net/{iface}/mtu")).unwrap_or(1500)
}

impl Gate {
    /// The cookies' key, and the MSS the SYN-ACKs offer (from the MTU);
    /// the options they may carry are read from the namespace.
    pub fn set_syn_key(&mut self, key: [u64; 2], mtu: u32) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.syn_key = key;
        data.settings.syn_mss4 = mtu.saturating_sub(40).clamp(536, 65_495) as u16;
        data.settings.syn_mss6 = mtu.saturating_sub(60).clamp(1220, 65_475) as u16;
        self.refresh_syn_allow();
    }

    /// What a gate cookie may carry (SLUICE_SYN_* bits), as the settings of
    /// a namespace give it (`syn_allow_of`).
    pub fn set_syn_allow(&mut self, allow: u32) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.syn_allow = allow;
    }

    /// Does the gate answer SYNs where a guard says so: its cookie checker is
    /// attached (the kernel takes gate cookies) and the key set? The
    /// namespace's settings may still forbid it (`syn_allow`).
    pub fn answers_syns(&self) -> bool {
        self.cookie_link.is_some()
    }

    /// What the namespace's TCP settings let a gate cookie carry, as the
    /// gate was last told (`settings.syn_allow`).
    pub fn syn_allow(&self) -> u32 {
        self.skel.maps.data_data.as_deref().map_or(0, |d| d.settings.syn_allow)
    }

    /// Why the namespace's settings keep the gate from answering any SYN
    /// (None: they do not), as last read.
    pub fn why_no_cookies(&self) -> Option<&str> {
        self.syn_why_not.as_deref()
    }

    /// Read the namespace's TCP settings and the interface's VLAN offload
    /// and upper devices again (`vlan_untagged_why`) and tell the gate; the
    /// new `syn_allow` if it changed.
    pub fn refresh_syn_allow(&mut self) -> Option<u32> {
        let (mut allow, why) = syn_allow_of(read_tcp_setting, read_conntrack_loose());
        let mut why = why.map(String::from);
        if let Some(iface) = &self.cookie_iface {
            allow |= routes_of(|family| read_forwarding(iface, family));
            if let (None, Some(vlan)) = (&why, vlan_untagged_why(iface, rx_vlan_stripped(iface), &uppers_of(iface))) {
                allow &= !SLUICE_SYN_COOKIES;
                why = Some(vlan);
            }
        }
        let changed = self.syn_allow() != allow;
        self.set_syn_allow(allow);
        self.syn_why_not = why;
        changed.then_some(allow)
    }

    /// Write a class's SYN guard, and the latest check time of any class's
    /// (`syn_guard_any`: while it is past, the checker parses no packet).
    pub fn set_syn_guard(&self, class: usize, guard: &sluice_syn_guard) -> Result<()> {
        let map = |err| GateError::Map { map: "syn_guard", err };
        let guards = &self.skel.maps.syn_guard;
        guards.update(&self.ids.id(class).key().to_ne_bytes(), bytes_of(guard), MapFlags::ANY).map_err(map)?;
        let mut latest = 0u64;
        for c in 0..SLUICE_CLASS_IDS {
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

    /// Write words of syn_peers (index, value; the bit set of client
    /// addresses that may hold a socket on an answering class's port:
    /// struct sluice_syn_guard), in one batch. The daemon writes only its
    /// own half, words 0..SLUICE_SYN_PEER_WORDS.
    pub fn set_syn_peer_words(&self, words: &[(u32, u64)]) -> Result<()> {
        if words.is_empty() {
            return Ok(());
        }
        let keys: Vec<u8> = words.iter().flat_map(|(i, _)| i.to_ne_bytes()).collect();
        let values: Vec<u8> = words.iter().flat_map(|(_, w)| w.to_ne_bytes()).collect();
        self.skel
            .maps
            .syn_peers
            .update_batch(&keys, &values, words.len() as u32, MapFlags::ANY, MapFlags::ANY)
            .map_err(|err| GateError::Map { map: "syn_peers", err })
    }

    /// Clear both halves of syn_peers (no guard answers), in one batch.
    pub fn clear_syn_peers(&self) -> Result<()> {
        let zeros: Vec<(u32, u64)> = (0..2 * SLUICE_SYN_PEER_WORDS).map(|i| (i, 0)).collect();
        self.set_syn_peer_words(&zeros)
    }

    /// The words of syn_peers that are not zero, both halves (index, value), for tests.
    pub fn syn_peer_words(&self) -> Result<Vec<(u32, u64)>> {
        let words: Vec<(u32, u64)> = super::dump_map(&self.skel.maps.syn_peers, "syn_peers")?;
        Ok(words.into_iter().filter(|&(_, w)| w != 0).collect())
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
        self.cookie_iface = Some(iface.into());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An interface's forwarding gives each family's ROUTES bit only while
    /// it is on (unreadable: off), and the log line says what it changes.
    #[test]
    fn an_interface_that_forwards_gives_its_families_routes_bits() {
        assert_eq!(routes_of(|_| None), 0);
        assert_eq!(routes_of(|_| Some(0)), 0);
        assert_eq!(routes_of(|f| (f == "ipv4").then_some(1)), SLUICE_SYN_ROUTES_V4);
        assert_eq!(routes_of(|_| Some(1)), SLUICE_SYN_ROUTES_V4 | SLUICE_SYN_ROUTES_V6);
        let all = syn_allow_all();
        assert!(!describe_syn_allow(all, None).contains("forwards"));
        let said = describe_syn_allow(all | SLUICE_SYN_ROUTES_V6, None);
        assert!(
            said.ends_with("forwards IPv6: a SYN or ACK the host would route to another machine goes to the kernel")
        );
    }

    /// Issue 49, item 8: where the interface strips VLAN tags before XDP
    /// and carries VLANs, the gate's SYN-ACKs would leave untagged, so it
    /// answers none, and says how to let it.
    #[test]
    fn a_gate_whose_answers_would_leave_untagged_answers_none() {
        let vlan = [("eth0.100".to_string(), UpperKind::Vlan)];
        let why = vlan_untagged_why("eth0", Some(true), &vlan).expect("stripped and carried: no answers");
        assert!(why.starts_with("eth0 strips VLAN tags before XDP (rx-vlan-offload on) and carries VLANs (eth0.100)"));
        assert!(why.ends_with("`ethtool -K eth0 rxvlan off` lets the gate answer"), "{why}");
        assert_eq!(vlan_untagged_why("eth0", Some(false), &vlan), None, "tags left in the frame: answered in place");
        assert!(vlan_untagged_why("eth0", None, &vlan).is_some_and(|w| w.contains("may strip")), "unread: taken as so");
        let bridge = [("br0".to_string(), UpperKind::VlanBridge), ("bond0".to_string(), UpperKind::Other)];
        assert!(vlan_untagged_why("eth0", Some(true), &bridge).is_some_and(|w| w.contains("VLANs (br0)")));
        let plain = [("br0".to_string(), UpperKind::Other)];
        assert_eq!(vlan_untagged_why("eth0", Some(true), &plain), None, "no VLAN carried: nothing to lose");
        assert_eq!(vlan_untagged_why("eth0", Some(true), &[]), None);
    }

    /// The offload is read with ETHTOOL_GFLAGS, which needs no privilege:
    /// loopback strips nothing; an interface that does not exist says nothing.
    #[test]
    fn the_vlan_offload_is_read_from_the_interface() {
        assert_eq!(rx_vlan_stripped("lo"), Some(false));
        assert_eq!(rx_vlan_stripped("sluice-none0"), None);
        assert_eq!(rx_vlan_stripped("a-name-longer-than-ifnamsiz"), None);
    }

    /// Each setting gives its bit only while it is on; an unreadable one
    /// (a kernel without it) is off; conntrack that takes up no connection
    /// it did not see begin keeps the gate from answering.
    #[test]
    fn the_cookies_carry_only_what_the_settings_allow() {
        let all = |_: &str| Some(1);
        assert_eq!(syn_allow_of(all, None), (syn_allow_all(), None));
        assert_eq!(syn_allow_of(all, Some(1)), (syn_allow_all(), None), "conntrack, loose (its default)");
        let no_sack = |n: &str| Some(u32::from(n != "tcp_sack"));
        assert_eq!(syn_allow_of(no_sack, None).0, SLUICE_SYN_COOKIES | SLUICE_SYN_TS | SLUICE_SYN_WSCALE);
        // tcp_syncookies = 2 (always send cookies) still takes them.
        let always = |n: &str| Some(if n == "tcp_syncookies" { 2 } else { 0 });
        assert_eq!(syn_allow_of(always, None).0, SLUICE_SYN_COOKIES);
        let no_cookies = |n: &str| (n != "tcp_syncookies").then_some(1);
        let (bits, why) = syn_allow_of(no_cookies, None);
        assert!(bits & SLUICE_SYN_COOKIES == 0 && why.is_some_and(|w| w.contains("tcp_syncookies = 0")));
        let (bits, why) = syn_allow_of(all, Some(0));
        assert!(bits & SLUICE_SYN_COOKIES == 0 && why.is_some_and(|w| w.contains("nf_conntrack_tcp_loose = 0")));
        assert_eq!(bits, syn_allow_all() & !SLUICE_SYN_COOKIES, "the options stay as they are");
    }
}
