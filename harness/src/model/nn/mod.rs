//! Building blocks shared by the model files, all from differentiable candle ops (no fused op
//! without a backward). Weights are cast to the activations' dtype at use, which is how the
//! `mixed-*` precision policies run 16-bit compute on f32 master weights: the backward of
//! `to_dtype` brings gradients back to the f32 variables.
use crate::vocab::QMatmul;
use candle_core::{DType, Result, Tensor, D};

mod attention;
mod layers;
pub mod moe;
pub mod rope;

pub use attention::{
    attend, attention, attention_scored, causal_mask, split_heads, Causal, Scoring,
};
pub use layers::{lora_names, Conv2d, Linear, Lora, QTensors, Weight, LORA_ALPHA};

/// `w` in the dtype of `x` (a no-op when they match).
pub fn cast_like(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    if w.dtype() == x.dtype() {
        Ok(w.clone())
    } else {
        w.to_dtype(x.dtype())
    }
}

/// LayerNorm weight and bias (applied by [`layer_norm`]).
pub struct Norm {
    pub w: Tensor,
    pub b: Tensor,
}

impl Norm {
    pub fn forward(&self, x: &Tensor, eps: f64) -> Result<Tensor> {
        layer_norm(x, &self.w, &self.b, eps)
    }
}

/// The HF-named tensors a model constructor consumes, by name: dense ones, and (for a
/// quantized point) quantized ones with how their products run.
pub struct Named(
    pub std::collections::HashMap<String, Tensor>,
    pub QTensors,
    pub QMatmul,
);

impl Named {
    /// Dense tensors only.
    pub fn dense(t: std::collections::HashMap<String, Tensor>) -> Self {
        Named(t, QTensors::new(), QMatmul::Auto)
    }

    pub fn take(&mut self, name: &str) -> anyhow::Result<Tensor> {
        self.0
            .remove(name)
            .ok_or_else(|| anyhow::anyhow!("weights lack tensor `{name}`"))
    }

    /// A weight: quantized when the map holds it quantized, else dense.
    pub fn weight(&mut self, name: &str) -> anyhow::Result<Weight> {
        match self.1.remove(name) {
            Some(q) => Ok(Weight::Quant(q, self.2)),
            None => self.take(name).map(Weight::Dense),
        }
    }

    /// Module `m`'s `.weight` (and `.bias` when `bias`), plus its LoRA adapter
    /// (`m.lora_A.weight`, `m.lora_B.weight`) when the map holds one.
    pub fn linear(&mut self, m: &str, bias: bool) -> anyhow::Result<Linear> {
        let w = self.weight(&format!("{m}.weight"))?;
        let b = if bias {
            Some(self.take(&format!("{m}.bias"))?)
        } else {
            None
        };
        let [a_name, b_name] = lora_names(m);
        let lora = match self.0.remove(&a_name) {
            Some(a) => Some(Lora {
                a,
                b: self.take(&b_name)?,
            }),
            None => None,
        };
        Ok(Linear {
            w,
            b,
            transposed: false,
            lora,
        })
    }

    /// GPT-2's Conv1D module `m`: weight stored (in, out), with a bias.
    pub fn conv1d(&mut self, m: &str) -> anyhow::Result<Linear> {
        Ok(Linear {
            transposed: true,
            ..self.linear(m, true)?
        })
    }

    /// LayerNorm module `m` (`.weight`, `.bias`).
    pub fn norm(&mut self, m: &str) -> anyhow::Result<Norm> {
        Ok(Norm {
            w: self.take(&format!("{m}.weight"))?,
            b: self.take(&format!("{m}.bias"))?,
        })
    }
}

/// RMSNorm in f32, cast back (HF's LlamaRMSNorm).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let y = unit_rms(x, eps)?;
    y.broadcast_mul(&cast_like(w, &y)?)
}

/// x over its root mean square (last dimension) in f32, cast back: RMSNorm without a weight
/// (Llama 4's `Llama4TextL2Norm` of q and k).
pub fn unit_rms(x: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    x32.broadcast_div(&(var + eps)?.sqrt()?)?
        .to_dtype(x.dtype())
}

/// Gemma's RMSNorm: normalized and scaled by (1 + weight) in f32, then cast back (HF's
/// Gemma2RMSNorm, whose product is in f32 where llama's is in the input's dtype).
pub fn gemma_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let y = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    let scale = (w.to_dtype(DType::F32)? + 1.0)?;
    y.broadcast_mul(&scale)?.to_dtype(x.dtype())
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
