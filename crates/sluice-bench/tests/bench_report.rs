//! Report generation from a recorded results fixture (a real `sluice bench run
//! --scenario demo` on the reference machine), and the schema's round trip.
use sluice_bench::report;
use sluice_bench::scenarios::sweep::Results;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/demo-results.json");

#[test]
fn results_json_round_trips() {
    let r = report::load(std::path::Path::new(FIXTURE)).unwrap();
    let text = serde_json::to_string(&r).unwrap();
    let back: Results = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
}

/// A version-1 file (the fixture is one) is summarised again on load: the
/// median of two repeats is their mean (version 1 took the larger), and a
/// window without replies has no p99 (version 1 wrote 0).
#[test]
fn a_version_1_file_is_summarised_again() {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    assert_eq!(v["schema_version"], 1, "the fixture is a version-1 recording");
    let results = v["models"][0]["results"].as_array_mut().unwrap();
    let mut second = results[0].clone();
    second["repeat"] = 1.into();
    let first = results[0]["delivered_pps"].as_f64().unwrap();
    second["delivered_pps"] = (first + 1000.0).into();
    second["legit_replies"] = 0.into();
    second["rtt"]["p99_us"] = 0.0.into();
    results.push(second);
    let dir = std::env::temp_dir().join(format!("sluice-report-v1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("results.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let r = report::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r.schema_version, sluice_bench::scenarios::scenario::SCHEMA_VERSION);
    let m = &r.models[0];
    let x = &m.results[0];
    let p = m.points.iter().find(|p| p.config == x.config && p.multiple == x.multiple).unwrap();
    assert_eq!(p.delivered_pps.median, Some(first + 500.0), "the mean of the two repeats");
    assert_eq!((p.delivered_pps.min, p.delivered_pps.max), (Some(first), Some(first + 1000.0)));
    assert_eq!(m.results.last().unwrap().rtt.p99_us, None, "no replies: no p99");
    assert_eq!(p.legit_p99_us.missing, 1, "the repeat without replies is counted as missing");
    assert_eq!(p.legit_p99_us.median, x.rtt.p99_us, "the median is the one repeat that has a p99");
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
    assert!(
        svg.contains("delivered vs applied load") && svg.contains("static"),
        "the figure has its title and a line per configuration"
    );
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + m.results.len(), "one CSV row per measurement");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.contains("Ledger") && html.contains(&format!("{}", m.results[0].ledger.applied)),
        "the ledger is in the report"
    );
    assert!(
        html.contains(&r.machine.kernel) && html.contains("on CPU"),
        "machine and stage placement are in the report"
    );
    let summary = report::summary(&r);
    assert!(summary.contains("peak") && summary.contains("static"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}
