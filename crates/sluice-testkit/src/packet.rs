//! Crafting Ethernet frames: for BPF_PROG_TEST_RUN tests, `sluice bench gate`
//! and the traffic generators. Checksums are left zero (the gate does not read them).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const ETH_P_LLDP: u16 = 0x88cc;

pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_AH: u8 = 51;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// The L4 part of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum L4 {
    Udp {
        sport: u16,
        dport: u16,
    },
    Tcp {
        sport: u16,
        dport: u16,
    },
    /// ICMP (IPv4) or ICMPv6 (IPv6): an echo request header.
    Icmp,
    /// Raw bytes after the IP header(s), with this protocol number.
    Raw {
        proto: u8,
        bytes: Vec<u8>,
    },
}

impl L4 {
    fn proto(&self, v6: bool) -> u8 {
        match self {
            L4::Udp { .. } => IPPROTO_UDP,
            L4::Tcp { .. } => IPPROTO_TCP,
            L4::Icmp if v6 => IPPROTO_ICMPV6,
            L4::Icmp => IPPROTO_ICMP,
            L4::Raw { proto, .. } => *proto,
        }
    }

    fn bytes(&self, payload: usize, fill: u8) -> Vec<u8> {
        let mut b = match self {
            L4::Udp { sport, dport } => {
                let len = (8 + payload) as u16;
                [sport.to_be_bytes(), dport.to_be_bytes(), len.to_be_bytes(), [0, 0]].concat()
            }
            L4::Tcp { sport, dport } => {
                let mut h = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
                h.extend([0u8; 8]); // seq, ack
                h.extend([5 << 4, 0x02, 0xff, 0xff, 0, 0, 0, 0]); // data offset 5, SYN, window, csum, urg
                h
            }
            L4::Icmp => vec![8, 0, 0, 0, 0, 1, 0, 1],
            L4::Raw { bytes, .. } => return bytes.clone(),
        };
        b.resize(b.len() + payload, fill);
        b
    }
}

/// An IPv6 extension header to put between the fixed header and L4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ext {
    HopByHop,
    Routing,
    DestOpts,
    /// Fragment header with this offset (in 8-byte units) and more-fragments flag.
    Fragment {
        offset: u16,
        more: bool,
    },
    Auth,
}

impl Ext {
    fn proto(self) -> u8 {
        match self {
            Ext::HopByHop => IPPROTO_HOPOPTS,
            Ext::Routing => IPPROTO_ROUTING,
            Ext::DestOpts => IPPROTO_DSTOPTS,
            Ext::Fragment { .. } => IPPROTO_FRAGMENT,
            Ext::Auth => IPPROTO_AH,
        }
    }

    /// The header's bytes, before `next`; a fragment header carries `frag_id`.
    fn bytes(self, next: u8, frag_id: u32) -> Vec<u8> {
        match self {
            // 16 bytes: hdrlen 1 = (1+1)*8, padded with a PadN option.
            Ext::HopByHop | Ext::Routing | Ext::DestOpts => {
                let mut b = vec![next, 1, 1, 12];
                b.resize(16, 0);
                b
            }
            Ext::Fragment { offset, more } => {
                let fo = (offset << 3) | more as u16;
                [&[next, 0][..], &fo.to_be_bytes(), &frag_id.to_be_bytes()].concat()
            }
            // AH: hdrlen 4 = (4+2)*4 = 24 bytes.
            Ext::Auth => {
                let mut b = vec![next, 4, 0, 0];
                b.resize(24, 0);
                b
            }
        }
    }
}

/// A frame description; `build()` makes the bytes.
#[derive(Debug, Clone)]
pub struct Frame {
    pub vlans: Vec<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub l4: L4,
    /// IPv4 options length in bytes (multiple of 4, at most 40).
    pub ipv4_options: usize,
    /// IPv4 fragment offset (8-byte units) and more-fragments flag.
    pub ipv4_frag: (u16, bool),
    /// The IP id a fragment carries (IPv4: its low 16 bits; IPv6: the fragment header's).
    pub frag_id: u32,
    pub ipv6_ext: Vec<Ext>,
    pub payload: usize,
    /// Byte the payload is filled with.
    pub fill: u8,
    /// Destination and source MAC addresses.
    pub macs: ([u8; 6], [u8; 6]),
}

impl Frame {
    pub fn udp(src: &str, dst: &str, sport: u16, dport: u16) -> Frame {
        Frame::new(src, dst, L4::Udp { sport, dport })
    }

    pub fn tcp(src: &str, dst: &str, sport: u16, dport: u16) -> Frame {
        Frame::new(src, dst, L4::Tcp { sport, dport })
    }

    pub fn icmp(src: &str, dst: &str) -> Frame {
        Frame::new(src, dst, L4::Icmp)
    }

