//! Compiles the mlp fixture into `$OUT_DIR/mlopt/libmlp.a` with its Rust binding, and links it. The
//! compiler is the `mlopt` binary: `$MLOPT`, else `mlopt` on PATH.
fn main() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mlp/model.onnx");
    if let Err(e) = mlopt_build::Config::new().name("mlp").compile(model) {
        panic!("{e}");
    }
}
