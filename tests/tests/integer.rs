//! Integer contractions (quantized models): `mma` blocks on i16 pairs with i32 sums, compiled for each
//! x86 integer dot product (`vpmaddwd` + `vpaddd` on ymm and zmm, `vpdpwssd`) and run where this CPU
//! can, bit for bit against the kernel IR's interpreter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_target::Target;

mod common;
use common::{io, run_code};

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

/// An integer contraction as the rewrite writes it for a quantized model: `x - zx` widened to i16
/// (`x` u8 activations), times an i16 constant weight, summed in i32 with an i32 bias.
fn integer_graph(case: &Case) -> mlopt_ir::Graph {
    use mlopt_ir::{Binary, DType, Graph, Op, Tensor, TensorType};
    let mut g = Graph::new("int");
    let mut lcg = 0x2545_F491_4F6C_DD1Du64 ^ case.seed;
    let mut next = move |m: u64| {
        lcg = lcg
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((lcg >> 33) % m) as i64
    };
    let (x_shape, w_shape) = match case.op {
        Shape::Conv { n, c, m, hw, k, .. } => (vec![n, c, hw, hw], vec![m, c, k, k]),
        Shape::MatMul { m, k, n } => (vec![m, k], vec![k, n]),
    };
    let x = g.add_input("x", TensorType::new(DType::U8, x_shape));
    let wn: usize = w_shape.iter().product();
    let wv: Vec<i16> = (0..wn).map(|_| (next(255) - 127) as i16).collect();
    let w = g.add_const("w", Tensor::from_vec(&w_shape, wv).unwrap());
    let zx = g.add_const("zx", Tensor::from_vec(&[], vec![case.zero as i16]).unwrap());
    let wide = g.add(Op::Cast { to: DType::I16 }, "widen", &[x]).unwrap();
    let centred = g
        .add(Op::Binary(Binary::Sub), "centre", &[wide, zx])
        .unwrap();
    let y = match case.op {
        Shape::Conv { m, k, stride, .. } => {
            let bv: Vec<i32> = (0..m).map(|_| next(20001) as i32 - 10000).collect();
            let b = g.add_const("b", Tensor::from_vec(&[m], bv).unwrap());
            g.add(Op::Conv(same(k, stride)), "conv", &[centred, w, b])
                .unwrap()
        }
        Shape::MatMul { .. } => g.add(Op::MatMul, "matmul", &[centred, w]).unwrap(),
    };
    g.add_output("y", y);
    g
}

/// A 2-D convolution's attributes for a k x k window of stride `stride`, padded by k / 2.
fn same(k: usize, stride: usize) -> mlopt_ir::ConvAttrs {
    mlopt_ir::ConvAttrs {
        strides: vec![stride; 2],
        pads: vec![k / 2; 4],
        dilations: vec![1; 2],
        group: 1,
        output_padding: vec![],
    }
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Conv {
        n: usize,
        c: usize,
        m: usize,
        hw: usize,
        k: usize,
        stride: usize,
    },
    MatMul {
        m: usize,
        k: usize,
        n: usize,
    },
}

struct Case {
    op: Shape,
    zero: u8,
    seed: u64,
    /// Whether the contraction runs as `mma` blocks (else as the loops lowering wrote: too small).
    blocks: bool,
}

