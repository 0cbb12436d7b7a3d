//! The one testbed: two network namespaces made for one run ("A", the sender,
//! and "B", the service and the gate) joined by a veth pair `va` <-> `vb`,
//! with addresses that exist only inside them and static neighbours (no
//! ARP/ND exchange in the middle of a flood). The tests, the bench and the
//! demo all build on it. Dropping it deletes both namespaces, and with them
//! the veth pair and any XDP program attached to it (an RAII guard, like aya's
//! `PeerNsGuard` or cilium/ebpf's `testutils.NewNetNS`).
use std::net::IpAddr;
use std::path::Path;

use anyhow::{Context, Result};

use sluice::base::netns::sh;

/// The veth end in A and in B.
pub const IF_A: &str = "va";
pub const IF_B: &str = "vb";
/// The addresses of A and B (inside the namespaces only).
pub const IP_A: &str = "10.77.0.1";
pub const IP_B: &str = "10.77.0.2";
pub const IP6_A: &str = "fd77::1";
pub const IP6_B: &str = "fd77::2";

/// What to make.
#[derive(Debug, Clone, Copy)]
pub struct TestbedOpts<'a> {
    /// Namespace names start with this (`cleanup_leftovers` finds them by it).
    pub prefix: &'a str,
    /// IPv6 addresses too; false turns IPv6 off in both namespaces (no router
    /// or neighbour solicitations to disturb exact packet counts).
    pub ipv6: bool,
    /// Queues of each veth end. 1: one each way, as the tests had always.
    /// With more, a sender's queue is its CPU's (XPS on each end's transmit
    /// queues; the kernel puts live frames on queue cpu % queues), as RSS
    /// gives each flow a queue: what is sent on CPU n enters the peer on
    /// queue n, whose NAPI then runs on CPU n.
    pub queues: u32,
}

pub struct Testbed {
    /// Namespace names.
    pub a: String,
    pub b: String,
    pub ip_a: IpAddr,
    pub ip_b: IpAddr,
    pub ip6_a: IpAddr,
    pub ip6_b: IpAddr,
    pub mac_a: [u8; 6],
    pub mac_b: [u8; 6],
    /// Index of `va` inside A.
    pub ifindex_a: u32,
}

