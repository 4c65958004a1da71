//! Compiled code on the fixture models: each optimised fixture is lowered, compiled by LLVM for this
//! machine, loaded into the process and run on the fixture's inputs; its outputs must match the graph
//! interpreter's. The instruction mix of each fixture's unoptimised LLVM IR is snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_driver::{compile, Options};
use mlopt_ir::interp;
use mlopt_rewrite::{Config, Precision};
use mlopt_target::{runnable_level, Target};
use mlopt_tests::{data, import, worst_error, FIXTURES};

mod common;
use common::{io, run_code};

/// Compiles a fixture for this machine, runs it in-process; returns the error against the interpreter
/// (on the optimised graph) and the compiled model.
fn run_compiled(name: &str, precision: Precision, threads: u32) -> (f64, mlopt_driver::Compiled) {
    let g = import(name);
    let mut config = Config::new(Target::named(runnable_level(), threads).unwrap());
    config.precision = precision;
    let c = compile(&g, &Options::new(config)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (inputs, _) = data(name);
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let want = interp::run(&c.optimized.plan.graph, &inputs).unwrap();
    (worst_error(&want, &got), c)
}

#[test]
fn compiled_fixtures_match_the_interpreter() {
    for name in FIXTURES {
        for threads in [1, 2] {
            let (err, _) = run_compiled(name, Precision::Fp32, threads);
            assert!(err < 1e-5, "{name} with {threads} threads: error {err:e}");
        }
    }
}

#[test]
fn compiled_low_precision_fixtures_match_the_interpreter() {
    for name in FIXTURES {
        let (err, _) = run_compiled(name, Precision::Bf16, 1);
        // Both sides round to bf16 at the same places; accumulation order differs.
        assert!(err < 1e-2, "{name} in bf16: error {err:e}");
    }
}

/// The type an instruction works on: its first vector type, else its first scalar type.
fn operand_type(rhs: &str) -> Option<String> {
    if let Some(at) = rhs.find('<') {
        return Some(rhs[at..=at + rhs[at..].find('>')?].to_string());
    }
    rhs.split([' ', ','])
        .find(|t| {
            [
                "float", "double", "half", "bfloat", "i1", "i8", "i16", "i32", "i64", "ptr",
            ]
            .contains(t)
        })
        .map(String::from)
}

/// What one LLVM instruction counts as in the mix: calls by callee, memory and floating-point operations
/// by type; index arithmetic, loop counters and control flow do not count.
fn mix_key(ins: &str) -> Option<String> {
    let rhs = ins.split_once(" = ").map_or(ins, |(_, r)| r);
    let op = rhs.split_whitespace().next()?;
    match op {
        "call" | "tail" => Some(format!(
            "call {}",
            rhs.split_once('@')?.1.split('(').next()?
        )),
        // (i64 and pointer loads and stores are the unoptimised IR's loop counters and addresses.)
        "load" | "store" => Some(operand_type(&rhs[op.len()..])?)
            .filter(|t| t != "i64" && t != "ptr")
            .map(|t| format!("{op} {t}")),
        "fadd" | "fsub" | "fmul" | "fdiv" | "frem" | "fneg" | "fcmp" | "select" | "sitofp"
        | "uitofp" | "fptosi" | "fptoui" | "fpext" | "fptrunc" => {
            let t = operand_type(&rhs[op.len()..])?;
            (op != "select" || t.contains("float")).then(|| format!("{op} {t}"))
        }
        _ => None,
    }
}

/// Each function's instruction mix from LLVM IR text (counts of calls, loads and stores, and
/// floating-point operations by type): what a codegen change moves (vector widths, gathers, FMAs per
/// kernel) in a few lines per kernel, where the IR itself runs to tens of thousands.
fn instruction_mix(ir: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut cur: Option<(String, std::collections::BTreeMap<String, usize>)> = None;
    for line in ir.lines() {
        if let Some(def) = line.strip_prefix("define ") {
            let name = def
                .split_once('@')
                .and_then(|(_, r)| r.split('(').next())
                .unwrap_or("?");
            cur = Some((name.to_string(), Default::default()));
        } else if line == "}" {
            if let Some((name, m)) = cur.take() {
                let _ = writeln!(out, "@{name}");
                for (k, n) in m {
                    let _ = writeln!(out, "  {n:>5} {k}");
                }
            }
        } else if let (Some((_, m)), Some(k)) = (cur.as_mut(), mix_key(line.trim())) {
            *m.entry(k).or_default() += 1;
        }
    }
    out
}

/// The instruction mix of each fixture's LLVM IR before optimisation, so a codegen change shows in
/// review (a kernel that loses its vector FMAs, gains gathers or calls a new routine).
#[test]
fn llvm_ir_snapshots() {
    for name in FIXTURES {
        let g = import(name);
        let config = Config::new(Target::named("x86-64-v4", 1).unwrap());
        let c = compile(&g, &Options::new(config)).unwrap();
        insta::assert_snapshot!(format!("llvm_mix_{name}"), instruction_mix(&c.code.llvm_ir));
    }
}

/// bf16 contractions as `mma` blocks through the whole driver: a pointwise convolution (batch 2, 96 -> 328
/// channels, 5x7, so rows and columns pad to whole blocks; its weight the blocks' A, its activations
/// packed as B, the last block of positions partial), 3x3 and 5x1 convolutions and the MLP and transformer fixtures,
/// compiled for this machine (AMX tiles when it has them), for Zen 4 (`vdpbf16ps`, which this machine
/// also runs) and for x86-64-v4 (no matrix unit: fp32 tiles), against the interpreter on the optimised
/// graph.
#[test]
fn bf16_contractions_compile_to_mma_blocks() {
    use mlopt_ir::{ConvAttrs, DType, Op, Tensor, TensorType};
    // Pointwise convolutions (+ bias, ReLU): 96 -> 328 channels, and 18 and 21 -> 40 (K below a tile
    // row: pairs on vdpbf16ps, an odd one padded).
    let mut cases = vec![];
    for (name, cin, cout) in [
        ("pointwise", 96, 328),
        ("pointwise k18", 18, 40),
        ("pointwise k21", 21, 40),
    ] {
        let g = mlopt_tests::conv_graph(2, cin, cout, &[5, 7], 1, 1, 1, true);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 5);
        cases.push((name, g, inputs));
    }
    // 3x3 and 5x1 convolutions (one block product per tap over a channels-innermost copy): stride 1
    // and 2, padded, a dilation, 72 -> 200 channels (K pads to AMX's 32s, the output channels to
    // whole blocks), output rows of 24 and 12 positions (fewer than an AMX block's 16: its epilogue
    // has only a tail), batch 2.
    // On a 7x7 map (ResNet-50's last stage), AMX blocks run over the image's positions flattened (7 x
    // 9 = 63 rows in two blocks of 32, the copy's columns past each row computed and not stored); on
    // a 13x13 one (SqueezeNet's), row by row in blocks of 16 of which only the tail of 13 is stored.
    for (name, k, stride, pad, dil, size) in [
        ("conv3x3", [3, 3], 1, [1, 1], 1, [11, 24]),
        ("conv3x3 stride 2", [3, 3], 2, [1, 1], 1, [11, 24]),
        ("conv5x1 dilated", [5, 1], 1, [4, 0], 2, [11, 24]),
        ("conv3x3 7x7", [3, 3], 1, [1, 1], 1, [7, 7]),
        ("conv3x3 13x13", [3, 3], 1, [1, 1], 1, [13, 13]),
    ] {
        let mut g = mlopt_ir::Graph::new("conv");
        let x = g.add_input(
            "x",
            TensorType::new(DType::F32, vec![2, 72, size[0], size[1]]),
        );
        let w: Vec<f32> = (0..200 * 72 * k[0] * k[1])
            .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
            .collect();
        let w = g.add_const("w", Tensor::from_vec(&[200, 72, k[0], k[1]], w).unwrap());
        let a = ConvAttrs {
            strides: vec![stride; 2],
            pads: vec![pad[0], pad[1], pad[0], pad[1]],
            dilations: vec![dil, 1],
            group: 1,
            output_padding: vec![],
        };
        let y = g.add(Op::Conv(a), "conv", &[x, w]).unwrap();
        g.add_output("y", y);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 6);
        cases.push((name, g, inputs));
    }
    // A strided 1x1 convolution (ResNet's downsample: its copy holds a quarter of the input), a 1-D
    // one (Whisper's stem: 3 taps, stride 2, padded; a 2-D one of a single row), output channels
    // enough for the blocks to pay for their copies, and a 3-channel 7x7 stem (ResNet's: each row of
    // taps folded into K, 21 channels padded to AMX's 32, which the cost model takes).
    for (name, c, m, size, k) in [
        ("conv1x1 stride 2", 128, 512, &[14, 14][..], 1),
        ("conv1d stride 2", 128, 384, &[160][..], 3),
        ("stem 7x7 stride 2", 3, 64, &[48, 48][..], 7),
    ] {
        let g = mlopt_tests::conv_graph(2, c, m, size, k, 2, 1, true);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 8);
        cases.push((name, g, inputs));
    }
    // Attention (2 heads, 40 queries, 37 keys, depth 24, 20 values): both products on blocks, a last
    // block of 8 query rows, keys and values past whole blocks; scaled with a mask, and plain.
    for (name, scale, mask) in [("attention", 0.3, true), ("attention unscaled", 1.0, false)] {
        let mut g = mlopt_ir::Graph::new("attention");
        let f32s = |dims: Vec<usize>| TensorType::new(DType::F32, dims);
        let q = g.add_input("q", f32s(vec![2, 40, 24]));
        let kt = g.add_input("kt", f32s(vec![2, 24, 37]));
        let v = g.add_input("v", f32s(vec![2, 37, 20]));
        let mut args = vec![q, kt, v];
        if mask {
            args.push(g.add_input("mask", f32s(vec![40, 37])));
        }
        let y = g.add(Op::Attention { scale }, "attention", &args).unwrap();
        g.add_output("y", y);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 7);
        cases.push((name, g, inputs));
    }
    // A MatMul whose output is written transposed (Whisper's keys: [positions, channels] stored as
    // [channels, positions]): its blocks store along the output's contiguous axis, the rows.
    {
        let mut g = mlopt_ir::Graph::new("keys");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 100, 64]));
        let w: Vec<f32> = (0..64 * 96)
            .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
            .collect();
        let w = g.add_const("w", Tensor::from_vec(&[64, 96], w).unwrap());
        let y = g.add(Op::MatMul, "matmul", &[x, w]).unwrap();
        let perm = vec![0, 2, 1];
        let y = g.add(Op::Transpose { perm }, "transpose", &[y]).unwrap();
        g.add_output("y", y);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 9);
        cases.push(("matmul transposed", g, inputs));
    }
    for name in ["mlp", "transformer"] {
        cases.push((name, import(name), data(name).0));
    }
    for (name, g, inputs) in &cases {
        for target in ["host", "znver4", "sapphirerapids", "x86-64-v4"] {
            let mut config = Config::new(Target::named(target, 1).unwrap());
            config.precision = Precision::Bf16;
            let c = compile(g, &Options::new(config))
                .unwrap_or_else(|e| panic!("{name} for {target}: {e}"));
            let pays = mlopt_cost::tile::bf16_blocks_pay(c.cfg.target.cpu().unwrap());
            assert!(
                !target.starts_with(['z', 's']) || pays,
                "{name}: Zen 4's vdpbf16ps is costed at twice its FMA rate, AMX at ten times"
            );
            // Without a matrix unit the convolutions' fp32 tiles read the bf16 weights widened to
            // f32 once, at compile time. (The MLP's batch-1 MatMuls have no rows to tile; the 7x7
            // map's convolution runs swapped, its weight the tiles' rows, read as bf16.)
            let widened = c.program.weights.iter().any(|w| w.name.ends_with(".f32"));
            assert!(
                target != "x86-64-v4"
                    || widened
                    || !name.starts_with(['p', 'c'])
                    || name.ends_with("7x7")
                    || name.ends_with("13x13"),
                "{name} for {target}: bf16 weights widened for the fp32 tiles"
            );
            let blocks = c
                .program
                .kernels
                .iter()
                .any(|k| mlopt_kir::analysis::has_mma(&k.body));
            assert_eq!(
                blocks, pays,
                "{name} for {target}: mma blocks iff the target's matrix unit pays"
            );
            // A pointwise convolution's weight is A (its output channels the blocks' rows) and its
            // activations are packed as B, so the epilogue runs along the output's positions in vector
            // lanes; on vdpbf16ps, where its 35 positions would pad the columns to 64 and its 328
            // channels as columns pad less, it is turned around (the activations copied as A's rows).
            let dot = Target::named(target, 1).unwrap().cpu().unwrap().matrix()
                == Some(mlopt_target::MatrixUnit::Dot);
            let rows = *name == "pointwise" && dot;
            // The first kernel on blocks, as text.
            let blocks_text = || {
                let mut kernels = c.program.kernels.iter();
                let k = kernels.find(|k| mlopt_kir::analysis::has_mma(&k.body));
                mlopt_kir::print::kernel(k.unwrap())
            };
            if name.starts_with("pointwise") && pays {
                let text = blocks_text();
                let (copied, packed, what) = match rows {
                    true => ("a_pad", "b_pack", "the positions are the rows"),
                    false => ("b_pack", "a_pad", "the activations are B"),
                };
                assert!(
                    text.contains(copied) && !text.contains(packed),
                    "{target}: {what}\n{text}"
                );
            }
            if *name == "conv3x3 7x7" && target == "sapphirerapids" {
                let text = blocks_text();
                assert!(
                    text.contains("mma<32x32x96>"),
                    "flat positions in blocks of 32\n{text}"
                );
            }
            if *name == "matmul transposed" && pays {
                let text = blocks_text();
                assert!(
                    text.contains("vector<16> %ii"),
                    "{target}: the epilogue runs along the rows\n{text}"
                );
            }
            // Attention packs K^T and V per head into the blocks' layout.
            if name.starts_with("attention") && pays {
                let text: String = c
                    .program
                    .kernels
                    .iter()
                    .map(mlopt_kir::print::kernel)
                    .collect();
                assert!(
                    text.contains("k_pack") && text.contains("v_pack") && text.contains("mma<"),
                    "{target}: attention on blocks\n{text}"
                );
            }
            // Code for a CPU this one is not (AMX blocks without the tiles) runs in the kernel IR's
            // interpreter, which takes most of a minute per case: the flat 7x7 one only (the others
            // are scheduled and verified).
            let got = match c.runs_here() {
                true => c.run(&mut c.load().unwrap(), inputs).unwrap(),
                false if name.ends_with("7x7") => c.interpret(inputs).unwrap(),
                false => continue,
            };
            let want = interp::run(&c.optimized.plan.graph, inputs).unwrap();
            let err = worst_error(&want, &got);
            // Both round to bf16 at the same places (attention's blocks also its softmax numerators);
            // the f32 accumulation order differs.
            assert!(err < 1e-2, "{name} for {target}: error {err:e}");
        }
    }
}

