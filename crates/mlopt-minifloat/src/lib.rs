//! Floats narrower than f16: ONNX's four float8 kinds and float4 E2M1, stored one per byte.
//!
//! Each is a sign, `ebits` of exponent biased by `bias` and `mbits` of mantissa, with subnormals, and
//! differs in what the top codes mean ([`Special`]). [`Format::decode`] gives a code's value (exact in
//! f32); [`Format::encode`] rounds an f64 to the nearest code, ties to even, as `astype` of ONNX's
//! reference (ml_dtypes) does: a value past the largest finite one becomes infinity where the format has
//! one, NaN where it has no infinity, the largest value where it has neither. ONNX `Cast`'s `saturate`
//! clamps to [`Format::max`] first (the reference's definition), so it is not a mode here.
//!
//! Both interpreters call these; code generation (`mlopt-llvm`) emits the same rounding as integer code
//! from the fields of [`Format`], and its tests compare every code and the midpoints between them.

/// What a format's top codes mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Special {
    /// IEEE-like (E5M2): the all-ones exponent is infinity (mantissa 0) or NaN.
    Ieee,
    /// "FN" (E4M3FN): no infinity; the all-ones exponent and mantissa are NaN, of either sign.
    Finite,
    /// "FNUZ": no infinity and no negative zero; the code of negative zero (0x80) is the only NaN.
    Unsigned0,
    /// Neither infinity nor NaN (E2M1): overflow saturates, and NaN becomes a zero of the other sign
    /// (what ml_dtypes, ONNX's reference, gives).
    None,
}

/// One narrow float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Format {
    pub ebits: u32,
    pub mbits: u32,
    pub bias: i32,
    pub special: Special,
}

impl Format {
    pub const E4M3FN: Format = Format::new(4, 3, 7, Special::Finite);
    pub const E4M3FNUZ: Format = Format::new(4, 3, 8, Special::Unsigned0);
    pub const E5M2: Format = Format::new(5, 2, 15, Special::Ieee);
    pub const E5M2FNUZ: Format = Format::new(5, 2, 16, Special::Unsigned0);
    pub const E2M1: Format = Format::new(2, 1, 1, Special::None);

    const fn new(ebits: u32, mbits: u32, bias: i32, special: Special) -> Format {
        Format {
            ebits,
            mbits,
            bias,
            special,
        }
    }

    /// The position of the sign bit (7 for float8, 3 for float4).
    pub const fn sign_shift(self) -> u32 {
        self.ebits + self.mbits
    }

    /// The smallest normal exponent, `1 - bias`.
    pub const fn emin(self) -> i32 {
        1 - self.bias
    }

    /// The code of the largest finite value (positive).
    pub const fn max_code(self) -> u8 {
        let all = (1u32 << (self.ebits + self.mbits)) - 1;
        (match self.special {
            // The top exponent holds infinity and the NaNs.
            Special::Ieee => all - (1 << self.mbits),
            // The top exponent and mantissa are NaN.
            Special::Finite => all - 1,
            Special::Unsigned0 | Special::None => all,
        }) as u8
    }

    /// The largest finite value.
    pub fn max(self) -> f64 {
        f64::from(self.decode(self.max_code()))
    }

    /// The code of a NaN whose sign is `negative` (its quiet pattern, as ml_dtypes gives it).
    pub const fn nan_code(self, negative: bool) -> u8 {
        let s = (negative as u32) << self.sign_shift();
        (match self.special {
            Special::Ieee => s | ((1 << self.sign_shift()) - 1 - 1),
            Special::Finite => s | ((1 << self.sign_shift()) - 1),
            Special::Unsigned0 => 1 << self.sign_shift(),
            Special::None => ((!negative) as u32) << self.sign_shift(),
        }) as u8
    }

    /// The code a value past the largest finite one takes (its sign applied after).
    pub const fn overflow_code(self) -> u8 {
        match self.special {
            Special::Ieee => self.max_code() + 1,
            Special::Finite => self.max_code() + 1,
            Special::Unsigned0 => 1 << self.sign_shift(),
            Special::None => self.max_code(),
        }
    }

    /// The value of `code` (its bits above the format's width ignored).
    pub fn decode(self, code: u8) -> f32 {
        let code = u32::from(code) & ((1 << (self.sign_shift() + 1)) - 1);
        let negative = code >> self.sign_shift() != 0;
        let mag = code & ((1 << self.sign_shift()) - 1);
        let exp = mag >> self.mbits;
        let man = mag & ((1 << self.mbits) - 1);
        let top = (1 << self.ebits) - 1;
        let nan = match self.special {
            Special::Ieee => exp == top && man != 0,
            Special::Finite => mag == (1 << self.sign_shift()) - 1,
            Special::Unsigned0 => negative && mag == 0,
            Special::None => false,
        };
        if nan {
            // With its sign, except FNUZ's (whose one NaN has the sign bit set).
            return if negative && self.special != Special::Unsigned0 {
                -f32::NAN
            } else {
                f32::NAN
            };
        }
        let v = if self.special == Special::Ieee && exp == top {
            f32::INFINITY
        } else if exp == 0 {
            man as f32 * pow2(self.emin() - self.mbits as i32)
        } else {
            (((1 << self.mbits) + man) as f32) * pow2(exp as i32 - self.bias - self.mbits as i32)
        };
        if negative {
            -v
        } else {
            v
        }
    }

    /// The code nearest `x`, ties to even (see the module's note on what overflows become).
    pub fn encode(self, x: f64) -> u8 {
        if x.is_nan() {
            return self.nan_code(x.is_sign_negative());
        }
        let negative = x.is_sign_negative();
        let a = x.abs();
        // a's binade (exact, from its bits; f64 subnormals, far below every format's smallest value, are
        // rounded in the subnormals' binade like any value below the normals).
        let e = if a == 0.0 || a.is_infinite() {
            self.emin()
        } else {
            (((a.to_bits() >> 52) as i32) - 1023).max(self.emin())
        };
        let step = 2f64.powi(e - self.mbits as i32);
        let q = (a / step).round_ties_even() * step;
        let mag = if q > self.max() {
            u32::from(self.overflow_code())
        } else if q == 0.0 {
            0
        } else if q < f64::from(pow2(self.emin())) {
            (q / step) as u32
        } else {
            // q may have rounded up into the next binade; its exponent is then e + 1.
            let e = if q >= f64::from(pow2(e + 1)) {
                e + 1
            } else {
                e
            };
            let man = (q / 2f64.powi(e - self.mbits as i32)) as u32 - (1 << self.mbits);
            (((e + self.bias) as u32) << self.mbits) | man
        };
        let signed = negative
            && !(self.special == Special::Unsigned0 && (mag == 0 || mag == 1 << self.sign_shift()));
        (mag | ((signed as u32) << self.sign_shift())) as u8
    }
}

/// 2^e as f32, for the exponents these formats reach (|e| < 40).
fn pow2(e: i32) -> f32 {
    2f32.powi(e)
}

#[cfg(test)]
mod tests;
