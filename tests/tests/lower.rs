//! Lowering to the kernel IR on the fixture models: every optimised fixture becomes a program whose kernels
//! verify, and the kernel IR interpreter running it matches the graph interpreter on the fixture's inputs.
//! The kernel dumps are snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::interp;
use mlopt_lower::interpret;
use mlopt_rewrite::{optimize, Config, Precision};
use mlopt_schedule::Winograd;
use mlopt_target::Target;
use mlopt_tests::{data, import, worst_error, FIXTURES};

/// A fused graph lowered, then scheduled for `target` when one is given (with `winograd`).
fn program(g: &mlopt_ir::Graph, target: Option<&Target>, winograd: Winograd) -> mlopt_kir::Program {
    let plan = mlopt_lower::plan_memory(g).unwrap();
    let p = mlopt_lower::lower(g, &plan).unwrap();
    match target {
        Some(t) => {
            let o = mlopt_schedule::Options {
                winograd,
                ..Default::default()
            };
            mlopt_schedule::schedule(p, t, &o).unwrap()
        }
        None => p,
    }
}

/// A CPU target by name, for 2 threads.
fn cpu(name: &str) -> Target {
    Target::named(name, 2).unwrap()
}

/// Fixture `name` optimised for `target` in `precision`, lowered and scheduled for `schedule` (or left
/// as the algorithm): its error against the graph interpreter, and the program.
fn lowered(
    name: &str,
    target: &str,
    precision: Precision,
    schedule: Option<&Target>,
) -> (f64, mlopt_kir::Program) {
    let g = import(name);
    let mut cfg = Config::new(Target::named(target, 1).unwrap());
    cfg.precision = precision;
    let o = optimize(&g, &cfg).unwrap();
    let p = program(&o.plan.graph, schedule, Winograd::Auto);
    let (inputs, _) = data(name);
    let want = interp::run(&o.plan.graph, &inputs).unwrap();
    let got = interpret(&p, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    (worst_error(&want, &got), p)
}

#[test]
fn lowered_fixtures_match_the_graph_interpreter() {
    for name in FIXTURES {
        for (target, p) in [
            ("x86-64-v4", Precision::Fp32),
            ("sm_80", Precision::Fp32),
            ("x86-64-v4", Precision::Bf16),
        ] {
            let (err, _) = lowered(name, target, p, None);
            assert!(err < 1e-5, "{name} on {target} {p:?}: error {err:e}");
        }
        // bf16 contractions as `mma` blocks (Zen 4's vdpbf16ps, Sapphire Rapids' AMX tiles), run by
        // the kernel IR interpreter: they round where the graph does, except attention's, whose
        // softmax numerators are rounded to bf16 for the second product (as on GPU tensor cores; the
        // graph keeps them f32).
        let tol = if *name == "transformer" { 1e-2 } else { 1e-5 };
        let (err, _) = lowered(
            name,
            "x86-64-v4",
            Precision::Bf16,
            Some(&cpu("sapphirerapids")),
        );
        assert!(err < tol, "{name} in bf16 on AMX blocks: error {err:e}");
        let (err, p) = lowered(name, "x86-64-v4", Precision::Bf16, Some(&cpu("znver4")));
        assert!(err < tol, "{name} in bf16 on mma blocks: error {err:e}");
        // The MLP's and the transformer's weight matrices are bf16 constants; the CNN's convolutions
        // (8 and 16 channels) are too small to pay for copying their input into the blocks' layout
        // (`mlopt_cost::tile::bf16_block_pays`), and the dynamic model's contraction for a tile.
        let blocks = p
            .kernels
            .iter()
            .any(|k| mlopt_kir::analysis::has_mma(&k.body));
        assert_eq!(
            blocks,
            matches!(*name, "mlp" | "transformer"),
            "{name}: mma blocks"
        );
        // Schedules change only how loops run: the interpreter still gets the same numbers.
        for t in ["x86-64-v3", "x86-64-v4"] {
            let (err, _) = lowered(name, "x86-64-v4", Precision::Fp32, Some(&cpu(t)));
            assert!(err < 1e-5, "{name} scheduled for {t}: error {err:e}");
        }
    }
}

#[test]
fn kernel_dumps() {
    for name in FIXTURES {
        let (_, p) = lowered(name, "x86-64-v4", Precision::Fp32, Some(&cpu("x86-64-v4")));
        insta::assert_snapshot!(format!("kir_{name}"), mlopt_kir::print::program(&p));
        // The text round-trips: print -> parse -> print is the identity, and the parsed kernel verifies.
        for k in &p.kernels {
            let text = mlopt_kir::print::kernel(k);
            let back =
                mlopt_kir::parse_kernel(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            assert_eq!(
                mlopt_kir::print::kernel(&back),
                text,
                "{name}: @{} does not round-trip",
                k.name
            );
            assert_eq!(
                back.schedule, k.schedule,
                "{name}: @{}'s schedule does not round-trip",
                k.name
            );
            mlopt_kir::verify(&back).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
    }
}

/// Lowering writes convolutions, pooling and attention as their algorithm (serial loops, no schedule
/// step); the CPU schedule makes them fast: a convolution an implicit GEMM over a padded copy of its
/// input, a pooling window a read of a padded copy, attention blocks of query rows whose two products
/// are tiled. The scheduled program still matches the graph.
#[test]
fn windows_and_attention_are_scheduled_not_lowered() {
    use mlopt_kir::ScheduleStep;
    /// A fixture's kernels that hold `marker` in the algorithm hold `made` after the schedule, with a
    /// step that `step` accepts.
    struct Case {
        name: &'static str,
        marker: &'static str,
        made: &'static str,
        step: fn(&ScheduleStep) -> bool,
        at_least: usize,
    }
    let tile: fn(&ScheduleStep) -> bool = |s| matches!(s, ScheduleStep::Tile { .. });
    let cases = [
        // A convolution's fold reads its input through a guarded, clamped window; scheduled, a
        // padded copy (xpad, xphase, or the phase planes xflat).
        Case {
            name: "cnn",
            marker: "fma(select(",
            made: "local %x",
            step: tile,
            at_least: 2,
        },
        // A max pool's window is -inf outside the input.
        Case {
            name: "cnn",
            marker: ", -inff32)",
            made: "local %xp",
            step: |s| matches!(s, ScheduleStep::Pad { .. }),
            at_least: 1,
        },
        // Attention's algorithm keeps one query row of scores; its schedule a block of rows.
        Case {
            name: "transformer",
            marker: "local %scores",
            made: "serial %blk",
            step: tile,
            at_least: 1,
        },
    ];
    for Case {
        name,
        marker,
        made,
        step,
        at_least,
    } in cases
    {
        let g = import(name);
        let o = optimize(&g, &Config::new(Target::named("x86-64-v4", 1).unwrap())).unwrap();
        let algorithm = program(&o.plan.graph, None, Winograd::Auto);
        let found: Vec<usize> = (0..algorithm.kernels.len())
            .filter(|i| print_has(&algorithm.kernels[*i], marker))
            .collect();
        assert!(
            found.len() >= at_least,
            "{name}: {} kernels with {marker:?}",
            found.len()
        );
        for &i in &found {
            let k = &algorithm.kernels[i];
            assert!(
                k.schedule.is_empty(),
                "{name} @{}: lowering chose {:?}",
                k.name,
                k.schedule
            );
            assert!(
                !print_has(k, "vector") && !print_has(k, made),
                "{name} @{} is not the algorithm:\n{}",
                k.name,
                mlopt_kir::print::kernel(k)
            );
        }
        let t = Target::named("x86-64-v4", 1).unwrap();
        let scheduled = mlopt_schedule::schedule(algorithm, &t, &Default::default()).unwrap();
        for &i in &found {
            let k = &scheduled.kernels[i];
            assert!(
                k.schedule.iter().any(step) && print_has(k, made),
                "{name} @{} was not scheduled ({made:?}):\n{}",
                k.name,
                mlopt_kir::print::kernel(k)
            );
        }
        let (inputs, _) = data(name);
        let want = interp::run(&o.plan.graph, &inputs).unwrap();
        assert!(
            worst_error(&want, &interpret(&scheduled, &inputs).unwrap()) < 1e-5,
            "{name}"
        );
    }
}

fn print_has(k: &mlopt_kir::Kernel, what: &str) -> bool {
    mlopt_kir::print::kernel(k).contains(what)
}

/// A graph of one contraction with a bias-and-ReLU epilogue, weights random.
fn contraction(kind: &str, m: usize, k: usize, n: usize, seed: u64) -> mlopt_ir::Graph {
    use mlopt_ir::{Binary, ConvAttrs, DType, Op, Tensor, TensorType, Unary};
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rand = |shape: &[usize]| {
        let v: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % 2000) as f32 / 1000.0 - 1.0
            })
            .collect();
        Tensor::from_vec(shape, v).unwrap()
    };
    let mut g = mlopt_ir::Graph::new(kind);
    let y = match kind {
        "matmul" => {
            // 3-D, so the optimiser keeps the MatMul (a 2-D MatMul + Add becomes a Gemm).
            let x = g.add_input("x", TensorType::new(DType::F32, vec![2, m, k]));
            let w = g.add_const("w", rand(&[k, n]));
            g.add(Op::MatMul, "mm", &[x, w]).unwrap()
        }
        "gemm" => {
            let x = g.add_input("x", TensorType::new(DType::F32, vec![m, k]));
            let w = g.add_const("w", rand(&[k, n]));
            g.add(Op::MatMul, "mm", &[x, w]).unwrap()
        }
        "gemm_t" => {
            let x = g.add_input("x", TensorType::new(DType::F32, vec![k, m]));
            let w = g.add_const("w", rand(&[n, k]));
            g.add(
                Op::Gemm {
                    alpha: 0.5,
                    beta: 1.0,
                    trans_a: true,
                    trans_b: true,
                },
                "gemm",
                &[x, w],
            )
            .unwrap()
        }
        _ => {
            // Conv: m output channels, k input channels, n x n image, 3x3, pad 1, groups 1 or k.
            let group = if kind == "depthwise" { k } else { 1 };
            let x = g.add_input("x", TensorType::new(DType::F32, vec![1, k, n, n]));
            let w = g.add_const("w", rand(&[if group > 1 { k } else { m }, k / group, 3, 3]));
            let a = ConvAttrs {
                strides: vec![1, 1],
                pads: vec![1, 1, 1, 1],
                dilations: vec![1, 1],
                group,
                output_padding: vec![],
            };
            g.add(Op::Conv(a), "conv", &[x, w]).unwrap()
        }
    };
    let last = *g.value_type(y).shape.last().unwrap();
    let b = g.add_const("b", rand(&[last]));
    let s = g.add(Op::Binary(Binary::Add), "bias", &[y, b]).unwrap();
    let r = g.add(Op::Unary(Unary::Relu), "relu", &[s]).unwrap();
    g.add_output("y", r);
    g
}

