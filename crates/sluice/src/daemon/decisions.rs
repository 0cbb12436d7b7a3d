//! The daemon's decision lines in the log: a class's limit changing (`rate`
//! events: a budget throttle starting or ending, the auto controller moving
//! a rate) and the class list changing (`class` events). A flood cannot
//! flood the log: [`Decisions`] writes a rate line only when the limit
//! changes kind (unlimited, blocked, a rate) or moves by a quarter since the
//! class's last line, at most one a second per class (the line carries the
//! latest value and how many changes it covers), and every decision line
//! takes a token from one bucket (10 a second, 30 at once); lines refused
//! are counted and said in one line when tokens are back.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::base::fmt::human;
use crate::base::log::Line;
use crate::policy::config::Limit;

/// Why a class's limit changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The config (a reload).
    Config,
    /// The auto controller.
    Auto,
    /// A TCP class's answers are late (`policy::late`).
    Late,
    /// The budget throttles the class for a service of higher priority in
    /// distress (priority, signal), or holds the throttle while it recovers.
    Budget(Option<(u8, &'static str)>),
}

impl Cause {
    fn name(self) -> &'static str {
        match self {
            Cause::Config => "config",
            Cause::Auto => "auto",
            Cause::Late => "late-answers",
            Cause::Budget(_) => "budget",
        }
    }

    fn describe(self) -> String {
        match self {
            Cause::Config => "the config".into(),
            Cause::Auto => "the auto controller".into(),
            Cause::Late => format!(
                "late answers: its service's p{:.0} answer delay is over {} times its calm one (known clients first)",
                crate::policy::late::LATE_QUANTILE * 100.0,
                crate::policy::late::LATE_FACTOR
            ),
            Cause::Budget(Some((p, why))) => format!("the budget: a service of priority {p} is in distress ({why})"),
            Cause::Budget(None) => "the budget: holding while the service recovers".into(),
        }
    }
}

/// A class's limit as written this tick, and what decided it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub from: Limit,
    pub to: Limit,
    pub cause: Cause,
}

/// A rate line is written when a limit moves by this fraction since the class's last line.
const MATERIAL: f64 = 0.25;
/// At most one rate line per class this often (a change of kind is written at once).
const PER_CLASS: Duration = Duration::from_secs(1);
/// The bucket every decision line takes a token from.
const LINES_PER_SEC: f64 = 10.0;
const BURST: f64 = 30.0;

/// The decision lines: which changes are worth a line, and how many lines a
/// second the log takes (see the module comment).
#[derive(Debug)]
pub struct Decisions {
    classes: HashMap<String, Logged>,
    tokens: f64,
    refilled: Option<Instant>,
    suppressed: u64,
}

/// A class's last line, and the change not yet written.
#[derive(Debug)]
struct Logged {
    limit: Limit,
    at: Instant,
    pending: Option<Change>,
    /// Changes since the last line.
    changes: u32,
}

impl Logged {
    /// A class whose last line said `limit` at `at`.
    fn since(limit: Limit, at: Instant) -> Logged {
        Logged { limit, at, pending: None, changes: 0 }
    }

    /// The line for `ch` (covering the changes since the last one); the
    /// class's last line is now this one.
    fn write(&mut self, class: &str, ch: Change, now: Instant) -> Line {
        let line = rate_line(class, self.limit, ch, self.changes);
        *self = Logged::since(ch.to, now);
        line
    }
}

impl Default for Decisions {
    fn default() -> Self {
        Decisions { classes: HashMap::new(), tokens: BURST, refilled: None, suppressed: 0 }
    }
}

impl Decisions {
    /// A class's limit changed at `now`: the lines to write (none, one, or
    /// a suppression count first).
    pub fn rate(&mut self, now: Instant, class: &str, ch: Change) -> Vec<Line> {
        let first = !self.classes.contains_key(class);
        if first {
            self.classes.insert(class.into(), Logged::since(ch.from, now));
        }
        let l = self.classes.get_mut(class).expect("inserted above");
        l.changes += 1;
        let kind_changed = std::mem::discriminant(&kind(l.limit)) != std::mem::discriminant(&kind(ch.to));
        if first || kind_changed || (material(l.limit, ch.to) && now.duration_since(l.at) >= PER_CLASS) {
            let line = l.write(class, ch, now);
            return self.admit(now, line);
        }
        l.pending = material(l.limit, ch.to).then_some(ch);
        Vec::new()
    }

