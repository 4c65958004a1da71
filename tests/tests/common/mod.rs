//! Helpers the compiled-code tests share: kernel IR programs compiled and run in-process.
#![allow(dead_code, clippy::unwrap_used)]

/// `code`, `p` compiled, loaded and run on `inputs`: its outputs, of `out_lens` bytes.
pub fn run_code(
    p: &mlopt_kir::Program,
    code: &mlopt_llvm::Output,
    inputs: &[Vec<u8>],
    out_lens: &[usize],
) -> Vec<Vec<u8>> {
    let mut lib = mlopt_runtime::Loaded::new(
        &mlopt_driver::cpu::members(&p.name, code).unwrap(),
        &mlopt_llvm::c_name(&p.name),
        inputs.iter().map(Vec::len).collect(),
        out_lens.to_vec(),
    )
    .unwrap();
    let mut got: Vec<Vec<u8>> = out_lens.iter().map(|n| vec![0u8; *n]).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    lib.run(&ins, &mut got).unwrap();
    got
}

/// A program input or output: its name, element type and dimensions.
pub fn io(name: &str, elem: mlopt_kir::Elem, dims: Vec<u64>) -> mlopt_kir::Io {
    mlopt_kir::Io {
        name: name.into(),
        elem,
        dims,
        counted: None,
        sequence: None,
    }
}