/// A convolution (48 channels, 48 x 48, 3x3, + bias and ReLU) big enough that its padded input and
/// Winograd's transforms are heap temporaries, compiled with and without Winograd, against the graph
/// interpreter.
#[test]
fn large_convolutions_compile_with_heap_temporaries() {
    let g = mlopt_tests::conv_graph(1, 48, 48, &[48, 48], 3, 1, 1, true);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 3);
    let want = interp::run(&g, &inputs).unwrap();
    for winograd in [
        mlopt_schedule::Winograd::Never,
        mlopt_schedule::Winograd::Always,
    ] {
        let config = Config::new(Target::named(runnable_level(), 2).unwrap());
        let c = compile(
            &g,
            &Options {
                config,
                tune: false,
                winograd,
                profile: false,
                dumps: false,
                probe: false,
            },
        )
        .unwrap();
        assert_eq!(
            c.program
                .kernels
                .iter()
                .any(|k| k.schedule.contains(&mlopt_kir::ScheduleStep::Winograd)),
            winograd == mlopt_schedule::Winograd::Always
        );
        // Either way the contraction is register-tiled by the schedule: the implicit GEMM, or Winograd's 16.
        let tiled = |k: &mlopt_kir::Kernel| {
            k.schedule
                .iter()
                .any(|s| matches!(s, mlopt_kir::ScheduleStep::Tile { .. }))
        };
        assert!(
            c.program.kernels.iter().any(tiled),
            "winograd = {winograd:?}: no tiled kernel"
        );
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
        assert!(err < 1e-5, "winograd = {winograd:?}: error {err:e}");
    }
}

/// ResNet's 7x7-stage convolutions (a 1x1, a 3x3 and a stride-2 1x1 from 14x14: 49 output positions,
/// which as columns leave a one-lane tail tile) run swapped: positions are the rows, output channels
/// the columns, the weight packed into column panels whose next block the tiles prefetch. Compiled at
/// batch 1, 2 and 8, on 1 and 2 threads, they match the interpreter.
#[test]
fn convolutions_at_7x7_run_swapped_and_prefetch_their_weight() {
    fn prefetches(body: &[mlopt_kir::Stmt]) -> bool {
        body.iter().any(|s| match s {
            mlopt_kir::Stmt::Prefetch { .. } => true,
            mlopt_kir::Stmt::For { body, .. } | mlopt_kir::Stmt::If { then: body, .. } => {
                prefetches(body)
            }
            _ => false,
        })
    }
    // (input channels, output channels, input size, window, stride; padded by window / 2), (batch,
    // threads) runs. At batch 8 the pointwise one's images would not stay in L2 as one set of rows:
    // they run swapped one at a time.
    type Case = ((usize, usize, usize, usize, usize), &'static [(usize, u32)]);
    const CASES: &[Case] = &[
        ((512, 2048, 7, 1, 1), &[(1, 1), (2, 2), (8, 2)]),
        ((512, 512, 7, 3, 1), &[(1, 1), (2, 2)]),
        ((1024, 2048, 14, 1, 2), &[(1, 1), (2, 2)]),
    ];
    for &((c, m, hw, k, stride), runs) in CASES {
        for &(batch, threads) in runs {
            let name =
                format!("{c}->{m} {k}x{k}/{stride} at {hw}x{hw}, batch {batch}, {threads} threads");
            let g = mlopt_tests::conv_graph(batch, c, m, &[hw, hw], k, stride, 1, true);
            let opts = Options {
                config: Config::new(Target::named(runnable_level(), threads).unwrap()),
                tune: false,
                winograd: mlopt_schedule::Winograd::Never,
                profile: false,
                dumps: false,
                probe: false,
            };
            let compiled = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            let conv = compiled
                .program
                .kernels
                .iter()
                .find(|k| k.schedule.contains(&mlopt_kir::ScheduleStep::Swap))
                .unwrap_or_else(|| panic!("{name}: not swapped"));
            assert!(prefetches(&conv.body), "{name}: no prefetch of the weight");
            let inputs = mlopt_rewrite::optimize::random_inputs(&g, 5);
            let want = interp::run(&g, &inputs).unwrap();
            let got = compiled
                .run(&mut compiled.load().unwrap(), &inputs)
                .unwrap();
            let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
            assert!(err < 1e-5, "{name}: error {err:e}");
        }
    }
}

/// A vector times a constant matrix (x[K] @ W[K, N]) is an untiled contraction whose dot products run
/// along K in vector lanes: the schedule stores W transposed, so they read it contiguously, and the
/// library carries only the transposed copy. Compiled, it matches the interpreter.
#[test]
fn vector_matrix_products_read_the_weight_contiguously() {
    use mlopt_ir::{DType, Op, Tensor, TensorType};
    let mut g = mlopt_ir::Graph::new("gemv");
    let (k, n) = (100usize, 24usize);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![k]));
    let w: Vec<f32> = (0..k * n)
        .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
        .collect();
    let w = g.add_const("w", Tensor::from_vec(&[k, n], w).unwrap());
    let y = g.add(Op::MatMul, "matmul", &[x, w]).unwrap();
    g.add_output("y", y);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 9);
    let want = interp::run(&g, &inputs).unwrap();
    let config = Config::new(Target::named(runnable_level(), 1).unwrap());
    let c = compile(&g, &Options::new(config)).unwrap();
    let k = c
        .program
        .kernels
        .iter()
        .find(|k| {
            k.schedule
                .iter()
                .any(|s| matches!(s, mlopt_kir::ScheduleStep::Transpose { .. }))
        })
        .expect("a transposed weight");
    assert_eq!(
        mlopt_kir::analysis::accesses(k).gather,
        0.0,
        "{}",
        mlopt_kir::print::kernel(k)
    );
    assert_eq!(
        c.program
            .weights
            .iter()
            .map(|w| w.dims.clone())
            .collect::<Vec<_>>(),
        [vec![24, 100]]
    );
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(err < 1e-5, "error {err:e}");
}

