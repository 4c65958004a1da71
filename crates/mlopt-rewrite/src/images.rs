//! Image by image: at a batch above 1, the first kernels of a CNN run once per image, each image through
//! all of them before the next, and the rest on the whole batch. A kernel that handles a batch of 8 reads
//! and writes 8 images' activations: an early layer's (MobileNetV2's 96 x 112 x 112, 2.4 MB an image
//! in bf16) then go to memory and back between kernels, where one image's stay in cache, as at batch 1.
//! Late layers hold the weights (ResNet-50's last stage: 15 MB) and few activations: there a batch reads
//! each weight once for all images. So fusion's plan (`fuse::emit`) runs the longest prefix of its
//! kernels that can run per image, cut where the batch's activations fit in L2, a group of images at a
//! time (one per thread; see `prefix`): each such kernel once per group at the group's batch (its value
//! types inferred again), each graph input sliced to the group first, and each value read after the
//! prefix joined from the groups' values by a concatenation along the batch axis. The memory plan then
//! gives every group's intermediate values the same bytes.

use mlopt_ir::{Graph, NodeId, Op};
use mlopt_target::Target;
use std::collections::BTreeSet;

/// How a batch runs its first kernels: `len` of them, on `images` images at a time (a group), `groups`
/// times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub len: usize,
    pub images: usize,
    pub groups: usize,
}

/// How many of `kernels` (each its members and root, in execution order) run a group of images at a
/// time: `None` where none do (batch 1, a GPU, a first kernel that cannot, or a batch of as many
/// images as threads). A group is one image per thread where the threads divide the batch (the
/// kernels' parallel loops split its images, each thread's in its own L2, with no more barriers
/// than at batch 1), else one image.
pub fn prefix(g: &Graph, kernels: &[(&BTreeSet<NodeId>, NodeId)], t: &Target) -> Option<Split> {
    let cpu = t.cpu()?;
    let l2 = cpu.l2_bytes;
    let inputs = g.graph_inputs();
    let batch = inputs
        .iter()
        .map(|n| g.node(*n).outputs[0].shape.first().copied())
        .next()??;
    let threads = cpu.threads.max(1) as usize;
    let images = if batch % threads == 0 { threads } else { 1 };
    if images >= batch {
        return None;
    }
    let mut cut = 0;
    for (i, (members, root)) in kernels.iter().enumerate() {
        if !per_image(g, members, batch) || weight_bytes(g, members) > l2 / 4 {
            break;
        }
        let bytes: usize = members
            .iter()
            .flat_map(|m| g.inputs(*m).into_iter().flatten())
            .filter(|v| !members.contains(&v.node) && !is_const(g, v.node))
            .map(|v| g.value_type(v).bytes())
            .sum::<usize>()
            + g.node(*root).outputs[0].bytes();
        if bytes as u64 > l2 {
            cut = i + 1;
        }
    }
    (cut > 0).then_some(Split {
        len: cut,
        images,
        groups: batch / images,
    })
}

fn is_const(g: &Graph, n: NodeId) -> bool {
    matches!(g.node(n).op, Op::Const(_))
}

/// The bytes of the constants `members` read (their weights).
fn weight_bytes(g: &Graph, members: &BTreeSet<NodeId>) -> u64 {
    let consts: BTreeSet<NodeId> = members
        .iter()
        .flat_map(|m| g.inputs(*m).into_iter().flatten())
        .map(|v| v.node)
        .filter(|n| is_const(g, *n))
        .collect();
    consts
        .iter()
        .map(|n| g.node(*n).outputs[0].bytes() as u64)
        .sum()
}

/// Whether a kernel computes each image's values from that image's alone: every op one whose output
/// at batch position b reads only its operands at b (convolutions, poolings, elementwise ops, batch
/// normalisation, concatenation of channels, padding of the other axes), and every value it reads
/// or writes batch-major (its first axis the batch; constants without it).
fn per_image(g: &Graph, members: &BTreeSet<NodeId>, batch: usize) -> bool {
    members.iter().all(|&m| {
        let node = g.node(m);
        let rank = node.outputs[0].shape.len();
        let elementwise = node.op.is_elementwise();
        let op_ok = match &node.op {
            _ if elementwise => true,
            Op::Conv(_)
            | Op::MaxPool { .. }
            | Op::AveragePool { .. }
            | Op::GlobalAveragePool
            | Op::GlobalMaxPool
            | Op::BatchNorm { .. }
            | Op::Lrn { .. } => true,
            Op::Concat { axis } => *axis > 0,
            Op::Pad { pads, .. } => pads[0] == 0 && pads.get(rank) == Some(&0),
            _ => false,
        };
        op_ok
            && node.outputs.len() == 1
            && node.outputs[0].shape.first() == Some(&batch)
            && g.inputs(m).into_iter().flatten().all(|v| {
                let s = &g.value_type(v).shape;
                if is_const(g, v.node) {
                    // A parameter, or a constant broadcast over the batch (not one holding a value
                    // per image).
                    !elementwise || s.len() < rank || s.first() != Some(&batch)
                } else {
                    s.first() == Some(&batch) && s.len() == rank
                }
            })
    })
}
