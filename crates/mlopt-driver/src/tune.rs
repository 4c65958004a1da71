//! `--tune`: for each register-tiled contraction, compile the kernel with a few candidate tiles, time each
//! on this machine, keep the fastest. Results are cached per shape, vector width, thread count and CPU
//! feature set in `$MLOPT_CACHE_DIR/tiles.txt` (or `~/.cache/mlopt`), so a shape is measured once.

use crate::error::{DriverError, Result};
use mlopt_kir::{Io, Place, Program, Step};
use mlopt_schedule::{candidates, tile_key, Tile, TileKey};
use mlopt_target::{CpuTarget, Target};
use std::collections::HashMap;
use std::path::PathBuf;

fn cache_file() -> Option<PathBuf> {
    Some(mlopt_target::calibrate::cache_dir()?.join("tiles.txt"))
}

/// One cache line: `features threads m n k lanes mr nr tile_lanes`. The file is read like any other
/// input: a line whose tile is not one the cost model could pick for its shape on `t` is skipped, with a
/// warning, and its shape measured again.
fn load_cache(features: &str, t: &CpuTarget) -> HashMap<TileKey, Tile> {
    let Some(text) = cache_file().and_then(|p| std::fs::read_to_string(p).ok()) else {
        return HashMap::new();
    };
    let mut out = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        if f.first() == Some(&features) && n(1) == Some(u64::from(t.threads)) {
            if let (Some(m), Some(nn), Some(k), Some(l), Some(mr), Some(nr), Some(tl)) =
                (n(2), n(3), n(4), n(5), n(6), n(7), n(8))
            {
                let tile = Tile {
                    mr,
                    nr,
                    lanes: u32::try_from(tl).unwrap_or(0),
                };
                if l != u64::from(t.lanes()) || !mlopt_cost::tile::valid(t, tile, m, nn) {
                    eprintln!(
                        "tune: ignoring a cached tile {mr}x{nr} ({tl} lanes) for {m}x{nn}x{k}: not a tile of this shape on this target"
                    );
                    continue;
                }
                out.insert((m, nn, k, t.lanes()), tile);
            }
        }
    }
    out
}

fn store_cache(features: &str, threads: u32, key: TileKey, t: Tile) {
    let Some(path) = cache_file() else { return };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let line = format!(
        "{features} {threads} {} {} {} {} {} {} {}\n",
        key.0, key.1, key.2, key.3, t.mr, t.nr, t.lanes
    );
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&line);
    let _ = std::fs::write(&path, text);
}

/// A program that runs only step `step` of `p`, every non-weight buffer a zero-filled input.
fn solo(p: &Program, step: usize) -> Program {
    let s = &p.steps[step];
    let k = p.kernels[s.kernel].clone();
    let mut q = Program {
        name: format!("{}_{}", p.name, k.name),
        ..Program::default()
    };
    let mut args = Vec::new();
    for (b, place) in k.params().iter().zip(&s.args) {
        args.push(match place {
            Place::Weight(w) => {
                q.weights.push(p.weights[*w].clone());
                Place::Weight(q.weights.len() - 1)
            }
            _ => {
                let buf = k.buffer(*b);
                q.inputs.push(Io {
                    name: buf.name.clone(),
                    elem: buf.elem,
                    dims: buf.dims.clone(),
                    counted: None,
                    sequence: None,
                });
                Place::Input(q.inputs.len() - 1)
            }
        });
    }
    q.steps.push(Step::call(0, args));
    q.kernels.push(k);
    q
}

/// Median seconds of one run of step `step` of `p`, compiled for `t`.
fn time_step(p: &Program, step: usize, t: &CpuTarget) -> Result<f64> {
    let q = solo(p, step);
    let code = mlopt_llvm::compile(&q, t)?;
    let mut lib = mlopt_runtime::Loaded::new(
        &crate::cpu::members(&q.name, &code)?,
        &mlopt_llvm::c_name(&q.name),
        q.inputs.iter().map(Io::bytes).collect(),
        vec![],
    )?;
    let ins: Vec<Vec<u8>> = q.inputs.iter().map(|io| vec![0u8; io.bytes()]).collect();
    let refs: Vec<&[u8]> = ins.iter().map(|b| b.as_slice()).collect();
    let mut times = Vec::new();
    for i in 0..7 {
        let s = std::time::Instant::now();
        lib.run(&refs, &mut [])?;
        if i >= 2 {
            times.push(s.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Measures candidate tiles for every tiled contraction of the lowered `algorithm`, scheduled for `t`
/// with `opts` and each candidate in turn, and returns the winners (a loop inside the schedule stage).
pub fn tune(
    algorithm: &Program,
    t: &CpuTarget,
    opts: &mlopt_schedule::Options,
) -> Result<HashMap<TileKey, Tile>> {
    let target = Target::Cpu(t.clone());
    let threads = t.threads;
    let features = format!(
        "{}:{:x}",
        t.name,
        t.features
            .join(",")
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64))
    );
    let mut chosen = load_cache(&features, t);
    let base = mlopt_schedule::schedule(algorithm.clone(), &target, opts)?;
    for (si, s) in base.steps.iter().enumerate() {
        let Some(key) = base.kernels[s.kernel].schedule.iter().find_map(tile_key) else {
            continue;
        };
        if chosen.contains_key(&key) {
            continue;
        }
        let mut best: Option<(f64, Tile)> = None;
        for cand in candidates(t, key.0, key.1, key.2) {
            let mut o = opts.clone();
            o.tiles.insert(key, cand);
            let p = mlopt_schedule::schedule(algorithm.clone(), &target, &o)?;
            let secs = time_step(&p, si, t)?;
            eprintln!(
                "tune: {}x{}x{} tile {}x{}: {:.3} ms",
                key.0,
                key.1,
                key.2,
                cand.mr,
                cand.nr,
                secs * 1e3
            );
            if best.is_none_or(|(b, _)| secs < b) {
                best = Some((secs, cand));
            }
        }
        let Some((_, tile)) = best else {
            return Err(DriverError::Input(format!(
                "no tile candidates for {key:?}"
            )));
        };
        store_cache(&features, threads, key, tile);
        chosen.insert(key, tile);
    }
    Ok(chosen)
}
