//! Round-trip tests for the text format: a graph using every op prints, parses and prints identically,
//! and malformed text is reported with its line.

use crate::parse::parse;
use crate::print::print;
use crate::*;
use std::sync::Arc;

fn f32s(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn nms_op() -> Op {
    Op::NonMaxSuppression {
        center_point_box: true,
        bound: 6,
    }
}

/// A graph with at least one node of every op (and both inline and named constants).
fn every_op() -> Graph {
    let mut g = Graph::new("every op");
    let x = g.add_input("x", f32s(&[1, 4, 6, 6]));
    let m = g.add_input("input.2", f32s(&[4, 8]));
    let big = Tensor::from_vec(&[4, 4, 3, 3], (0..144).map(|i| i as f32 * 0.01).collect()).unwrap();
    let w = g.add_const("conv.weight", big);
    let b = g.add_const(
        "",
        Tensor::from_vec(&[4], vec![0.5f32, -1.0, f32::INFINITY, 2.5]).unwrap(),
    );
    let idx = g.add_const("idx", Tensor::from_vec(&[2], vec![0i64, -1]).unwrap());
    let conv = ConvAttrs {
        strides: vec![1, 1],
        pads: vec![1, 1, 1, 1],
        dilations: vec![1, 1],
        group: 1,
        output_padding: vec![],
    };
    let c = g
        .add_node(
            Op::Conv(conv.clone()),
            "conv",
            &[Some(x), Some(w), None],
            None,
        )
        .unwrap()[0];
    let ct = ConvAttrs {
        output_padding: vec![0, 0],
        ..conv
    };
    let t = g
        .add_node(
            Op::ConvTranspose(ct),
            "deconv",
            &[Some(c), Some(w), Some(b)],
            None,
        )
        .unwrap()[0];
    let mut v = t;
    for u in [
        Unary::Relu,
        Unary::Sigmoid,
        Unary::Tanh,
        Unary::Erf,
        Unary::Softplus,
        Unary::Softsign,
        Unary::Sqrt,
        Unary::Reciprocal,
        Unary::Exp,
        Unary::Log,
        Unary::Neg,
        Unary::Abs,
        Unary::Floor,
        Unary::Ceil,
        Unary::Round,
        Unary::Sign,
        Unary::HardSwish,
        Unary::Mish,
        Unary::Sin,
        Unary::Cos,
        Unary::Tan,
        Unary::Asin,
        Unary::Acos,
        Unary::Atan,
        Unary::Sinh,
        Unary::Cosh,
        Unary::Asinh,
        Unary::Acosh,
        Unary::Atanh,
        Unary::LeakyRelu { alpha: 0.01 },
        Unary::Elu { alpha: 1.0 },
        Unary::Celu { alpha: 1.5 },
        Unary::Selu {
            alpha: 1.6732632,
            gamma: 1.050701,
        },
        Unary::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Unary::ThresholdedRelu { alpha: 1.0 },
        Unary::Shrink {
            bias: 0.0,
            lambd: 0.5,
        },
        Unary::Gelu { tanh: true },
    ] {
        v = g.add(Op::Unary(u), "", &[v]).unwrap();
    }
    let nan = g.add(Op::Unary(Unary::IsNaN), "", &[v]).unwrap();
    let inf = g
        .add(
            Op::Unary(Unary::IsInf {
                detect_negative: true,
                detect_positive: false,
            }),
            "",
            &[v],
        )
        .unwrap();
    let not = g.add(Op::Unary(Unary::Not), "", &[nan]).unwrap();
    let either = g.add(Op::Binary(Binary::Or), "", &[not, inf]).unwrap();
    for op in [Binary::And, Binary::Xor] {
        g.add(Op::Binary(op), "", &[either, nan]).unwrap();
    }
    let bits = g.add(Op::Cast { to: DType::U8 }, "", &[v]).unwrap();
    let mut bv = g.add(Op::Unary(Unary::BitNot), "", &[bits]).unwrap();
    for op in [
        Binary::BitAnd,
        Binary::BitOr,
        Binary::BitXor,
        Binary::BitShift { left: true },
    ] {
        bv = g.add(Op::Binary(op), "", &[bv, bits]).unwrap();
    }
    let mut y = v;
    for op in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Pow,
        Binary::Mod { fmod: true },
        Binary::PRelu,
    ] {
        y = g.add(Op::Binary(op), "", &[y, v]).unwrap();
    }
    let mut cmp = vec![];
    for op in [
        Binary::Equal,
        Binary::Greater,
        Binary::Less,
        Binary::GreaterOrEqual,
        Binary::LessOrEqual,
    ] {
        cmp.push(g.add(Op::Binary(op), "", &[y, v]).unwrap());
    }
    for n in [Nary::Sum, Nary::Mean, Nary::Max, Nary::Min] {
        y = g.add(Op::Nary(n), "", &[y, v, t]).unwrap();
    }
    y = g.add(Op::Where, "", &[cmp[0], y, v]).unwrap();
    let flag = g.add_input("flag", TensorType::new(DType::Bool, vec![]));
    y = g.add(Op::Choose, "", &[flag, y, v]).unwrap();
    let bits = g.add(Op::BitCast { to: DType::I32 }, "", &[y]).unwrap();
    y = g.add(Op::BitCast { to: DType::F32 }, "", &[bits]).unwrap();
    let lo = g.add_const("lo", Tensor::scalar(-1f32));
    y = g
        .add_node(Op::Clip, "", &[Some(y), Some(lo), None], None)
        .unwrap()[0];
    let half = g.add(Op::Cast { to: DType::F16 }, "", &[y]).unwrap();
    y = g.add(Op::Cast { to: DType::F32 }, "", &[half]).unwrap();
    y = g.add(Op::Softmax { axis: 3 }, "", &[y]).unwrap();
    let yt = g
        .add(
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            "",
            &[y],
        )
        .unwrap();
    y = g
        .add_node(
            Op::Attention { scale: 0.5 },
            "",
            &[Some(y), Some(yt), Some(y), None],
            None,
        )
        .unwrap()[0];
    y = g.add(Op::LogSoftmax { axis: 1 }, "", &[y]).unwrap();
    let scale = g.add_const("s", Tensor::from_vec(&[4], vec![1f32; 4]).unwrap());
    y = g
        .add(
            Op::BatchNorm { epsilon: 1e-5 },
            "",
            &[y, scale, b, b, scale],
        )
        .unwrap();
    y = g
        .add(Op::InstanceNorm { epsilon: 1e-5 }, "", &[y, scale, b])
        .unwrap();
    let ln_scale = g.add_const("ln", Tensor::from_vec(&[6], vec![1f32; 6]).unwrap());
    let ln = g
        .add_node(
            Op::LayerNorm {
                axis: 3,
                epsilon: 1e-5,
            },
            "ln",
            &[Some(y), Some(ln_scale), None],
            None,
        )
        .unwrap();
    y = g
        .add(
            Op::Lrn {
                size: 3,
                alpha: 1e-4,
                beta: 0.75,
                bias: 1.0,
            },
            "",
            &[ln[0]],
        )
        .unwrap();
    let pool = PoolAttrs {
        kernel: vec![2, 2],
        strides: vec![2, 2],
        pads: vec![0, 0, 1, 1],
        dilations: vec![1, 1],
        ceil_mode: true,
    };
    let mp = g
        .add_node(
            Op::MaxPool {
                pool: pool.clone(),
                col_major: true,
            },
            "mp",
            &[Some(y)],
            None,
        )
        .unwrap()[0];
    g.add(
        Op::MaxPool {
            pool: pool.clone(),
            col_major: false,
        },
        "",
        &[y],
    )
    .unwrap();
    let ap = g
        .add(
            Op::AveragePool {
                pool,
                count_include_pad: true,
            },
            "",
            &[y],
        )
        .unwrap();
    g.add(Op::GlobalAveragePool, "", &[mp]).unwrap();
    g.add(Op::GlobalMaxPool, "", &[ap]).unwrap();
    for kind in [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::SumSquare,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
    ] {
        g.add(
            Op::Reduce {
                kind,
                axes: vec![1, 3],
                keepdims: kind == ReduceKind::Sum,
            },
            "",
            &[y],
        )
        .unwrap();
    }
    g.add(
        Op::Arg {
            max: true,
            axis: 1,
            keepdims: true,
            select_last_index: false,
        },
        "",
        &[y],
    )
    .unwrap();
    g.add(
        Op::Arg {
            max: false,
            axis: 2,
            keepdims: false,
            select_last_index: true,
        },
        "",
        &[y],
    )
    .unwrap();
    let r = g.add(Op::Reshape { shape: vec![4, 36] }, "", &[y]).unwrap();
    let tr = g.add(Op::Transpose { perm: vec![1, 0] }, "", &[r]).unwrap();
    let mm = g.add(Op::MatMul, "", &[tr, m]).unwrap();
    let gm = g
        .add_node(
            Op::Gemm {
                alpha: 0.5,
                beta: 2.0,
                trans_a: true,
                trans_b: false,
            },
            "",
            &[Some(r), Some(m), None],
            None,
        )
        .unwrap()[0];
    g.add(Op::MatMul, "", &[mm, tr]).unwrap_err();
    let cat = g.add(Op::Concat { axis: 0 }, "", &[gm, gm]).unwrap();
    let parts = g
        .add_node(
            Op::Split {
                axis: 0,
                sizes: vec![30, 42],
            },
            "split",
            &[Some(cat)],
            None,
        )
        .unwrap();
    let sl = g
        .add(
            Op::Slice {
                starts: vec![4, 0],
                steps: vec![-2, 3],
                lens: vec![2, 3],
            },
            "",
            &[parts[1]],
        )
        .unwrap();
    let ga = g.add(Op::Gather { axis: 1 }, "", &[sl, idx]).unwrap();
    let gi = g.add_const("gi", Tensor::from_vec(&[2, 1], vec![1i64, 0]).unwrap());
    g.add(Op::GatherElements { axis: 0 }, "", &[ga, gi])
        .unwrap();
    let ex = g
        .add(
            Op::Expand {
                shape: vec![3, 2, 2],
            },
            "",
            &[ga],
        )
        .unwrap();
    let ti = g
        .add(
            Op::Tile {
                repeats: vec![1, 2, 1],
            },
            "",
            &[ex],
        )
        .unwrap();
    g.add(
        Op::Pad {
            pads: vec![0, 1, -1, 0, 0, 2],
            mode: PadMode::Reflect,
            value: 0.0,
        },
        "",
        &[ti],
    )
    .unwrap();
    g.add(
        Op::Trilu {
            upper: false,
            k: -1,
        },
        "",
        &[ti],
    )
    .unwrap();
    for kind in [Accumulate::Sum, Accumulate::Prod] {
        let op = Op::Cumulative(CumulativeAttrs {
            kind,
            axis: 1,
            exclusive: true,
            reverse: false,
        });
        g.add(op, "", &[ti]).unwrap();
    }
    let topk = g
        .add_node(
            Op::TopK {
                axis: 1,
                k: 2,
                largest: false,
                sorted: true,
            },
            "topk",
            &[Some(ti)],
            None,
        )
        .unwrap();
    let nd = g.add_const("nd", Tensor::from_vec(&[2, 1], vec![0i64, 2]).unwrap());
    g.add(Op::GatherNd { batch_dims: 0 }, "", &[ti, nd])
        .unwrap();
    let upd = g
        .add(Op::GatherNd { batch_dims: 0 }, "", &[ti, nd])
        .unwrap();
    g.add(
        Op::ScatterNd {
            reduction: ScatterReduction::Add,
        },
        "",
        &[ti, nd, upd],
    )
    .unwrap();
    g.add(
        Op::ScatterElements {
            axis: 1,
            reduction: ScatterReduction::None,
        },
        "",
        &[ti, topk[1], topk[0]],
    )
    .unwrap();
    let grid = g.add_const(
        "grid",
        Tensor::from_vec(&[1, 2, 2, 2], vec![-1f32, -1., 0.5, 0.5, 0., 0., 1., 1.]).unwrap(),
    );
    g.add(
        Op::GridSample {
            mode: ResizeMode::Cubic,
            padding: GridPadding::Reflection,
            align_corners: true,
        },
        "",
        &[y, grid],
    )
    .unwrap();
    let rs = ResizeAttrs {
        mode: ResizeMode::Cubic,
        coord: CoordMode::TfCropAndResize,
        nearest: NearestMode::RoundPreferCeil,
        cubic_coeff_a: -0.5,
        exclude_outside: true,
        extrapolation_value: 10.0,
        antialias: false,
        scales: vec![1.0, 1.0, 2.0, 0.5],
        sizes: vec![1, 4, 12, 3],
        roi: vec![0.0, 0.0, 0.1, 0.2, 1.0, 1.0, 0.9, 0.8],
    };
    let big_y = g.add(Op::Resize(rs), "", &[y]).unwrap();
    let d2s = g
        .add(Op::SpaceToDepth { blocksize: 3 }, "", &[big_y])
        .unwrap();
    let s2d_in = g
        .add(
            Op::Reshape {
                shape: vec![1, 4, 6, 6],
            },
            "",
            &[y],
        )
        .unwrap();
    let s2d = g
        .add(Op::SpaceToDepth { blocksize: 2 }, "", &[s2d_in])
        .unwrap();
    let back = g
        .add(
            Op::DepthToSpace {
                blocksize: 2,
                crd: true,
            },
            "",
            &[s2d],
        )
        .unwrap();
    // The data-sized ops: each output at its bound, then the count.
    let nz = g.add_node(Op::NonZero, "nz", &[Some(m)], None).unwrap();
    let keep = g.add_const(
        "keep",
        Tensor::from_vec(&[3], vec![true, false, true]).unwrap(),
    );
    g.add_node(Op::Compress { axis: 1 }, "", &[Some(m), Some(keep)], None)
        .unwrap();
    let unique = Op::Unique {
        axis: 0,
        sorted: false,
    };
    g.add_node(unique, "", &[Some(m)], None).unwrap();
    let boxes = g.add_const("boxes", Tensor::zeros(&f32s(&[1, 4, 4])));
    let scores = g.add_const("scores", Tensor::zeros(&f32s(&[1, 2, 4])));
    let iou = g.add_const("iou", Tensor::from_vec(&[1], vec![0.5f32]).unwrap());
    g.add_node(
        nms_op(),
        "nms",
        &[Some(boxes), Some(scores), None, Some(iou)],
        None,
    )
    .unwrap();
    g.add_output("nonzero", nz[0]);
    g.add_output("y", back);
    g.add_output("mean", ln[0]);
    g.add_output("resized", d2s);
    g.add_output("parts0", parts[0]);
    g
}

