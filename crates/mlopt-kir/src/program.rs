//! A program: a model as kernels and the steps that call them, with its inputs, outputs, weights and
//! activation arena.

use crate::ir::*;
use std::sync::Arc;

/// Where a kernel argument lives when a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Input(usize),
    Output(usize),
    Weight(usize),
    /// A byte offset into the activation arena.
    Arena(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Io {
    pub name: String,
    pub elem: Elem,
    pub dims: Vec<u64>,
    /// An output whose size along an axis depends on the data (`mlopt_ir::extent`): its dims are the
    /// bound, and the first `count` entries along `axis` hold the values, `count` being the i64 held
    /// by output `output`.
    pub counted: Option<Counted>,
    /// The ONNX sequence this is an element of (`mlopt_onnx::interface`): a sequence's elements are
    /// consecutive inputs or outputs, in order.
    pub sequence: Option<String>,
}

/// How an output's size depends on the data: see `Io::counted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub axis: usize,
    pub output: usize,
}

impl Io {
    /// The size of the caller's buffer for this input or output.
    pub fn bytes(&self) -> usize {
        (self.dims.iter().product::<u64>() * self.elem.size()) as usize
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Weight {
    pub name: String,
    pub elem: Elem,
    pub dims: Vec<u64>,
    /// Little-endian element bytes.
    pub data: Arc<Vec<u8>>,
}

/// One kernel call: `args[i]` is bound to the kernel's i-th parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub kernel: usize,
    pub args: Vec<Place>,
    /// A check of the input data (an index in range, a nonzero integer divisor): see `Check`.
    pub check: Option<Check>,
    /// The call is made only when every condition holds (none: always); see `Guard`.
    pub guard: Vec<Guard>,
}

/// A condition on a call: the bool (one byte) at `place` is nonzero (`when`) or zero (`!when`). What
/// only one branch of an `If` decided at run time needs is called under its condition
/// (`mlopt_ir::demand`). A condition whose value was not computed in a run (its own call was guarded
/// off) reads stale bytes, but then another condition of the same guard is false.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guard {
    pub place: Place,
    pub when: bool,
}

impl Step {
    /// Whether the call is made, given the byte at each guard's place.
    pub fn runs(&self, mut byte: impl FnMut(Place) -> Option<u8>) -> bool {
        self.guard
            .iter()
            .all(|g| byte(g.place).is_some_and(|b| (b != 0) == g.when))
    }
}

/// What a check step's kernel decides: it writes 4 bytes at `flag` (an arena offset), nonzero when the
/// data is invalid, and then the run stops with `message` (`run_program`'s error, the compiled entry
/// point's status, the GPU launcher's error).
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub flag: u64,
    pub message: String,
}

impl Step {
    /// A plain kernel call.
    pub fn call(kernel: usize, args: Vec<Place>) -> Step {
        Step {
            kernel,
            args,
            check: None,
            guard: Vec::new(),
        }
    }
}

/// The most bytes of local buffers one CPU function (a kernel, or the body of one of its parallel loops)
/// keeps on its thread's stack: larger locals that the whole kernel shares move into the activation
/// arena (the schedule's `scratch_in_arena`), and code generation puts the rest of what does not fit in
/// the runtime's per-thread scratch (`mlopt_llvm`'s `locals.rs`), so a run's stack stays small.
pub const STACK_LOCALS_BYTES: u64 = 32 * 1024;

/// A compiled model before code generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Program {
    pub name: String,
    pub inputs: Vec<Io>,
    pub outputs: Vec<Io>,
    pub weights: Vec<Weight>,
    pub arena_bytes: u64,
    pub kernels: Vec<Kernel>,
    pub steps: Vec<Step>,
}

impl Program {
    /// The bytes of a run's context (what `mlopt_<name>_create` allocates): the arena rounded up to 64
    /// bytes, then 64 bytes of status (the last run's error).
    pub fn context_bytes(&self) -> u64 {
        self.arena_bytes.div_ceil(64) * 64 + 64
    }
}
