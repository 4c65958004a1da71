//! A program's kernels as GPU launches: blocks of one launch cannot wait for each other, so each
//! top-level nest of a kernel becomes its own launch, and a local that a later nest reads becomes a global
//! scratch buffer past the activation arena. A contraction that split-K pays for becomes two launches
//! first (`split_k.rs`).

use super::split_k;
use super::*;

/// Turns a program of plain kernels into GPU kernels, splitting kernels into launches where needed.
pub(super) fn schedule_program(p: Program, s: &GpuSchedule) -> Result<Program> {
    let mut out = Program {
        kernels: Vec::new(),
        steps: Vec::new(),
        ..p.clone()
    };
    let scratch0 = p.arena_bytes.div_ceil(256) * 256;
    let mut arena = p.arena_bytes;
    for step in &p.steps {
        let mut k = p
            .kernels
            .get(step.kernel)
            .ok_or_else(|| ScheduleError::Internal(format!("step calls kernel {}", step.kernel)))?
            .clone();
        let plain = split(&k);
        let launches = split_k::expand(&mut k, plain, s);
        let k = &k;
        // Locals read by more than one launch: global scratch, laid out from the arena's end.
        let mut scratch: HashMap<BufId, u64> = HashMap::new();
        let mut at = scratch0;
        if launches.len() > 1 {
            for (b, buf) in k.bufs.iter().enumerate() {
                let users = launches
                    .iter()
                    .filter(|(l, _)| buffer_uses(l).contains_key(&BufId(b as u32)))
                    .count();
                if buf.space == Space::Local && users > 1 {
                    scratch.insert(BufId(b as u32), at);
                    at += (buf.numel() * buf.elem.size()).div_ceil(256) * 256;
                }
            }
        }
        arena = arena.max(at);
        let n = launches.len();
        for (i, (body, how)) in launches.into_iter().enumerate() {
            let mut kernel = k.clone();
            if n > 1 {
                kernel.name = format!("{}_{i}", k.name);
            }
            kernel.body = body;
            kernel.schedule.extend(how);
            // Parameters in order: the original ones, then the scratch buffers.
            let mut order: Vec<BufId> = scratch.keys().copied().collect();
            order.sort();
            for b in &order {
                kernel.bufs[b.0 as usize].space = Space::Global;
            }
            let (mut kernel, args) = drop_unused(kernel, &step.args, &order, &scratch)?;
            let class = launch_class(&mut kernel);
            schedule_kernel(&mut kernel, class, s)?;
            // A check reads its flag once the last launch has written it.
            out.steps.push(Step {
                kernel: out.kernels.len(),
                args,
                check: step.check.clone().filter(|_| i + 1 == n),
                guard: step.guard.clone(),
            });
            out.kernels.push(kernel);
        }
    }
    out.arena_bytes = arena;
    mlopt_kir::verify_program(&out).map_err(ScheduleError::Verify)?;
    Ok(out)
}

/// The launches of a kernel: each top-level loop nest, with the statements before it.
fn split(k: &Kernel) -> Vec<Vec<Stmt>> {
    let mut out: Vec<Vec<Stmt>> = Vec::new();
    let mut pending = Vec::new();
    for s in &k.body {
        pending.push(s.clone());
        if matches!(s, Stmt::For { .. }) {
            out.push(std::mem::take(&mut pending));
        }
    }
    match out.last_mut() {
        Some(last) => last.extend(pending),
        None if !pending.is_empty() => out.push(pending),
        None => {}
    }
    out
}

/// The class of a launch's nest, recognised once: a launch of one nest has that nest's class; one
/// that also holds statements before or after it is scheduled as it is.
pub(super) fn launch_class(k: &mut Kernel) -> Class {
    match Class::of_kernel(k).pop() {
        Some(c) if k.body.len() == 1 => c,
        _ => Class::Other,
    }
}

/// The kernel without the buffers its body does not use, and the arguments of its parameters: the
/// original parameters (`args`, in order) and the promoted scratch buffers (`scratch`, in `order`).
fn drop_unused(
    k: Kernel,
    args: &[Place],
    order: &[BufId],
    scratch: &HashMap<BufId, u64>,
) -> Result<(Kernel, Vec<Place>)> {
    let used = buffer_uses(&k.body);
    // The original parameters are the Global buffers that are not scratch, in order.
    let mut param_args = args.iter();
    let mut keep: Vec<(BufId, Option<Place>)> = Vec::new();
    for (i, b) in k.bufs.iter().enumerate() {
        let id = BufId(i as u32);
        let place = if b.space == Space::Global && !scratch.contains_key(&id) {
            Some(*param_args.next().ok_or_else(|| {
                ScheduleError::Internal(format!("@{}: fewer arguments than parameters", k.name))
            })?)
        } else {
            None
        };
        if used.contains_key(&id) {
            keep.push((id, place));
        }
    }
    // Scratch parameters go last, so the step's arguments read: original parameters, then scratch.
    keep.sort_by_key(|(id, _)| order.iter().position(|o| o == id).map_or(0, |p| p + 1));
    let remap: HashMap<BufId, BufId> = keep
        .iter()
        .enumerate()
        .map(|(new, (old, _))| (*old, BufId(new as u32)))
        .collect();
    let mut out = Kernel {
        bufs: keep
            .iter()
            .map(|(id, _)| k.bufs[id.0 as usize].clone())
            .collect(),
        body: Vec::new(),
        ..k.clone()
    };
    let rename = |b: BufId| remap.get(&b).copied().unwrap_or(b);
    out.body = k.body.iter().map(|s| s.map_bufs(&rename)).collect();
    let args = keep
        .iter()
        .filter(|(id, _)| k.bufs[id.0 as usize].space == Space::Global)
        .map(|(id, place)| {
            place.unwrap_or_else(|| Place::Arena(scratch.get(id).copied().unwrap_or(0)))
        })
        .collect();
    Ok((out, args))
}