/// A contraction whose reduction is blocked (a panel of B over a quarter of the L2 at every vector width:
/// K = 8192 by 48 columns)
/// and whose only split is the row tiles inside the K blocks, at 2 threads: one run of the parallel
/// loop leaves each tile's partial sums for the next, so they are shared, not each thread's own
/// (ResNet-50's 512 -> 512 3x3 stride-2 convolution, K = 4608 by 49 columns, once read another
/// thread's uninitialised copy: 6.7e-2 off at 2 threads). Compiled, it matches the interpreter.
#[test]
fn blocked_reductions_keep_their_partial_sums_across_threads() {
    use mlopt_ir::{DType, Op, Tensor, TensorType};
    let mut g = mlopt_ir::Graph::new("kblock");
    let (m, k, n) = (64usize, 8192usize, 48usize);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![m, k]));
    let w: Vec<f32> = (0..k * n)
        .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
        .collect();
    let w = g.add_const("w", Tensor::from_vec(&[k, n], w).unwrap());
    let y = g.add(Op::MatMul, "matmul", &[x, w]).unwrap();
    g.add_output("y", y);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 5);
    let want = interp::run(&g, &inputs).unwrap();
    let config = Config::new(Target::named(runnable_level(), 2).unwrap());
    let options = Options::new(config);
    let c = compile(&g, &options).unwrap();
    let k = &c.program.kernels[0];
    let text = mlopt_kir::print::kernel(k);
    assert!(
        k.schedule
            .iter()
            .any(|s| matches!(s, mlopt_kir::ScheduleStep::KBlock { .. }))
            && text.contains("serial %kb")
            && text.contains("parallel %io"),
        "{text}"
    );
    let mut loaded = c.load().unwrap();
    for _ in 0..3 {
        let got = c.run(&mut loaded, &inputs).unwrap();
        let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
        assert!(err < 1e-5, "error {err:e}");
    }
}

/// A convolution (3x3, stride 2, 32 -> 64 channels at 160 x 160, + bias) split over images at 2
/// threads, each thread copying its image into a padded, phased buffer of 3.3 MB (YOLO's stride-2
/// layers at batch 8 copy 13 MB): a thread's own locals above the stack budget go on the heap. On the stack they overflowed it (YOLO at batch 8 and 2 threads crashed;
/// a test thread's 2 MB stack overflows here). Compiled, it matches the interpreter.
#[test]
fn threads_own_large_locals_on_the_heap() {
    let g = mlopt_tests::conv_graph(2, 32, 64, &[160, 160], 3, 2, 1, false);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 7);
    let want = interp::run(&g, &inputs).unwrap();
    let options = Options {
        config: Config::new(Target::named(runnable_level(), 2).unwrap()),
        tune: false,
        winograd: mlopt_schedule::Winograd::Never,
        profile: false,
        dumps: false,
        probe: false,
    };
    let c = compile(&g, &options).unwrap();
    let k = &c.program.kernels[0];
    let text = mlopt_kir::print::kernel(k);
    let big_private = k
        .bufs
        .iter()
        .any(|b| b.space == mlopt_kir::Space::Local && b.numel() * b.elem.size() > 2 << 20);
    assert!(big_private && text.contains("parallel %g"), "{text}");
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(err < 1e-5, "error {err:e}");
}

/// 1-D convolutions (Whisper's audio stem: 80 mel bins -> 96 channels, kernel 3, then stride 2) compile
/// and match the interpreter; lowering once read a 2-D convolution's width from their rank-3 output and
/// panicked.
#[test]
fn one_dimensional_convolutions_compile() {
    use mlopt_ir::{ConvAttrs, DType, Op, Tensor, TensorType, Unary};
    let mut g = mlopt_ir::Graph::new("conv1d");
    let (c, m, len) = (80usize, 96usize, 60usize);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, c, len]));
    let w1: Vec<f32> = (0..m * c * 3)
        .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
        .collect();
    let w1 = g.add_const("w1", Tensor::from_vec(&[m, c, 3], w1).unwrap());
    let w2: Vec<f32> = (0..m * m * 3)
        .map(|i| ((i * 104729) % 200) as f32 / 1000.0 - 0.1)
        .collect();
    let w2 = g.add_const("w2", Tensor::from_vec(&[m, m, 3], w2).unwrap());
    let a1 = ConvAttrs {
        strides: vec![1],
        pads: vec![1, 1],
        dilations: vec![1],
        group: 1,
        output_padding: vec![],
    };
    let a2 = ConvAttrs {
        strides: vec![2],
        pads: vec![1, 1],
        dilations: vec![1],
        group: 1,
        output_padding: vec![],
    };
    let y = g.add(Op::Conv(a1), "conv1", &[x, w1]).unwrap();
    let y = g
        .add(Op::Unary(Unary::Gelu { tanh: false }), "gelu", &[y])
        .unwrap();
    let y = g.add(Op::Conv(a2), "conv2", &[y, w2]).unwrap();
    g.add_output("y", y);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 5);
    let want = interp::run(&g, &inputs).unwrap();
    let config = Config::new(Target::named(runnable_level(), 1).unwrap());
    let c = compile(&g, &Options::new(config)).unwrap();
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(err < 1e-5, "error {err:e}");
}

/// CumSum and CumProd along each axis of a 3-D tensor, forward, reversed and exclusive, in f32 and i32,
/// on two threads: compiled code accumulates in index order as the interpreter does, so the results are
/// the same bits (a schedule that split or reordered a row's accumulation would not be).
#[test]
fn running_sums_and_products_compile_in_order() {
    use mlopt_ir::{Accumulate, CumulativeAttrs, DType, Op, TensorType};
    let mut g = mlopt_ir::Graph::new("cumulative");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![6, 40, 130]));
    let i = g.add_input("i", TensorType::new(DType::I32, vec![6, 40, 130]));
    let cases = [
        (Accumulate::Sum, 2, false, false),
        (Accumulate::Sum, 1, true, false),
        (Accumulate::Sum, 0, false, true),
        (Accumulate::Prod, 2, false, true),
        (Accumulate::Prod, 1, true, true),
    ];
    for (k, &(kind, axis, exclusive, reverse)) in cases.iter().enumerate() {
        for (src, name) in [(x, "f"), (i, "i")] {
            let op = Op::Cumulative(CumulativeAttrs {
                kind,
                axis,
                exclusive,
                reverse,
            });
            let y = g.add(op, format!("{name}{k}"), &[src]).unwrap();
            g.add_output(format!("{name}{k}"), y);
        }
    }
    let mut inputs = mlopt_rewrite::optimize::random_inputs(&g, 9);
    // Products of values near 1 stay finite over 130 steps; integers small enough to wrap visibly.
    let near_one = inputs["x"]
        .to_f64_vec()
        .iter()
        .map(|v| (1.0 + v * 0.05) as f32)
        .collect();
    let small = (0..6 * 40 * 130i32).map(|k| k * 7919 % 9 - 4).collect();
    inputs.insert(
        "x".into(),
        mlopt_ir::Tensor::from_vec(&[6, 40, 130], near_one).unwrap(),
    );
    inputs.insert(
        "i".into(),
        mlopt_ir::Tensor::from_vec(&[6, 40, 130], small).unwrap(),
    );
    let want = interp::run(&g, &inputs).unwrap();
    let config = Config::new(Target::named("host", 2).unwrap());
    let c = compile(&g, &Options::new(config)).unwrap();
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        assert!(w.same_bits(g), "{name}: interpreter {w}, compiled {g}");
    }
}

/// Mod with fmod=0 on floats (opset 28) is Python's %: the divisor's sign, a zero result's too, with
/// infinities and NaN as numpy gives them (ONNX's edge-case test). The interpreter gives these values,
/// and compiled code the same bits (any NaN for a NaN).
#[test]
fn float_mod_takes_the_divisors_sign_compiled_as_interpreted() {
    use mlopt_ir::{Binary, DType, Op, Tensor, TensorType};
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let x = [
        0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, inf, -inf, 1.0, 1.0, nan, 1.0, -4.5, 4.5,
    ];
    let y = [
        -2.0, 2.0, 2.0, -2.0, inf, inf, -inf, -inf, 2.0, 2.0, 0.0, -0.0, 2.0, nan, 2.0, -2.0,
    ];
    let want = [
        -0.0, 0.0, 0.0, -0.0, inf, 3.0, -1.0, -inf, nan, nan, nan, nan, nan, nan, 1.5, -1.5,
    ];
    let n = x.len();
    let mut g = mlopt_ir::Graph::new("pymod");
    let ty = TensorType::new(DType::F32, vec![n]);
    let (a, b) = (g.add_input("x", ty.clone()), g.add_input("y", ty));
    let m = g
        .add(Op::Binary(Binary::Mod { fmod: false }), "m", &[a, b])
        .unwrap();
    g.add_output("m", m);
    let inputs = std::collections::HashMap::from([
        ("x".to_string(), Tensor::from_vec(&[n], x.to_vec()).unwrap()),
        ("y".to_string(), Tensor::from_vec(&[n], y.to_vec()).unwrap()),
    ]);
    let same = |got: &[f64], what: &str| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = *g as f32;
            assert!(
                (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                "{what}: mod({}, {}) = {g}, want {w}",
                x[i],
                y[i]
            );
        }
    };
    same(
        &interp::run(&g, &inputs).unwrap()[0].1.to_f64_vec(),
        "interpreter",
    );
    let c = compile(
        &g,
        &Options::new(Config::new(Target::named("host", 1).unwrap())),
    )
    .unwrap();
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    same(&got[0].1.to_f64_vec(), "compiled");
}

