//! Numbers as tables and log lines show them.

/// A value for a table, or "n/a" where it was not measured (never 0: a
/// missing measurement must not read as a good one).
pub fn missing_or(v: Option<f64>, show: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), show)
}

/// 1234567 -> "1.23M".
pub fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