    /// Write what waited for its class's second (call every tick).
    pub fn flush(&mut self, now: Instant) -> Vec<Line> {
        let mut due = Vec::new();
        for (name, l) in &mut self.classes {
            if let Some(ch) = l.pending.filter(|_| now.duration_since(l.at) >= PER_CLASS) {
                due.push(l.write(name, ch, now));
            }
        }
        due.sort_by(|a, b| a.fields["class"].as_str().cmp(&b.fields["class"].as_str()));
        due.into_iter().flat_map(|line| self.admit(now, line)).collect()
    }

    /// A class added or removed.
    pub fn class(&mut self, now: Instant, class: &str, what: &'static str, msg: String) -> Vec<Line> {
        if what == "removed" {
            self.classes.remove(class);
        }
        let line = Line::new("info", "class", msg).with("class", class).with("change", what);
        self.admit(now, line)
    }

    /// Take a token for `line`: the line (after a count of those refused
    /// before it, if any), or nothing.
    fn admit(&mut self, now: Instant, line: Line) -> Vec<Line> {
        let dt = self.refilled.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        self.tokens = (self.tokens + dt * LINES_PER_SEC).min(BURST);
        self.refilled = Some(now);
        // A count of refused lines takes a token of its own.
        let need = if self.suppressed > 0 { 2.0 } else { 1.0 };
        if self.tokens < need {
            self.suppressed += 1;
            return Vec::new();
        }
        self.tokens -= need;
        let mut out = Vec::new();
        if self.suppressed > 0 {
            let n = std::mem::take(&mut self.suppressed);
            let msg = format!("{n} decision lines were not written (at most {LINES_PER_SEC} a second)");
            out.push(Line::new("warn", "suppressed", msg).with("lines", n));
        }
        out.push(line);
        out
    }
}

/// A limit's kind, to see a throttle start or end.
fn kind(l: Limit) -> Limit {
    match l {
        Limit::Rate { .. } => Limit::Rate { pps: 0, burst: 0 },
        other => other,
    }
}

/// Has a rate moved by MATERIAL or more?
fn material(from: Limit, to: Limit) -> bool {
    match (from, to) {
        (Limit::Rate { pps: a, .. }, Limit::Rate { pps: b, .. }) => {
            (b as f64 - a as f64).abs() >= MATERIAL * (a.max(1) as f64)
        }
        (a, b) => a != b,
    }
}

