//! What the CPU program (`program.rs`) and the PTX module (`ptx.rs`) share in compiling their kernels:
//! kernels identical but for their names (a repeated layer, whose weights are arguments) compiled once,
//! and the distinct ones compiled in groups of about equal size, each group on a thread of its own (LLVM
//! contexts are per thread).

use crate::error::{LlvmError, Result};
use mlopt_kir::Kernel;
use std::collections::HashMap;

/// The stack of each code generation thread (address space, committed only as used): LLVM and the code
/// generator recurse over the kernels' expressions.
const CODEGEN_STACK: usize = 64 << 20;

/// Which kernels share code.
#[derive(Debug, Clone)]
pub(crate) struct Sharing {
    /// For each kernel, the index of the first kernel identical to it but for its name (its own index
    /// where it is the first).
    pub same: Vec<usize>,
    /// Each kernel's printed size, the measure the groups balance.
    sizes: Vec<usize>,
}

impl Sharing {
    pub(crate) fn of(kernels: &[Kernel]) -> Sharing {
        let mut first: HashMap<String, usize> = HashMap::new();
        let mut sizes = Vec::with_capacity(kernels.len());
        let same = kernels
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let mut key = k.clone();
                key.name.clear();
                let text = mlopt_kir::print::kernel(&key);
                sizes.push(text.len());
                *first.entry(text).or_insert(i)
            })
            .collect();
        Sharing { same, sizes }
    }

    /// The kernels compiled: the first of each set of identical ones, in program order.
    pub(crate) fn distinct(&self) -> Vec<usize> {
        (0..self.same.len())
            .filter(|i| self.same[*i] == *i)
            .collect()
    }

    /// The distinct kernels in one group per available thread at most, balanced by size (largest
    /// first onto the lightest group), each group in program order; no group is empty.
    pub(crate) fn groups(&self) -> Vec<Vec<usize>> {
        let distinct = self.distinct();
        let jobs = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, distinct.len().max(1));
        let mut groups: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); jobs];
        let mut by_size: Vec<(usize, usize)> =
            distinct.iter().map(|&i| (self.sizes[i], i)).collect();
        by_size.sort_by(|a, b| b.cmp(a));
        for (size, i) in by_size {
            if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
                g.0 += size;
                g.1.push(i);
            }
        }
        groups
            .into_iter()
            .filter(|g| !g.1.is_empty())
            .map(|mut g| {
                g.1.sort_unstable();
                g.1
            })
            .collect()
    }
}

/// `work` on each group, each on a thread of its own; the results in the groups' order, or the first
/// error.
pub(crate) fn on_threads<T: Send>(
    groups: &[Vec<usize>],
    work: impl Fn(&[usize]) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|group| {
                std::thread::Builder::new()
                    .stack_size(CODEGEN_STACK)
                    .spawn_scoped(s, move || work(group))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.map_err(|e| {
                    LlvmError::Codegen(format!("starting a code generation thread: {e}"))
                })?
                .join()
                .unwrap_or_else(|_| {
                    Err(LlvmError::Codegen(
                        "a code generation thread panicked".into(),
                    ))
                })
            })
            .collect()
    })
}
