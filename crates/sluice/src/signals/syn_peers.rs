//! What lets the gate answer a SYN without its socket lookup (the why is
//! in bpf/sluice.h, at struct sluice_syn_guard): the client addresses that
//! hold a socket on an answering class's port, whose SYNs the gate still
//! looks up, and, by class, the families whose every port has a wildcard
//! listener on the gate's interface and no MPTCP one. The daemon reads
//! them only while some class's guard answers, at most every
//! SLUICE_SYN_PEERS_MS, and writes them to the gate before the guards.
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::discover::{Family, Listeners, Listening, L4};
use super::kernel::{SockDiag, TCP_CLOSE, TCP_LISTEN};
use crate::bpf_intf::{SLUICE_SYN_DIRECT_V4, SLUICE_SYN_DIRECT_V6, SLUICE_SYN_PEERS_MAX, SLUICE_SYN_PEERS_MS};

/// A client address as the gate's syn_peers keys it: the 16 bytes of an
/// IPv6 address, an IPv4 one as ::ffff:a.b.c.d, in network order.
pub type PeerKey = [u32; 4];

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

/// The reader, and the addresses the gate holds (as last written).
pub struct SynPeers {
    diag: SockDiag,
    listeners: Listeners,
    held: HashSet<PeerKey>,
    read_at: Option<Instant>,
}

/// One reading: the addresses holding a socket on the ports read (None:
/// more than SLUICE_SYN_PEERS_MAX), the listeners, and the ports with an
/// MPTCP listener (None: not known).
pub struct PeersRead {
    pub peers: Option<HashSet<PeerKey>>,
    pub listeners: Vec<Listening>,
    pub mptcp: Option<HashSet<u16>>,
}

impl SynPeers {
    /// A reader in the current network namespace, sharing the daemon's
    /// reading of the listeners.
    pub fn new(listeners: Listeners) -> Result<SynPeers> {
        Ok(SynPeers { diag: SockDiag::open(None)?, listeners, held: HashSet::new(), read_at: None })
    }

    /// Is a new reading due (none yet, or SLUICE_SYN_PEERS_MS since the last)?
    pub fn due(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= Duration::from_millis(SLUICE_SYN_PEERS_MS.into()))
    }

    /// Read the TCP sockets on `ports` that are not listeners (established,
    /// half-open, closing, TIME_WAIT; both families), the listeners, and
    /// the MPTCP listeners.
    pub fn read(&mut self, ports: &[(u16, u16)]) -> Result<PeersRead> {
        self.read_at = Some(Instant::now());
        let mut peers = HashSet::new();
        let states = !(1u32 << TCP_LISTEN | 1 << TCP_CLOSE);
        if !ports.is_empty() {
            for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                self.diag.dump_ports(family, libc::IPPROTO_TCP as u8, states, ports, &mut |s| {
                    if ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&s.sport)) {
                        peers.insert(peer_key(s.dst));
                    }
                })?;
            }
        }
        let peers = (peers.len() <= SLUICE_SYN_PEERS_MAX as usize).then_some(peers);
        Ok(PeersRead { peers, listeners: self.listeners.now()?, mptcp: self.mptcp_ports() })
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

    /// What to add to and remove from the gate's syn_peers to make it `to`.
    pub fn change_to(&self, to: &HashSet<PeerKey>) -> (Vec<PeerKey>, Vec<PeerKey>) {
        (to.difference(&self.held).copied().collect(), self.held.difference(to).copied().collect())
    }

    /// The gate holds `peers` now.
    pub fn hold(&mut self, peers: HashSet<PeerKey>) {
        self.held = peers;
    }

    /// The addresses the gate holds.
    pub fn held(&self) -> &HashSet<PeerKey> {
        &self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(port: u16, addr: &str, family: Family) -> Listening {
        Listening { l4: L4::Tcp, port, addr: addr.parse().unwrap(), inode: 1, family }
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

    #[test]
    fn an_ipv4_client_has_one_key_whether_its_socket_is_ipv4_or_dual_stack() {
        let v4 = peer_key("192.0.2.7".parse().unwrap());
        assert_eq!(v4, peer_key("::ffff:192.0.2.7".parse().unwrap()));
        assert_eq!(v4[2], 0xffffu32.to_be(), "::ffff: in network order");
        assert_eq!(v4[3], u32::from_ne_bytes([192, 0, 2, 7]));
        assert_ne!(v4, peer_key("2001:db8::7".parse().unwrap()));
    }
}
