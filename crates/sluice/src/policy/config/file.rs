//! The TOML file: its raw shape (serde), and errors with file:line:column.
use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
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
pub(super) struct RawAuto {
    hold: Option<f64>,
    pno_step: Option<u64>,
    napi: Option<NapiSched>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
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
pub(super) struct RawRule {
    proto: Option<Spanned<IntOrString>>,
    port: Option<Spanned<IntOrString>>,
    src: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum IntOrString {
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

pub(super) fn line_col(src: &str, offset: usize) -> (usize, usize) {
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
pub(super) struct Locator<'a> {
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
