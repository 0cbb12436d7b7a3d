//! Configuration: the TOML file and the equivalent `--class` flag syntax.
//!
//! Parse, then validate, into [`Config`]; nothing here touches the kernel, so
//! `sluice check-config` and the unit tests use it as is. Every error names the
//! source (file and line, or the flag), the field, and what would be valid.
//!
//! ```toml
//! interface = "eth0"            # optional, --iface wins
//! xdp_mode = "native"           # "native" (default) or "generic"
//! malformed = "drop"            # verdict for malformed IP packets: "drop" (default) or "pass"
//! default_class = "default"     # class for unmatched IP traffic (an unlimited "default" class is added if absent)
//! metrics = "127.0.0.1:9786"    # Prometheus listen address, or "off"
//! socket = "/run/sluice/eth0.sock"
//! discover = true               # a class for each listening service no class matches (default true)
//! mode = "enforce"              # "enforce" (default) or "observe": count what would be dropped, drop nothing
//!
//! [[class]]
//! name = "dns"
//! priority = 0                  # 0 = highest
//! rate = "unlimited"            # packets/s ("450k", "1.5M", 20000), "unlimited" or "blocked"
//! match = [{ proto = "udp", port = 53 }]
//!
//! [[class]]
//! name = "flood"
//! priority = 3
//! rate = "100k"
//! burst = 1000                  # packets; default: 10 ms of the rate, at least 8
//! match = [{ proto = "udp", port = "5000-5999", src = "10.0.0.0/8" }]
//!
//! [[class]]
//! name = "api"
//! priority = 1
//! rate = "auto"                 # the controller picks the rate (needs UDP or TCP port rules)
//! algo = "knee"                 # "knee" (default) or "pno"; all auto classes share one
//! min_share = 0.1               # fraction of capacity kept under any flood (default 0)
//! fallback = "unlimited"        # limit once signals are lost past auto.hold: packets/s or "unlimited"
//! readers = "least-loaded"      # a reuseport group's socket per datagram: "hash", "round-robin", "least-loaded"
//! cpu = "away"                  # admitted packets to another CPU while a higher priority is in distress
//! syn_cookies = "auto"          # TCP: the gate answers SYNs with cookies "auto" (under SYN pressure), "on" or "off"
//! match = [{ proto = "udp", port = 8053 }]
//!
//! [auto]
//! hold = 2.0                    # seconds to hold the last rate when the signals vanish
//! pno_step = 1000               # perturb-and-observe step, packets/s per 10 ms tick
//! napi = "keep"                 # napi kthreads of a threaded-NAPI interface: "keep" or "idle" (SCHED_IDLE)
//! ```
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::bpf_intf::{SLUICE_MAX_BURST, SLUICE_MAX_CLASSES, SLUICE_MAX_RATE};
use crate::controller::Algo;

/// Default Prometheus listen address (documented in the README).
pub const DEFAULT_METRICS: &str = "127.0.0.1:9786";
/// Name of the class added when the config names no default class.
pub const DEFAULT_CLASS: &str = "default";
/// Priority of classes that do not set one, and of the implicit default class.
pub const DEFAULT_PRIORITY: u8 = 1;
pub const IMPLICIT_DEFAULT_PRIORITY: u8 = 255;

/// Where a config error was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File { path: PathBuf, line: usize, column: usize },
    Flag(String),
}

/// A configuration error: where, which field, and what is wrong / what is valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub origin: Origin,
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Origin::File { path, line, column } => write!(f, "{}:{line}:{column}: ", path.display())?,
            Origin::Flag(spec) => write!(f, "--class '{spec}': ")?,
        }
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "field `{}`: {}", self.field, self.message)
        }
    }
}

/// XDP attach mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Driver (native) mode: the drop happens in the driver's receive path.
    #[default]
    Native,
    /// Generic (skb) mode: after the kernel allocated an skb; for drivers without XDP.
    Generic,
}

/// Verdict for malformed IP packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    #[default]
    Drop,
    Pass,
}

/// A class's admission limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    Unlimited,
    Blocked,
    Rate {
        pps: u64,
        burst: u64,
    },
    /// The controller picks the rate (see `controller`).
    Auto(AutoSpec),
}

/// A `rate = "auto"` class's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct AutoSpec {
    pub algo: Algo,
    /// Share of the capacity the class keeps under any flood, in 1/1000.
    pub min_share_permille: u16,
    /// The limit once the signals are gone past the hold time; None = unlimited.
    pub fallback_pps: Option<u64>,
}

impl AutoSpec {
    pub fn min_share(&self) -> f64 {
        f64::from(self.min_share_permille) / 1000.0
    }
}

/// Which socket of a UDP service's SO_REUSEPORT group gets each datagram
/// (the `readers` key; see `crate::steer`). Unset: `least-loaded` for a
/// group of 2+ sockets while discovery is on, else the kernel's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Readers {
    /// The kernel's own choice, a hash of the 4-tuple (sluice steers nothing).
    Hash,
    /// In turn (each CPU deals to the readers in order).
    RoundRobin,
    /// The reader with the fewest datagrams queued (among equals, the one the
    /// flow's hash names).
    LeastLoaded,
}

impl Readers {
    pub const NAMES: &'static str = "\"hash\", \"round-robin\" or \"least-loaded\"";

    pub fn parse(s: &str) -> Result<Readers, String> {
        match s.trim() {
            "hash" => Ok(Readers::Hash),
            "round-robin" => Ok(Readers::RoundRobin),
            "least-loaded" => Ok(Readers::LeastLoaded),
            other => Err(format!("\"{other}\" is not a readers policy; valid: {}", Readers::NAMES)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Readers::Hash => "hash",
            Readers::RoundRobin => "round-robin",
            Readers::LeastLoaded => "least-loaded",
        }
    }
}

/// What the daemon does to the napi kthreads of a threaded-NAPI interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NapiSched {
    /// Leave them as they are.
    #[default]
    Keep,
    /// SCHED_IDLE: the receive work runs only when the CPU has nothing else
    /// to do (excess frames die in the ring; blind to classes).
    Idle,
}

