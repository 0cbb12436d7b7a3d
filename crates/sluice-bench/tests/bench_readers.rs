//! `sluice bench run --scenario readers` end to end, 1 s cells: every cell
//! ran and measured, and least-loaded steers around a stalling reader.
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

#[test]
fn the_readers_scenario_measures_every_cell_and_least_loaded_steers_around_a_stall() {
    let dir = std::env::temp_dir().join(format!("sluice-bench-readers-test-{}", std::process::id()));
    let run = Command::new(BENCH)
        .args(["run", "--scenario", "readers", "--duration", "1", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("PROG ns"), "the summary is printed: {stdout}");
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!((results["schema_version"].as_u64(), results["scenario"].as_str()), (Some(1), Some("readers")));
    let cells = results["cells"].as_array().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(cells.len(), 21, "13 threads + 6 stall + 2 nsd cells");
    for c in cells {
        assert!(c["answered"].as_u64().unwrap() > 0, "{c}");
        let steered = c["layout"] == "round-robin" || c["layout"] == "least-loaded";
        assert_eq!(c["prog_ns"].is_number(), steered, "the program's cost where it ran, missing where not: {c}");
    }
    let find = |part: &str, layout: &str, stall: bool| {
        cells.iter().find(|c| c["part"] == part && c["layout"] == layout && c["stall"] == stall).unwrap()
    };
    let ll = find("stall", "least-loaded", true);
    assert!(
        ll["lost"].as_u64().unwrap() * 1000 <= ll["sent"].as_u64().unwrap(),
        "least-loaded loses (almost) nothing to a stalled reader: {ll}"
    );
    // A policy that keeps feeding the stalled reader (round-robin) delays its
    // quarter of the traffic for 10% of the time by up to 20 ms: a p99 of
    // 10-16 ms. Least-loaded measured 0.2-0.45 ms in 3 s cells, 1.2 ms and,
    // in slow hours of CI, 5.7 ms and 7.7 ms (against round-robin's 12.6 ms
    // in the same run) in 1 s cells: it reacts at the daemon's tick, and a
    // late tick sends more to the stalled reader. So the bound is side by
    // side in the same run: under 0.8 of round-robin's p99 (a least-loaded
    // that fed the stalled reader as round-robin does would be at 1). (The target, 2x
    // the unstalled p99, is checked by the bench's figures, not here; nor the
    // hash's, which depends on how many of the 16 flows it happens to put on
    // the stalling reader.)
    let p_ll = ll["p99_us"].as_f64().unwrap();
    let p_rr = find("stall", "round-robin", true)["p99_us"].as_f64().unwrap();
    assert!(p_ll < 0.8 * p_rr, "p99 {p_ll} us with a reader stalling 20 ms in 200, round-robin's {p_rr} us: {ll}");
}
