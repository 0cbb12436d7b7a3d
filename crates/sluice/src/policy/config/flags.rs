//! The flag syntax: --class 'NAME:priority=P,rate=R,burst=B,match=PROTO[:PORTS][@PREFIX],...'.
use super::*;

pub(super) const FLAG_KEYS: &str = "priority, rate, burst, match, algo, min_share, fallback, readers, cpu, syn_cookies";

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
