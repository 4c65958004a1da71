//! Kernel IR tests of the transforms' API: small kernels written in the text form, rearranged by schedule
//! steps and run by the interpreter. (Kernels that only need to parse, verify or be scheduled are
//! filetests: `tests/filetests/`.)

use crate::*;

fn bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Runs a kernel on f32 buffers (one region per parameter) and returns them.
fn run(k: &Kernel, bufs: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    let mut regions: Vec<Vec<u8>> = bufs.iter().map(|b| bytes(b)).collect();
    let args: Vec<(usize, usize)> = (0..regions.len()).map(|i| (i, 0)).collect();
    run_kernel(k, &mut regions, &args).unwrap();
    regions
        .iter()
        .map(|r| {
            r.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
        .collect()
}

const SCALE: &str = "kernel @scale(%x: f32[10], %y: f32[10]) {
  serial %i in 0..10 {
    %y[%i] = fma(%x[%i], 2.0f32, 1.0f32)
  }
}
";

#[test]
fn schedules_keep_the_results() {
    let base = parse_kernel(SCALE).unwrap();
    let x: Vec<f32> = (0..10).map(|i| i as f32 * 0.5).collect();
    let want = run(&base, vec![x.clone(), vec![0.0; 10]]);
    // A split that does not divide the extent gets a guard, and still verifies.
    let mut k = base.clone();
    let (o, i) = sched::split(&mut k, Var(0), 4).unwrap();
    verify(&k).unwrap();
    assert!(
        print::kernel(&k).contains("if lt("),
        "{}",
        print::kernel(&k)
    );
    assert_eq!(run(&k, vec![x.clone(), vec![0.0; 10]]), want);
    sched::reorder(&mut k, o, i).unwrap();
    sched::set_kind(&mut k, o, LoopKind::Parallel).unwrap();
    verify(&k).unwrap();
    assert_eq!(run(&k, vec![x.clone(), vec![0.0; 10]]), want);
    assert_eq!(
        crate::step::schedule_text(&k.schedule),
        "split(i,4) reorder(i.o,i.i) parallel(i.o)"
    );
    // A vector width must divide its loop.
    assert!(sched::set_kind(&mut base.clone(), Var(0), LoopKind::Vector(4)).is_err());
    // Peeling the remainder makes it divide: 10 = 8 in vector<4> + a 2-iteration tail.
    let mut k = base.clone();
    let tail = sched::peel(&mut k, Var(0), 4).unwrap();
    assert!(tail.is_some());
    sched::set_kind(&mut k, Var(0), LoopKind::Vector(4)).unwrap();
    verify(&k).unwrap();
    assert_eq!(run(&k, vec![x.clone(), vec![0.0; 10]]), want);
    let text = print::kernel(&k);
    assert!(
        text.contains("vector<4> %i in 0..8") && text.contains("serial %i.t in 0..2"),
        "{text}"
    );
    assert_eq!(print::kernel(&parse_kernel(&text).unwrap()), text);
    assert_eq!(
        sched::peel(&mut k, Var(0), 4).unwrap(),
        None,
        "nothing left to peel"
    );
}

#[test]
fn gpu_barriers_order_the_thread_loops() {
    let text = "kernel @rotate(%x: f32[8], %y: f32[8]) {
  shared %s: f32[8]
  local %r: f32[]
  gpu.block.x %b in 0..1 {
    gpu.thread.x %t in 0..8 {
      %s[%t] = %x[%t]
      %r[] = (%x[%t] * 10.0f32)
    }
    barrier
    gpu.thread.x %u in 0..8 {
      %y[%u] = (%s[((%u + 1) % 8)] + %r[])
    }
  }
}
";
    let k = parse_kernel(text).unwrap();
    assert_eq!(print::kernel(&k), text);
    verify(&k).unwrap();
    assert_eq!(
        crate::gpu::launch(&k),
        Some(crate::gpu::Launch {
            grid: 1,
            block: 8,
            shared_bytes: 32
        })
    );
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let out = run(&k, vec![x.clone(), vec![0.0; 8]]);
    assert_eq!(out[1], vec![1.0, 12.0, 23.0, 34.0, 45.0, 56.0, 67.0, 70.0]);
    // Without the barrier, thread 0 reads the slot thread 1 wrote: a race the interpreter reports.
    let racy = parse_kernel(&text.replace("    barrier\n", "")).unwrap();
    verify(&racy).unwrap();
    let mut regions = vec![bytes(&x), bytes(&[0.0; 8])];
    let e = crate::run_kernel(&racy, &mut regions, &[(0, 0), (1, 0)]).unwrap_err();
    assert!(
        e.to_string()
            .contains("race on %s at element 1: thread 0 reads it after thread 1 wrote it"),
        "{e}"
    );
    // A thread reading what another block's thread wrote to global memory in the same kernel races too.
    let grid = "kernel @g(%y: f32[4]) {
  gpu.block.x %b in 0..2 {
    gpu.thread.x %t in 0..2 {
      %y[((%b * 2) + %t)] = 1.0f32
    }
    gpu.thread.x %u in 0..2 {
      %y[((%u + 1) % 4)] = 2.0f32
    }
  }
}
";
    let mut regions = vec![bytes(&[0.0; 4])];
    let e = crate::run_kernel(&parse_kernel(grid).unwrap(), &mut regions, &[(0, 0)]).unwrap_err();
    assert!(e.to_string().contains("race on %y"), "{e}");
}

