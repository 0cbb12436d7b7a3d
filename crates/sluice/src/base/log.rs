//! Log lines: one per event on stderr (the journal under systemd),
//! human-readable by default, one JSON object per line with
//! `sluice run --log-format json`. The daemon's decision lines (which limit
//! changes get a line, and how many a second) are `daemon/decisions.rs`.
//!
//! Not `tracing` + `tracing-subscriber`: their JSON lines nest the fields
//! (`{"timestamp","level","fields":{...},"target"}`), so keeping this
//! documented line (docs/usage.md) would take a formatter of our own on top
//! of two crates, longer than this module; and sluice has no spans to record.
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use serde_json::{json, Map, Value};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// `sluice: MESSAGE` (the journal adds the time).
    #[default]
    Human,
    /// `{"ts":UNIX_SECS,"level":...,"event":...,"msg":...,...}`.
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

/// Set the format of every later line (once, as the daemon starts).
pub fn set_format(f: Format) {
    JSON.store(f == Format::Json, Ordering::Relaxed);
}

fn format() -> Format {
    if JSON.load(Ordering::Relaxed) {
        Format::Json
    } else {
        Format::Human
    }
}

/// A plain line: what the daemon did or found.
pub fn info(msg: impl Display) {
    write(&Line::new("info", "message", msg.to_string()));
}

/// Something failed or was refused; the daemon goes on.
pub fn warn(msg: impl Display) {
    write(&Line::new("warn", "message", msg.to_string()));
}

/// The daemon stops on this error.
pub fn error(msg: impl Display) {
    write(&Line::new("error", "message", msg.to_string()));
}

/// Write a line as the format wants.
pub fn write(line: &Line) {
    eprintln!("{}", line.render(format(), SystemTime::now()));
}

/// One log line: its level, event kind, message and fields (for JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub level: &'static str,
    pub event: &'static str,
    pub msg: String,
    pub fields: Map<String, Value>,
}

impl Line {
    pub fn new(level: &'static str, event: &'static str, msg: String) -> Line {
        Line { level, event, msg, fields: Map::new() }
    }

    /// The line with one more JSON field.
    pub fn with(mut self, key: &str, v: impl Into<Value>) -> Line {
        self.fields.insert(key.into(), v.into());
        self
    }

    /// The line as text, without the newline.
    pub fn render(&self, f: Format, now: SystemTime) -> String {
        match f {
            Format::Human if self.level == "info" => format!("sluice: {}", self.msg),
            Format::Human => format!("sluice: {}: {}", self.level, self.msg),
            Format::Json => {
                let ts = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                let mut o = Map::new();
                o.insert("ts".into(), json!((ts * 1e3).round() / 1e3));
                o.insert("level".into(), json!(self.level));
                o.insert("event".into(), json!(self.event));
                o.insert("msg".into(), json!(self.msg));
                o.extend(self.fields.clone());
                Value::Object(o).to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_and_a_human_one_says_its_level() {
        let line = Line::new("warn", "message", "x".into()).with("class", "dns");
        let text =
            line.render(Format::Json, SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123));
        assert!(!text.contains('\n'));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (v["ts"].as_f64(), v["level"].as_str(), v["class"].as_str()),
            (Some(1_700_000_000.123), Some("warn"), Some("dns"))
        );
        assert_eq!(line.render(Format::Human, SystemTime::now()), "sluice: warn: x");
    }
}
