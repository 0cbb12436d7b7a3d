//! The rules `promtool check metrics` enforces that apply to sluice's
//! exposition, as a check every test can run without promtool installed
//! (`tests/deploy.rs` runs promtool itself where it is).

/// Check a text-format 0.0.4 exposition against the rules `promtool check
/// metrics` enforces that apply here: every family has HELP and TYPE; a
/// counter's name ends in `_total` and a gauge's does not; every sample
/// belongs to the family declared before it. Returns the families
/// (name, type) or the first broken rule.
pub fn lint_004(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut families: Vec<(String, String)> = vec![];
    let mut helped: Vec<String> = vec![];
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            if help.trim().is_empty() {
                return Err(format!("{name}: no help text"));
            }
            helped.push(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(format!("bad TYPE line: {line}"))?;
            if !helped.iter().any(|h| h == name) {
                return Err(format!("{name}: no help text"));
            }
            match (kind, name.ends_with("_total")) {
                ("counter", false) => return Err(format!("{name}: a counter's name must end in _total")),
                ("gauge", true) => {
                    return Err(format!("{name}: a gauge must not end in _total (it reads as a counter)"))
                }
                _ => {}
            }
            families.push((name.to_string(), kind.to_string()));
        } else if line.starts_with('#') {
            return Err(format!("unexpected comment line: {line}"));
        } else {
            let sample = line.split(['{', ' ']).next().unwrap_or("");
            match families.last() {
                Some((name, _)) if name == sample => {}
                _ => return Err(format!("{sample}: a sample outside its family (no HELP/TYPE before it)")),
            }
        }
    }
    Ok(families)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_catch_what_they_are_for() {
        assert!(lint_004("# HELP a_total x\n# TYPE a_total counter\na_total 1\n").is_ok());
        assert!(lint_004("# HELP a_total x\n# TYPE a_total gauge\na_total 1\n").is_err());
        assert!(lint_004("# HELP a x\n# TYPE a counter\na_total 1\n").is_err());
        assert!(lint_004("# TYPE a gauge\na 1\n").is_err());
        assert!(lint_004("# HELP a x\n# TYPE a gauge\nb 1\n").is_err());
    }
}