/// Integer convolutions and products of every shape class the fp32 path has (3x3, 1x1, strided, a
/// 3-channel 7x7 stem, a batch of two, few positions, a MatMul), compiled for this machine: the same
/// i32 results as the graph interpreter, exactly, and run on the integer dot product's blocks.
#[test]
fn integer_contractions_compile_exactly() {
    use Shape::*;
    let conv = |n, c, m, hw, k, stride| Conv {
        n,
        c,
        m,
        hw,
        k,
        stride,
    };
    let cases = [
        (conv(1, 32, 64, 14, 3, 1), 128, true),
        (conv(1, 64, 48, 9, 1, 1), 3, true),
        (conv(2, 24, 40, 11, 3, 2), 0, true),
        (conv(1, 3, 32, 20, 7, 2), 114, true),
        (conv(1, 128, 96, 4, 1, 1), 255, true),
        (conv(1, 64, 64, 7, 1, 2), 17, true),
        (MatMul { m: 9, k: 96, n: 40 }, 128, true),
        (
            MatMul {
                m: 64,
                k: 32,
                n: 64,
            },
            7,
            true,
        ),
        // Too shallow and narrow for blocks: the loops as written, still exact.
        (MatMul { m: 3, k: 6, n: 5 }, 1, false),
    ];
    for (i, (op, zero, blocks)) in cases.into_iter().enumerate() {
        let case = Case {
            op,
            zero,
            seed: i as u64,
            blocks,
        };
        let g = integer_graph(&case);
        let mut inputs = std::collections::HashMap::new();
        let x_ty = g.node(g.graph_inputs()[0]).outputs[0].clone();
        let mut s = 0x9E37_79B9u64 + i as u64;
        let xv: Vec<u8> = (0..x_ty.numel())
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                (s >> 56) as u8
            })
            .collect();
        inputs.insert(
            "x".to_string(),
            mlopt_ir::Tensor::from_vec(&x_ty.shape, xv).unwrap(),
        );
        let want = mlopt_ir::interp::run(&g, &inputs).unwrap();
        for threads in [1, 2] {
            let config = mlopt_rewrite::Config::new(
                Target::named(mlopt_target::runnable_level(), threads).unwrap(),
            );
            let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
            let text: String = c
                .program
                .kernels
                .iter()
                .map(mlopt_kir::print::kernel)
                .collect();
            let on_blocks = text.contains("mma<") && text.contains("i16[");
            assert_eq!(on_blocks, case.blocks, "{op:?}: mma blocks\n{text}");
            let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
            assert_eq!(want[0].1.ty(), got[0].1.ty(), "{op:?}");
            assert!(
                want[0].1.same_bits(&got[0].1),
                "{op:?} on {threads} threads: compiled differs from the interpreter"
            );
        }
    }
}

/// A QDQ graph as the importer writes one: `x` quantized to u8 (zero point 128) and dequantized, times
/// an i8 constant weight dequantized per output channel (a Conv's [M, C, k, k] or a MatMul's [K, N]).
fn qdq_graph(op: Shape) -> mlopt_ir::Graph {
    use mlopt_ir::{Binary, DType, Graph, Op, Tensor, TensorType, Unary};
    let mut g = Graph::new("qdq");
    let (x_shape, w_shape, s_shape) = match op {
        Shape::Conv { n, c, m, hw, k, .. } => {
            (vec![n, c, hw, hw], vec![m, c, k, k], vec![m, 1, 1, 1])
        }
        Shape::MatMul { m, k, n } => (vec![m, k], vec![k, n], vec![1, n]),
    };
    let x = g.add_input("x", TensorType::new(DType::F32, x_shape));
    let scalar = |g: &mut Graph, v: f32| g.add_const("", Tensor::scalar(v));
    let (ten, zero_point, lo, hi, tenth) = (
        scalar(&mut g, 10.0),
        scalar(&mut g, 128.0),
        scalar(&mut g, 0.0),
        scalar(&mut g, 255.0),
        scalar(&mut g, 0.1),
    );
    let add = |g: &mut Graph, op: Op, ins: &[mlopt_ir::Value]| g.add(op, "", ins).unwrap();
    let q = add(&mut g, Op::Binary(Binary::Mul), &[x, ten]);
    let q = add(&mut g, Op::Unary(Unary::Round), &[q]);
    let q = add(&mut g, Op::Binary(Binary::Add), &[q, zero_point]);
    let q = add(&mut g, Op::Clip, &[q, lo, hi]);
    let q = add(&mut g, Op::Cast { to: DType::U8 }, &[q]);
    let dx = add(&mut g, Op::Cast { to: DType::F32 }, &[q]);
    let dx = add(&mut g, Op::Binary(Binary::Sub), &[dx, zero_point]);
    let dx = add(&mut g, Op::Binary(Binary::Mul), &[dx, tenth]);
    let wn: usize = w_shape.iter().product();
    let wv: Vec<i8> = (0..wn).map(|i| ((i * 7919) % 255) as i16 as i8).collect();
    let wq = g.add_const("w", Tensor::from_vec(&w_shape, wv).unwrap());
    let sn: usize = s_shape.iter().product();
    let sv: Vec<f32> = (0..sn).map(|i| 0.001 + 0.0001 * (i % 7) as f32).collect();
    let sw = g.add_const("sw", Tensor::from_vec(&s_shape, sv).unwrap());
    let dw = add(&mut g, Op::Cast { to: DType::F32 }, &[wq]);
    let dw = add(&mut g, Op::Binary(Binary::Mul), &[dw, sw]);
    let y = match op {
        Shape::Conv { m, k, stride, .. } => {
            let b = g.add_const("b", Tensor::from_vec(&[m], vec![0.5f32; m]).unwrap());
            add(&mut g, Op::Conv(same(k, stride)), &[dx, dw, b])
        }
        Shape::MatMul { .. } => add(&mut g, Op::MatMul, &[dx, dw]),
    };
    g.add_output("y", y);
    g
}

