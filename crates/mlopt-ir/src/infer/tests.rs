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