/// Register-tiled contractions (row tails, column tails of any width, packed B, transposed operands,
/// padded convs, groups), Winograd convolutions, and their
/// fused epilogues compute what the graph interpreter computes, for AVX-512 and AVX2 tiles.
#[test]
fn tiled_contractions_of_many_shapes_match() {
    let cases = [
        ("matmul", 1, 5, 16),
        ("matmul", 7, 33, 48),
        ("matmul", 13, 8, 64),
        ("matmul", 6, 17, 72),
        ("gemm", 7, 9, 48),
        ("gemm_t", 9, 12, 32),
        ("conv", 8, 3, 16),
        ("conv", 5, 4, 8),
        ("depthwise", 4, 4, 16),
        ("gemm", 8, 128, 10),
        ("matmul", 3, 32, 12),
        ("matmul", 5, 7, 88),
        ("gemm", 7, 9, 40),
        ("gemm_t", 6, 5, 24),
        ("conv", 4, 3, 24),
        ("conv", 16, 16, 8),
        ("conv", 24, 32, 16),
        // Output widths of real convolutions that 8 does not divide (ResNet's 7, SqueezeNet's 13, 27).
        ("conv", 8, 3, 7),
        ("conv", 6, 5, 13),
        ("conv", 5, 4, 27),
        ("matmul", 9, 40, 3),
    ];
    for (i, (kind, m, k, n)) in cases.into_iter().enumerate() {
        let g = contraction(kind, m, k, n, i as u64);
        let o = optimize(&g, &Config::new(Target::named("x86-64-v4", 1).unwrap())).unwrap();
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, i as u64);
        let want = interp::run(&g, &inputs).unwrap();
        for target in ["x86-64-v3", "x86-64-v4"] {
            let p = program(&o.plan.graph, Some(&cpu(target)), Winograd::Always);
            let tiled = p.kernels.iter().any(|k| {
                k.schedule
                    .iter()
                    .any(|s| matches!(s, mlopt_kir::ScheduleStep::Tile { .. }))
            });
            // Every contraction is register-tiled, whatever N: the columns past the last full tile run as
            // tail tiles, down to one vector of N % 8 lanes.
            assert!(tiled, "{kind} {m}x{k}x{n}: not tiled for {target}");
            // 3x3 convolutions with 16+ channels each way go through Winograd F(2x2, 3x3).
            let winograd = p
                .kernels
                .iter()
                .any(|k| k.schedule.contains(&mlopt_kir::ScheduleStep::Winograd));
            assert_eq!(
                winograd,
                kind == "conv" && m >= 16 && k >= 16,
                "{kind} {m}x{k}x{n}: winograd = {winograd}"
            );
            let got = interpret(&p, &inputs).unwrap();
            let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
            assert!(err < 1e-5, "{kind} {m}x{k}x{n} on {target}: error {err:e}");
        }
    }
}