/// QDQ convolutions and MatMuls are optimised into integer contractions, the 1x1 convolution of 64 to
/// 256 channels at 56x56 included (its scale and bias are priced as the epilogue they fuse into, not as
/// passes over memory: so priced, ResNet-50's expansions stayed in float), and the compiled model
/// computes what the QDQ graph does (the integer sums exact where the float graph rounds).
#[test]
fn qdq_contractions_are_chosen_in_integers() {
    let conv = |c, m, hw, k| Shape::Conv {
        n: 1,
        c,
        m,
        hw,
        k,
        stride: 1,
    };
    for op in [
        conv(64, 256, 56, 1),
        conv(64, 64, 56, 3),
        Shape::MatMul {
            m: 49,
            k: 256,
            n: 256,
        },
    ] {
        compile_qdq(op, true);
    }
}

/// Compiles `qdq_graph(op)`, checks whether it runs an integer contraction (`integer`), and that it
/// computes what the graph does.
fn compile_qdq(op: Shape, integer: bool) {
    let g = qdq_graph(op);
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 5);
    let want = mlopt_ir::interp::run(&g, &inputs).unwrap();
    let config =
        mlopt_rewrite::Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
    let plan = &c.optimized.plan.graph;
    let found = plan.node_ids().any(|n| {
        let node = plan.node(n);
        matches!(node.op, mlopt_ir::Op::Conv(_) | mlopt_ir::Op::MatMul)
            && node.outputs[0].dtype == mlopt_ir::DType::I32
    });
    assert_eq!(
        found,
        integer,
        "{op:?}: an integer contraction?\n{}",
        mlopt_ir::print::print(plan)
    );
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    let err = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(err < 1e-4, "{op:?}: error {err:e}");
}

/// A product so deep that its integer sum could pass i32 (128 x 128 x 140,000 > 2^31) stays in float:
/// the blocks' i32 sums would wrap.
#[test]
fn qdq_contractions_that_could_overflow_stay_float() {
    compile_qdq(
        Shape::MatMul {
            m: 1,
            k: 140_000,
            n: 16,
        },
        false,
    );
}

/// ONNX models of one QOperator node, built from protos as an exporter writes them.
mod qop {
    use mlopt_onnx::proto::*;

