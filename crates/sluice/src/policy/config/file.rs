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
    priority: Option<Spanned<IntOrString>>,
    rate: Option<Spanned<IntOrString>>,
    burst: Option<Spanned<IntOrString>>,
    algo: Option<Spanned<String>>,
    min_share: Option<Spanned<IntOrString>>,
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

impl RawClass {
    /// The value written for `key` (of `grammar::CLASS_KEYS`) as its text,
    /// and where; None where the table does not have it. (serde reads the
    /// table into the fields above, named as CLASS_KEYS spells them: the
    /// test `every_class_key_is_read_from_a_file_and_a_flag_and_shown_in_help`
    /// holds the two together.)
    fn value(&self, key: Key) -> Option<(String, std::ops::Range<usize>)> {
        let num = |v: &Option<Spanned<IntOrString>>| v.as_ref().map(|v| (v.get_ref().text(), v.span()));
        let txt = |v: &Option<Spanned<String>>| v.as_ref().map(|v| (v.get_ref().clone(), v.span()));
        match key {
            Key::Name => Some((self.name.get_ref().clone(), self.name.span())),
            Key::Priority => num(&self.priority),
            Key::Rate => num(&self.rate),
            Key::Burst => num(&self.burst),
            Key::Algo => txt(&self.algo),
            Key::MinShare => num(&self.min_share),
            Key::Fallback => num(&self.fallback),
            Key::Readers => txt(&self.readers),
            Key::Cpu => txt(&self.cpu),
            Key::SynCookies => txt(&self.syn_cookies),
            Key::Rule(..) => None,
        }
    }
}

/// A value TOML may write as a number or as a string ("450k"): its text
/// goes to the one grammar either way.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum IntOrString {
    Int(i64),
    Float(f64),
    Str(String),
}

impl IntOrString {
    fn text(&self) -> String {
        match self {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::Float(f) => f.to_string(),
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

    /// A `[[class]]` table: its keys as text, then the one grammar
    /// (`grammar.rs`); an error points at the key it is about.
    fn class(&self, rc: &Spanned<RawClass>) -> Result<Class, ConfigError> {
        let cspan = rc.span();
        let rc = rc.get_ref();
        let values = CLASS_KEYS.iter().filter_map(|&(key, ..)| rc.value(key).map(|(v, _)| (key, v))).collect();
        let keys = ClassKeys {
            name: rc.name.get_ref().clone(),
            values,
            rules: rc
                .rules
                .iter()
                .map(|r| {
                    let r = r.get_ref();
                    let text = |v: &Option<Spanned<IntOrString>>| v.as_ref().map(|v| v.get_ref().text());
                    RuleKeys {
                        proto: text(&r.proto),
                        port: text(&r.port),
                        src: r.src.as_ref().map(|s| s.get_ref().clone()),
                    }
                })
                .collect(),
        };
        let name = &keys.name;
        let span_of = |key: Key| {
            let span = match key {
                // A rate's error about the burst points at the burst, if written.
                Key::Burst => rc.value(Key::Burst).or_else(|| rc.value(Key::Rate)).map(|(_, s)| s),
                Key::Rule(i, part) => rc.rules.get(i).map(|r| {
                    let (whole, r) = (r.span(), r.get_ref());
                    match part {
                        RulePart::Proto => r.proto.as_ref().map(Spanned::span),
                        RulePart::Port => r.port.as_ref().map(Spanned::span),
                        RulePart::Src => r.src.as_ref().map(Spanned::span),
                        RulePart::Whole => None,
                    }
                    .unwrap_or(whole)
                }),
                key => rc.value(key).map(|(_, s)| s),
            };
            span.unwrap_or(cspan.clone())
        };
        build_class(&keys, &|key, m| {
            let field =
                if key == Key::Name { "name".to_string() } else { format!("class.{} (class \"{name}\")", key.name()) };
            self.at(span_of(key), &field, m)
        })
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
