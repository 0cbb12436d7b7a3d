//! What lets the gate answer a SYN without its socket lookup (the why is
//! in bpf/sluice.h, at struct sluice_syn_guard): the client addresses that
//! hold a socket on a class's ports when its guard starts answering (one
//! dump; the gate marks the rest itself while it answers), and, by class,
//! the families whose every port has a wildcard listener on the gate's
//! interface and no MPTCP one. Read only while a guard answers.
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::discover::{Family, Listeners, Listening, L4};
use super::sock_diag::{SockDiag, TCP_CLOSE, TCP_LISTEN};
use crate::bpf_intf::{SLUICE_SYN_DIRECT_V4, SLUICE_SYN_DIRECT_V6, SLUICE_SYN_PEER_LOG2};

/// A client address as the gate's syn_peers hashes it: the 16 bytes of an
/// IPv6 address, an IPv4 one as ::ffff:a.b.c.d, in network order.
pub type PeerKey = [u32; 4];

/// A client address's bit in each half of the gate's syn_peers: the
/// gate's syn_peer_bit (bpf/sluice.h), computed the same way.
pub fn peer_bit(k: PeerKey) -> u32 {
    let x = u64::from(k[0] ^ k[2]) << 32 | u64::from(k[1] ^ k[3]);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLUICE_SYN_PEER_LOG2)) as u32
}

/// The key of a client address (an IPv4-mapped IPv6 address, as a
/// dual-stack socket shows an IPv4 client, is the IPv4 address's key).
pub fn peer_key(addr: IpAddr) -> PeerKey {
    let octets = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    std::array::from_fn(|i| u32::from_ne_bytes(octets[4 * i..4 * i + 4].try_into().unwrap()))
}

/// The largest number of ports of one class that are checked for
/// listeners; a class with more is never direct.
pub const DIRECT_PORTS_MAX: usize = 1024;

/// The SLUICE_SYN_DIRECT_* bits of a class with TCP `ports`: a family's bit
/// where every port has a wildcard TCP listener that receives that family
/// (`listeners`, the gate interface's) and none of the ports has an MPTCP
/// listener (`mptcp`: those ports; None: not known, and then no bit).
pub fn direct_bits(ports: &[(u16, u16)], listeners: &[Listening], mptcp: Option<&HashSet<u16>>) -> u32 {
    let Some(mptcp) = mptcp else { return 0 };
    let count: usize = ports.iter().map(|&(lo, hi)| usize::from(hi.saturating_sub(lo)) + 1).sum();
    if ports.is_empty() || count > DIRECT_PORTS_MAX {
        return 0;
    }
    let mut by_port: HashMap<u16, u32> = HashMap::new();
    for l in listeners.iter().filter(|l| l.l4 == L4::Tcp && l.addr.is_unspecified()) {
        let bits = match l.family {
            Family::Both => SLUICE_SYN_DIRECT_V4 | SLUICE_SYN_DIRECT_V6,
            Family::V4 => SLUICE_SYN_DIRECT_V4,
            Family::V6 => SLUICE_SYN_DIRECT_V6,
        };
        *by_port.entry(l.port).or_default() |= bits;
    }
    let mut bits = SLUICE_SYN_DIRECT_V4 | SLUICE_SYN_DIRECT_V6;
    for &(lo, hi) in ports {
        for port in lo..=hi {
            if mptcp.contains(&port) {
                return 0;
            }
            bits &= by_port.get(&port).copied().unwrap_or(0);
        }
    }
    bits
}

/// Does this kernel have MPTCP (net.mptcp in this namespace)?
fn kernel_has_mptcp() -> bool {
    std::path::Path::new("/proc/sys/net/mptcp").exists()
}

/// How often the listeners are read again while a guard answers.
pub const LISTENERS_EVERY: Duration = Duration::from_secs(1);

