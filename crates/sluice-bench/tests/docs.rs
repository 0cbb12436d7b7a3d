//! The documents say what the code does: numbers the docs and the results
//! schema state are the ones the code uses (no root needed).
use sluice_bench::scenarios::scenario;
use sluice_bench::scenarios::sweep::LOSS_FREE;

fn read(rel: &str) -> String {
    let path = format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Regression: the code counted under 0.5% loss as loss-free, the README and
/// the results schema said 0.1%.
#[test]
fn the_mlfrr_threshold_is_the_one_the_docs_state() {
    let stated = format!("{}% loss", LOSS_FREE * 100.0);
    for doc in ["docs/results-schema.md", "docs/bench.md"] {
        let text = read(doc);
        assert!(text.contains(&stated), "{doc} does not state the MLFRR threshold as \"{stated}\"");
        for other in ["0.1% loss", "0.2% loss", "1% loss"] {
            assert!(other == stated || !text.contains(other), "{doc} states \"{other}\"");
        }
    }
}

/// Regression: the README called scenarios/readme.toml "the default scenario
/// at 3 s x 1"; it has fewer levels and one flood source. The README now says
/// how it differs; this checks that it differs in exactly that.
#[test]
fn the_readme_scenario_is_the_default_with_the_stated_differences() {
    let readme_sc = scenario::load(&format!("{}/../../scenarios/readme.toml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut want = scenario::load("default").unwrap();
    want.name = "readme".into();
    want.levels.retain(|&l| l != 0.75);
    (want.duration, want.repeats) = (3.0, 1);
    for s in want.streams.iter_mut().filter(|s| !s.legit) {
        s.sources = 1;
    }
    assert_eq!(readme_sc, want);
    let file = "docs/results/2026-11-21-the-bench-on-the-reference-machine.md";
    let text = read(file);
    assert!(
        text.contains("9 levels (no 0.75x), one flood source address instead\nof 16, and 3 s x 1 per level"),
        "{file}'s description of scenarios/readme.toml"
    );
}
