//! Reading inputs and test data for `run` and `check`, pinning input shapes from them, and writing outputs.

use anyhow::{bail, Context, Result};
use mlopt_ir::Tensor;
use mlopt_onnx::interface::{read_data, Form, Given};
use mlopt_onnx::proto::ModelProto;
use mlopt_onnx::{import_model, load_model, parse_input_shape, ImportOptions};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Npy,
    Pb,
}

/// Reads and decodes a model file (once: weights can be large).
pub fn load(path: &Path) -> Result<ModelProto> {
    Ok(load_model(path)?)
}

/// A model's graph inputs that are not initializers and its outputs, in order, with their forms
/// (tensors, sequences, optionals: `mlopt_onnx::interface`).
pub struct Ports {
    pub inputs: Vec<(String, Form)>,
    pub outputs: Vec<(String, Form)>,
}

impl Ports {
    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|(n, _)| n.clone()).collect()
    }
}

/// The model's ports. Maps, sparse tensors and nested sequences are refused here, before their data is
/// read.
pub fn ports(m: &ModelProto) -> Result<Ports> {
    let (inputs, outputs) = mlopt_onnx::interface::ports(m)?;
    Ok(Ports { inputs, outputs })
}

/// The import options for `--input-shape` flags and given inputs (whose shapes pin their inputs, and
/// whose values may stand in for constants: `run` and `check` evaluate exactly those inputs).
pub fn import_options(flags: &[String], given: &Given) -> Result<ImportOptions> {
    let mut opts = ImportOptions::default();
    for (name, t) in &given.tensors {
        opts.input_shapes.insert(name.clone(), t.shape().to_vec());
    }
    opts.known_values = given.tensors.clone();
    opts.sequence_lengths = given.lengths.clone();
    opts.absent = given.absent.clone();
    let given = &given.tensors;
    for f in flags {
        let (name, dims) = parse_input_shape(f).map_err(anyhow::Error::msg)?;
        if let Some(t) = given.get(&name) {
            if t.shape() != dims.as_slice() {
                bail!(
                    "--input-shape {f} contradicts the given input of shape {:?}",
                    t.shape()
                );
            }
        }
        if opts.input_shapes.contains_key(&name) && !given.contains_key(&name) {
            bail!("--input-shape {f}: input '{name}' is given twice");
        }
        opts.input_shapes.insert(name, dims);
    }
    Ok(opts)
}

/// Adds `--input-value NAME=V,..` flags to `opts`: each names a graph input of `m`, once. `NAME=none`
/// leaves an optional input empty (as ONNX Runtime's None).
pub fn pin_values(opts: &mut ImportOptions, m: &ModelProto, flags: &[String]) -> Result<()> {
    let g = m.graph.as_ref().context("the model has no graph")?;
    for f in flags {
        let (name, value) = f.split_once('=').unwrap_or((f.as_str(), ""));
        let v = g
            .input
            .iter()
            .find(|v| v.name == name)
            .with_context(|| format!("--input-value {f}: '{name}' is not a graph input"))?;
        let twice = opts.pinned_values.contains_key(name) || opts.absent.contains(name);
        if twice {
            bail!("--input-value {f}: input '{name}' is given twice");
        }
        if value == "none" {
            if !mlopt_onnx::interface::form(v)?.is_optional() {
                bail!("--input-value {f}: input '{name}' is not optional; only an optional input may be none");
            }
            opts.absent.insert(name.to_string());
            continue;
        }
        let t = mlopt_onnx::parse_input_value(f, v)
            .map_err(|e| anyhow::anyhow!("--input-value {f}: {e}"))?;
        opts.pinned_values.insert(name.to_string(), t);
    }
    Ok(())
}

/// The library's name: `--name` as given (it must be a C identifier, as the files, symbols and macros
/// use it unchanged), else the model file's stem made one (`c_name`), never the graph's name inside the
/// file (every PyTorch export's is `main_graph`). With where it came from, for the report.
pub fn library_name(path: &Path, flag: Option<&str>) -> Result<(String, &'static str)> {
    match flag {
        Some(n) if mlopt_driver::is_c_name(n) => Ok((n.to_string(), "--name")),
        Some(n) => bail!(
            "--name {n:?} is not a C identifier (ASCII letters, digits and _, not starting with a digit, at \
             most {} bytes): the library's files, symbols and macros use it as it is; e.g. --name {}",
            mlopt_driver::NAME_MAX,
            mlopt_driver::c_name(n)
        ),
        None => {
            let stem = path.file_stem().map(|s| s.to_string_lossy());
            Ok((
                mlopt_driver::c_name(stem.as_deref().unwrap_or_default()),
                "the model file's name",
            ))
        }
    }
}

/// The model read from `path` as the pipeline's source: imported with `opts`, named `name`
/// (`library_name`), its external data read from the file's folder.
pub fn source<'a>(
    m: &'a ModelProto,
    path: &'a Path,
    name: &'a str,
    opts: &'a ImportOptions,
) -> mlopt_driver::Source<'a> {
    mlopt_driver::Source::Onnx {
        model: m,
        dir: Some(mlopt_onnx::tensor_io::folder_of(path)),
        name,
        options: opts,
    }
}