#[test]
fn print_parse_print_is_identical() {
    let g = every_op();
    verify::verify(&g).unwrap();
    let text = print(&g);
    let parsed =
        parse(&text, &|name| g.const_by_name(name)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&parsed), text);
}

#[test]
fn every_op_name_appears() {
    let text = print(&every_op());
    for name in [
        "conv",
        "conv_transpose",
        "relu",
        "gelu",
        "is_nan",
        "is_inf",
        "not",
        "or",
        "and",
        "xor",
        "mod",
        "prelu",
        "equal",
        "less_or_equal",
        "sum",
        "mean",
        "max",
        "min",
        "where",
        "choose",
        "bit_cast",
        "clip",
        "cast",
        "softmax",
        "log_softmax",
        "batch_norm",
        "instance_norm",
        "layer_norm",
        "lrn",
        "max_pool",
        "average_pool",
        "global_average_pool",
        "global_max_pool",
        "reduce_log_sum_exp",
        "arg_max",
        "arg_min",
        "reshape",
        "transpose",
        "matmul",
        "gemm",
        "concat",
        "split",
        "slice",
        "gather",
        "gather_elements",
        "expand",
        "tile",
        "pad",
        "trilu",
        "cum_sum",
        "cum_prod",
        "resize",
        "space_to_depth",
        "depth_to_space",
        "top_k",
        "gather_nd",
        "scatter_nd",
        "scatter_elements",
        "grid_sample",
        "bit_not",
        "bit_and",
        "bit_or",
        "bit_xor",
        "bit_shift",
        "non_zero",
        "compress",
        "unique",
        "non_max_suppression",
    ] {
        assert!(
            text.contains(&format!("= {name}")),
            "{name} missing from\n{text}"
        );
    }
}