fn rate_line(class: &str, from: Limit, ch: Change, changes: u32) -> Line {
    let text = |l: Limit| match l {
        Limit::Rate { pps, .. } => format!("{} pkt/s", human(pps as f64)),
        Limit::Blocked => "blocked".into(),
        Limit::Unlimited | Limit::Auto(_) => "unlimited".into(),
    };
    let pps = |l: Limit| match l {
        Limit::Rate { pps, .. } => json!(pps),
        _ => Value::Null,
    };
    let also = if changes > 1 { format!("; {changes} changes since the class's last line") } else { String::new() };
    let msg = format!("class {class}: limit {} -> {} by {}{also}", text(from), text(ch.to), ch.cause.describe());
    let mut line = Line::new("info", "rate", msg)
        .with("class", class)
        .with("from", text(from))
        .with("to", text(ch.to))
        .with("from_pps", pps(from))
        .with("to_pps", pps(ch.to))
        .with("cause", ch.cause.name())
        .with("changes", changes);
    if let Cause::Budget(Some((p, why))) = ch.cause {
        line = line.with("distress_priority", p).with("distress", why);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::log::Format;
    use std::time::SystemTime;

    fn rate(pps: u64) -> Limit {
        Limit::Rate { pps, burst: 100 }
    }

    fn auto(from: Limit, to: Limit) -> Change {
        Change { from, to, cause: Cause::Auto }
    }

    #[test]
    fn a_rate_moved_every_tick_writes_one_line_a_second_per_class() {
        let mut d = Decisions::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        let mut last = rate(10_000);
        // 10 s of 10 ms ticks; the controller doubles or halves the rate every tick.
        for tick in 0..1000u64 {
            let now = t0 + Duration::from_millis(10 * tick);
            let to = rate(if tick % 2 == 0 { 20_000 } else { 10_000 });
            lines.extend(d.rate(now, "dns", auto(last, to)));
            lines.extend(d.flush(now));
            last = to;
        }
        assert!((10..=11).contains(&lines.len()), "{} lines: {lines:?}", lines.len());
        assert!(lines.iter().all(|l| l.event == "rate" && l.fields["class"] == "dns"));
        // Each line after the first covers the changes of its second (100
        // ticks; 101 when the tick at the second's end moved back to the last line's rate).
        let n: u32 = lines[2].fields["changes"].as_u64().unwrap() as u32;
        assert!((100..=101).contains(&n), "{}", lines[2].msg);
    }

    #[test]
    fn small_moves_write_nothing_until_they_add_up() {
        let mut d = Decisions::default();
        let t0 = Instant::now();
        assert_eq!(d.rate(t0, "web", auto(rate(1000), rate(1000))).len(), 1, "first sight of the class");
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(d.rate(at(2), "web", auto(rate(1000), rate(1100))).is_empty(), "10%: no line");
        assert!(d.rate(at(3), "web", auto(rate(1100), rate(1200))).is_empty(), "20% from the last line: none");
        let l = d.rate(at(4), "web", auto(rate(1200), rate(1300)));
        assert_eq!(l.len(), 1, "30% from the last line's 1000");
        assert_eq!(l[0].fields["from_pps"], 1000);
        assert_eq!(l[0].fields["to_pps"], 1300);
    }

    #[test]
    fn a_throttle_starting_or_ending_is_written_at_once() {
        let mut d = Decisions::default();
        let t0 = Instant::now();
        let by = Cause::Budget(Some((0, "socket drops")));
        assert_eq!(d.rate(t0, "bulk", Change { from: Limit::Unlimited, to: rate(5000), cause: by }).len(), 1);
        let later = t0 + Duration::from_millis(20);
        let l = d.rate(later, "bulk", Change { from: rate(5000), to: Limit::Unlimited, cause: Cause::Config });
        assert_eq!(l.len(), 1, "a change of kind does not wait for the class's second");
        assert_eq!(l[0].fields["to"], "unlimited");
        assert_eq!(l[0].fields["to_pps"], Value::Null, "no rate is not a rate of 0");
    }

    #[test]
    fn a_storm_of_decisions_is_capped_and_counted() {
        let mut d = Decisions::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        // 200 classes whose throttle flips every 10 ms for 5 s: 100,000 decisions.
        for tick in 0..500u64 {
            let now = t0 + Duration::from_millis(10 * tick);
            let (from, to) = if tick % 2 == 0 { (Limit::Unlimited, rate(100)) } else { (rate(100), Limit::Unlimited) };
            for c in 0..200 {
                lines.extend(d.rate(now, &format!("c{c}"), Change { from, to, cause: Cause::Budget(None) }));
            }
        }
        let budget = BURST + 5.0 * LINES_PER_SEC;
        assert!(lines.len() as f64 <= budget + 1.0, "{} lines in 5 s", lines.len());
        let counted: u64 =
            lines.iter().filter(|l| l.event == "suppressed").map(|l| l.fields["lines"].as_u64().unwrap()).sum();
        let written = lines.iter().filter(|l| l.event == "rate").count() as u64;
        // Every decision is either written or counted, except those refused after the last count.
        assert!(written + counted <= 100_000 && written + counted > 100_000 - 500 * 200 / 5, "{written} + {counted}");
    }

    #[test]
    fn a_rate_line_in_json_carries_the_decision() {
        let mut d = Decisions::default();
        let by = Cause::Budget(Some((0, "socket drops")));
        let l = d.rate(Instant::now(), "bulk", Change { from: Limit::Unlimited, to: rate(12_000), cause: by });
        let text = l[0].render(Format::Json, SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
        assert!(!text.contains('\n'));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ts"], 1_700_000_000.123);
        assert_eq!(v["level"], "info");
        assert_eq!(v["event"], "rate");
        assert_eq!(v["class"], "bulk");
        assert_eq!(v["to_pps"], 12_000);
        assert_eq!(v["cause"], "budget");
        assert_eq!(v["distress"], "socket drops");
        let human = l[0].render(Format::Human, SystemTime::now());
        assert_eq!(
            human,
            "sluice: class bulk: limit unlimited -> 12.0k pkt/s by the budget: a service of priority 0 is in distress (socket drops)"
        );
    }
}