/// A reading of the listeners: the gate interface's, and the ports with an
/// MPTCP listener (None: not known).
pub struct ListenersRead {
    pub at: Instant,
    pub listeners: Vec<Listening>,
    pub mptcp: Option<HashSet<u16>>,
}

/// The reader, and the daemon's half of the gate's syn_peers as written.
pub struct SynPeers {
    diag: SockDiag,
    listeners: Listeners,
    last: Option<ListenersRead>,
    /// The words of the daemon's half that are not zero, by index.
    words: HashMap<u32, u64>,
    /// Since the last `release`: some class was seeded, so the gate may
    /// have set bits of its own too.
    used: bool,
}

impl SynPeers {
    /// A reader in the current network namespace, sharing the daemon's
    /// reading of the listeners.
    pub fn new(listeners: Listeners) -> Result<SynPeers> {
        Ok(SynPeers { diag: SockDiag::open(None)?, listeners, last: None, words: HashMap::new(), used: false })
    }

    /// Add `peers` to the daemon's half: the words to write (index, value).
    pub fn add(&mut self, peers: &HashSet<PeerKey>) -> Vec<(u32, u64)> {
        self.used = true;
        let mut changed = Vec::new();
        for (i, w) in peer_words(peers) {
            let held = self.words.entry(i).or_default();
            if *held | w != *held {
                *held |= w;
                changed.push((i, *held));
            }
        }
        changed
    }

    /// No guard answers: the daemon's half is forgotten. Whether the gate's
    /// syn_peers may hold bits (either half), to be cleared.
    pub fn release(&mut self) -> bool {
        self.words.clear();
        std::mem::take(&mut self.used)
    }

    /// The client addresses of every TCP socket on `ports` that is not a
    /// listener (established, half-open, closing, TIME_WAIT; both families):
    /// one dump of each family.
    pub fn holding(&mut self, ports: &[(u16, u16)]) -> Result<HashSet<PeerKey>> {
        let mut peers = HashSet::new();
        if ports.is_empty() {
            return Ok(peers);
        }
        let states = !(1u32 << TCP_LISTEN | 1 << TCP_CLOSE);
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.diag.dump_ports(family, libc::IPPROTO_TCP as u8, states, ports, &mut |s| {
                if ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&s.sport)) {
                    peers.insert(peer_key(s.dst));
                }
            })?;
        }
        Ok(peers)
    }

    /// The listeners, read again if `now` or the last reading is
    /// LISTENERS_EVERY old; None if not read again.
    pub fn listeners(&mut self, now: bool) -> Result<Option<&ListenersRead>> {
        if !now && self.last.as_ref().is_some_and(|r| r.at.elapsed() < LISTENERS_EVERY) {
            return Ok(None);
        }
        let read = ListenersRead { at: Instant::now(), listeners: self.listeners.now()?, mptcp: self.mptcp_ports() };
        Ok(Some(self.last.insert(read)))
    }

    /// The ports with an MPTCP listener (empty where the kernel has no
    /// MPTCP); None where it has and they cannot be read.
    fn mptcp_ports(&mut self) -> Option<HashSet<u16>> {
        let mut ports = HashSet::new();
        if !kernel_has_mptcp() {
            return Some(ports);
        }
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.diag
                .dump_mptcp_listeners(family, &mut |s| {
                    ports.insert(s.sport);
                })
                .ok()?;
        }
        Some(ports)
    }
}