    pub fn tensor(name: &str, elem: i32, dims: &[usize], raw: Vec<u8>) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: elem,
            raw_data: raw,
            ..Default::default()
        }
    }

    pub fn f32s(name: &str, dims: &[usize], v: &[f32]) -> TensorProto {
        tensor(
            name,
            data_type::FLOAT,
            dims,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INTS,
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    pub fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INT,
            i: v,
            ..Default::default()
        }
    }

    fn value(name: &str, elem: i32, dims: &[usize]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: elem,
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn node(op: &str, ins: &[&str], out: &str, attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: out.into(),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            attribute: attrs,
            ..Default::default()
        }
    }

    /// One node `op` over input `x` (u8, `dims`) and the initializers, with output `y`.
    pub fn model(
        op: &str,
        ins: &[&str],
        attrs: Vec<AttributeProto>,
        x: &[usize],
        inits: Vec<TensorProto>,
    ) -> ModelProto {
        graph(vec![node(op, ins, "y", attrs)], x, inits)
    }

    /// `nodes` over input `x` (u8, `dims`) and the initializers, with output `y`.
    pub fn graph(nodes: Vec<NodeProto>, x: &[usize], inits: Vec<TensorProto>) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                name: "g".into(),
                node: nodes,
                input: vec![value("x", data_type::UINT8, x)],
                output: vec![ValueInfoProto {
                    name: "y".into(),
                    ..Default::default()
                }],
                initializer: inits,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// Exact integer sums of an input, computed by loops.
type Sums = fn(&[u8]) -> Vec<i32>;

/// A QOperator case: the model, whether its contraction must run in integers (i32) or else in f32, and
/// the exact result of an integer-valued output (ConvInteger, MatMulInteger) computed here by loops.
struct QopCase {
    name: &'static str,
    model: mlopt_onnx::proto::ModelProto,
    integer: bool,
    reference: Option<Sums>,
}

fn i8_bytes(n: usize, seed: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 31) % 255) as i16 - 127) as i8 as u8)
        .collect()
}

// Shapes of the QOperator cases: x [1, C, H, H] (or [M, K]), 3x3 windows with padding 1.
const QC: usize = 16;
const QM: usize = 32;
const QH: usize = 7;
const QK: usize = 40;
const QN: usize = 24;
const QROWS: usize = 20;

/// ConvInteger over `x` (u8, zero point 3) and the i8 weight of `i8_bytes(.., 1)` less its zero
/// point -2, by loops: `group` groups, 3x3 windows, padding 1.
fn conv_integer_reference(x: &[u8], group: usize) -> Vec<i32> {
    let (cg, mg) = (QC / group, if group == 1 { QM } else { QC } / group);
    let m_all = mg * group;
    let w = i8_bytes(m_all * cg * 9, 1);
    let mut y = vec![0i32; m_all * QH * QH];
    for m in 0..m_all {
        let g = m / mg;
        for (oy, ox) in (0..QH).flat_map(|a| (0..QH).map(move |b| (a, b))) {
            let mut s = 0i32;
            for c in 0..cg {
                for (ky, kx) in (0..3).flat_map(|a| (0..3).map(move |b| (a, b))) {
                    let (iy, ix) = ((oy + ky) as isize - 1, (ox + kx) as isize - 1);
                    if iy < 0 || ix < 0 || iy >= QH as isize || ix >= QH as isize {
                        continue;
                    }
                    let xv = x[((g * cg + c) * QH + iy as usize) * QH + ix as usize] as i32 - 3;
                    let wv = w[((m * cg + c) * 3 + ky) * 3 + kx] as i8 as i32 + 2;
                    s += xv * wv;
                }
            }
            y[(m * QH + oy) * QH + ox] = s;
        }
    }
    y
}

/// MatMulInteger of `x` [ROWS, K] (u8, zero point per row: row % 5) by the i8 weight [K, N] of
/// `i8_bytes(.., 2)`, less its zero point per column (column % 3 - 1), by loops.
fn matmul_integer_reference(x: &[u8]) -> Vec<i32> {
    let w = i8_bytes(QK * QN, 2);
    let mut y = vec![0i32; QROWS * QN];
    for r in 0..QROWS {
        for n in 0..QN {
            y[r * QN + n] = (0..QK)
                .map(|k| {
                    (x[r * QK + k] as i32 - (r % 5) as i32)
                        * (w[k * QN + n] as i8 as i32 - ((n % 3) as i32 - 1))
                })
                .sum();
        }
    }
    y
}

