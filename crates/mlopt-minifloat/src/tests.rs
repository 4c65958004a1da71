use super::*;

const ALL: [Format; 5] = [
    Format::E4M3FN,
    Format::E4M3FNUZ,
    Format::E5M2,
    Format::E5M2FNUZ,
    Format::E2M1,
];

fn codes(f: Format) -> impl Iterator<Item = u8> {
    0..=((1u32 << (f.sign_shift() + 1)) - 1) as u8
}

#[test]
fn largest_values_are_the_specs() {
    let max: Vec<f64> = ALL.iter().map(|f| f.max()).collect();
    assert_eq!(max, [448.0, 240.0, 57344.0, 57344.0, 6.0]);
}

/// Every code that is a number encodes back to itself; NaN codes decode to NaN and encode to the
/// format's NaN.
#[test]
fn every_code_round_trips() {
    for f in ALL {
        for c in codes(f) {
            let v = f.decode(c);
            if v.is_nan() {
                assert!(f.decode(f.encode(f64::NAN)).is_nan() || f.special == Special::None);
                continue;
            }
            assert_eq!(f.encode(f64::from(v)), c, "{f:?}: code {c:#x} = {v}");
        }
    }
}

/// Halfway between two neighbouring codes rounds to the even one; a hair either side rounds to the
/// nearer.
#[test]
fn midpoints_round_to_even() {
    for f in ALL {
        let mut finite: Vec<(f64, u8)> = codes(f)
            .map(|c| (f64::from(f.decode(c)), c))
            .filter(|(v, _)| v.is_finite() && *v > 0.0)
            .collect();
        finite.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in finite.windows(2) {
            let ((lo, cl), (hi, ch)) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            let even = if cl % 2 == 0 { cl } else { ch };
            assert_eq!(f.encode(mid), even, "{f:?}: {mid} between {lo} and {hi}");
            assert_eq!(f.encode(mid - (hi - lo) / 64.0), cl);
            assert_eq!(f.encode(mid + (hi - lo) / 64.0), ch);
            assert_eq!(f.encode(-mid), even | (1 << f.sign_shift()));
        }
    }
}

/// What ml_dtypes (ONNX's reference) gives for the special values, read from it: NaN, infinities,
/// overflow, zeros of both signs, and a value far below the smallest.
#[test]
fn special_values_follow_the_reference() {
    let x = [
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e6,
        -1e6,
        0.0,
        -0.0,
        0.25,
        0.75,
        2.5,
        5.0,
        1e-7,
        -1e-7,
    ];
    let want: [(Format, [u8; 14]); 5] = [
        (Format::E2M1, [8, 0, 7, 15, 7, 15, 0, 8, 0, 2, 4, 6, 0, 8]),
        (
            Format::E4M3FN,
            [127, 255, 127, 255, 127, 255, 0, 128, 40, 52, 66, 74, 0, 128],
        ),
        (
            Format::E4M3FNUZ,
            [128, 128, 128, 128, 128, 128, 0, 0, 48, 60, 74, 82, 0, 0],
        ),
        (
            Format::E5M2,
            [126, 254, 124, 252, 124, 252, 0, 128, 52, 58, 65, 69, 0, 128],
        ),
        (
            Format::E5M2FNUZ,
            [128, 128, 128, 128, 128, 128, 0, 0, 56, 62, 69, 73, 0, 0],
        ),
    ];
    for (f, codes) in want {
        let got: Vec<u8> = x.iter().map(|&v| f.encode(v)).collect();
        assert_eq!(got, codes, "{f:?}");
    }
}

/// Past the largest value, rounding decides first: E4M3FN's 464 is halfway to the next (absent) code and
/// rounds down to 448's even code; 470 rounds up past it and overflows (ml_dtypes' codes).
#[test]
fn overflow_is_decided_after_rounding() {
    let x = [464.0, 470.0, -470.0];
    let want: [(Format, [u8; 3]); 5] = [
        (Format::E2M1, [7, 7, 15]),
        (Format::E4M3FN, [126, 127, 255]),
        (Format::E4M3FNUZ, [128, 128, 128]),
        (Format::E5M2, [95, 95, 223]),
        (Format::E5M2FNUZ, [99, 99, 227]),
    ];
    for (f, codes) in want {
        let got: Vec<u8> = x.iter().map(|&v| f.encode(v)).collect();
        assert_eq!(got, codes, "{f:?}");
    }
}