/// A contraction whose panels of B would not fit in a quarter of the L2 (here a 64 KiB one, so that small
/// shapes cross it) runs its reduction in blocks, its sums kept between them, and still matches: packed
/// weights (MatMul, Gemm), packed im2col panels (a convolution with short rows) and a padded window.
#[test]
fn contractions_too_deep_for_l2_run_in_k_blocks() {
    let cases = [
        ("matmul", 7, 600, 48),
        ("gemm_t", 9, 384, 64),
        ("matmul", 13, 1000, 70),
        ("conv", 24, 80, 13),
        ("conv", 16, 80, 40),
    ];
    for (i, (kind, m, k, n)) in cases.into_iter().enumerate() {
        let g = contraction(kind, m, k, n, i as u64);
        let o = optimize(&g, &Config::new(Target::named("x86-64-v4", 1).unwrap())).unwrap();
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, i as u64);
        let want = interp::run(&g, &inputs).unwrap();
        let mut small = mlopt_target::cpu::x86_64_v4(2);
        small.l2_bytes = 64 << 10;
        let p = program(&o.plan.graph, Some(&Target::Cpu(small)), Winograd::Never);
        let blocks = p
            .kernels
            .iter()
            .flat_map(|k| &k.schedule)
            .find_map(|s| match s {
                mlopt_kir::ScheduleStep::KBlock { k } => Some(*k),
                _ => None,
            });
        assert!(blocks.is_some(), "{kind} {m}x{k}x{n}: not in K blocks");
        let got = interpret(&p, &inputs).unwrap();
        let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
        assert!(
            err < 1e-5,
            "{kind} {m}x{k}x{n} in K blocks of {blocks:?}: error {err:e}"
        );
    }
}

