//! The optimised graph -> a kernel IR program: one kernel per fusion group, in execution order, bound to
//! the caller's inputs and outputs, the weights, and offsets in the activation arena from the memory plan.
//! Kernels made only of reshapes are not emitted: their value is the bytes of their input (unless it is a
//! graph output, which is the caller's buffer and gets a copy). A kernel that only one branch of an `If`
//! decided at run time needs is called under that branch's condition (`order.rs`).

use crate::elementwise::elem;
use crate::error::{LowerError, Result};
use crate::kernel::{dims, Lowerer};
use crate::memory::MemoryPlan;
use mlopt_ir::{Graph, NodeId, Op, Value};
use mlopt_kir::{Io, Place, Program, Space, Step, Stmt, Weight};
use std::collections::HashMap;

struct Binder<'g> {
    g: &'g Graph,
    program: Program,
    weights: HashMap<NodeId, usize>,
    places: HashMap<Value, Place>,
}

impl Binder<'_> {
    /// The places of a kernel's parameters (weights lowering made are added to the program).
    fn bind(&mut self, params: crate::kernel::Params) -> Result<Vec<Place>> {
        params
            .into_iter()
            .map(|p| match p {
                crate::kernel::Param::Value(v) => self.place(v),
                crate::kernel::Param::Weight(w) => {
                    self.program.weights.push(w);
                    Ok(Place::Weight(self.program.weights.len() - 1))
                }
            })
            .collect()
    }

    /// Where a value read by a kernel lives.
    fn place(&mut self, v: Value) -> Result<Place> {
        if let Some(p) = self.places.get(&v) {
            return Ok(*p);
        }
        let node = self.g.node(v.node);
        match &node.op {
            Op::Const(t) => {
                let i = *self.weights.entry(v.node).or_insert_with(|| {
                    self.program.weights.push(Weight {
                        name: node.name.clone(),
                        elem: elem(t.dtype()),
                        dims: t.shape().iter().map(|d| *d as u64).collect(),
                        data: std::sync::Arc::new(t.to_le_bytes()),
                    });
                    self.program.weights.len() - 1
                });
                Ok(Place::Weight(i))
            }
            _ => Err(LowerError::Unsupported {
                node: node.name.clone(),
                op: node.op.name(),
                why: "its value has no place in memory (a bug in mlopt's lowering)".into(),
            }),
        }
    }
}

