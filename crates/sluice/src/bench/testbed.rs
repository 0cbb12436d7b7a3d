//! The bench's testbed: two network namespaces made for one run (generator
//! "A", victim "B") joined by a veth pair, addresses that exist only inside
//! them, and the victim model that decides which CPU runs which stage.
//! Dropping a Testbed deletes both namespaces, and with them the veth pair and
//! anything attached to it; `cleanup_leftovers` removes those of a killed run.
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::gen::parse_mac;
use crate::netns::sh;

/// Every bench namespace's name starts with this.
pub const NS_PREFIX: &str = "sluice-bench-";
pub const IF_A: &str = "va";
pub const IF_B: &str = "vb";

/// Which CPU runs which receive stage on the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VictimModel {
    /// Threaded NAPI on the victim interface, its kthread pinned to the victim
    /// CPU with the service: receive work (XDP, the stack) competes with the
    /// service for one core.
    SameCore,
    /// NAPI and XDP on the generator's CPU (like a NIC that drops in hardware),
    /// RPS sending the IP/UDP stack's work to the victim CPU, where it runs in
    /// softirq and pre-empts the service: the mode that livelocks.
    Nic,
}

impl VictimModel {
    pub fn name(self) -> &'static str {
        match self {
            VictimModel::SameCore => "same-core",
            VictimModel::Nic => "nic",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<VictimModel> {
        match s {
            "same-core" => Ok(VictimModel::SameCore),
            "nic" => Ok(VictimModel::Nic),
            other => anyhow::bail!("unknown victim model \"{other}\"; valid: \"nic\", \"same-core\""),
        }
    }

    /// Which CPU runs which stage, for the report.
    pub fn stages(self, gen_cpu: usize, victim_cpu: usize) -> Vec<(String, usize)> {
        let (napi, stack) = match self {
            VictimModel::SameCore => (victim_cpu, victim_cpu),
            VictimModel::Nic => (gen_cpu, victim_cpu),
        };
        vec![
            ("generator (BPF live frames)".into(), gen_cpu),
            ("veth NAPI + XDP gate".into(), napi),
            ("IP/UDP stack (softirq)".into(), stack),
            ("service".into(), victim_cpu),
        ]
    }
}

pub struct Testbed {
    pub a: String,
    pub b: String,
    pub model: VictimModel,
    pub gen_cpu: usize,
    pub victim_cpu: usize,
    pub ip_a: IpAddr,
    pub ip_b: IpAddr,
    pub ip6_a: IpAddr,
    pub ip6_b: IpAddr,
    pub mac_a: [u8; 6],
    pub mac_b: [u8; 6],
    /// Index of va inside A.
    pub ifindex_a: u32,
}

fn link_info(ns: &str, ifname: &str) -> Result<serde_json::Value> {
    let out = sh(&["ip", "-n", ns, "-j", "link", "show", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v[0].clone())
}

/// An interface's packet counters (`ip -s link`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub rx_dropped: u64,
    pub tx_packets: u64,
    /// On a veth end: frames the peer's full ring refused.
    pub tx_dropped: u64,
}

pub fn link_stats(ns: &str, ifname: &str) -> Result<LinkStats> {
    let out = sh(&["ip", "-n", ns, "-s", "-j", "link", "show", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let st = &v[0]["stats64"];
    let n = |a: &str, b: &str| st[a][b].as_u64().unwrap_or(0);
    Ok(LinkStats {
        rx_packets: n("rx", "packets"),
        rx_dropped: n("rx", "dropped"),
        tx_packets: n("tx", "packets"),
        tx_dropped: n("tx", "dropped"),
    })
}

impl Testbed {
    /// Make the namespaces, the veth pair and the addresses.
    pub fn create(tag: &str, model: VictimModel, gen_cpu: usize, victim_cpu: usize) -> Result<Testbed> {
        let base = format!("{NS_PREFIX}{}-{tag}", std::process::id());
        let (a, b) = (format!("{base}-a"), format!("{base}-b"));
        sh(&["ip", "netns", "add", &a])?;
        // From here on, Drop removes what exists.
        let mut tb = Testbed {
            a,
            b,
            model,
            gen_cpu,
            victim_cpu,
            ip_a: "10.77.0.1".parse().unwrap(),
            ip_b: "10.77.0.2".parse().unwrap(),
            ip6_a: "fd77::1".parse().unwrap(),
            ip6_b: "fd77::2".parse().unwrap(),
            mac_a: [0; 6],
            mac_b: [0; 6],
            ifindex_a: 0,
        };
        sh(&["ip", "netns", "add", &tb.b])?;
        sh(&["ip", "-n", &tb.a, "link", "add", IF_A, "type", "veth", "peer", "name", IF_B, "netns", &tb.b])?;
        for (ns, ifc, ip, ip6) in [(&tb.a, IF_A, tb.ip_a, tb.ip6_a), (&tb.b, IF_B, tb.ip_b, tb.ip6_b)] {
            sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", ifc])?;
            sh(&["ip", "-n", ns, "addr", "add", &format!("{ip6}/64"), "dev", ifc, "nodad"])?;
            sh(&["ip", "-n", ns, "link", "set", ifc, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        let ia = link_info(&tb.a, IF_A)?;
        let ib = link_info(&tb.b, IF_B)?;
        tb.mac_a = parse_mac(ia["address"].as_str().unwrap_or_default())?;
        tb.mac_b = parse_mac(ib["address"].as_str().unwrap_or_default())?;
        tb.ifindex_a = ia["ifindex"].as_u64().context("ifindex of va")? as u32;
        // Static neighbours: no ARP/ND exchanges in the middle of a flood.
        let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        for (ns, ifc, peer_ip, peer_mac) in [
            (&tb.a, IF_A, tb.ip_b, tb.mac_b),
            (&tb.a, IF_A, tb.ip6_b, tb.mac_b),
            (&tb.b, IF_B, tb.ip_a, tb.mac_a),
            (&tb.b, IF_B, tb.ip6_a, tb.mac_a),
        ] {
            sh(&["ip", "-n", ns, "neigh", "replace", &peer_ip.to_string(), "lladdr", &mac(peer_mac), "dev", ifc, "nud", "permanent"])?;
        }
        Ok(tb)
    }

    /// Put the victim model in place. Call it after every XDP attach on vb:
    /// attaching re-creates the threaded-NAPI kthread, unpinned.
    pub fn apply_model(&self) -> Result<()> {
        let rps = format!("/sys/class/net/{IF_B}/queues/rx-0/rps_cpus");
        let threaded = format!("/sys/class/net/{IF_B}/threaded");
        match self.model {
            VictimModel::SameCore => {
                self.write_in_b(&rps, "0")?;
                self.write_in_b(&threaded, "1")?;
                let pids = self.napi_threads()?;
                if pids.is_empty() {
                    bail!("threaded NAPI on {IF_B} made no napi/{IF_B}-* kthread (is an XDP program attached?)");
                }
                for pid in pids {
                    sh(&["taskset", "-pc", &self.victim_cpu.to_string(), &pid.to_string()])?;
                }
            }
            VictimModel::Nic => {
                self.write_in_b(&threaded, "0")?;
                self.write_in_b(&rps, &format!("{:x}", 1u64 << self.victim_cpu))?;
            }
        }
        Ok(())
    }

    /// Write a sysfs file as seen from namespace B (its /sys/class/net).
    fn write_in_b(&self, path: &str, value: &str) -> Result<()> {
        sh(&["ip", "netns", "exec", &self.b, "sh", "-c", &format!("echo {value} > {path}")])?;
        Ok(())
    }

    /// Pids of the napi/vb-* kthreads.
    pub fn napi_threads(&self) -> Result<Vec<u32>> {
        // Threaded NAPI kthreads appear a moment after the switch.
        for _ in 0..50 {
            let mut pids = Vec::new();
            for e in std::fs::read_dir("/proc")?.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                // A napi kthread carries no namespace: one bench testbed runs at a
                // time (`sluice bench` and its tests never run two), so any napi/vb-* is ours.
                if comm.trim().starts_with(&format!("napi/{IF_B}-")) {
                    pids.push(pid);
                }
            }
            if !pids.is_empty() {
                return Ok(pids);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(vec![])
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = std::process::Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Delete the namespaces a killed bench left behind; returns their names.
pub fn cleanup_leftovers() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let list = sh(&["ip", "netns", "list"])?;
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(NS_PREFIX) {
            sh(&["ip", "netns", "del", name])?;
            removed.push(name.to_string());
        }
    }
    Ok(removed)
}
