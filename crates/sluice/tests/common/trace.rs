//! Waiting for `sluice trace`'s programs, for the tests that run one.
use std::time::{Duration, Instant};

/// Names of the loaded BPF programs only `sluice trace` loads (the daemon
/// loads trace_drop alone).
pub fn trace_programs() -> Vec<String> {
    use libbpf_rs::query::ProgInfoIter;
    ProgInfoIter::default()
        .map(|p| p.name.to_string_lossy().into_owned())
        .filter(|n| n.starts_with("trace_") && n != "trace_drop")
        .collect()
}

/// Wait until a `sluice trace` has loaded its programs (it attaches them
/// right after), then a little longer.
pub fn wait_for_trace() {
    let deadline = Instant::now() + Duration::from_secs(20);
    while trace_programs().is_empty() {
        assert!(Instant::now() < deadline, "sluice trace did not load its programs");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
}
