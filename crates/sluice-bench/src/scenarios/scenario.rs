//! Bench scenarios: which victim models, configurations, load levels and
//! streams a run measures. A TOML file or a built-in by name.
//!
//! ```toml
//! name = "mine"
//! models = ["nic", "same-core"]     # victim models (see victim.rs)
//! configs = ["off", "nft", "static"]
//! levels = [0.25, 0.5, 1, 2, 5, 10] # multiples of the calibrated peak
//! duration = 5.0                    # seconds measured per level
//! warmup = 1.0                      # seconds discarded before each measurement
//! repeats = 3                       # runs per level (median, min-max reported)
//! max_rate = 3000000                # generator cap, packets/s
//! static_rate = 1.0                 # the static gate's rate, as a multiple of the peak
//! gen_batch = 64                    # generator frames per flush: bursts never exceed it
//!
//! [victim]
//! port = 7000
//! work_ns = 2000                    # CPU per datagram of `sluice-bench serve udp-echo`
//! readers = 1                       # its reader threads (SO_REUSEPORT sockets)
//! # command = "my-server --port {port}"   # or any external server, run pinned in the victim namespace
//!
//! [[stream]]                        # the flood: its rate is share x the level's load
//! name = "flood"
//! share = 1.0
//! frame = 64
//! flows = 64                        # source ports
//! sources = 16                      # source addresses
//!
//! [[stream]]                        # the legitimate probe: fixed rate, stamped, echoed, timed
//! name = "legit"
//! rate = 1000
//! frame = 128
//! legit = true
//! ```
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

use crate::testbed::victim::VictimModel;

/// Version of the results JSON schema (results.json); bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 2;

/// A configuration of the victim compared in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigKind {
    /// A pass-through XDP program (the gate with no limit), so the victim's path is the same.
    Off,
    /// nftables `limit rate` on the victim: admission after the stack has paid.
    Nft,
    /// The gate at a static rate.
    Static,
    /// The gate with `rate = "auto"`, capacity algorithm.
    Auto,
    /// The gate with `rate = "auto"`, perturb and observe (Macpherson, "Performing Under Overload").
    AutoPno,
    /// `auto` plus the napi kthread at SCHED_IDLE (same-core model only).
    AutoIdle,
}

impl ConfigKind {
    pub const ALL: [ConfigKind; 6] = [
        ConfigKind::Off,
        ConfigKind::Nft,
        ConfigKind::Static,
        ConfigKind::Auto,
        ConfigKind::AutoPno,
        ConfigKind::AutoIdle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConfigKind::Off => "off",
            ConfigKind::Nft => "nft",
            ConfigKind::Static => "static",
            ConfigKind::Auto => "auto",
            ConfigKind::AutoPno => "auto-pno",
            ConfigKind::AutoIdle => "auto-idle",
        }
    }

    pub fn parse(s: &str) -> Result<ConfigKind> {
        ConfigKind::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| {
            anyhow::anyhow!("unknown configuration \"{s}\"; valid: {:?}", ConfigKind::ALL.map(|c| c.name()))
        })
    }

    /// False for configurations a victim model cannot run (auto-idle needs
    /// the same-core model's napi kthread); the sweep skips them.
    pub fn applies_to(self, model: VictimModel) -> bool {
        self != ConfigKind::AutoIdle || model == VictimModel::SameCore
    }

    /// The controller's algorithm, for the auto configurations.
    pub fn algo(self) -> Option<sluice::policy::controller::Algo> {
        match self {
            ConfigKind::Auto | ConfigKind::AutoIdle => Some(sluice::policy::controller::Algo::Capacity),
            ConfigKind::AutoPno => Some(sluice::policy::controller::Algo::Pno),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Victim {
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "default_work")]
    pub work_ns: u64,
    /// Reader threads of `sluice-bench serve udp-echo` (SO_REUSEPORT sockets).
    #[serde(default = "one")]
    pub readers: u32,
    /// An external server command; "{port}" is replaced. Default: `sluice-bench serve udp-echo`.
    #[serde(default)]
    pub command: Option<String>,
    /// A second, low-priority service on this port (same command, same CPU):
    /// the victim then has two classes, "svc" (priority 0, `port`) and "bulk"
    /// (priority 1, `bulk_port`); `static` limits only "bulk".
    #[serde(default)]
    pub bulk_port: Option<u16>,
    /// SO_RCVBUF of the built-in service's sockets (bytes; default: the
    /// kernel's). On veth with XDP every datagram takes a 4 KiB page, so the
    /// default 208 KiB holds about 50 datagrams: half a millisecond at 100k/s.
    /// A larger buffer turns the service's short stalls into queueing delay
    /// instead of drops.
    #[serde(default)]
    pub rcvbuf: Option<usize>,
}