/// Settings of the auto controller (the `[auto]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AutoSettings {
    /// How long the last rate is held when the signals vanish (ms).
    pub hold_ms: u64,
    /// Perturb-and-observe step (packets/s per tick).
    pub pno_step: u64,
    pub napi: NapiSched,
}

impl Default for AutoSettings {
    fn default() -> Self {
        AutoSettings { hold_ms: 2_000, pno_step: 1_000, napi: NapiSched::Keep }
    }
}

/// IP protocol a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Proto {
    Any,
    Udp,
    Tcp,
    /// Any other IP protocol by number (ICMP = 1, ICMPv6 = 58, ...).
    Number(u8),
}

/// A source prefix, IPv4 or IPv6, with host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// Does `other` lie inside `self` (same family, longer or equal, same leading bits)?
    pub fn contains(&self, other: &Prefix) -> bool {
        if other.len < self.len {
            return false;
        }
        match (self.addr, other.addr) {
            (IpAddr::V4(a), IpAddr::V4(b)) => mask_v4(u32::from(b), self.len) == u32::from(a),
            (IpAddr::V6(a), IpAddr::V6(b)) => mask_v6(u128::from(b), self.len) == u128::from(a),
            _ => false,
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

fn mask_v4(a: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - len as u32))
    }
}
fn mask_v6(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - len as u32))
    }
}

/// One match rule: protocol, optional destination port range, optional source prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Rule {
    pub proto: Proto,
    /// Inclusive destination port range; None = any port (and port-less packets).
    pub ports: Option<(u16, u16)>,
    pub src: Option<Prefix>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Class {
    pub name: String,
    /// 0 = highest.
    pub priority: u8,
    pub limit: Limit,
    pub rules: Vec<Rule>,
    /// For a class made by discovery (`discover`), where its priority came
    /// from; None for a configured class.
    pub discovered: Option<String>,
    /// How its UDP services' reuseport groups are steered; None: the default (see `Readers`).
    pub readers: Option<Readers>,
    /// `cpu = "away"`: its admitted packets go to another CPU while a higher
    /// priority is in distress (see `crate::away`); false (`"stay"`, the default): never.
    pub away: bool,
    /// When the gate answers the class's TCP SYNs with its own cookies (see `crate::syn_guard`).
    pub syn_cookies: SynCookies,
}

/// `syn_cookies`: when the gate answers a TCP class's SYNs itself (SYN cookies at the driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SynCookies {
    /// While the class's listeners are under SYN pressure (the default).
    #[default]
    Auto,
    /// Always (a test, or a service known to be flooded).
    On,
    /// Never: the kernel answers every SYN, as without sluice.
    Off,
}

impl SynCookies {
    pub fn parse(s: &str) -> Result<SynCookies, String> {
        match s.trim() {
            "auto" => Ok(SynCookies::Auto),
            "on" => Ok(SynCookies::On),
            "off" => Ok(SynCookies::Off),
            other => {
                Err(format!("\"{other}\" is not a syn_cookies policy; valid: \"auto\" (default), \"on\" or \"off\""))
            }
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            SynCookies::Auto => "auto",
            SynCookies::On => "on",
            SynCookies::Off => "off",
        }
    }
}

/// A validated configuration. Class ids are indexes into `classes`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Config {
    pub interface: Option<String>,
    pub xdp_mode: XdpMode,
    pub malformed: Verdict,
    /// Index into `classes` of the class for unmatched IP traffic.
    pub default_class: usize,
    /// Prometheus listen address; None = off.
    pub metrics: Option<SocketAddr>,
    /// Statistics socket; None = the default for the interface.
    pub socket: Option<PathBuf>,
    pub classes: Vec<Class>,
    pub auto: AutoSettings,
    /// Find the listening services and add a class for each (`discover`).
    pub discover: bool,
    /// Observe mode (`mode = "observe"`, `sluice run --observe`): everything
    /// runs and is counted, and the gate drops nothing.
    pub observe: bool,
}

/// What the gate does with the packets it counts as dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Drop them (the default).
    #[default]
    Enforce,
    /// Pass them: status, metrics and logs say what would have been dropped.
    Observe,
}

impl Config {
    pub fn class_id(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name == name)
    }

    /// The ids of the `rate = "auto"` classes.
    pub fn auto_classes(&self) -> Vec<usize> {
        (0..self.classes.len()).filter(|&i| matches!(self.classes[i].limit, Limit::Auto(_))).collect()
    }
}

impl Class {
    /// The UDP destination port ranges of the class's rules (where its service's sockets are).
    pub fn udp_ports(&self) -> Vec<(u16, u16)> {
        self.ports_of(Proto::Udp)
    }

    /// The TCP destination port ranges of the class's rules (where its listeners are).
    pub fn tcp_ports(&self) -> Vec<(u16, u16)> {
        self.ports_of(Proto::Tcp)
    }

    fn ports_of(&self, proto: Proto) -> Vec<(u16, u16)> {
        self.rules.iter().filter(|r| r.proto == proto).filter_map(|r| r.ports).collect()
    }
}

// ---------------------------------------------------------------------------
// Value parsers shared by the TOML file and the flag syntax. They return a
// message saying what is valid; the caller adds the origin and field.

/// "450000", "450k", "1.5M", "2G" -> packets/s.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 =
        num.trim().parse().map_err(|_| format!("\"{s}\" is not a number (examples: 20000, \"450k\", \"1.5M\")"))?;
    let v = v * mult;
    if !v.is_finite() || v < 0.0 || v.fract() != 0.0 {
        return Err(format!("\"{s}\" is not a whole non-negative number of packets"));
    }
    Ok(v as u64)
}

