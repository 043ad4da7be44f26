//! The llama family (Llama 2/3, Mistral, Qwen2, SmolLM2, TinyLlama) from differentiable candle
//! ops only: GQA, RoPE (rotate-half), RMSNorm, SwiGLU, tied embeddings, optional qkv bias.
//!
//! No fused op without a backward is used (candle-nn's `rms_norm`, `softmax_last_dim` and
//! `rope` record none), so the same code serves inference and training. Like HF's eager
//! implementation, RMSNorm and softmax run in f32 and cast back.
use super::{Config, KvCache};
use anyhow::{anyhow, Result};
use candle_core::{DType, Device, Tensor, D};
use std::collections::HashMap;

struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    /// x: (b, s, in) → (b, s, out).
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, s, i) = x.dims3()?;
        let y = x.reshape((b * s, i))?.matmul(&self.w.t()?)?;
        let y = match &self.b {
            Some(bias) => y.broadcast_add(bias)?,
            None => y,
        };
        y.reshape((b, s, ()))
    }
}

struct Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    post_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub struct Llama {
    cfg: Config,
    dtype: DType,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Option<Tensor>,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let y = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    y.to_dtype(dtype)?.broadcast_mul(w)
}

/// Softmax over the last dimension, in f32, from differentiable ops.
pub fn softmax(x: &Tensor) -> candle_core::Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?;
    let max = x32.max_keepdim(D::Minus1)?.detach();
    let e = x32.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.to_dtype(dtype)
}

fn rotate_half(x: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// cos and sin tables (s, head_dim) for positions pos..pos+s, in `dtype`.
fn rope_tables(
    cfg: &Config,
    pos: usize,
    s: usize,
    dtype: DType,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let hd = cfg.head_dim;
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / hd as f64) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, hd / 2), dev)?;
    let t = Tensor::arange(pos as u32, (pos + s) as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((s, 1))?;
    let f = t.broadcast_mul(&inv)?;
    let f = Tensor::cat(&[&f, &f], D::Minus1)?;
    Ok((f.cos()?.to_dtype(dtype)?, f.sin()?.to_dtype(dtype)?))
}

fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?
}

/// Additive causal mask (s, total) for queries at positions pos..pos+s.
fn causal_mask(pos: usize, s: usize, total: usize, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
    let m: Vec<f32> = (0..s)
        .flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (s, total), dev)?.to_dtype(dtype)
}

impl Llama {
    /// Builds the model from HF-named tensors (consumed). Every tensor of `cfg` must be there.
    pub fn new(cfg: &Config, mut t: HashMap<String, Tensor>) -> Result<Self> {
        let mut take = |name: &str| {
            t.remove(name)
                .ok_or_else(|| anyhow!("weights lack tensor `{name}`"))
        };
        let embed = take("model.embed_tokens.weight")?;
        let dtype = embed.dtype();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |m: &str, bias: bool| -> Result<Linear> {
                Ok(Linear {
                    w: take(&format!("{p}.{m}.weight"))?,
                    b: if bias { Some(take(&format!("{p}.{m}.bias"))?) } else { None },
                })
            };
            let q = lin("self_attn.q_proj", cfg.qkv_bias)?;
            let k = lin("self_attn.k_proj", cfg.qkv_bias)?;
            let v = lin("self_attn.v_proj", cfg.qkv_bias)?;
            let o = lin("self_attn.o_proj", cfg.o_bias)?;
            let gate = lin("mlp.gate_proj", false)?;
            let up = lin("mlp.up_proj", false)?;
            let down = lin("mlp.down_proj", false)?;
            layers.push(Layer {
                input_norm: take(&format!("{p}.input_layernorm.weight"))?,
                post_norm: take(&format!("{p}.post_attention_layernorm.weight"))?,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
            });
        }
        let norm = take("model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(take("lm_head.weight")?)
        };
        Ok(Llama {
            cfg: cfg.clone(),
            dtype,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    fn attention(
        &self,
        l: &Layer,
        x: &Tensor,
        layer: usize,
        pos: usize,
        rope: &(Tensor, Tensor),
        cache: Option<&mut KvCache>,
    ) -> candle_core::Result<Tensor> {
        let c = &self.cfg;
        let (b, s, _) = x.dims3()?;
        let (h, kvh, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let heads = |t: Tensor, n: usize| t.reshape((b, s, n, hd))?.transpose(1, 2)?.contiguous();
        let q = apply_rope(&heads(l.q.forward(x)?, h)?, &rope.0, &rope.1)?;
        let k = apply_rope(&heads(l.k.forward(x)?, kvh)?, &rope.0, &rope.1)?;
        let v = heads(l.v.forward(x)?, kvh)?;
        let (k, v) = match cache {
            Some(cache) => cache.append(layer, &k, &v)?,
            None => (k, v),
        };
        let total = k.dim(2)?;
        // GQA without copying K/V: the g query heads that share a KV head become rows.
        let g = h / kvh;
        let q = q.reshape((b, kvh, g * s, hd))?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let scores = if s > 1 {
            let mask = causal_mask(pos, s, total, scores.dtype(), x.device())?;
            scores
                .reshape((b, kvh, g, s, total))?
                .broadcast_add(&mask)?
                .reshape((b, kvh, g * s, total))?
        } else {
            scores
        };
        let probs = softmax(&scores)?;
        let out = probs.matmul(&v)?; // (b, kvh, g*s, hd)
        let out = out
            .reshape((b, h, s, hd))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, s, h * hd))?;
        l.o.forward(&out)
    }

    /// Runs the model on token ids (b, s) at positions pos..pos+s, appending to `cache` when
    /// given. Returns logits (b, s, vocab), or (b, 1, vocab) for the last position only when
    /// `last_only` (what a generation step needs).
    pub fn forward(
        &self,
        ids: &Tensor,
        pos: usize,
        mut cache: Option<&mut KvCache>,
        last_only: bool,
    ) -> candle_core::Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let c = &self.cfg;
        let rope = rope_tables(c, pos, s, self.dtype, ids.device())?;
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, s, c.hidden_size))?;
        for (i, l) in self.layers.iter().enumerate() {
            let a = self.attention(l, &rms_norm(&x, &l.input_norm, c.norm_eps)?, i, pos, &rope, cache.as_deref_mut())?;
            x = (x + a)?;
            let hn = rms_norm(&x, &l.post_norm, c.norm_eps)?;
            let m = l.down.forward(&(l.gate.forward(&hn)?.silu()? * l.up.forward(&hn)?)?)?;
            x = (x + m)?;
        }
        if let Some(cache) = cache {
            cache.advance(s);
        }
        let x = if last_only && s > 1 {
            x.narrow(1, s - 1, 1)?.contiguous()?
        } else {
            x
        };
        let x = rms_norm(&x, &self.norm, c.norm_eps)?;
        let head = Linear {
            w: self.lm_head.as_ref().unwrap_or(&self.embed).clone(),
            b: None,
        };
        head.forward(&x)
    }

    /// Greedy next token per sequence from logits (b, s, vocab): (b, 1) u32.
    pub fn argmax_last(logits: &Tensor) -> candle_core::Result<Tensor> {
        let s = logits.dim(1)?;
        logits.narrow(1, s - 1, 1)?.argmax(D::Minus1)
    }
}
