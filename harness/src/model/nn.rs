//! Building blocks shared by the model files, all from differentiable candle ops (no fused op
//! without a backward). Weights are cast to the activations' dtype at use, which is how the
//! `mixed-*` precision policies run 16-bit compute on f32 master weights: the backward of
//! `to_dtype` brings gradients back to the f32 variables.
use candle_core::{DType, Result, Tensor, D};

/// `w` in the dtype of `x` (a no-op when they match).
pub fn cast_like(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    if w.dtype() == x.dtype() {
        Ok(w.clone())
    } else {
        w.to_dtype(x.dtype())
    }
}

/// A dense layer. `w` is (out, in) like torch's Linear, or (in, out) for GPT-2's Conv1D.
pub struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
    pub transposed: bool,
}

impl Linear {
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Linear {
            w,
            b,
            transposed: false,
        }
    }

    /// GPT-2's Conv1D: weight stored (in, out).
    pub fn conv1d(w: Tensor, b: Tensor) -> Self {
        Linear {
            w,
            b: Some(b),
            transposed: true,
        }
    }

    /// x: (b, s, in) → (b, s, out).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, s, i) = x.dims3()?;
        let w = cast_like(&self.w, x)?;
        let w = if self.transposed { w } else { w.t()? };
        let y = x.reshape((b * s, i))?.matmul(&w)?;
        let y = match &self.b {
            Some(bias) => y.broadcast_add(&cast_like(bias, &y)?)?,
            None => y,
        };
        y.reshape((b, s, ()))
    }
}

/// RMSNorm in f32, cast back (HF's LlamaRMSNorm).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let y = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    let y = y.to_dtype(x.dtype())?;
    y.broadcast_mul(&cast_like(w, &y)?)
}

/// LayerNorm in f32, cast back.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let mean = x32.mean_keepdim(D::Minus1)?;
    let xc = x32.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xc
        .broadcast_div(&(var + eps)?.sqrt()?)?
        .to_dtype(x.dtype())?;
    y.broadcast_mul(&cast_like(w, &y)?)?
        .broadcast_add(&cast_like(b, &y)?)
}

/// Softmax over the last dimension, in f32, cast back.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let max = x32.max_keepdim(D::Minus1)?.detach();
    let e = x32.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.to_dtype(x.dtype())
}

/// Additive causal mask (s, total) for queries at positions pos..pos+s.
pub fn causal_mask(
    pos: usize,
    s: usize,
    total: usize,
    dtype: DType,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    let m: Vec<f32> = (0..s)
        .flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (s, total), dev)?.to_dtype(dtype)
}

/// Multi-head attention core. q: (b, h, s, hd), k and v: (b, kvh, total, hd) with h a multiple
/// of kvh (GQA without copying K/V: the query heads sharing a KV head become rows).
/// `causal_pos`: Some(pos) applies a causal mask for queries at pos..pos+s. Returns (b, s, h·hd).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal_pos: Option<usize>) -> Result<Tensor> {
    let (b, h, s, hd) = q.dims4()?;
    let (kvh, total) = (k.dim(1)?, k.dim(2)?);
    let g = h / kvh;
    let q = q.contiguous()?.reshape((b, kvh, g * s, hd))?;
    let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
    let scores = match causal_pos {
        Some(pos) if s > 1 => {
            let mask = causal_mask(pos, s, total, scores.dtype(), q.device())?;
            scores
                .reshape((b, kvh, g, s, total))?
                .broadcast_add(&mask)?
                .reshape((b, kvh, g * s, total))?
        }
        _ => scores,
    };
    let out = softmax(&scores)?.matmul(v)?;
    out.reshape((b, h, s, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, s, h * hd))
}

/// (b, s, n·hd) → (b, n, s, hd), contiguous.
pub fn split_heads(x: &Tensor, n: usize) -> Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    x.reshape((b, s, n, ()))?.transpose(1, 2)?.contiguous()
}

/// Mean token cross-entropy of logits (b, s, V) against targets (b, s) u32, in f32.
pub fn lm_loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (b, s, v) = logits.dims3()?;
    let logits = logits.to_dtype(DType::F32)?.reshape((b * s, v))?;
    candle_nn::loss::cross_entropy(&logits, &targets.flatten_all()?)
}

/// Rows `ids` (b, s) u32 of an embedding table (V, d) → (b, s, d) in `dtype`. The rows are
/// gathered in the table's dtype and then cast, so under a mixed policy the gradient lands on
/// the f32 table without a 16-bit copy of the whole table.
pub fn embedding(table: &Tensor, ids: &Tensor, dtype: DType) -> Result<Tensor> {
    let (b, s) = ids.dims2()?;
    table
        .index_select(&ids.flatten_all()?, 0)?
        .reshape((b, s, ()))?
        .to_dtype(dtype)
}
