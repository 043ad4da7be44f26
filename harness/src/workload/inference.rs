//! Inference: a prefill of `prompt_len` tokens × `batch`, then `decode_steps` single-token
//! steps, each appending to the KV cache. Rows: `prefill`; `decode` every `decode_every` steps
//! (and at the last) with the live token count; `total`, the envelope of the point.
//!
//! Live state between phases is exactly the cache and the (batch, 1) u32 next-token tensor,
//! so `end_allocated` differences are KV bytes.
//!
//! An encoder ([`encode`]) runs one `forward` over the batch: no cache, one row.
use super::phase;
use crate::meter::{Meter, PhaseMemory};
use crate::model::config::KvWindow;
use crate::model::{Decoder, Encoder, KvCache, KvKind};
use crate::record::Phase;
use anyhow::Result;
use candle_core::{DType, Tensor, D};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct InferSpec {
    pub batch: usize,
    pub context: usize,
    pub prompt_len: usize,
    pub decode_steps: usize,
    pub decode_every: usize,
    pub kv: KvKind,
    pub kv_window: KvWindow,
}

/// One measured phase of a point.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    pub phase: Phase,
    pub step: Option<u64>,
    pub kv_tokens: u64,
    pub mem: PhaseMemory,
    pub elapsed_ms: f64,
}

/// Seeded prompt token ids (batch, len) in 0..vocab, the same for every run of a point.
pub fn prompt_ids(
    vocab: usize,
    batch: usize,
    len: usize,
    seed: u64,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<u32> = (0..batch * len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    Ok(Tensor::from_vec(ids, (batch, len), dev)?)
}

/// Greedy next token per sequence from logits (b, s, vocab): (b, 1) u32.
pub fn argmax_last(logits: &Tensor) -> candle_core::Result<Tensor> {
    let s = logits.dim(1)?;
    logits.narrow(1, s - 1, 1)?.argmax(D::Minus1)
}

/// Runs one inference point, handing each phase to `emit` as soon as it is measured.
pub fn run(
    model: &dyn Decoder,
    p: &InferSpec,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(PhaseResult) -> Result<()>,
) -> Result<()> {
    let dev = model.device().clone();

    // Prefill: the prompt batch and the cache (all of it, for `preallocated`) are created
    // inside the phase; the prompt is freed before its end.
    let total_t0 = Instant::now();
    let ((mut cache, mut next), prefill, ms) = phase(meter, Phase::Prefill, || {
        let ids = prompt_ids(model.config().vocab_size, p.batch, p.prompt_len, 42, &dev)?;
        let mut cache = KvCache::new(
            p.kv,
            model.config(),
            p.batch,
            p.context,
            p.kv_window,
            model.dtype(),
            &dev,
        )?;
        let next = argmax_last(&model.forward(&ids, 0, Some(&mut cache), true)?)?;
        drop(ids);
        Ok((cache, next))
    })?;
    // A running envelope, not a Vec of phases: a growing Vec would show in the figures.
    let mut total = prefill;
    emit(PhaseResult {
        phase: Phase::Prefill,
        step: Some(0),
        kv_tokens: cache.held() as u64,
        mem: prefill,
        elapsed_ms: ms,
    })?;

    // Decode: a row every `decode_every` steps (and at the last), each measuring its steps.
    let mut done = 0;
    while done < p.decode_steps {
        let upto = (done + p.decode_every).min(p.decode_steps);
        let ((), mem, ms) = phase(meter, Phase::Decode, || {
            for _ in done..upto {
                let pos = cache.len();
                next = argmax_last(&model.forward(&next, pos, Some(&mut cache), true)?)?;
            }
            Ok(())
        })?;
        done = upto;
        total = PhaseMemory::span(&total, &[mem]);
        emit(PhaseResult {
            phase: Phase::Decode,
            step: Some(done as u64),
            kv_tokens: cache.held() as u64,
            mem,
            elapsed_ms: ms,
        })?;
    }
    let kv_tokens = cache.held() as u64;
    drop((cache, next));
    emit(PhaseResult {
        phase: Phase::Total,
        step: Some(p.decode_steps as u64),
        kv_tokens,
        mem: total,
        elapsed_ms: total_t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Greedy decoding of `n` tokens after `prompt` (one sequence), with a preallocated cache.
pub fn generate(model: &dyn Decoder, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    generate_with(model, prompt, n, KvKind::Preallocated)
}

/// [`generate`] with a KV cache of kind `kv`.
pub fn generate_with(
    model: &dyn Decoder,
    prompt: &[u32],
    n: usize,
    kv: KvKind,
) -> Result<Vec<u32>> {
    let dev = model.device().clone();
    let mut cache = KvCache::new(
        kv,
        model.config(),
        1,
        prompt.len() + n,
        KvWindow::Model,
        model.dtype(),
        &dev,
    )?;
    let ids = Tensor::new(prompt, &dev)?.unsqueeze(0)?;
    let mut next = argmax_last(&model.forward(&ids, 0, Some(&mut cache), true)?)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?[0]);
        if out.len() == n {
            break;
        }
        let pos = cache.len();
        next = argmax_last(&model.forward(&next, pos, Some(&mut cache), true)?)?;
    }
    Ok(out)
}

/// One encoder point: a `forward` row for one pass over `batch` sequences of `seq` seeded
/// tokens (the ids are created and the output freed inside the phase), then its `total`
/// envelope (the same figures: the point has one phase).
pub fn encode(
    model: &dyn Encoder,
    batch: usize,
    seq: usize,
    meter: &mut dyn Meter,
    emit: &mut dyn FnMut(PhaseResult) -> Result<()>,
) -> Result<()> {
    let ((), mem, elapsed_ms) = phase(meter, Phase::Forward, || {
        let ids = prompt_ids(model.config().vocab_size, batch, seq, 42, model.device())?;
        let out = model.encode(&ids)?;
        drop((ids, out));
        Ok(())
    })?;
    for ph in [Phase::Forward, Phase::Total] {
        emit(PhaseResult {
            phase: ph,
            step: Some(0),
            kv_tokens: 0,
            mem,
            elapsed_ms,
        })?;
    }
    Ok(())
}
