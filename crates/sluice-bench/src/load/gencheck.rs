//! `sluice bench generator`: how fast and how accurately the generator sends,
//! counted by the kernel on the victim's side. The `same-core` testbed gives
//! the generator CPU 0 to itself; the victim's gate drops everything (its
//! cheapest work). What arrived = frames the victim's XDP counted + frames the
//! full veth ring refused (TX drops on the generator's end).
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::load::gen::{stream_value, udp_stream, Generator};
use crate::testbed::victim::{link_stats, VictimBed, VictimModel, IF_A, IF_B};
use sluice::dataplane::gate::Gate;
use sluice::{base::netns, dataplane::classify, policy::config};

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct GenCheck {
    pub asked_pps: f64,
    pub secs: f64,
    pub sent: u64,
    pub late: u64,
    pub ring_drops: u64,
    pub xdp_seen: u64,
    /// (xdp_seen + ring_drops) / (asked x secs) - 1.
    pub error: f64,
}

/// Send 64-byte frames at each rate for `secs`; one testbed for all of them.
pub fn check(rates: &[f64], secs: f64, batch: u32) -> Result<Vec<GenCheck>> {
    sluice::dataplane::gate::check_privileges()?;
    let tb = VictimBed::create("gencheck", VictimModel::SameCore)?;
    let gate = counting_gate(&tb)?;
    tb.apply_model()?;
    let gen = Arc::new(Mutex::new(Generator::load()?));
    let mut out = Vec::new();
    for &rate in rates {
        gate.reset_counters()?;
        let before = link_stats(&tb.net.a, IF_A)?;
        let v = stream_value(
            &udp_stream("check", rate, 64, tb.net.ip_a, 4000, tb.net.ip_b, 9),
            tb.net.mac_b,
            tb.net.mac_a,
        )?;
        let (a, ifx, g, cpu) = (tb.net.a.clone(), tb.net.ifindex_a, gen.clone(), tb.gen_cpu);
        let (counts, run_secs) = netns::run_in(&a, move || {
            netns::pin_thread(cpu)?;
            let mut g = g.lock().unwrap();
            g.set_streams(&[v])?;
            g.run(ifx, Duration::from_secs_f64(secs), batch)
        })?;
        std::thread::sleep(Duration::from_millis(100));
        let xdp_seen = gate.class_counters(0)?[0];
        let ring_drops = link_stats(&tb.net.a, IF_A)?.tx_dropped - before.tx_dropped;
        out.push(GenCheck {
            asked_pps: rate,
            secs: run_secs,
            sent: counts[0].sent,
            late: counts[0].late,
            ring_drops,
            xdp_seen,
            error: (xdp_seen + ring_drops) as f64 / (rate * run_secs) - 1.0,
        });
    }
    Ok(out)
}

/// A gate on vb that counts every frame in class 0 and drops it: the XDP
/// program the generator's live frames need on the receiving end.
pub fn counting_gate(tb: &VictimBed) -> Result<Gate> {
    netns::run_in(&tb.net.b, || {
        let cfg = config::from_flags(&["default:rate=blocked".into()])?;
        let mut g = Gate::load()?;
        g.apply(&cfg, &classify::compile(&cfg)?)?;
        g.attach(IF_B, config::XdpMode::Native, false)?;
        Ok(g)
    })
}