impl Testbed {
    /// Make namespaces PREFIX-TAG-a and PREFIX-TAG-b, the veth pair, the
    /// addresses and the neighbours. What exists is removed again if a step fails.
    pub fn create(opts: TestbedOpts, tag: &str) -> Result<Testbed> {
        let base = format!("{}{tag}", opts.prefix);
        let (a, b) = (format!("{base}-a"), format!("{base}-b"));
        sh(&["ip", "netns", "add", &a])?;
        // From here on, Drop removes what exists.
        let mut tb = Testbed {
            a,
            b,
            ip_a: IP_A.parse().expect("an address"),
            ip_b: IP_B.parse().expect("an address"),
            ip6_a: IP6_A.parse().expect("an address"),
            ip6_b: IP6_B.parse().expect("an address"),
            mac_a: [0; 6],
            mac_b: [0; 6],
            ifindex_a: 0,
        };
        sh(&["ip", "netns", "add", &tb.b])?;
        let q = opts.queues.max(1).to_string();
        let queues = ["numtxqueues", &q, "numrxqueues", &q];
        let mut add = vec!["ip", "-n", &tb.a, "link", "add", IF_A];
        add.extend(queues);
        add.extend(["type", "veth", "peer", "name", IF_B]);
        add.extend(queues);
        add.extend(["netns", &tb.b]);
        sh(&add)?;
        if opts.queues > 1 {
            for (ns, ifc) in [(&tb.a, IF_A), (&tb.b, IF_B)] {
                let each: Vec<String> = (0..opts.queues as usize)
                    .map(|q| format!("echo {} > /sys/class/net/{ifc}/queues/tx-{q}/xps_cpus", cpu_mask(q)))
                    .collect();
                sh(&["ip", "netns", "exec", ns, "sh", "-c", &each.join("; ")])
                    .with_context(|| format!("setting XPS on {ifc}: a transmit queue per CPU"))?;
            }
        }
        for (ns, ifc, ip, ip6) in [(&tb.a, IF_A, tb.ip_a, tb.ip6_a), (&tb.b, IF_B, tb.ip_b, tb.ip6_b)] {
            if opts.ipv6 {
                sh(&["ip", "-n", ns, "addr", "add", &format!("{ip6}/64"), "dev", ifc, "nodad"])?;
            } else {
                sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
            }
            sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", ifc])?;
            sh(&["ip", "-n", ns, "link", "set", ifc, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        let ia = link_info(&tb.a, IF_A)?;
        let ib = link_info(&tb.b, IF_B)?;
        tb.mac_a = parse_mac(ia["address"].as_str().unwrap_or_default())?;
        tb.mac_b = parse_mac(ib["address"].as_str().unwrap_or_default())?;
        tb.ifindex_a = ia["ifindex"].as_u64().context("ifindex of va")? as u32;
        tb.static_neighbours(opts.ipv6)?;
        Ok(tb)
    }

    fn static_neighbours(&self, ipv6: bool) -> Result<()> {
        let mut entries = vec![(&self.a, IF_A, self.ip_b, self.mac_b), (&self.b, IF_B, self.ip_a, self.mac_a)];
        if ipv6 {
            entries.extend([(&self.a, IF_A, self.ip6_b, self.mac_b), (&self.b, IF_B, self.ip6_a, self.mac_a)]);
        }
        for (ns, ifc, peer_ip, peer_mac) in entries {
            let (ip, mac) = (peer_ip.to_string(), format_mac(peer_mac));
            sh(&["ip", "-n", ns, "neigh", "replace", &ip, "lladdr", &mac, "dev", ifc, "nud", "permanent"])?;
        }
        Ok(())
    }

    /// Write a file as seen from namespace B (its /sys/class/net is B's).
    pub fn write_in_b(&self, path: &str, value: &str) -> Result<()> {
        sh(&["ip", "netns", "exec", &self.b, "sh", "-c", &format!("echo {value} > {path}")])?;
        Ok(())
    }

    /// Write `value` into a file of every receive queue of B's interface
    /// (`rps_cpus`, say), as seen from namespace B.
    pub fn write_rx_queues_in_b(&self, file: &str, value: &str) -> Result<()> {
        let each = format!("for q in /sys/class/net/{IF_B}/queues/rx-*; do echo {value} > $q/{file} || exit 1; done");
        sh(&["ip", "netns", "exec", &self.b, "sh", "-c", &each])?;
        Ok(())
    }

    /// The id of the XDP program attached to B's interface, if any.
    pub fn attached_prog(&self) -> Result<Option<u64>> {
        xdp_prog(&self.b, IF_B)
    }
}

/// The id of the XDP program on interface `ifname` of namespace `ns`, if any.
pub fn xdp_prog(ns: &str, ifname: &str) -> Result<Option<u64>> {
    Ok(link_info(ns, ifname)?["xdp"]["prog"]["id"].as_u64())
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = std::process::Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn link_info(ns: &str, ifname: &str) -> Result<serde_json::Value> {
    let out = sh(&["ip", "-n", ns, "-j", "link", "show", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v[0].clone())
}

/// A MAC address from its text form.
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let v: Vec<u8> = s.trim().split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>()?;
    v.try_into().map_err(|_| anyhow::anyhow!("not a MAC address: {s}"))
}

/// A MAC address in its text form.
pub fn format_mac(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Does a network namespace of this name exist?
pub fn netns_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists()
}

/// Delete every namespace whose name starts with `prefix` (what a killed run
/// left behind); returns their names.
pub fn cleanup_leftovers(prefix: &str) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let list = sh(&["ip", "netns", "list"])?;
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(prefix) {
            sh(&["ip", "netns", "del", name])?;
            removed.push(name.to_string());
        }
    }
    Ok(removed)
}

/// Hold `lock` for the rest of a test: the tests of one binary that load
/// the CPUs (floods, spinners) take turns, as the harness runs as many at
/// once as there are CPUs, and a flood beside a test's service costs that
/// service datagrams of its own. A test that panicked holding it leaves it
/// poisoned; the next one takes it anyway.
pub fn one_at_a_time(lock: &'static std::sync::Mutex<()>) -> std::sync::MutexGuard<'static, ()> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kernel's cpumask text for one CPU (rps_cpus, xps_cpus and the like):
/// 32-bit hex words, highest first, comma-separated ("1" for CPU 0,
/// "8,00000000" for CPU 35), so any CPU number fits, not only the first 64.
pub fn cpu_mask(cpu: usize) -> String {
    let mut words = vec![format!("{:x}", 1u32 << (cpu % 32))];
    words.extend(std::iter::repeat_n("00000000".to_string(), cpu / 32));
    words.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_mask_has_a_word_for_every_32_cpus_below_it() {
        assert_eq!(cpu_mask(0), "1");
        assert_eq!(cpu_mask(1), "2");
        assert_eq!(cpu_mask(31), "80000000");
        assert_eq!(cpu_mask(35), "8,00000000");
        assert_eq!(cpu_mask(64), "1,00000000,00000000", "1 << 64 overflowed a u64");
    }

    #[test]
    fn mac_addresses_round_trip() {
        let m = parse_mac("02:00:0a:ff:00:01").unwrap();
        assert_eq!(m, [2, 0, 10, 255, 0, 1]);
        assert_eq!(format_mac(m), "02:00:0a:ff:00:01");
        assert!(parse_mac("02:00").is_err());
    }
}
