//! The status JSON's one description of each field: the doc comment on
//! the field of [`Snapshot`] (and the types it holds). `schemars` turns
//! those comments into the JSON Schema `sluice status --schema` prints, and
//! the reference docs/status-json.md is made from that schema; a test holds
//! the document equal to it (`SLUICE_WRITE_DOCS=1` rewrites it), as
//! `families.rs` does for the metrics.
use serde_json::{Map, Value};

use super::Snapshot;

/// The JSON Schema of `sluice status --json`, descriptions included.
pub fn status_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Snapshot)).expect("a schema is JSON")
}

/// One field of the status JSON: its path (`classes[].totals.seen_pkts`),
/// its type in words, and its description.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub path: String,
    pub kind: String,
    pub what: String,
}

/// Every field of the status JSON, by name within each object.
pub fn status_fields() -> Vec<Field> {
    let schema = status_schema();
    let defs = schema.get("definitions").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut out = vec![];
    walk(&schema, &defs, "", &mut out);
    out
}

/// A schema with its references followed and `null` taken out of its
/// alternatives: (the schema, whether null is allowed).
fn resolve<'a>(s: &'a Value, defs: &'a Map<String, Value>) -> (&'a Value, bool) {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/definitions/");
        return match defs.get(name) {
            Some(d) => resolve(d, defs),
            None => (s, false),
        };
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            let real: Vec<&Value> = alts.iter().filter(|a| a.get("type") != Some(&Value::from("null"))).collect();
            if real.len() == 1 {
                let (inner, null) = resolve(real[0], defs);
                return (inner, null || real.len() < alts.len());
            }
        }
    }
    (s, false)
}

/// The schema's type in words ("integer", "array of string", "[string, number]").
fn kind(s: &Value, defs: &Map<String, Value>) -> (String, bool) {
    let (s, mut null) = resolve(s, defs);
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    null |= types.contains(&"null");
    let t = types.into_iter().find(|t| *t != "null").unwrap_or("object");
    let words = match (t, s.get("items")) {
        ("array", Some(Value::Array(items))) => {
            format!("[{}]", items.iter().map(|i| kind(i, defs).0).collect::<Vec<_>>().join(", "))
        }
        ("array", Some(item)) => format!("array of {}", kind(item, defs).0),
        _ => t.to_string(),
    };
    (words, null)
}

/// One line of a doc comment's text.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn walk(s: &Value, defs: &Map<String, Value>, path: &str, out: &mut Vec<Field>) {
    let (inner, _) = resolve(s, defs);
    // An array of objects: its items' fields under `path[]`.
    if let Some(item) = inner.get("items").filter(|i| i.is_object()) {
        let (item, _) = resolve(item, defs);
        if item.get("properties").is_some() {
            walk(item, defs, &format!("{path}[]"), out);
        }
        return;
    }
    let Some(props) = inner.get("properties").and_then(Value::as_object) else { return };
    for (name, p) in props {
        let field = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        let (words, null) = kind(p, defs);
        // A field's own comment, else its type's.
        let what = p
            .get("description")
            .or_else(|| resolve(p, defs).0.get("description"))
            .and_then(Value::as_str)
            .map(one_line)
            .unwrap_or_default();
        out.push(Field { path: field.clone(), kind: if null { format!("{words} or null") } else { words }, what });
        walk(p, defs, &field, out);
    }
}

/// docs/status-json.md as the schema makes it.
pub fn reference_markdown() -> String {
    let mut s = String::from(
        "# `sluice status --json`: the fields\n\n\
         Made from the doc comments on the snapshot's types \
         (`crates/sluice/src/surface/stats/`); `sluice status --schema` prints \
         the same as a JSON Schema. Do not edit by hand: \
         `SLUICE_WRITE_DOCS=1 cargo test -p sluice --lib schema` rewrites it.\n\n\
         A value that was not measured is null, never 0 (a description's \
         \"None\" is null in the JSON).\n\n\
         | field | type | what it is |\n|---|---|---|\n",
    );
    for f in status_fields() {
        s += &format!("| `{}` | {} | {} |\n", f.path, f.kind, f.what.replace('|', "\\|"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/status-json.md is what the doc comments make it; every field
    /// has a description (a field added without one fails here).
    #[test]
    fn the_status_reference_is_made_from_the_doc_comments() {
        let fields = status_fields();
        let undescribed: Vec<&str> = fields.iter().filter(|f| f.what.is_empty()).map(|f| f.path.as_str()).collect();
        assert!(undescribed.is_empty(), "status fields without a doc comment: {undescribed:?}");
        for must in ["version", "classes[].totals.seen_pkts", "classes[].auto.capacity_pps", "sources.capacity"] {
            assert!(
                fields.iter().any(|f| f.path == must),
                "{must} in {:?}",
                fields.iter().map(|f| &f.path).collect::<Vec<_>>()
            );
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/status-json.md");
        let want = reference_markdown();
        if std::env::var_os("SLUICE_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/status-json.md is out of date: run SLUICE_WRITE_DOCS=1 cargo test -p sluice --lib schema"
        );
    }
}