/// A rate: a number of packets/s, "unlimited" or "blocked".
fn parse_limit(rate: &str, burst: Option<u64>) -> Result<Limit, (&'static str, String)> {
    let limit = match rate.trim() {
        "unlimited" => Limit::Unlimited,
        "blocked" => Limit::Blocked,
        "auto" => Limit::Auto(AutoSpec::default()),
        other => {
            let pps = parse_count(other).map_err(|m| {
                (
                    "rate",
                    format!(
                        "{m}; valid: packets/s (20000, \"450k\", \"1.5M\"), \"unlimited\", \"blocked\" or \"auto\""
                    ),
                )
            })?;
            if pps == 0 || pps > u64::from(SLUICE_MAX_RATE) {
                return Err((
                    "rate",
                    format!("{pps} is out of range: 1 to {SLUICE_MAX_RATE} packets/s (or \"blocked\")"),
                ));
            }
            let burst = burst.unwrap_or_else(|| default_burst(pps));
            if burst == 0 || burst > u64::from(SLUICE_MAX_BURST) {
                return Err(("burst", format!("{burst} is out of range: 1 to {SLUICE_MAX_BURST} packets")));
            }
            Limit::Rate { pps, burst }
        }
    };
    if burst.is_some() && !matches!(limit, Limit::Rate { .. }) {
        return Err(("burst", format!("a burst only applies to a packets/s rate, not to \"{}\"", rate.trim())));
    }
    Ok(limit)
}

/// Apply the auto-only keys (algo, min_share, fallback) to a parsed limit.
fn auto_keys(
    mut limit: Limit,
    algo: Option<&str>,
    min_share: Option<f64>,
    fallback: Option<&str>,
) -> Result<Limit, (&'static str, String)> {
    let Limit::Auto(spec) = &mut limit else {
        for (key, given) in
            [("algo", algo.is_some()), ("min_share", min_share.is_some()), ("fallback", fallback.is_some())]
        {
            if given {
                return Err((key, format!("{key} only applies to rate = \"auto\"")));
            }
        }
        return Ok(limit);
    };
    if let Some(a) = algo {
        spec.algo = match a.trim() {
            "knee" => Algo::Knee,
            "pno" => Algo::Pno,
            other => {
                return Err(("algo", format!("unknown algorithm \"{other}\"; valid: \"knee\" (default) or \"pno\"")))
            }
        };
    }
    if let Some(m) = min_share {
        if !(0.0..=1.0).contains(&m) {
            return Err(("min_share", format!("{m} is not a fraction of capacity; valid: 0 to 1 (0.1 = 10%)")));
        }
        spec.min_share_permille = (m * 1000.0).round() as u16;
    }
    if let Some(f) = fallback {
        spec.fallback_pps = match f.trim() {
            "unlimited" => None,
            other => match parse_count(other) {
                Ok(pps) if pps > 0 && pps <= u64::from(SLUICE_MAX_RATE) => Some(pps),
                _ => return Err(("fallback", format!("\"{other}\" is not a fallback; valid: packets/s (1 to {SLUICE_MAX_RATE}, \"50k\") or \"unlimited\""))),
            },
        };
    }
    Ok(limit)
}

/// Default bucket depth: 10 ms of the rate, at least 8 packets.
pub fn default_burst(pps: u64) -> u64 {
    (pps / 100).max(8)
}

fn parse_proto(s: &str) -> Result<Proto, String> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "any" => Proto::Any,
        "udp" => Proto::Udp,
        "tcp" => Proto::Tcp,
        "icmp" => Proto::Number(1),
        "icmpv6" | "ipv6-icmp" => Proto::Number(58),
        other => match other.parse::<u8>() {
            Ok(17) => Proto::Udp,
            Ok(6) => Proto::Tcp,
            Ok(n) => Proto::Number(n),
            Err(_) => {
                return Err(format!(
                    "unknown protocol \"{s}\"; valid: \"udp\", \"tcp\", \"icmp\", \"icmpv6\", \"any\" or an IP protocol number 0-255"
                ))
            }
        },
    })
}

