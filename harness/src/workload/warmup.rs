//! Warm-up: run every op family once before the first measured phase, so one-off costs
//! (rayon's pool, gemm's per-thread buffers, lazily loaded kernels) land in no measurement.
use crate::model::config::KvWindow;
use crate::model::{Decoder, Encoder, KvCache, KvKind};
use crate::workload::inference::argmax_last;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// Device-level warm-up with no model: matmul, casts, reductions, cat in `dtype`, repeated
/// and large enough that every thread of the pool takes part (each keeps its own gemm
/// buffers; a thread first used inside a measured phase would shift that phase's baseline).
pub fn device(dev: &Device, dtype: DType) -> Result<()> {
    for _ in 0..4 {
        let a = Tensor::randn(0f32, 1.0, (512, 1024), dev)?.to_dtype(dtype)?;
        let b = Tensor::randn(0f32, 1.0, (1024, 512), dev)?.to_dtype(dtype)?;
        let c = a.matmul(&b)?;
        let c = Tensor::cat(&[&c, &c], 1)?.to_dtype(DType::F32)?;
        let _ = crate::model::nn::softmax(&c)?
            .sum_all()?
            .to_scalar::<f32>()?;
    }
    Ok(())
}

/// The most tokens per sequence an inference warm-up runs (prompt or encoder sequence).
///
/// What a warm-up leaves behind does not depend on the sequence length once every matmul is
/// large enough to be split across every thread of the pool: rayon's threads, gemm's
/// per-thread packing slab (sized by the L2 cache, not by the problem), candle's thread-locals,
/// lazily loaded CUDA modules. 64 tokens at the group's largest batch already are, for every
/// model the harness runs, while a prefill's cost grows faster than its length: warming up
/// SmolLM2 at 480 tokens cost two prefills of 10 to 19 s per group, a third of a sweep's
/// measured time. The measured figures are the same either way: `vramlab compare` of a
/// `scenarios/cpu-smollm2.toml` run before and after this bound is exact on every allocated
/// column (docs/src/guides/sweep-overhead.md).
pub const MAX_TOKENS: usize = 64;

/// Model-level warm-up: a prefill at the group's largest batch and prompt (at most
/// [`MAX_TOKENS`]) and a few decode steps with each cache kind. Lazily allocated per-thread
/// buffers (gemm's packing memory) come into being here, not inside the first measured point,
/// so a point's figures do not depend on which points ran before it in the process.
pub fn decoder(m: &dyn Decoder, batch: usize, prompt: usize) -> Result<()> {
    let dev = m.device().clone();
    let prompt = prompt.clamp(1, MAX_TOKENS);
    for kind in [KvKind::Preallocated, KvKind::Growing] {
        let mut cache = KvCache::new(
            kind,
            m.config(),
            batch,
            prompt + 4,
            KvWindow::Model,
            m.dtype(),
            &dev,
        )?;
        let ids = Tensor::zeros((batch, prompt), DType::U32, &dev)?;
        let mut next = argmax_last(&m.forward(&ids, 0, Some(&mut cache), true)?)?;
        for t in 0..4 {
            next = argmax_last(&m.forward(&next, prompt + t, Some(&mut cache), true)?)?;
        }
        let _ = next.to_vec2::<u32>()?;
    }
    Ok(())
}

/// Encoder warm-up: one pass at the group's largest batch and sequence (at most
/// [`MAX_TOKENS`]).
pub fn encoder(m: &dyn Encoder, batch: usize, seq: usize) -> Result<()> {
    let ids = Tensor::zeros((batch, seq.clamp(1, MAX_TOKENS)), DType::U32, m.device())?;
    let _ = m
        .encode(&ids)?
        .to_dtype(DType::F32)?
        .sum_all()?
        .to_scalar::<f32>()?;
    Ok(())
}

/// Training warm-up: one forward and backward at the micro-batch shape (batch, seq) the
/// group's first point uses, for each trainable set of the group, so that gemm's per-thread
/// packing buffers reach their size before the first measured phase (a tiny warm-up left
/// ~1 MB to the first step; LoRA's rank-r matmuls need buffers full training does not).
pub fn training(
    cfg: &crate::model::Config,
    vars: &[(String, candle_core::Var)],
    compute: DType,
    (batch, seq): (usize, usize),
    sets: &[(crate::vocab::Trainable, crate::vocab::Ops)],
) -> Result<()> {
    for &(set, ops) in sets {
        let (m, trainable) =
            crate::model::trainable::trainable_model(cfg, vars, set, compute, ops)?;
        let dev = trainable
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu);
        let ids = Tensor::zeros((batch, seq), DType::U32, &dev)?;
        let g = m.forward_loss(&ids, &ids)?.backward()?;
        drop(g);
    }
    Ok(())
}
