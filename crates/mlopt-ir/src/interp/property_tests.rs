//! Properties of the interpreter on random shapes and values: what shape inference promises, evaluation
//! delivers, and ops that undo each other do.

use crate::{infer::infer, interp::eval_op, Binary, DType, Op, Tensor, TensorType, Unary};
use proptest::prelude::*;

/// A shape of rank 0..=4 with dims 0..=4 (zero-sized dims included on purpose).
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..=4, 0..=4)
}

fn tensor(shape: Vec<usize>) -> impl Strategy<Value = Tensor> {
    let n: usize = shape.iter().product();
    prop::collection::vec(-100i32..100, n).prop_map(move |v| {
        Tensor::from_vec(&shape, v.into_iter().map(|x| x as f32 / 8.0).collect()).unwrap()
    })
}

/// Two shapes that broadcast: the second is the first with some dims set to 1 or dropped from the front.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape().prop_flat_map(|a| {
        let r = a.len();
        (
            Just(a.clone()),
            prop::collection::vec(any::<bool>(), r),
            0..=r,
        )
            .prop_map(|(a, ones, drop)| {
                let b: Vec<usize> = a
                    .iter()
                    .zip(&ones)
                    .map(|(&d, &one)| if one { 1 } else { d })
                    .skip(drop)
                    .collect();
                (a, b)
            })
    })
}

fn run(op: &Op, inputs: &[&Tensor]) -> Vec<Tensor> {
    let tys: Vec<TensorType> = inputs.iter().map(|t| t.ty()).collect();
    let refs: Vec<Option<&TensorType>> = tys.iter().map(Some).collect();
    let outs = infer(op, &refs).unwrap();
    let args: Vec<Option<&Tensor>> = inputs.iter().copied().map(Some).collect();
    let got = eval_op(op, &args, &outs).unwrap();
    let got_tys: Vec<TensorType> = got.iter().map(|t| t.ty()).collect();
    assert_eq!(got_tys, outs, "{op:?}");
    got
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn broadcasting_ops_commute_and_match_inference(((a, b), swap) in broadcast_pair().prop_flat_map(|(a, b)| ((tensor(a), tensor(b)), any::<bool>()))) {
        let (x, y) = if swap { (b, a) } else { (a, b) };
        for op in [Binary::Add, Binary::Mul] {
            let xy = run(&Op::Binary(op), &[&x, &y]);
            let yx = run(&Op::Binary(op), &[&y, &x]);
            prop_assert_eq!(&xy, &yx);
        }
        let lt = run(&Op::Binary(Binary::Less), &[&x, &y]);
        let ge = run(&Op::Binary(Binary::GreaterOrEqual), &[&x, &y]);
        let not_lt = run(&Op::Unary(Unary::Not), &[&lt[0]]);
        prop_assert_eq!(&not_lt[0], &ge[0]);
    }

    #[test]
    fn transpose_then_inverse_is_identity(x in shape().prop_flat_map(tensor), seed in any::<u64>()) {
        let r = x.shape().len();
        let mut perm: Vec<usize> = (0..r).collect();
        // A seeded Fisher-Yates shuffle.
        let mut s = seed;
        for i in (1..r).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut inv = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        let t = run(&Op::Transpose { perm }, &[&x]);
        let back = run(&Op::Transpose { perm: inv }, &[&t[0]]);
        prop_assert_eq!(&back[0], &x);
    }

    #[test]
    fn concat_then_split_returns_the_parts(shapes in shape().prop_filter("rank >= 1", |s| !s.is_empty()).prop_flat_map(|s| {
        let r = s.len();
        (Just(s), 0..r, prop::collection::vec(0usize..=3, 1..=3))
    }), seed in any::<i32>()) {
        let (base, axis, sizes) = shapes;
        let parts: Vec<Tensor> = sizes.iter().enumerate().map(|(k, &n)| {
            let mut s = base.clone();
            s[axis] = n;
            let count: usize = s.iter().product();
            Tensor::from_vec(&s, (0..count).map(|i| (i as i32).wrapping_mul(31).wrapping_add(seed.wrapping_add(k as i32))).collect()).unwrap()
        }).collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let joined = run(&Op::Concat { axis }, &refs);
        let split = run(&Op::Split { axis, sizes }, &[&joined[0]]);
        prop_assert_eq!(split, parts);
    }

    #[test]
    fn reversing_slice_twice_is_identity(x in shape().prop_flat_map(tensor)) {
        let s = x.shape().to_vec();
        let starts: Vec<usize> = s.iter().map(|&d| d.saturating_sub(1)).collect();
        let op = Op::Slice { starts, steps: vec![-1; s.len()], lens: s.clone() };
        let once = run(&op, &[&x]);
        let twice = run(&op, &[&once[0]]);
        prop_assert_eq!(&twice[0], &x);
    }

    #[test]
    fn reduce_sum_matches_matmul_with_ones(x in (1usize..=4, 1usize..=5).prop_flat_map(|(m, k)| tensor(vec![m, k]))) {
        let k = x.shape()[1];
        let ones = Tensor::full(&TensorType::new(DType::F32, vec![k, 1]), 1.0);
        let mm = run(&Op::MatMul, &[&x, &ones]);
        let rs = run(&Op::Reduce { kind: crate::ReduceKind::Sum, axes: vec![1], keepdims: true }, &[&x]);
        // Values are multiples of 1/8 below 2^10: both sums are exact.
        prop_assert_eq!(&mm[0], &rs[0]);
    }

    #[test]
    fn f16_results_are_the_rounded_f32_results(x in shape().prop_flat_map(tensor)) {
        let h = x.cast(DType::F16);
        let wide = run(&Op::Unary(Unary::Exp), &[&h.cast(DType::F32)]);
        let narrow = run(&Op::Unary(Unary::Exp), &[&h]);
        prop_assert_eq!(&narrow[0], &wide[0].cast(DType::F16));
    }
}