/// "53" or "8000-8080".
fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("\"{s}\" is not a port or port range; valid: 53 or \"8000-8080\" (0-65535, low <= high)");
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
        None => {
            let p = s.trim().parse().map_err(|_| bad())?;
            (p, p)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// "10.0.0.0/8", "2001:db8::/32", or an address alone (a host prefix).
pub fn parse_prefix(s: &str) -> Result<Prefix, String> {
    let bad = |why: &str| format!("\"{s}\" is not a source prefix ({why}); valid: \"10.0.0.0/8\", \"2001:db8::/32\"");
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.trim().parse().map_err(|_| bad("bad address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len: u8 = match l {
        Some(l) => l.trim().parse().map_err(|_| bad("bad length"))?,
        None => max,
    };
    if len > max {
        return Err(bad("length too long"));
    }
    let masked = match addr {
        IpAddr::V4(v) => IpAddr::V4(mask_v4(u32::from(v), len).into()),
        IpAddr::V6(v) => IpAddr::V6(mask_v6(u128::from(v), len).into()),
    };
    if masked != addr {
        return Err(bad("host bits set after the prefix length"));
    }
    Ok(Prefix { addr, len })
}

fn make_rule(proto: Proto, ports: Option<(u16, u16)>, src: Option<Prefix>) -> Result<Rule, (&'static str, String)> {
    if ports.is_some() && !matches!(proto, Proto::Udp | Proto::Tcp) {
        return Err(("port", "ports only apply to proto \"udp\" or \"tcp\"".into()));
    }
    Ok(Rule { proto, ports, src })
}

// ---------------------------------------------------------------------------
// Building a Config from classes (shared by the file and the flags).

/// Checks that span the whole config: names, count, default class.
fn finish(
    mut classes: Vec<Class>,
    default_class: Option<&str>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(Vec<Class>, usize), ConfigError> {
    for (i, c) in classes.iter().enumerate() {
        if classes[..i].iter().any(|o| o.name == c.name) {
            return Err(err("name", format!("class \"{}\" is defined twice; class names must be unique", c.name)));
        }
        if let Limit::Auto(spec) = c.limit {
            if c.udp_ports().is_empty() && c.tcp_ports().is_empty() {
                return Err(err(
                    "rate",
                    format!("class \"{}\" has rate = \"auto\" but no UDP or TCP port rule: the controller finds the service by its sockets' ports; add match = [{{ proto = \"udp\", port = 53 }}] or set a packets/s rate", c.name),
                ));
            }
            let first = classes.iter().find_map(|o| if let Limit::Auto(s) = o.limit { Some((o, s)) } else { None });
            if let Some((o, s)) = first.filter(|(_, s)| s.algo != spec.algo) {
                return Err(err(
                    "algo",
                    format!("class \"{}\" uses algo \"{}\" but class \"{}\" uses \"{}\": the auto classes share one controller (one capacity); use one algorithm", c.name, spec.algo.name(), o.name, s.algo.name()),
                ));
            }
        }
    }
    let default = match default_class {
        Some(name) => classes.iter().position(|c| c.name == name).ok_or_else(|| {
            let names: Vec<_> = classes.iter().map(|c| c.name.as_str()).collect();
            err("default_class", format!("no class named \"{name}\"; defined classes: {names:?}"))
        })?,
        None => match classes.iter().position(|c| c.name == DEFAULT_CLASS) {
            Some(i) => i,
            None => {
                classes.push(Class {
                    name: DEFAULT_CLASS.into(),
                    priority: IMPLICIT_DEFAULT_PRIORITY,
                    limit: Limit::Unlimited,
                    rules: vec![],
                    discovered: None,
                    readers: None,
                    away: false,
                    syn_cookies: SynCookies::Auto,
                });
                classes.len() - 1
            }
        },
    };
    if classes.len() > SLUICE_MAX_CLASSES as usize {
        return Err(err(
            "class",
            format!("{} classes (with the default class); at most {SLUICE_MAX_CLASSES} are supported", classes.len()),
        ));
    }
    Ok((classes, default))
}

fn check_name(name: &str) -> Result<(), String> {
    let ok =
        !name.is_empty() && name.len() <= 32 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!("\"{name}\" is not a valid class name; use 1-32 letters, digits, '-' or '_'"))
    }
}

// ---------------------------------------------------------------------------
// TOML file.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    interface: Option<String>,
    xdp_mode: Option<XdpMode>,
    malformed: Option<Verdict>,
    default_class: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
    socket: Option<PathBuf>,
    discover: Option<bool>,
    mode: Option<Mode>,
    #[serde(default, rename = "class")]
    classes: Vec<Spanned<RawClass>>,
    auto: Option<Spanned<RawAuto>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuto {
    hold: Option<f64>,
    pno_step: Option<u64>,
    napi: Option<NapiSched>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    name: Spanned<String>,
    priority: Option<u8>,
    rate: Option<Spanned<IntOrString>>,
    burst: Option<Spanned<u64>>,
    algo: Option<Spanned<String>>,
    min_share: Option<Spanned<f64>>,
    fallback: Option<Spanned<IntOrString>>,
    readers: Option<Spanned<String>>,
    cpu: Option<Spanned<String>>,
    syn_cookies: Option<Spanned<String>>,
    #[serde(default, rename = "match")]
    rules: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    proto: Option<Spanned<IntOrString>>,
    port: Option<Spanned<IntOrString>>,
    src: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Str(String),
}

impl IntOrString {
    fn text(&self) -> String {
        match self {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::Str(s) => s.clone(),
        }
    }
}

fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// Parse and validate a TOML config held in `src`, read from `path`.
pub fn from_toml(src: &str, path: &Path) -> Result<Config, ConfigError> {
    let loc = Locator { src, path };
    let raw: RawConfig =
        toml::from_str(src).map_err(|e| loc.at(e.span().unwrap_or(0..0), "", e.message().to_string()))?;
    let mut classes = Vec::new();
    for rc in &raw.classes {
        let class = loc.class(rc)?;
        if class.rules.is_empty() && class.name != DEFAULT_CLASS {
            // A class without rules only receives traffic as the default class; allowed, but say so when it is not.
            let is_default = raw.default_class.as_ref().is_some_and(|d| d.get_ref() == &class.name);
            if !is_default {
                let field = format!("class.match (class \"{}\")", class.name);
                return Err(loc.at(rc.span(), &field, "the class has no match rules and is not the default class, so no packet could reach it; add match = [{ proto = \"udp\", port = 53 }] or similar".into()));
            }
        }
        classes.push(class);
    }
    let dspan = raw.default_class.as_ref().map_or(0..0, |d| d.span());
    let (classes, default_class) =
        finish(classes, raw.default_class.as_ref().map(|d| d.get_ref().as_str()), &|f, m| {
            loc.at(if f == "default_class" { dspan.clone() } else { 0..0 }, f, m)
        })?;
    Ok(Config {
        auto: raw.auto.as_ref().map_or(Ok(AutoSettings::default()), |a| loc.auto(a))?,
        metrics: loc.metrics(raw.metrics.as_ref())?,
        interface: raw.interface,
        xdp_mode: raw.xdp_mode.unwrap_or_default(),
        malformed: raw.malformed.unwrap_or_default(),
        default_class,
        socket: raw.socket,
        classes,
        discover: raw.discover.unwrap_or(true),
        observe: raw.mode == Some(Mode::Observe),
    })
}

/// A config file's text and path, to turn a span into file:line:column.
struct Locator<'a> {
    src: &'a str,
    path: &'a Path,
}

