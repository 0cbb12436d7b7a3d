//! What the bench's test binaries share.
#![allow(dead_code)]
use std::path::PathBuf;

/// The `sluice` binary the bench starts its services with: built beside
/// `sluice-bench` by `cargo test --workspace` (the README's `make test`).
pub fn sluice_exe() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice-bench")).with_file_name("sluice");
    assert!(exe.exists(), "{} not built: run the tests with `cargo test --workspace` (make test)", exe.display());
    exe
}
