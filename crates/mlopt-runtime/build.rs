//! Compiles the C runtime to one position-independent object, which `mlopt compile` puts into every
//! generated static library (embedded with include_bytes!).
fn main() {
    println!("cargo:rerun-if-changed=runtime/mlopt_runtime.c");
    let objs = cc::Build::new().file("runtime/mlopt_runtime.c").pic(true).opt_level(2).flag_if_supported("-pthread").compile_intermediates();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("mlopt_runtime.o");
    let [obj] = objs.as_slice() else { panic!("expected one runtime object, got {objs:?}") };
    std::fs::copy(obj, &out).unwrap_or_else(|e| panic!("copy {obj:?}: {e}"));
}