/// An error for a given input tensor whose type or shape the model's declaration of that input rules out
/// (before it pins the input's shape, so the message is about the file, not about `--input-shape`).
fn check_given(m: &ModelProto, given: &Given) -> Result<()> {
    let g = m.graph.as_ref().context("the model has no graph")?;
    for v in &g.input {
        let names = match given.lengths.get(&v.name) {
            Some(&n) => (0..n)
                .map(|k| mlopt_onnx::interface::element_name(&v.name, k))
                .collect(),
            None => vec![v.name.clone()],
        };
        for name in names {
            check_given_tensor(v, &name, given)?;
        }
    }
    Ok(())
}

/// `check_given` for the given tensor `name` (the input `v`, or an element of the sequence `v`).
fn check_given_tensor(
    v: &mlopt_onnx::proto::ValueInfoProto,
    name: &str,
    given: &Given,
) -> Result<()> {
    let Some(t) = given.tensors.get(name) else {
        return Ok(());
    };
    let (dtype, dims) = mlopt_onnx::import::declared_type(v)?;
    let fits = dims
        .as_ref()
        .is_none_or(|d| mlopt_onnx::import::fits_declared(d, t.shape()));
    if t.dtype() != dtype || !fits {
        let declared = dims
            .as_ref()
            .map_or("[?]".into(), mlopt_onnx::import::dims_text);
        bail!(
            "the tensor given for input '{name}' is {}, but the model declares {dtype}{declared}",
            t.ty()
        );
    }
    Ok(())
}

/// Imports the model read from `path`, pinning input shapes from `--input-shape` flags and from the given
/// input tensors, and inputs to the values of `--input-value` flags.
pub fn import(
    m: &ModelProto,
    path: &Path,
    (flags, values): (&[String], &[String]),
    given: &Given,
) -> Result<mlopt_ir::Graph> {
    check_given(m, given)?;
    let mut opts = import_options(flags, given)?;
    pin_values(&mut opts, m, values)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(import_model(
        m,
        Some(mlopt_onnx::tensor_io::folder_of(path)),
        &stem,
        &opts,
    )?)
}

/// `--input NAME=FILE`, or `--input FILE` for the model's inputs in order (a tensor in `.npy` or `.pb`;
/// a sequence or an optional in `.pb`, as ONNX writes them).
pub fn read_inputs(args: &[String], ports: &Ports) -> Result<Given> {
    let mut out = Given::default();
    let names = ports.input_names();
    for (i, a) in args.iter().enumerate() {
        let (k, file) = match a.split_once('=') {
            Some((n, f)) => match names.iter().position(|x| x == n) {
                Some(k) => (k, PathBuf::from(f)),
                None => bail!(
                    "--input {a}: the model has no input '{n}' (inputs: {})",
                    names.join(", ")
                ),
            },
            None if i < names.len() => (i, PathBuf::from(a)),
            None => bail!("--input {a}: the model has only {} inputs", names.len()),
        };
        let (name, form) = &ports.inputs[k];
        if out.contains(name) {
            bail!("--input {a}: input '{name}' is given twice");
        }
        let d = read_data(&file, *form).with_context(|| format!("reading input '{name}'"))?;
        out.add(name, d);
    }
    Ok(out)
}

/// `DIR/PREFIX_K.pb` for K = 0, 1, .. while they exist, read as values of the forms in turn.
/// `DIR/input_K.pb` bound to the model's inputs in order, and `DIR/output_K.pb`: the outputs as the
/// compiled model gives them (a sequence's elements in turn, nothing for an empty optional).
pub fn read_test_dir(dir: &Path, ports: &Ports) -> Result<(Given, Vec<Tensor>)> {
    let (given, expected) =
        mlopt_onnx::interface::read_test_data(dir, &ports.inputs, &ports.outputs)?;
    Ok((given, expected.into_iter().map(|(_, t)| t).collect()))
}

/// The input sets in `dir`: its subdirectories that hold an `input_0.pb`, in name order, or else
/// `dir` itself (ONNX's test-data layout, `read_test_dir`).
pub fn read_input_sets(dir: &Path, ports: &Ports) -> Result<Vec<HashMap<String, Tensor>>> {
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("input_0.pb").is_file())
        .collect();
    subdirs.sort();
    if subdirs.is_empty() {
        subdirs.push(dir.to_path_buf());
    }
    subdirs
        .iter()
        .map(|d| Ok(read_test_dir(d, ports)?.0.tensors))
        .collect()
}