/// Every kernel IR operator on every element type it takes (the unsigned ones with their top bit set), in
/// a serial loop and 8- and 16-lane vector
/// loops: the compiled code computes what the kernel IR interpreter does, on values that reach the edges
/// (NaN on either side, infinities, division by zero and by -1 at the type's minimum, shifts by the width
/// or more, negative operands).
#[test]
fn kir_operators_compile_as_they_interpret() {
    use mlopt_kir::{BinOp, Elem, Expr, Io, Kernel, LoopKind, Place, Program, Space, Stmt, UnOp};
    const N: u64 = 32;
    let floats = [
        -2.5,
        -1.0,
        -0.5,
        -0.0,
        0.5,
        1.0,
        2.0,
        3.7,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-3,
        10.0,
        -10.0,
        0.25,
        0.9,
    ];
    let ints = [
        -7.0, -1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 100.0, -100.0, 127.0, -128.0, 7.0, 8.0, 31.0, 33.0,
        64.0,
    ];
    let shifts = [
        0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 31.0, 32.0, 63.0, 64.0, -1.0, 0.0, -1.0, 5.0, 1.0,
    ];
    let types = [
        Elem::F32,
        Elem::F64,
        Elem::I8,
        Elem::U8,
        Elem::I16,
        Elem::U16,
        Elem::I32,
        Elem::U32,
        Elem::I64,
        Elem::U64,
        Elem::Bool,
    ];
    for t in types {
        let (xs, ys): (Vec<f64>, Vec<f64>) = match t {
            _ if t.is_float() => (
                floats.iter().chain(floats.iter().rev()).copied().collect(),
                floats.iter().rev().chain(floats.iter()).copied().collect(),
            ),
            Elem::Bool => (
                (0..N).map(|i| (i % 2) as f64).collect(),
                (0..N).map(|i| (i / 2 % 2) as f64).collect(),
            ),
            _ if t.is_unsigned() => {
                // Values with the top bit set (which signed arithmetic would get wrong) and the
                // largest (2^64 saturates to u64::MAX when encoded); negative ones wrap.
                let m = 2f64.powi(8 * t.size() as i32);
                let mut x: Vec<f64> = (0..N).map(|i| ((i * 37) % 256) as f64).collect();
                x[5] = m - 1.0;
                x[6] = m / 2.0;
                x[25] = m / 2.0 + 256.0;
                let y = shifts
                    .iter()
                    .chain(ints.iter())
                    .map(|v: &f64| v.rem_euclid(m));
                (x, y.collect())
            }
            _ => {
                // The type's minimum divided by -1 is in the table for every signed type.
                let min = match t {
                    Elem::I8 => i8::MIN as f64,
                    Elem::I16 => i16::MIN as f64,
                    Elem::I32 => i32::MIN as f64,
                    _ => i64::MIN as f64,
                };
                let mut x: Vec<f64> = ints.iter().chain(ints.iter()).copied().collect();
                x[20] = min;
                (x, shifts.iter().chain(ints.iter().rev()).copied().collect())
            }
        };
        let binops: Vec<BinOp> = match t {
            _ if t.is_float() => {
                vec![
                    BinOp::Add,
                    BinOp::Sub,
                    BinOp::Mul,
                    BinOp::Div,
                    BinOp::Rem,
                    BinOp::Min,
                    BinOp::Max,
                    BinOp::AtMost,
                    BinOp::AtLeast,
                    BinOp::Pow,
                    BinOp::Lt,
                    BinOp::Le,
                    BinOp::Eq,
                    BinOp::Ne,
                ]
            }
            Elem::Bool => vec![BinOp::And, BinOp::Or, BinOp::Xor, BinOp::Eq, BinOp::Ne],
            _ => vec![
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Rem,
                BinOp::Min,
                BinOp::Max,
                BinOp::AtMost,
                BinOp::AtLeast,
                BinOp::Lt,
                BinOp::Le,
                BinOp::Eq,
                BinOp::Ne,
                BinOp::And,
                BinOp::Or,
                BinOp::Xor,
                BinOp::Shl,
                BinOp::Shr,
            ],
        };
        let unops: Vec<UnOp> = match t {
            _ if t.is_float() => mlopt_kir::print::UNOPS
                .iter()
                .copied()
                .filter(|o| *o != UnOp::Not)
                .collect(),
            Elem::Bool => vec![UnOp::Not],
            _ => vec![UnOp::Neg, UnOp::Abs, UnOp::Not],
        };
        type MakeExpr = Box<dyn Fn(Expr, Expr) -> Expr>;
        let exprs: Vec<(String, MakeExpr)> = binops
            .iter()
            .map(|o| {
                let o = *o;
                (
                    mlopt_kir::print::binop_name(o).to_string(),
                    Box::new(move |x, y| Expr::bin(o, x, y)) as MakeExpr,
                )
            })
            .chain(unops.iter().map(|o| {
                let o = *o;
                (
                    mlopt_kir::print::unop_name(o).to_string(),
                    Box::new(move |x, _| Expr::un(o, x)) as MakeExpr,
                )
            }))
            .collect();
        let encode = |vs: &[f64]| -> Vec<u8> {
            vs.iter()
                .flat_map(|v| match t {
                    Elem::F32 => (*v as f32).to_le_bytes().to_vec(),
                    Elem::F64 => v.to_le_bytes().to_vec(),
                    Elem::I8 => (*v as i8).to_le_bytes().to_vec(),
                    Elem::U8 | Elem::Bool => vec![*v as u8],
                    Elem::I16 => (*v as i16).to_le_bytes().to_vec(),
                    Elem::U16 => (*v as u16).to_le_bytes().to_vec(),
                    Elem::I32 => (*v as i32).to_le_bytes().to_vec(),
                    Elem::U32 => (*v as u32).to_le_bytes().to_vec(),
                    Elem::U64 => (*v as u64).to_le_bytes().to_vec(),
                    _ => (*v as i64).to_le_bytes().to_vec(),
                })
                .collect()
        };
        let mut p = Program {
            name: format!("ops_{t}"),
            inputs: vec![
                Io {
                    name: "x".into(),
                    elem: t,
                    dims: vec![N],
                    counted: None,
                    sequence: None,
                },
                Io {
                    name: "y".into(),
                    elem: t,
                    dims: vec![N],
                    counted: None,
                    sequence: None,
                },
            ],
            ..Default::default()
        };
        for (name, f) in &exprs {
            for kind in [LoopKind::Serial, LoopKind::Vector(8), LoopKind::Vector(16)] {
                let mut k = Kernel::new(format!("k{}", p.kernels.len()));
                let e = f(Expr::Int(0), Expr::Int(0));
                let out_t = if matches!(e, Expr::Binary(o, ..) if o.is_compare()) {
                    Elem::Bool
                } else {
                    t
                };
                let (o, x, y) = (
                    k.buf("out", out_t, vec![N], Space::Global),
                    k.buf("x", t, vec![N], Space::Global),
                    k.buf("y", t, vec![N], Space::Global),
                );
                let i = k.var("i");
                let at = || vec![Expr::var(i)];
                k.body = vec![Stmt::For {
                    var: i,
                    extent: N,
                    kind,
                    body: vec![Stmt::Store {
                        buf: o,
                        index: at(),
                        value: f(Expr::load(x, at()), Expr::load(y, at())),
                    }],
                }];
                mlopt_kir::verify(&k).unwrap_or_else(|e| panic!("{name} on {t}: {e:?}"));
                p.steps.push(mlopt_kir::Step::call(
                    p.kernels.len(),
                    vec![
                        Place::Output(p.outputs.len()),
                        Place::Input(0),
                        Place::Input(1),
                    ],
                ));
                p.outputs.push(Io {
                    name: format!("{name} {kind:?}"),
                    elem: out_t,
                    dims: vec![N],
                    counted: None,
                    sequence: None,
                });
                p.kernels.push(k);
            }
        }
        let inputs = vec![encode(&xs), encode(&ys)];
        let want = mlopt_kir::run_program(&p, &inputs).unwrap();
        let code = mlopt_llvm::compile(&p, &mlopt_target::calibrate::host(1))
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        let got = run_code(&p, &code, &inputs, &lens(&want));
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            let same = match io.elem {
                Elem::F32 | Elem::F64 => {
                    let vals = |b: &[u8]| -> Vec<f64> {
                        if io.elem == Elem::F32 {
                            b.chunks_exact(4)
                                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                                .collect()
                        } else {
                            b.chunks_exact(8)
                                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                                .collect()
                        }
                    };
                    // exp/tanh/erf are evaluated in registers to about 1 ulp; the rest is exact.
                    vals(w).iter().zip(vals(g)).all(|(a, b)| {
                        (a.is_nan() && b.is_nan())
                            || a == &b
                            || (a - b).abs() <= 1e-6 * a.abs().max(1.0)
                    })
                }
                _ => w == g,
            };
            assert!(
                same,
                "{} on {t}: x = {xs:?}\ny = {ys:?}\ninterpreter {w:?}\ncompiled    {g:?}",
                io.name
            );
        }
    }
}

/// f32 and f64 -> bf16 and f16 on every x86 level, against the interpreter bit for bit: ties round to
/// even, overflow goes to infinity, f16 keeps subnormals and bf16 flushes f32 subnormals to a signed zero
/// (mlopt's definition, `bf16_from_f32`), NaNs stay NaN with their sign; serial and vector loops. bf16 is
/// `vcvtneps2bf16` for this machine when it has AVX512-BF16 and for Zen 4, integer code for x86-64-v3/v4.
/// (The interpreter once rounded like `half`'s f64 conversions, which lose the low bits: 0x3f808001
/// became bf16 1.0.)
#[test]
fn casts_to_bf16_round_as_the_interpreter_does() {
    use mlopt_kir::{Elem, LoopKind};
    let bits: [u32; 24] = [
        0x3f80_8000, // 1 + 2^-8: a tie, rounds down to even
        0x3f81_8000, // a tie that rounds up to even
        0x3f80_8001, // just above a tie
        0x7f7f_ffff, // f32::MAX rounds to infinity
        0x7f80_0000, // infinity
        0x7fc0_0001, // a quiet NaN with payload
        0xff80_0001, // a negative signalling NaN
        0x0000_0001, // the smallest subnormal
        0x807f_ffff, // a negative subnormal: bf16 -0 (flushed)
        0x0000_0000,
        0x8000_0000, // -0
        0x4049_0fdb, // pi
        0xc2f6_e979, // -123.456
        0x3dcc_cccd, // 0.1
        0x477f_e000, // 65504
        0x3f7f_ffff, // just below 1
        0x3f80_1001, // f16: just above a tie (1 + 2^-11 + 2^-23), rounds up
        0x3380_0000, // f16: 2^-24, the smallest subnormal
        0x3300_0001, // f16: just above half the smallest subnormal, rounds up to it
        0x3300_0000, // f16: exactly half the smallest subnormal, rounds to 0
        0x477f_f000, // f16: the tie between 65504 and 65536, rounds to infinity (even)
        0x477f_efff, // f16: just below that tie, stays 65504
        0x0080_0000, // the smallest normal f32
        0xbf80_0000, // -1
    ];
    let values: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
    let kinds = [LoopKind::Serial, LoopKind::Vector(8)];
    let (p, inputs) = cast_program("to_bf16", &values, &[Elem::BF16, Elem::F16], &kinds);
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for (target, got) in run_on_x86_levels(&p, &inputs, &want) {
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            let h = |b: &[u8]| -> Vec<String> {
                b.chunks_exact(2)
                    .map(|c| format!("{:04x}", u16::from_le_bytes([c[0], c[1]])))
                    .collect()
            };
            assert_eq!(h(w), h(g), "{target}: {}", io.name);
        }
    }
}

/// f32 and f64 -> u8 and i8 on every x86 level, against the interpreter byte for byte: truncation
/// toward zero, out-of-range values and infinities saturate to the byte's range, NaN is 0; serial and
/// vector loops (the vector form converts whole registers, not element by element).
#[test]
fn casts_to_bytes_saturate_as_the_interpreter_does() {
    use mlopt_kir::{Elem, LoopKind};
    let values: [f32; 32] = [
        1.5,
        -1.5,
        2.5,
        -2.5,
        126.6,
        -127.6,
        100.0,
        -100.0,
        0.999,
        -0.999,
        65535.0,
        -65536.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e10,
        -1e10,
        255.7,
        256.0,
        254.5,
        -0.7,
        -128.9,
        -129.0,
        127.9,
        128.0,
        0.5,
        3.0,
        -3.6,
        -0.0,
        200.2,
        -1.0,
    ];
    let kinds = [LoopKind::Serial, LoopKind::Vector(4), LoopKind::Vector(16)];
    let (p, inputs) = cast_program("to_bytes", &values, &[Elem::U8, Elem::I8], &kinds);
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for (target, got) in run_on_x86_levels(&p, &inputs, &want) {
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            assert_eq!(w, g, "{target}: {}", io.name);
        }
    }
}

