//! The one grammar of a class, whichever syntax wrote it: a file's
//! `[[class]]` table (file.rs) or a `--class NAME:KEY=VAL,...` flag
//! (flags.rs). Each syntax only reads its text into [`ClassKeys`]; which
//! keys there are, what values they take and how they combine into a
//! [`Class`] is decided here once, and an error names the [`Key`] it is
//! about so each syntax can say where that key was written.
use super::*;

/// One class as written: every value as its text.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ClassKeys {
    pub name: String,
    pub priority: Option<String>,
    pub rate: Option<String>,
    pub burst: Option<String>,
    pub algo: Option<String>,
    pub min_share: Option<String>,
    pub fallback: Option<String>,
    pub readers: Option<String>,
    pub cpu: Option<String>,
    pub syn_cookies: Option<String>,
    pub rules: Vec<RuleKeys>,
}

/// One match rule as written.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct RuleKeys {
    pub proto: Option<String>,
    pub port: Option<String>,
    pub src: Option<String>,
}

/// The key an error is about (a rule's part with the rule's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RulePart {
    Whole,
    Proto,
    Port,
    Src,
}

impl Key {
    /// The key's name as the file writes it (`match.port` for a rule's part).
    pub fn name(self) -> &'static str {
        match self {
            Key::Name => "name",
            Key::Priority => "priority",
            Key::Rate => "rate",
            Key::Burst => "burst",
            Key::Algo => "algo",
            Key::MinShare => "min_share",
            Key::Fallback => "fallback",
            Key::Readers => "readers",
            Key::Cpu => "cpu",
            Key::SynCookies => "syn_cookies",
            Key::Rule(_, RulePart::Whole) => "match",
            Key::Rule(_, RulePart::Proto) => "match.proto",
            Key::Rule(_, RulePart::Port) => "match.port",
            Key::Rule(_, RulePart::Src) => "match.src",
        }
    }

    /// A field name the value checks return ("rate", "burst", "algo", ...).
    fn of(field: &str) -> Key {
        match field {
            "burst" => Key::Burst,
            "algo" => Key::Algo,
            "min_share" => Key::MinShare,
            "fallback" => Key::Fallback,
            _ => Key::Rate,
        }
    }
}

/// The class `k` says, or the first error, about the key it names.
pub(super) fn build_class(k: &ClassKeys, err: &dyn Fn(Key, String) -> ConfigError) -> Result<Class, ConfigError> {
    check_name(&k.name).map_err(|m| err(Key::Name, m))?;
    let priority = match &k.priority {
        Some(p) => p.trim().parse().map_err(|_| err(Key::Priority, format!("\"{p}\" is not 0-255 (0 = highest)")))?,
        None => DEFAULT_PRIORITY,
    };
    let burst = k.burst.as_deref().map(parse_count).transpose().map_err(|m| err(Key::Burst, m))?;
    let limit = match &k.rate {
        Some(r) => parse_limit(r, burst).map_err(|(f, m)| err(Key::of(f), m))?,
        None if burst.is_some() => return Err(err(Key::Burst, "a burst needs a packets/s rate".into())),
        None => Limit::Unlimited,
    };
    let min_share = match &k.min_share {
        Some(m) => Some(
            m.trim()
                .parse::<f64>()
                .map_err(|_| err(Key::MinShare, format!("\"{m}\" is not a number; valid: 0 to 1")))?,
        ),
        None => None,
    };
    let limit =
        auto_keys(limit, k.algo.as_deref(), min_share, k.fallback.as_deref()).map_err(|(f, m)| err(Key::of(f), m))?;
    let rules = k.rules.iter().enumerate().map(|(i, r)| rule(i, r, err)).collect::<Result<Vec<_>, _>>()?;
    let readers = k.readers.as_deref().map(Readers::parse).transpose().map_err(|m| err(Key::Readers, m))?;
    let away = k.cpu.as_deref().map(parse_cpu).transpose().map_err(|m| err(Key::Cpu, m))?.unwrap_or(false);
    let syn_cookies = k
        .syn_cookies
        .as_deref()
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