impl Locator<'_> {
    fn at(&self, span: std::ops::Range<usize>, field: &str, message: String) -> ConfigError {
        let (line, column) = line_col(self.src, span.start);
        ConfigError {
            origin: Origin::File { path: self.path.to_path_buf(), line, column },
            field: field.into(),
            message,
        }
    }

    fn class(&self, rc: &Spanned<RawClass>) -> Result<Class, ConfigError> {
        let cspan = rc.span();
        let rc = rc.get_ref();
        let name = rc.name.get_ref().clone();
        check_name(&name).map_err(|m| self.at(rc.name.span(), "name", m))?;
        let field = |f: &str| format!("class.{f} (class \"{name}\")");
        let burst = rc.burst.as_ref().map(|b| *b.get_ref());
        let limit = match &rc.rate {
            Some(r) => parse_limit(&r.get_ref().text(), burst).map_err(|(f, m)| {
                let span = if f == "burst" { rc.burst.as_ref().map_or(r.span(), |b| b.span()) } else { r.span() };
                self.at(span, &field(f), m)
            })?,
            None if burst.is_some() => {
                let span = rc.burst.as_ref().map_or(cspan.clone(), |b| b.span());
                return Err(self.at(span, &field("burst"), "a burst needs a packets/s rate".into()));
            }
            None => Limit::Unlimited,
        };
        let limit = auto_keys(
            limit,
            rc.algo.as_ref().map(|a| a.get_ref().as_str()),
            rc.min_share.as_ref().map(|m| *m.get_ref()),
            rc.fallback.as_ref().map(|f| f.get_ref().text()).as_deref(),
        )
        .map_err(|(f, m)| {
            let span = match f {
                "algo" => rc.algo.as_ref().map(|x| x.span()),
                "min_share" => rc.min_share.as_ref().map(|x| x.span()),
                _ => rc.fallback.as_ref().map(|x| x.span()),
            };
            self.at(span.unwrap_or(cspan.clone()), &field(f), m)
        })?;
        let rules = rc.rules.iter().map(|rr| self.rule(rr, &field)).collect::<Result<Vec<_>, _>>()?;
        let readers = match &rc.readers {
            Some(r) => Some(Readers::parse(r.get_ref()).map_err(|m| self.at(r.span(), &field("readers"), m))?),
            None => None,
        };
        let away = match &rc.cpu {
            Some(c) => parse_cpu(c.get_ref()).map_err(|m| self.at(c.span(), &field("cpu"), m))?,
            None => false,
        };
        let syn_cookies = match &rc.syn_cookies {
            Some(c) => SynCookies::parse(c.get_ref()).map_err(|m| self.at(c.span(), &field("syn_cookies"), m))?,
            None => SynCookies::Auto,
        };
        let priority = rc.priority.unwrap_or(DEFAULT_PRIORITY);
        Ok(Class { name, priority, limit, rules, discovered: None, readers, away, syn_cookies })
    }

    fn rule(&self, rr: &Spanned<RawRule>, field: &dyn Fn(&str) -> String) -> Result<Rule, ConfigError> {
        let rspan = rr.span();
        let rr = rr.get_ref();
        let proto = match &rr.proto {
            Some(p) => parse_proto(&p.get_ref().text()).map_err(|m| self.at(p.span(), &field("match.proto"), m))?,
            None if rr.port.is_some() => {
                return Err(self.at(rspan, &field("match.proto"), "a port needs proto = \"udp\" or \"tcp\"".into()))
            }
            None => Proto::Any,
        };
        let ports = match &rr.port {
            Some(p) => Some(parse_ports(&p.get_ref().text()).map_err(|m| self.at(p.span(), &field("match.port"), m))?),
            None => None,
        };
        let src_prefix = match &rr.src {
            Some(s) => Some(parse_prefix(s.get_ref()).map_err(|m| self.at(s.span(), &field("match.src"), m))?),
            None => None,
        };
        make_rule(proto, ports, src_prefix).map_err(|(f, m)| self.at(rspan.clone(), &field(&format!("match.{f}")), m))
    }

    fn metrics(&self, m: Option<&Spanned<String>>) -> Result<Option<SocketAddr>, ConfigError> {
        match m {
            None => Ok(Some(DEFAULT_METRICS.parse().expect("the default metrics address parses"))),
            Some(m) if m.get_ref() == "off" => Ok(None),
            Some(m) => m.get_ref().parse().map(Some).map_err(|_| {
                let msg = format!("\"{}\" is not an address:port; valid: \"127.0.0.1:9786\" or \"off\"", m.get_ref());
                self.at(m.span(), "metrics", msg)
            }),
        }
    }

    fn auto(&self, a: &Spanned<RawAuto>) -> Result<AutoSettings, ConfigError> {
        let (span, a) = (a.span(), a.get_ref());
        let mut auto = AutoSettings::default();
        if let Some(h) = a.hold {
            if !(0.0..=3600.0).contains(&h) {
                return Err(self.at(span, "auto.hold", format!("{h} is out of range; valid: 0 to 3600 seconds")));
            }
            auto.hold_ms = (h * 1000.0).round() as u64;
        }
        if let Some(p) = a.pno_step {
            if p == 0 || p > u64::from(SLUICE_MAX_RATE) {
                let msg = format!("{p} is out of range; valid: 1 to {SLUICE_MAX_RATE} packets/s");
                return Err(self.at(span, "auto.pno_step", msg));
            }
            auto.pno_step = p;
        }
        if let Some(n) = a.napi {
            auto.napi = n;
        }
        Ok(auto)
    }
}

/// Read and validate a config file.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let src = std::fs::read_to_string(path).map_err(|e| ConfigError {
        origin: Origin::File { path: path.to_path_buf(), line: 0, column: 0 },
        field: String::new(),
        message: format!("cannot read the config file: {e}"),
    })?;
    from_toml(&src, path)
}

// ---------------------------------------------------------------------------
// Flag syntax: --class 'NAME:priority=P,rate=R,burst=B,match=PROTO[:PORTS][@PREFIX],...'

const FLAG_KEYS: &str = "priority, rate, burst, match, algo, min_share, fallback, readers, cpu, syn_cookies";

/// The `cpu` key: "away" (true) or "stay" (false).
fn parse_cpu(s: &str) -> Result<bool, String> {
    match s.trim() {
        "away" => Ok(true),
        "stay" => Ok(false),
        other => Err(format!("\"{other}\" is not a cpu policy; valid: \"stay\" (default) or \"away\"")),
    }
}

