//! Compiles the C runtime (the thread pool CPU libraries link) and the CUDA launcher (what GPU libraries
//! link) to position-independent objects, which `mlopt compile` puts into the static libraries it writes
//! (embedded with include_bytes!).
fn main() {
    for name in ["mlopt_runtime", "mlopt_cuda"] {
        println!("cargo:rerun-if-changed=runtime/{name}.c");
        let objs = cc::Build::new()
            .file(format!("runtime/{name}.c"))
            .pic(true)
            .opt_level(2)
            .flag_if_supported("-pthread")
            .warnings(true)
            .compile_intermediates();
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default())
            .join(format!("{name}.o"));
        let [obj] = objs.as_slice() else {
            panic!("expected one object for {name}, got {objs:?}")
        };
        std::fs::copy(obj, &out).unwrap_or_else(|e| panic!("copy {obj:?}: {e}"));
    }
}
