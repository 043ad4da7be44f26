//! Attention: the causal mask, eager attention over materialized scores, and the choice
//! between eager and vramlab-kernels' tiled (flash) attention.
use super::softmax;
use crate::vocab::Attention;
use candle_core::{DType, Result, Tensor};

/// A causal mask for queries at positions pos..pos+s over keys at positions 0..total: a query
/// at position p sees keys in (p - window, p] (all keys up to p without a window), and with a
/// chunk c only those of its own chunk, [c·⌊p/c⌋, p] (Llama 4's chunked layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Causal {
    pub pos: usize,
    pub window: Option<usize>,
    pub chunk: Option<usize>,
}

/// Additive causal mask (s, total) for queries at positions pos..pos+s.
pub fn causal_mask(
    c: Causal,
    s: usize,
    total: usize,
    dtype: DType,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    let w = c.window.unwrap_or(usize::MAX);
    let chunk = c.chunk.unwrap_or(usize::MAX);
    let m: Vec<f32> = (0..s)
        .flat_map(|i| {
            let p = c.pos + i;
            (0..total).map(move |j| {
                if j > p || p - j >= w || j / chunk != p / chunk {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(m, (s, total), dev)?.to_dtype(dtype)
}

/// Multi-head attention core. q: (b, h, s, hd), k and v: (b, kvh, total, hd) with h a multiple
/// of kvh (GQA without copying K/V: the query heads sharing a KV head become rows).
/// `causal`: a causal (and possibly windowed) mask for queries at pos..pos+s; a single query
/// (a decode step) is given only the keys it may see, so it takes no mask. `fused_softmax`
/// runs vramlab-kernels' softmax (it keeps only its output) instead of the f32 composition.
/// Returns (b, s, h·hd).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: Option<Causal>,
    fused_softmax: bool,
) -> Result<Tensor> {
    attention_scored(q, k, v, causal, fused_softmax, Scoring::default())
}

/// How eager attention scores its keys beyond the default 1/√head_dim.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scoring<'a> {
    /// The scale of q·k (None: 1/√head_dim).
    pub scale: Option<f64>,
    /// tanh soft-capping of the scaled scores, before the mask: cap · tanh(scores / cap)
    /// (Gemma 2).
    pub softcap: Option<f64>,
    /// A sink logit per query head (h): a column every query's softmax includes and then
    /// drops, so a head can attend to nothing (gpt-oss).
    pub sinks: Option<&'a Tensor>,
}

/// [`attention`] with the scores scaled and capped as `scoring` says.
pub fn attention_scored(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: Option<Causal>,
    fused_softmax: bool,
    scoring: Scoring<'_>,
) -> Result<Tensor> {
    let (b, h, s, hd) = q.dims4()?;
    let (kvh, total) = (k.dim(1)?, k.dim(2)?);
    let g = h / kvh;
    let q = q.contiguous()?.reshape((b, kvh, g * s, hd))?;
    let scale = scoring.scale.unwrap_or(1.0 / (hd as f64).sqrt());
    let scores = (q.matmul(&k.t()?)? * scale)?;
    let scores = match scoring.softcap {
        Some(cap) => ((scores / cap)?.tanh()? * cap)?,
        None => scores,
    };
    let scores = match causal {
        Some(c) if s > 1 => {
            let mask = causal_mask(c, s, total, scores.dtype(), q.device())?;
            scores
                .reshape((b, kvh, g, s, total))?
                .broadcast_add(&mask)?
                .reshape((b, kvh, g * s, total))?
        }
        _ => scores,
    };
    let p = match scoring.sinks {
        Some(sinks) => {
            // (h) → (b, kvh, g·s, 1): head kv·g + i's sink beside each of its queries' rows.
            let col = sinks
                .to_dtype(scores.dtype())?
                .reshape((1, kvh, g, 1, 1))?
                .broadcast_as((b, kvh, g, s, 1))?
                .reshape((b, kvh, g * s, 1))?;
            let p = softmax(&Tensor::cat(&[&scores, &col], 3)?)?;
            p.narrow(3, 0, total)?
        }
        None if fused_softmax => vramlab_kernels::softmax_last_dim(&scores)?,
        None => softmax(&scores)?,
    };
    let out = p.matmul(v)?;
    out.reshape((b, h, s, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, s, h * hd))
}

/// Unmasked attention of q (b, heads, n, hd) over k, v (b, heads, m, hd), all contiguous,
/// scale 1/√hd → (b, n, heads·hd). [`Attention::Flash`] runs vramlab-kernels' tiled attention
/// (online softmax, no (n, m) scores); anything else materializes the scores in the
/// activations' dtype and runs vramlab-kernels' softmax (fused, with a backward). q and k are
/// dropped once the scores exist.
pub fn attend(q: Tensor, k: Tensor, v: &Tensor, kind: Attention) -> Result<Tensor> {
    let (b, heads, n, hd) = q.dims4()?;
    let scale = 1.0 / (hd as f64).sqrt();
    match kind {
        Attention::Flash => vramlab_kernels::flash_attention(
            &q,
            &k,
            v,
            scale as f32,
            vramlab_kernels::AttnMask::FULL,
        )?
        .reshape((b, n, heads * hd)),
        _ => {
            let scores = (q.matmul(&k.t()?)? * scale)?;
            drop((q, k));
            let p = vramlab_kernels::softmax_last_dim(&scores)?;
            drop(scores);
            p.matmul(v)?.transpose(1, 2)?.reshape((b, n, heads * hd))
        }
    }
}

/// (b, s, n·hd) → (b, n, s, hd), contiguous.
pub fn split_heads(x: &Tensor, n: usize) -> Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    x.reshape((b, s, n, ()))?.transpose(1, 2)?.contiguous()
}