#[test]
fn parsed_graph_evaluates_like_the_original() {
    let mut g = Graph::new("small");
    let x = g.add_input("x", f32s(&[2, 3]));
    let c = g.add_const("c", Tensor::from_vec(&[3], vec![1f32, -2.0, 0.5]).unwrap());
    let y = g.add(Op::Binary(Binary::Mul), "mul", &[x, c]).unwrap();
    let z = g.add(Op::Softmax { axis: 1 }, "sm", &[y]).unwrap();
    g.add_output("z", z);
    let parsed = parse(&print(&g), &|_| None).unwrap();
    let input = Tensor::from_vec(&[2, 3], vec![0.1f32, 0.2, 0.3, -1.0, 2.0, 0.0]).unwrap();
    let inputs = [("x".to_string(), input)].into_iter().collect();
    assert_eq!(
        interp::run(&g, &inputs).unwrap(),
        interp::run(&parsed, &inputs).unwrap()
    );
}

/// Names come from model files: control characters print escaped (no raw escape sequence reaches a
/// terminal) and parse back to the same name.
#[test]
fn control_characters_in_names_print_escaped_and_round_trip() {
    let name = "x\u{1b}[31mred\u{7}\t\"q\"\\";
    let mut g = Graph::new("g\u{1b}]0;title\u{7}");
    let x = g.add_input(name, f32s(&[2]));
    let y = g.add(Op::Unary(Unary::Neg), "n\u{0}eg", &[x]).unwrap();
    g.add_output(name, y);
    let text = print(&g);
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{text:?}"
    );
    assert!(text.contains("\\u{1b}[31mred"), "{text}");
    let back = parse(&text, &|_| None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&back), text);
    assert_eq!(back.name, g.name);
}