/// The GPU form: barriers only in uniform code, one block size, no stores outside thread loops.
#[test]
fn gpu_kernels_keep_their_form() {
    let bad = "kernel @bad(%y: f32[8]) {
  shared %s: f32[8]
  gpu.block.x %b in 0..1 {
    %y[0] = 1.0f32
    gpu.thread.x %t in 0..8 {
      %s[%t] = 1.0f32
      barrier
    }
    gpu.thread.x %u in 0..4 {
      %y[%u] = %s[%u]
    }
  }
}
";
    let e = verify(&parse_kernel(bad).unwrap()).unwrap_err().join("\n");
    for want in [
        "store to %y outside a thread loop",
        "barrier inside a thread loop",
        "thread loop %u must be gpu.thread.x over the block's 8 threads",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

#[test]
fn bad_text_is_an_error_with_a_line() {
    let e = parse_kernel("kernel @k(%x: f32[2]) {\n  %y[0] = 1\n}\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.msg.contains("%y"), "{e}");
    assert!(parse_kernel("kernel @k(%x: q7[2]) {}").is_err());
}

/// One warp's tf32 `mma.sync`: A (16 x 8) and B (8 x 8) staged in shared memory, the accumulators written
/// out by the fragment layout. `{A_ROWS}` and `{A_AT}` let a test move the A block per thread.
const WARP_MMA: &str = "kernel @mma(%a: f32[{A_ROWS},8], %b: f32[8,8], %out: f32[16,8]) {
  shared %sa: f32[{A_ROWS},8]
  shared %sb: f32[8,8]
  local %c: f32[1,1,4]
  gpu.block.x %g in 0..1 {
    gpu.thread.x %t in 0..32 {
      unrolled %q in 0..4 {
        %c[0, 0, %q] = 0.0f32
      }
      serial %i in 0..{A_ROWS4} {
        %sa[(((%i * 32) + %t) / 8), (((%i * 32) + %t) % 8)] = %a[(((%i * 32) + %t) / 8), (((%i * 32) + %t) % 8)]
      }
      serial %j in 0..2 {
        %sb[(((%j * 32) + %t) / 8), (((%j * 32) + %t) % 8)] = %b[(((%j * 32) + %t) / 8), (((%j * 32) + %t) % 8)]
      }
    }
    barrier
    gpu.thread.x %u in 0..32 {
      mma.sync %c[0, 0, 0] += %sa[{A_AT}, 0] * %sb[0, 0]
      unrolled %p in 0..4 {
        %out[((%u / 4) + ((%p / 2) * 8)), (((%u % 4) * 2) + (%p % 2))] = %c[0, 0, %p]
      }
    }
  }
}
";

fn warp_mma(rows: u64, at: &str) -> Kernel {
    let text = WARP_MMA
        .replace("{A_ROWS}", &rows.to_string())
        .replace("{A_ROWS4}", &(rows / 4).to_string())
        .replace("{A_AT}", at);
    let k = parse_kernel(&text).unwrap();
    assert_eq!(print::kernel(&k), text);
    verify(&k).unwrap();
    k
}

/// The emulator's warp mma gives each lane its fragment of the product, with the operands rounded to
/// tf32 as `cvt.rna.tf32.f32` does: to 10 mantissa bits, so 1 + 2^-12 is 1, and the tie 1 + 2^-11
/// goes away from zero, to 1 + 2^-10.
#[test]
fn a_warp_mma_computes_each_lanes_fragment() {
    let k = warp_mma(16, "0");
    let a: Vec<f32> = (0..128).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let b: Vec<f32> = (0..64).map(|i| ((i * 5) % 9) as f32 * 0.5 - 2.0).collect();
    let out = run(&k, vec![a.clone(), b.clone(), vec![0.0; 128]]);
    for r in 0..16 {
        for c in 0..8 {
            let want: f32 = (0..8).map(|p| a[r * 8 + p] * b[p * 8 + c]).sum();
            assert_eq!(out[2][r * 8 + c], want, "({r}, {c})");
        }
    }
    assert_eq!(interp::tf32(1.0 + 2f32.powi(-12)), 1.0);
    assert_eq!(interp::tf32(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
    assert_eq!(
        interp::tf32(-(1.0 + 2f32.powi(-11))),
        -(1.0 + 2f32.powi(-10))
    );
    let mut a1 = vec![0.0f32; 128];
    let mut b1 = vec![0.0f32; 64];
    a1[0] = 1.0 + 2f32.powi(-12);
    b1[0] = 1.0;
    let out = run(&k, vec![a1, b1, vec![0.0; 128]]);
    assert_eq!(out[2][0], 1.0, "operands are rounded to tf32");
}

/// Every thread of a warp must name the same blocks (the hardware takes them from all 32 lanes); a
/// block that moves with the lane is an error, as is one under a guard.
#[test]
fn a_warp_mma_on_blocks_that_differ_within_the_warp_fails() {
    let k = warp_mma(24, "((%u / 16) * 8)");
    let mut regions: Vec<Vec<u8>> = vec![vec![0; 24 * 8 * 4], vec![0; 256], vec![0; 512]];
    let e = run_kernel(&k, &mut regions, &[(0, 0), (1, 0), (2, 0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("blocks differ within a warp"), "{e}");
    let text = print::kernel(&warp_mma(16, "0")).replace(
        "      mma.sync %c[0, 0, 0] += %sa[0, 0] * %sb[0, 0]\n",
        "      if lt(%u, 16) {\n        mma.sync %c[0, 0, 0] += %sa[0, 0] * %sb[0, 0]\n      }\n",
    );
    let e = verify(&parse_kernel(&text).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("mma.sync under a guard"), "{e}");
}

/// `cp.async`: copies land at the thread's wait, are seen by other threads after a barrier, write zeros
/// where they are not valid, and must be aligned; the emulator reports each missing step.
#[test]
fn async_copies_land_at_the_wait() {
    let text = "kernel @shift(%x: f32[16], %y: f32[16]) {
  shared %s: f32[2,8]
  gpu.block.x %b in 0..1 {
    gpu.thread.x %t in 0..4 {
      cp.async x4 %s[(%t / 2), ((%t % 2) * 4)] <- %x.flat[(%t * 4)] when lt(%t, 3)
    }
    gpu.thread.x %u in 0..4 {
      cp.async.wait_all
    }
    barrier
    gpu.thread.x %v in 0..4 {
      unrolled %w in 0..4 {
        %y[((%v * 4) + %w)] = %s[(((((%v * 4) + %w) + 1) % 16) / 8), ((((%v * 4) + %w) + 1) % 8)]
      }
    }
  }
}
";
    let k = parse_kernel(text).unwrap();
    assert_eq!(print::kernel(&k), text);
    verify(&k).unwrap();
    let x: Vec<f32> = (1..=16).map(|i| i as f32).collect();
    let out = run(&k, vec![x.clone(), vec![0.0; 16]]);
    // Thread 3's copy is not valid: zeros, and x[12..16] is never read.
    let want: Vec<f32> = (0..16)
        .map(|v| {
            if (v + 1) % 16 < 12 {
                ((v + 1) % 16 + 1) as f32
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(out[1], want);
    let fails = |text: &str| -> String {
        let mut regions = vec![bytes(&x), bytes(&[0.0; 16])];
        crate::run_kernel(
            &parse_kernel(text).unwrap(),
            &mut regions,
            &[(0, 0), (1, 0)],
        )
        .unwrap_err()
        .to_string()
    };
    // No wait: the reader sees a copy still in flight.
    let e = fails(&text.replace("      cp.async.wait_all\n", ""));
    assert!(
        e.contains("before thread 0's cp.async to it has landed"),
        "{e}"
    );
    // A wait but no barrier: another thread's copy is a race.
    let e = fails(&text.replace("    barrier\n", ""));
    assert!(
        e.contains("race on %s at element 4: thread 0 reads it after thread 1 wrote it"),
        "{e}"
    );
    // A copy never waited for.
    let e = fails(
        &text
            .replace(
                "    gpu.thread.x %u in 0..4 {\n      cp.async.wait_all\n    }\n    barrier\n",
                "    barrier\n",
            )
            .replace(
                "%s[(((((%v * 4) + %w) + 1) % 16) / 8), ((((%v * 4) + %w) + 1) % 8)]",
                "0.0f32",
            ),
    );
    assert!(e.contains("never waited for"), "{e}");
    // A 16-byte copy from a source that is not 16-byte aligned.
    let mut regions = vec![bytes(&[0.0; 20]), bytes(&[0.0; 16])];
    let e = crate::run_kernel(&k, &mut regions, &[(0, 4), (1, 0)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("source byte 4 is not aligned to the 16-byte copy"),
        "{e}"
    );
    // The verifier wants copies that start on their width, of the right size, global to shared.
    let e = verify(
        &parse_kernel(&text.replace("%x.flat[(%t * 4)]", "%x.flat[((%t * 4) + 1)]")).unwrap(),
    )
    .unwrap_err()
    .join("\n");
    assert!(
        e.contains("is not shown to start on a multiple of 4"),
        "{e}"
    );
    let e = verify(&parse_kernel(&text.replace("cp.async x4", "cp.async x3")).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("moves 12 bytes"), "{e}");
}

/// `prefetch`: a hint that reads and changes nothing, so any element may be named, past the end too;
/// only a global buffer and an integer position.
#[test]
fn prefetches_change_nothing() {
    let text = "kernel @copy(%x: f32[64], %y: f32[64]) {
  serial %i in 0..64 {
    prefetch %x.flat[((%i * 16) + 64)]
    %y[%i] = %x[%i]
  }
}
";
    let k = parse_kernel(text).unwrap();
    assert_eq!(print::kernel(&k), text);
    verify(&k).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let out = run(&k, vec![x.clone(), vec![0.0; 64]]);
    assert_eq!(out[1], x);
    let e = verify(&parse_kernel(&text.replace("[((%i * 16) + 64)]", "[1.5f32]")).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("not an integer"), "{e}");
    let local = text.replace("  serial %i", "  local %t: f32[4]\n  serial %i");
    let local = local.replace("prefetch %x", "prefetch %t");
    let e = verify(&parse_kernel(&local).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("not a global buffer"), "{e}");
}

/// `warp.reduce`: every thread's local scalar becomes the reduction over its warp, in uniform code only.
#[test]
fn warp_reductions_combine_each_warp() {
    let text = "kernel @sums(%x: f32[64], %y: f32[64]) {
  local %v: f32[]
  gpu.block.x %b in 0..1 {
    gpu.thread.x %t in 0..64 {
      %v[] = %x[%t]
    }
    warp.reduce(+) %v[]
    gpu.thread.x %u in 0..64 {
      %y[%u] = %v[]
    }
  }
}
";
    let k = parse_kernel(text).unwrap();
    assert_eq!(print::kernel(&k), text);
    verify(&k).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let out = run(&k, vec![x.clone(), vec![0.0; 64]]);
    assert_eq!(out[1], [vec![496.0; 32], vec![1520.0; 32]].concat());
    let out = run(
        &parse_kernel(&text.replace("warp.reduce(+)", "warp.reduce(max)")).unwrap(),
        vec![x, vec![0.0; 64]],
    );
    assert_eq!(out[1], [vec![31.0; 32], vec![63.0; 32]].concat());
    let inside = text.replace(
        "      %v[] = %x[%t]\n    }\n    warp.reduce(+) %v[]\n",
        "      %v[] = %x[%t]\n      warp.reduce(+) %v[]\n    }\n",
    );
    let e = verify(&parse_kernel(&inside).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("warp.reduce inside a thread loop"), "{e}");
    let e = verify(&parse_kernel(&text.replace("warp.reduce(+)", "warp.reduce(-)")).unwrap())
        .unwrap_err()
        .join("\n");
    assert!(e.contains("- is not a reduction"), "{e}");
}

#[test]
fn split_positions_simplify_and_digits_move_with_their_variable() {
    use crate::analysis::{moves_with, simplify_index};
    let (i, j) = (Var(0), Var(1));
    let (vi, vj) = (Expr::var(i), Expr::var(j));
    let extent = |v: Var| {
        [(i, 16), (j, 64)]
            .iter()
            .find(|(w, _)| *w == v)
            .map(|(_, n)| *n)
    };
    // A row-major position [16, 64] read back as [16, 4, 16]: each axis is one digit of the position.
    let flat = Expr::add(Expr::mul(vi.clone(), Expr::int(64)), vj.clone());
    let heads = Expr::rem(Expr::div(flat.clone(), Expr::int(16)), Expr::int(4));
    assert_eq!(
        simplify_index(&heads, &extent),
        Expr::div(vj.clone(), Expr::int(16))
    );
    assert_eq!(
        simplify_index(&Expr::div(flat.clone(), Expr::int(64)), &extent),
        vi.clone()
    );
    assert_eq!(
        simplify_index(&Expr::rem(flat.clone(), Expr::int(16)), &extent),
        Expr::rem(vj.clone(), Expr::int(16))
    );
    // Nothing is taken apart where the ranges do not allow it (j reaches 64).
    let kept = Expr::rem(Expr::add(vi.clone(), vj.clone()), Expr::int(16));
    assert_eq!(simplify_index(&kept, &extent), kept);
    // Stored transposed as [4, 16, 16] (head, row, column): j moves it through two digits that cannot
    // meet; j / 16 + j % 16 can.
    let (hi, lo) = (
        Expr::div(vj.clone(), Expr::int(16)),
        Expr::rem(vj.clone(), Expr::int(16)),
    );
    let transposed = Expr::add(
        Expr::add(
            Expr::mul(hi.clone(), Expr::int(256)),
            Expr::mul(vi.clone(), Expr::int(16)),
        ),
        lo.clone(),
    );
    assert!(moves_with(&transposed, j, 64) && moves_with(&transposed, i, 16));
    assert!(!moves_with(&Expr::add(hi, lo), j, 64));
    assert!(!moves_with(&vi, j, 64));
}

/// A window partition's reshape: a position flattened with its innermost axis and divided by a multiple
/// of that axis's length loses the axis (`simplify::simplify` under the loop ranges); the kernel pass
/// keeps the plain loops' results.
#[test]
fn quotients_of_a_common_factor_drop_the_inner_axis() {
    use crate::simplify::simplify;
    let (w, r, c) = (Var(0), Var(1), Var(2));
    let ranges: std::collections::HashMap<Var, u64> =
        [(w, 64), (r, 49), (c, 96)].into_iter().collect();
    let (vw, vr, vc) = (Expr::var(w), Expr::var(r), Expr::var(c));
    // ((w * 49 + r) * 96 + c): window w, row r of the window, channel c.
    let flat = Expr::add(
        Expr::mul(
            Expr::add(Expr::mul(vw.clone(), Expr::int(49)), vr.clone()),
            Expr::int(96),
        ),
        vc.clone(),
    );
    // / (8 * 49 * 96): the window's row of windows; / (7 * 96) % 7: the row's digit; % (2 * 96): the
    // channel kept below the factor.
    assert_eq!(
        simplify(&Expr::div(flat.clone(), Expr::int(37632)), &ranges),
        Expr::div(vw.clone(), Expr::int(8))
    );
    assert_eq!(
        simplify(
            &Expr::rem(Expr::div(flat.clone(), Expr::int(672)), Expr::int(7)),
            &ranges
        ),
        Expr::div(vr.clone(), Expr::int(7))
    );
    let row = Expr::add(Expr::mul(vw.clone(), Expr::int(49)), vr.clone());
    assert_eq!(
        simplify(&Expr::rem(flat.clone(), Expr::int(192)), &ranges),
        Expr::add(
            Expr::mul(Expr::rem(row, Expr::int(2)), Expr::int(96)),
            vc.clone()
        )
    );
    let text = "kernel @part(%x: f32[3136,96], %y: f32[8,392,96], %z: f32[64,49,96], %u: f32[64,49,96]) {
  serial %p in 0..3136 {
    serial %q in 0..96 {
      %y[(%p / 392), (%p % 392), %q] = %x[%p, %q]
    }
  }
  serial %w in 0..64 {
    serial %r in 0..49 {
      serial %c in 0..96 {
        %z[%w, %r, %c] = %y[(((((%w * 49) + %r) * 96) + %c) / 37632), ((((((%w * 49) + %r) * 96) + %c) / 96) % 392), %c]
        %u[%w, %r, %c] = %x[((((((%w * 49) + %r) * 96) + %c) % 192) + 0), 0]
      }
    }
  }
}";
    let base = parse_kernel(text).unwrap();
    verify(&base).unwrap();
    let mut k = base.clone();
    crate::simplify::simplify_kernel(&mut k);
    verify(&k).unwrap();
    let printed = print::kernel(&k);
    assert!(!printed.contains("37632"), "{printed}");
    let x: Vec<f32> = (0..3136 * 96).map(|i| (i % 1000) as f32).collect();
    let args = || {
        vec![
            x.clone(),
            vec![0.0; 3136 * 96],
            vec![0.0; 3136 * 96],
            vec![0.0; 3136 * 96],
        ]
    };
    let (got, want) = (run(&k, args()), run(&base, args()));
    assert_eq!(got, want);
    assert_eq!(
        want[2], x,
        "the partition of a row-major reshape is the identity here"
    );
}

/// `analysis::arithmetic` splits a kernel's operations by how they run: a vector loop over contiguous
/// loads, one that gathers (a transposed operand strides along the vector), a register tile, a scalar nest.
#[test]
fn arithmetic_is_split_by_how_it_runs() {
    let k = parse_kernel(
        "kernel @mix(%a: f32[16,16], %b: f32[16,16], %c: f32[16,16]) {
  local %acc: f32[2,16]
  serial %i in 0..16 {
    vector<16> %j in 0..16 {
      %c[%i, %j] = fma(%a[%i, %j], 2.0f32, 1.0f32)
    }
    vector<16> %j2 in 0..16 {
      %c[%i, %j2] = (%a[%j2, %i] * %b[%i, %j2])
    }
    serial %j3 in 0..16 {
      %c[%i, %j3] = (%a[%i, %j3] + 1.0f32)
    }
  }
  serial %k in 0..16 {
    unrolled %ii in 0..2 {
      vector<16> %jl in 0..16 {
        %acc[%ii, %jl] = fma(%a[%ii, %k], %b[%k, %jl], %acc[%ii, %jl])
      }
    }
  }
}
",
    )
    .unwrap();
    let a = analysis::arithmetic(&k);
    assert_eq!(
        a,
        analysis::Arithmetic {
            tiled: 2.0 * 16.0 * 2.0 * 16.0,
            tiled_gather: 0.0,
            vector: 2.0 * 256.0,
            gather: 256.0,
            scalar: 256.0
        }
    );
    // Loads and stores by how they move: the transposed load gathers (stride 16), everything else in
    // the vector loops is contiguous or broadcast (%a[%ii, %k] along %jl).
    let m = analysis::accesses(&k);
    assert_eq!(
        m,
        analysis::Accesses {
            vector: 2.0 * 256.0 + 2.0 * 256.0 + 4.0 * 16.0 * 32.0,
            gather: 256.0,
            scalar: 2.0 * 256.0
        }
    );
    // The same tile reading B at stride 2 (a stride-2 convolution's input row) gathers.
    let strided = parse_kernel(
        "kernel @s2(%a: f32[2,16], %b: f32[16,32], %acc: f32[2,16]) {
  serial %k in 0..16 {
    unrolled %ii in 0..2 {
      vector<16> %jl in 0..16 {
        %acc[%ii, %jl] = fma(%a[%ii, %k], %b[%k, (%jl * 2)], %acc[%ii, %jl])
      }
    }
  }
}
",
    )
    .unwrap();
    assert_eq!(
        analysis::arithmetic(&strided),
        analysis::Arithmetic {
            tiled_gather: 2.0 * 16.0 * 2.0 * 16.0,
            ..Default::default()
        }
    );
}

/// A concat of two inputs along the outer axis, and a row read through a split vector loop.
const CONCAT: &str = "kernel @concat(%a: f32[4,8], %b: f32[2,8], %y: f32[6,8], %s: f32[6]) {
  local %part: f32[4]
  serial %i in 0..6 {
    serial %j in 0..8 {
      %y[%i, %j] = select(lt(%i, 4), %a[max(min(%i, 3), 0), %j], %b[max(min((%i - 4), 1), 0), %j])
    }
    serial %q in 0..4 {
      %part[%q] = 0.0f32
    }
    serial %ro in 0..4 {
      serial %rl in 0..4 {
        %part[%rl] = (%part[%rl] + select(lt(((%ro * 4) + %rl), 8), %a[0, max(min(((%ro * 4) + %rl), 7), 0)], %b[0, max(min((((%ro * 4) + %rl) - 8), 7), 0)]))
      }
    }
    %s[%i] = (%part[0] + %part[3])
  }
}
";

#[test]
fn partitioning_folds_the_tests_and_keeps_the_results() {
    let base = parse_kernel(CONCAT).unwrap();
    verify(&base).unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..16).map(|i| 100.0 + i as f32).collect();
    let args = || vec![a.clone(), b.clone(), vec![0.0; 48], vec![0.0; 6]];
    let want = run(&base, args());
    let mut k = base.clone();
    crate::partition::partition(&mut k);
    verify(&k).unwrap();
    assert_eq!(run(&k, args()), want);
    let text = print::kernel(&k);
    // %i splits where the concat changes input, %ro where the row read does (4 * 2 = 8), and no select
    // or clamp is left in either.
    assert_eq!(
        crate::step::schedule_text(&k.schedule),
        "partition(i,4) partition(ro.0,2) partition(ro.4,2)",
        "{text}"
    );
    assert!(!text.contains("select") && !text.contains("min("), "{text}");
    assert!(
        text.contains("%y[(%i.4 + 4), %j.4] = %b[%i.4, %j.4]"),
        "{text}"
    );
    assert_eq!(print::kernel(&parse_kernel(&text).unwrap()), text);
    // A test that is not uniform over a piece (%rl decides it within one %ro) leaves the loop whole.
    let mixed = CONCAT.replace("lt(((%ro * 4) + %rl), 8)", "lt(((%ro * 4) + %rl), 6)");
    let mut k = parse_kernel(&mixed).unwrap();
    crate::partition::partition(&mut k);
    assert_eq!(crate::step::schedule_text(&k.schedule), "partition(i,4)");
}

/// Folds over rows of 37: a sum, a max from a non-zero start, a dot product (fma), a sum whose start is
/// not 0 (left alone: each lane's partial would count it), and a product (not an rfactor op).
const FOLDS: &str = "kernel @folds(%x: f32[3,37], %y: f32[3,37], %s: f32[3,5]) {
  local %a: f32[]
  local %m: f32[]
  local %d: f32[]
  local %b: f32[]
  local %p: f32[]
  serial %i in 0..3 {
    %a[] = 0.0f32
    serial %r in 0..37 {
      %a[] = (%a[] + %x[%i, %r])
    }
    %m[] = -1.0f32
    serial %r2 in 0..37 {
      %m[] = max(%x[%i, %r2], %m[])
    }
    %d[] = 0.0f32
    serial %r3 in 0..37 {
      %d[] = fma(%x[%i, %r3], %y[%i, %r3], %d[])
    }
    %b[] = 1.0f32
    serial %r4 in 0..37 {
      %b[] = (%b[] + %x[%i, %r4])
    }
    %p[] = 1.0f32
    serial %r5 in 0..37 {
      %p[] = (%p[] * %x[%i, %r5])
    }
    %s[%i, 0] = %a[]
    %s[%i, 1] = %m[]
    %s[%i, 2] = %d[]
    %s[%i, 3] = %b[]
    %s[%i, 4] = %p[]
  }
}
";