/// f32 and f64 -> float8 (the four kinds), float4 E2M1, int4, uint4, int2 and uint2 on every x86 level, against the
/// interpreter byte for byte (whose codes `mlopt_minifloat`'s tests check against ml_dtypes, ONNX's
/// reference): every code's value, the midpoints between neighbouring codes (ties to even) and a hair
/// either side, overflow past the largest value, subnormals, zeros and NaNs of both signs; serial and
/// vector loops. Then every code of each format back to f32, f64 and i32.
#[test]
fn casts_to_and_from_narrow_types_match_the_interpreter() {
    use mlopt_kir::{Elem, Expr, Io, LoopKind, Program};
    let narrow = [
        Elem::F8E4M3FN,
        Elem::F8E4M3FNUZ,
        Elem::F8E5M2,
        Elem::F8E5M2FNUZ,
        Elem::F4E2M1,
    ];
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        1e-30,
        -1e-30,
        f32::from_bits(1),
        470.0,
        464.0,
        -300.7,
        300.7,
        7.5,
        -8.5,
        15.9,
    ];
    for f in narrow.iter().filter_map(|e| e.minifloat()) {
        let mut codes: Vec<f32> = (0..=255u8)
            .map(|c| f.decode(c))
            .filter(|v| v.is_finite())
            .collect();
        codes.sort_by(f32::total_cmp);
        codes.dedup();
        for w in codes.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            let eps = (hi - lo) / 64.0;
            values.extend([lo, mid, mid - eps, mid + eps]);
        }
        values.push(codes[codes.len() - 1]);
    }
    // Whole vectors of 16.
    while !values.len().is_multiple_of(16) {
        values.push(1.0);
    }
    let mut to = narrow.to_vec();
    to.extend([Elem::I4, Elem::U4, Elem::I2, Elem::U2]);
    let kinds = [LoopKind::Serial, LoopKind::Vector(8), LoopKind::Vector(16)];
    let (p, inputs) = cast_program("to_narrow", &values, &to, &kinds);
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for (target, got) in run_on_x86_levels(&p, &inputs, &want) {
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            let wrong: Vec<String> = w
                .iter()
                .zip(g)
                .zip(&values)
                .filter(|((a, b), _)| a != b)
                .take(8)
                .map(|((a, b), v)| format!("{v:e} ({:#x}): {a:#x} vs {b:#x}", v.to_bits()))
                .collect();
            assert!(wrong.is_empty(), "{target}: {}: {wrong:?}", io.name);
        }
    }

    // Every byte read as each narrow type, converted to f32, f64 and i32.
    let mut p = Program {
        name: "from_narrow".into(),
        ..Default::default()
    };
    let mut from = narrow.to_vec();
    from.extend([Elem::I4, Elem::U4, Elem::I2, Elem::U2]);
    for (src, &e) in from.iter().enumerate() {
        p.inputs.push(Io {
            name: format!("x{src}"),
            elem: e,
            dims: vec![256],
            counted: None,
            sequence: None,
        });
        for t in [Elem::F32, Elem::F64, Elem::I32] {
            for kind in [LoopKind::Serial, LoopKind::Vector(16)] {
                push_loop_kernel(
                    &mut p,
                    (src, e, 256),
                    (t, 256, kind),
                    &|x, i| Expr::cast(t, Expr::load(x, vec![i])),
                    format!("{e} -> {t} {kind:?}"),
                );
            }
        }
    }
    // int4 / uint4 / int2 / uint2 bytes as the types hold them (sign- / zero-extended).
    let bytes = |e: Elem| -> Vec<u8> {
        (0..=255u8)
            .map(|b| match e {
                Elem::I4 => (((b << 4) as i8) >> 4) as u8,
                Elem::U4 => b & 15,
                Elem::I2 => (((b << 6) as i8) >> 6) as u8,
                Elem::U2 => b & 3,
                _ => b,
            })
            .collect()
    };
    let inputs: Vec<Vec<u8>> = from.iter().map(|&e| bytes(e)).collect();
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for (target, got) in run_on_x86_levels(&p, &inputs, &want) {
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            assert_eq!(w, g, "{target}: {}", io.name);
        }
    }
}

/// A program of one kernel per source type (f32, f64), target type in `to` and loop kind in `kinds`,
/// each `out[q] = cast(x[q])`, and its inputs: `values` as f32 and as f64.
fn cast_program(
    name: &str,
    values: &[f32],
    to: &[mlopt_kir::Elem],
    kinds: &[mlopt_kir::LoopKind],
) -> (mlopt_kir::Program, Vec<Vec<u8>>) {
    use mlopt_kir::{Elem, Expr, Io, Program};
    let n = values.len() as u64;
    let io = |name: &str, elem| Io {
        name: name.into(),
        elem,
        dims: vec![n],
        counted: None,
        sequence: None,
    };
    let mut p = Program {
        name: name.into(),
        inputs: vec![io("x32", Elem::F32), io("x64", Elem::F64)],
        ..Default::default()
    };
    for (src, from) in [(0, Elem::F32), (1, Elem::F64)] {
        for &t in to {
            for &kind in kinds {
                push_loop_kernel(
                    &mut p,
                    (src, from, n),
                    (t, n, kind),
                    &|x, i| Expr::cast(t, Expr::load(x, vec![i])),
                    format!("{from} -> {t} {kind:?}"),
                );
            }
        }
    }
    let x32: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x64: Vec<u8> = values
        .iter()
        .flat_map(|v| f64::from(*v).to_le_bytes())
        .collect();
    (p, vec![x32, x64])
}

/// Adds to `p` one kernel, `out[q] = value(x, q)` for q < `extent` in one loop of `kind`, reading
/// input `src` as `x` ([x_len] of `x_elem`) and writing a new output `name` ([extent] of `elem`).
fn push_loop_kernel(
    p: &mut mlopt_kir::Program,
    (src, x_elem, x_len): (usize, mlopt_kir::Elem, u64),
    (elem, extent, kind): (mlopt_kir::Elem, u64, mlopt_kir::LoopKind),
    value: &dyn Fn(mlopt_kir::BufId, mlopt_kir::Expr) -> mlopt_kir::Expr,
    name: String,
) {
    use mlopt_kir::{Expr, Io, Kernel, Place, Space, Step, Stmt};
    let mut k = Kernel::new(format!("k{}", p.kernels.len()));
    let (o, x) = (
        k.buf("out", elem, vec![extent], Space::Global),
        k.buf("x", x_elem, vec![x_len], Space::Global),
    );
    let q = k.var("q");
    k.body = vec![Stmt::For {
        var: q,
        extent,
        kind,
        body: vec![Stmt::Store {
            buf: o,
            index: vec![Expr::var(q)],
            value: value(x, Expr::var(q)),
        }],
    }];
    mlopt_kir::verify(&k).unwrap();
    p.steps.push(Step::call(
        p.kernels.len(),
        vec![Place::Output(p.outputs.len()), Place::Input(src)],
    ));
    p.outputs.push(Io {
        name,
        elem,
        dims: vec![extent],
        counted: None,
        sequence: None,
    });
    p.kernels.push(k);
}

/// `p` compiled for this machine, x86-64-v3, x86-64-v4 and Zen 4, and run on `inputs` for each of those
/// this machine runs: each such target's outputs (`want` gives their sizes). Every target is compiled.
fn run_on_x86_levels(
    p: &mlopt_kir::Program,
    inputs: &[Vec<u8>],
    want: &[Vec<u8>],
) -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let mut out = vec![];
    for target in ["host", "x86-64-v3", "x86-64-v4", "znver4"] {
        let t = Target::named(target, 1).unwrap();
        let t = t.cpu().unwrap();
        let code = mlopt_llvm::compile(p, t).unwrap_or_else(|e| panic!("{target}: {e}"));
        if t.runs_here() {
            out.push((target, run_code(p, &code, inputs, &lens(want))));
        }
    }
    assert!(
        out.len() >= 2,
        "this machine runs host and x86-64-v3 code at least"
    );
    out
}

/// The byte lengths of `bufs`.
fn lens(bufs: &[Vec<u8>]) -> Vec<usize> {
    bufs.iter().map(Vec::len).collect()
}

/// Vector loads of every second, third and fourth element (a stride-2 window's row), of f32, bf16 and f16,
/// 8 and 16 lanes, from each start offset up to the stride, reaching the last element of the buffer
/// (compiled as two overlapping loads and a shuffle), and loads whose lanes interleave 2 or 4 rows (one
/// load per row and a shuffle): bit for bit the interpreter's copy.
#[test]
fn strided_and_interleaved_vector_loads() {
    use mlopt_kir::{BinOp, Elem, Expr, Io, LoopKind, Program};
    let n = 64u64;
    let mut p = Program {
        name: "strided".into(),
        ..Default::default()
    };
    let mut inputs = vec![];
    for elem in [Elem::F32, Elem::BF16, Elem::F16] {
        p.inputs.push(Io {
            name: format!("x_{elem}"),
            elem,
            dims: vec![n],
            counted: None,
            sequence: None,
        });
        // Distinct bit patterns (all finite): a wrong lane shows.
        inputs.push((0..n * elem.size()).map(|i| (i * 37 % 61) as u8).collect());
    }
    // One kernel per case: out[q] = x[index(q)] over `extent` lanes of input `src`, `lanes` wide.
    let mut copy = |src: usize,
                    elem: Elem,
                    (extent, lanes): (u64, u32),
                    index: &dyn Fn(Expr) -> Expr,
                    name: String| {
        push_loop_kernel(
            &mut p,
            (src, elem, n),
            (elem, extent, LoopKind::Vector(lanes)),
            &|x, q| Expr::load(x, vec![index(q)]),
            name,
        );
    };
    for (src, elem) in [Elem::F32, Elem::BF16, Elem::F16].into_iter().enumerate() {
        for (st, lanes, start) in (2..=4u64).flat_map(|st| {
            [8u32, 16]
                .into_iter()
                .flat_map(move |w| (0..st).map(move |s| (st, w, s)))
        }) {
            // The last lane reads element (w - 1) * st + start + base: the largest base keeps it inside.
            let count = (n - 1 - start) / st + 1;
            let extent = count / u64::from(lanes) * u64::from(lanes);
            let base = (count - extent) as i64 * st as i64;
            copy(
                src,
                elem,
                (extent, lanes),
                &|q| {
                    Expr::bin(
                        BinOp::Add,
                        Expr::mul(q, Expr::int(st as i64)),
                        Expr::int(start as i64 + base),
                    )
                },
                format!("{elem} stride {st} from {start} x{lanes}"),
            );
        }
        // Lanes interleaving r rows of a [r, n / r] view: x[(q % r) * (n / r) + q / r], the row offset
        // written as the ONNX importer's reshapes leave it (a division and a remainder of the lane).
        for (r, lanes) in [(2i64, 8u32), (2, 16), (4, 16)] {
            copy(
                src,
                elem,
                (n, lanes),
                &|q| {
                    let row = Expr::rem(q.clone(), Expr::int(r));
                    Expr::add(
                        Expr::mul(row, Expr::int(n as i64 / r)),
                        Expr::div(q, Expr::int(r)),
                    )
                },
                format!("{elem} {r} rows interleaved x{lanes}"),
            );
        }
    }
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for (target, got) in run_on_x86_levels(&p, &inputs, &want) {
        for ((io, w), g) in p.outputs.iter().zip(&want).zip(&got) {
            assert_eq!(w, g, "{target}: {}", io.name);
        }
    }
    // Both forms compile to whole-vector loads and shuffles, not per-lane loads.
    let code =
        mlopt_llvm::compile(&p, Target::named("x86-64-v4", 1).unwrap().cpu().unwrap()).unwrap();
    for lane_by_lane in ["insertelement", "gather"] {
        assert!(
            !code.optimized_ir.contains(lane_by_lane),
            "a strided or interleaved load was built lane by lane ({lane_by_lane})"
        );
    }
}

