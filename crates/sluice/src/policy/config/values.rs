//! Value parsers shared by the TOML file and the flag syntax. They return a
//! message saying what is valid; the caller adds the origin and field.
use super::*;

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
pub(super) fn parse_limit(rate: &str, burst: Option<u64>) -> Result<Limit, (&'static str, String)> {
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
pub(super) fn auto_keys(
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
            // "knee" named the algorithm "capacity" replaced: a config
            // written for it keeps working.
            "capacity" | "knee" => Algo::Capacity,
            "pno" => Algo::Pno,
            other => {
                return Err((
                    "algo",
                    format!("unknown algorithm \"{other}\"; valid: \"capacity\" (default) or \"pno\""),
                ))
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

pub(super) fn parse_proto(s: &str) -> Result<Proto, String> {
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
pub(super) fn parse_ports(s: &str) -> Result<(u16, u16), String> {
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

pub(super) fn make_rule(
    proto: Proto,
    ports: Option<(u16, u16)>,
    src: Option<Prefix>,
) -> Result<Rule, (&'static str, String)> {
    if ports.is_some() && !matches!(proto, Proto::Udp | Proto::Tcp) {
        return Err(("port", "ports only apply to proto \"udp\" or \"tcp\"".into()));
    }
    Ok(Rule { proto, ports, src })
}

/// The `cpu` key: "away" (true) or "stay" (false).
pub(super) fn parse_cpu(s: &str) -> Result<bool, String> {
    match s.trim() {
        "away" => Ok(true),
        "stay" => Ok(false),
        other => Err(format!("\"{other}\" is not a cpu policy; valid: \"stay\" (default) or \"away\"")),
    }
}
