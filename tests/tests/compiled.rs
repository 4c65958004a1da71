//! Compiled code on the fixture models: each optimised fixture is lowered, compiled by LLVM for this
//! machine, loaded into the process and run on the fixture's inputs; its outputs must match the graph
//! interpreter's. The unoptimised LLVM IR of each fixture is snapshot-tested.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_cost::Target;
use mlopt_ir::interp;
use mlopt_llvm::{c_name, compile, CpuTarget};
use mlopt_lower::{lower_program, program::tensor, Options};
use mlopt_rewrite::{optimize, Config, Precision};
use mlopt_runtime::Loaded;
use mlopt_tests::{data, import, FIXTURES};

fn run_compiled(name: &str, precision: Precision, threads: u32) -> (f64, mlopt_llvm::Output) {
    let g = import(name);
    let mut cfg = Config::new(Target::named("x86-64-v4", threads).unwrap());
    cfg.precision = precision;
    let o = optimize(&g, &cfg).unwrap();
    let t = CpuTarget::named("host").unwrap();
    let p = lower_program(&o.plan.graph, &Options { cpu: Some(mlopt_lower::CpuSchedule { lanes: t.lanes, threads }) }).unwrap();
    let out = compile(&p, &t, threads).unwrap_or_else(|e| panic!("{name}: {e}"));
    let size = |io: &mlopt_kir::Io| (io.dims.iter().product::<u64>() * io.elem.size()) as usize;
    let mut lib = Loaded::new(&out.object, &format!("mlopt_{}_run", c_name(&p.name)), p.arena_bytes, p.inputs.iter().map(size).collect(), p.outputs.iter().map(size).collect()).unwrap();
    let (inputs, _) = data(name);
    let bytes: Vec<Vec<u8>> = p.inputs.iter().map(|io| inputs[&io.name].to_le_bytes()).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
    let mut outs: Vec<Vec<u8>> = p.outputs.iter().map(|io| vec![0u8; size(io)]).collect();
    lib.run(&refs, &mut outs).unwrap();
    let want = interp::run(&o.plan.graph, &inputs).unwrap();
    let mut worst = 0f64;
    for ((io, b), (wn, w)) in p.outputs.iter().zip(&outs).zip(&want) {
        assert_eq!(&io.name, wn);
        let got = tensor(io, b).unwrap();
        worst = worst.max(mlopt_rewrite::optimize::scaled_error(w, &got));
    }
    (worst, out)
}

#[test]
fn compiled_fixtures_match_the_interpreter() {
    for name in FIXTURES {
        for threads in [1, 2] {
            let (err, _) = run_compiled(name, Precision::Fp32, threads);
            assert!(err < 1e-5, "{name} with {threads} threads: error {err:e}");
        }
    }
}
