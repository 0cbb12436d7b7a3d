//! `sluice bench run --scenario cpu` end to end, 1 s cells: every cell ran,
//! the flood reached its rate (a client that spins on the generator's CPU
//! once held it to a tenth or so), and in the same-core model `cpu = "away"`
//! kept the high-priority service's goodput.
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

#[test]
fn the_cpu_scenario_floods_at_rate_and_away_keeps_the_high_priority_service() {
    let dir = std::env::temp_dir().join(format!("sluice-bench-cpu-test-{}", std::process::id()));
    let run =
        Command::new(BENCH).args(["run", "--scenario", "cpu", "--duration", "1", "--out"]).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!((results["schema_version"].as_u64(), results["scenario"].as_str()), (Some(1), Some("cpu")));
    let cells = results["cells"].as_array().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(cells.len(), 9, "4 nic + 5 same-core cells");
    for c in cells {
        match c["config"].as_str().unwrap() {
            "unflooded" => {
                assert!(c["flood_pps"].is_null(), "{c}");
                assert!(other_loss(c) < 0.05, "no flood, no loss to speak of: {c}");
            }
            _ => assert!(c["flood_pps"].as_f64().unwrap() > 50_000.0, "the flood ran near its rate: {c}"),
        }
    }
    let away = cells.iter().find(|c| c["model"] == "same-core" && c["config"] == "away").unwrap();
    // Target 95% (measured 100% in 3 s cells); 90% here for a 1 s cell.
    assert!(other_loss(away) < 0.10, "{away}");
}

/// hi's lost share, the gate's own drops of it included (issue 23, item 14:
/// they were excused). 1 s cells: answered per second is the count.
fn other_loss(c: &serde_json::Value) -> f64 {
    let sent = c["hi_sent"].as_f64().unwrap();
    let answered = c["hi_pps"].as_f64().unwrap();
    (sent - answered) / sent
}
