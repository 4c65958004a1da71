//! What the pipeline makes for an x86-64 CPU (`Library::Cpu`): the objects, the program they were made
//! from and what is reported of them; loading them into this process (`run`, `check`, `bench`), and
//! writing the library's files (`lib<name>.a`, the C header, the Rust binding, the stage dumps).

use crate::error::{DriverError, Result};
use mlopt_ir::Tensor;
use mlopt_kir::Program;
use mlopt_llvm::c_name;
use mlopt_runtime::{Loaded, Member};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug)]
pub struct Compiled {
    pub optimized: mlopt_rewrite::Optimized,
    pub cfg: mlopt_rewrite::Config,
    /// The arena layout of the optimised graph's values (the scratch past it is the program's).
    pub memory: mlopt_lower::MemoryPlan,
    pub program: Program,
    pub code: mlopt_llvm::Output,
    /// (stage, seconds) in pipeline order.
    pub times: Vec<(&'static str, f64)>,
    /// Each stage's text, when the pipeline kept them (`Options::dumps`).
    pub dumps: Vec<(crate::Stage, String)>,
    /// Built with per-kernel clock readings (`Options::profile`).
    pub profiled: bool,
}

impl Compiled {
    /// Links the object with the runtime and loads it into this process.
    pub fn load(&self) -> Result<Loaded> {
        let p = &self.program;
        Ok(Loaded::new(
            &members(&c_name(&p.name), &self.code)?,
            &c_name(&p.name),
            p.inputs.iter().map(mlopt_kir::Io::bytes).collect(),
            p.outputs.iter().map(mlopt_kir::Io::bytes).collect(),
        )?)
    }

    /// The input buffers for named tensors, checked against the compiled shapes and types.
    pub fn input_bytes(&self, inputs: &HashMap<String, Tensor>) -> Result<Vec<Vec<u8>>> {
        self.program
            .inputs
            .iter()
            .map(|io| {
                let t = inputs.get(&io.name).ok_or_else(|| {
                    DriverError::Input(format!("graph input '{}': no value given", io.name))
                })?;
                let want: Vec<usize> = io.dims.iter().map(|d| *d as usize).collect();
                if t.shape() != want.as_slice() || t.dtype().name() != io.elem.name() {
                    return Err(DriverError::Input(format!(
                        "input '{}' is {}, the model was compiled for {}{:?}",
                        io.name,
                        t.ty(),
                        io.elem,
                        want
                    )));
                }
                Ok(t.to_le_bytes())
            })
            .collect()
    }

    /// Whether this machine can run the code (`CpuTarget::runs_here`; GPU code never runs here).
    pub fn runs_here(&self) -> bool {
        self.cfg.target.cpu().is_some_and(|t| t.runs_here())
    }

    /// Runs the scheduled kernel IR in its interpreter on named tensors: the kernels, tiles and `mma`
    /// blocks the code was generated from, on any machine (the interpreter's `mma` is the blocks'
    /// arithmetic, so AMX schedules are checked where there are no tiles).
    pub fn interpret(&self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>> {
        mlopt_lower::program::interpret(&self.program, inputs).map_err(DriverError::Input)
    }

    /// Runs loaded code on named tensors.
    pub fn run(
        &self,
        lib: &mut Loaded,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        let ins = self.input_bytes(inputs)?;
        let refs: Vec<&[u8]> = ins.iter().map(|b| b.as_slice()).collect();
        let mut outs: Vec<Vec<u8>> = self
            .program
            .outputs
            .iter()
            .map(|io| vec![0u8; io.bytes()])
            .collect();
        lib.run(&refs, &mut outs)?;
        self.program
            .outputs
            .iter()
            .zip(&outs)
            .map(|(io, b)| {
                Ok((
                    io.name.clone(),
                    mlopt_lower::program::tensor(io, b).map_err(DriverError::Io)?,
                ))
            })
            .collect()
    }

    /// Runs loaded code `warmups` times untimed, then `runs` times, and returns each timed run's seconds
    /// (in run order): what `bench` and the profiler measure.
    pub fn timed_runs(
        &self,
        lib: &mut Loaded,
        inputs: &[&[u8]],
        warmups: usize,
        runs: usize,
    ) -> Result<Vec<f64>> {
        let mut outs: Vec<Vec<u8>> = self
            .program
            .outputs
            .iter()
            .map(|io| vec![0u8; io.bytes()])
            .collect();
        for _ in 0..warmups {
            lib.run(inputs, &mut outs)?;
        }
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            lib.run(inputs, &mut outs)?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(times)
    }

    /// Writes lib<stem>.a, <stem>.h, <stem>.rs, the stage dumps and `extra` (name, bytes: the report)
    /// into `dir`, all or none (`output.rs`); returns the paths written.
    pub fn write_library(
        &self,
        dir: &Path,
        stem: &str,
        extra: &[(String, Vec<u8>)],
    ) -> Result<Vec<PathBuf>> {
        let mut files = vec![
            (
                format!("{stem}.h"),
                crate::emit::c_header(&self.program, self.cfg.target.name()),
            ),
            (
                format!("{stem}.rs"),
                crate::emit::rust_binding(&self.program, stem),
            ),
        ];
        files.extend(crate::library::dump_files(
            &self.dumps,
            stem,
            &self.cfg.target,
        ));
        crate::output::write_files(
            dir,
            files,
            (stem, &members(stem, &self.code)?),
            mlopt_runtime::write_archive,
            extra,
        )
    }
}

/// The objects of CPU code as a library's members: the entry point's (`<stem>.o`), the weights'
/// (`<stem>.1.o`, in pieces that share the program's weight buffers), then each group of kernels'.
pub fn members<'a>(stem: &str, code: &'a mlopt_llvm::Output) -> Result<Vec<Member<'a>>> {
    let name = |i: usize| {
        if i == 0 {
            format!("{stem}.o")
        } else {
            format!("{stem}.{i}.o")
        }
    };
    let mut all = vec![Member {
        name: name(1),
        parts: code.data.parts(),
        symbols: code.data.symbols().to_vec(),
    }];
    for (i, o) in code.objects.iter().enumerate() {
        // The entry point's object goes first, the kernels' after the weights'.
        let at = if i == 0 { 0 } else { i + 1 };
        all.insert(
            at,
            Member::object(name(at), o)
                .map_err(|e| DriverError::Io(format!("{}: {e}", name(at))))?,
        );
    }
    Ok(all)
}
