//! The one grammar of a class, whichever syntax wrote it: a file's
//! `[[class]]` table (file.rs) or a `--class NAME:KEY=VAL,...` flag
//! (flags.rs). Each syntax only reads its text into [`ClassKeys`]; which
//! keys there are, what values they take and how they combine into a
//! [`Class`] is decided here once, and an error names the [`Key`] it is
//! about so each syntax can say where that key was written.
use std::collections::BTreeMap;

use super::*;

/// One class as written: every value as its text.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ClassKeys {
    pub name: String,
    /// The keys of CLASS_KEYS written, each once.
    pub values: BTreeMap<Key, String>,
    pub rules: Vec<RuleKeys>,
}

impl ClassKeys {
    fn get(&self, key: Key) -> Option<&str> {
        self.values.get(&key).map(String::as_str)
    }
}

/// One match rule as written.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct RuleKeys {
    pub proto: Option<String>,
    pub port: Option<String>,
    pub src: Option<String>,
}

/// The key an error is about (a rule's part with the rule's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Key {
    Name,
    Priority,
    Rate,
    Burst,
    Algo,
    MinShare,
    Fallback,
    Readers,
    Cpu,
    SynCookies,
    Rule(usize, RulePart),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum RulePart {
    Whole,
    Proto,
    Port,
    Src,
}

/// Every key a class takes beside its name, once: how both syntaxes spell
/// it (the flag's `KEY=VAL`, the file's `KEY = VAL`) and what it takes, in
/// the order `--class`'s help lists them. The flag parser looks keys up
/// here, the file reader reads these keys of its table, and an error names
/// a key by this spelling. (The name is the file's `name` and the flag's
/// `NAME:`, not a key of either list.)
pub(super) const CLASS_KEYS: [(Key, &str, &str); 10] = [
    (Key::Priority, "priority", "0-255, 0 = highest"),
    (Key::Rate, "rate", "packets/s (\"50k\"), unlimited, blocked or auto"),
    (Key::Burst, "burst", "packets, beside a packets/s rate"),
    (Key::Rule(0, RulePart::Whole), "match", "PROTO[:PORTS][@PREFIX], repeatable"),
    (Key::Algo, "algo", "with rate=auto: capacity or pno"),
    (Key::MinShare, "min_share", "with rate=auto: 0 to 1"),
    (Key::Fallback, "fallback", "with rate=auto: packets/s or unlimited"),
    (Key::Readers, "readers", "hash, round-robin or least-loaded"),
    (Key::Cpu, "cpu", "stay or away"),
    (Key::SynCookies, "syn_cookies", "auto, on or off"),
];

/// The keys a `--class` flag takes, for its errors.
pub(super) fn flag_keys() -> String {
    CLASS_KEYS.iter().map(|k| k.1).collect::<Vec<_>>().join(", ")
}

/// What `--class` takes, key by key, for its help.
pub fn class_flag_help() -> String {
    let keys: Vec<String> = CLASS_KEYS.iter().map(|(_, name, what)| format!("  {name}: {what}")).collect();
    format!(
        "A class as NAME:KEY=VAL,... (repeatable; a class with the same name as one in the file replaces it). \
         Keys:\n{}\nExample: 'dns:priority=0,rate=50k,match=udp:53,match=tcp:53@10.0.0.0/8', \
         'api:rate=auto,min_share=0.1,match=udp:8053'.",
        keys.join("\n")
    )
}

impl Key {
    /// The value key spelled `name` (not `name` itself, nor `match`).
    pub fn by_name(name: &str) -> Option<Key> {
        CLASS_KEYS.iter().find(|k| k.1 == name && !matches!(k.0, Key::Rule(..))).map(|k| k.0)
    }

    /// The key's name as the file writes it (`match.port` for a rule's part).
    pub fn name(self) -> &'static str {
        match self {
            Key::Rule(_, RulePart::Proto) => "match.proto",
            Key::Rule(_, RulePart::Port) => "match.port",
            Key::Rule(_, RulePart::Src) => "match.src",
            Key::Rule(_, RulePart::Whole) => "match",
            Key::Name => "name",
            key => CLASS_KEYS.iter().find(|k| k.0 == key).map(|k| k.1).expect("every key is in CLASS_KEYS"),
        }
    }

    /// A field name the value checks return ("rate", "burst", "algo", ...).
    fn of(field: &str) -> Key {
        Key::by_name(field).unwrap_or(Key::Rate)
    }
}

