//! The GPU pipeline on the fixture models, without a GPU: every fixture is compiled for each NVIDIA
//! target; ptxas must assemble every kernel without spills; the GPU schedules, run by the kernel IR
//! emulator (which also reports races a missing barrier would leave), must match the graph interpreter;
//! the PTX of a few kernels is snapshot-tested (the launcher against a stand-in libcuda:
//! `gpu_launcher.rs`). With a GPU present (`nvidia-smi` finds one) the library also runs on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_driver::{compile_gpu, GpuCompiled, Options};
use mlopt_ir::interp;
use mlopt_kir::step::schedule_text;
use mlopt_kir::{GpuEngine, ScheduleStep};
use mlopt_rewrite::{Config, Precision};
use mlopt_target::Target;
use mlopt_tests::{data, import, worst_error, FIXTURES};
use std::process::Command;

fn compiled(name: &str, target: &str, precision: Precision) -> GpuCompiled {
    let g = import(name);
    let mut config = Config::new(Target::named(target, 1).unwrap());
    config.precision = precision;
    compile_gpu(
        &g,
        &Options {
            winograd: mlopt_schedule::Winograd::Never,
            ..Options::new(config)
        },
    )
    .unwrap_or_else(|e| panic!("{name} for {target}: {e}"))
}

#[test]
fn gpu_fixtures_assemble_and_emulate_correctly() {
    assert!(
        mlopt_driver::gpu::find_ptxas().is_some(),
        "no ptxas: `cargo xtask setup` installs it (nvidia-cuda-nvcc-cu12 in .venv)"
    );
    for name in FIXTURES {
        for target in ["sm_80", "sm_86", "sm_89", "sm_90"] {
            for precision in [Precision::Fp32, Precision::Bf16] {
                let c = compiled(name, target, precision);
                assert!(c.ptxas.is_some(), "{name} for {target}: ptxas did not run");
                for k in &c.kernels {
                    let p = k.ptxas.as_ref().unwrap_or_else(|| {
                        panic!("{name}/{target}: no ptxas figures for @{}", k.name)
                    });
                    assert_eq!(
                        p.spill_stores + p.spill_loads,
                        0,
                        "{name} for {target}: @{} spills",
                        k.name
                    );
                    assert!(
                        p.registers > 0 && p.registers <= 255,
                        "{name}/{target} @{}: {} registers",
                        k.name,
                        p.registers
                    );
                    assert!(
                        k.launch.block <= 1024 && k.launch.shared_bytes <= 48 * 1024,
                        "{name}/{target} @{}: {:?}",
                        k.name,
                        k.launch
                    );
                }
                assert!(
                    c.ptx.ptx.contains(&format!(".target {target}")),
                    "{name}: PTX for the wrong target"
                );
                // The emulator runs the scheduled kernels (grid, threads, shared memory, barriers).
                let (inputs, _) = data(name);
                let want = interp::run(&c.optimized.plan.graph, &inputs).unwrap();
                let got = mlopt_lower::interpret(&c.program, &inputs)
                    .unwrap_or_else(|e| panic!("{name} for {target}: {e}"));
                let tol = if precision == Precision::Fp32 {
                    1e-5
                } else {
                    1e-2
                };
                let err = worst_error(&want, &got);
                assert!(
                    err < tol,
                    "{name} for {target} in {precision:?}: error {err:e}"
                );
            }
        }
    }
}