/// The words of a bit set with the bits of `peers` (index, word; only
/// those not zero), as the daemon's half of syn_peers holds them.
pub fn peer_words(peers: &HashSet<PeerKey>) -> Vec<(u32, u64)> {
    let mut words: HashMap<u32, u64> = HashMap::new();
    for &k in peers {
        let bit = peer_bit(k);
        *words.entry(bit / 64).or_default() |= 1 << (bit % 64);
    }
    let mut words: Vec<(u32, u64)> = words.into_iter().collect();
    words.sort_unstable();
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf_intf::SLUICE_SYN_PEER_BITS;

    fn tcp(port: u16, addr: &str, family: Family) -> Listening {
        Listening { l4: L4::Tcp, port, addr: addr.parse().unwrap(), inode: 1, uid: 0, family }
    }

    const BOTH: u32 = SLUICE_SYN_DIRECT_V4 | SLUICE_SYN_DIRECT_V6;

    /// A family is direct only where every port of the class has a wildcard
    /// listener receiving it, and no port an MPTCP one; not known: never.
    #[test]
    fn a_class_is_direct_only_where_every_port_has_a_wildcard_listener() {
        let none = HashSet::new();
        let dual = [tcp(80, "::", Family::Both)];
        assert_eq!(direct_bits(&[(80, 80)], &dual, Some(&none)), BOTH);
        assert_eq!(direct_bits(&[(80, 80)], &dual, None), 0, "MPTCP listeners not known");
        assert_eq!(direct_bits(&[(80, 80)], &dual, Some(&HashSet::from([80]))), 0, "an MPTCP listener");
        let v4 = [tcp(80, "0.0.0.0", Family::V4)];
        assert_eq!(direct_bits(&[(80, 80)], &v4, Some(&none)), SLUICE_SYN_DIRECT_V4);
        let split = [tcp(80, "0.0.0.0", Family::V4), tcp(80, "::", Family::V6)];
        assert_eq!(direct_bits(&[(80, 80)], &split, Some(&none)), BOTH);
        let bound = [tcp(80, "10.0.0.1", Family::V4)];
        assert_eq!(direct_bits(&[(80, 80)], &bound, Some(&none)), 0, "a listener on one address: looked up");
        assert_eq!(direct_bits(&[(80, 81)], &dual, Some(&none)), 0, "port 81 has none");
        let udp = [Listening { l4: L4::Udp, ..dual[0] }];
        assert_eq!(direct_bits(&[(80, 80)], &udp, Some(&none)), 0, "a UDP socket is no TCP listener");
        assert_eq!(direct_bits(&[], &dual, Some(&none)), 0, "no TCP port");
        let many: Vec<Listening> = (1000..=3000).map(|p| tcp(p, "::", Family::Both)).collect();
        assert_eq!(direct_bits(&[(1000, 3000)], &many, Some(&none)), 0, "more than DIRECT_PORTS_MAX ports");
        assert_eq!(direct_bits(&[(1000, 1500)], &many, Some(&none)), BOTH);
    }

    /// The bit set's words hold each address's bit; the bits spread (a
    /// thousand neighbouring addresses take about a thousand bits).
    #[test]
    fn each_address_sets_its_own_bit() {
        let addrs: HashSet<PeerKey> =
            (0..1000u32).map(|i| peer_key(std::net::Ipv4Addr::from(0x0a00_0000 + i).into())).collect();
        let words = peer_words(&addrs);
        let set: u32 = words.iter().map(|(_, w)| w.count_ones()).sum();
        assert!(set > 990, "{set} bits for 1000 addresses");
        for &k in &addrs {
            let bit = peer_bit(k);
            assert!(bit < SLUICE_SYN_PEER_BITS);
            let w = words.iter().find(|(i, _)| *i == bit / 64).expect("its word").1;
            assert_eq!((w >> (bit % 64)) & 1, 1);
        }
    }

    #[test]
    fn an_ipv4_client_has_one_key_whether_its_socket_is_ipv4_or_dual_stack() {
        let v4 = peer_key("192.0.2.7".parse().unwrap());
        assert_eq!(v4, peer_key("::ffff:192.0.2.7".parse().unwrap()));
        assert_eq!(v4[2], 0xffffu32.to_be(), "::ffff: in network order");
        assert_eq!(v4[3], u32::from_ne_bytes([192, 0, 2, 7]));
        assert_ne!(v4, peer_key("2001:db8::7".parse().unwrap()));
    }
}
