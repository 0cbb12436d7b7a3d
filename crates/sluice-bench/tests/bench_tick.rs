//! `sluice bench tick` measures the daemon's own loop: every read it names
//! is timed (a read that was skipped or failed would show 0 or NaN), the
//! whole tick costs at least its health reads, discovery finds the services
//! it holds (one class each, plus the default class), and their few sockets
//! are read alone, not dumped.
#[test]
fn the_tick_bench_times_every_read_of_the_daemons_loop() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["tick", "--services", "4", "--rounds", "3", "--calls", "20", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["classes"], 9, "4 UDP + 4 TCP services and the default class: {r}");
    let parts = r["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 17);
    for p in parts {
        let us = p["us"].as_f64().unwrap_or(f64::NAN);
        // The counters' read with nothing marked takes a word a class (under a µs here).
        let least = if p["name"].as_str().unwrap().contains("none marked") { 0.0 } else { 0.1 };
        assert!(us > least && us < 100_000.0, "{p}");
    }
    // Compared by the least of the rounds (a median of 3 moves with one
    // preemption; since the tick reads /proc/net/snmp only while an auto
    // class is near its knee, the whole tick is close to its health reads).
    let part = |name: &str| parts.iter().find(|p| p["name"].as_str().unwrap().contains(name)).unwrap();
    let min = |name: &str| part(name)["min_us"].as_f64().unwrap();
    assert!(min("the whole tick (") > min("health:"), "the whole tick includes its health reads: {r}");
    assert!(min("health:") > min("softnet_stat"), "the health read includes softnet_stat: {r}");
    // The tick with every class limited re-splits each, and writes only
    // the split's entries that changed (none here: no packet arrives), so
    // it costs about the whole tick: printed, not asserted (before issue
    // 51's mapped settings it wrote every class's on every CPU, 27 us more
    // here). `gate_sources::a_split_writes_only_the_entries_that_changed`
    // counts the writes.
    // The counters' read copies the entries marked since the last (issue
    // 51): none with no packet, every class on every possible CPU (the
    // kernel's count, not this test's guess) with all marked.
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last: u64 = possible.trim().rsplit(['-', ',']).next().unwrap().parse().unwrap();
    let c = &r["counters"];
    assert_eq!(c["possible_cpus"].as_u64().unwrap(), last + 1, "{c} against {possible}");
    assert_eq!(c["copied_quiet"], 0, "{c}");
    assert_eq!(c["copied_marked"].as_u64().unwrap(), 9 * (last + 1), "{c}");
    assert_eq!(c["bytes_per_entry"].as_u64().unwrap() % 64, 0, "whole cache lines: {c}");
    assert!(min("every class marked") > min("none marked"), "{r}");
    // The statistics' read (10 a second) is the tick's kind, not a copy of
    // every entry through the kernel as before.
    assert!(min("the statistics' read") < min("every entry read"), "{r}");
    // Two sockets a family: the tick reads each alone, and the dumps are
    // timed beside them but not made (none a second).
    for (alone, dump) in [("UDP, each socket read alone", "UDP dump"), ("TCP listeners, each", "TCP LISTEN dump")] {
        assert!(part(alone)["per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(part(dump)["per_sec"].as_f64().unwrap(), 0.0, "{r}");
    }
    // The calm tick's figure is printed, not asserted: it reads the UDP
    // sockets one tick in ten, and a least-of-3 of that moves with the phase.
}