#[test]
fn gpu_kernel_dumps_round_trip() {
    for (name, precision) in FIXTURES
        .iter()
        .flat_map(|n| [(n, Precision::Fp32), (n, Precision::Bf16)])
    {
        let c = compiled(name, "sm_80", precision);
        for k in &c.program.kernels {
            let text = mlopt_kir::print::kernel(k);
            let back =
                mlopt_kir::parse_kernel(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            assert_eq!(
                mlopt_kir::print::kernel(&back),
                text,
                "{name}: @{} does not round-trip",
                k.name
            );
            assert_eq!(
                back.schedule, k.schedule,
                "{name}: @{}'s schedule does not round-trip",
                k.name
            );
            mlopt_kir::verify(&back).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
    }
}

/// Kernels identical but for their names (a repeated layer) are compiled once: the LLVM IR defines one
/// function for them, the PTX has an entry under each name (the launch table names every kernel), and
/// ptxas's figures reach every copy. The transformer fixture repeats its layer.
#[test]
fn repeated_kernels_compile_once_and_keep_their_names() {
    let c = compiled("transformer", "sm_80", Precision::Fp32);
    let copies: Vec<&(String, String)> =
        c.ptx.sharing.iter().filter(|(k, code)| k != code).collect();
    assert!(
        !copies.is_empty(),
        "the transformer fixture repeats no kernel"
    );
    let defined = c.ptx.llvm_ir.matches("\ndefine ").count();
    assert_eq!(defined + copies.len(), c.program.kernels.len());
    let figures = |name: &str| {
        c.kernels
            .iter()
            .find(|k| k.name == name)
            .and_then(|k| k.ptxas.clone())
            .unwrap_or_else(|| panic!("no ptxas figures for @{name}"))
    };
    for (kernel, code) in copies {
        assert!(
            c.ptx.ptx.contains(&format!(".entry {kernel}(")),
            "no entry @{kernel}"
        );
        assert_eq!(figures(kernel).registers, figures(code).registers);
    }
    for k in &c.program.kernels {
        assert_eq!(c.ptx.ptx.matches(&format!(".entry {}(", k.name)).count(), 1);
    }
}

/// Model-sized contractions, built in the graph IR with splat weights: ResNet-50's 3x3 and 1x1
/// convolutions (stride 1, padded, with the bias of a folded batch norm) and a BERT-base FFN projection.
fn model_sized() -> Vec<(&'static str, mlopt_ir::Graph)> {
    use mlopt_ir::{ConvAttrs, DType, Graph, Op, Tensor, TensorType, Unary};
    let conv = |name: &'static str, c: usize, m: usize, hw: usize, k: usize| {
        let mut g = Graph::new(name);
        let x = g.add_input("x", TensorType::new(DType::F32, vec![1, c, hw, hw]));
        let w = g.add_const(
            "w",
            Tensor::full(&TensorType::new(DType::F32, vec![m, c, k, k]), 0.01),
        );
        let b = g.add_const(
            "b",
            Tensor::full(&TensorType::new(DType::F32, vec![m]), 0.5),
        );
        let a = ConvAttrs {
            strides: vec![1, 1],
            pads: vec![k / 2; 4],
            dilations: vec![1, 1],
            group: 1,
            output_padding: vec![],
        };
        let y = g.add(Op::Conv(a), "conv", &[x, w, b]).unwrap();
        let y = g.add(Op::Unary(Unary::Relu), "relu", &[y]).unwrap();
        g.add_output("y", y);
        (name, g)
    };
    let mut ffn = Graph::new("ffn");
    let x = ffn.add_input("x", TensorType::new(DType::F32, vec![128, 768]));
    let w = ffn.add_const(
        "w",
        Tensor::full(&TensorType::new(DType::F32, vec![768, 3072]), 0.01),
    );
    let y = ffn.add(Op::MatMul, "up", &[x, w]).unwrap();
    ffn.add_output("y", y);
    vec![
        conv("conv3x3_c64_56", 64, 64, 56, 3),
        conv("conv3x3_c32_64", 32, 32, 64, 3),
        conv("conv1x1_c256_56", 256, 64, 56, 1),
        ("ffn", ffn),
    ]
}

#[test]
fn gemm_register_plans_hold_at_model_sizes() {
    // A tile is chosen within the registers it plans for (its occupancy follows from them); ptxas must
    // not need more (the driver plans again with a margin when it does), nor spill.
    for (name, g) in model_sized() {
        for precision in [Precision::Fp32, Precision::Bf16] {
            let mut config = Config::new(Target::named("sm_80", 1).unwrap());
            config.precision = precision;
            let c = compile_gpu(
                &g,
                &Options {
                    winograd: mlopt_schedule::Winograd::Never,
                    ..Options::new(config)
                },
            )
            .unwrap();
            let gemm_engine = |k: &&mlopt_driver::gpu::KernelReport| {
                k.schedule.iter().find_map(|s| match s {
                    ScheduleStep::GpuGemm { engine, .. } => Some(*engine),
                    _ => None,
                })
            };
            let gemms: Vec<_> = c
                .kernels
                .iter()
                .filter(|k| gemm_engine(k).is_some())
                .collect();
            assert_eq!(
                gemms.len(),
                1,
                "{name}: {:?}",
                c.kernels.iter().map(|k| &k.schedule).collect::<Vec<_>>()
            );
            for k in gemms {
                let planned = mlopt_driver::gpu::planned_registers(&k.schedule)
                    .unwrap_or_else(|| panic!("{name}: no plan in {}", schedule_text(&k.schedule)));
                let p = k.ptxas.as_ref().unwrap();
                assert!(
                    p.registers <= planned && p.spill_stores + p.spill_loads == 0,
                    "{name} in {precision:?}: {} registers, {} planned ({})",
                    p.registers,
                    planned,
                    schedule_text(&k.schedule)
                );
                let bf16 = gemm_engine(&k) == Some(GpuEngine::Mma(mlopt_kir::Elem::BF16));
                assert_eq!(
                    bf16,
                    precision == Precision::Bf16,
                    "{name}: {}",
                    schedule_text(&k.schedule)
                );
            }
        }
    }
}

/// Attention over 3 heads of 80 queries and 72 keys (neither a multiple of the tiles), q.k depth 32,
/// values 24 wide, with inputs of type `dtype` and a mask that hides every key more than 16 before the
/// query with -inf (so later queries see whole blocks of masked keys before any they may use).
fn attention_graph(
    dtype: mlopt_ir::DType,
) -> (
    mlopt_ir::Graph,
    std::collections::HashMap<String, mlopt_ir::Tensor>,
) {
    use mlopt_ir::{Graph, Op, Tensor, TensorType};
    let (heads, s, t, d, dv) = (3, 80, 72, 32, 24);
    let mut seed = 7u64;
    let mut random = |shape: &[usize]| {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(shape, v).unwrap().cast(dtype)
    };
    let mut g = Graph::new("attention");
    let mut inputs = std::collections::HashMap::new();
    let mut ins = Vec::new();
    for (name, shape) in [
        ("q", vec![heads, s, d]),
        ("kt", vec![heads, d, t]),
        ("v", vec![heads, t, dv]),
    ] {
        ins.push(g.add_input(name, TensorType::new(dtype, shape.clone())));
        inputs.insert(name.to_string(), random(&shape));
    }
    let mask: Vec<f32> = (0..s * t)
        .map(|x| {
            if x % t + 16 < x / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    ins.push(g.add_const("mask", Tensor::from_vec(&[s, t], mask).unwrap().cast(dtype)));
    let y = g
        .add(
            Op::Attention {
                scale: 1.0 / (d as f32).sqrt(),
            },
            "attention",
            &ins,
        )
        .unwrap();
    g.add_output("y", y);
    (g, inputs)
}

#[test]
fn attention_runs_on_tensor_cores_and_matches_the_interpreter() {
    use mlopt_ir::DType;
    // bf16 operands as they are; f32 operands under bf16 precision lowered to bf16 by the precision
    // pass (as the matrix ops are); under fp32 the SIMT rows.
    for (dtype, precision, engine, tol) in [
        (DType::F32, Precision::Fp32, None, 1e-5),
        (
            DType::F32,
            Precision::Bf16,
            Some(GpuEngine::Mma(mlopt_kir::Elem::BF16)),
            8e-3,
        ),
        (
            DType::BF16,
            Precision::Fp32,
            Some(GpuEngine::Mma(mlopt_kir::Elem::BF16)),
            8e-3,
        ),
    ] {
        let (g, inputs) = attention_graph(dtype);
        let mut config = Config::new(Target::named("sm_80", 1).unwrap());
        config.precision = precision;
        let c = compile_gpu(
            &g,
            &Options {
                winograd: mlopt_schedule::Winograd::Never,
                ..Options::new(config)
            },
        )
        .unwrap();
        let k = c.kernels.iter().find(|k| k.flops > 100_000).unwrap();
        let text = schedule_text(&k.schedule);
        let attention = k.schedule.iter().find_map(|s| match s {
            ScheduleStep::GpuAttention { engine, .. } => Some(*engine),
            _ => None,
        });
        assert_eq!(attention, engine, "{dtype:?}/{precision:?}: {text}");
        let p = k.ptxas.as_ref().unwrap();
        assert_eq!(p.spill_stores + p.spill_loads, 0, "{text}: spills");
        let want = interp::run(&c.optimized.plan.graph, &inputs).unwrap();
        let got = mlopt_lower::interpret(&c.program, &inputs).unwrap();
        let err = worst_error(&want, &got);
        assert!(
            err < tol,
            "{dtype:?} in {precision:?} ({text}): error {err:e}"
        );
    }
}

/// The PTX of one entry (from `.visible .entry name(` to its closing brace).
fn entry(ptx: &str, name: &str) -> String {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry {name}"));
    let end = ptx[start..].find("\n}").map(|e| start + e + 2).unwrap();
    ptx[start..end].to_string()
}

#[test]
fn ptx_snapshots() {
    // A GEMM on SIMT FMAs: the CNN's first convolution as an implicit GEMM (block tiles in shared
    // memory, a register tile per thread), with the folded batch norm and ReLU fused into its epilogue.
    let cnn = compiled("cnn", "sm_80", Precision::Fp32);
    insta::assert_snapshot!("ptx_gemm_simt_conv_bn_relu", entry(&cnn.ptx.ptx, "k0"));
    // An elementwise kernel: the CNN's input rounded to bf16, four neighbouring elements per thread,
    // loaded 16 bytes and stored 8 bytes at a time.
    let cnn16 = compiled("cnn", "sm_80", Precision::Bf16);
    let cast = entry(&cnn16.ptx.ptx, "k0");
    for want in ["ld.global.v4.f32", "st.global.v4.u16"] {
        assert!(cast.contains(want), "no {want} in the elementwise kernel");
    }
    insta::assert_snapshot!("ptx_elementwise_cast_bf16", cast);
    // A reduction: the transformer's first layer norm, one row per block, sums by warp shuffles.
    let tr = compiled("transformer", "sm_80", Precision::Fp32);
    let norm = entry(&tr.ptx.ptx, "k0");
    assert!(
        norm.contains("shfl.sync.bfly.b32"),
        "no warp shuffle in the layer norm"
    );
    insta::assert_snapshot!("ptx_rows_layernorm", norm);
    // A tensor-core GEMM: the MLP's first layer in bf16 (tiles staged by 16-byte cp.async, ldmatrix,
    // mma.sync m16n8k16), bias + ReLU.
    let mlp = compiled("mlp", "sm_80", Precision::Bf16);
    let mma = entry(&mlp.ptx.ptx, "k1");
    for want in [
        "cp.async.cg.shared.global",
        "cp.async.wait_all",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "bar.sync",
    ] {
        assert!(mma.contains(want), "no {want} in the tensor-core GEMM");
    }
    insta::assert_snapshot!("ptx_gemm_mma_bf16_bias_relu", mma);
    // Attention on tensor cores: the transformer's, bf16 under bf16 precision (q, k and v bf16, P
    // rounded to bf16 for its product), with the merge of the heads in its store.
    let tr16 = compiled("transformer", "sm_80", Precision::Bf16);
    let names: Vec<&str> = tr16.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8_0", "k8_1"],
        "one launch per kernel (the projections store into the heads, casts and all), but the FFN's \
         down projection (16 x 64 outputs, K = 256: two blocks of eight slices) in two, split-K"
    );
    assert!(tr16.kernels[8..].iter().all(|k| k
        .schedule
        .contains(&ScheduleStep::GpuSplitK { parts: 4, k: 256 })));
    let attention = tr16
        .kernels
        .iter()
        .find(|k| {
            k.schedule
                .iter()
                .any(|s| matches!(s, ScheduleStep::GpuAttention { .. }))
        })
        .expect("an attention launch");
    let attention = entry(&tr16.ptx.ptx, &attention.name);
    assert!(
        attention.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
        "no bf16 mma.sync in the attention"
    );
    insta::assert_snapshot!("ptx_attention_bf16", attention);
}

/// On a machine with an NVIDIA GPU, every fixture's library (fp32 and bf16 for sm_80, fp32 for sm_90)
/// runs there, linked into a C program, and matches the interpreter on the optimised graph. It needs
/// the GPU, so `cargo test` lists it as ignored; `cargo xtask test` runs it where `nvidia-smi` finds a
/// GPU and prints `skipped: no GPU` where none is (the PTX is still checked by ptxas and every schedule
/// by the emulator).
#[test]
#[ignore = "needs an NVIDIA GPU: `cargo xtask test` runs it where nvidia-smi finds one"]
fn the_gpu_library_runs_on_a_real_gpu() {
    let gpu = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .expect("this test needs an NVIDIA GPU, and nvidia-smi found none");
    eprintln!("running on {}", String::from_utf8_lossy(&gpu.stdout).trim());
    let mut failures = Vec::new();
    for name in FIXTURES {
        for (target, precision, tolerance) in [
            ("sm_80", Precision::Fp32, 1e-4),
            ("sm_80", Precision::Bf16, 2e-2),
            ("sm_90", Precision::Fp32, 1e-4),
        ] {
            let what = format!("{name} for {target} in {precision:?}");
            match run_on_gpu(name, target, precision) {
                Ok(err) if err < tolerance => eprintln!("{what}: error {err:e}"),
                Ok(err) => failures.push(format!("{what}: error {err:e}")),
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fixture `name` compiled for `target` at `precision`, run on the GPU by a C program on its test
/// input: the worst error against the interpreter on the optimised graph, or why it did not run.
fn run_on_gpu(name: &str, target: &str, precision: Precision) -> Result<f64, String> {
    let c = compiled(name, target, precision);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    c.write_library(dir.path(), name, &[])
        .map_err(|e| e.to_string())?;
    let (inputs, _) = data(name);
    let x = &inputs[&c.program.inputs[0].name];
    std::fs::write(dir.path().join("x.bin"), x.to_le_bytes()).map_err(|e| e.to_string())?;
    let up = name.to_uppercase();
    let main = format!(
        r#"
#include <stdio.h>
#include "{name}.h"
int main(void) {{
    static float x[MLOPT_{up}_INPUT0_ELEMS], y[MLOPT_{up}_OUTPUT0_ELEMS];
    FILE *f = fopen("x.bin", "rb"); if (fread(x, sizeof x, 1, f) != 1) return 5; fclose(f);
    void *m = mlopt_{name}_create(0);
    if (!m) {{ fprintf(stderr, "%s\n", mlopt_{name}_last_error()); return 3; }}
    const void *in[] = {{x}}; void *out[] = {{y}};
    if (mlopt_{name}_run(m, in, out)) {{ fprintf(stderr, "%s\n", mlopt_{name}_last_error()); return 4; }}
    fwrite(y, sizeof y, 1, stdout);
    mlopt_{name}_destroy(m);
    return 0;
}}
"#
    );
    std::fs::write(dir.path().join("main.c"), main).map_err(|e| e.to_string())?;
    let cc = Command::new("cc")
        .current_dir(dir.path())
        .args(["main.c", "-L.", &format!("-l{name}"), "-ldl", "-o", "main"])
        .output()
        .map_err(|e| e.to_string())?;
    if !cc.status.success() {
        return Err(String::from_utf8_lossy(&cc.stderr).into_owned());
    }
    let out = Command::new(dir.path().join("main"))
        .current_dir(dir.path())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let io = &c.program.outputs[0];
    let got = vec![(
        io.name.clone(),
        mlopt_lower::program::tensor(io, &out.stdout).map_err(|e| e.to_string())?,
    )];
    let want = interp::run(&c.optimized.plan.graph, &inputs).map_err(|e| e.to_string())?;
    Ok(worst_error(&want, &got))
}
