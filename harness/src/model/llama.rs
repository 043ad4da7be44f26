//! The llama family (Llama 2/3, Mistral, Qwen2, SmolLM2, TinyLlama) from differentiable candle
//! ops only: GQA, RoPE (rotate-half), RMSNorm, SwiGLU, tied embeddings, optional qkv bias.
//!
//! No fused op without a backward is used (candle-nn's `rms_norm`, `softmax_last_dim` and
//! `rope` record none), so the same code serves inference and training. Like HF's eager
//! implementation, RMSNorm and softmax run in f32 and cast back.
//!
//! [`Ops`] picks the implementations: `kernels = "fused"` runs vramlab-kernels' RMSNorm, RoPE,
//! SwiGLU (and softmax inside eager attention), each with its own backward;
//! `attention = "flash"` runs its tiled attention, which never materializes the scores.
use super::nn::{attention, embedding, lm_loss, rms_norm, split_heads, Linear, Named};
use super::{Config, KvCache, Trainable};
use crate::scenario::spec::{Attention, Kernels, Ops};
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use std::collections::HashMap;

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
    /// The dtype activations are computed in (weights are cast to it at use when they differ).
    compute: DType,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Option<Tensor>,
    ops: Ops,
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

impl Llama {
    /// Builds the model from HF-named tensors (consumed); activations run in `compute`.
    /// Tensors may be variables (training) or plain (inference).
    pub fn new(cfg: &Config, t: HashMap<String, Tensor>, compute: DType) -> Result<Self> {
        let mut t = Named(t);
        let embed = t.take("model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |m: &str, bias: bool| t.linear(&format!("{p}.{m}"), bias);
            let q = lin("self_attn.q_proj", cfg.qkv_bias)?;
            let k = lin("self_attn.k_proj", cfg.qkv_bias)?;
            let v = lin("self_attn.v_proj", cfg.qkv_bias)?;
            let o = lin("self_attn.o_proj", cfg.o_bias)?;
            let gate = lin("mlp.gate_proj", false)?;
            let up = lin("mlp.up_proj", false)?;
            let down = lin("mlp.down_proj", false)?;
            layers.push(Layer {
                input_norm: t.take(&format!("{p}.input_layernorm.weight"))?,
                post_norm: t.take(&format!("{p}.post_attention_layernorm.weight"))?,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
            });
        }
        let norm = t.take("model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(t.take("lm_head.weight")?)
        };
        Ok(Llama {
            cfg: cfg.clone(),
            compute,
            embed,
            layers,
            norm,
            lm_head,
            ops: Ops::default(),
        })
    }

    /// The same model running the op implementations `ops`.
    pub fn with_ops(mut self, ops: Ops) -> Self {
        self.ops = ops;
        self
    }

    /// Switches the op implementations (an inference group shares one loaded model).
    pub fn set_ops(&mut self, ops: Ops) {
        self.ops = ops;
    }

    fn norm(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        match self.ops.kernels {
            Kernels::Reference => rms_norm(x, w, self.cfg.norm_eps),
            Kernels::Fused => vramlab_kernels::rms_norm(x, w, self.cfg.norm_eps),
        }
    }

    fn rope(&self, x: &Tensor, (cos, sin): &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
        match self.ops.kernels {
            Kernels::Reference => apply_rope(x, cos, sin),
            Kernels::Fused => vramlab_kernels::rope(x, cos, sin),
        }
    }

    /// q (b, h, s, hd), k and v (b, kvh, total, hd) → (b, s, h·hd), causal for queries at
    /// pos..pos+s.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: usize,
    ) -> candle_core::Result<Tensor> {
        let fused = self.ops.kernels == Kernels::Fused;
        match self.ops.attention {
            Attention::Eager => attention(q, k, v, Some(pos), fused),
            Attention::Flash => {
                let (b, h, s, hd) = q.dims4()?;
                let scale = 1.0 / (hd as f32).sqrt();
                let mask = vramlab_kernels::AttnMask::CAUSAL;
                vramlab_kernels::flash_attention(q, k, v, scale, mask)?.reshape((b, s, h * hd))
            }
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The compute dtype (also the KV cache dtype).
    pub fn dtype(&self) -> DType {
        self.compute
    }

    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    fn block(
        &self,
        i: usize,
        x: &Tensor,
        pos: usize,
        rope: &(Tensor, Tensor),
        cache: Option<&mut KvCache>,
    ) -> candle_core::Result<Tensor> {
        let (c, l) = (&self.cfg, &self.layers[i]);
        let h = self.norm(x, &l.input_norm)?;
        let q = self.rope(&split_heads(&l.q.forward(&h)?, c.num_heads)?, rope)?;
        let k = self.rope(&split_heads(&l.k.forward(&h)?, c.num_kv_heads)?, rope)?;
        let v = split_heads(&l.v.forward(&h)?, c.num_kv_heads)?;
        let (k, v) = match cache {
            Some(cache) => cache.append(i, &k, &v)?,
            None => (k, v),
        };
        let x = (x + l.o.forward(&self.attend(&q, &k, &v, pos)?)?)?;
        let h = self.norm(&x, &l.post_norm)?;
        let (gate, up) = (l.gate.forward(&h)?, l.up.forward(&h)?);
        let act = match self.ops.kernels {
            Kernels::Reference => (gate.silu()? * up)?,
            Kernels::Fused => vramlab_kernels::swiglu(&gate, &up)?,
        };
        x + l.down.forward(&act)?
    }

    fn head(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.norm(x, &self.norm)?;
        Linear::new(self.lm_head.as_ref().unwrap_or(&self.embed).clone(), None).forward(&x)
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
        let s = ids.dim(1)?;
        let rope = rope_tables(&self.cfg, pos, s, self.compute, ids.device())?;
        let mut x = self.embed(ids)?;
        for i in 0..self.layers.len() {
            x = self.block(i, &x, pos, &rope, cache.as_deref_mut())?;
        }
        if let Some(cache) = cache {
            cache.advance(s);
        }
        let x = if last_only && s > 1 {
            x.narrow(1, s - 1, 1)?.contiguous()?
        } else {
            x
        };
        self.head(&x)
    }

    /// Greedy next token per sequence from logits (b, s, vocab): (b, 1) u32.
    pub fn argmax_last(logits: &Tensor) -> candle_core::Result<Tensor> {
        let s = logits.dim(1)?;
        logits.narrow(1, s - 1, 1)?.argmax(D::Minus1)
    }
}

impl Trainable for Llama {
    fn config(&self) -> &Config {
        &self.cfg
    }

    /// Gathers rows in the weights' dtype, then casts (so a mixed policy's embedding
    /// gradient lands on the f32 variable without casting the whole table).
    fn embed(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        embedding(&self.embed, ids, self.compute)
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer(&self, i: usize, x: &Tensor) -> candle_core::Result<Tensor> {
        let rope = rope_tables(&self.cfg, 0, x.dim(1)?, self.compute, x.device())?;
        self.block(i, x, 0, &rope, None)
    }

    fn loss(&self, x: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        lm_loss(&self.head(x)?, targets)
    }
}