#[test]
fn rfactor_keeps_one_partial_per_lane() {
    let base = parse_kernel(FOLDS).unwrap();
    verify(&base).unwrap();
    let x: Vec<f32> = (0..111)
        .map(|i| ((i * 7) % 23) as f32 * 0.25 - 2.0)
        .collect();
    let y: Vec<f32> = (0..111)
        .map(|i| ((i * 5) % 13) as f32 * 0.5 - 3.0)
        .collect();
    let args = || vec![x.clone(), y.clone(), vec![0.0; 15]];
    let want = run(&base, args());
    let mut k = base.clone();
    assert_eq!(crate::rfactor::rfactor(&mut k, 16), 3);
    verify(&k).unwrap();
    assert_eq!(
        crate::step::schedule_text(&k.schedule),
        "rfactor(r,16) rfactor(r2,16) rfactor(r3,16)"
    );
    // Every value here is a multiple of 1/16 and small, so the sums are exact in any order.
    assert_eq!(run(&k, args()), want);
    let text = print::kernel(&k);
    // 37 = 2 x 16 + 5: two vector steps, the halves 16 -> 8 -> 4, four scalar steps, five in order.
    assert!(
        text.contains("serial %r.o in 0..2 {") && text.contains("vector<16> %r.l in 0..16 {"),
        "{text}"
    );
    assert!(
        text.contains("vector<4> %r.h8 in 0..4 {") && text.contains("serial %r.t in 0..5 {"),
        "{text}"
    );
    assert!(text.contains("%d.part[%r3.l] = fma("), "{text}");
    assert!(
        text.contains("serial %r4 in 0..37") && text.contains("serial %r5 in 0..37"),
        "{text}"
    );
    assert_eq!(print::kernel(&parse_kernel(&text).unwrap()), text);
    // A loop shorter than the lanes is left alone.
    let mut k = base.clone();
    assert_eq!(crate::rfactor::rfactor(&mut k, 64), 0);
    // Four lanes: 37 is eight vectors or more, so four chains of 4 lanes: two groups of 16, one whole
    // vector after them, the halves 16 -> 8 -> 4, and one element in order; the same results.
    let mut k = base.clone();
    assert_eq!(crate::rfactor::rfactor(&mut k, 4), 3);
    verify(&k).unwrap();
    assert_eq!(run(&k, args()), want);
    let text = print::kernel(&k);
    for line in [
        "local %a.part: f32[16]",
        "serial %r.o in 0..2 {",
        "vector<4> %r.l in 0..16 {",
        "serial %r.v in 0..1 {",
        "%a.part[%r.m] = (%a.part[%r.m] + %x[%i, ((32 + (%r.v * 4)) + %r.m)])",
        "vector<4> %r.h16 in 0..8 {",
        "serial %r.t in 0..1 {",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    assert_eq!(print::kernel(&parse_kernel(&text).unwrap()), text);
}

#[test]
fn unused_locals_are_dropped_and_the_rest_renumbered() {
    let text = "kernel @k(%x: f32[4], %y: f32[4]) {
  local %dead: f32[]
  local %t: f32[4]
  serial %i in 0..4 {
    %t[%i] = (%x[%i] + 1.0f32)
  }
  serial %j in 0..4 {
    %y[%j] = (%t[%j] * 2.0f32)
  }
}
";
    let mut k = parse_kernel(text).unwrap();
    let want = run(&k, vec![vec![1.0, 2.0, 3.0, 4.0], vec![0.0; 4]]);
    k.drop_unused_locals();
    verify(&k).unwrap();
    let names: Vec<&str> = k.bufs.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "t"]);
    assert_eq!(
        print::kernel(&k),
        text.replace("  local %dead: f32[]\n", "")
    );
    assert_eq!(run(&k, vec![vec![1.0, 2.0, 3.0, 4.0], vec![0.0; 4]]), want);
}

