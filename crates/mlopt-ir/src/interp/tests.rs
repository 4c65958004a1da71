//! Interpreter semantics, as data: each case is a small graph in the text format, its inputs, and the
//! expected output (or error). ONNX's own node tests (`cargo xtask conformance`) cover each op more
//! broadly; these pin down the corners ONNX semantics are precise about.

use crate::parse::parse;
use crate::{interp, DType, Tensor};
use half::f16;

/// A case: name, named inputs, the graph's node lines, and the expected output (or error text).
type Case<E> = (&'static str, Vec<(&'static str, Tensor)>, &'static str, E);

fn t<T: crate::Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

/// Runs `body` (the graph's node lines) with inputs `%a` (and `%b`), returning output `y` or the error.
fn eval(inputs: &[(&str, Tensor)], body: &str) -> Result<Tensor, String> {
    let header: Vec<String> = inputs
        .iter()
        .map(|(n, v)| format!("%{n}: {}", v.ty()))
        .collect();
    let src = format!(
        "graph @t({}) {{\n{body}\n  return %y @\"y\"\n}}",
        header.join(", ")
    );
    let g = parse(&src, &|_| None).map_err(|e| e.to_string())?;
    let ins = inputs
        .iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect();
    interp::run(&g, &ins)
        .map(|mut o| o.remove(0).1)
        .map_err(|e| e.to_string())
}

