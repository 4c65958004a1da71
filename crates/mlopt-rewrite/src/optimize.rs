//! The optimiser's driver: load, saturate within limits, extract, fuse; for `--precision auto`, check the
//! result against the fp32 interpreter and back off lowered ops until it is within tolerance.

use crate::convert::{build, load};
use crate::error::{Result, RewriteError};
use crate::extract::extract;
use crate::fuse::{fuse, Plan};
use crate::rules::{rules, RuleSet};
use egg::{Runner, StopReason};
use mlopt_cost::Cost;
use mlopt_ir::{DType, Graph, Tensor};
use mlopt_target::{MatrixPrecision, Target};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
    /// Low precision where the cost model says it pays, then checked against fp32 within the tolerance.
    Auto,
    /// Contractions quantized to 8 bits by mlopt, on ranges calibrated on real inputs (`quantize.rs`),
    /// run as integer contractions; each output's error against fp32 reported.
    Int8,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Auto => "auto",
            Precision::Int8 => "int8",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            "auto" => Ok(Precision::Auto),
            "int8" => Ok(Precision::Int8),
            _ => Err(format!(
                "unknown precision '{s}' (fp32, bf16, fp16, auto, int8)"
            )),
        }
    }
}

/// Equality-saturation limits; the first reached stops the run and is reported.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub iterations: usize,
    pub nodes: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            iterations: 12,
            nodes: 200_000,
            time: Duration::from_secs(10),
        }
    }
}

/// What the optimiser is asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: Target,
    pub precision: Precision,
    pub memory_budget: Option<u64>,
    /// `auto` precision: the largest error allowed, relative to each output's largest magnitude.
    pub tolerance: f64,
    /// `auto` precision: input sets to check on (random inputs when empty); `int8`: the sets its
    /// activations' ranges are calibrated on, and its error measured on.
    pub calibration: Vec<HashMap<String, Tensor>>,
    pub limits: Limits,
    /// Show a spinner on stderr while saturating (drawn only when stderr is a terminal).
    pub progress: bool,
}

impl Config {
    pub fn new(target: Target) -> Config {
        Config {
            target,
            precision: Precision::Fp32,
            memory_budget: None,
            tolerance: 1e-2,
            calibration: vec![],
            limits: Limits::default(),
            progress: false,
        }
    }
}

/// Figures of one optimisation, for the dump header and the report.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub stop_reason: String,
    pub iterations: usize,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub saturate_s: f64,
    pub extract_s: f64,
    /// Times each rule was applied.
    pub applied: BTreeMap<String, usize>,
    /// The extracted graph's DAG cost with one kernel per op, before fusion.
    pub extracted: Cost,
    /// `auto` precision: ops kept in fp32 by the check, and the final error.
    pub backed_off: Vec<String>,
    pub precision_error: Option<f64>,
    /// `int8`: the contractions quantized, and each output's error against fp32 (largest over the
    /// calibration sets, scaled as `scaled_error`).
    pub quantized: usize,
    pub output_errors: Vec<(String, f64)>,
}

/// The result: the fused plan, the cost of the input graph with one kernel per op, and the figures.
#[derive(Debug, Clone)]
pub struct Optimized {
    pub plan: Plan,
    pub before: Cost,
    pub stats: Stats,
}