/// The class `k` says, or the first error, about the key it names.
pub(super) fn build_class(k: &ClassKeys, err: &dyn Fn(Key, String) -> ConfigError) -> Result<Class, ConfigError> {
    check_name(&k.name).map_err(|m| err(Key::Name, m))?;
    let priority = match k.get(Key::Priority) {
        Some(p) => p.trim().parse().map_err(|_| err(Key::Priority, format!("\"{p}\" is not 0-255 (0 = highest)")))?,
        None => DEFAULT_PRIORITY,
    };
    let burst = k.get(Key::Burst).map(parse_count).transpose().map_err(|m| err(Key::Burst, m))?;
    let limit = match k.get(Key::Rate) {
        Some(r) => parse_limit(r, burst).map_err(|(f, m)| err(Key::of(f), m))?,
        None if burst.is_some() => return Err(err(Key::Burst, "a burst needs a packets/s rate".into())),
        None => Limit::Unlimited,
    };
    let min_share = match k.get(Key::MinShare) {
        Some(m) => Some(
            m.trim()
                .parse::<f64>()
                .map_err(|_| err(Key::MinShare, format!("\"{m}\" is not a number; valid: 0 to 1")))?,
        ),
        None => None,
    };
    let limit =
        auto_keys(limit, k.get(Key::Algo), min_share, k.get(Key::Fallback)).map_err(|(f, m)| err(Key::of(f), m))?;
    let rules = k.rules.iter().enumerate().map(|(i, r)| rule(i, r, err)).collect::<Result<Vec<_>, _>>()?;
    let readers = k.get(Key::Readers).map(Readers::parse).transpose().map_err(|m| err(Key::Readers, m))?;
    let away = k.get(Key::Cpu).map(parse_cpu).transpose().map_err(|m| err(Key::Cpu, m))?.unwrap_or(false);
    let syn_cookies = k
        .get(Key::SynCookies)
        .map(SynCookies::parse)
        .transpose()
        .map_err(|m| err(Key::SynCookies, m))?
        .unwrap_or(SynCookies::Auto);
    Ok(Class { name: k.name.clone(), priority, limit, rules, discovered: None, readers, away, syn_cookies })
}

/// Rule `i`: a protocol (any, when only a source is given), ports for UDP
/// and TCP, a source prefix.
fn rule(i: usize, r: &RuleKeys, err: &dyn Fn(Key, String) -> ConfigError) -> Result<Rule, ConfigError> {
    let at = |part| Key::Rule(i, part);
    let proto = match &r.proto {
        Some(p) => parse_proto(p).map_err(|m| err(at(RulePart::Proto), m))?,
        None if r.port.is_some() => {
            return Err(err(at(RulePart::Proto), "a port needs proto = \"udp\" or \"tcp\"".into()))
        }
        None => Proto::Any,
    };
    let ports = r.port.as_deref().map(parse_ports).transpose().map_err(|m| err(at(RulePart::Port), m))?;
    let src = r.src.as_deref().map(parse_prefix).transpose().map_err(|m| err(at(RulePart::Src), m))?;
    make_rule(proto, ports, src).map_err(|(f, m)| {
        let part = match f {
            "port" => RulePart::Port,
            "src" => RulePart::Src,
            "proto" => RulePart::Proto,
            _ => RulePart::Whole,
        };
        err(at(part), m)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One table of keys: each of CLASS_KEYS is read by the file (serde's
    /// field names agree with it) and by the flag, a bad value of it is an
    /// error about that key in both, and `--class`'s help lists it.
    #[test]
    fn every_class_key_is_read_from_a_file_and_a_flag_and_shown_in_help() {
        let help = class_flag_help();
        for &(key, name, _) in CLASS_KEYS.iter().filter(|k| !matches!(k.0, Key::Rule(..))) {
            let by_flag = parse_class_flag(&format!("x:{name}=bogus,match=udp:1")).unwrap_err();
            assert_eq!(by_flag.field, name, "the flag's error is about {name}: {by_flag}");
            assert!(!by_flag.message.starts_with("unknown key"), "the flag reads {name}: {by_flag}");
            let toml =
                format!("[[class]]\nname = \"x\"\n{name} = \"bogus\"\nmatch = [{{ proto = \"udp\", port = 1 }}]\n");
            let by_file = from_toml(&toml, Path::new("t.toml")).unwrap_err();
            assert_eq!(
                by_file.field,
                format!("class.{name} (class \"x\")"),
                "the file's error is about {name}: {by_file}"
            );
            assert!(by_file.to_string().contains("t.toml:3:"), "it points at the key's line: {by_file}");
            assert_eq!(Key::by_name(name), Some(key));
            assert!(help.contains(&format!("  {name}: ")), "--class's help lists {name}");
        }
        assert!(help.contains("  match: "));
        let unknown = parse_class_flag("x:colour=red").unwrap_err();
        assert!(unknown.message.contains("syn_cookies"), "the flag's unknown key lists the keys: {unknown}");
    }

    /// One grammar: a class written as a flag and as a file's table is the
    /// same class, and a bad value is refused by both with the same words.
    #[test]
    fn a_flag_and_a_file_table_that_say_the_same_make_the_same_class() {
        let flag = parse_class_flag(
            "api:priority=1,rate=auto,min_share=0.1,fallback=50k,readers=hash,cpu=away,syn_cookies=on,\
             match=udp:8053,match=tcp:8000-8010@10.0.0.0/8",
        )
        .unwrap();
        let file = from_toml(
            r#"[[class]]
name = "api"
priority = 1
rate = "auto"
min_share = 0.1
fallback = "50k"
readers = "hash"
cpu = "away"
syn_cookies = "on"
match = [{ proto = "udp", port = 8053 }, { proto = "tcp", port = "8000-8010", src = "10.0.0.0/8" }]
"#,
            Path::new("t.toml"),
        )
        .unwrap();
        assert_eq!(file.classes[0], flag);
        let by_flag = parse_class_flag("x:priority=300,match=udp:1").unwrap_err();
        let by_file = from_toml(
            "[[class]]\nname = \"x\"\npriority = 300\nmatch = [{ proto = \"udp\", port = 1 }]\n",
            Path::new("t.toml"),
        )
        .unwrap_err();
        assert_eq!(by_flag.message, by_file.message, "the same words");
        assert!(by_file.to_string().contains("t.toml:3:"), "the file's error points at the line: {by_file}");
        assert_eq!((by_flag.field.as_str(), by_file.field.as_str()), ("priority", "class.priority (class \"x\")"));
    }
}