/// Lowers a fused graph (the optimiser's output), its values placed by `plan` (`plan_memory(g)`), to a
/// program of algorithm kernels: plain loop nests, verified, with no schedule (`mlopt-schedule` makes
/// them run on a target).
pub fn lower(g: &Graph, plan: &MemoryPlan) -> Result<Program> {
    let order = g.topo_order()?;
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut b = Binder {
        g,
        program: Program {
            name: g.name.clone(),
            arena_bytes: plan.arena_bytes,
            ..Program::default()
        },
        weights: HashMap::new(),
        places: HashMap::new(),
    };
    for (i, n) in g.graph_inputs().iter().enumerate() {
        let t = &g.node(*n).outputs[0];
        b.program.inputs.push(Io {
            name: g.node(*n).name.clone(),
            elem: elem(t.dtype),
            dims: dims(t),
            counted: None,
            sequence: None,
        });
        b.places.insert(
            Value {
                node: *n,
                output: 0,
            },
            Place::Input(i),
        );
    }
    // Graph outputs produced by a kernel are written there directly; the others get a copy at the end.
    let mut copies = Vec::new();
    for (i, (name, v)) in g.graph_outputs().iter().enumerate() {
        let t = g.value_type(*v);
        b.program.outputs.push(Io {
            name: name.clone(),
            elem: elem(t.dtype),
            dims: dims(t),
            counted: None,
            sequence: None,
        });
        let produced = g.node(v.node).kernel.is_some() && !b.places.contains_key(v);
        if produced {
            b.places.insert(*v, Place::Output(i));
        } else {
            copies.push((i, *v));
        }
    }
    for s in &plan.slots {
        b.places.entry(s.value).or_insert(Place::Arena(s.offset));
    }
    // The flag of data checks (`data_checks.rs`) lives past the planned arena.
    let flag = plan.arena_bytes.div_ceil(64) * 64;
    for crate::order::Ordered {
        id,
        nodes: k,
        guard,
    } in crate::order::execution_order(g)?
    {
        let Some(&root) = k.roots.first() else {
            continue;
        };
        // A guarded call's conditions were computed by earlier kernels, so their places are known.
        let guard = guard
            .iter()
            .map(|l| {
                Ok(mlopt_kir::Guard {
                    place: b.place(l.cond)?,
                    when: l.when,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let view = Value {
            node: root,
            output: 0,
        };
        if let Some((_, src)) = plan.aliases.iter().find(|(v, _)| *v == view) {
            if !matches!(b.places.get(&view), Some(Place::Output(_))) {
                let p = b.place(*src)?;
                b.places.insert(view, p);
                continue;
            }
        }
        let mut members = k.members.clone();
        members.sort_by_key(|m| pos[m]);
        for (c, &m) in members.iter().enumerate() {
            let Some((mut kernel, params, message)) =
                crate::data_checks::check_kernel(g, &members, m, format!("k{id}_check{c}"))?
            else {
                continue;
            };
            mlopt_kir::simplify::simplify_kernel(&mut kernel);
            let mut args = vec![Place::Arena(flag)];
            args.extend(b.bind(params)?);
            b.program.steps.push(Step {
                kernel: b.program.kernels.len(),
                args,
                check: Some(mlopt_kir::Check { flag, message }),
                guard: guard.clone(),
            });
            b.program.kernels.push(kernel);
            b.program.arena_bytes = b.program.arena_bytes.max(flag + 64);
        }
        let mut l = Lowerer::new(g, format!("k{id}"), &members);
        let mut outs = Vec::new();
        let mut args = Vec::new();
        for o in 0..g.node(root).outputs.len() {
            let v = Value {
                node: root,
                output: o as u32,
            };
            if let Some(p) = b.places.get(&v).copied() {
                let t = g.value_type(v);
                let buf =
                    l.k.buf(format!("out{o}"), elem(t.dtype), dims(t), Space::Global);
                outs.push((v, buf));
                args.push(p);
            }
        }
        let (mut kernel, params) = l.lower(&members, root, &outs)?;
        // Reshape chains leave divided and re-multiplied indices; the loop ranges undo them.
        mlopt_kir::simplify::simplify_kernel(&mut kernel);
        args.extend(b.bind(params)?);
        b.program.steps.push(Step {
            guard,
            ..Step::call(b.program.kernels.len(), args)
        });
        b.program.kernels.push(kernel);
    }
    for (i, v) in copies {
        let p = b.place(v)?;
        let io = b.program.outputs[i].clone();
        b.program.steps.push(Step::call(
            b.program.kernels.len(),
            vec![Place::Output(i), p],
        ));
        b.program
            .kernels
            .push(copy_kernel(&format!("copy{i}"), &io));
    }
    mlopt_kir::verify_program(&b.program).map_err(LowerError::Verify)?;
    Ok(b.program)
}

/// `out[i] = in[i]` over one flat loop.
fn copy_kernel(name: &str, io: &Io) -> mlopt_kir::Kernel {
    let mut k = mlopt_kir::Kernel::new(name);
    let n: u64 = io.dims.iter().product();
    let out = k.buf("out0", io.elem, vec![n], Space::Global);
    let inp = k.buf("in0", io.elem, vec![n], Space::Global);
    let i = k.var("i");
    let ix = vec![mlopt_kir::Expr::var(i)];
    k.body = vec![Stmt::For {
        var: i,
        extent: n.max(1),
        kind: mlopt_kir::LoopKind::Serial,
        body: vec![Stmt::Store {
            buf: out,
            index: ix.clone(),
            value: mlopt_kir::Expr::load(inp, ix),
        }],
    }];
    if n == 0 {
        k.body.clear();
    }
    k
}

/// Runs a program with the kernel IR interpreter on named tensors; returns the outputs by name.
pub fn interpret(
    p: &Program,
    inputs: &HashMap<String, mlopt_ir::Tensor>,
) -> std::result::Result<Vec<(String, mlopt_ir::Tensor)>, String> {
    let bytes = p
        .inputs
        .iter()
        .map(|io| {
            inputs
                .get(&io.name)
                .map(|t| t.to_le_bytes())
                .ok_or_else(|| format!("input '{}' is missing", io.name))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let outs = mlopt_kir::run_program(p, &bytes).map_err(|e| e.to_string())?;
    p.outputs
        .iter()
        .zip(outs)
        .map(|(io, b)| tensor(io, &b).map(|t| (io.name.clone(), t)))
        .collect()
}

/// A tensor from an output's bytes.
pub fn tensor(io: &Io, bytes: &[u8]) -> std::result::Result<mlopt_ir::Tensor, String> {
    let dtype = mlopt_ir::DType::from_name(io.elem.name())
        .ok_or_else(|| format!("no dtype {}", io.elem))?;
    let ty = mlopt_ir::TensorType::new(
        dtype,
        io.dims.iter().map(|d| *d as usize).collect::<Vec<_>>(),
    );
    mlopt_ir::Tensor::from_le_bytes(&ty, bytes).ok_or_else(|| {
        format!(
            "output '{}': {} bytes do not make a {ty}",
            io.name,
            bytes.len()
        )
    })
}