fn qop_cases() -> Vec<QopCase> {
    use mlopt_onnx::proto::data_type::{INT32, INT8, UINT8};
    use qop::*;
    let conv = |group: usize, qlinear: bool| {
        let m = if group == 1 { QM } else { QC };
        let w = tensor(
            "w",
            INT8,
            &[m, QC / group, 3, 3],
            i8_bytes(m * QC / group * 9, 1),
        );
        let (xz, wz) = (
            tensor("xz", UINT8, &[], vec![3]),
            tensor("wz", INT8, &[], vec![(-2i8) as u8]),
        );
        let attrs = vec![ints("pads", &[1, 1, 1, 1]), int("group", group as i64)];
        let x = [1, QC, QH, QH];
        if !qlinear {
            return model(
                "ConvInteger",
                &["x", "w", "xz", "wz"],
                attrs,
                &x,
                vec![w, xz, wz],
            );
        }
        let ws: Vec<f32> = (0..m).map(|i| 0.01 + 0.001 * i as f32).collect();
        let bias: Vec<u8> = (0..m as i32)
            .flat_map(|i| (i * 97 - 900).to_le_bytes())
            .collect();
        let inits = vec![
            w,
            xz,
            wz,
            f32s("xs", &[], &[0.05]),
            f32s("ws", &[m], &ws),
            f32s("ys", &[], &[0.2]),
            tensor("yz", UINT8, &[], vec![128]),
            tensor("b", INT32, &[m], bias),
        ];
        model(
            "QLinearConv",
            &["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
            attrs,
            &x,
            inits,
        )
    };
    let matmul = |qlinear: bool| {
        let w = tensor("w", INT8, &[QK, QN], i8_bytes(QK * QN, 2));
        let x = [QROWS, QK];
        if !qlinear {
            let xz = tensor(
                "xz",
                UINT8,
                &[QROWS],
                (0..QROWS).map(|r| (r % 5) as u8).collect(),
            );
            let wz = tensor(
                "wz",
                INT8,
                &[QN],
                (0..QN).map(|n| ((n % 3) as i8 - 1) as u8).collect(),
            );
            return model(
                "MatMulInteger",
                &["x", "w", "xz", "wz"],
                vec![],
                &x,
                vec![w, xz, wz],
            );
        }
        let inits = vec![
            w,
            f32s("xs", &[], &[0.05]),
            tensor("xz", UINT8, &[], vec![7]),
            f32s("ws", &[], &[0.02]),
            tensor("wz", INT8, &[], vec![0]),
            f32s("ys", &[], &[0.3]),
            tensor("yz", UINT8, &[], vec![100]),
        ];
        model(
            "QLinearMatMul",
            &["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
            vec![],
            &x,
            inits,
        )
    };
    vec![
        QopCase {
            name: "ConvInteger",
            model: conv(1, false),
            integer: true,
            reference: Some(|x| conv_integer_reference(x, 1)),
        },
        QopCase {
            name: "ConvInteger depthwise",
            model: conv(QC, false),
            integer: false,
            reference: Some(|x| conv_integer_reference(x, QC)),
        },
        QopCase {
            name: "QLinearConv",
            model: conv(1, true),
            integer: true,
            reference: None,
        },
        QopCase {
            name: "QLinearConv depthwise",
            model: conv(QC, true),
            integer: false,
            reference: None,
        },
        QopCase {
            name: "MatMulInteger",
            model: matmul(false),
            integer: true,
            reference: Some(matmul_integer_reference),
        },
        QopCase {
            name: "QLinearMatMul",
            model: matmul(true),
            integer: true,
            reference: None,
        },
    ]
}

/// QOperator ops (QLinearConv, ConvInteger, QLinearMatMul, MatMulInteger) import as the integer
/// contractions the QDQ rule writes (i16 operands summed in i32, on the integer dot product's blocks),
/// a depthwise one as an f32 convolution (exact below 2^24, for the depthwise schedules); the compiled
/// model gives the interpreter's bits, and the integer outputs equal sums computed here by loops (per-row
/// and per-column zero points, a weight zero point, padding, groups).
#[test]
fn qoperator_contractions_run_in_integers() {
    for case in qop_cases() {
        let name = case.name;
        let g = mlopt_onnx::import_model(&case.model, None, "qop", &Default::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = mlopt_rewrite::optimize::random_inputs(&g, 3);
        let x = inputs["x"]
            .to_f64_vec()
            .iter()
            .map(|&v| v as u8)
            .collect::<Vec<_>>();
        let want = mlopt_ir::interp::run(&g, &inputs).unwrap();
        if let Some(reference) = case.reference {
            let exact = reference(&x);
            let got: Vec<i32> = want[0].1.to_f64_vec().iter().map(|&v| v as i32).collect();
            assert_eq!(got, exact, "{name}: the interpreter differs from the loops");
        }
        let config =
            mlopt_rewrite::Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
        let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
        let plan = &c.optimized.plan.graph;
        let sums: Vec<mlopt_ir::DType> = plan
            .node_ids()
            .filter(|&n| {
                matches!(
                    plan.node(n).op,
                    mlopt_ir::Op::Conv(_) | mlopt_ir::Op::MatMul
                )
            })
            .map(|n| plan.node(n).outputs[0].dtype)
            .collect();
        let expect = if case.integer {
            mlopt_ir::DType::I32
        } else {
            mlopt_ir::DType::F32
        };
        assert_eq!(sums, [expect], "{name}\n{}", mlopt_ir::print::print(plan));
        let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
        assert!(
            want[0].1.same_bits(&got[0].1),
            "{name}: compiled differs from the interpreter"
        );
    }
}

/// A float model of two convolutions (3x3 of 16 to 32 channels, ReLU, 1x1 of 32 to 32) for
/// `--precision int8`.
fn float_convs() -> mlopt_ir::Graph {
    use mlopt_ir::{DType, Graph, Op, Tensor, TensorType, Unary};
    let mut g = Graph::new("float");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 16, 12, 12]));
    let weights = |g: &mut Graph, name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.2).collect();
        g.add_const(name, Tensor::from_vec(shape, v).unwrap())
    };
    let (w1, w2) = (
        weights(&mut g, "w1", &[32, 16, 3, 3]),
        weights(&mut g, "w2", &[32, 32, 1, 1]),
    );
    let b = g.add_const("b", Tensor::from_vec(&[32], vec![0.1f32; 32]).unwrap());
    let y = g.add(Op::Conv(same(3, 1)), "c1", &[x, w1, b]).unwrap();
    let y = g.add(Op::Unary(Unary::Relu), "r", &[y]).unwrap();
    let y = g.add(Op::Conv(same(1, 1)), "c2", &[y, w2]).unwrap();
    g.add_output("y", y);
    g
}