/// Resize of integer images (u8 and i32) in every mode: computed in f64, rounded half away from zero and
/// saturated (cubic overshoots 0..255), as the reference does.
#[test]
fn integer_resize_compiles_as_it_interprets() {
    use mlopt_ir::{
        CoordMode, DType, NearestMode, Op, ResizeAttrs, ResizeMode, Tensor, TensorType,
    };
    for (dtype, mode) in [
        (DType::U8, ResizeMode::Nearest),
        (DType::U8, ResizeMode::Linear),
        (DType::U8, ResizeMode::Cubic),
        (DType::I32, ResizeMode::Cubic),
    ] {
        let mut g = mlopt_ir::Graph::new("resize_int");
        let x = g.add_input("x", TensorType::new(dtype, vec![1, 2, 4, 5]));
        let attrs = ResizeAttrs {
            mode,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: false,
            scales: vec![1.0, 1.0, 2.0, 1.6],
            sizes: vec![1, 2, 8, 8],
            roi: vec![],
        };
        let y = g.add(Op::Resize(attrs), "resize", &[x]).unwrap();
        g.add_output("y", y);
        // Sharp edges (0 next to 255, and negatives for i32) so cubic overshoots the range.
        let vals: Vec<f64> = (0..40)
            .map(|i| if (i / 2) % 2 == 0 { 255.0 } else { 0.0 })
            .map(|v| if dtype == DType::I32 { v - 128.0 } else { v })
            .collect();
        let x = Tensor::from_vec(&[1, 2, 4, 5], vals).unwrap().cast(dtype);
        let inputs = std::collections::HashMap::from([("x".to_string(), x)]);
        let want = interp::run(&g, &inputs).unwrap();
        let config = Config::new(Target::named(runnable_level(), 1).unwrap());
        let c =
            compile(&g, &Options::new(config)).unwrap_or_else(|e| panic!("{dtype} {mode:?}: {e}"));
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        assert_eq!(
            want[0].1.to_i64_vec(),
            got[0].1.to_i64_vec(),
            "{dtype} {mode:?}"
        );
        let kir = mlopt_lower::interpret(&c.program, &inputs).unwrap();
        assert_eq!(
            want[0].1.to_i64_vec(),
            kir[0].1.to_i64_vec(),
            "{dtype} {mode:?} in the kernel IR interpreter"
        );
    }
}

/// `mma` blocks (bf16 in, f32 accumulators) compiled for this machine (AMX tiles when it has them), for
/// x86-64-v4 (the same blocks as loops) and for Zen 4 (`vdpbf16ps`; this machine runs its code too),
/// against the kernel IR interpreter: a 64x64x96 product in 32x32 blocks, then 16x32x64 blocks and one
/// 32x16x32 block accumulated on top, then a loop of three 13x32x32 products into one block (a
/// convolution's taps: on `vdpbf16ps` one sum with C in registers, in row groups of 6 and 7; for AMX,
/// whose tiles take 16 rows, 16x32x32, summed in the tiles), compiled for Sapphire Rapids too and run
/// where this machine has the tiles. The first
/// and last prefetch the block after B's as they run (`ahead`; the first's last block asks past B's end),
/// which changes no value.
#[test]
fn mma_blocks_compile_as_they_interpret() {
    use mlopt_kir::{Elem, Place, Program, Step};
    let set = "kernel @set(%c: f32[64,64], %a: bf16[64,96], %b: bf16[48,128]) {
  serial %i in 0..2 {
    serial %j in 0..2 {
      mma<32x32x96> %c[(%i * 32), (%j * 32)] = %a[(%i * 32), 0] * %b[0, (%j * 64)] ahead
    }
  }
}
";
    let add = "kernel @add(%c: f32[64,64], %a: bf16[64,96], %b: bf16[48,128]) {
  serial %i in 0..4 {
    mma<16x32x64> %c[(%i * 16), 32] += %a[(%i * 16), 32] * %b[16, 0]
  }
  mma<32x16x32> %c[32, 48] += %a[0, 64] * %b[32, 96]
}
";
    let taps = |m: u64| {
        format!(
            "kernel @taps(%c: f32[64,64], %a: bf16[64,96], %b: bf16[48,128]) {{
  serial %t in 0..3 {{
    mma<{m}x32x32> %c[0, 0] += %a[(%t * 16), (%t * 2)] * %b[(%t * 8), 32] ahead
  }}
}}
"
        )
    };
    let program = |taps_m: u64| {
        let taps = taps(taps_m);
        let kernels: Vec<_> = [set, add, &taps]
            .iter()
            .map(|t| mlopt_kir::parse_kernel(t).unwrap())
            .collect();
        for k in &kernels {
            mlopt_kir::verify(k).unwrap();
            let text = match k.name.as_str() {
                "set" => set,
                "add" => add,
                _ => &taps,
            };
            assert_eq!(&mlopt_kir::print::kernel(k), text);
        }
        let args = vec![Place::Output(0), Place::Input(0), Place::Input(1)];
        Program {
            name: "mma".into(),
            inputs: vec![
                io("a", Elem::BF16, vec![64, 96]),
                io("b", Elem::BF16, vec![48, 128]),
            ],
            outputs: vec![io("c", Elem::F32, vec![64, 64])],
            kernels,
            steps: vec![
                Step::call(0, args.clone()),
                Step::call(1, args.clone()),
                Step::call(2, args),
            ],
            ..Default::default()
        }
    };
    let bf16 = |n: usize, seed: u64| -> Vec<u8> {
        (0..n as u64)
            .flat_map(|i| {
                half::bf16::from_f32((((i * 7919 + seed) % 201) as f32 - 100.0) / 64.0)
                    .to_le_bytes()
            })
            .collect()
    };
    let inputs = vec![bf16(64 * 96, 1), bf16(48 * 128, 2)];
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    for target in ["host", "x86-64-v4", "znver4", "sapphirerapids"] {
        let t = Target::named(target, 1).unwrap();
        let t = t.cpu().unwrap();
        let amx = t.matrix() == Some(mlopt_target::MatrixUnit::Amx);
        let p = program(if amx { 16 } else { 13 });
        let want = mlopt_kir::run_program(&p, &inputs).unwrap();
        let code = mlopt_llvm::compile(&p, t).unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(
            code.optimized_ir.contains("tdpbf16ps"),
            t.matrix() == Some(mlopt_target::MatrixUnit::Amx),
            "{target}: AMX instructions iff the target has AMX"
        );
        assert_eq!(
            code.optimized_ir.contains("dpbf16ps.512"),
            t.matrix() == Some(mlopt_target::MatrixUnit::Dot),
            "{target}: vdpbf16ps iff the target has it and no AMX"
        );
        if t.matrix() == Some(mlopt_target::MatrixUnit::Dot) {
            assert!(
                code.optimized_ir.contains("llvm.prefetch"),
                "{target}: blocks marked `ahead` prefetch"
            );
        }
        if !t.runs_here() {
            continue;
        }
        let got = run_code(&p, &code, &inputs, &[64 * 64 * 4]);
        // Products of bf16 values are exact in f32; only the order of the f32 sums differs.
        let (w, g) = (f32s(&want[0]), f32s(&got[0]));
        let worst = w
            .iter()
            .zip(&g)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{target}: worst relative error {worst:e}");
    }
}

/// A serial loop around a vector loop whose lanes read an operand a plane apart (the channels-innermost
/// copy bf16 convolutions make: `xp[.., q, c] = x[c, .., q s + ph]`) runs 16 steps at a time as rows
/// transposed in registers (`mlopt-llvm/src/transpose.rs`): bf16 at a step of 2 and f32 at a step of 1,
/// with the steps past the last whole block (37 = 2 x 16 + 5, 21 = 16 + 5) run as before, the value
/// computed around the operand (a guard on the lane, a product); against the kernel IR interpreter.
#[test]
fn transposed_copies_compile_as_they_interpret() {
    use mlopt_kir::{Elem, Place, Program, Step};
    let strided = "kernel @strided(%o: bf16[2,37,32], %x: bf16[32,2,80]) {
  serial %h in 0..2 {
    serial %q in 0..37 {
      vector<16> %c in 0..32 {
        %o[%h, %q, %c] = %x[%c, %h, ((%q * 2) + 1)]
      }
    }
  }
}
";
    let guarded = "kernel @guarded(%p: f32[3,21,16], %y: f32[16,3,21]) {
  serial %h in 0..3 {
    serial %q in 0..21 {
      vector<16> %c in 0..16 {
        %p[%h, %q, %c] = select(lt(%c, 12), (%y[%c, %h, %q] * 2.0f32), 0.0f32)
      }
    }
  }
}
";
    let kernels: Vec<_> = [strided, guarded]
        .iter()
        .map(|t| mlopt_kir::parse_kernel(t).unwrap())
        .collect();
    for (k, text) in kernels.iter().zip([strided, guarded]) {
        mlopt_kir::verify(k).unwrap();
        assert_eq!(&mlopt_kir::print::kernel(k), text);
    }
    let p = Program {
        name: "tr".into(),
        inputs: vec![
            io("x", Elem::BF16, vec![32, 2, 80]),
            io("y", Elem::F32, vec![16, 3, 21]),
        ],
        outputs: vec![
            io("o", Elem::BF16, vec![2, 37, 32]),
            io("p", Elem::F32, vec![3, 21, 16]),
        ],
        kernels,
        steps: vec![
            Step::call(0, vec![Place::Output(0), Place::Input(0)]),
            Step::call(1, vec![Place::Output(1), Place::Input(1)]),
        ],
        ..Default::default()
    };
    let x: Vec<u8> = (0..32 * 2 * 80u32)
        .flat_map(|i| half::bf16::from_f32(i as f32 - 2000.0).to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..16 * 3 * 21u32)
        .flat_map(|i| (i as f32 * 0.5 - 100.0).to_le_bytes())
        .collect();
    let inputs = vec![x, y];
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for target in ["host", "x86-64-v3", "x86-64-v4"] {
        let t = Target::named(target, 1).unwrap();
        let code =
            mlopt_llvm::compile(&p, t.cpu().unwrap()).unwrap_or_else(|e| panic!("{target}: {e}"));
        // The unoptimised IR holds the transposes' shuffles.
        assert!(code.llvm_ir.contains("%tr"), "{target}: no transpose");
        if !t.cpu().unwrap().runs_here() {
            continue;
        }
        let got = run_code(&p, &code, &inputs, &lens(&want));
        assert_eq!(got, want, "{target}");
    }
}