#[test]
fn replace_swaps_a_subexpression_everywhere() {
    let (i, j) = (Expr::var(Var(0)), Expr::var(Var(1)));
    let place = Expr::bin(
        BinOp::Max,
        Expr::bin(BinOp::Min, i.clone(), Expr::int(7)),
        Expr::int(0),
    );
    let e = Expr::add(
        Expr::load(BufId(0), vec![place.clone()]),
        Expr::load(BufId(1), vec![Expr::mul(place.clone(), Expr::int(8))]),
    );
    let got = e.replace(&place, &j);
    assert_eq!(
        got,
        Expr::add(
            Expr::load(BufId(0), vec![j.clone()]),
            Expr::load(BufId(1), vec![Expr::mul(j.clone(), Expr::int(8))])
        )
    );
    assert!(!got.uses(Var(0)));
}

#[test]
fn ids_display_out_of_their_kernel() {
    assert_eq!(
        (BufId(3).to_string(), Var(0).to_string()),
        ("b3".into(), "v0".into())
    );
}

/// Stores through a layout tail (a tile's columns split into heads) write distinct elements for every
/// column panel, which the affine test cannot see; a store that does meet is caught.
#[test]
fn distinct_writes_are_proved_by_evaluation() {
    let (jo, c) = (Var(0), Var(1));
    let col = Expr::add(Expr::mul(Expr::var(jo), Expr::int(64)), Expr::var(c));
    // [col / 384, (col / 32) % 12, col % 32] of a [3, 12, 32] buffer, 18 panels of 64 columns.
    let flat = Expr::add(
        Expr::add(
            Expr::mul(Expr::div(col.clone(), Expr::int(384)), Expr::int(384)),
            Expr::mul(
                Expr::rem(Expr::div(col.clone(), Expr::int(32)), Expr::int(12)),
                Expr::int(32),
            ),
        ),
        Expr::rem(col.clone(), Expr::int(32)),
    );
    assert_eq!(analysis::coefficient(&flat, jo), None);
    assert!(analysis::distinct_for(
        &flat,
        (jo, 18),
        &[],
        &[(c, 64)],
        1 << 20
    ));
    // Panels that overlap (64-wide steps over 96 columns) write some element twice.
    let overlapping = Expr::add(Expr::mul(Expr::var(jo), Expr::int(64)), Expr::var(c));
    assert!(!analysis::distinct_for(
        &overlapping,
        (jo, 4),
        &[],
        &[(c, 96)],
        1 << 20
    ));
    // Too many points to evaluate: not proved.
    assert!(!analysis::distinct_for(
        &flat,
        (jo, 18),
        &[],
        &[(c, 64)],
        100
    ));
    // An image loop around it that the index is affine in only shifts the values: evaluated at its
    // first image, within the budget of one (8 x 18 x 64 points would not be).
    let n = Var(jo.0.max(c.0) + 1);
    let batched = Expr::add(Expr::mul(Expr::var(n), Expr::int(18 * 64)), flat.clone());
    assert!(analysis::distinct_for(
        &batched,
        (jo, 18),
        &[(n, 8)],
        &[(c, 64)],
        18 * 64
    ));
    // One it is not affine in is still enumerated: here, too many points.
    let folded = Expr::add(Expr::rem(Expr::var(n), Expr::int(3)), flat);
    assert!(!analysis::distinct_for(
        &folded,
        (jo, 18),
        &[(n, 8)],
        &[(c, 64)],
        18 * 64
    ));
}

