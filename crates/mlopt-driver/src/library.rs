//! What `mlopt compile` gets from the pipeline (`pipeline::build`): a `Library` for a CPU or a GPU that says
//! what is written and reported for either, so the CLI does not orchestrate stages or assemble reports
//! itself.

use crate::batch::Batched;
use crate::error::Result;
use crate::gpu::GpuCompiled;
use crate::Compiled;
use mlopt_rewrite::report::json_str;
use std::path::{Path, PathBuf};

/// What `Library::report` makes: report.json's text and the `--report` printout.
#[derive(Debug, Clone)]
pub struct Report {
    pub json: String,
    pub text: String,
}

/// A compiled model for a CPU or a GPU.
#[derive(Debug)]
pub enum Library {
    Cpu(Box<Compiled>),
    Gpu(Box<GpuCompiled>),
    /// A dynamic batch: CPU builds at several batch sizes behind one run (`batch.rs`).
    Batched(Box<Batched>),
}

impl Library {
    /// The library with the pipeline's stage times.
    pub(crate) fn with_times(mut self, times: Vec<(&'static str, f64)>) -> Self {
        match &mut self {
            Library::Cpu(c) => c.times = times,
            Library::Gpu(c) => c.times = times,
            Library::Batched(_) => {}
        }
        self
    }

    /// The library with each stage's text (`Options::dumps`).
    pub(crate) fn with_dumps(mut self, dumps: Vec<(crate::Stage, String)>) -> Self {
        match &mut self {
            Library::Cpu(c) => c.dumps = dumps,
            Library::Gpu(c) => c.dumps = dumps,
            Library::Batched(_) => {}
        }
        self
    }

    /// The model's name (the graph's), which names the library's files and symbols.
    pub fn name(&self) -> &str {
        match self {
            Library::Cpu(c) => &c.program.name,
            Library::Gpu(c) => &c.program.name,
            Library::Batched(b) => &b.name,
        }
    }

    /// The target's name (`host`, `x86-64-v4`, `sm_80`, ...).
    pub fn target_name(&self) -> &str {
        match self {
            Library::Cpu(c) => c.cfg.target.name(),
            Library::Gpu(c) => c.cfg.target.name(),
            Library::Batched(b) => b.largest().cfg.target.name(),
        }
    }

    fn stages(times: &[(&'static str, f64)]) -> String {
        let stages: Vec<String> = times.iter().map(|(k, v)| format!("{k} {v:.2} s")).collect();
        format!("stages: {}\n", stages.join(", "))
    }

    /// report.json (the optimiser's report with the arena, the kernels compiled, `compile_s` and each
    /// stage's seconds, and every launch for a GPU) and what `compile --report` prints (the optimiser's
    /// header, the kernel table, the activation arena for a CPU, the stages' times). The arena is the
    /// memory plan lowering used.
    pub fn report(&self, compile_s: f64) -> Report {
        let (optimized, cfg, times, mut extra, text) = match self {
            Library::Cpu(c) => cpu_parts(c),
            Library::Batched(b) => cpu_parts(b.largest()),
            Library::Gpu(c) => {
                let extra = vec![
                    ("arena_bytes", c.program.arena_bytes.to_string()),
                    ("kernels_compiled", c.program.kernels.len().to_string()),
                    ("gpu_kernels", c.json()),
                ];
                let text = format!(
                    "{}{}{}",
                    mlopt_rewrite::report::header(&c.optimized, &c.cfg),
                    c.table(),
                    Library::stages(&c.times)
                );
                (&c.optimized, &c.cfg, &c.times, extra, text)
            }
        };
        // The library's name and interface, for programs that load it (the Python package).
        let per_item;
        let program = match self {
            Library::Cpu(c) => &c.program,
            Library::Gpu(c) => &c.program,
            Library::Batched(b) => {
                per_item = b.per_item();
                let flags: Vec<&str> = b
                    .input_batched
                    .iter()
                    .map(|&x| if x { "true" } else { "false" })
                    .collect();
                let sizes: Vec<String> = b.variants.iter().map(|(k, _)| k.to_string()).collect();
                extra.push((
                    "batch",
                    format!(
                        "{{\"symbol\": {}, \"max\": {}, \"variants\": [{}], \"inputs_batched\": [{}]}}",
                        json_str(&b.symbol),
                        b.max_batch,
                        sizes.join(", "),
                        flags.join(", ")
                    ),
                ));
                &per_item
            }
        };
        let io = |list: &[mlopt_kir::Io]| {
            let items: Vec<String> = list
                .iter()
                .map(|io| {
                    let dims: Vec<String> = io.dims.iter().map(u64::to_string).collect();
                    let counted = io
                        .counted
                        .map(|c| {
                            format!(
                                ", \"counted\": {{\"axis\": {}, \"count_output\": {}}}",
                                c.axis, c.output
                            )
                        })
                        .unwrap_or_default();
                    let seq = io
                        .sequence
                        .as_ref()
                        .map(|q| format!(", \"sequence\": {}", json_str(q)))
                        .unwrap_or_default();
                    format!(
                        "{{\"name\": {}, \"dtype\": \"{}\", \"shape\": [{}]{counted}{seq}}}",
                        json_str(&io.name),
                        io.elem,
                        dims.join(", ")
                    )
                })
                .collect();
            format!("[{}]", items.join(", "))
        };
        extra.insert(0, ("name", json_str(&program.name)));
        extra.insert(1, ("inputs", io(&program.inputs)));
        extra.insert(2, ("outputs", io(&program.outputs)));
        extra.push(("compile_s", format!("{compile_s:.3}")));
        extra.extend(times.iter().map(|(k, v)| (*k, format!("{v:.3}"))));
        Report {
            json: mlopt_rewrite::report::json(optimized, cfg, &extra),
            text,
        }
    }

    /// The estimated roofline of the kernels as SVG (CPU libraries; a GPU's kernels are in report.json).
    pub fn roofline(&self, title: &str) -> Option<String> {
        match self {
            Library::Cpu(c) => Some(crate::svg::roofline(
                title,
                &c.cfg.target,
                &c.kernel_records(),
            )),
            Library::Gpu(_) => None,
            Library::Batched(b) => Some(crate::svg::roofline(
                title,
                &b.largest().cfg.target,
                &b.largest().kernel_records(),
            )),
        }
    }

    /// Writes the library, header, binding or PTX, dumps and `extra` into `dir`, all or none.
    pub fn write(
        &self,
        dir: &Path,
        stem: &str,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<PathBuf>> {
        match self {
            Library::Cpu(c) => c.write_library(dir, stem, extra),
            Library::Gpu(c) => c.write_library(dir, stem, extra),
            Library::Batched(b) => b.write_library(dir, stem, extra),
        }
    }

    /// What was checked beyond the pipeline's own verifiers (for a GPU: whether ptxas assembled the PTX),
    /// and how many contractions run in integers (a quantized model's, `integer_note`).
    pub fn notes(&self) -> Vec<String> {
        match self {
            Library::Cpu(c) => quantization_notes(c).collect(),
            Library::Batched(b) => {
                let sizes: Vec<String> = b.variants.iter().map(|(k, _)| k.to_string()).collect();
                let first = b.variants.first().map(|(_, c)| quantization_notes(c));
                first.into_iter().flatten().chain([format!(
                    "dynamic batch over '{}' (1 to {}): built at batch {}; checked that items do not mix",
                    b.symbol.escape_default(),
                    b.max_batch,
                    sizes.join(", ")
                )])
                .collect()
            }
            Library::Gpu(c) => vec![match &c.ptxas {
                Some(p) => format!("ptxas ({}) assembled every kernel for {}", p.display(), c.cfg.target.name()),
                None => "warning: no ptxas found (set MLOPT_PTXAS or put it on PATH): the PTX is not checked and the report has no registers".into(),
            }],
        }
    }
}

/// What a quantized build says: how many contractions run in integers (`integer_note`) and, where
/// mlopt quantized the model (`--precision int8`), each output's error against fp32.
fn quantization_notes(c: &Compiled) -> impl Iterator<Item = String> {
    integer_note(c)
        .into_iter()
        .chain(mlopt_rewrite::report::int8_errors(&c.optimized))
}

/// How many of `c`'s convolutions and matrix products run as integer contractions (i16 operands summed
/// in i32: a quantized model's, `mlopt-rewrite`'s `rules/quant.rs`), when any do.
fn integer_note(c: &Compiled) -> Option<String> {
    let g = &c.optimized.plan.graph;
    let (mut all, mut integer) = (0, 0);
    for n in g.node_ids() {
        let node = g.node(n);
        if matches!(
            node.op,
            mlopt_ir::Op::Conv(_) | mlopt_ir::Op::MatMul | mlopt_ir::Op::Gemm { .. }
        ) {
            all += 1;
            integer += usize::from(
                node.outputs
                    .first()
                    .is_some_and(|t| t.dtype == mlopt_ir::DType::I32),
            );
        }
    }
    (integer > 0).then(|| {
        format!(
            "{integer} of {all} convolutions and matrix products run as integer contractions (8-bit values less their zero points, summed exactly in i32 on the integer dot product); the others in float"
        )
    })
}

/// A CPU build's part of its report: the plan, configuration and stage times, its fields, its text.
type Parts<'a> = (
    &'a mlopt_rewrite::Optimized,
    &'a mlopt_rewrite::Config,
    &'a Vec<(&'static str, f64)>,
    Vec<(&'static str, String)>,
    String,
);

fn cpu_parts(c: &Compiled) -> Parts<'_> {
    let mem = &c.memory;
    let extra = vec![
        ("arena_bytes", mem.arena_bytes.to_string()),
        ("in_place", mem.in_place.len().to_string()),
        ("kernels_compiled", c.program.kernels.len().to_string()),
    ];
    let text = format!(
            "{}{}activation arena: {:.3} MB for {} stored values ({} written in place, {} views; {:.3} MB without reuse)\n{}",
            mlopt_rewrite::report::header(&c.optimized, &c.cfg),
            mlopt_rewrite::report::table(&c.optimized),
            mem.arena_bytes as f64 / 1e6,
            mem.slots.len(),
            mem.in_place.len(),
            mem.aliases.len(),
            mem.unshared_bytes as f64 / 1e6,
            Library::stages(&c.times)
        );
    (&c.optimized, &c.cfg, &c.times, extra, text)
}

/// The files a compile writes for the stages' texts: `<stem>.<suffix>` each (`Stage::dump_suffix`).
pub(crate) fn dump_files(
    dumps: &[(crate::Stage, String)],
    stem: &str,
    target: &mlopt_target::Target,
) -> Vec<(String, String)> {
    dumps
        .iter()
        .filter_map(|(st, text)| {
            Some((format!("{stem}.{}", st.dump_suffix(target)?), text.clone()))
        })
        .collect()
}
