//! Compile ONNX models with mlopt from a `build.rs`, in the style of prost-build: each model becomes a
//! static library in `OUT_DIR`, cargo is told to link it, and its safe Rust binding is a module to
//! include.
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), mlopt_build::Error> {
//!     mlopt_build::Config::new()
//!         .input_shape("x", &[1, 3, 224, 224])
//!         .compile("models/resnet50.onnx")?; // the library `resnet50`
//!     Ok(())
//! }
//! ```
//!
//! ```text
//! // src/main.rs: one module per compiled model, named like its library (`resnet50::Model`).
//! include!(concat!(env!("OUT_DIR"), "/mlopt/models.rs"));
//!
//! fn main() -> Result<(), resnet50::Error> {
//!     let mut model = resnet50::Model::new()?;
//!     let x = vec![0f32; resnet50::INPUT0_SHAPE.iter().product()];
//!     let mut y = vec![0f32; resnet50::OUTPUT0_SHAPE.iter().product()];
//!     model.run(&x, &mut y)
//! }
//! ```
//!
//! The compiler is the `mlopt` binary (as prost-build runs `protoc`): the one the `MLOPT` environment
//! variable names, else `mlopt` on `PATH` (`cargo install --path crates/mlopt-cli` installs it). Cargo
//! reruns the build script when a model file, the `mlopt` binary it found or `MLOPT` changes; the
//! options are in `build.rs` itself, whose change reruns it too. A library is named like `mlopt compile`
//! names it: [`Config::name`], else the model file's name made a C identifier; models compiled by one
//! build script need different names. Each model's `Model` is `Send` (it may move to another thread)
//! and not `Sync` (`run` takes `&mut self`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What went wrong: the message says which model and what `mlopt` printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// How models are compiled: the options of `mlopt compile`, applied to every model passed to
/// [`Config::compile`] after they are set.
#[derive(Debug, Clone, Default)]
pub struct Config {
    args: Vec<String>,
    name: Option<String>,
    max_batch: Option<(String, u64)>,
    out_dir: Option<PathBuf>,
    mlopt: Option<PathBuf>,
    /// (name, binding path) of each model compiled so far, for `models.rs`.
    compiled: Vec<(String, PathBuf)>,
}

impl Config {
    pub fn new() -> Config {
        Config::default()
    }

    /// `--target`: host (the default: the CPU the build runs on), x86-64-v3, x86-64-v4, znver4,
    /// sapphirerapids, or sm_80, sm_86, sm_89, sm_90 for NVIDIA GPUs.
    pub fn target(&mut self, target: &str) -> &mut Config {
        self.arg("--target").arg(target)
    }

    /// `--threads`: threads the parallel loops use unless the program sets another count.
    pub fn threads(&mut self, n: usize) -> &mut Config {
        self.arg("--threads").arg(&n.to_string())
    }

    /// `--precision`: fp32 (the default), bf16, fp16 or auto.
    pub fn precision(&mut self, precision: &str) -> &mut Config {
        self.arg("--precision").arg(precision)
    }

    /// `--input-shape NAME=DIMS`: pins an input's symbolic dimensions.
    pub fn input_shape(&mut self, input: &str, dims: &[usize]) -> &mut Config {
        let d: Vec<String> = dims.iter().map(usize::to_string).collect();
        self.arg("--input-shape")
            .arg(&format!("{input}={}", d.join("x")))
    }

    /// `--input-value NAME=V,V,..`: fixes an input to a value (it is no longer an input of the library).
    pub fn input_value(&mut self, input: &str, values: &[f64]) -> &mut Config {
        let v: Vec<String> = values.iter().map(f64::to_string).collect();
        self.arg("--input-value")
            .arg(&format!("{input}={}", v.join(",")))
    }

    /// Any other `mlopt compile` argument (`--memory-budget`, `--tune`, ...), passed as it is.
    pub fn arg(&mut self, arg: &str) -> &mut Config {
        self.args.push(arg.to_string());
        self
    }

    /// `--name` of the next model compiled (then reset): its library, symbols and module. Default: the
    /// model file's name made a C identifier (`my-model.onnx`: `my_model`).
    pub fn name(&mut self, name: &str) -> &mut Config {
        self.name = Some(name.to_string());
        self
    }

    /// `--max SYMBOL=BOUND` for the next model compiled (then reset): a dynamic batch, whose `run` takes
    /// the number of items, 1 to `bound` (`SYMBOL`: the inputs' first dimension, named in
    /// [`Config::input_shape`]'s dims or the model's own symbolic dimension).
    pub fn max_batch(&mut self, symbol: &str, bound: u64) -> &mut Config {
        self.max_batch = Some((symbol.to_string(), bound));
        self
    }

    /// Where the libraries go (default: `$OUT_DIR/mlopt`).
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Config {
        self.out_dir = Some(dir.into());
        self
    }

    /// The `mlopt` binary to run (default: `$MLOPT`, else `mlopt` on `PATH`).
    pub fn mlopt(&mut self, path: impl Into<PathBuf>) -> &mut Config {
        self.mlopt = Some(path.into());
        self
    }

    /// Compiles `model` into the output folder, tells cargo to link its library and to rerun when the
    /// model or the compiler changes, and (re)writes `models.rs` there: `pub mod <name> { .. }` for
    /// every model this `Config` compiled.
    pub fn compile(&mut self, model: impl AsRef<Path>) -> Result<&mut Config, Error> {
        let model = model.as_ref();
        let out = self.output_dir()?;
        let mlopt = self.mlopt_path()?;
        let mut cmd = Command::new(&mlopt);
        cmd.arg("compile").arg(model).arg("-o").arg(&out);
        cmd.args(&self.args);
        if let Some(n) = self.name.take() {
            cmd.arg("--name").arg(n);
        }
        if let Some((sym, bound)) = self.max_batch.take() {
            cmd.arg("--max").arg(format!("{sym}={bound}"));
        }
        let output = cmd.output().map_err(|e| {
            Error(format!(
                "running {} (set MLOPT to the mlopt binary, or put it on PATH): {e}",
                mlopt.display()
            ))
        })?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(Error(format!(
                "mlopt compile {} failed ({}):\n{stderr}",
                model.display(),
                output.status
            )));
        }
        // The library's name, from the line that says what was compiled.
        let name = stderr
            .lines()
            .find_map(|l| l.split_once("; compiled ")?.1.split_once(' '))
            .map(|(n, _)| n.to_string())
            .ok_or_else(|| Error(format!("mlopt printed no library name:\n{stderr}")))?;
        if ["_", "self", "super", "crate", "Self"].contains(&name.as_str()) {
            return Err(Error(format!(
                "{} is named {name}, which cannot name a Rust module: give it another with Config::name",
                model.display()
            )));
        }
        if let Some((_, earlier)) = self.compiled.iter().find(|(n, _)| *n == name) {
            return Err(Error(format!(
                "{} and an earlier model are both named {name} ({}): give one another name with \
                 Config::name",
                model.display(),
                earlier.display()
            )));
        }
        println!("cargo:rerun-if-changed={}", model.display());
        println!("cargo:rerun-if-changed={}", mlopt.display());
        println!("cargo:rerun-if-env-changed=MLOPT");
        println!("cargo:rustc-link-search=native={}", out.display());
        println!("cargo:rustc-link-lib=static={name}");
        // The GPU launcher opens the CUDA driver with dlopen; CPU kernels call libm.
        let header = std::fs::read_to_string(out.join(format!("{name}.h")))
            .map_err(|e| Error(format!("reading {name}.h: {e}")))?;
        println!(
            "cargo:rustc-link-lib={}",
            if header.contains("-ldl") { "dl" } else { "m" }
        );
        self.compiled.push((name, model.to_path_buf()));
        self.write_models(&out)?;
        Ok(self)
    }

    /// `models.rs`: a module per compiled model (a raw identifier, so a model named `type` works), each
    /// including its binding by its absolute path (an `include!` in an included file would resolve a
    /// relative path against the including crate).
    fn write_models(&self, out: &Path) -> Result<(), Error> {
        let mut text =
            String::from("// Generated by mlopt-build: one module per compiled model.\n");
        for (name, _) in &self.compiled {
            let binding = out.join(format!("{name}.rs"));
            let path = binding
                .to_str()
                .ok_or_else(|| Error(format!("{} is not UTF-8", binding.display())))?;
            text.push_str(&format!(
                "#[allow(dead_code)]\npub mod r#{name} {{\n    include!({path:?});\n}}\n"
            ));
        }
        std::fs::write(out.join("models.rs"), text)
            .map_err(|e| Error(format!("writing models.rs: {e}")))
    }

    fn output_dir(&self) -> Result<PathBuf, Error> {
        match &self.out_dir {
            Some(d) => Ok(d.clone()),
            None => std::env::var_os("OUT_DIR")
                .map(|d| PathBuf::from(d).join("mlopt"))
                .ok_or_else(|| {
                    Error(
                        "OUT_DIR is not set: call this from a build script, or set Config::out_dir"
                            .into(),
                    )
                }),
        }
    }

    fn mlopt_path(&self) -> Result<PathBuf, Error> {
        if let Some(p) = &self.mlopt {
            return Ok(p.clone());
        }
        if let Some(p) = std::env::var_os("MLOPT") {
            return Ok(PathBuf::from(p));
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join("mlopt"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                Error("no mlopt binary: set MLOPT to its path, or put it on PATH (cargo install --path crates/mlopt-cli)".into())
            })
    }
}
