//! TCP segments with options and correct checksums, for the SYN cookie
//! tests (the library's `packet::Frame` builds plain headers only).
#![allow(dead_code)]

use std::net::IpAddr;

use sluice_testkit::packet::checksum;

pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;

/// What a Linux client offers in its SYN: MSS 1460, SACK permitted,
/// timestamps (TSval `tsval`), a NOP and window scale 7.
pub fn linux_syn_options(mss: u16, tsval: u32) -> Vec<u8> {
    let mut o = vec![2, 4];
    o.extend(mss.to_be_bytes());
    o.extend([4, 2, 8, 10]);
    o.extend(tsval.to_be_bytes());
    o.extend(0u32.to_be_bytes());
    o.extend([1, 3, 3, 7]);
    o
}

/// The timestamp option of an ACK (NOP, NOP, TS), padded to 12 bytes.
pub fn ts_options(tsval: u32, tsecr: u32) -> Vec<u8> {
    let mut o = vec![1, 1, 8, 10];
    o.extend(tsval.to_be_bytes());
    o.extend(tsecr.to_be_bytes());
    o
}

/// One TCP segment in an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Segment {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// Options, padded here to a multiple of 4 with EOL.
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
    pub vlan: Option<u16>,
}

impl Segment {
    pub fn new(src: &str, dst: &str, sport: u16, dport: u16, flags: u8) -> Segment {
        Segment {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            sport,
            dport,
            seq: 0x1234_5678,
            ack: 0,
            flags,
            options: vec![],
            payload: vec![],
            vlan: None,
        }
    }

    pub fn build(&self) -> Vec<u8> {
        let mut opts = self.options.clone();
        while !opts.len().is_multiple_of(4) {
            opts.push(0);
        }
        let mut tcp = Vec::new();
        tcp.extend(self.sport.to_be_bytes());
        tcp.extend(self.dport.to_be_bytes());
        tcp.extend(self.seq.to_be_bytes());
        tcp.extend(self.ack.to_be_bytes());
        tcp.push((((20 + opts.len()) / 4) as u8) << 4);
        tcp.push(self.flags);
        tcp.extend(64240u16.to_be_bytes());
        tcp.extend([0, 0, 0, 0]); // checksum, urgent pointer
        tcp.extend(&opts);
        tcp.extend(&self.payload);
        let sum = l4_checksum(&self.src, &self.dst, &tcp);
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if let Some(id) = self.vlan {
            f.extend([0x81, 0x00]);
            f.extend(id.to_be_bytes());
        }
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend([0x08, 0x00]);
                let mut ip = vec![0x45, 0];
                ip.extend(((20 + tcp.len()) as u16).to_be_bytes());
                ip.extend([0, 1, 0x40, 0, 64, 6, 0, 0]);
                ip.extend(s.octets());
                ip.extend(d.octets());
                let sum = checksum(&ip, 0);
                ip[10..12].copy_from_slice(&sum.to_be_bytes());
                f.extend(ip);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend([0x86, 0xdd]);
                f.extend([0x60, 0, 0, 0]);
                f.extend((tcp.len() as u16).to_be_bytes());
                f.extend([6, 64]);
                f.extend(s.octets());
                f.extend(d.octets());
            }
            _ => panic!("mixed address families"),
        }
        f.extend(tcp);
        f
    }
}

/// The TCP checksum of `tcp` (its checksum field as it is) between two addresses.
pub fn l4_checksum(src: &IpAddr, dst: &IpAddr, tcp: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend(s.octets());
            pseudo.extend(d.octets());
            pseudo.extend([0, 6]);
            pseudo.extend((tcp.len() as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend(s.octets());
            pseudo.extend(d.octets());
            pseudo.extend((tcp.len() as u32).to_be_bytes());
            pseudo.extend([0, 0, 0, 6]);
        }
        _ => panic!("mixed address families"),
    }
    // The pseudo header is 12 or 40 bytes: whole 16-bit words before the segment.
    checksum(&[pseudo.as_slice(), tcp].concat(), 0)
}

/// A SYN-ACK (or any segment) as the tests read it back from a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// (kind, data) of each option but NOP and EOL.
    pub options: Vec<(u8, Vec<u8>)>,
    /// The IPv4 header checksum verifies (true for IPv6, which has none).
    pub ip_csum_ok: bool,
    /// The TCP checksum verifies.
    pub tcp_csum_ok: bool,
    pub vlan: Option<u16>,
    /// Bytes after the TCP header (the IP length says where the segment ends).
    pub payload_len: usize,
}

pub fn parse(f: &[u8]) -> Parsed {
    let mut off = 12;
    let mut vlan = None;
    if f[off..off + 2] == [0x81, 0x00] {
        vlan = Some(u16::from_be_bytes([f[off + 2], f[off + 3]]));
        off += 4;
    }
    let ether = u16::from_be_bytes([f[off], f[off + 1]]);
    off += 2;
    let (src, dst, l4, end, ip_csum_ok): (IpAddr, IpAddr, usize, usize, bool) = if ether == 0x0800 {
        let ip = &f[off..off + 20];
        let s: [u8; 4] = ip[12..16].try_into().unwrap();
        let d: [u8; 4] = ip[16..20].try_into().unwrap();
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        (s.into(), d.into(), off + 20, off + total, checksum(ip, 0) == 0)
    } else {
        let ip = &f[off..off + 40];
        let s: [u8; 16] = ip[8..24].try_into().unwrap();
        let d: [u8; 16] = ip[24..40].try_into().unwrap();
        let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
        (s.into(), d.into(), off + 40, off + 40 + plen, true)
    };
    let t = &f[l4..end];
    let doff = (t[12] >> 4) as usize * 4;
    let mut options = Vec::new();
    let mut i = 20;
    while i < doff {
        match t[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let len = t[i + 1] as usize;
                options.push((kind, t[i + 2..i + len].to_vec()));
                i += len;
            }
        }
    }
    Parsed {
        src,
        dst,
        sport: u16::from_be_bytes([t[0], t[1]]),
        dport: u16::from_be_bytes([t[2], t[3]]),
        seq: u32::from_be_bytes(t[4..8].try_into().unwrap()),
        ack: u32::from_be_bytes(t[8..12].try_into().unwrap()),
        flags: t[13],
        window: u16::from_be_bytes([t[14], t[15]]),
        options,
        ip_csum_ok,
        tcp_csum_ok: l4_checksum(&src, &dst, t) == 0,
        vlan,
        payload_len: t.len() - doff,
    }
}

impl Parsed {
    pub fn option(&self, kind: u8) -> Option<&[u8]> {
        self.options.iter().find(|(k, _)| *k == kind).map(|(_, d)| d.as_slice())
    }
}
