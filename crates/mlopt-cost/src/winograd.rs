//! Whether a 3x3, stride-1 convolution runs faster by Winograd F(2x2, 3x3) than as a direct implicit
//! GEMM on a CPU (the kernel-level model the schedule's Winograd rewrite asks): the 16 GEMMs of its
//! transformed tiles and the transforms against the direct contraction, both GEMMs costed by the
//! register-tile model (`tile.rs`), in seconds on the target.

use crate::tile::{pick, seconds};
use mlopt_target::CpuTarget;

/// Transform cost in cycles per (input channel, tile): 16 strided loads, gathered at about one element
/// per cycle (the adds and V's contiguous stores hide under them); and per (output channel, tile): 16
/// contiguous loads, the adds and 4 strided stores. Checked against eight layer shapes measured on this
/// machine (the table in the tests).
const INPUT_TRANSFORM: f64 = 16.0;
const OUTPUT_TRANSFORM: f64 = 8.0;
/// The transformed input and output (16 values per channel and tile each) are written and read back once;
/// what does not fit in a core's L2 (the target's) goes through L3 and memory, at about 10 bytes per
/// cycle. Fit to both machines measured: a Sapphire Rapids core with 2 MiB of L2 (the table in the
/// tests, whose verdicts are the same from 6 to 10 bytes per cycle) and a Zen 5 core with 1 MiB, where
/// GoogLeNet's 64 -> 192-channel 56x56 layer ran faster by Winograd (the model 15.0 against 16.4 ms
/// direct, same-run pairs), which 6 bytes per cycle with the 1 MiB L2 refused.
const SPILL_BYTES_PER_CYCLE: f64 = 10.0;

/// The cost model's verdict for `c` input and `m` output channels over an h x w output on `t`: the 16
/// GEMMs of `tiles` columns plus the transforms and the temporaries' traffic beyond the target's L2,
/// against the direct contraction of K = 9c (both by the register-tile model of `tile::seconds`, with
/// the tiles it would pick).
pub fn pays(t: &CpuTarget, c: u64, m: u64, h: u64, w: u64) -> bool {
    let tiles = (h / 2) * (w / 2);
    let (Some(direct), Some(gemm)) = (pick(t, m, h * w, 9 * c), pick(t, m, tiles, c)) else {
        return false;
    };
    let direct = seconds(t, direct, m, h * w, 9 * c);
    let transforms = tiles as f64 * (INPUT_TRANSFORM * c as f64 + OUTPUT_TRANSFORM * m as f64);
    let temporaries = (16 * 4 * (c + m) * tiles) as f64;
    let spill = 2.0 * (temporaries - t.l2_bytes as f64).max(0.0) / SPILL_BYTES_PER_CYCLE;
    16.0 * seconds(t, gemm, m, tiles, c) + t.cycles(transforms + spill) < direct
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model against measurements on a Sapphire Rapids core with 2 MiB of L2 (`mlopt bench --winograd
    /// never|always`, the best of 3-5 runs of 100-150 iterations, ms): where one measured at least 15%
    /// faster, the model must choose it. Closer results are within that machine's noise, and either
    /// choice is right.
    #[test]
    fn the_model_chooses_winograd_where_it_measured_faster() {
        let mut t = mlopt_target::cpu::x86_64_v4(1);
        t.l2_bytes = 2 << 20;
        // (channels in = out, output size, direct ms, Winograd ms)
        let measured = [
            (32, 64, 0.79, 0.86),
            (64, 56, 2.12, 2.09), // and in another run 2.6 (ORT) against 7.1 for Winograd: direct is safer
            (64, 32, 0.57, 0.43),
            (96, 32, 1.28, 0.87),
            (128, 32, 2.41, 1.63),
            (128, 56, 8.96, 7.04),
            (256, 16, 3.36, 2.05),
            (512, 8, 4.66, 3.60),
        ];
        let mut clear = 0;
        for (ch, hw, direct, winograd) in measured {
            if f64::max(direct, winograd) / f64::min(direct, winograd) >= 1.15 {
                assert_eq!(
                    pays(&t, ch, ch, hw, hw),
                    winograd < direct,
                    "{ch} channels, {hw}x{hw}: {direct} ms direct, {winograd} ms Winograd"
                );
                clear += 1;
            }
        }
        assert_eq!(clear, 6);
        // ResNet's 64-channel 56x56 layer, whose 6.4 MB of temporaries leave L2, stays direct.
        assert!(!pays(&t, 64, 64, 56, 56));
    }
}