/// A local is private to an iteration of a loop when every access is inside it and indexed by its own
/// loops: a tile's accumulator is; the partial sums a K-blocked tile leaves for the next run of the
/// loop (indexed by the loop's variable) are not, nor is anything read outside.
#[test]
fn locals_indexed_by_the_loop_are_shared() {
    let text = "kernel @kblock(%x: f32[4,8], %y: f32[4]) {
  local %acc: f32[1]
  local %sums: f32[4]
  serial %kb in 0..2 {
    parallel %io in 0..4 {
      if eq(%kb, 0) {
        %acc[0] = 0.0f32
      }
      if ne(%kb, 0) {
        %acc[0] = %sums[%io]
      }
      serial %k in 0..4 {
        %acc[0] = (%acc[0] + %x[%io, ((%kb * 4) + %k)])
      }
      %sums[%io] = %acc[0]
      if eq(%kb, 1) {
        %y[%io] = %acc[0]
      }
    }
  }
}
";
    let k = parse_kernel(text).unwrap();
    let Stmt::For { body: kb, .. } = &k.body[0] else {
        panic!("{text}")
    };
    let Stmt::For { body: io, .. } = &kb[0] else {
        panic!("{text}")
    };
    let names = |bufs: Vec<BufId>| -> Vec<String> {
        bufs.iter().map(|b| k.buffer(*b).name.clone()).collect()
    };
    assert_eq!(names(analysis::private_locals(&k, io)), ["acc"]);
    assert_eq!(names(analysis::private_locals(&k, kb)), ["acc", "sums"]);
    let owned = analysis::locals_owned_by_loops(&k, &|kind| kind == LoopKind::Parallel);
    assert_eq!(names(owned), ["acc"]);
    // Run as written, the sums carry from the first block to the second.
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let out = run(&k, vec![x, vec![0.0; 4]]);
    assert_eq!(out[1], [28.0, 92.0, 156.0, 220.0]);
}