#[test]
fn parse_errors_name_their_line() {
    let cases = [
        (
            "graph @g(%x: f32[2]) {\n  %0: f32[2] = frobnicate %x\n  return %0 @\"y\"\n}",
            2,
            "unknown op",
        ),
        (
            "graph @g(%x: f32[2]) {\n  %0: f32[2] = relu %nope\n  return %0 @\"y\"\n}",
            2,
            "not defined",
        ),
        (
            "graph @g(%x: f32[2]) {\n  %0: f32[3] = relu %x\n  return %0 @\"y\"\n}",
            0,
            "inferred",
        ),
        (
            "graph @g(%x: f32[2]) {\n  %0: f32[2] = leaky_relu %x\n  return %0 @\"y\"\n}",
            2,
            "missing attribute",
        ),
        (
            "graph @g(%x: f32[2]) {\n  %0: f32[9,9] = const @\"w\"\n  return %0 @\"y\"\n}",
            2,
            "no data",
        ),
        (
            "graph @g(%x: q7[2]) {\n  return %x @\"y\"\n}",
            1,
            "unknown dtype",
        ),
    ];
    for (src, line, msg) in cases {
        let e = parse(src, &|_| None).expect_err(src).to_string();
        assert!(e.contains(msg), "{e} should mention {msg}");
        if line > 0 {
            assert!(
                e.starts_with(&format!("line {line}:")),
                "{e} should be on line {line}"
            );
        }
    }
}

