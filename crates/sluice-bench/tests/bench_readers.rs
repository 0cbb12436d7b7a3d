//! `sluice bench run --scenario readers` end to end, 1 s cells: every cell
//! ran and measured, and the stalling reader shows what each policy does.
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

#[test]
fn the_readers_scenario_measures_every_cell_and_least_loaded_steers_around_a_stall() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(BENCH)
        .args(["run", "--scenario", "readers", "--duration", "1", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("PROG ns"), "the summary is printed: {stdout}");
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(cells.len(), 21, "13 threads + 6 stall + 2 nsd cells");
    for c in &cells {
        assert!(c["answered"].as_u64().unwrap() > 0, "{c}");
        let steered = c["layout"] == "round-robin" || c["layout"] == "least-loaded";
        assert_eq!(c["prog_ns"].is_number(), steered, "the program's cost where it ran, missing where not: {c}");
    }
    let find = |part: &str, layout: &str, stall: bool| {
        cells.iter().find(|c| c["part"] == part && c["layout"] == layout && c["stall"] == stall).unwrap()
    };
    let ll = find("stall", "least-loaded", true);
    let hash = find("stall", "hash", true);
    assert!(
        ll["lost"].as_u64().unwrap() * 1000 <= ll["sent"].as_u64().unwrap(),
        "least-loaded loses (almost) nothing to a stalled reader: {ll}"
    );
    // A hashed stalled reader holds its share of the traffic for 20 ms.
    assert!(hash["p99_us"].as_f64().unwrap() > 4.0 * ll["p99_us"].as_f64().unwrap(), "{hash}\n{ll}");
}
