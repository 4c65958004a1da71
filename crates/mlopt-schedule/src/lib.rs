//! mlopt's schedule stage: kernel IR -> kernel IR for one target. Lowering writes each kernel's
//! algorithm (its loop nests over buffers) and knows no target; a schedule chooses how those loops run
//! on the target, without changing what they compute, and records each choice as a typed
//! `mlopt_kir::ScheduleStep`. Every target decision of mlopt is made here, with the cost model's
//! kernel-level figures (`mlopt-cost`):
//!
//! - What a nest computes is recognised once, by the shared recognisers: `contraction.rs` (rows,
//!   columns, batch, reduction and operands), `window.rs` (a convolution's or a pooling's window),
//!   `attention.rs` (one query row of attention). The CPU and GPU schedulers read what they find.
//! - `cpu/`: Winograd F(2x2, 3x3) for the 3x3 convolutions where the cost model rates it faster
//!   (`winograd.rs`), register tiles with packed weights (`gemm.rs`, `conv.rs` with padded, phased
//!   copies from `padded.rs`, `attention.rs`; built by `tiler.rs`, in K blocks where a panel of B would
//!   leave L2), bf16 `mma` blocks on the matrix unit (`mma.rs`), padded copies for pooling windows, then
//!   rfactor, partitioned, vector and parallel loops (`loops.rs`), weights stored the way their loops
//!   read them (`layout.rs`), and large scratch moved into the arena.
//! - `gpu/`: every kernel as GPU launches (grids, cooperative rows in shared memory), tiled GEMMs and
//!   implicit-GEMM convolutions on tensor cores or SIMT FMAs (`gemm.rs`), attention with an online
//!   softmax (`attention.rs`).
//!
//! Architecture invariant: sees the kernel IR, the target and the cost model only; no other crate
//! chooses a tile, a layout of weights, a copy, a vector or parallel loop or a GPU launch.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod attention;
mod class;
mod contraction;
pub mod cpu;
pub mod error;
pub mod gpu;
mod window;

pub use cpu::{tile_key, Winograd, ARENA_LOCAL_BYTES};
pub use error::{Result, ScheduleError};
pub use mlopt_cost::tile::{candidates, Tile, TileKey};

use mlopt_kir::Program;
use mlopt_target::Target;
use std::collections::HashMap;

/// What the caller decides beyond the target: measured tiles, the Winograd policy, tf32 and the GPU's
/// register margin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    /// Contraction tiles chosen by measurement (`--tune`), overriding the cost model's.
    pub tiles: HashMap<TileKey, Tile>,
    /// When eligible 3x3 convolutions run by Winograd F(2x2, 3x3) on a CPU.
    pub winograd: Winograd,
    /// GPU tensor cores may round f32 operands to tf32 (only where the precision allows it).
    pub tf32: bool,
    /// Registers added to every GPU GEMM tile's estimate: the shortfall ptxas found in an earlier plan.
    pub register_margin: u64,
}

/// The schedule stage: every kernel of `p` scheduled for `target` (`cpu::schedule` or
/// `gpu::schedule`); the result is verified.
pub fn schedule(p: Program, target: &Target, o: &Options) -> Result<Program> {
    let p = match target {
        Target::Cpu(t) => cpu::schedule(p, t, o)?,
        Target::Gpu(t) => gpu::schedule(p, t, o)?,
    };
    mlopt_kir::verify_program(&p).map_err(ScheduleError::Verify)?;
    Ok(p)
}