/// Optimises `g` for `cfg.target`.
pub fn optimize(g: &Graph, cfg: &Config) -> Result<Optimized> {
    if cfg.precision == Precision::Int8 {
        return int8(g, cfg);
    }
    // tf32 tensor cores round fp32 operands to 10 mantissa bits, which the interpreter does not model, so
    // `auto` (whose promise is a checked error) does not use them; bf16/fp16 accept less precision anyway.
    let tf32 = matches!(cfg.precision, Precision::Bf16 | Precision::Fp16);
    // The input graph is costed under the same assumptions as the plan, so before/after compare like with like.
    let before = crate::fuse::unfused_cost(g, &cfg.target, tf32);
    let lower_to = match cfg.precision {
        Precision::Fp32 | Precision::Int8 => None,
        Precision::Bf16 => Some(DType::BF16),
        Precision::Fp16 => Some(DType::F16),
        Precision::Auto => Some(if cfg.target.fast_matrix(MatrixPrecision::Bf16).is_some() {
            DType::BF16
        } else {
            DType::F16
        }),
    };
    let set = RuleSet {
        algebra: true,
        layout: true,
        fusion: true,
        merge: true,
        lower_to,
        // A quantized model's contractions in integers wherever the CPU has an integer dot product
        // (under every precision: the integer sum is the one the model specifies).
        integer: cfg.target.cpu().is_some_and(|c| c.i16_dot().is_some()),
    };
    let mut keep: HashSet<String> = HashSet::new();
    let mut backed_off: Vec<String> = vec![];
    let mut reference: Option<Reference> = None;
    let mut round = 0u32;
    loop {
        let (plan, mut stats) = run_once(g, cfg, &set, &keep, tf32)?;
        let mut lowered = if cfg.precision == Precision::Auto {
            lowered_ops(&plan.graph)
        } else {
            vec![]
        };
        // Nothing lowered: nothing to check (and integer-only models need no calibration inputs).
        if lowered.is_empty() {
            return Ok(Optimized {
                plan,
                before,
                stats,
            });
        }
        let source = if cfg.calibration.is_empty() {
            "random inputs (use --calibration DIR for real ones)"
        } else {
            "the calibration inputs"
        };
        let checking = |e: RewriteError| {
            RewriteError::Precision(format!("checking --precision auto on {source}: {e}"))
        };
        let reference = match &mut reference {
            Some(r) => r,
            None => reference.insert(Reference::new(g, cfg).map_err(checking)?),
        };
        let err = reference.error(&plan.graph).map_err(checking)?;
        stats.precision_error = Some(err);
        stats.backed_off = backed_off.clone();
        if err <= cfg.tolerance {
            return Ok(Optimized {
                plan,
                before,
                stats,
            });
        }
        // Back off the lowered ops with the most FLOPs (the longest contractions round the most): one in the
        // first round, then twice as many each round, so a model with n matrix ops needs O(log n) rounds.
        lowered.retain(|(n, _)| !n.is_empty() && !keep.contains(n));
        if lowered.is_empty() {
            // Every lowered op that has a name is held, and the error is still above the tolerance: the
            // rest have no name to hold them by (a bf16 convolution feeding a bf16 ReLU, whose fp32
            // cast carries the ReLU's name). The plan is then fp32 throughout, which meets any
            // tolerance. (`auto` failed here on ResNet-50, GoogLeNet and RegNet-Y with random inputs.)
            let fp32 = RuleSet {
                lower_to: None,
                ..set
            };
            let (plan, mut stats) = run_once(g, cfg, &fp32, &keep, false)?;
            let err = reference.error(&plan.graph).map_err(checking)?;
            if err > cfg.tolerance {
                return Err(RewriteError::Precision(format!(
                    "error {err:.3e} exceeds the tolerance {:.1e} with every op in fp32",
                    cfg.tolerance
                )));
            }
            stats.precision_error = Some(err);
            backed_off.push("every matrix op".into());
            stats.backed_off = backed_off;
            return Ok(Optimized {
                plan,
                before,
                stats,
            });
        }
        lowered.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, _) in lowered.into_iter().take(1 << round.min(20)) {
            backed_off.push(name.clone());
            keep.insert(name);
        }
        round += 1;
    }
}