/// Vector loops of odd widths (12, 7 lanes: a row's tail) load and store by one masked access on
/// AVX-512, touching only their lanes (the outputs' other elements stay zero), and a serial loop whose
/// body is such loops under guards its steps share (an mma epilogue's full and edge blocks: C read down
/// its columns) runs transposed: the same answers as the interpreter on every x86 level.
#[test]
fn odd_widths_and_transposed_tails_compile_as_they_interpret() {
    use mlopt_kir::{Elem, Place, Program, Step};
    let odd = "kernel @odd(%o: f32[4,40], %q: bf16[4,40], %x: f32[4,40], %z: bf16[4,40]) {
  serial %r in 0..4 {
    vector<12> %a in 0..24 {
      %o[%r, (%a + 3)] = (%x[%r, (%a + 5)] * 2.0f32)
    }
    vector<7> %b in 0..14 {
      %q[%r, (%b + 20)] = %z[%r, (%b + 1)]
    }
  }
}
";
    let tails = "kernel @tails(%e: f32[2,32,28], %c: f32[28,32]) {
  serial %b in 0..2 {
    serial %j in 0..32 {
      if lt(%b, 1) {
        vector<16> %i in 0..16 {
          %e[%b, %j, %i] = (%c[%i, %j] + 1.0f32)
        }
        vector<12> %t in 0..12 {
          %e[%b, %j, (%t + 16)] = (%c[(%t + 16), %j] + 1.0f32)
        }
      }
      if le(1, %b) {
        vector<16> %i2 in 0..16 {
          %e[%b, %j, %i2] = (%c[%i2, %j] * 2.0f32)
        }
      }
    }
  }
}
";
    let kernels: Vec<_> = [odd, tails]
        .iter()
        .map(|t| mlopt_kir::parse_kernel(t).unwrap())
        .collect();
    for k in &kernels {
        mlopt_kir::verify(k).unwrap();
    }
    let p = Program {
        name: "odd".into(),
        inputs: vec![
            io("x", Elem::F32, vec![4, 40]),
            io("z", Elem::BF16, vec![4, 40]),
            io("c", Elem::F32, vec![28, 32]),
        ],
        outputs: vec![
            io("o", Elem::F32, vec![4, 40]),
            io("q", Elem::BF16, vec![4, 40]),
            io("e", Elem::F32, vec![2, 32, 28]),
        ],
        kernels,
        steps: vec![
            Step::call(
                0,
                vec![
                    Place::Output(0),
                    Place::Output(1),
                    Place::Input(0),
                    Place::Input(1),
                ],
            ),
            Step::call(1, vec![Place::Output(2), Place::Input(2)]),
        ],
        ..Default::default()
    };
    let f32s = |n: u32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.25 - 7.0).to_le_bytes())
            .collect()
    };
    let z: Vec<u8> = (0..160u32)
        .flat_map(|i| half::bf16::from_f32(i as f32 - 50.0).to_le_bytes())
        .collect();
    let inputs = vec![f32s(160), z, f32s(28 * 32)];
    let want = mlopt_kir::run_program(&p, &inputs).unwrap();
    for target in ["host", "x86-64-v3", "x86-64-v4"] {
        let t = Target::named(target, 1).unwrap();
        let code =
            mlopt_llvm::compile(&p, t.cpu().unwrap()).unwrap_or_else(|e| panic!("{target}: {e}"));
        if target == "x86-64-v4" {
            assert!(code.llvm_ir.contains("llvm.masked.load"), "no masked load");
            assert!(
                code.llvm_ir.contains("llvm.masked.store"),
                "no masked store"
            );
            assert!(code.llvm_ir.contains("%tr"), "no transpose");
        }
        if !t.cpu().unwrap().runs_here() {
            continue;
        }
        let got = run_code(&p, &code, &inputs, &lens(&want));
        assert_eq!(got, want, "{target}");
    }
}

/// The spacing of f32 values at |v|.
fn ulp32(v: f64) -> f64 {
    let w = (v as f32).abs();
    (f32::from_bits(w.to_bits() + 1) - w) as f64
}

/// The transcendental functions written as register code (`mlopt-llvm/src/transcendental.rs`, shared by
/// x86 and NVPTX) against Rust's libm in f64, over their whole useful ranges, in serial and vector loops:
/// the largest error in units of the result's last place stays within each function's documented bound,
/// and integer powers through f64 are exact.
#[test]
fn register_math_is_accurate() {
    use mlopt_kir::{BinOp, Elem, Expr, Io, Kernel, LoopKind, Place, Program, Space, Stmt, UnOp};
    const N: usize = 4096;
    let sweep = |lo: f64, hi: f64| -> Vec<f64> {
        (0..N)
            .map(|i| lo + (hi - lo) * i as f64 / (N - 1) as f64)
            .collect()
    };
    let logspace = |lo: f64, hi: f64, signed: bool| -> Vec<f64> {
        (0..N)
            .map(|i| {
                let v = (lo.ln() + (hi.ln() - lo.ln()) * (i / 2) as f64 / (N / 2) as f64).exp();
                if signed && i % 2 == 1 {
                    -v
                } else {
                    v
                }
            })
            .collect()
    };
    // (name, type, x, y, expression, reference, bound in ulps at (x, y))
    type Case = (
        &'static str,
        Elem,
        Vec<f64>,
        Vec<f64>,
        fn(Expr, Expr) -> Expr,
        fn(f64, f64) -> f64,
        fn(f64, f64) -> f64,
    );
    // Integer powers below 2^53 (exact in f64), as ONNX's integer Pow computes them.
    let exact: Vec<(f64, f64)> = (2..=10)
        .flat_map(|b: i32| {
            (0..64)
                .filter(move |e| (b as f64).powi(*e) < 2f64.powi(53))
                .map(move |e| (b as f64, e as f64))
        })
        .collect();
    let (ints, int_exps): (Vec<f64>, Vec<f64>) = (0..N).map(|i| exact[i % exact.len()]).unzip();
    let avx512 = mlopt_target::calibrate::host(1).has("avx512f");
    let cases: Vec<Case> = vec![
        (
            "asin f32",
            Elem::F32,
            sweep(-1.0, 1.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Asin, x),
            |x, _| x.asin(),
            |_, _| 3.0,
        ),
        (
            "acos f32",
            Elem::F32,
            sweep(-1.0, 1.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Acos, x),
            |x, _| x.acos(),
            |_, _| 3.0,
        ),
        (
            "atan f32",
            Elem::F32,
            logspace(1e-6, 1e6, true),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Atan, x),
            |x, _| x.atan(),
            |_, _| 3.0,
        ),
        (
            "exp f32",
            Elem::F32,
            sweep(-87.0, 88.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Exp, x),
            |x, _| x.exp(),
            |_, _| 3.0,
        ),
        // Past both ends of f32's normal range: below e^-87.34 both forms give 0, not a subnormal
        // (which costs Intel cores a microcode assist per operation), and AVX-512's `vscalefps`
        // overflows exactly where e^x does (the exponent-bit form gives inf from e^88.4).
        (
            "exp f32 at the ends",
            Elem::F32,
            match avx512 {
                true => sweep(-110.0, 95.0),
                false => sweep(-87.0, 88.0),
            },
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Exp, x),
            |x, _| if x < -87.33654 { 0.0 } else { x.exp() },
            |_, _| 3.0,
        ),
        // tanh within 4 ulp (its series below |x| = 0.1); erf (Abramowitz & Stegun 7.1.26) within
        // 4e-7 absolute (the formula's 1.5e-7, and f32's rounding of 1 - p e^(-x^2): 3e-7 at 0.19),
        // and exactly +-1 from |x| = 10 on. (Neither was tested before.)
        (
            "tanh f32",
            Elem::F32,
            sweep(-12.0, 12.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Tanh, x),
            |x, _| x.tanh(),
            |_, _| 4.0,
        ),
        (
            "erf f32",
            Elem::F32,
            sweep(-6.0, 6.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Erf, x),
            |x, _| libm::erf(x),
            |x, _| 2.0 + 4e-7 / ulp32(libm::erf(x)),
        ),
        (
            "erf f32 far out",
            Elem::F32,
            [
                logspace(10.0, 1e38, true),
                vec![f64::INFINITY, f64::NEG_INFINITY],
            ]
            .concat()[2..]
                .to_vec(),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Erf, x),
            |x, _| libm::erf(x),
            |_, _| 0.0,
        ),
        (
            "exp f64",
            Elem::F64,
            sweep(-744.0, 709.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Exp, x),
            |x, _| x.exp(),
            |_, _| 3.0,
        ),
        (
            "log f64",
            Elem::F64,
            logspace(1e-310, 1e308, false),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Log, x),
            |x, _| x.ln(),
            |_, _| 3.0,
        ),
        (
            "log f64 near 1",
            Elem::F64,
            sweep(0.5, 2.0),
            vec![0.0; N],
            |x, _| Expr::un(UnOp::Log, x),
            |x, _| x.ln(),
            |_, _| 3.0,
        ),
        (
            "pow f32",
            Elem::F32,
            logspace(1e-2, 1e2, false),
            sweep(-9.5, 9.5),
            |x, y| Expr::bin(BinOp::Pow, x, y),
            |x, y| x.powf(y),
            |_, _| 1.0,
        ),
        (
            "pow f32 integer",
            Elem::F32,
            logspace(1e-1, 1e1, true),
            int_exps.iter().map(|e| e - 32.0).collect(),
            |x, y| Expr::bin(BinOp::Pow, x, y),
            |x, y| x.powf(y),
            |_, _| 1.0,
        ),
        (
            "pow f64",
            Elem::F64,
            logspace(1e-3, 1e3, false),
            sweep(-50.5, 50.5),
            |x, y| Expr::bin(BinOp::Pow, x, y),
            |x, y| x.powf(y),
            |x, y| 2.0 + 2.0 * (y * x.ln()).abs(),
        ),
        (
            "pow f64 integer",
            Elem::F64,
            ints,
            int_exps,
            |x, y| Expr::bin(BinOp::Pow, x, y),
            |x, y| x.powf(y),
            |_, _| 0.0,
        ),
    ];
    for (name, t, xs, ys, f, reference, bound) in cases {
        let mut p = Program {
            name: "math".into(),
            inputs: vec![
                Io {
                    name: "x".into(),
                    elem: t,
                    dims: vec![N as u64],
                    counted: None,
                    sequence: None,
                },
                Io {
                    name: "y".into(),
                    elem: t,
                    dims: vec![N as u64],
                    counted: None,
                    sequence: None,
                },
            ],
            ..Default::default()
        };
        let kinds = [LoopKind::Serial, LoopKind::Vector(8), LoopKind::Vector(16)];
        for kind in kinds {
            let mut k = Kernel::new(format!("k{}", p.kernels.len()));
            let (o, x, y) = (
                k.buf("out", t, vec![N as u64], Space::Global),
                k.buf("x", t, vec![N as u64], Space::Global),
                k.buf("y", t, vec![N as u64], Space::Global),
            );
            let i = k.var("i");
            let at = || vec![Expr::var(i)];
            k.body = vec![Stmt::For {
                var: i,
                extent: N as u64,
                kind,
                body: vec![Stmt::Store {
                    buf: o,
                    index: at(),
                    value: f(Expr::load(x, at()), Expr::load(y, at())),
                }],
            }];
            p.steps.push(mlopt_kir::Step::call(
                p.kernels.len(),
                vec![
                    Place::Output(p.outputs.len()),
                    Place::Input(0),
                    Place::Input(1),
                ],
            ));
            p.outputs.push(Io {
                name: format!("{kind:?}"),
                elem: t,
                dims: vec![N as u64],
                counted: None,
                sequence: None,
            });
            p.kernels.push(k);
        }
        let encode = |vs: &[f64]| -> Vec<u8> {
            vs.iter()
                .flat_map(|v| {
                    if t == Elem::F32 {
                        (*v as f32).to_le_bytes().to_vec()
                    } else {
                        v.to_le_bytes().to_vec()
                    }
                })
                .collect()
        };
        let inputs = [encode(&xs), encode(&ys)];
        let code = mlopt_llvm::compile(&p, &mlopt_target::calibrate::host(1))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let size = if t == Elem::F32 { 4 } else { 8 };
        let got = run_code(&p, &code, &inputs, &vec![N * size; kinds.len()]);
        for (out, kind) in got.iter().zip(["serial", "vector<8>", "vector<16>"]) {
            let mut worst = (0.0f64, 0.0, 0.0, 0.0);
            for (j, c) in out.chunks_exact(size).enumerate() {
                // The inputs as the kernel saw them (f32 rounded), the reference in f64.
                let (x, y) = if t == Elem::F32 {
                    (xs[j] as f32 as f64, ys[j] as f32 as f64)
                } else {
                    (xs[j], ys[j])
                };
                let want = reference(x, y);
                let (got, ulp) = if t == Elem::F32 {
                    let g = f32::from_le_bytes(c.try_into().unwrap()) as f64;
                    (g, ulp32(want))
                } else {
                    let g = f64::from_le_bytes(c.try_into().unwrap());
                    let w = want.abs();
                    (g, f64::from_bits(w.to_bits() + 1) - w)
                };
                // A result past the type's largest finite value is infinite in the type.
                let rounded = if t == Elem::F32 {
                    want as f32 as f64
                } else {
                    want
                };
                let err = if rounded.is_finite() {
                    (got - want).abs() / ulp
                } else if got == rounded {
                    0.0
                } else {
                    f64::INFINITY
                };
                let allowed = bound(x, y);
                assert!(
                    err <= allowed,
                    "{name} ({kind}): {err:.2} ulp (bound {allowed:.2}) at x = {x:e}, y = {y:e}"
                );
                if err > worst.0 {
                    worst = (err, x, y, allowed);
                }
            }
            println!(
                "{name} ({kind}): at most {:.2} ulp (x = {:e}, y = {:e}, bound {:.2})",
                worst.0, worst.1, worst.2, worst.3
            );
        }
    }
}