fn default_port() -> u16 {
    7000
}
fn default_work() -> u64 {
    2000
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stream {
    pub name: String,
    /// Fixed packets/s ...
    #[serde(default)]
    pub rate: Option<f64>,
    /// ... or this fraction of each level's load.
    #[serde(default)]
    pub share: Option<f64>,
    #[serde(default = "default_frame")]
    pub frame: u32,
    #[serde(default = "one")]
    pub flows: u32,
    /// Source addresses (flood streams only), from 10.77.0.10 / fd77::10 on.
    #[serde(default = "one")]
    pub sources: u32,
    /// Destination port (default: the victim's) and how many from there.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default = "one")]
    pub dports: u32,
    #[serde(default)]
    pub ipv6: bool,
    /// The legitimate probe: stamped, echoed by the service, replies counted and timed.
    #[serde(default)]
    pub legit: bool,
}

fn default_frame() -> u32 {
    64
}
fn one() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub models: Vec<VictimModel>,
    pub configs: Vec<ConfigKind>,
    pub levels: Vec<f64>,
    #[serde(default = "default_duration")]
    pub duration: f64,
    #[serde(default = "default_warmup")]
    pub warmup: f64,
    #[serde(default = "default_repeats")]
    pub repeats: u32,
    #[serde(default = "default_max_rate")]
    pub max_rate: f64,
    #[serde(default = "default_static")]
    pub static_rate: f64,
    /// Generator frames per flush (1..=256; bursts never exceed it).
    #[serde(default = "default_batch")]
    pub gen_batch: u32,
    pub victim: Victim,
    #[serde(rename = "stream")]
    pub streams: Vec<Stream>,
}

fn default_duration() -> f64 {
    5.0
}
fn default_warmup() -> f64 {
    1.0
}
fn default_repeats() -> u32 {
    3
}
fn default_max_rate() -> f64 {
    3e6
}
fn default_static() -> f64 {
    1.0
}
fn default_batch() -> u32 {
    crate::load::gen::DEFAULT_BATCH
}

impl Scenario {
    /// Check what serde cannot; errors name the field.
    pub fn validate(&self) -> Result<()> {
        ensure!(!self.models.is_empty(), "field `models`: name at least one of \"nic\", \"same-core\"");
        ensure!(
            !self.configs.is_empty(),
            "field `configs`: name at least one of {:?}",
            ConfigKind::ALL.map(|c| c.name())
        );
        ensure!(
            !self.configs.contains(&ConfigKind::AutoIdle) || self.models.contains(&VictimModel::SameCore),
            "field `configs`: \"auto-idle\" needs the same-core model (the nic model has no napi kthread)"
        );
        ensure!(
            self.victim.bulk_port.is_none_or(|b| b != self.victim.port && b > 0),
            "field `victim.bulk_port`: a port other than victim.port"
        );
        ensure!(
            !self.levels.is_empty() && self.levels.iter().all(|l| l.is_finite() && *l > 0.0 && *l <= 1000.0),
            "field `levels`: multiples of the peak, each above 0 and at most 1000"
        );
        ensure!(self.duration >= 0.2 && self.duration <= 600.0, "field `duration`: 0.2 to 600 seconds");
        ensure!(self.warmup >= 0.0 && self.warmup <= 60.0, "field `warmup`: 0 to 60 seconds");
        ensure!((1..=20).contains(&self.repeats), "field `repeats`: 1 to 20");
        ensure!(self.max_rate >= 1000.0 && self.max_rate <= 20e6, "field `max_rate`: 1000 to 20000000 packets/s");
        ensure!(
            self.static_rate > 0.0 && self.static_rate <= 10.0,
            "field `static_rate`: a multiple of the peak, above 0 and at most 10"
        );
        ensure!((1..=256).contains(&self.gen_batch), "field `gen_batch`: 1 to 256 frames per flush");
        ensure!(self.victim.port > 0, "field `victim.port`: 1 to 65535");
        ensure!(self.victim.work_ns <= 10_000_000, "field `victim.work_ns`: at most 10000000 ns");
        ensure!((1..=256).contains(&self.victim.readers), "field `victim.readers`: 1 to 256");
        ensure!(
            self.victim.rcvbuf.is_none_or(|b| (4096..=1 << 30).contains(&b)),
            "field `victim.rcvbuf`: 4096 to 1073741824 bytes"
        );
        ensure!(!self.streams.is_empty(), "field `stream`: at least one [[stream]]");
        ensure!(self.streams.len() <= 8, "field `stream`: at most 8 streams");
        ensure!(
            self.streams.iter().filter(|s| s.legit).count() <= 1,
            "field `stream.legit`: at most one legitimate stream"
        );
        for s in &self.streams {
            let f = |x: &str| format!("field `stream.{x}` (stream \"{}\")", s.name);
            match (s.rate, s.share) {
                (Some(r), None) => ensure!(r > 0.0 && r <= 20e6, "{}: 1 to 20000000 packets/s", f("rate")),
                (None, Some(sh)) => {
                    ensure!(sh > 0.0 && sh <= 1.0, "{}: a fraction of the level, above 0 and at most 1", f("share"))
                }
                _ => bail!("{}: give exactly one of rate (packets/s) or share (of the level)", f("rate")),
            }
            ensure!((60..=1514).contains(&s.frame), "{}: 60 to 1514 bytes", f("frame"));
            let min = if s.ipv6 { 62 } else { 42 } + if s.legit { 16 } else { 0 };
            ensure!(s.frame >= min, "{}: at least {min} bytes for this stream", f("frame"));
            ensure!((1..=4096).contains(&s.flows), "{}: 1 to 4096", f("flows"));
            ensure!((1..=200).contains(&s.sources), "{}: 1 to 200", f("sources"));
            ensure!(!(s.legit && s.sources > 1), "{}: the legitimate stream has one source", f("sources"));
            ensure!((1..=4096).contains(&s.dports), "{}: 1 to 4096", f("dports"));
            ensure!(!(s.legit && (s.flows > 1 || s.dports > 1)), "{}: the legitimate stream is one flow", f("flows"));
        }
        ensure!(
            self.streams.iter().any(|s| s.share.is_some()),
            "field `stream.share`: at least one stream must follow the level (share = ...)"
        );
        Ok(())
    }
}