/// Data checks (`mlopt-lower/src/data_checks.rs`): indices and integer divisors from the inputs, valid and not.
/// The kernel IR interpreter, with and without CPU schedules, and the compiled code must give the graph
/// interpreter's outputs on valid data and fail with its error (the node named) on invalid data.
#[test]
fn data_checks_agree_with_the_graph_interpreter() {
    use mlopt_ir::{Binary, DType, Graph, Op, Tensor, TensorType};
    let i64s = |shape: &[usize], v: Vec<i64>| Tensor::from_vec(shape, v).unwrap();
    let table = Tensor::from_vec(&[5, 3], (0..15).map(|x| x as f32).collect::<Vec<f32>>()).unwrap();
    // (name, graph, valid inputs, invalid inputs, the word the error must hold)
    type Case = (
        &'static str,
        Graph,
        Vec<(&'static str, Tensor)>,
        Vec<(&'static str, Tensor)>,
        &'static str,
    );
    let mut cases: Vec<Case> = Vec::new();
    // Gather along axis 1 of a constant, 40 indices (past a vector's width, with a tail), negative allowed.
    let mut g = Graph::new("gather");
    let t = g.add_const("t", table.clone());
    let i = g.add_input("i", TensorType::new(DType::I64, vec![8, 5]));
    let y = g
        .add(Op::Gather { axis: 1 }, "gather_node", &[t, i])
        .unwrap();
    g.add_output("y", y);
    let good: Vec<i64> = (0..40).map(|k| k % 6 - 3).collect();
    let mut bad = good.clone();
    bad[37] = 3;
    cases.push((
        "gather",
        g,
        vec![("i", i64s(&[8, 5], good))],
        vec![("i", i64s(&[8, 5], bad))],
        "gather_node",
    ));
    // GatherND with index tuples computed inside the kernel's fusion group (an Add before the gather).
    let mut g = Graph::new("gather_nd");
    let t = g.add_const("t", table.clone());
    let i = g.add_input("i", TensorType::new(DType::I64, vec![4, 2]));
    let one = g.add_const("one", i64s(&[], vec![1]));
    let j = g.add(Op::Binary(Binary::Add), "shift", &[i, one]).unwrap();
    let y = g
        .add(Op::GatherNd { batch_dims: 0 }, "gather_nd_node", &[t, j])
        .unwrap();
    g.add_output("y", y);
    cases.push((
        "gather_nd",
        g,
        vec![("i", i64s(&[4, 2], vec![0, 1, 3, -1, -6, -4, 2, 0]))],
        vec![("i", i64s(&[4, 2], vec![0, 1, 3, 2, 0, 0, 2, 0]))],
        "gather_nd_node",
    ));
    // Integer division by a tensor with one zero among 70 divisors.
    let mut g = Graph::new("div");
    let a = g.add_input("a", TensorType::new(DType::I32, vec![70]));
    let b = g.add_input("b", TensorType::new(DType::I32, vec![70]));
    let y = g.add(Op::Binary(Binary::Div), "div_node", &[a, b]).unwrap();
    g.add_output("y", y);
    let num = Tensor::from_vec(&[70], (0..70).collect::<Vec<i32>>()).unwrap();
    let den: Vec<i32> = (0..70).map(|k| k % 5 + 1).collect();
    let mut zero = den.clone();
    zero[66] = 0;
    cases.push((
        "div",
        g,
        vec![
            ("a", num.clone()),
            ("b", Tensor::from_vec(&[70], den).unwrap()),
        ],
        vec![("a", num), ("b", Tensor::from_vec(&[70], zero).unwrap())],
        "division by zero",
    ));
    let named = |v: &[(&str, Tensor)]| {
        v.iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    for (name, g, good, bad, needle) in cases {
        let o = optimize(&g, &Config::new(Target::named("x86-64-v4", 1).unwrap())).unwrap();
        let want = interp::run(&g, &named(&good)).unwrap();
        let refused = interp::run(&g, &named(&bad)).unwrap_err().to_string();
        assert!(refused.contains(needle), "{name}: {refused}");
        for target in [None, Some(cpu("x86-64-v3")), Some(cpu("x86-64-v4"))] {
            let p = program(&o.plan.graph, target.as_ref(), Winograd::Auto);
            let cpu = target.as_ref().map(Target::name);
            assert!(
                p.steps.iter().any(|s| s.check.is_some()),
                "{name}: no check step"
            );
            let got =
                interpret(&p, &named(&good)).unwrap_or_else(|e| panic!("{name} {cpu:?}: {e}"));
            assert_eq!(worst_error(&want, &got), 0.0, "{name} {cpu:?}");
            let e = interpret(&p, &named(&bad)).unwrap_err();
            assert!(e.contains(needle), "{name} {cpu:?}: {e}");
        }
        let opts = mlopt_driver::Options {
            config: Config::new(Target::named(mlopt_target::runnable_level(), 2).unwrap()),
            tune: false,
            winograd: mlopt_schedule::Winograd::Auto,
            profile: false,
            dumps: false,
            probe: false,
        };
        let c = mlopt_driver::compile(&g, &opts).unwrap();
        let mut lib = c.load().unwrap();
        let got = c.run(&mut lib, &named(&good)).unwrap();
        assert_eq!(worst_error(&want, &got), 0.0, "{name} compiled");
        let e = c.run(&mut lib, &named(&bad)).unwrap_err().to_string();
        assert!(
            e.contains(needle) && e.contains("status 3"),
            "{name} compiled: {e}"
        );
        // A valid run after a failed one succeeds: the flag is recomputed, not sticky.
        assert!(
            c.run(&mut lib, &named(&good)).is_ok(),
            "{name}: valid data after an error"
        );
    }
}
