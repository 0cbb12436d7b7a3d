//! The daemon's statistics as it publishes them: the first snapshot, the
//! classes with their gate ids, and each refresh from the daemon's parts
//! (counters, controllers, budget, sources, readers, kernel drops).
use std::path::PathBuf;

use anyhow::Result;

use crate::base::iface::Iface;
use crate::base::log;
use crate::dataplane::gate::Gate;
use crate::policy::config::Config;
use crate::policy::syn_guard;
use crate::surface::stats::{class_snapshots, ClassSnapshot, Snapshot, SNAPSHOT_VERSION};

use super::Daemon;

/// The classes of `cfg` for a snapshot, with the gate's ids (`gate` runs `cfg`).
pub(super) fn gate_snapshots(cfg: &Config, gate: &Gate) -> Vec<ClassSnapshot> {
    let mut classes = class_snapshots(cfg);
    for c in &mut classes {
        c.gate_id = Some(gate.class_ids().id(c.id).key());
    }
    classes
}

/// The snapshot served from the start, before the first refresh.
pub(super) fn first_snapshot(iface: &Iface, cfg: &Config, gate: &Gate, config_file: Option<PathBuf>) -> Snapshot {
    Snapshot {
        version: SNAPSHOT_VERSION,
        interface: iface.name.clone(),
        ifindex: iface.index,
        xdp_mode: format!("{:?}", cfg.xdp_mode).to_lowercase(),
        prog_id: gate.prog_id(),
        pid: std::process::id(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        config_file: config_file.map(|p| p.display().to_string()),
        classes: gate_snapshots(cfg, gate),
        discover: cfg.discover,
        observe: cfg.observe,
        attached: true,
        ..Default::default()
    }
}

impl Daemon {
    /// Read the counters into the daemon's snapshot and hand it to the servers.
    pub(super) fn refresh_stats(&mut self) -> Result<()> {
        let counters = self.ticker.counter_totals(&self.gate);
        self.publish.counters(&self.gate, &counters)?;
        let snap = &mut self.publish.snap;
        if let Some(a) = &self.ticker.auto {
            for (id, st) in a.status() {
                snap.classes[id].auto = Some(st);
            }
        }
        for (c, l) in snap.classes.iter_mut().zip(self.ticker.late_status()) {
            c.late = l;
        }
        let (distress, throttles) = self.ticker.budget_status();
        snap.distress = distress.map(|(p, why)| format!("priority {p}: {why}"));
        snap.last_distress =
            self.ticker.last_distress().map(|((p, why), ago)| (format!("priority {p}: {why}"), ago.as_secs_f64()));
        let w = &self.ticker.signals;
        snap.signals_unreadable = w.stale_secs().zip(w.last_error.clone());
        for (c, t) in snap.classes.iter_mut().zip(throttles.iter().chain(std::iter::repeat(&None))) {
            c.throttle_pps = *t;
        }
        snap.rx_measured = self.ticker.reads_rx();
        let rx = &self.ticker.rx_cpu;
        let none = std::iter::repeat(&None);
        for ((c, t), m) in
            snap.classes.iter_mut().zip(rx.taken.iter().chain(none.clone())).zip(rx.max.iter().chain(none))
        {
            (c.rx_cpu_taken, c.rx_cpu_taken_max) = (*t, *m);
        }
        for ((c, d), h) in snap.classes.iter_mut().zip(self.ticker.distress_secs()).zip(self.ticker.dropped_with_room())
        {
            (c.distress_secs, c.dropped_with_room_pkts) = (d, h);
        }
        let unavailable = match self.gate.answers_syns() {
            false => Some("the kernel lacks bpf_sk_assign_tcp_reqsk, Linux 6.9"),
            true => self.gate.why_no_cookies(),
        };
        for (c, g) in snap.classes.iter_mut().zip(self.ticker.syn.status(unavailable)) {
            c.syn_guard = g;
        }
        let attached = self.gate.attached_to(snap.ifindex as i32);
        if snap.attached && !attached {
            log::error(format_args!(
                "the gate (prog id {}) is no longer attached to {}: nothing is protected; restart sluice",
                snap.prog_id, self.iface
            ));
        }
        snap.attached = attached;
        self.sources.fill(snap, &self.ticker.fair_status(), self.gate.sources_capacity());
        snap.readers = self.steer.as_ref().map(|(s, _)| s.status()).unwrap_or_default();
        snap.cpu_away = self.protect.describe(&self.cfg, &self.iface);
        snap.tick_ms = Some(self.pace.interval().as_secs_f64() * 1e3);
        snap.wakes = self.pace.wakes;
        snap.wake_ms = self.pace.wake_last.map(|d| d.as_secs_f64() * 1e3);
        snap.wake_max_ms = self.pace.wake_max.map(|d| d.as_secs_f64() * 1e3);
        snap.wake_gate_ns = self.pace.wake_at_ns;
        snap.ticks = self.pace.ticks;
        if let Some((t, book)) = &mut self.tracer {
            self.publish.softirq(t.softirq_secs()?);
            book.update(t, &self.gate.class_ids().names_by_id())?;
            let mut strays = Vec::new();
            for c in self.publish.snap.classes.iter_mut() {
                c.kernel_drops = book.of(t, &c.name);
                c.known_lost_pkts = Some(book.known_lost_of(&c.name));
                let stray = c.kernel_drops.iter().filter(|d| syn_guard::STRAY_REASONS.contains(&d.reason.as_str()));
                strays.push((c.name.clone(), stray.map(|d| d.packets).sum()));
            }
            self.ticker.syn.kernel_strays(&strays, std::time::Instant::now());
            for (class, n) in book.known_lost_due(std::time::Instant::now()) {
                let limit = self.publish.snap.classes.iter().find(|c| c.name == class).map_or(String::new(), |c| {
                    // An auto class's rate is its controller's; its sockets' fill, the last tick's.
                    let rate = c.auto.as_ref().map_or(c.rate_pps.map(|r| r as f64), |a| a.rate_pps);
                    let limit = rate.map_or("unlimited".into(), |r| format!("limited at {r:.0} pkt/s"));
                    let fill = c.auto.as_ref().filter(|a| a.rcvbuf_bytes > 0).map_or(String::new(), |a| {
                        format!(
                            ", its fullest socket {:.0}% full",
                            100.0 * a.queued_bytes as f64 / a.rcvbuf_bytes as f64
                        )
                    });
                    format!("; the class {limit}{fill}")
                });
                log::warn(format_args!(
                    "known lost: {n} of {class}'s known clients' datagrams dropped after the gate admitted them{limit}"
                ));
            }
        }
        self.publish.publish();
        Ok(())
    }
}