    pub fn new(src: &str, dst: &str, l4: L4) -> Frame {
        Frame {
            vlans: vec![],
            src: src.parse().expect("source address"),
            dst: dst.parse().expect("destination address"),
            l4,
            ipv4_options: 0,
            ipv4_frag: (0, false),
            frag_id: 1,
            ipv6_ext: vec![],
            payload: 18,
            fill: 0xab,
            macs: ([0x02, 0, 0, 0, 0, 2], [0x02, 0, 0, 0, 0, 1]),
        }
    }

    pub fn vlan(mut self, id: u16) -> Frame {
        self.vlans.push(id);
        self
    }

    pub fn options(mut self, len: usize) -> Frame {
        self.ipv4_options = len;
        self
    }

    pub fn fragment(mut self, offset: u16, more: bool) -> Frame {
        self.ipv4_frag = (offset, more);
        self
    }

    /// The datagram's IP id (in its fragments: which datagram they are of).
    pub fn frag_id(mut self, id: u32) -> Frame {
        self.frag_id = id;
        self
    }

    pub fn ext(mut self, e: Ext) -> Frame {
        self.ipv6_ext.push(e);
        self
    }

    pub fn payload(mut self, n: usize) -> Frame {
        self.payload = n;
        self
    }

    /// Pad the payload so the frame is `len` bytes long (if it is shorter).
    pub fn frame_len(mut self, len: usize) -> Frame {
        let now = self.build().len();
        if now < len {
            self.payload += len - now;
        }
        self
    }

