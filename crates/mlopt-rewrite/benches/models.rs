//! Model-sized graphs for the optimiser's benchmark, built directly in the graph IR: a ResNet-50 (about
//! 500 nodes with its BatchNormalizations and weights) and a BERT-base encoder (12 layers as PyTorch exports
//! them: separate Q/K/V projections, written-out GELU, additive mask). Weights are splats of a different
//! value per tensor: distinct, so nothing collapses by hash-consing, and cheap to build.

#![allow(clippy::unwrap_used)]

use mlopt_ir::*;

struct M {
    g: Graph,
    next: f64,
}

impl M {
    fn w(&mut self, shape: &[usize]) -> Value {
        self.next += 1e-3;
        let t = Tensor::full(&TensorType::new(DType::F32, shape.to_vec()), self.next);
        self.g.add_const(format!("w{}", self.g.num_nodes()), t)
    }
    fn op(&mut self, op: Op, ins: &[Value]) -> Value {
        self.g
            .add(op, format!("n{}", self.g.num_nodes()), ins)
            .unwrap()
    }
    fn conv_bn(
        &mut self,
        x: Value,
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        relu: bool,
    ) -> Value {
        let w = self.w(&[cout, cin, k, k]);
        let p = k / 2;
        let c = ConvAttrs {
            strides: vec![stride; 2],
            pads: vec![p; 4],
            dilations: vec![1, 1],
            group: 1,
            output_padding: vec![],
        };
        let y = self.op(Op::Conv(c), &[x, w]);
        let (s, b, m) = (self.w(&[cout]), self.w(&[cout]), self.w(&[cout]));
        let v = self.w(&[cout]);
        let y = self.op(Op::BatchNorm { epsilon: 1e-5 }, &[y, s, b, m, v]);
        if relu {
            self.op(Op::Unary(Unary::Relu), &[y])
        } else {
            y
        }
    }
}

pub fn resnet50() -> Graph {
    let mut m = M {
        g: Graph::new("resnet50"),
        next: 0.0,
    };
    let x =
        m.g.add_input("image", TensorType::new(DType::F32, vec![1, 3, 224, 224]));
    let mut y = m.conv_bn(x, 3, 64, 7, 2, true);
    let pool = PoolAttrs {
        kernel: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![1; 4],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    y =
        m.g.add_node(
            Op::MaxPool {
                pool,
                col_major: false,
            },
            "pool",
            &[Some(y)],
            Some(1),
        )
        .unwrap()[0];
    let mut cin = 64;
    for (stage, (blocks, width)) in [(3, 64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for b in 0..blocks {
            let stride = if b == 0 && stage > 0 { 2 } else { 1 };
            let h = m.conv_bn(y, cin, width, 1, 1, true);
            let h = m.conv_bn(h, width, width, 3, stride, true);
            let h = m.conv_bn(h, width, width * 4, 1, 1, false);
            let skip = if b == 0 {
                m.conv_bn(y, cin, width * 4, 1, stride, false)
            } else {
                y
            };
            let s = m.op(Op::Binary(Binary::Add), &[h, skip]);
            y = m.op(Op::Unary(Unary::Relu), &[s]);
            cin = width * 4;
        }
    }
    y = m.op(Op::GlobalAveragePool, &[y]);
    y = m.op(
        Op::Reshape {
            shape: vec![1, 2048],
        },
        &[y],
    );
    let (w, b) = (m.w(&[2048, 1000]), m.w(&[1000]));
    let z = m.op(Op::MatMul, &[y, w]);
    let z = m.op(Op::Binary(Binary::Add), &[z, b]);
    m.g.add_output("logits", z);
    m.g
}

pub fn bert(layers: usize, hidden: usize, heads: usize, seq: usize, ffn: usize) -> Graph {
    let mut m = M {
        g: Graph::new("bert"),
        next: 0.0,
    };
    let mut x =
        m.g.add_input("hidden", TensorType::new(DType::F32, vec![1, seq, hidden]));
    let mask =
        m.g.add_input("mask", TensorType::new(DType::F32, vec![1, 1, 1, seq]));
    let d = hidden / heads;
    let scalar = |m: &mut M, v: f32| {
        m.g.add_const(format!("c{}", m.g.num_nodes()), Tensor::scalar(v))
    };
    for _ in 0..layers {
        let proj = |m: &mut M, x: Value, perm: Vec<usize>| {
            let (w, b) = (m.w(&[hidden, hidden]), m.w(&[hidden]));
            let y = m.op(Op::MatMul, &[x, w]);
            let y = m.op(Op::Binary(Binary::Add), &[y, b]);
            let y = m.op(
                Op::Reshape {
                    shape: vec![1, seq, heads, d],
                },
                &[y],
            );
            m.op(Op::Transpose { perm }, &[y])
        };
        let q = proj(&mut m, x, vec![0, 2, 1, 3]);
        let kt = proj(&mut m, x, vec![0, 2, 3, 1]);
        let v = proj(&mut m, x, vec![0, 2, 1, 3]);
        let s = m.op(Op::MatMul, &[q, kt]);
        let sq = scalar(&mut m, (d as f32).sqrt());
        let s = m.op(Op::Binary(Binary::Div), &[s, sq]);
        let s = m.op(Op::Binary(Binary::Add), &[s, mask]);
        let p = m.op(Op::Softmax { axis: 3 }, &[s]);
        let c = m.op(Op::MatMul, &[p, v]);
        let c = m.op(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[c],
        );
        let c = m.op(
            Op::Reshape {
                shape: vec![1, seq, hidden],
            },
            &[c],
        );
        let (wo, bo) = (m.w(&[hidden, hidden]), m.w(&[hidden]));
        let o = m.op(Op::MatMul, &[c, wo]);
        let o = m.op(Op::Binary(Binary::Add), &[o, bo]);
        let r = m.op(Op::Binary(Binary::Add), &[x, o]);
        let (g1, b1) = (m.w(&[hidden]), m.w(&[hidden]));
        let h = m.op(
            Op::LayerNorm {
                axis: 2,
                epsilon: 1e-12,
            },
            &[r, g1, b1],
        );
        let (wu, bu) = (m.w(&[hidden, ffn]), m.w(&[ffn]));
        let u = m.op(Op::MatMul, &[h, wu]);
        let u = m.op(Op::Binary(Binary::Add), &[u, bu]);
        let (s2, one, half) = (
            scalar(&mut m, std::f32::consts::SQRT_2),
            scalar(&mut m, 1.0),
            scalar(&mut m, 0.5),
        );
        let e = m.op(Op::Binary(Binary::Div), &[u, s2]);
        let e = m.op(Op::Unary(Unary::Erf), &[e]);
        let e = m.op(Op::Binary(Binary::Add), &[e, one]);
        let gl = m.op(Op::Binary(Binary::Mul), &[u, e]);
        let gl = m.op(Op::Binary(Binary::Mul), &[gl, half]);
        let (wd, bd) = (m.w(&[ffn, hidden]), m.w(&[hidden]));
        let dn = m.op(Op::MatMul, &[gl, wd]);
        let dn = m.op(Op::Binary(Binary::Add), &[dn, bd]);
        let r2 = m.op(Op::Binary(Binary::Add), &[h, dn]);
        let (g2, b2) = (m.w(&[hidden]), m.w(&[hidden]));
        x = m.op(
            Op::LayerNorm {
                axis: 2,
                epsilon: 1e-12,
            },
            &[r2, g2, b2],
        );
    }
    m.g.add_output("last_hidden_state", x);
    m.g
}