#[test]
fn verifier_reports_every_problem() {
    let mut g = Graph::new("bad");
    let x = g.add_input("x", f32s(&[2]));
    let a = g.add_raw(
        Op::Unary(Unary::Relu),
        "a".into(),
        &[Some(x)],
        vec![f32s(&[3])],
    );
    let b = g.add_raw(
        Op::Binary(Binary::Add),
        "b".into(),
        &[Some(x), None],
        vec![f32s(&[2])],
    );
    g.add_output("a", Value { node: a, output: 0 });
    g.add_output("b", Value { node: b, output: 0 });
    let IrError::Verify(errs) = verify::verify(&g).unwrap_err() else {
        panic!()
    };
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("'a'") && errs[1].contains("'b'"),
        "{errs:?}"
    );
}

#[test]
fn constants_print_inline_only_when_small() {
    let mut g = Graph::new("c");
    let small = g.add_const("small", Tensor::from_vec(&[2], vec![true, false]).unwrap());
    let large = g.add_const("large", Tensor::zeros(&f32s(&[5])));
    g.add_output("s", small);
    g.add_output("l", large);
    let text = print(&g);
    assert!(
        text.contains("%0: bool[2] = const [true, false] @\"small\""),
        "{text}"
    );
    assert!(text.contains("%1: f32[5] = const @\"large\""), "{text}");
    let back = parse(&text, &|n| {
        (n == "large").then(|| Arc::new(Tensor::zeros(&f32s(&[5]))))
    })
    .unwrap();
    assert_eq!(print(&back), text);
}
