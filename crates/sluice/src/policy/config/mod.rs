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
//! algo = "capacity"             # "capacity" (default) or "pno"; all auto classes share one
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

use crate::bpf_intf::{SLUICE_MAX_BURST, SLUICE_MAX_CLASSES, SLUICE_MAX_RATE};
use crate::policy::controller::Algo;

mod file;
mod flags;
mod grammar;
mod values;

pub use file::{from_toml, load_file};
pub use flags::{from_flags, parse_class_flag};
pub use grammar::class_flag_help;
use grammar::{build_class, flag_keys, ClassKeys, Key, RuleKeys, RulePart, CLASS_KEYS};
use values::*;
pub use values::{default_burst, parse_count, parse_prefix};

/// Default Prometheus listen address (documented in docs/config.md).
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
/// (the `readers` key; see `crate::dataplane::steer`). Unset: `least-loaded` for a
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
    /// priority is in distress (see `crate::policy::protect`); false (`"stay"`, the default): never.
    pub away: bool,
    /// When the gate answers the class's TCP SYNs with its own cookies (see `crate::policy::syn_guard`).
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
    /// The class names, by class index.
    pub fn names(&self) -> Vec<&str> {
        self.classes.iter().map(|c| c.name.as_str()).collect()
    }

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
        assert_eq!(c.names(), ["a", "b", "default"]);
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
            Limit::Auto(AutoSpec { algo: Algo::Capacity, min_share_permille: 100, fallback_pps: None })
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
        assert!(e.message.contains("\"capacity\""), "{e}");
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
