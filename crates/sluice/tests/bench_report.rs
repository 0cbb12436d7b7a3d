//! Report generation from a recorded results fixture (a real `sluice bench run
//! --scenario demo` on the reference machine), and the schema's round trip.
use sluice::bench::report;
use sluice::bench::sweep::Results;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/demo-results.json");

#[test]
fn results_json_round_trips() {
    let r = report::load(std::path::Path::new(FIXTURE)).unwrap();
    let text = serde_json::to_string(&r).unwrap();
    let back: Results = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    assert_eq!(r.schema_version, sluice::bench::scenario::SCHEMA_VERSION);
}

#[test]
fn a_wrong_schema_version_is_refused() {
    let dir = std::env::temp_dir().join(format!("sluice-report-v-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    v["schema_version"] = 999.into();
    let p = dir.join("results.json");
    std::fs::write(&p, v.to_string()).unwrap();
    let e = report::load(&p).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(e.contains("schema version 999"), "{e}");
}

#[test]
fn report_renders_from_the_fixture() {
    let r = report::load(std::path::Path::new(FIXTURE)).unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-report-{}", std::process::id()));
    report::write_all(&r, &dir).unwrap();
    let m = &r.models[0];
    for stem in ["delivered", "cpu", "ns_per_delivered", "legit_p99"] {
        for ext in ["svg", "png"] {
            let f = dir.join(format!("{}-{stem}.{ext}", m.model.name()));
            assert!(std::fs::metadata(&f).map(|x| x.len() > 1000).unwrap_or(false), "{} missing or empty", f.display());
        }
    }
    let svg = std::fs::read_to_string(dir.join(format!("{}-delivered.svg", m.model.name()))).unwrap();
    assert!(svg.contains("delivered vs applied load") && svg.contains("static"), "the figure has its title and a line per configuration");
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + m.results.len(), "one CSV row per measurement");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("Ledger") && html.contains(&format!("{}", m.results[0].ledger.applied)), "the ledger is in the report");
    assert!(html.contains(&r.machine.kernel) && html.contains("on CPU"), "machine and stage placement are in the report");
    let summary = report::summary(&r);
    assert!(summary.contains("peak") && summary.contains("static"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}