/// `analysis::row_runs`: the lanes of an im2col copy (16 output positions `p` of a 28-wide map, read
/// at the 30-wide padded input) walk the input's rows, contiguous within one and 2 elements further
/// at its end; through a stride-2 window (rows of 60, two per output row: 2 x 60 - 2 x 28 further), 2
/// apart; a lane variable outside the split or a split whose column is not the contiguous axis do
/// not.
#[test]
fn row_runs_find_positions_split_into_rows() {
    let k = parse_kernel(
        "kernel @copy(%x: f32[4,30,30], %y: f32[4,64], %z: f32[4,64], %s: f32[4,60,60], %t: f32[4,30,30]) {
  serial %c in 0..4 {
    serial %j in 0..4 {
      vector<16> %l in 0..16 {
        %y[%c, ((%j * 16) + %l)] = %x[%c, ((((%j * 16) + %l) / 28) + 1), ((((%j * 16) + %l) % 28) + 2)]
        %z[%c, ((%j * 16) + %l)] = %s[%c, (((((%j * 16) + %l) / 28) * 2) + 1), (((((%j * 16) + %l) % 28) * 2) + 1)]
        %z[%c, ((%j * 16) + %l)] = %x[%c, ((((%j * 16) + %l) / 28) + 1), (((((%j * 16) + %l) % 28) + %l) / 2)]
        %z[%c, ((%j * 16) + %l)] = %t[%c, ((((%j * 16) + %l) % 28) + 1), ((((%j * 16) + %l) / 28) + 2)]
      }
    }
  }
}
",
    )
    .unwrap();
    let mut found = vec![];
    analysis::for_each_access(&k.body, &mut |b, index, vector, _| {
        if let (Some(v), false) = (vector, k.buffer(b).name.starts_with(['y', 'z'])) {
            let flat = analysis::flat_index(&k, b, index);
            found.push(analysis::row_runs(&k, &flat, v).map(|r| (r.width, r.step, r.jump)));
        }
    });
    assert_eq!(found, [Some((28, 1, 2)), Some((28, 2, 64)), None, None]);
}

