//! Shape inference on attributes and sizes from a model file.

use crate::{DType, Graph, Op, TensorType};

/// Attributes from a model file at the ends of their ranges are errors, not arithmetic overflows.
#[test]
fn extreme_attributes_are_errors() {
    let cases: Vec<(Op, Vec<usize>)> = vec![
        (
            Op::Slice {
                starts: vec![0],
                steps: vec![i64::MIN],
                lens: vec![2],
            },
            vec![4],
        ),
        (
            Op::Slice {
                starts: vec![1],
                steps: vec![i64::MAX],
                lens: vec![3],
            },
            vec![4],
        ),
        (
            Op::Slice {
                starts: vec![0],
                steps: vec![1],
                lens: vec![usize::MAX],
            },
            vec![4],
        ),
        (
            Op::DepthToSpace {
                blocksize: usize::MAX / 2,
                crd: false,
            },
            vec![1, 4, 2, 2],
        ),
        (
            Op::DepthToSpace {
                blocksize: 1 << 33,
                crd: false,
            },
            vec![1, 4, 2, 2],
        ),
        (
            Op::SpaceToDepth {
                blocksize: usize::MAX,
            },
            vec![1, 4, usize::MAX, usize::MAX],
        ),
        (
            Op::Pad {
                pads: vec![i64::MAX, i64::MAX],
                mode: crate::PadMode::Constant,
                value: 0.0,
            },
            vec![4],
        ),
        (
            Op::MaxPool {
                pool: crate::PoolAttrs {
                    kernel: vec![3],
                    strides: vec![1],
                    pads: vec![usize::MAX, usize::MAX],
                    dilations: vec![1],
                    ceil_mode: true,
                },
                col_major: false,
            },
            vec![1, 1, 8],
        ),
        (
            Op::MaxPool {
                pool: crate::PoolAttrs {
                    kernel: vec![usize::MAX],
                    strides: vec![1],
                    pads: vec![0, 0],
                    dilations: vec![3],
                    ceil_mode: false,
                },
                col_major: false,
            },
            vec![1, 1, 8],
        ),
    ];
    for (op, shape) in cases {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, shape));
        assert!(g.add(op.clone(), "n", &[x]).is_err(), "{op:?}");
    }
}

/// A bf16 or f16 product with an f32 bias has an f32 result (precision lowering's widening form: the
/// sum is rounded once, by whatever narrows it later); an i16 product is an i32 one, its bias i32 (a
/// quantized model's integer contraction); any other mix of types is an error about the bias.
#[test]
fn narrow_products_widen_to_an_f32_bias() {
    use DType::{BF16, F16, F32, I16, I32};
    let conv = Op::Conv(crate::ConvAttrs {
        strides: vec![1, 1],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        group: 1,
        output_padding: vec![],
    });
    let gemm = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    // (op, operands' type, bias type, the result's type or None for an error)
    let cases = [
        (&conv, BF16, F32, Some(F32)),
        (&conv, F16, F32, Some(F32)),
        (&conv, BF16, BF16, Some(BF16)),
        (&conv, F32, F32, Some(F32)),
        (&conv, BF16, F16, None),
        (&conv, F32, BF16, None),
        (&gemm, BF16, F32, Some(F32)),
        (&gemm, F16, F16, Some(F16)),
        (&gemm, F32, F16, None),
        (&conv, I16, I32, Some(I32)),
        (&conv, I16, I16, None),
        (&gemm, I16, I32, Some(I32)),
        (&gemm, I16, F32, None),
    ];
    for (op, operands, bias, want) in cases {
        let (x, w) = match op {
            Op::Conv(_) => (vec![1, 8, 4, 4], vec![16, 8, 1, 1]),
            _ => (vec![4, 8], vec![16, 8]),
        };
        let x = TensorType::new(operands, x);
        let w = TensorType::new(operands, w);
        let b = TensorType::new(bias, vec![16]);
        let got = crate::infer::infer(op, &[Some(&x), Some(&w), Some(&b)]);
        if bias == I32 {
            // Without a bias too.
            let plain = crate::infer::infer(op, &[Some(&x), Some(&w)]);
            assert_eq!(plain.map(|o| o[0].dtype), Ok(I32), "{op:?} {operands}");
        }
        match want {
            Some(t) => assert_eq!(got.map(|o| o[0].dtype), Ok(t), "{op:?} {operands} {bias}"),
            None => assert_eq!(
                got.map_err(|e| e.input),
                Err(Some(2)),
                "{op:?} {operands} {bias}"
            ),
        }
    }
}
