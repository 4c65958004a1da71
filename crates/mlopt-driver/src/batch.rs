//! Dynamic batch: one library whose run takes the batch size (`mlopt compile --max N=32`).
//!
//! Every schedule in mlopt is for static shapes, so the model is compiled at batch sizes 1, 2, 4 and 8
//! (those up to the bound): its variants, each a complete program (`<name>_b<k>`). A run of n items is
//! the largest variant that fits what is left, repeated (`mlopt_batched_run` in the runtime: 13 items
//! run as 8, 4 and 1), so each item runs at the speed of a batch-8 build, or of the largest that fits.
//! The weights every variant packs alike are stored once (`elf::data_object` shares equal bytes), and
//! the context holds one context per variant. Only a leading batch dimension may vary: inputs that have
//! it are consecutive items, inputs without it are passed whole to every chunk, and every output must
//! have it. Running a batch as chunks is only right when items do not mix, which no shape shows: before
//! anything is written, the batch-2 variant is run on random items and compared with the batch-1
//! variant run on each, and a model whose items mix (a reshape across the batch, a reduction over it)
//! is refused.

use crate::emit::Batch;
use crate::error::{DriverError, Result};
use crate::Compiled;
use mlopt_kir::{Io, Program};
use mlopt_runtime::Member;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The batch sizes compiled for a bound: powers of two up to 8 (past 8, items run at batch 8's speed).
pub fn variant_sizes(max_batch: u64) -> Vec<u64> {
    [8, 4, 2, 1]
        .into_iter()
        .filter(|&b| b <= max_batch)
        .collect()
}

/// A dynamic-batch library: its variants (largest first, each a CPU build), the entry object and the
/// weights of all variants stored once.
#[derive(Debug)]
pub struct Batched {
    pub name: String,
    /// The batch dimension's name (`N` of `--max N=32`).
    pub symbol: String,
    pub max_batch: u64,
    pub variants: Vec<(u64, Compiled)>,
    /// Whether each input has the batch dimension.
    pub input_batched: Vec<bool>,
    /// The object of the entry points (`mlopt_llvm::batch_entry`).
    pub entry: Vec<u8>,
    pub data: mlopt_llvm::DataObject,
}

impl Batched {
    /// Joins `variants` (batch size and build, any order; one of batch 1) of the library `name`.
    pub fn new(
        name: &str,
        symbol: &str,
        max_batch: u64,
        mut variants: Vec<(u64, Compiled)>,
    ) -> Result<Batched> {
        variants.sort_by_key(|v| std::cmp::Reverse(v.0));
        let Some((1, one)) = variants.last() else {
            return Err(DriverError::Input(
                "a dynamic batch needs a batch-1 build".into(),
            ));
        };
        let unit = &one.program;
        // One item's program runs per item, so an output sized by the data would have a count per
        // item where the interface has one.
        if let Some(io) = unit.outputs.iter().find(|io| io.counted.is_some()) {
            return Err(DriverError::Input(format!(
                "output '{}' has a size that depends on the data (computed at a bound, with a count): \
                 a dynamic batch (--max) does not take such outputs; compile at a fixed batch",
                io.name.escape_default()
            )));
        }
        let mut input_batched = vec![false; unit.inputs.len()];
        for (b, c) in &variants {
            let p = &c.program;
            if p.inputs.len() != unit.inputs.len() || p.outputs.len() != unit.outputs.len() {
                return Err(DriverError::Input(format!(
                    "at batch {b} the model has other inputs or outputs than at batch 1"
                )));
            }
            for (i, (io, one)) in p.inputs.iter().zip(&unit.inputs).enumerate() {
                input_batched[i] |= batched(io, one, *b, "input")?;
            }
            for (io, one) in p.outputs.iter().zip(&unit.outputs) {
                if !batched(io, one, *b, "output")? && *b > 1 {
                    return Err(DriverError::Input(format!(
                        "output '{}' does not grow with the batch ({:?} at batch {b} and at batch 1): \
                         a dynamic batch needs every output to have it as its first dimension",
                        io.name.escape_default(),
                        io.dims
                    )));
                }
            }
        }
        independent(&variants)?;
        let item = |io: &Io, yes: bool| if yes { io.bytes() as u64 } else { 0 };
        let plan = mlopt_llvm::BatchPlan {
            name: name.to_string(),
            variants: variants
                .iter()
                .map(|(b, c)| (c.program.name.clone(), *b))
                .collect(),
            max_batch,
            input_item_bytes: unit
                .inputs
                .iter()
                .zip(&input_batched)
                .map(|(io, &yes)| item(io, yes))
                .collect(),
            output_item_bytes: unit.outputs.iter().map(|io| item(io, true)).collect(),
        };
        let target = variants[0]
            .1
            .cfg
            .target
            .cpu()
            .ok_or_else(|| DriverError::Input("a dynamic batch is for CPU targets".into()))?;
        let entry = mlopt_llvm::batch_entry(&plan, target)?;
        let weights: Vec<_> = variants
            .iter()
            .flat_map(|(_, c)| c.code.weights.iter().cloned())
            .collect();
        let data = mlopt_llvm::data_object(&weights);
        Ok(Batched {
            name: name.to_string(),
            symbol: symbol.to_string(),
            max_batch,
            variants,
            input_batched,
            entry,
            data,
        })
    }

    /// Writes lib<stem>.a (the entry, every variant's code, the weights once), <stem>.h and <stem>.rs
    /// for a run of n items, the largest variant's stage dumps and `extra` into `dir`, all or none.
    pub fn write_library(
        &self,
        dir: &Path,
        stem: &str,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<PathBuf>> {
        let p = self.per_item();
        let batch = Batch::Dynamic {
            max: self.max_batch,
            symbol: &self.symbol,
            input_batched: &self.input_batched,
        };
        let stack = self
            .variants
            .iter()
            .map(|(_, c)| mlopt_llvm::stack_bytes(&c.program))
            .max()
            .unwrap_or_default();
        let largest = self.largest();
        let mut files = vec![
            (
                format!("{stem}.h"),
                crate::emit::c_header_with(&p, largest.cfg.target.name(), batch, stack),
            ),
            (
                format!("{stem}.rs"),
                crate::emit::rust_binding_with(&p, stem, batch),
            ),
        ];
        files.extend(crate::library::dump_files(
            &largest.dumps,
            stem,
            &largest.cfg.target,
        ));
        let mut members = vec![
            Member::object(format!("{stem}.o"), &self.entry)
                .map_err(|e| DriverError::Io(format!("{stem}.o: {e}")))?,
            Member {
                name: format!("{stem}.1.o"),
                parts: self.data.parts(),
                symbols: self.data.symbols().to_vec(),
            },
        ];
        for (_, c) in &self.variants {
            let v = mlopt_llvm::c_name(&c.program.name);
            // Each variant's code; its weights are in the library's data object.
            let data = format!("{v}.1.o");
            members.extend(
                crate::cpu::members(&v, &c.code)?
                    .into_iter()
                    .filter(|m| m.name != data),
            );
        }
        crate::output::write_files(
            dir,
            files,
            (stem, &members),
            mlopt_runtime::write_archive,
            extra,
        )
    }

    /// The largest variant, whose report, dumps and roofline stand for the library's.
    pub fn largest(&self) -> &Compiled {
        &self.variants[0].1
    }

    /// The batch-1 program renamed as the library: its inputs and outputs are one item's.
    pub fn per_item(&self) -> Program {
        let mut p = self.variants[self.variants.len() - 1].1.program.clone();
        p.name = self.name.clone();
        p.arena_bytes = self
            .variants
            .iter()
            .map(|(_, c)| c.program.context_bytes())
            .sum();
        p
    }
}

/// Whether `io` at batch `b` is `one` (its batch-1 form) with the first dimension times `b`; an error if
/// it differs from `one` any other way.
fn batched(io: &Io, one: &Io, b: u64, what: &str) -> Result<bool> {
    if io.dims == one.dims {
        return Ok(b == 1);
    }
    let lead = !io.dims.is_empty() && io.dims.first().copied() == one.dims.first().map(|d| d * b);
    if lead
        && io.dims.len() == one.dims.len()
        && io.dims[1..] == one.dims[1..]
        && io.elem == one.elem
    {
        return Ok(true);
    }
    Err(DriverError::Input(format!(
        "{what} '{}' is {:?} at batch {b} and {:?} at batch 1: only a leading batch dimension can be \
         dynamic",
        io.name.escape_default(),
        io.dims,
        one.dims
    )))
}

/// An error unless the batch-2 variant gives, on random items, what the batch-1 variant gives for each.
fn independent(variants: &[(u64, Compiled)]) -> Result<()> {
    let find = |b: u64| variants.iter().find(|v| v.0 == b).map(|v| &v.1);
    let (Some(two), Some(one)) = (find(2), find(1)) else {
        return Ok(());
    };
    let g = &two.optimized.plan.graph;
    let inputs = mlopt_rewrite::optimize::random_inputs(g, 7);
    let whole = two.run(&mut two.load()?, &inputs)?;
    let mut lib = one.load()?;
    let mut halves: Vec<Vec<(String, mlopt_ir::Tensor)>> = Vec::new();
    for h in 0..2 {
        let part: HashMap<String, mlopt_ir::Tensor> = inputs
            .iter()
            .map(|(k, t)| {
                let batched = one.program.inputs.iter().any(|io| {
                    io.name == *k
                        && io.dims.first().copied() != t.shape().first().map(|&d| d as u64)
                });
                let t = if batched { half(t, h)? } else { t.clone() };
                Ok((k.clone(), t))
            })
            .collect::<Result<_>>()?;
        halves.push(one.run(&mut lib, &part)?);
    }
    for (o, (name, w)) in whole.iter().enumerate() {
        let both = join(&halves[0][o].1, &halves[1][o].1)?;
        let err = mlopt_rewrite::optimize::scaled_error(w, &both);
        if err > 1e-3 {
            return Err(DriverError::Input(format!(
                "the model mixes the items of a batch: output '{}' of a batch of 2 differs from two \
                 batches of 1 by {err:.2e} (scaled): running it in chunks would change its results, so \
                 it cannot have a dynamic batch",
                name.escape_default()
            )));
        }
    }
    Ok(())
}

/// Item `h` of the two a batch-2 tensor holds.
fn half(t: &mlopt_ir::Tensor, h: usize) -> Result<mlopt_ir::Tensor> {
    let bytes = t.to_le_bytes();
    let n = bytes.len() / 2;
    let mut ty = t.ty();
    ty.shape[0] /= 2;
    mlopt_ir::Tensor::from_le_bytes(&ty, &bytes[h * n..(h + 1) * n])
        .ok_or_else(|| DriverError::Input("splitting a batch of 2 (a bug in mlopt)".into()))
}

/// Two batch-1 tensors as one batch of 2.
fn join(a: &mlopt_ir::Tensor, b: &mlopt_ir::Tensor) -> Result<mlopt_ir::Tensor> {
    let mut bytes = a.to_le_bytes();
    bytes.extend(b.to_le_bytes());
    let mut ty = a.ty();
    ty.shape[0] *= 2;
    mlopt_ir::Tensor::from_le_bytes(&ty, &bytes)
        .ok_or_else(|| DriverError::Input("joining two batches of 1 (a bug in mlopt)".into()))
}
