//! Build script: compiles the traffic generator with clang into a libbpf
//! skeleton, and generates the Rust view of its header `bpf/gen.h` with
//! bindgen (the daemon's crate does the same for the gate and `sluice.h`).
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const GEN_SRC: &str = "bpf/gen.bpf.c";
const HEADER: &str = "bpf/gen.h";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch_include = format!("-I/usr/include/{}-linux-gnu", env::var("CARGO_CFG_TARGET_ARCH").unwrap());
    SkeletonBuilder::new()
        .source(GEN_SRC)
        .clang_args(["-Wall", "-Werror", "-O2", "-Ibpf", arch_include.as_str()])
        .build_and_generate(out.join("gen.skel.rs"))
        .unwrap_or_else(|e| panic!("building {GEN_SRC} failed (is clang installed? run `make deps`): {e:#}"));
    bindgen::Builder::default()
        .header(HEADER)
        .clang_arg(arch_include.as_str())
        .allowlist_item("(sluice|SLUICE)_gen.*|SLUICE_GEN_.*")
        .derive_default(true)
        .derive_partialeq(true)
        .derive_eq(true)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen over {HEADER} failed (is libclang installed? run `make deps`): {e}"))
        .write_to_file(out.join("gen_intf.rs"))
        .expect("writing the bindgen output");
    println!("cargo:rerun-if-changed={GEN_SRC}");
    println!("cargo:rerun-if-changed={HEADER}");
}
