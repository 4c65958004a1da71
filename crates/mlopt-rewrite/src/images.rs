//! Image by image: at a batch above 1, the first kernels of a CNN run once per image, each image through
//! all of them before the next, and the rest on the whole batch. A kernel that handles a batch of 8 reads
//! and writes 8 images' activations: an early layer's (MobileNetV2's 96 x 112 x 112, 2.4 MB an image
//! in bf16) then go to memory and back between kernels, where one image's stay in cache, as at batch 1.
//! Late layers hold the weights (ResNet-50's last stage: 15 MB) and few activations: there a batch reads
//! each weight once for all images. So fusion's plan (`fuse::emit`) runs a prefix of its kernels that
//! can run per image (cut where what it keeps in cache most exceeds what joining the groups copies; see
//! `prefix`), a group of images at a time (one per thread): each such kernel once per group at the
//! group's batch (its value types inferred again), each graph input sliced to the group first, and
//! each value read after the prefix joined from the groups' values by a concatenation along the batch
//! axis. The memory plan then gives every group's intermediate values the same bytes.

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
    // The kernels that can run by groups: up to the first that cannot, or whose weights would be
    // read again for every group from beyond L2.
    let len = kernels
        .iter()
        .position(|(members, _)| !per_image(g, members, batch) || weight_bytes(g, members) > l2 / 4)
        .unwrap_or(kernels.len());
    // The cut: where the activations the prefix keeps in cache (each kernel's beyond L2 at the full
    // batch) most exceed what joining the groups copies (the values read after the cut, read and
    // written once more). ResNet-50's prefix cut inside its second stage joined 38 MB; after the
    // first, 13.
    let index: std::collections::HashMap<NodeId, usize> = kernels
        .iter()
        .enumerate()
        .map(|(i, (_, r))| (*r, i))
        .collect();
    let outputs: BTreeSet<NodeId> = g.graph_outputs().iter().map(|(_, v)| v.node).collect();
    // Each kernel's value: the last kernel that reads it (kernels.len() for a graph output).
    let mut last_read: Vec<usize> = (0..kernels.len())
        .map(|i| {
            if outputs.contains(&kernels[i].1) {
                kernels.len()
            } else {
                i
            }
        })
        .collect();
    for (j, (members, _)) in kernels.iter().enumerate() {
        for v in members
            .iter()
            .flat_map(|m| g.inputs(*m).into_iter().flatten())
        {
            if let Some(&i) = index.get(&v.node).filter(|_| !members.contains(&v.node)) {
                last_read[i] = last_read[i].max(j);
            }
        }
    }
    let mut kept = 0f64;
    let mut best = (0f64, 0);
    for c in 1..=len {
        let (members, root) = kernels[c - 1];
        let bytes: usize = members
            .iter()
            .flat_map(|m| g.inputs(*m).into_iter().flatten())
            .filter(|v| !members.contains(&v.node) && !is_const(g, v.node))
            .map(|v| g.value_type(v).bytes())
            .sum::<usize>()
            + g.node(root).outputs[0].bytes();
        kept += (bytes as f64 - l2 as f64).max(0.0);
        let joined: usize = (0..c)
            .filter(|&i| last_read[i] >= c)
            .map(|i| g.node(kernels[i].1).outputs[0].bytes())
            .sum();
        let gain = kept - 2.0 * joined as f64;
        if gain > best.0 {
            best = (gain, c);
        }
    }
    let cut = best.1;
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
/// and layer normalisation over other axes, concatenation of channels, padding of the other axes,
/// transposes that keep the batch first, products of batch-major operands or of one and a constant:
/// ConvNeXt's channels-last blocks), and every value it reads or writes batch-major (its first axis
/// the batch, every non-constant operand of the output's rank; constants without it).
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
            Op::LayerNorm { axis, .. } => *axis > 0,
            Op::Transpose { perm } => perm.first() == Some(&0),
            // Rows of a batch-major operand times a constant, or batch-major products.
            Op::MatMul => true,
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

#[cfg(test)]
mod tests {
    use super::*;
    use mlopt_ir::{ConvAttrs, DType, Tensor, TensorType, Unary};

    /// A chain of 3x3 convolutions (`c` channels at 56 x 56, the last `last` channels), each node a
    /// kernel of its own.
    fn chain(batch: usize, c: usize, last: usize) -> Graph {
        let mut g = Graph::new("chain");
        let mut x = g.add_input("x", TensorType::new(DType::F32, vec![batch, c, 56, 56]));
        for (i, m) in [c, c, last].into_iter().enumerate() {
            let w = g.add_const(
                format!("w{i}"),
                Tensor::zeros(&TensorType::new(DType::F32, vec![m, c, 3, 3])),
            );
            let a = ConvAttrs {
                strides: vec![1, 1],
                pads: vec![1; 4],
                dilations: vec![1, 1],
                group: 1,
                output_padding: vec![],
            };
            x = g.add(Op::Conv(a), format!("conv{i}"), &[x, w]).unwrap();
            x = g
                .add(Op::Unary(Unary::Relu), format!("relu{i}"), &[x])
                .unwrap();
        }
        g.add_output("y", x);
        g
    }

    fn split(g: &Graph, threads: u32) -> Option<Split> {
        let members: Vec<(BTreeSet<NodeId>, NodeId)> = g
            .topo_order()
            .unwrap()
            .into_iter()
            .filter(|n| !matches!(g.node(*n).op, Op::Input | Op::Const(_)))
            .map(|n| (BTreeSet::from([n]), n))
            .collect();
        let listed: Vec<(&BTreeSet<NodeId>, NodeId)> =
            members.iter().map(|(m, r)| (m, *r)).collect();
        prefix(g, &listed, &Target::named("x86-64-v4", threads).unwrap())
    }

    /// A batch of 8 runs its 56 x 56 layers by groups: of one image on one thread, of two on two;
    /// a batch of as many images as threads, or of one, does not; a layer whose weights exceed a
    /// quarter of L2 ends the prefix (here the last: 64 -> 512 channels, 1.2 MB).
    #[test]
    fn groups_of_images_up_to_weights_beyond_l2() {
        let g = chain(8, 64, 64);
        assert_eq!(
            split(&g, 1),
            Some(Split {
                len: 6,
                images: 1,
                groups: 8
            })
        );
        assert_eq!(split(&g, 2).map(|s| (s.images, s.groups)), Some((2, 4)));
        assert_eq!(split(&chain(2, 64, 64), 2), None);
        assert_eq!(split(&chain(1, 64, 64), 1), None);
        assert_eq!(split(&chain(8, 64, 512), 1).map(|s| s.len), Some(4));
    }
}