/// Parse one `--class` flag into a class (not yet validated against the others).
pub fn parse_class_flag(spec: &str) -> Result<Class, ConfigError> {
    let err =
        |field: &str, message: String| ConfigError { origin: Origin::Flag(spec.into()), field: field.into(), message };
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    check_name(name.trim()).map_err(|m| err("name", m))?;
    let (mut priority, mut rate, mut burst, mut rules) = (DEFAULT_PRIORITY, None, None, Vec::new());
    let (mut algo, mut min_share, mut fallback, mut readers, mut away) = (None, None, None, None, false);
    let mut syn_cookies = SynCookies::Auto;
    for kv in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) =
            kv.split_once('=').ok_or_else(|| err(kv, format!("expected key=value with key one of {FLAG_KEYS}")))?;
        match k.trim() {
            "priority" => {
                priority =
                    v.trim().parse().map_err(|_| err("priority", format!("\"{v}\" is not 0-255 (0 = highest)")))?
            }
            "rate" => rate = Some(v.to_string()),
            "burst" => burst = Some(parse_count(v).map_err(|m| err("burst", m))?),
            "algo" => algo = Some(v.to_string()),
            "min_share" => {
                min_share = Some(
                    v.trim()
                        .parse::<f64>()
                        .map_err(|_| err("min_share", format!("\"{v}\" is not a number; valid: 0 to 1")))?,
                )
            }
            "fallback" => fallback = Some(v.to_string()),
            "readers" => readers = Some(Readers::parse(v).map_err(|m| err("readers", m))?),
            "cpu" => away = parse_cpu(v).map_err(|m| err("cpu", m))?,
            "syn_cookies" => syn_cookies = SynCookies::parse(v).map_err(|m| err("syn_cookies", m))?,
            "match" => {
                let (pp, src) = match v.split_once('@') {
                    Some((pp, s)) => (pp, Some(parse_prefix(s).map_err(|m| err("match", m))?)),
                    None => (v, None),
                };
                let (proto, ports) = match pp.split_once(':') {
                    Some((p, ports)) => (p, Some(parse_ports(ports).map_err(|m| err("match", m))?)),
                    None => (pp, None),
                };
                let proto = parse_proto(proto).map_err(|m| err("match", m))?;
                rules.push(make_rule(proto, ports, src).map_err(|(_, m)| err("match", m))?);
            }
            other => {
                return Err(err(other, format!("unknown key; valid keys: {FLAG_KEYS}")));
            }
        }
    }
    let limit = match rate {
        Some(r) => parse_limit(&r, burst).map_err(|(f, m)| err(f, m))?,
        None if burst.is_some() => return Err(err("burst", "a burst needs a packets/s rate".into())),
        None => Limit::Unlimited,
    };
    let limit = auto_keys(limit, algo.as_deref(), min_share, fallback.as_deref()).map_err(|(f, m)| err(f, m))?;
    Ok(Class { name: name.trim().into(), priority, limit, rules, discovered: None, readers, away, syn_cookies })
}

/// Build a config from `--class` flags alone.
pub fn from_flags(specs: &[String]) -> Result<Config, ConfigError> {
    let classes = specs.iter().map(|s| parse_class_flag(s)).collect::<Result<Vec<_>, _>>()?;
    let first = specs.first().cloned().unwrap_or_default();
    let (classes, default_class) = finish(classes, None, &|f, m| ConfigError {
        origin: Origin::Flag(first.clone()),
        field: f.into(),
        message: m,
    })?;
    Ok(Config {
        interface: None,
        xdp_mode: XdpMode::Native,
        malformed: Verdict::Drop,
        default_class,
        metrics: Some(DEFAULT_METRICS.parse().unwrap()),
        socket: None,
        classes,
        auto: AutoSettings::default(),
        discover: true,
        observe: false,
    })
}

