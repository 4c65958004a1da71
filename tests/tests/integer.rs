//! Integer contractions (quantized models): `mma` blocks on i16 pairs with i32 sums, compiled for each
//! x86 integer dot product (`vpmaddwd` + `vpaddd` on ymm and zmm, `vpdpwssd`) and run where this CPU
//! can, bit for bit against the kernel IR's interpreter.

use mlopt_target::Target;

/// A program input or output: its name, element type and dimensions.
fn io(name: &str, elem: mlopt_kir::Elem, dims: Vec<u64>) -> mlopt_kir::Io {
    mlopt_kir::Io {
        name: name.into(),
        elem,
        dims,
        counted: None,
        sequence: None,
    }
}

/// Runs compiled `code` of program `p` on `inputs`, with outputs of `out_lens` bytes.
fn run_code(
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

/// i16 `mma` blocks that set C, add to it, and sum a loop of taps in registers (the three forms code
/// generation has), with rows that do not fill a row group, 8- and 16-lane column blocks, over the
/// whole i16 range (so pair sums and accumulations wrap, as the instructions do): the same bytes
/// compiled as interpreted, on every target this CPU runs, and the instruction each target has.
#[test]
fn i16_mma_blocks_compile_as_they_interpret() {
    use mlopt_kir::{Elem, Place, Program, Step};
    let set = "kernel @set(%c: i32[64,64], %a: i16[64,96], %b: i16[48,128]) {
  serial %i in 0..2 {
    serial %j in 0..2 {
      mma<32x32x96> %c[(%i * 32), (%j * 32)] = %a[(%i * 32), 0] * %b[0, (%j * 64)] ahead
    }
  }
}
";
    let add = "kernel @add(%c: i32[64,64], %a: i16[64,96], %b: i16[48,128]) {
  serial %i in 0..4 {
    mma<13x16x64> %c[(%i * 16), 32] += %a[(%i * 16), 32] * %b[16, 0]
  }
  mma<7x16x32> %c[32, 48] += %a[0, 64] * %b[32, 96]
}
";
    let taps = "kernel @taps(%c: i32[64,64], %a: i16[64,96], %b: i16[48,128]) {
  serial %t in 0..3 {
    mma<11x32x32> %c[0, 0] += %a[(%t * 16), (%t * 2)] * %b[(%t * 8), 32] ahead
  }
}
";
    let kernels: Vec<_> = [set, add, taps]
        .iter()
        .map(|text| {
            let k = mlopt_kir::parse_kernel(text).unwrap();
            mlopt_kir::verify(&k).unwrap();
            assert_eq!(&mlopt_kir::print::kernel(&k), text);
            k
        })
        .collect();
    let args = vec![Place::Output(0), Place::Input(0), Place::Input(1)];
    let p = Program {
        name: "imma".into(),
        inputs: vec![
            io("a", Elem::I16, vec![64, 96]),
            io("b", Elem::I16, vec![48, 128]),
        ],
        outputs: vec![io("c", Elem::I32, vec![64, 64])],
        kernels,
        steps: (0..3).map(|k| Step::call(k, args.clone())).collect(),
        ..Default::default()
    };
    // The whole i16 range, the extremes included.
    let i16s = |n: usize, seed: u64| -> Vec<u8> {
        (0..n as u64)
            .flat_map(|i| {
                let v = match (i * 7919 + seed) % 13 {
                    0 => i16::MIN,
                    1 => i16::MAX,
                    r => ((i * 2654435761 + seed * 97 + r) % 65536) as u16 as i16,
                };
                v.to_le_bytes()
            })
            .collect()
    };
    let inputs = vec![i16s(64 * 96, 1), i16s(48 * 128, 2)];
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    // (target, the instruction its code must use)
    for (target, instruction) in [
        ("host", None),
        ("x86-64-v3", Some("llvm.x86.avx2.pmadd.wd")),
        ("x86-64-v4", Some("llvm.x86.avx512.pmaddw.d.512")),
        ("znver4", Some("llvm.x86.avx512.vpdpwssd.512")),
        ("sapphirerapids", Some("llvm.x86.avx512.vpdpwssd.512")),
    ] {
        let t = Target::named(target, 1).unwrap();
        let t = t.cpu().unwrap();
        let code = mlopt_llvm::compile(&p, t).unwrap_or_else(|e| panic!("{target}: {e}"));
        if let Some(i) = instruction {
            assert!(code.optimized_ir.contains(i), "{target}: uses {i}");
        }
        assert!(
            !code.optimized_ir.contains("tdpbf16ps"),
            "{target}: integer blocks never run on bf16 tiles"
        );
        if !t.runs_here() {
            continue;
        }
        let got = run_code(&p, &code, &inputs, &[64 * 64 * 4]);
        assert!(
            got[0] == want[0],
            "{target}: compiled differs from interpreted"
        );
    }
}
