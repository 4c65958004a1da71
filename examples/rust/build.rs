//! Links the library `mlopt compile fixtures/mlp/model.onnx --name mlp -o $MLOPT_OUT` wrote.
fn main() {
    let dir =
        std::env::var("MLOPT_OUT").expect("set MLOPT_OUT to the directory mlopt compile wrote");
    println!("cargo:rerun-if-env-changed=MLOPT_OUT");
    println!("cargo:rerun-if-changed={dir}/libmlp.a");
    println!("cargo:rustc-link-search=native={dir}");
    println!("cargo:rustc-link-lib=static=mlp");
    println!("cargo:rustc-link-lib=m");
}