/// Writes each output as `dir/NAME.npy` (or `.pb`), NAME its name with every character other than an
/// ASCII letter, digit, `.`, `_` or `-` made `_`; names that come out the same (`y:0` and `y_0`) get
/// `_2`, `_3`.. in output order, so every output has its own file. Written by rename, all or none, a
/// link at a name replaced, never written through (`mlopt_driver::output::replace_files`).
pub fn write_outputs(dir: &Path, outs: &[(String, Tensor)], format: Format) -> Result<()> {
    use mlopt_driver::output::{replace_files, Content};
    let mut files: Vec<(String, Content)> = Vec::with_capacity(outs.len());
    let mut used = std::collections::HashSet::new();
    for (name, t) in outs {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let ext = match format {
            Format::Npy => "npy",
            Format::Pb => "pb",
        };
        let file = (1..)
            .map(|i| match i {
                1 => format!("{safe}.{ext}"),
                i => format!("{safe}_{i}.{ext}"),
            })
            .find(|f| !used.contains(&f.to_ascii_lowercase()))
            .unwrap_or_default();
        used.insert(file.to_ascii_lowercase());
        let bytes = match format {
            Format::Npy => mlopt_onnx::tensor_io::npy_bytes(t),
            Format::Pb => mlopt_onnx::tensor_io::pb_bytes(t, name),
        };
        files.push((file, Content::Bytes(bytes)));
    }
    replace_files(dir, &files)?;
    Ok(())
}

/// The most items `--max` allows.
pub const MAX_BATCH: u64 = 65536;

/// `--max SYMBOL=BOUND`: the batch dimension's name and the most items a run takes.
pub fn parse_max(flag: &str) -> Result<(String, u64)> {
    let (sym, bound) = flag
        .split_once('=')
        .with_context(|| format!("--max {flag}: expected SYMBOL=BOUND (e.g. N=32)"))?;
    let plain = sym
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && sym
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !plain || sym.contains('x') {
        bail!("--max {flag}: '{sym}' is not a dimension name (letters, digits, _ and -, without x, which separates dimensions)");
    }
    let bound: u64 = bound
        .parse()
        .ok()
        .filter(|b| (1..=MAX_BATCH).contains(b))
        .with_context(|| {
            format!("--max {flag}: the bound must be a number from 1 to {MAX_BATCH}")
        })?;
    Ok((sym.to_string(), bound))
}

/// The `--input-shape` flags at batch `b`: each dimension spelled `sym` becomes `b`; and an input no
/// flag names whose declared first dimension is the symbol `sym` (and the rest static) is pinned to
/// `[b, rest..]`. An error if `sym` names no dimension at all.
pub fn shapes_at(m: &ModelProto, flags: &[String], sym: &str, b: u64) -> Result<Vec<String>> {
    let mut used = false;
    let mut out: Vec<String> = flags
        .iter()
        .map(|f| match f.split_once('=') {
            Some((name, dims)) => {
                let dims: Vec<String> = dims
                    .split(['x', ','])
                    .map(|d| {
                        if d.trim() == sym {
                            used = true;
                            b.to_string()
                        } else {
                            d.to_string()
                        }
                    })
                    .collect();
                format!("{name}={}", dims.join("x"))
            }
            None => f.clone(),
        })
        .collect();
    let g = m.graph.as_ref().context("the model has no graph")?;
    let named: HashSet<&str> = flags
        .iter()
        .filter_map(|f| f.split_once('=').map(|p| p.0))
        .collect();
    for v in &g.input {
        if named.contains(v.name.as_str()) {
            continue;
        }
        let Ok((_, Some(dims))) = mlopt_onnx::import::declared_type(v) else {
            continue;
        };
        if dims.first().is_some_and(|(d, s)| d.is_none() && s == sym) {
            let mut d = vec![b.to_string()];
            for (k, (size, s)) in dims.iter().enumerate().skip(1) {
                let size = size.with_context(|| {
                    format!("input '{}': dimension {k} ('{s}') is dynamic too; pin it with --input-shape", v.name)
                })?;
                d.push(size.to_string());
            }
            used = true;
            out.push(format!("{}={}", v.name, d.join("x")));
        }
    }
    if !used {
        bail!("--max: no --input-shape dimension and no input's first dimension is named '{sym}'");
    }
    Ok(out)
}

/// The quantization ops of `m`'s graph (subgraphs included), counted by op, as text (`3 QuantizeLinear,
/// 5 DequantizeLinear`); `None` if it has none.
pub fn quantized_ops(m: &ModelProto) -> Option<String> {
    let ops = mlopt_onnx::quantization_ops();
    let mut counts = vec![0usize; ops.len()];
    let mut graphs: Vec<&mlopt_onnx::proto::GraphProto> = m.graph.iter().collect();
    while let Some(g) = graphs.pop() {
        for n in &g.node {
            if let Some(i) = ops.iter().position(|o| *o == n.op_type) {
                counts[i] += 1;
            }
            graphs.extend(n.attribute.iter().flat_map(|a| a.g.iter().chain(&a.graphs)));
        }
    }
    let parts: Vec<String> = ops
        .iter()
        .zip(&counts)
        .filter(|(_, &c)| c > 0)
        .map(|(o, c)| format!("{c} {o}"))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}