fn close(a: &Tensor, b: &Tensor) -> bool {
    a.ty() == b.ty()
        && a.to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

#[test]
fn semantics() {
    let nan = f32::NAN;
    let cases: Vec<Case<Tensor>> = vec![
        ("broadcast both ways", vec![("a", t(&[2, 1, 3], vec![0f32, 1., 2., 3., 4., 5.])), ("b", t(&[2, 1], vec![10f32, 20.]))],
         "  %y: f32[2,2,3] = add %a, %b", t(&[2, 2, 3], vec![10f32, 11., 12., 20., 21., 22., 13., 14., 15., 23., 24., 25.])),
        ("integer division truncates", vec![("a", t(&[4], vec![-7i32, 7, -7, 7])), ("b", t(&[4], vec![2i32, -2, -2, 2]))],
         "  %y: i32[4] = div %a, %b", t(&[4], vec![-3i32, -3, 3, 3])),
        ("mod takes the divisor's sign", vec![("a", t(&[2], vec![-7i64, 7])), ("b", t(&[2], vec![3i64, -3]))],
         "  %y: i64[2] = mod[fmod=0] %a, %b", t(&[2], vec![2i64, -2])),
        ("fmod takes the dividend's sign", vec![("a", t(&[2], vec![-7.5f32, 7.5])), ("b", t(&[2], vec![2f32, -2.]))],
         "  %y: f32[2] = mod[fmod=1] %a, %b", t(&[2], vec![-1.5f32, 1.5])),
        ("integer add wraps", vec![("a", t(&[1], vec![127i8])), ("b", t(&[1], vec![1i8]))],
         "  %y: i8[1] = add %a, %b", t(&[1], vec![-128i8])),
        ("max propagates NaN", vec![("a", t(&[2], vec![nan, 1.])), ("b", t(&[2], vec![1f32, nan]))],
         "  %y: f32[2] = max %a, %b", t(&[2], vec![nan, nan])),
        ("relu keeps NaN", vec![("a", t(&[2], vec![nan, -1.]))], "  %y: f32[2] = relu %a", t(&[2], vec![nan, 0.])),
        ("clip keeps NaN and applies min then max", vec![("a", t(&[3], vec![nan, -5., 5.]))],
         "  %lo: f32[] = const [2.0]\n  %hi: f32[] = const [1.0]\n  %y: f32[3] = clip %a, %lo, %hi", t(&[3], vec![nan, 1., 1.])),
        ("argmax picks the first NaN", vec![("a", t(&[4], vec![1f32, nan, 3., nan]))],
         "  %y: i64[] = arg_max[axis=0, keepdims=0, select_last_index=0] %a", t(&[], vec![1i64])),
        ("argmax select_last_index", vec![("a", t(&[4], vec![3f32, 1., 3., 2.]))],
         "  %y: i64[1] = arg_max[axis=0, keepdims=1, select_last_index=1] %a", t(&[1], vec![2i64])),
        ("round is half to even", vec![("a", t(&[6], vec![0.5f32, 1.5, 2.5, -0.5, -1.5, 2.4]))],
         "  %y: f32[6] = round %a", t(&[6], vec![0f32, 2., 2., -0., -2., 2.])),
        ("cast truncates toward zero", vec![("a", t(&[4], vec![-1.9f32, 1.9, 1e10, nan]))],
         "  %y: i32[4] = cast[to=i32] %a", t(&[4], vec![-1i32, 1, i32::MAX, 0])),
        ("f16 results are rounded to f16", vec![("a", t(&[1], vec![f16::from_f32(1.0)])), ("b", t(&[1], vec![f16::from_f32(0.0004)]))],
         "  %y: f16[1] = add %a, %b", t(&[1], vec![f16::from_f32(1.0)])),
        ("ceil_mode keeps a window starting inside", vec![("a", t(&[1, 1, 1, 5], vec![1f32, 2., 3., 4., 5.]))],
         "  %y: f32[1,1,1,3] = max_pool[ceil_mode=1, col_major=0, dilations=[1,1], kernel=[1,2], pads=[0,0,0,0], strides=[1,2]] %a",
         t(&[1, 1, 1, 3], vec![2f32, 4., 5.])),
        ("ceil_mode drops a window starting in the padding", vec![("a", t(&[1, 1, 1, 4], vec![1f32, 2., 3., 4.]))],
         "  %y: f32[1,1,1,2] = max_pool[ceil_mode=1, col_major=0, dilations=[1,1], kernel=[1,2], pads=[0,0,0,1], strides=[1,3]] %a",
         t(&[1, 1, 1, 2], vec![2f32, 4.])),
        ("average excludes pads", vec![("a", t(&[1, 1, 2, 2], vec![4f32; 4]))],
         "  %y: f32[1,1,3,3] = average_pool[ceil_mode=0, count_include_pad=0, dilations=[1,1], kernel=[2,2], pads=[1,1,1,1], strides=[1,1]] %a",
         t(&[1, 1, 3, 3], vec![4f32; 9])),
        ("average includes pads", vec![("a", t(&[1, 1, 2, 2], vec![4f32; 4]))],
         "  %y: f32[1,1,3,3] = average_pool[ceil_mode=0, count_include_pad=1, dilations=[1,1], kernel=[2,2], pads=[1,1,1,1], strides=[1,1]] %a",
         t(&[1, 1, 3, 3], vec![1f32, 2., 1., 2., 4., 2., 1., 2., 1.])),
        ("dilated conv", vec![("a", t(&[1, 1, 1, 5], vec![1f32, 2., 3., 4., 5.]))],
         "  %w: f32[1,1,1,2] = const [1.0, 10.0]\n  %y: f32[1,1,1,3] = conv[dilations=[1,2], group=1, pads=[0,0,0,0], strides=[1,1]] %a, %w",
         t(&[1, 1, 1, 3], vec![31f32, 42., 53.])),
        ("strided transposed conv", vec![("a", t(&[1, 1, 1, 2], vec![1f32, 2.]))],
         "  %w: f32[1,1,1,3] = const [1.0, 10.0, 100.0]\n  %y: f32[1,1,1,5] = conv_transpose[dilations=[1,1], group=1, output_padding=[0,0], pads=[0,0,0,0], strides=[1,2]] %a, %w",
         t(&[1, 1, 1, 5], vec![1f32, 10., 102., 20., 200.])),
        ("gather wraps negative indices", vec![("a", t(&[3], vec![10f32, 20., 30.]))],
         "  %i: i64[2] = const [-1, 0]\n  %y: f32[2] = gather[axis=0] %a, %i", t(&[2], vec![30f32, 10.])),
        ("slice with a negative step", vec![("a", t(&[5], vec![0f32, 1., 2., 3., 4.]))],
         "  %y: f32[2] = slice[lens=[2], starts=[4], steps=[-3]] %a", t(&[2], vec![4f32, 1.])),
        ("reflect and crop pads", vec![("a", t(&[4], vec![1f32, 2., 3., 4.]))],
         "  %y: f32[5] = pad[mode=reflect, pads=[2,-1], value=0.0] %a", t(&[5], vec![3f32, 2., 1., 2., 3.])),
        ("nearest round_prefer_ceil, asymmetric", vec![("a", t(&[1, 2], vec![1f32, 2.]))],
         "  %y: f32[1,4] = resize[antialias=0, coord=asymmetric, cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, mode=nearest, nearest=round_prefer_ceil, roi=[], scales=[1.0,2.0], sizes=[1,4]] %a",
         t(&[1, 4], vec![1f32, 2., 2., 2.])),
        ("linear half_pixel clamps at the edges", vec![("a", t(&[1, 2], vec![1f32, 3.]))],
         "  %y: f32[1,4] = resize[antialias=0, coord=half_pixel, cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, mode=linear, nearest=floor, roi=[], scales=[1.0,2.0], sizes=[1,4]] %a",
         t(&[1, 4], vec![1f32, 1.5, 2.5, 3.])),
        ("reduce over no values", vec![("a", t(&[2, 0], Vec::<f32>::new()))],
         "  %y: f32[2] = reduce_sum[axes=[1], keepdims=0] %a", t(&[2], vec![0f32, 0.])),
        ("softmax is stable for large inputs", vec![("a", t(&[3], vec![1000f32, 1000., -1000.]))],
         "  %y: f32[3] = softmax[axis=0] %a", t(&[3], vec![0.5f32, 0.5, 0.])),
        ("matmul promotes 1-D operands", vec![("a", t(&[2], vec![1f32, 2.])), ("b", t(&[2, 2, 3], (0..12).map(|v| v as f32).collect()))],
         "  %y: f32[2,3] = matmul %a, %b", t(&[2, 3], vec![6f32, 9., 12., 24., 27., 30.])),
        // The unsigned types compute as unsigned, their top bit included; the 16-bit ones wrap.
        ("u64 divides as unsigned", vec![("a", t(&[2], vec![(1u64 << 63) + 6, 7])), ("b", t(&[2], vec![2u64, 2]))],
         "  %y: u64[2] = div %a, %b", t(&[2], vec![(1u64 << 62) + 3, 3])),
        ("u64 compares as unsigned", vec![("a", t(&[2], vec![1u64 << 63, 1])), ("b", t(&[2], vec![1u64, 2]))],
         "  %y: bool[2] = greater %a, %b", t(&[2], vec![true, false])),
        ("u64 max and reduce_max", vec![("a", t(&[3], vec![u64::MAX, 1, 1 << 63]))],
         "  %y: u64[] = reduce_max[axes=[0], keepdims=0] %a", t(&[], vec![u64::MAX])),
        ("u64 shifts right logically", vec![("a", t(&[2], vec![u64::MAX, 8])), ("b", t(&[2], vec![60u64, 64]))],
         "  %y: u64[2] = bit_shift[left=0] %a, %b", t(&[2], vec![15u64, 0])),
        ("u64 converts to f32 as unsigned", vec![("a", t(&[1], vec![u64::MAX]))],
         "  %y: f32[1] = cast[to=f32] %a", t(&[1], vec![u64::MAX as f32])),
        ("u16 add wraps", vec![("a", t(&[1], vec![65535u16])), ("b", t(&[1], vec![2u16]))],
         "  %y: u16[1] = add %a, %b", t(&[1], vec![1u16])),
        ("i16 division truncates", vec![("a", t(&[2], vec![-7i16, i16::MIN])), ("b", t(&[2], vec![2i16, -1]))],
         "  %y: i16[2] = div %a, %b", t(&[2], vec![-3i16, i16::MIN])),
        ("u32 to i16 wraps", vec![("a", t(&[2], vec![70000u32, u32::MAX]))],
         "  %y: i16[2] = cast[to=i16] %a", t(&[2], vec![4464i16, -1])),
    ];
    for (name, inputs, body, want) in cases {
        match eval(&inputs, body) {
            // Integers exactly (a relative tolerance hides a wrong low bit of a u64).
            Ok(got) if !want.dtype().is_float() => {
                assert!(got.same_bits(&want), "{name}: got {got}, want {want}")
            }
            Ok(got) => assert!(close(&got, &want), "{name}: got {got}, want {want}"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

#[test]
fn errors() {
    let cases: Vec<Case<&str>> = vec![
        (
            "integer division by zero",
            vec![("a", t(&[1], vec![1i64])), ("b", t(&[1], vec![0i64]))],
            "  %y: i64[1] = div %a, %b",
            "integer division by zero",
        ),
        (
            "gather index out of range",
            vec![
                ("a", t(&[3], vec![1f32, 2., 3.])),
                ("i", t(&[1], vec![3i64])),
            ],
            "  %y: f32[1] = gather[axis=0] %a, %i",
            "index 3 out of range",
        ),
    ];
    // Constant indices out of range make an invalid graph: the verifier rejects it before any run.
    let e = eval(
        &[("a", t(&[3], vec![1f32, 2., 3.]))],
        "  %i: i64[1] = const [3]\n  %y: f32[1] = gather[axis=0] %a, %i",
    )
    .unwrap_err();
    assert!(
        e.contains("failed verification") && e.contains("index 3 out of range for axis of size 3"),
        "{e}"
    );
    for (name, inputs, body, msg) in cases {
        let e = eval(&inputs, body).expect_err(name);
        assert!(
            e.contains(msg) && e.contains("evaluating node"),
            "{name}: {e}"
        );
    }
    // An input of the wrong type is named.
    let e = eval(&[("a", t(&[2], vec![1f32, 2.]))], "  %y: f32[2] = relu %a").map(|_| ());
    assert!(e.is_ok());
    let src = "graph @t(%a: f32[2]) {\n  %y: f32[2] = relu %a\n  return %y @\"y\"\n}";
    let g = parse(src, &|_| None).unwrap();
    let bad = [("a".to_string(), t(&[3], vec![1f32, 2., 3.]))]
        .into_iter()
        .collect();
    let e = interp::run(&g, &bad).unwrap_err().to_string();
    assert!(e.contains("graph input 'a'") && e.contains("f32[3]"), "{e}");
    assert_eq!(DType::F32.size(), 4);
}

/// An output the process cannot allocate is an error, before the op runs: here an f32 Expand of
/// 2^61 elements (the limit `Vec` takes, past any machine).
#[test]
fn an_output_too_large_to_allocate_is_an_error() {
    let x = Tensor::from_vec(&[1], vec![1f32]).unwrap();
    let ty = crate::TensorType::new(DType::F32, vec![1 << 31, 1 << 30]);
    let op = crate::Op::Expand {
        shape: vec![1 << 31, 1 << 30],
    };
    let got = interp::eval_op(&op, &[Some(&x)], &[ty]);
    let msg = got.expect_err("allocated 8 EiB");
    assert!(
        msg.contains("cannot allocate") || msg.contains("too many elements"),
        "{msg}"
    );
}
