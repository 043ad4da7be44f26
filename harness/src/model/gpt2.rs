//! GPT-2 from differentiable candle ops only: learned positions, pre-LayerNorm blocks, fused
//! qkv projection, GELU (tanh approximation, like HF's `gelu_new`), Conv1D weight layout
//! (stored (in, out)), and a head tied to the token embedding.
//!
//! Tensor names are HF's `model.safetensors` names without the `transformer.` prefix (see
//! [`Config::tensor_shapes`]). LayerNorm and softmax run in f32 and cast back (see `nn`).
use super::nn::{attention, embedding, lm_loss, split_heads, Linear, Named, Norm};
use super::{Config, Trainable};
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::collections::HashMap;

struct Block {
    ln_1: Norm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: Norm,
    c_fc: Linear,
    mlp_proj: Linear,
}

pub struct Gpt2 {
    cfg: Config,
    /// The dtype activations are computed in (weights are cast to it at use when they differ).
    compute: DType,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: Norm,
}

impl Gpt2 {
    /// Builds the model from HF-named tensors (consumed); activations run in `compute`.
    /// Tensors may be variables (training) or plain (inference).
    pub fn new(cfg: &Config, t: HashMap<String, Tensor>, compute: DType) -> Result<Self> {
        let mut t = Named(t);
        let wte = t.take("wte.weight")?;
        let wpe = t.take("wpe.weight")?;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("h.{i}");
            blocks.push(Block {
                ln_1: t.norm(&format!("{p}.ln_1"))?,
                c_attn: t.conv1d(&format!("{p}.attn.c_attn"))?,
                attn_proj: t.conv1d(&format!("{p}.attn.c_proj"))?,
                ln_2: t.norm(&format!("{p}.ln_2"))?,
                c_fc: t.conv1d(&format!("{p}.mlp.c_fc"))?,
                mlp_proj: t.conv1d(&format!("{p}.mlp.c_proj"))?,
            });
        }
        let ln_f = t.norm("ln_f")?;
        Ok(Gpt2 {
            cfg: cfg.clone(),
            compute,
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.compute
    }

    /// Logits (b, s, vocab) of the final hidden states (b, s, d): ln_f, then the tied head.
    pub fn head(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.ln_f.forward(x, self.cfg.norm_eps)?;
        Linear::new(self.wte.clone(), None).forward(&x)
    }

    /// Logits (b, s, vocab) for token ids (b, s) at positions 0..s.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = self.embed(ids)?;
        for i in 0..self.blocks.len() {
            x = self.layer(i, &x)?;
        }
        self.head(&x)
    }
}

impl Trainable for Gpt2 {
    fn config(&self) -> &Config {
        &self.cfg
    }

    /// Token rows plus position rows 0..s (both gathered in the weights' dtype, then cast).
    fn embed(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let s = ids.dim(1)?;
        let tok = embedding(&self.wte, ids, self.compute)?;
        let pos = self.wpe.narrow(0, 0, s)?.to_dtype(self.compute)?;
        tok.broadcast_add(&pos)
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    fn layer(&self, i: usize, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, l) = (&self.cfg, &self.blocks[i]);
        let d = c.hidden_size;
        let h = l.ln_1.forward(x, c.norm_eps)?;
        let qkv = l.c_attn.forward(&h)?;
        let q = split_heads(&qkv.narrow(2, 0, d)?, c.num_heads)?;
        let k = split_heads(&qkv.narrow(2, d, d)?, c.num_heads)?;
        let v = split_heads(&qkv.narrow(2, 2 * d, d)?, c.num_heads)?;
        let x = (x + l
            .attn_proj
            .forward(&attention(&q, &k, &v, Some(0), false)?)?)?;
        let h = l.ln_2.forward(&x, c.norm_eps)?;
        let m = l.mlp_proj.forward(&l.c_fc.forward(&h)?.gelu()?)?;
        x + m
    }

    /// Causal LM cross-entropy over all positions (`targets` are the next-token ids).
    fn loss(&self, x: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        lm_loss(&self.head(x)?, targets)
    }
}