/// `--precision int8`: `g` quantized on the calibration sets (`quantize.rs`) and optimised as the QDQ
/// model it becomes, each output's error against `g` in fp32 measured on the same sets.
fn int8(g: &Graph, cfg: &Config) -> Result<Optimized> {
    if cfg.target.cpu().is_none_or(|c| c.i16_dot().is_none()) {
        return Err(RewriteError::Precision(format!(
            "--precision int8: {} has no integer dot product mlopt uses (integer contractions run on x86-64 CPUs with AVX2)",
            cfg.target
        )));
    }
    let q = crate::quantize::quantize(g, &cfg.calibration)?;
    let fp32 = Config {
        precision: Precision::Fp32,
        ..cfg.clone()
    };
    let mut o = optimize(&q.graph, &fp32)?;
    o.before = crate::fuse::unfused_cost(g, &cfg.target, false);
    let reference = Reference {
        sets: cfg.calibration.iter().cloned().zip(q.fp32).collect(),
    };
    let errors = reference.errors(&o.plan.graph)?;
    o.stats.precision_error = errors.iter().map(|e| e.1).reduce(f64::max);
    o.stats.output_errors = errors;
    o.stats.quantized = q.contractions;
    Ok(o)
}

/// One saturation + extraction + fusion, with the ops named in `keep` held in fp32.
fn run_once(
    g: &Graph,
    cfg: &Config,
    set: &RuleSet,
    keep: &HashSet<String>,
    tf32: bool,
) -> Result<(Plan, Stats)> {
    let mut loaded = load(g, true)?;
    loaded.eg.analysis.keep_fp32 = loaded
        .names
        .iter()
        .filter(|(_, n)| keep.contains(*n))
        .map(|(id, _)| *id)
        .collect();
    let roots: Vec<egg::Id> = loaded.roots.iter().map(|r| r.1).collect();
    let start = Instant::now();
    let bar = progress_bar(cfg.progress);
    let hook_bar = bar.clone();
    let runner = Runner::default()
        .with_egraph(std::mem::take(&mut loaded.eg))
        .with_iter_limit(cfg.limits.iterations)
        .with_node_limit(cfg.limits.nodes)
        .with_time_limit(cfg.limits.time)
        .with_hook(move |r| {
            hook_bar.set_message(format!(
                "saturating: iteration {}, {} e-nodes",
                r.iterations.len() + 1,
                r.egraph.total_number_of_nodes()
            ));
            hook_bar.tick();
            Ok(())
        })
        .run(&rules(set));
    bar.finish_and_clear();
    let saturate_s = start.elapsed().as_secs_f64();
    let mut stats = Stats {
        stop_reason: match &runner.stop_reason {
            Some(StopReason::Saturated) => "saturated".into(),
            Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
            Some(StopReason::NodeLimit(n)) => format!("e-node limit ({n})"),
            Some(StopReason::TimeLimit(s)) => format!("time limit ({s:.1} s)"),
            Some(StopReason::Other(s)) => s.clone(),
            None => "not run".into(),
        },
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        egraph_classes: runner.egraph.number_of_classes(),
        saturate_s,
        ..Default::default()
    };
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            *stats.applied.entry(rule.to_string()).or_default() += n;
        }
    }
    loaded.eg = runner.egraph;
    let start = Instant::now();
    let mut opts = crate::extract::Options {
        allow_tf32: tf32,
        force_low: matches!(cfg.precision, Precision::Bf16 | Precision::Fp16),
        ..Default::default()
    };
    let mut best: Option<(Plan, Cost)> = None;
    // Twice at most: the second time with the narrow products the first plan stores in f32 rounded
    // before their store instead (half the bytes; extraction cannot see where fusion puts a kernel's
    // boundary), kept where the plan is cheaper.
    for _ in 0..2 {
        for (choice, cost) in extract(&loaded.eg, &roots, &cfg.target, &opts) {
            let mut extracted = build(&loaded, &choice)?;
            if let Some(lo) = set.lower_to {
                crate::rules::precision::narrow_shared(&mut extracted, lo)?;
                crate::rules::precision::widen_per_reader(&mut extracted)?;
            }
            let plan = fuse(&extracted, &cfg.target, tf32, cfg.memory_budget)?;
            if best.as_ref().is_none_or(|b| plan.total < b.0.total) {
                best = Some((plan, cost));
            }
        }
        let stored = best
            .as_ref()
            .map(|b| stored_widening(&b.0.graph, &loaded))
            .unwrap_or_default();
        if stored.is_empty() || !opts.narrow_stores.is_empty() {
            break;
        }
        opts.narrow_stores = stored;
    }
    let (plan, cost) =
        best.ok_or_else(|| RewriteError::Internal("extraction produced no graph".into()))?;
    stats.extracted = cost;
    stats.extract_s = start.elapsed().as_secs_f64();
    Ok((plan, stats))
}

