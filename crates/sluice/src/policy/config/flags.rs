//! The flag syntax: --class 'NAME:priority=P,rate=R,burst=B,match=PROTO[:PORTS][@PREFIX],...'.
use super::*;

/// Parse one `--class` flag into a class (not yet validated against the
/// others): its keys (`grammar::CLASS_KEYS`), then the one grammar (`grammar.rs`).
pub fn parse_class_flag(spec: &str) -> Result<Class, ConfigError> {
    let err =
        |field: &str, message: String| ConfigError { origin: Origin::Flag(spec.into()), field: field.into(), message };
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut k = ClassKeys { name: name.trim().into(), ..Default::default() };
    for kv in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, v) =
            kv.split_once('=').ok_or_else(|| err(kv, format!("expected key=value with key one of {}", flag_keys())))?;
        match (key.trim(), Key::by_name(key.trim())) {
            ("match", _) => k.rules.push(rule_keys(v)),
            (_, Some(key)) => {
                k.values.insert(key, v.to_string());
            }
            (other, None) => return Err(err(other, format!("unknown key; valid keys: {}", flag_keys()))),
        }
    }
    // A flag names a rule's errors by its one key, `match`.
    build_class(&k, &|key, m| match key {
        Key::Rule(..) => err("match", m),
        key => err(key.name(), m),
    })
}

/// A rule written `PROTO[:PORTS][@PREFIX]`.
fn rule_keys(v: &str) -> RuleKeys {
    let (pp, src) = match v.split_once('@') {
        Some((pp, s)) => (pp, Some(s.to_string())),
        None => (v, None),
    };
    let (proto, port) = match pp.split_once(':') {
        Some((p, ports)) => (p, Some(ports.to_string())),
        None => (pp, None),
    };
    RuleKeys { proto: Some(proto.to_string()), port, src }
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