/// `--precision int8`: mlopt quantizes a float model's contractions itself on ranges calibrated on the
/// given inputs; both convolutions run as integer contractions, the error against fp32 is reported per
/// output (non-zero: the values are quantized; small: the ranges fit), and the compiled model is within
/// that error. Without calibration inputs, or for a target without an integer dot product, a clear
/// error.
#[test]
fn int8_quantizes_float_contractions_on_calibrated_ranges() {
    use mlopt_rewrite::{Config, Precision};
    let g = float_convs();
    let mut config = Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
    config.precision = Precision::Int8;
    let missing = mlopt_rewrite::optimize(&g, &config)
        .unwrap_err()
        .to_string();
    assert!(missing.contains("--calibration"), "{missing}");
    config.calibration = (0..3)
        .map(|s| mlopt_rewrite::optimize::random_inputs(&g, s))
        .collect();
    let mut gpu = config.clone();
    gpu.target = Target::named("sm_80", 1).unwrap();
    let refused = mlopt_rewrite::optimize(&g, &gpu).unwrap_err().to_string();
    assert!(refused.contains("integer dot product"), "{refused}");
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config.clone())).unwrap();
    let stats = &c.optimized.stats;
    assert_eq!(stats.quantized, 2);
    let [(name, err)] = &stats.output_errors[..] else {
        panic!("one output's error: {:?}", stats.output_errors)
    };
    assert!(name == "y" && *err > 0.0 && *err < 0.03, "error {err:e}");
    let plan = &c.optimized.plan.graph;
    let integer = plan
        .node_ids()
        .filter(|&n| {
            matches!(plan.node(n).op, mlopt_ir::Op::Conv(_))
                && plan.node(n).outputs[0].dtype == mlopt_ir::DType::I32
        })
        .count();
    assert_eq!(integer, 2, "{}", mlopt_ir::print::print(plan));
    let inputs = &config.calibration[0];
    let want = mlopt_ir::interp::run(&g, inputs).unwrap();
    let got = c.run(&mut c.load().unwrap(), inputs).unwrap();
    let compiled = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(
        compiled <= err + 1e-4,
        "compiled error {compiled:e}, reported {err:e}"
    );
}