/// The classes of the widening products (see `rules::precision::widening_product`) that the fused
/// graph `g` writes to memory for other kernels to read (a graph output is f32 either way): each a
/// kernel's root, found by its node's name.
fn stored_widening(g: &Graph, loaded: &crate::convert::Loaded) -> HashSet<egg::Id> {
    let returned: HashSet<mlopt_ir::NodeId> =
        g.graph_outputs().iter().map(|(_, v)| v.node).collect();
    let by_name: HashMap<&str, egg::Id> = loaded
        .names
        .iter()
        .map(|(id, n)| (n.as_str(), loaded.eg.find(*id)))
        .collect();
    g.kernels()
        .values()
        .flat_map(|k| k.roots.iter().copied())
        .filter(|&r| {
            crate::rules::precision::narrow_product(g, r)
                && g.node(r).outputs[0].dtype == DType::F32
                && !returned.contains(&r)
        })
        .filter_map(|r| by_name.get(g.node(r).name.as_str()).copied())
        .collect()
}

fn progress_bar(on: bool) -> indicatif::ProgressBar {
    if !on {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Low-precision matrix ops of `g` (name, FLOPs): the widening ones by their own name, the rounded
/// ones by the fp32 cast reading them, which carries the original op's name (its class's name).
fn lowered_ops(g: &Graph) -> Vec<(String, f64)> {
    let mut out = vec![];
    for n in g.node_ids() {
        if !crate::rules::precision::narrow_product(g, n) {
            continue;
        }
        let node = g.node(n);
        let flops = mlopt_cost::op_work(&node.op, &g.input_types(n), &node.outputs, false).flops();
        let name = if node.outputs[0].dtype == DType::F32 {
            node.name.clone()
        } else {
            g.users(n)
                .iter()
                .map(|(u, _)| g.node(*u).name.clone())
                .find(|s| !s.is_empty())
                .unwrap_or_else(|| node.name.clone())
        };
        out.push((name, flops));
    }
    out
}

/// The fp32 graph's outputs on the calibration sets (or 3 random ones), computed once per optimisation.
struct Reference {
    /// (inputs, fp32 outputs) per calibration set.
    sets: Vec<(Inputs, Vec<(String, Tensor)>)>,
}

type Inputs = HashMap<String, Tensor>;

impl Reference {
    fn new(orig: &Graph, cfg: &Config) -> Result<Reference> {
        let inputs: Vec<HashMap<String, Tensor>> = if cfg.calibration.is_empty() {
            (0..3).map(|s| random_inputs(orig, s)).collect()
        } else {
            cfg.calibration.clone()
        };
        let sets = inputs
            .into_iter()
            .map(|i| Ok((i.clone(), mlopt_ir::interp::run(orig, &i)?)))
            .collect::<Result<_>>()?;
        Ok(Reference { sets })
    }

    /// The largest error of `opt`, each output's error divided by its largest magnitude (at least 1).
    fn error(&self, opt: &Graph) -> Result<f64> {
        Ok(self.errors(opt)?.iter().map(|e| e.1).fold(0f64, f64::max))
    }

    /// Each output's largest error over the sets, divided by its largest magnitude (at least 1).
    fn errors(&self, opt: &Graph) -> Result<Vec<(String, f64)>> {
        let mut worst: Vec<(String, f64)> = vec![];
        for (inputs, want) in &self.sets {
            let got = mlopt_ir::interp::run(opt, inputs)?;
            for (i, ((name, w), (_, o))) in want.iter().zip(&got).enumerate() {
                if w.shape() != o.shape() {
                    return Err(RewriteError::Internal(format!(
                        "output {name} changed shape"
                    )));
                }
                let e = scaled_error(w, o);
                match worst.get_mut(i) {
                    Some(slot) => slot.1 = slot.1.max(e),
                    None => worst.push((name.clone(), e)),
                }
            }
        }
        Ok(worst)
    }
}

/// The largest difference between `got` and `want`, divided by `want`'s largest finite magnitude (at least
/// 1): the error measure of `--tolerance` and of the optimiser's tests. NaN against NaN and equal infinities
/// count as equal; NaN against a number, or differing infinities, is an infinite error.
pub fn scaled_error(want: &Tensor, got: &Tensor) -> f64 {
    let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(1f64, |m, x| m.max(x.abs()));
    w.iter()
        .zip(&g)
        .map(|(a, b)| {
            if a == b || (a.is_nan() && b.is_nan()) {
                0.0
            } else if a.is_finite() && b.is_finite() {
                (a - b).abs() / scale
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Inputs drawn uniformly from [-1, 1) for floats (a fixed xorshift sequence per seed), zeros otherwise.
pub fn random_inputs(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0xA24B_AED4_963E_E407);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    g.graph_inputs()
        .iter()
        .map(|&n| {
            let node = g.node(n);
            let ty = &node.outputs[0];
            let t = if ty.dtype.is_float() {
                let vals: Vec<f64> = (0..ty.numel()).map(|_| next()).collect();
                Tensor::from_vec(&ty.shape, vals)
                    .map(|t| t.cast(ty.dtype))
                    .unwrap_or_else(|| Tensor::zeros(ty))
            } else {
                Tensor::zeros(ty)
            };
            (node.name.clone(), t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{Binary, Op, ReduceKind, TensorType, Unary};

    /// A 2-D convolution's attributes: stride 1, `pad` on every side.
    fn conv2d(pad: usize) -> mlopt_ir::ConvAttrs {
        mlopt_ir::ConvAttrs {
            strides: vec![1, 1],
            pads: vec![pad; 4],
            dilations: vec![1, 1],
            group: 1,
            output_padding: vec![],
        }
    }

    /// A LayerNormalization as exporters before opset 17 write it, with a constant scale and bias, becomes
    /// one `layer_norm` kernel and computes the same values.
    #[test]
    fn written_out_layer_norm_becomes_one_op() {
        let mut g = Graph::new("ln");
        let ty = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        let x = g.add_input("x", ty(&[4, 32]));
        let mean = |g: &mut Graph, v| {
            g.add(
                Op::Reduce {
                    kind: ReduceKind::Mean,
                    axes: vec![1],
                    keepdims: true,
                },
                "",
                &[v],
            )
            .unwrap()
        };
        let mu = mean(&mut g, x);
        let d = g.add(Op::Binary(Binary::Sub), "", &[x, mu]).unwrap();
        let two = g.add_const("two", Tensor::scalar(2f32));
        let sq = g.add(Op::Binary(Binary::Pow), "", &[d, two]).unwrap();
        let var = mean(&mut g, sq);
        let eps = g.add_const("eps", Tensor::scalar(1e-5f32));
        let ve = g.add(Op::Binary(Binary::Add), "", &[var, eps]).unwrap();
        let sd = g.add(Op::Unary(Unary::Sqrt), "", &[ve]).unwrap();
        let n = g.add(Op::Binary(Binary::Div), "", &[d, sd]).unwrap();
        let gamma = g.add_const(
            "gamma",
            Tensor::from_vec(&[32], (0..32).map(|i| i as f32 / 7.0).collect()).unwrap(),
        );
        let beta = g.add_const(
            "beta",
            Tensor::from_vec(&[32], (0..32).map(|i| 1.0 - i as f32 / 9.0).collect()).unwrap(),
        );
        let s = g.add(Op::Binary(Binary::Mul), "", &[n, gamma]).unwrap();
        let y = g.add(Op::Binary(Binary::Add), "", &[s, beta]).unwrap();
        g.add_output("y", y);
        let o = optimize(&g, &Config::new(Target::named("x86-64-v4", 1).unwrap())).unwrap();
        let kernels: Vec<Vec<&str>> = o.plan.kernels.iter().map(|k| k.ops.clone()).collect();
        assert_eq!(
            kernels,
            vec![vec!["layer_norm"]],
            "{}",
            mlopt_ir::print::print(&o.plan.graph)
        );
        let inputs = random_inputs(&g, 3);
        let (want, got) = (
            mlopt_ir::interp::run(&g, &inputs).unwrap(),
            mlopt_ir::interp::run(&o.plan.graph, &inputs).unwrap(),
        );
        for (a, b) in want[0].1.to_f64_vec().iter().zip(got[0].1.to_f64_vec()) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// `auto` checks only what it lowered: an integer model (whose random inputs would divide by zero) has
    /// nothing to check and optimises without calibration data.
    #[test]
    fn auto_needs_no_check_when_nothing_is_lowered() {
        let mut g = Graph::new("int");
        let ty = TensorType::new(DType::I32, vec![4]);
        let x = g.add_input("x", ty.clone());
        let y = g.add_input("y", ty);
        let z = g.add(Op::Binary(Binary::Div), "z", &[x, y]).unwrap();
        g.add_output("z", z);
        let mut cfg = Config::new(Target::named("sm_80", 1).unwrap());
        cfg.precision = Precision::Auto;
        let o = optimize(&g, &cfg).unwrap();
        assert_eq!(o.stats.precision_error, None);
    }

    /// `auto` on a CPU with a bf16 unit lowers a 1x1 convolution fed by a squeeze-excitation multiply
    /// (RegNetY's): the casts around the bf16 form fuse into their neighbours, so extraction charges
    /// them no pass over memory of their own (it did, and kept such convolutions in fp32, 1.10x slower).
    #[test]
    fn auto_lowers_a_convolution_whose_casts_fuse() {
        let mut g = Graph::new("se");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 48, 56, 56]));
        let s = g.add_input("s", TensorType::new(DType::F32, vec![1, 48, 1, 1]));
        let y = g.add(Op::Binary(Binary::Mul), "scale", &[x, s]).unwrap();
        let w: Vec<f32> = (0..48 * 48)
            .map(|i| ((i * 7919) % 200) as f32 / 1000.0 - 0.1)
            .collect();
        let w = g.add_const("w", Tensor::from_vec(&[48, 48, 1, 1], w).unwrap());
        let a = conv2d(0);
        let z = g.add(Op::Conv(a), "conv", &[y, w]).unwrap();
        g.add_output("z", z);
        let mut cfg = Config::new(Target::named("znver4", 1).unwrap());
        cfg.precision = Precision::Auto;
        cfg.tolerance = 1.0;
        let o = optimize(&g, &cfg).unwrap();
        assert_eq!(lowered_ops(&o.plan.graph).len(), 1);
    }

    /// A lowered op with no name to hold it by (here every node is unnamed; in exports, a bf16
    /// convolution whose fp32 cast carries the next ReLU's name) cannot be backed off alone: `auto`
    /// then returns the fp32 plan, within any tolerance, where it used to fail.
    #[test]
    fn auto_falls_back_to_fp32_when_it_cannot_name_what_to_hold() {
        let mut g = Graph::new("unnamed");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 64, 32, 32]));
        let w: Vec<f32> = (0..128 * 64 * 9)
            .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let w = g.add_const("", Tensor::from_vec(&[128, 64, 3, 3], w).unwrap());
        let a = conv2d(1);
        let y = g.add(Op::Conv(a), "", &[x, w]).unwrap();
        let y = g.add(Op::Unary(Unary::Relu), "", &[y]).unwrap();
        g.add_output("y", y);
        let mut cfg = Config::new(Target::named("sm_80", 1).unwrap());
        cfg.precision = Precision::Auto;
        cfg.tolerance = 1e-9;
        let o = optimize(&g, &cfg).unwrap();
        assert!(
            o.stats.precision_error.is_some_and(|e| e <= 1e-9),
            "{:?}",
            o.stats.precision_error
        );
        assert!(lowered_ops(&o.plan.graph).is_empty());
    }
}