/// The config a daemon runs: the file (if any), with `--class` flags added
/// after the file's classes (same name: the flag replaces the file's class).
pub fn resolve(file: Option<&Path>, flags: &[String]) -> Result<Config, ConfigError> {
    let Some(path) = file else { return from_flags(flags) };
    let mut cfg = load_file(path)?;
    if flags.is_empty() {
        return Ok(cfg);
    }
    // Take the implicit default class out; `finish` adds it back last.
    let implicit = Class {
        name: DEFAULT_CLASS.into(),
        priority: IMPLICIT_DEFAULT_PRIORITY,
        limit: Limit::Unlimited,
        rules: vec![],
        discovered: None,
        readers: None,
        away: false,
        syn_cookies: SynCookies::Auto,
    };
    let default_name = cfg.classes[cfg.default_class].name.clone();
    let mut classes = cfg.classes;
    let explicit_default = classes.last() != Some(&implicit) || default_name != DEFAULT_CLASS;
    if !explicit_default {
        classes.pop();
    }
    for spec in flags {
        let c = parse_class_flag(spec)?;
        match classes.iter_mut().find(|o| o.name == c.name) {
            Some(o) => *o = c,
            None => classes.push(c),
        }
    }
    let first = flags[0].clone();
    let (classes, default_class) = finish(classes, explicit_default.then_some(default_name.as_str()), &|f, m| {
        ConfigError { origin: Origin::Flag(first.clone()), field: f.into(), message: m }
    })?;
    cfg.classes = classes;
    cfg.default_class = default_class;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(src: &str) -> Result<Config, ConfigError> {
        from_toml(src, Path::new("t.toml"))
    }

    #[test]
    fn counts_with_suffixes() {
        assert_eq!(parse_count("450k"), Ok(450_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("20000"), Ok(20_000));
        assert!(parse_count("fast").is_err());
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("-3").is_err());
    }

    #[test]
    fn full_example_parses() {
        let c = cfg(r#"
interface = "eth0"
malformed = "pass"
metrics = "off"
[[class]]
name = "dns"
priority = 0
rate = "unlimited"
match = [{ proto = "udp", port = 53 }, { proto = "tcp", port = 53 }]
[[class]]
name = "flood"
priority = 3
rate = "100k"
burst = 1000
match = [{ proto = "udp", port = "5000-5999", src = "10.0.0.0/8" }, { proto = "icmp" }]
"#)
        .unwrap();
        assert_eq!(c.interface.as_deref(), Some("eth0"));
        assert_eq!(c.malformed, Verdict::Pass);
        assert_eq!(c.metrics, None);
        assert_eq!(c.classes.len(), 3, "implicit default class added");
        assert_eq!(c.classes[c.default_class].name, "default");
        assert_eq!(c.classes[1].limit, Limit::Rate { pps: 100_000, burst: 1000 });
        assert_eq!(c.classes[1].rules[0].ports, Some((5000, 5999)));
        assert_eq!(c.classes[1].rules[0].src, Some(parse_prefix("10.0.0.0/8").unwrap()));
        assert_eq!(c.classes[1].rules[1].proto, Proto::Number(1));
        assert_eq!(c.metrics, None);
    }

    #[test]
    fn default_burst_is_10ms() {
        let c = cfg("[[class]]\nname='a'\nrate=450000\nmatch=[{proto='udp'}]\n").unwrap();
        assert_eq!(c.classes[0].limit, Limit::Rate { pps: 450_000, burst: 4500 });
    }

    #[test]
    fn bad_rate_names_line_and_field() {
        let e = cfg("[[class]]\nname = 'a'\nrate = 'fast'\nmatch=[{proto='udp'}]\n").unwrap_err();
        assert_eq!(e.field, "class.rate (class \"a\")");
        assert!(matches!(e.origin, Origin::File { line: 3, .. }), "{e}");
        assert!(e.message.contains("unlimited"), "says what is valid: {e}");
    }

    #[test]
    fn readers_policy_is_read_from_file_and_flag_and_a_bad_one_named() {
        let c = cfg("[[class]]\nname = 'a'\nreaders = 'round-robin'\nmatch=[{proto='udp', port=53}]\n").unwrap();
        assert_eq!(c.classes[0].readers, Some(Readers::RoundRobin));
        let e = cfg("[[class]]\nname = 'a'\nreaders = 'fastest'\nmatch=[{proto='udp'}]\n").unwrap_err();
        assert_eq!(e.field, "class.readers (class \"a\")");
        assert!(matches!(e.origin, Origin::File { line: 3, .. }), "{e}");
        assert!(e.message.contains("least-loaded"), "says what is valid: {e}");
        assert_eq!(
            parse_class_flag("a:match=udp:53,readers=least-loaded").unwrap().readers,
            Some(Readers::LeastLoaded)
        );
        assert_eq!(parse_class_flag("a:readers=lifo").unwrap_err().field, "readers");
        assert!(parse_class_flag("a:cpu=away").unwrap().away);
        let e = cfg("[[class]]\nname = 'a'\ncpu = 'elsewhere'\nmatch=[{proto='udp'}]\n").unwrap_err();
        assert_eq!(e.field, "class.cpu (class \"a\")");
        assert!(e.message.contains("away"), "{e}");
    }

    #[test]
    fn syn_cookies_is_auto_unless_set_and_a_bad_value_names_the_field() {
        assert_eq!(parse_class_flag("a:match=tcp:80").unwrap().syn_cookies, SynCookies::Auto);
        assert_eq!(parse_class_flag("a:syn_cookies=off").unwrap().syn_cookies, SynCookies::Off);
        assert_eq!(parse_class_flag("a:syn_cookies=maybe").unwrap_err().field, "syn_cookies");
        let c = cfg("[[class]]\nname = 'a'\nsyn_cookies = 'on'\nmatch=[{proto='tcp'}]\n").unwrap();
        assert_eq!(c.classes[0].syn_cookies, SynCookies::On);
        let e = cfg("[[class]]\nname = 'a'\nsyn_cookies = 'always'\nmatch=[{proto='tcp'}]\n").unwrap_err();
        assert_eq!(e.field, "class.syn_cookies (class \"a\")");
        assert!(e.message.contains("\"auto\" (default), \"on\" or \"off\""), "{e}");
        for p in [SynCookies::Auto, SynCookies::On, SynCookies::Off] {
            assert_eq!(SynCookies::parse(p.name()), Ok(p));
        }
    }

    #[test]
    fn unknown_field_is_refused_with_line() {
        let e = cfg("[[class]]\nname = 'a'\nrat = 5\n").unwrap_err();
        assert!(matches!(e.origin, Origin::File { line: 3, .. }), "{e}");
        assert!(e.message.contains("unknown field `rat`"), "{e}");
    }

    #[test]
    fn bad_port_prefix_proto() {
        let e = cfg("[[class]]\nname='a'\nmatch=[{proto='udp', port='9-1'}]\n").unwrap_err();
        assert_eq!(e.field, "class.match.port (class \"a\")");
        let e = cfg("[[class]]\nname='a'\nmatch=[{proto='udp', src='10.0.0.1/8'}]\n").unwrap_err();
        assert!(e.message.contains("host bits"), "{e}");
        let e = cfg("[[class]]\nname='a'\nmatch=[{proto='sctp'}]\n").unwrap_err();
        assert_eq!(e.field, "class.match.proto (class \"a\")");
        let e = cfg("[[class]]\nname='a'\nmatch=[{proto='icmp', port=5}]\n").unwrap_err();
        assert!(e.message.contains("udp"), "{e}");
    }

    #[test]
    fn duplicate_and_missing_default() {
        let e = cfg("[[class]]\nname='a'\nmatch=[{proto='udp'}]\n[[class]]\nname='a'\nmatch=[{proto='tcp'}]\n")
            .unwrap_err();
        assert_eq!(e.field, "name");
        let e = cfg("default_class = 'x'\n[[class]]\nname='a'\nmatch=[{proto='udp'}]\n").unwrap_err();
        assert_eq!(e.field, "default_class");
        assert!(matches!(e.origin, Origin::File { line: 1, .. }));
    }

    #[test]
    fn class_without_rules_must_be_default() {
        assert!(cfg("[[class]]\nname='lonely'\n").is_err());
        let c = cfg("default_class='rest'\n[[class]]\nname='rest'\nrate='1k'\n").unwrap();
        assert_eq!(c.classes.len(), 1);
        assert_eq!(c.default_class, 0);
    }

    #[test]
    fn too_many_classes() {
        let mut s = String::new();
        for i in 0..64 {
            s += &format!("[[class]]\nname='c{i}'\nmatch=[{{proto='udp', port={i}}}]\n");
        }
        let e = cfg(&s).unwrap_err();
        assert!(e.message.contains("at most 64"), "{e}");
    }

    #[test]
    fn flag_syntax() {
        let c = parse_class_flag("web:priority=2,rate=1.5M,burst=3k,match=tcp:80-443@10.1.0.0/16,match=icmp").unwrap();
        assert_eq!(c.name, "web");
        assert_eq!(c.priority, 2);
        assert_eq!(c.limit, Limit::Rate { pps: 1_500_000, burst: 3000 });
        assert_eq!(
            c.rules[0],
            Rule { proto: Proto::Tcp, ports: Some((80, 443)), src: Some(parse_prefix("10.1.0.0/16").unwrap()) }
        );
        assert_eq!(c.rules[1], Rule { proto: Proto::Number(1), ports: None, src: None });
        let e = parse_class_flag("web:rate=lots,match=udp").unwrap_err();
        assert_eq!(e.field, "rate");
        assert!(e.to_string().starts_with("--class 'web:rate=lots,match=udp': field `rate`"), "{e}");
        assert_eq!(parse_class_flag("web:colour=red").unwrap_err().field, "colour");
        assert_eq!(parse_class_flag("we b:match=udp").unwrap_err().field, "name");
        assert_eq!(parse_class_flag("x:rate=blocked,burst=5").unwrap_err().field, "burst");
    }

    #[test]
    fn flags_add_to_file_and_replace_same_name() {
        let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(&p, "[[class]]\nname='a'\nrate='1k'\nmatch=[{proto='udp', port=1}]\n").unwrap();
        let c = resolve(Some(&p), &["a:rate=2k,match=udp:1".into(), "b:match=tcp".into()]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<_> = c.classes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "default"]);
        assert_eq!(c.classes[0].limit, Limit::Rate { pps: 2000, burst: 20 });
        assert_eq!(c.default_class, 2);
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = load_file(Path::new("/nonexistent/sluice.toml")).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }

    #[test]
    fn auto_classes_in_the_file_and_the_flags() {
        let c = cfg("[auto]\nhold = 0.5\npno_step = 500\nnapi = \"idle\"\n\n[[class]]\nname = \"api\"\nrate = \"auto\"\nalgo = \"pno\"\nmin_share = 0.25\nfallback = \"20k\"\nmatch = [{ proto = \"udp\", port = \"8000-8001\" }]\n").unwrap();
        let want = AutoSpec { algo: Algo::Pno, min_share_permille: 250, fallback_pps: Some(20_000) };
        assert_eq!(c.classes[0].limit, Limit::Auto(want));
        assert_eq!(c.auto, AutoSettings { hold_ms: 500, pno_step: 500, napi: NapiSched::Idle });
        assert_eq!(c.auto_classes(), vec![0]);
        assert_eq!(c.classes[0].udp_ports(), vec![(8000, 8001)]);
        let f = from_flags(&["api:rate=auto,min_share=0.1,fallback=unlimited,match=udp:53".into()]).unwrap();
        assert_eq!(
            f.classes[0].limit,
            Limit::Auto(AutoSpec { algo: Algo::Knee, min_share_permille: 100, fallback_pps: None })
        );
        assert_eq!(f.auto, AutoSettings::default());
    }

    #[test]
    fn auto_errors_name_the_class_and_field() {
        // No UDP or TCP port: the controller could not find the service.
        let e = cfg("[[class]]\nname = \"web\"\nrate = \"auto\"\nmatch = [{ proto = \"icmp\" }]\n").unwrap_err();
        assert_eq!(e.field, "rate");
        assert!(e.message.contains("\"web\"") && e.message.contains("UDP or TCP port"), "{e}");
        // A TCP service can be auto (its listeners are its health signals).
        cfg("[[class]]\nname = \"web\"\nrate = \"auto\"\nmatch = [{ proto = \"tcp\", port = 80 }]\n").unwrap();
        // Auto-only keys on a static class.
        let e = parse_class_flag("x:rate=1k,min_share=0.2,match=udp:1").unwrap_err();
        assert_eq!(e.field, "min_share");
        let e = cfg(
            "[[class]]\nname = \"x\"\nrate = \"auto\"\nalgo = \"fuzzy\"\nmatch = [{ proto = \"udp\", port = 1 }]\n",
        )
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.origin.clone()),
            ("class.algo (class \"x\")", Origin::File { path: "t.toml".into(), line: 4, column: 8 })
        );
        assert!(e.message.contains("\"knee\""), "{e}");
        assert_eq!(parse_class_flag("x:rate=auto,min_share=1.5,match=udp:1").unwrap_err().field, "min_share");
        assert_eq!(parse_class_flag("x:rate=auto,fallback=0,match=udp:1").unwrap_err().field, "fallback");
        // Two algorithms for one shared controller.
        let e = from_flags(&["a:rate=auto,match=udp:1".into(), "b:rate=auto,algo=pno,match=udp:2".into()]).unwrap_err();
        assert_eq!(e.field, "algo");
        assert!(e.message.contains("\"a\"") && e.message.contains("\"b\""), "{e}");
        // The [auto] table.
        assert_eq!(cfg("[auto]\nhold = -1\n").unwrap_err().field, "auto.hold");
        assert_eq!(cfg("[auto]\nnapi = \"fast\"\n").unwrap_err().field, "");
        assert!(cfg("[auto]\nspeed = 1\n").is_err());
    }
}
