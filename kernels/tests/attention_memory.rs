//! O(s) memory of flash attention in both directions, measured with a counting allocator in a
//! process of its own. The bounds are derived from the shapes:
//! - forward: the output (b·s·h·d) and the log-sum-exp (b·s·h f32), plus per-thread scratch
//!   of (2·d + tile) f32 per live rayon split;
//! - backward (candle's whole `backward()` of Σ out): candle's own buffers (the output's
//!   gradient twice while it accumulates, each input's gradient three times while it
//!   accumulates), plus per-task dK/dV accumulators (2·s·d f32) and row scratch.
//!
//! Both bounds are linear in s; the scores alone (b·h·s²·4 bytes) exceed them many times over
//! at the lengths tested. The eager reference is measured too, to show that the counter sees
//! an s² buffer when there is one.
mod common;

use candle_core::{DType, Device, Tensor, Var};
use vramlab_kernels::{flash_attention, AttnMask, FLASH_TILE};

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

/// Bookkeeping slack per candle tensor made (Arc'd tensor header, shape and stride vectors,
/// the op node): generous, and independent of s.
const PER_TENSOR_SLACK: usize = 1024;

fn main() {
    let (b, h, kvh, d) = (1usize, 4usize, 2usize, 32usize);
    let threads = rayon::current_num_threads();
    let f = 4; // f32
               // Warm up rayon's pool and candle's first-use allocations.
    run(b, h, kvh, 64, d);
    for s in [1000usize, 2048] {
        let (fwd, bwd, eager) = run(b, h, kvh, s, d);
        let (q, kv, o) = (b * h * s * d * f, b * kvh * s * d * f, b * s * h * d * f);
        let lse = b * s * h * 4;
        let splits = threads * (usize::BITS - (b * s).leading_zeros()) as usize;
        let fwd_bound = o + lse + splits * (2 * d + FLASH_TILE) * 4 + 8 * PER_TENSOR_SLACK;
        let tasks = threads.min(b * kvh);
        let bwd_bound = 2 * o
            + 3 * (q + 2 * kv)
            + tasks * (2 * s * d + 3 * d + FLASH_TILE) * 4
            + 64 * PER_TENSOR_SLACK;
        let scores = b * h * s * s * f;
        println!(
            "s={s}: flash forward {fwd} B (bound {fwd_bound}), flash backward {bwd} B (bound {bwd_bound}), \
             eager forward {eager} B; scores alone {scores} B"
        );
        assert!(
            fwd >= o + lse,
            "forward below its own output: {fwd} < {}",
            o + lse
        );
        assert!(
            fwd <= fwd_bound,
            "s={s}: forward transient {fwd} B > O(s) bound {fwd_bound} B"
        );
        assert!(
            bwd <= bwd_bound,
            "s={s}: backward transient {bwd} B > O(s) bound {bwd_bound} B"
        );
        assert!(
            fwd_bound * 4 < scores && bwd_bound * 2 < scores,
            "bounds must be far below s²"
        );
        assert!(
            eager >= scores,
            "the eager reference keeps the scores: {eager} < {scores}"
        );
    }
    println!("attention_memory: ok");
}

/// (flash forward transient, flash backward transient, eager forward transient), in bytes.
fn run(b: usize, h: usize, kvh: usize, s: usize, d: usize) -> (usize, usize, usize) {
    let dev = Device::Cpu;
    let var = |n| Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, n, s, d), &dev).unwrap()).unwrap();
    let (q, k, v) = (var(h), var(kvh), var(kvh));
    let scale = 1.0 / (d as f32).sqrt();
    let (out, fwd) =
        common::transient(|| flash_attention(&q, &k, &v, scale, AttnMask::CAUSAL).unwrap());
    let loss = out.sum_all().unwrap();
    let (grads, bwd) = common::transient(|| loss.backward().unwrap());
    drop((grads, loss, out));
    let (eager, eager_bytes) = common::transient(|| {
        let kk = k
            .unsqueeze(2)
            .unwrap()
            .broadcast_as((b, kvh, h / kvh, s, d))
            .unwrap();
        let kk = kk.reshape((b, h, s, d)).unwrap();
        let sc = (q.matmul(&kk.t().unwrap()).unwrap() * scale as f64).unwrap();
        candle_core::Tensor::exp(&sc)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    });
    drop(eager);
    (fwd, bwd, eager_bytes)
}
