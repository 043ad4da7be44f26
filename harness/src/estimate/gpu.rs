//! What an estimate says about one GPU of the catalogue (`crate::gpu`): whether it fits, the
//! largest batch and context that do, the KV capacity, and the smallest FSDP degree for
//! training.
use super::{estimate, Mode, Overflow, Query, Sharding};
use crate::fit::Constants;
use crate::gpu::budget;
use crate::model::Config;
use serde::Serialize;

/// The largest value in 1..=hi for which `fits` holds (monotone), or 0.
pub fn largest(hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, hi);
    if fits(hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The verdict on one GPU: `borderline` where the budget lies within the range the allocator
/// reserve's fitted error gives the NVML figure (at its low end it fits, at its high end not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Fits,
    Borderline,
    DoesNotFit,
}

/// What the estimate says about one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuFit {
    pub gpu: String,
    pub gpu_bytes: u64,
    pub budget_bytes: u64,
    /// The NVML figure with the reserve at the low end of its range.
    pub total_low_bytes: u64,
    /// The NVML figure with the reserve at the high end of its range: what `fits` judges.
    pub total_high_bytes: u64,
    /// At the high end of the NVML figure's range: the conservative answer.
    pub fits: bool,
    pub verdict: Verdict,
    pub largest_batch: u64,
    pub largest_context: u64,
    /// vLLM-style: tokens the KV budget holds (inference only).
    pub kv_capacity_tokens: Option<u64>,
    /// Sequences of `context` tokens the KV budget holds at once (each holding the tokens its
    /// cache keeps: at most the sliding window under `--kv-window model`).
    pub max_concurrency: Option<f64>,
    /// Training that does not fit: the smallest FSDP (ZeRO-3) degree that does.
    pub min_fsdp_gpus: Option<u64>,
}

/// Largest batch searched.
pub const MAX_BATCH: u64 = 1 << 20;
/// Largest context searched.
pub const MAX_CONTEXT: u64 = 1 << 24;
/// Largest FSDP degree searched.
pub const MAX_GPUS: u64 = 4096;

/// What the estimate of `q` says about one GPU: an [`Overflow`] when `q`'s own estimate
/// overflows; a searched candidate that overflows does not fit.
pub fn gpu_fit(
    cfg: &Config,
    q: &Query,
    c: Option<&Constants>,
    gpu: &str,
    gpu_bytes: u64,
    headroom: f64,
) -> Result<GpuFit, Overflow> {
    let cap = budget(gpu_bytes, headroom);
    let fits = |q: &Query| fits_in(cfg, q, c, cap);
    let (kv_tokens, concurrency) = if q.mode == Mode::Infer {
        let e = estimate(cfg, q, c)?;
        // One sequence of the context: its KV bytes (a windowed layer holds at most its
        // window) and the tokens it holds. A sequence past 2^64 B holds no token.
        let context = q.context as usize;
        let per_sequence = cfg
            .kv_bytes(context, q.kv_window, q.act_bytes() as usize, q.mla_cache())
            .get()
            .unwrap_or(u64::MAX)
            .max(1);
        let held = cfg.kv_tokens_held(context, q.kv_window) as u128;
        let free = cap.saturating_sub(e.total_high()? - e.kv);
        let tokens =
            u64::try_from(u128::from(free) * held / u128::from(per_sequence)).unwrap_or(u64::MAX);
        // Sequences of the context that fit: the tokens over the tokens one holds.
        (Some(tokens), Some(tokens as f64 / held.max(1) as f64))
    } else {
        (None, None)
    };
    let ok = fits(q);
    let e = estimate(cfg, q, c)?;
    let (low, high) = (e.total_low()?, e.total_high()?);
    let verdict = match (ok, low <= cap) {
        (true, _) => Verdict::Fits,
        (false, true) => Verdict::Borderline,
        (false, false) => Verdict::DoesNotFit,
    };
    let min_fsdp_gpus = (q.mode == Mode::Train && !ok)
        .then(|| {
            let sharded = |n: u64| Query {
                sharding: Sharding::Fsdp,
                gpus: n,
                ..*q
            };
            // Every sharded row shrinks as the degree grows: bisect for the first that fits.
            let n = (largest(MAX_GPUS, |n| !fits(&sharded(n))) + 1).max(2);
            (n <= MAX_GPUS).then_some(n)
        })
        .flatten();
    Ok(GpuFit {
        gpu: gpu.to_string(),
        gpu_bytes,
        budget_bytes: cap,
        total_low_bytes: low,
        total_high_bytes: high,
        fits: ok,
        verdict,
        largest_batch: largest(MAX_BATCH, |b| fits(&Query { batch: b, ..*q })),
        largest_context: largest(MAX_CONTEXT, |s| fits(&Query { context: s, ..*q })),
        kv_capacity_tokens: kv_tokens,
        max_concurrency: concurrency,
        min_fsdp_gpus,
    })
}

/// Whether the estimate of `q` fits `cap` bytes at the high end of its range
/// ([`super::Breakdown::total_high`]); one that overflows does not.
pub fn fits_in(cfg: &Config, q: &Query, c: Option<&Constants>, cap: u64) -> bool {
    estimate(cfg, q, c)
        .and_then(|e| e.total_high())
        .is_ok_and(|t| t <= cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::{estimate, gpu_fit, preset, q};

    #[test]
    fn search() {
        assert_eq!(largest(1000, |x| x * x <= 2000), 44);
        assert_eq!(largest(1000, |_| false), 0);
        assert_eq!(largest(1000, |_| true), 1000);
    }

    #[test]
    fn largest_batch_is_the_last_that_fits() {
        let m = preset("llama-3.1-8b");
        let g = gpu_fit(&m, &q(), "h100-80", 80_000_000_000);
        let total = |b: u64| {
            estimate(&m, &Query { batch: b, ..q() }, None)
                .total_high()
                .unwrap()
        };
        assert!(total(g.largest_batch) <= g.budget_bytes);
        assert!(total(g.largest_batch + 1) > g.budget_bytes);
        let tokens = g.kv_capacity_tokens.unwrap();
        assert!(tokens >= g.largest_batch * 4096);
    }
}
