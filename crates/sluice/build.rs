//! Build script: compiles the BPF programs (the XDP gate, the reader steering,
//! the tracer)
//! with clang into libbpf skeletons, and
//! generates the Rust view of the shared header `bpf/sluice.h` with bindgen,
//! so no C struct, enum or constant is ever copied into Rust by hand.
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

/// Each BPF source and the skeleton it becomes.
const PROGRAMS: [(&str, &str); 3] =
    [("bpf/gate.bpf.c", "gate.skel.rs"), ("bpf/steer.bpf.c", "steer.skel.rs"), ("bpf/trace.bpf.c", "trace.skel.rs")];
const HEADER: &str = "bpf/sluice.h";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch_include = format!("-I/usr/include/{}-linux-gnu", env::var("CARGO_CFG_TARGET_ARCH").unwrap());

    for (src, skel) in PROGRAMS {
        SkeletonBuilder::new()
            .source(src)
            .clang_args(["-Wall", "-Werror", "-O2", "-Ibpf", arch_include.as_str()])
            .build_and_generate(out.join(skel))
            .unwrap_or_else(|e| panic!("building {src} failed (is clang installed? run `make deps`): {e:#}"));
        println!("cargo:rerun-if-changed={src}");
    }

    bindgen::Builder::default()
        .header(HEADER)
        .clang_arg(arch_include.as_str())
        .allowlist_item("(sluice|SLUICE)_.*")
        .derive_default(true)
        .derive_partialeq(true)
        .derive_eq(true)
        .derive_hash(true)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen over {HEADER} failed (is libclang installed? run `make deps`): {e}"))
        .write_to_file(out.join("sluice_intf.rs"))
        .expect("writing the bindgen output");

    println!("cargo:rerun-if-changed={HEADER}");
    println!("cargo:rerun-if-changed=bpf/classify.h");
    println!("cargo:rerun-if-changed=bpf/kernel.h");
    println!("cargo:rerun-if-changed=bpf/syncookie.h");
    println!("cargo:rerun-if-changed=bpf/gate");
}
