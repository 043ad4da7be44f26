//! Warm-up: run every op family once before the first measured phase, so one-off costs
//! (rayon's pool, gemm's per-thread buffers, lazily loaded kernels) land in no measurement.
use crate::model::{KvCache, KvKind, Llama};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

/// Device-level warm-up with no model: matmul, casts, reductions, cat in `dtype`.
pub fn device(dev: &Device, dtype: DType) -> Result<()> {
    let a = Tensor::randn(0f32, 1.0, (64, 256), dev)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (256, 64), dev)?.to_dtype(dtype)?;
    let c = a.matmul(&b)?;
    let c = Tensor::cat(&[&c, &c], 1)?.to_dtype(DType::F32)?;
    let _ = crate::model::nn::softmax(&c)?
        .sum_all()?
        .to_scalar::<f32>()?;
    Ok(())
}

/// Model-level warm-up: a short prefill and decode with each cache kind.
pub fn model(m: &Llama, batch: usize) -> Result<()> {
    let dev = m.device().clone();
    for kind in [KvKind::Preallocated, KvKind::Growing] {
        let mut cache = KvCache::new(kind, m.config(), batch, 24, m.dtype(), &dev)?;
        let ids = Tensor::zeros((batch, 16), DType::U32, &dev)?;
        let mut next = Llama::argmax_last(&m.forward(&ids, 0, Some(&mut cache), true)?)?;
        for t in 0..4 {
            next = Llama::argmax_last(&m.forward(&next, 16 + t, Some(&mut cache), true)?)?;
        }
        let _ = next.to_vec2::<u32>()?;
    }
    Ok(())
}

/// Training warm-up: one forward and backward at the micro-batch shape (batch, seq) the
/// group's first point uses, so that gemm's per-thread packing buffers reach their size
/// before the first measured phase (a tiny warm-up left ~1 MB to the first step).
pub fn training(
    cfg: &crate::model::Config,
    vars: &[(String, candle_core::Var)],
    compute: DType,
    (batch, seq): (usize, usize),
) -> Result<()> {
    let (m, trainable) = crate::runner::trainable_model(cfg, vars, false, compute)?;
    let dev = trainable
        .first()
        .map(|v| v.device().clone())
        .unwrap_or(Device::Cpu);
    let ids = Tensor::zeros((batch, seq), DType::U32, &dev)?;
    let g = m.forward_loss(&ids, &ids)?.backward()?;
    drop(g);
    Ok(())
}
