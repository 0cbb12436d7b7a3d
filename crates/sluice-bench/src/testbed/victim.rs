//! The bench's testbed: the one testbed (`sluice_testkit::testbed`: namespaces A and
//! B, the veth pair, addresses) under the bench's namespace prefix, plus the
//! victim model that decides which CPU runs which receive stage. Dropping it
//! removes the namespaces; `cleanup_leftovers` removes those of a killed run.
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use sluice::base::netns::sh;
pub use sluice_testkit::testbed::{cpu_mask, IF_A, IF_B};
use sluice_testkit::testbed::{Testbed, TestbedOpts};

/// Every bench namespace's name starts with this.
pub const NS_PREFIX: &str = "sluice-bench-";

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

/// The testbed with a victim model in place.
pub struct VictimBed {
    pub net: Testbed,
    pub model: VictimModel,
    pub gen_cpu: usize,
    pub victim_cpu: usize,
    /// Where the daemon and the rig's tick run (`cpu_plan::Plan::control`).
    pub control_cpu: Option<usize>,
    /// Queues of each veth end.
    pub queues: u32,
}

impl VictimBed {
    /// Make the testbed (sluice-bench-PID-TAG-a/b, with IPv6) on the CPU
    /// plan's CPUs (`cpu_plan::here`), with a queue per CPU. The model is
    /// put in place by `apply_model`, after the XDP programs are attached.
    pub fn create(tag: &str, model: VictimModel) -> Result<VictimBed> {
        VictimBed::with_queues(tag, model, crate::testbed::cpu_plan::queues())
    }

    /// `create` with `queues` queues on each veth end (1: every sender
    /// shares one, as the bench had before issue 51).
    pub fn with_queues(tag: &str, model: VictimModel, queues: u32) -> Result<VictimBed> {
        let opts = TestbedOpts { prefix: NS_PREFIX, ipv6: true, queues };
        let net = Testbed::create(opts, &format!("{}-{tag}", std::process::id()))?;
        let plan = crate::testbed::cpu_plan::here();
        Ok(VictimBed {
            net,
            model,
            gen_cpu: plan.generator(),
            victim_cpu: plan.service,
            control_cpu: plan.control,
            queues: queues.max(1),
        })
    }

    /// Put the victim model in place. Call it after every XDP attach on vb:
    /// attaching re-creates the threaded-NAPI kthread, unpinned.
    pub fn apply_model(&self) -> Result<()> {
        let threaded = format!("/sys/class/net/{IF_B}/threaded");
        match self.model {
            VictimModel::SameCore => {
                self.net.write_rx_queues_in_b("rps_cpus", "0")?;
                self.net.write_in_b(&threaded, "1")?;
                let pids = self.napi_threads()?;
                if pids.is_empty() {
                    bail!("threaded NAPI on {IF_B} made no napi/{IF_B}-* kthread (is an XDP program attached?)");
                }
                for pid in pids {
                    sh(&["taskset", "-pc", &self.victim_cpu.to_string(), &pid.to_string()])?;
                }
            }
            VictimModel::Nic => {
                self.net.write_in_b(&threaded, "0")?;
                self.steer_rps()?;
            }
        }
        Ok(())
    }

    /// The nic model's receive side: vb's stack on the victim CPU (RPS),
    /// beside the service. (`apply_model` does it too, with threaded NAPI
    /// off, which vb takes only with an XDP program attached.)
    pub fn steer_rps(&self) -> Result<()> {
        self.net.write_rx_queues_in_b("rps_cpus", &cpu_mask(self.victim_cpu))
    }

    /// Pids of vb's napi kthreads (as the kernel lists them in B), waiting
    /// for them a moment: they appear a little after threaded NAPI is
    /// switched on.
    pub fn napi_threads(&self) -> Result<Vec<i32>> {
        for _ in 0..50 {
            let pids = sluice::base::netns::run_in(&self.net.b, || {
                Ok(sluice::daemon::sched::napi_threads(&sluice::dataplane::gate::iface(IF_B)?))
            })?;
            if !pids.is_empty() {
                return Ok(pids);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(vec![])
    }
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
    // A counter ip does not show is an error, never 0 drops.
    let n = |a: &str, b: &str| {
        st[a][b].as_u64().with_context(|| format!("`ip -s -j link show {ifname}` in {ns} has no stats64.{a}.{b}"))
    };
    Ok(LinkStats {
        rx_packets: n("rx", "packets")?,
        rx_dropped: n("rx", "dropped")?,
        tx_packets: n("tx", "packets")?,
        tx_dropped: n("tx", "dropped")?,
    })
}

/// Frames each receive queue of a veth end ran XDP on (`ethtool -S`'s
/// rx_queue_N_xdp_packets, the veth driver's own per-queue counters), by
/// queue number: where each sender entered.
pub fn queue_xdp_packets(ns: &str, ifname: &str) -> Result<Vec<u64>> {
    let out = sh(&["ip", "netns", "exec", ns, "ethtool", "-S", ifname])?;
    let mut queues: Vec<(usize, u64)> = out
        .lines()
        .filter_map(|l| {
            let (name, value) = l.trim().split_once(": ")?;
            let q = name.strip_prefix("rx_queue_")?.strip_suffix("_xdp_packets")?;
            Some((q.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect();
    queues.sort();
    anyhow::ensure!(
        !queues.is_empty() && queues.iter().enumerate().all(|(i, &(q, _))| i == q),
        "`ethtool -S {ifname}` in {ns} has no rx_queue_N_xdp_packets for every queue:\n{out}"
    );
    Ok(queues.into_iter().map(|(_, n)| n).collect())
}

/// Delete the namespaces a killed bench left behind; returns their names.
pub fn cleanup_leftovers() -> Result<Vec<String>> {
    sluice_testkit::testbed::cleanup_leftovers(NS_PREFIX)
}