pub fn from_toml(src: &str, origin: &str) -> Result<Scenario> {
    let s: Scenario = toml::from_str(src).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    s.validate().with_context(|| format!("{origin}: invalid scenario"))?;
    Ok(s)
}

const DEFAULT: &str = r#"
name = "default"
models = ["nic", "same-core"]
configs = ["off", "nft", "static"]
levels = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20]
[victim]
port = 7000
work_ns = 2000
[[stream]]
name = "flood"
share = 1.0
frame = 64
flows = 64
sources = 16
[[stream]]
name = "legit"
rate = 1000
frame = 128
legit = true
"#;

/// The demo: the default's streams, the nic model, off vs static vs auto, short.
fn demo() -> Scenario {
    let mut s = from_toml(DEFAULT, "built-in scenario default").expect("the default scenario is valid");
    s.name = "demo".into();
    s.models = vec![VictimModel::Nic];
    s.configs = vec![ConfigKind::Off, ConfigKind::Static, ConfigKind::Auto];
    s.levels = vec![0.5, 1.0, 2.0, 5.0, 10.0];
    (s.duration, s.warmup, s.repeats) = (2.0, 0.5, 1);
    s
}

/// The auto targets: both models, the auto configurations beside off and
/// static, the issue's overload levels.
fn auto() -> Scenario {
    let mut s = from_toml(DEFAULT, "built-in scenario default").expect("the default scenario is valid");
    s.name = "auto".into();
    s.configs = vec![ConfigKind::Off, ConfigKind::Static, ConfigKind::Auto, ConfigKind::AutoPno, ConfigKind::AutoIdle];
    s.levels = vec![0.5, 1.0, 1.5, 3.0, 10.0, 20.0];
    (s.duration, s.warmup, s.repeats) = (3.0, 1.0, 2);
    s
}

/// Priority: a high-priority legitimate service keeps its traffic while a
/// low-priority service on another port is flooded.
fn priority() -> Scenario {
    let mut s = from_toml(DEFAULT, "built-in scenario default").expect("the default scenario is valid");
    s.name = "priority".into();
    s.configs = vec![ConfigKind::Off, ConfigKind::Static, ConfigKind::Auto, ConfigKind::AutoIdle];
    s.levels = vec![0.5, 1.0, 3.0, 10.0];
    s.victim.bulk_port = Some(7001);
    (s.duration, s.warmup, s.repeats) = (3.0, 1.0, 1);
    for st in &mut s.streams {
        if st.legit {
            st.rate = Some(5_000.0);
        } else {
            st.port = Some(7001);
        }
    }
    s
}

