//! The element types narrower than a byte's worth of range: ONNX's float8 kinds and float4 E2M1
//! (`mlopt_minifloat` formats), and int4, uint4, int2 and uint2. Each is stored one element per byte,
//! in tensors, in constants and in compiled code's buffers alike (ONNX files pack the 4-bit types two
//! and the 2-bit ones four to a byte; the importer unpacks them).
//!
//! The floats are computed in f32 as f16 and bf16 are, and converted with ONNX `Cast` semantics: to
//! the nearest code, ties to even, a value past the largest becoming infinity, NaN or the largest as the
//! format has them (`Cast`'s `saturate` is a clamp the importer adds before the cast). The 4- and
//! 2-bit integers wrap, as every integer cast does.

use crate::tensor::{Elem, Tensor};
use crate::DType;
use mlopt_minifloat::Format;
use ndarray::ArrayD;
use std::cmp::Ordering;
use std::fmt;

/// The `Elem` methods a one-byte type's storage takes: its `Tensor` variant, and its byte (`from_byte`
/// reads one back).
macro_rules! one_byte {
    ($t:ident, $from_byte:expr) => {
        fn wrap(a: ArrayD<Self>) -> Tensor {
            Tensor::$t(a)
        }
        fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
            match t {
                Tensor::$t(a) => Some(a),
                _ => None,
            }
        }
        fn write_le(self, out: &mut Vec<u8>) {
            out.push(self.0 as u8);
        }
        fn read_le(b: &[u8]) -> Self {
            $from_byte(b[0])
        }
    };
}

macro_rules! minifloat {
    ($(#[$doc:meta])* $t:ident, $format:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default)]
        pub struct $t(pub u8);

        impl $t {
            pub const FORMAT: Format = $format;
            pub fn to_f32(self) -> f32 {
                Self::FORMAT.decode(self.0)
            }
        }

        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                self.to_f32().partial_cmp(&other.to_f32())
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.to_f32())
            }
        }

        impl Elem for $t {
            const DTYPE: DType = DType::$t;
            fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }
            fn from_f64(v: f64) -> Self {
                $t(Self::FORMAT.encode(v))
            }
            fn to_i64(self) -> i64 {
                self.to_f32() as i64
            }
            fn from_i64(v: i64) -> Self {
                $t(Self::FORMAT.encode(v as f64))
            }
            one_byte!($t, |b: u8| $t(b));
        }
    };
}

minifloat!(
    /// float8 E4M3FN: no infinity, NaN at the all-ones code of either sign, largest 448.
    F8E4M3FN,
    Format::E4M3FN
);
minifloat!(
    /// float8 E4M3FNUZ: no infinity, no negative zero (its code is the NaN), largest 240.
    F8E4M3FNUZ,
    Format::E4M3FNUZ
);
minifloat!(
    /// float8 E5M2: IEEE-like, with infinities and NaNs, largest 57344.
    F8E5M2,
    Format::E5M2
);
minifloat!(
    /// float8 E5M2FNUZ: no infinity, no negative zero (its code is the NaN), largest 57344.
    F8E5M2FNUZ,
    Format::E5M2FNUZ
);
minifloat!(
    /// float4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; no infinity or NaN.
    F4E2M1,
    Format::E2M1
);

macro_rules! nibble {
    ($(#[$doc:meta])* $t:ident, $repr:ty, $wrap:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
        pub struct $t(pub $repr);

        impl $t {
            /// The low four bits of `v`, as this type reads them.
            pub fn wrapping(v: i64) -> Self {
                $t($wrap(v))
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl Elem for $t {
            const DTYPE: DType = DType::$t;
            fn to_f64(self) -> f64 {
                f64::from(self.0)
            }
            /// Truncated toward zero and wrapped, as ONNX's reference casts floats to int4; NaN is 0
            /// and infinities saturate to i64's range first, as every float-to-integer cast does.
            fn from_f64(v: f64) -> Self {
                Self::wrapping(v as i64)
            }
            fn to_i64(self) -> i64 {
                i64::from(self.0)
            }
            fn from_i64(v: i64) -> Self {
                Self::wrapping(v)
            }
            one_byte!($t, |b: u8| Self::wrapping(i64::from(b)));
        }
    };
}

nibble!(
    /// int4: -8..=7, held sign-extended in a byte.
    I4,
    i8,
    |v: i64| ((v as u8) << 4) as i8 >> 4
);
nibble!(
    /// uint4: 0..=15, held zero-extended in a byte.
    U4,
    u8,
    |v: i64| v as u8 & 15
);
nibble!(
    /// int2: -2..=1, held sign-extended in a byte.
    I2,
    i8,
    |v: i64| ((v as u8) << 6) as i8 >> 6
);
nibble!(
    /// uint2: 0..=3, held zero-extended in a byte.
    U2,
    u8,
    |v: i64| v as u8 & 3
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_wrap_as_the_reference_casts() {
        let x = [-9.0, -8.0, 7.0, 8.0, 15.0, 300.7, -300.7, f64::NAN];
        let i: Vec<i8> = x.iter().map(|&v| I4::from_f64(v).0).collect();
        let u: Vec<u8> = x.iter().map(|&v| U4::from_f64(v).0).collect();
        assert_eq!(i, [7, -8, 7, -8, -1, -4, 4, 0]);
        assert_eq!(u, [7, 8, 7, 8, 15, 12, 4, 0]);
        let i: Vec<i8> = x.iter().map(|&v| I2::from_f64(v).0).collect();
        let u: Vec<u8> = x.iter().map(|&v| U2::from_f64(v).0).collect();
        assert_eq!(i, [-1, 0, -1, 0, -1, 0, 0, 0]);
        assert_eq!(u, [3, 0, 3, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn minifloats_convert_through_their_format() {
        let t = Tensor::from_vec(&[4], vec![0.3f32, -470.0, 1e9, f32::NAN]).unwrap();
        let f8 = t.cast(DType::F8E4M3FN);
        assert_eq!(f8.to_le_bytes(), [0x2a, 0xff, 0x7f, 0x7f]);
        let back = f8.cast(DType::F32).to_f64_vec();
        assert_eq!(back[0], 0.3125);
        assert!(back[1..].iter().all(|v| v.is_nan()));
    }
}