    /// The frame's bytes, and the offsets where each header starts (for truncation tests).
    pub fn build_with_offsets(&self) -> (Vec<u8>, Vec<(&'static str, usize)>) {
        let mut offs = vec![("eth", 0)];
        let mut b = [self.macs.0, self.macs.1].concat();
        let v6 = self.src.is_ipv6();
        let tag_types = [ETH_P_8021AD, ETH_P_8021Q];
        for (i, id) in self.vlans.iter().enumerate() {
            let tpid = if self.vlans.len() > 1 && i == 0 { tag_types[0] } else { tag_types[1] };
            b.extend(tpid.to_be_bytes());
            offs.push(("vlan", b.len()));
            b.extend(id.to_be_bytes());
        }
        b.extend(if v6 { ETH_P_IPV6 } else { ETH_P_IP }.to_be_bytes());
        let l4 = self.l4.bytes(self.payload, self.fill);
        let proto = self.l4.proto(v6);
        offs.push(("ip", b.len()));
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let hlen = 20 + self.ipv4_options;
                let total = (hlen + l4.len()) as u16;
                let fo = self.ipv4_frag.0 | if self.ipv4_frag.1 { 0x2000 } else { 0 };
                b.extend([0x40 | (hlen / 4) as u8, 0]);
                b.extend(total.to_be_bytes());
                b.extend((self.frag_id as u16).to_be_bytes());
                b.extend(fo.to_be_bytes());
                b.extend([64, proto, 0, 0]);
                b.extend(s.octets());
                b.extend(d.octets());
                if self.ipv4_options > 0 {
                    offs.push(("ipv4-options", b.len()));
                    b.extend(std::iter::repeat_n(1u8, self.ipv4_options)); // NOP options
                }
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let exts: Vec<Vec<u8>> = self
                    .ipv6_ext
                    .iter()
                    .enumerate()
                    .map(|(i, e)| e.bytes(self.ipv6_ext.get(i + 1).map_or(proto, |n| n.proto()), self.frag_id))
                    .collect();
                let plen = (exts.iter().map(Vec::len).sum::<usize>() + l4.len()) as u16;
                let first = self.ipv6_ext.first().map_or(proto, |e| e.proto());
                b.extend([0x60, 0, 0, 0]);
                b.extend(plen.to_be_bytes());
                b.extend([first, 64]);
                b.extend(s.octets());
                b.extend(d.octets());
                for e in exts {
                    offs.push(("ipv6-ext", b.len()));
                    b.extend(e);
                }
            }
            _ => panic!("source and destination must be the same IP family"),
        }
        offs.push(("l4", b.len()));
        b.extend(l4);
        (b, offs)
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets().0
    }

    /// The frame with valid checksums, as a real receiver needs it: the IPv4
    /// header checksum, and the UDP checksum over IPv6 (over IPv4 it stays 0,
    /// "no checksum"). Only plain IPv4/IPv6 + UDP frames (no extension headers).
    pub fn build_valid(&self) -> Vec<u8> {
        let (mut b, offs) = self.build_with_offsets();
        let ip = offs.iter().find(|o| o.0 == "ip").unwrap().1;
        let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
        let v6 = self.src.is_ipv6();
        if !v6 {
            let c = checksum(&b[ip..l4], 0);
            b[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        }
        // The L4 checksum: TCP always, UDP over IPv6 (optional over IPv4: left 0).
        let csum_at = match self.l4 {
            L4::Tcp { .. } => Some(l4 + 16),
            L4::Udp { .. } if v6 => Some(l4 + 6),
            _ => None,
        };
        if let Some(at) = csum_at {
            let len = (b.len() - l4) as u32;
            // Pseudo-header: source, destination, L4 length, protocol.
            let mut pseudo = if v6 { b[ip + 8..ip + 40].to_vec() } else { b[ip + 12..ip + 20].to_vec() };
            pseudo.extend(len.to_be_bytes());
            pseudo.extend([0, 0, 0, self.l4.proto(v6)]);
            let c = checksum(&b[l4..], sum16(&pseudo));
            let c = if c == 0 && matches!(self.l4, L4::Udp { .. }) { 0xffff } else { c };
            b[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        b
    }
}

/// One's complement sum of 16-bit big-endian words (odd length padded with zero).
fn sum16(b: &[u8]) -> u32 {
    b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum()
}

/// The Internet checksum of `b` with an initial sum (RFC 1071).
pub fn checksum(b: &[u8], initial: u32) -> u16 {
    let mut s = initial as u64 + sum16(b) as u64;
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A non-IP frame (ARP request, LLDP, ...) with the given EtherType.
pub fn non_ip(ethertype: u16) -> Vec<u8> {
    let mut b = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1];
    b.extend(ethertype.to_be_bytes());
    b.extend([0u8; 46]);
    b
}

/// Handy addresses of the documentation ranges.
pub fn v4(a: u8, b: u8, c: u8, d: u8) -> String {
    Ipv4Addr::new(a, b, c, d).to_string()
}
pub fn v6(last: u16) -> String {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_udp_layout() {
        let f = Frame::udp("10.0.0.1", "10.0.0.2", 1000, 53).payload(0).build();
        assert_eq!(f.len(), 14 + 20 + 8);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(f[14], 0x45);
        assert_eq!(f[23], 17);
        assert_eq!(&f[36..38], &53u16.to_be_bytes());
    }

    #[test]
    fn vlans_options_and_ext_headers_shift_l4() {
        let (f, offs) = Frame::tcp("10.0.0.1", "10.0.0.2", 1, 80).vlan(1).vlan(2).options(8).build_with_offsets();
        let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
        assert_eq!(l4, 14 + 8 + 28);
        assert_eq!(&f[12..14], &ETH_P_8021AD.to_be_bytes());
        assert_eq!(&f[l4 + 2..l4 + 4], &80u16.to_be_bytes());
        let (f, offs) = Frame::udp(&v6(1), &v6(2), 1, 53).ext(Ext::HopByHop).ext(Ext::Auth).build_with_offsets();
        let l4 = offs.iter().find(|o| o.0 == "l4").unwrap().1;
        assert_eq!(l4, 14 + 40 + 16 + 24);
        assert_eq!(f[14 + 6], IPPROTO_HOPOPTS);
        assert_eq!(f[14 + 40], IPPROTO_AH);
        assert_eq!(f[14 + 56], IPPROTO_UDP);
    }

    #[test]
    fn checksums_verify() {
        // A valid checksum makes the sum over the covered bytes come out 0xffff (checksum 0).
        let f = Frame::udp("10.0.0.1", "10.0.0.2", 1, 2).build_valid();
        assert_eq!(checksum(&f[14..34], 0), 0, "IPv4 header");
        let f = Frame::udp(&v6(1), &v6(2), 1, 2).payload(31).build_valid();
        let mut pseudo = f[22..54].to_vec();
        pseudo.extend(((f.len() - 54) as u32).to_be_bytes());
        pseudo.extend([0, 0, 0, 17]);
        assert_eq!(checksum(&f[54..], sum16(&pseudo)), 0, "IPv6 UDP");
        let f = Frame::tcp("10.0.0.1", "10.0.0.2", 1, 80).payload(6).build_valid();
        let mut pseudo = f[26..34].to_vec();
        pseudo.extend(((f.len() - 34) as u32).to_be_bytes());
        pseudo.extend([0, 0, 0, 6]);
        assert_ne!(&f[50..52], &[0, 0], "a TCP checksum is written");
        assert_eq!(checksum(&f[34..], sum16(&pseudo)), 0, "IPv4 TCP");
        let f = Frame::tcp(&v6(1), &v6(2), 1, 80).build_valid();
        let mut pseudo = f[22..54].to_vec();
        pseudo.extend(((f.len() - 54) as u32).to_be_bytes());
        pseudo.extend([0, 0, 0, 6]);
        assert_eq!(checksum(&f[54..], sum16(&pseudo)), 0, "IPv6 TCP");
    }

    #[test]
    fn frame_len_pads() {
        assert_eq!(Frame::udp("10.0.0.1", "10.0.0.2", 1, 2).frame_len(64).build().len(), 64);
        assert_eq!(Frame::udp("10.0.0.1", "10.0.0.2", 1, 2).frame_len(1500).build().len(), 1500);
    }
}