/// At a batch above 1 a CNN's early kernels run a group of images at a time, one per thread
/// (`mlopt_rewrite::images`): a stem
/// convolution, a depthwise one, a pointwise one added to the stem's output, a channels-last block
/// (transpose, LayerNorm, product with a constant, transpose back, add), a max pool, a pointwise
/// convolution and a global average pool, at batch 3 and 4 on maps whose batch does not fit in L2.
/// The plan slices each group out of the input and joins the groups' values after the prefix, and
/// compiled (fp32 on 1 and 2 threads, bf16) it matches the interpreter on distinct images.
#[test]
fn early_kernels_run_image_by_image() {
    use mlopt_ir::{ConvAttrs, DType, Op, TensorType, Unary};
    let graph = |batch: usize| {
        let mut g = mlopt_ir::Graph::new("images");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![batch, 3, 64, 64]));
        let conv = |g: &mut mlopt_ir::Graph, x, c, m, k: usize, group, seed| {
            let w = g.add_const(
                format!("w{seed}"),
                mlopt_tests::weights(&[m, c / group, k, k], c / group * k * k, seed),
            );
            let b = g.add_const(format!("b{seed}"), mlopt_tests::weights(&[m], 1, seed + 50));
            let a = ConvAttrs {
                strides: vec![1, 1],
                pads: vec![k / 2; 4],
                dilations: vec![1, 1],
                group,
                output_padding: vec![],
            };
            g.add(Op::Conv(a), format!("conv{seed}"), &[x, w, b])
                .unwrap()
        };
        let stem = conv(&mut g, x, 3, 32, 3, 1, 1);
        let stem = g.add(Op::Unary(Unary::Relu), "relu1", &[stem]).unwrap();
        let dw = conv(&mut g, stem, 32, 32, 3, 32, 2);
        let dw = g.add(Op::Unary(Unary::Relu), "relu2", &[dw]).unwrap();
        let pw = conv(&mut g, dw, 32, 32, 1, 1, 3);
        let sum = g
            .add(Op::Binary(mlopt_ir::Binary::Add), "add", &[pw, stem])
            .unwrap();
        // A channels-last block (ConvNeXt's): transpose, LayerNorm over channels, a product with a
        // constant, transpose back, add.
        let t = g
            .add(
                Op::Transpose {
                    perm: vec![0, 2, 3, 1],
                },
                "nhwc",
                &[sum],
            )
            .unwrap();
        let scale = g.add_const("ln.s", mlopt_tests::weights(&[32], 1, 60));
        let bias = g.add_const("ln.b", mlopt_tests::weights(&[32], 1, 61));
        let ln = g
            .add(
                Op::LayerNorm {
                    axis: 3,
                    epsilon: 1e-5,
                },
                "ln",
                &[t, scale, bias],
            )
            .unwrap();
        let w = g.add_const("mm.w", mlopt_tests::weights(&[32, 32], 32, 62));
        let mm = g.add(Op::MatMul, "mm", &[ln, w]).unwrap();
        let back = g
            .add(
                Op::Transpose {
                    perm: vec![0, 3, 1, 2],
                },
                "nchw",
                &[mm],
            )
            .unwrap();
        let sum = g
            .add(Op::Binary(mlopt_ir::Binary::Add), "add2", &[back, sum])
            .unwrap();
        let pool = mlopt_ir::PoolAttrs {
            kernel: vec![2, 2],
            strides: vec![2, 2],
            pads: vec![0; 4],
            dilations: vec![1, 1],
            ceil_mode: false,
        };
        let p = g
            .add(
                Op::MaxPool {
                    pool,
                    col_major: false,
                },
                "pool",
                &[sum],
            )
            .unwrap();
        let y = conv(&mut g, p, 32, 64, 1, 1, 4);
        let y = g.add(Op::GlobalAveragePool, "gap", &[y]).unwrap();
        g.add_output("y", y);
        g
    };
    for (batch, threads, precision) in [
        (3, 1, Precision::Fp32),
        (4, 2, Precision::Fp32),
        (4, 1, Precision::Bf16),
    ] {
        let g = graph(batch);
        let name = format!("batch {batch}, {threads} threads, {precision:?}");
        let target = if precision == Precision::Bf16 {
            "host"
        } else {
            runnable_level()
        };
        let mut config = Config::new(Target::named(target, threads).unwrap());
        config.precision = precision;
        let opts = Options {
            winograd: mlopt_schedule::Winograd::Never,
            ..Options::new(config)
        };
        let c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = &c.optimized.plan.graph;
        let count =
            |f: &dyn Fn(&Op) -> bool| plan.node_ids().filter(|&n| f(&plan.node(n).op)).count();
        // A group of one image per thread.
        assert_eq!(
            count(&|o| matches!(o, Op::Slice { .. })),
            batch / threads as usize,
            "{name}: one slice per group"
        );
        assert!(
            count(&|o| matches!(o, Op::Concat { axis: 0 })) >= 1,
            "{name}: no join of the images"
        );
        assert_eq!(
            count(&|o| matches!(o, Op::LayerNorm { .. })),
            batch / threads as usize,
            "{name}: the channels-last block runs by groups"
        );
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 11);
        let want = interp::run(&g, &inputs).unwrap();
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
        let bound = if precision == Precision::Bf16 {
            3e-2
        } else {
            1e-5
        };
        assert!(err < bound, "{name}: error {err:e}");
    }
}

/// A 3x3 stride-1 convolution whose output rows are short for AVX2's tiles (ResNet-50's 128 -> 128 at
/// 28 x 28: per row a 16-wide tile and a 12-wide tail, or 8 x 8 tiles) runs with its output rows end to
/// end over the flat padded plane, 30 columns a row of which 2 are dropped (`flat(..,30)`), at batch 1
/// and 2 and 1 and 2 threads; compiled for x86-64-v3 (which every machine here runs), it matches the
/// interpreter.
#[test]
fn short_rows_run_as_one_flat_row_of_columns() {
    for (batch, threads) in [(1, 1), (2, 2)] {
        let g = mlopt_tests::conv_graph(batch, 128, 128, &[28, 28], 3, 1, 1, true);
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 3);
        let want = interp::run(&g, &inputs).unwrap();
        let opts = Options {
            winograd: mlopt_schedule::Winograd::Never,
            ..Options::new(Config::new(Target::named("x86-64-v3", threads).unwrap()))
        };
        let c = compile(&g, &opts).unwrap();
        let k = &c.program.kernels[0];
        assert!(
            k.schedule
                .iter()
                .any(|s| matches!(s, mlopt_kir::ScheduleStep::Flat { row: 30, .. })),
            "{}",
            mlopt_kir::print::kernel(k)
        );
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        let err = worst_error(&want, &got);
        assert!(
            err < 1e-5,
            "batch {batch}, {threads} threads: error {err:e}"
        );
    }
}