/// Two QLinearConvs with DequantizeLinear -> Relu -> QuantizeLinear between them at the first one's
/// output scale and zero point (ONNX Runtime's QOperator export of Conv -> Relu -> Conv): the
/// requantization cancels (`requantize-same-scale`: the ReLU becomes a max with the zero point on the
/// u8 values), so no float rounding is left in the plan, and the compiled model gives the
/// interpreter's bits.
#[test]
fn qoperator_requantization_between_convolutions_cancels() {
    use mlopt_onnx::proto::data_type::{INT8, UINT8};
    use qop::*;
    let conv = |i: usize, x: &str, y: &str| {
        let w = tensor(
            &format!("w{i}"),
            INT8,
            &[QC, QC, 3, 3],
            i8_bytes(QC * QC * 9, i),
        );
        let ins = [x, "s", "z", &format!("w{i}"), "ws", "wz", "s", "z"].map(String::from);
        let ins: Vec<&str> = ins.iter().map(String::as_str).collect();
        (
            node("QLinearConv", &ins, y, vec![ints("pads", &[1, 1, 1, 1])]),
            w,
        )
    };
    let (c1, w1) = conv(1, "x", "y1");
    let (c2, w2) = conv(2, "q1", "y");
    let nodes = vec![
        c1,
        node("DequantizeLinear", &["y1", "s", "z"], "d1", vec![]),
        node("Relu", &["d1"], "r1", vec![]),
        node("QuantizeLinear", &["r1", "s", "z"], "q1", vec![]),
        c2,
    ];
    let inits = vec![
        w1,
        w2,
        f32s("s", &[], &[0.05]),
        tensor("z", UINT8, &[], vec![120]),
        f32s("ws", &[], &[0.002]),
        tensor("wz", INT8, &[], vec![0]),
    ];
    let m = graph(nodes, &[1, QC, QH, QH], inits);
    let g = mlopt_onnx::import_model(&m, None, "chain", &Default::default()).unwrap();
    let inputs = mlopt_rewrite::optimize::random_inputs(&g, 4);
    let want = mlopt_ir::interp::run(&g, &inputs).unwrap();
    let config =
        mlopt_rewrite::Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
    let plan = &c.optimized.plan.graph;
    let rounds = plan
        .node_ids()
        .filter(|&n| plan.node(n).op == mlopt_ir::Op::Unary(mlopt_ir::Unary::Round))
        .count();
    // The two convolutions' own requantizing epilogues round; nothing else does.
    assert_eq!(rounds, 2, "{}", mlopt_ir::print::print(plan));
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    assert!(
        want[0].1.same_bits(&got[0].1),
        "compiled differs from the interpreter"
    );
}