/// A quantize-dequantize round trip in an epilogue (`simplify::quantized_once`): the integer casts go,
/// and the result is the same, bit for bit, on whole numbers, halves, both bounds' neighbours, NaN and
/// the infinities; forms that are not such a round trip keep their casts.
#[test]
fn a_fake_quantized_value_skips_the_integer_round_trip() {
    let kernel = |expr: &str| {
        parse_kernel(&format!(
            "kernel @q(%x: f32[64], %y: f32[64]) {{\n  serial %i in 0..64 {{\n    %y[%i] = {expr}\n  }}\n}}\n"
        ))
        .unwrap()
    };
    let trips = [
        "(cast<f32>(cast<u8>(min(max(round((%x[%i] * 40.0f32)), 0.0f32), 255.0f32))) * 0.5f32)",
        "cast<f32>(cast<u8>(min(max((round((%x[%i] * 40.0f32)) + 3.0f32), 0.0f32), 255.0f32)))",
        "cast<f32>(cast<i8>(min(max(floor((%x[%i] * 40.0f32)), 0.0f32), 127.0f32)))",
    ];
    let mut draws: Vec<f32> = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
    draws.extend((0..59).map(|i| (i as f32 - 29.0) * 0.2 + 0.0125));
    for text in trips {
        let original = kernel(text);
        let mut once = original.clone();
        simplify::simplify_kernel(&mut once);
        let printed = print::kernel(&once);
        assert!(
            !printed.contains("cast<u8>") && !printed.contains("cast<i8>"),
            "{text}: {printed}"
        );
        let want = run(&original, vec![draws.clone(), vec![0.0; 64]]);
        let got = run(&once, vec![draws.clone(), vec![0.0; 64]]);
        for (i, (a, b)) in want[1].iter().zip(&got[1]).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{text}: x = {}: {a} vs {b}",
                draws[i]
            );
        }
    }
    // Round trips nested eight deep (quantize steps around each op of an epilogue): each names its value
    // once, so the kernel's text grows by a constant per level (a form that repeated it grew fourfold
    // per level, and LLVM took 50 s over DistilBERT's GELU).
    let mut nested = "%x[%i]".to_string();
    for _ in 0..8 {
        nested = format!(
            "(cast<f32>(cast<u8>(min(max(round(({nested} * 3.0f32)), 0.0f32), 255.0f32))) * 0.25f32)"
        );
    }
    let original = kernel(&nested);
    let mut once = original.clone();
    simplify::simplify_kernel(&mut once);
    assert!(
        print::kernel(&once).len() < 2 * print::kernel(&original).len(),
        "{}",
        print::kernel(&once)
    );
    let want = run(&original, vec![draws.clone(), vec![0.0; 64]]);
    let got = run(&once, vec![draws.clone(), vec![0.0; 64]]);
    assert!(want[1]
        .iter()
        .zip(&got[1])
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // Not round trips: an unrounded value (the cast truncates it), a bound below zero (NaN would clamp to
    // it, not to the cast's 0), a bound u8 cannot hold.
    for text in [
        "cast<f32>(cast<u8>(min(max((%x[%i] * 40.0f32), 0.0f32), 255.0f32)))",
        "cast<f32>(cast<i8>(min(max(round(%x[%i]), -128.0f32), 127.0f32)))",
        "cast<f32>(cast<u8>(min(max(round(%x[%i]), 0.0f32), 256.0f32)))",
    ] {
        let mut k = kernel(text);
        simplify::simplify_kernel(&mut k);
        assert!(print::kernel(&k).contains("cast<"), "{text}");
    }
}

/// A guard bounds an expression only while what it reads is unchanged: a store to a buffer the
/// expression loads (a running count), before the access or anywhere in a loop around it, ends the
/// bound.
#[test]
fn a_guard_on_a_value_stops_bounding_it_once_the_value_is_stored() {
    let kernel = |body: &str| {
        format!(
            "kernel @k(%y: i64[4]) {{\n  local %c: i64[]\n  %c[] = 0\n  if and(le(0, %c[]), lt(%c[], 4)) {{\n{body}  }}\n}}\n"
        )
    };
    let fine = kernel("    %y[%c[]] = 1\n    %c[] = (%c[] + 1)\n");
    assert_eq!(verify(&parse_kernel(&fine).unwrap()), Ok(()));
    let after = kernel("    %c[] = (%c[] + 1)\n    %y[%c[]] = 1\n");
    let looped =
        kernel("    serial %i in 0..4 {\n      %y[%c[]] = 1\n      %c[] = (%c[] + 1)\n    }\n");
    for bad in [after, looped] {
        let e = verify(&parse_kernel(&bad).unwrap()).unwrap_err().join("\n");
        assert!(e.contains("store to %y: index 0"), "{e}\n{bad}");
    }
}