/// For tests: the demo at two levels, 1 s each, a lighter flood and probe.
fn quick() -> Scenario {
    let mut s = demo();
    s.name = "quick".into();
    s.levels = vec![0.5, 3.0];
    (s.duration, s.warmup) = (1.0, 0.3);
    for st in &mut s.streams {
        if st.legit {
            st.rate = Some(500.0);
        } else {
            (st.flows, st.sources) = (16, 8);
        }
    }
    s
}

/// A built-in scenario: its name, how it is made, and what it measures.
pub struct Builtin {
    pub name: &'static str,
    pub make: fn() -> Scenario,
    pub what: &'static str,
}

fn default_scenario() -> Scenario {
    from_toml(DEFAULT, "built-in scenario default").expect("the default scenario is valid")
}

/// Built-in scenarios by name.
pub const BUILTIN: &[Builtin] = &[
    Builtin {
        name: "default",
        make: default_scenario,
        what: "both victim models, off/nft/static, 10 levels, 5 s x 3 (about 40 minutes)",
    },
    Builtin { name: "demo", make: demo, what: "nic model, off vs static vs auto, 5 levels, 2 s x 1 (about 1.5 minutes)" },
    Builtin { name: "auto", make: auto, what: "both models, off/static/auto/auto-pno (+auto-idle on same-core), 6 levels, 3 s x 2 (about 10 minutes)" },
    Builtin { name: "priority", make: priority, what: "both models, a priority-0 service's probe beside a flood to a priority-1 service, off/static/auto (+auto-idle on same-core), 4 levels (about 5 minutes)" },
    Builtin { name: "quick", make: quick, what: "nic model, off/static/auto, 2 levels, 1 s (for tests)" },
];

/// A built-in name or a TOML file.
pub fn load(name_or_path: &str) -> Result<Scenario> {
    if let Some(Builtin { make, .. }) = BUILTIN.iter().find(|b| b.name == name_or_path) {
        let s = make();
        s.validate().with_context(|| format!("built-in scenario {name_or_path}"))?;
        return Ok(s);
    }
    let p = Path::new(name_or_path);
    if !p.exists() {
        let names: Vec<_> = BUILTIN.iter().map(|b| b.name).collect();
        bail!("no scenario \"{name_or_path}\": give a TOML file or one of {names:?}");
    }
    from_toml(&std::fs::read_to_string(p)?, &p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid() {
        for Builtin { name: n, .. } in BUILTIN {
            assert_eq!(&load(n).unwrap().name, n);
        }
        let q = load("quick").unwrap();
        assert_eq!((q.levels.clone(), q.duration, q.repeats), (vec![0.5, 3.0], 1.0, 1));
        assert_eq!(
            q.streams.iter().map(|s| (s.flows, s.sources, s.rate)).collect::<Vec<_>>(),
            [(16, 8, None), (1, 1, Some(500.0))]
        );
    }

    #[test]
    fn errors_name_the_field() {
        let bad = DEFAULT.replace("name = \"default\"", "name = \"default\"\nrepeats = 0");
        assert!(format!("{:#}", from_toml(&bad, "x").unwrap_err()).contains("field `repeats`"));
        let bad = DEFAULT.replace("frame = 128", "frame = 50");
        assert!(format!("{:#}", from_toml(&bad, "x").unwrap_err()).contains("field `stream.frame` (stream \"legit\")"));
        let bad = DEFAULT.replace("configs = [\"off\", \"nft\", \"static\"]", "configs = [\"off\", \"fast\"]");
        let e = format!("{:#}", from_toml(&bad, "x.toml").unwrap_err());
        assert!(e.contains("x.toml") && e.contains("fast") && e.contains("configs"), "{e}");
        let bad = DEFAULT.replace("rate = 1000\n", "rate = 1000\nshare = 0.5\n");
        assert!(format!("{:#}", from_toml(&bad, "x").unwrap_err()).contains("exactly one of rate"));
        let bad = DEFAULT.replace("name = \"default\"", "name = \"default\"\ncolour = 1");
        assert!(format!("{:#}", from_toml(&bad, "x").unwrap_err()).contains("unknown field `colour`"));
        assert!(load("nosuch").unwrap_err().to_string().contains("default"));
    }
}
