//! Runs the mlp fixture from Rust; build.rs compiles it with mlopt-build:
//!
//!     cargo build -p mlopt-cli    # the compiler build.rs runs (or put an mlopt on PATH)
//!     MLOPT=$PWD/target/debug/mlopt cargo run --manifest-path examples/rust/Cargo.toml -- input.bin
//!
//! input.bin holds the input as raw little-endian floats; every output element is printed, one per line.

// `pub mod mlp { .. }`: the model's constants, `Model` and `Error`.
include!(concat!(env!("OUT_DIR"), "/mlopt/models.rs"));

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: mlopt-example-rust INPUT.bin");
        std::process::exit(2)
    });
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(2)
    });
    let input: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut output = vec![0f32; mlp::OUTPUT0_SHAPE.iter().product()];
    if input.len() != mlp::INPUT0_SHAPE.iter().product::<usize>() {
        eprintln!(
            "{path}: {} floats, the model takes {:?}",
            input.len(),
            mlp::INPUT0_SHAPE
        );
        std::process::exit(2)
    }
    let run = mlp::Model::new().and_then(|mut model| model.run(&input, &mut output));
    if let Err(e) = run {
        eprintln!("mlp: {e}");
        std::process::exit(1)
    }
    for v in output {
        println!("{v:.9e}");
    }
}