/// A classifier's Gemm (weight transposed, a bias) quantized by `--precision int8` runs as an integer
/// Gemm, compiled within the error the optimiser reports.
#[test]
fn int8_gemm_runs_in_integers() {
    use mlopt_ir::{DType, Graph, Op, Tensor, TensorType};
    let mut g = Graph::new("gemm");
    // (Large enough that the integer product's arithmetic, not its quantize step, decides.)
    let x = g.add_input("x", TensorType::new(DType::F32, vec![64, 256]));
    let w: Vec<f32> = (0..128 * 256)
        .map(|i| (i as f32 * 0.21).sin() * 0.3)
        .collect();
    let w = g.add_const("w", Tensor::from_vec(&[128, 256], w).unwrap());
    let c = g.add_const("c", Tensor::from_vec(&[128], vec![0.25f32; 128]).unwrap());
    let gemm = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let y = g.add(gemm, "fc", &[x, w, c]).unwrap();
    g.add_output("y", y);
    let mut config =
        mlopt_rewrite::Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
    config.precision = mlopt_rewrite::Precision::Int8;
    config.calibration = (0..2)
        .map(|s| mlopt_rewrite::optimize::random_inputs(&g, s))
        .collect();
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config.clone())).unwrap();
    let plan = &c.optimized.plan.graph;
    assert!(
        plan.node_ids()
            .any(|n| matches!(plan.node(n).op, Op::Gemm { .. })
                && plan.node(n).outputs[0].dtype == DType::I32),
        "{}",
        mlopt_ir::print::print(plan)
    );
    let err = c.optimized.stats.precision_error.unwrap();
    let inputs = &config.calibration[1];
    let want = mlopt_ir::interp::run(&g, inputs).unwrap();
    let got = c.run(&mut c.load().unwrap(), inputs).unwrap();
    let compiled = mlopt_rewrite::optimize::scaled_error(&want[0].1, &got[0].1);
    assert!(
        err > 0.0 && compiled <= err + 1e-4,
        "compiled {compiled:e}, reported {err:e}"
    );
}

/// A quantize step's division by its scale stays a division (`div-const-to-mul` only takes powers of
/// two): on values whose quotient lies at or next to a rounding tie, a multiply by the rounded
/// reciprocal gave other integers than the interpreter and ONNX's reference.
#[test]
fn quantize_divides_exactly() {
    use mlopt_ir::{Binary, DType, Graph, Op, Tensor, TensorType, Unary};
    let n = 4096;
    let mut g = Graph::new("quantize");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![n]));
    let scalar = |g: &mut Graph, v: f32| g.add_const("", Tensor::scalar(v));
    let (s, z, lo, hi) = (
        scalar(&mut g, 0.0123),
        scalar(&mut g, 7.0),
        scalar(&mut g, 0.0),
        scalar(&mut g, 255.0),
    );
    let mut v = g.add(Op::Binary(Binary::Div), "q", &[x, s]).unwrap();
    v = g.add(Op::Unary(Unary::Round), "q", &[v]).unwrap();
    v = g.add(Op::Binary(Binary::Add), "q", &[v, z]).unwrap();
    v = g.add(Op::Clip, "q", &[v, lo, hi]).unwrap();
    v = g.add(Op::Cast { to: DType::U8 }, "q", &[v]).unwrap();
    g.add_output("y", v);
    // (k + 1/2) x scale, and its neighbours one ulp either side: quotients at the ties.
    let values: Vec<f32> = (0..n)
        .map(|i| {
            let t = ((i / 3) as f32 * 0.5 + 0.5) * 0.0123f32;
            match i % 3 {
                0 => t,
                1 => f32::from_bits(t.to_bits() + 1),
                _ => f32::from_bits(t.to_bits() - 1),
            }
        })
        .collect();
    let inputs = [("x".to_string(), Tensor::from_vec(&[n], values).unwrap())].into();
    let want = mlopt_ir::interp::run(&g, &inputs).unwrap();
    let config =
        mlopt_rewrite::Config::new(Target::named(mlopt_target::runnable_level(), 1).unwrap());
    let c = mlopt_driver::compile(&g, &mlopt_driver::Options::new(config)).unwrap();
    let got = c.run(&mut c.load().unwrap(), &inputs).unwrap();
    assert!(
        want[0].1.same_bits(&got[0].1),
        "compiled quantization differs from the interpreter"
    );
}
