//! The CLIP text encoders of SD (and FLUX's first text encoder): transformers'
//! `text_encoder/config.json` ([`ClipConfig`]), its parameter count, and [`ClipText`], built from
//! candle ops because candle's `clip::Config` has private fields (only its presets can be built),
//! so it cannot read a `config.json` or a tiny test config.
use crate::model::diffusion::params::linear_params;
use anyhow::Result;
use candle_core::{Device, Module, Tensor, D};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

/// The layer norms' epsilon when a config does not give one (CLIP's and the VAE's).
pub(super) fn eps() -> f64 {
    1e-5
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipAct {
    QuickGelu,
    Gelu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum ClipArch {
    CLIPTextModel,
    CLIPTextModelWithProjection,
}

/// transformers' `text_encoder/config.json` (CLIPTextConfig).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClipConfig {
    pub architectures: Vec<ClipArch>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub max_position_embeddings: usize,
    pub hidden_act: ClipAct,
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    pub projection_dim: usize,
}

impl ClipConfig {
    pub fn with_projection(&self) -> bool {
        self.architectures
            .contains(&ClipArch::CLIPTextModelWithProjection)
    }
}

pub(super) fn clip(
    arch: ClipArch,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    act: ClipAct,
    proj: usize,
) -> ClipConfig {
    ClipConfig {
        architectures: vec![arch],
        vocab_size: 49408,
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        max_position_embeddings: 77,
        hidden_act: act,
        layer_norm_eps: 1e-5,
        projection_dim: proj,
    }
}

/// OpenAI's CLIP ViT-L/14 text encoder (openai/clip-vit-large-patch14): SD 1.5's, SDXL's first
/// and FLUX.1's `text_encoder/`.
pub fn clip_l() -> ClipConfig {
    clip(
        ClipArch::CLIPTextModel,
        768,
        3072,
        12,
        12,
        ClipAct::QuickGelu,
        768,
    )
}

/// A CLIP text transformer's parameters from its config.
pub fn clip_params(c: &ClipConfig) -> u64 {
    let h = c.hidden_size as u64;
    let i = c.intermediate_size as u64;
    let layer = 4 * linear_params(h, h) + 2 * 2 * h + linear_params(h, i) + linear_params(i, h);
    let proj = if c.with_projection() {
        h * c.projection_dim as u64
    } else {
        0
    };
    (c.vocab_size + c.max_position_embeddings) as u64 * h
        + c.num_hidden_layers as u64 * layer
        + 2 * h
        + proj
}

/// A CLIP text transformer (transformers' `CLIPTextModel[WithProjection]`), built from candle
/// ops: embeddings, pre-norm causal self-attention layers, final LayerNorm. Returns the last
/// hidden state (b, s, hidden), what the UNet's cross-attention reads.
pub struct ClipText {
    token: candle_nn::Embedding,
    position: candle_nn::Embedding,
    layers: Vec<ClipLayer>,
    final_norm: candle_nn::LayerNorm,
    heads: usize,
    act: ClipAct,
}

struct ClipLayer {
    q: candle_nn::Linear,
    k: candle_nn::Linear,
    v: candle_nn::Linear,
    out: candle_nn::Linear,
    norm1: candle_nn::LayerNorm,
    norm2: candle_nn::LayerNorm,
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl ClipText {
    pub fn new(c: &ClipConfig, vb: VarBuilder) -> candle_core::Result<ClipText> {
        let h = c.hidden_size;
        let m = vb.pp("text_model");
        let e = m.pp("embeddings");
        let token = candle_nn::embedding(c.vocab_size, h, e.pp("token_embedding"))?;
        let position =
            candle_nn::embedding(c.max_position_embeddings, h, e.pp("position_embedding"))?;
        let ln = |vb: VarBuilder| candle_nn::layer_norm(h, c.layer_norm_eps, vb);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = m.pp(format!("encoder.layers.{i}"));
                let a = l.pp("self_attn");
                Ok(ClipLayer {
                    q: candle_nn::linear(h, h, a.pp("q_proj"))?,
                    k: candle_nn::linear(h, h, a.pp("k_proj"))?,
                    v: candle_nn::linear(h, h, a.pp("v_proj"))?,
                    out: candle_nn::linear(h, h, a.pp("out_proj"))?,
                    norm1: ln(l.pp("layer_norm1"))?,
                    norm2: ln(l.pp("layer_norm2"))?,
                    fc1: candle_nn::linear(h, c.intermediate_size, l.pp("mlp.fc1"))?,
                    fc2: candle_nn::linear(c.intermediate_size, h, l.pp("mlp.fc2"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let final_norm = ln(m.pp("final_layer_norm"))?;
        if c.with_projection() {
            // Stored (and loaded, as diffusers does); the pooled projection is not computed.
            vb.get((c.projection_dim, h), "text_projection.weight")?;
        }
        Ok(ClipText {
            token,
            position,
            layers,
            final_norm,
            heads: c.num_attention_heads,
            act: c.hidden_act,
        })
    }

    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let dev = ids.device();
        let pos = Tensor::arange(0u32, s as u32, dev)?;
        let mut x = self
            .token
            .forward(ids)?
            .broadcast_add(&self.position.forward(&pos)?)?;
        let mask: Vec<f32> = (0..s)
            .flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0. }))
            .collect();
        let mask = Tensor::from_vec(mask, (s, s), dev)?.to_dtype(x.dtype())?;
        let hd = x.dim(D::Minus1)? / self.heads;
        for l in &self.layers {
            let r = x.clone();
            let y = l.norm1.forward(&x)?;
            let split = |t: Tensor| {
                t.reshape((b, s, self.heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = (split(l.q.forward(&y)?)? * (hd as f64).powf(-0.5))?;
            let k = split(l.k.forward(&y)?)?;
            let v = split(l.v.forward(&y)?)?;
            let w = q.matmul(&k.t()?)?.broadcast_add(&mask)?;
            let w = candle_nn::ops::softmax_last_dim(&w)?;
            let y = w
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((b, s, self.heads * hd))?;
            x = (l.out.forward(&y)? + r)?;
            let r = x.clone();
            let y = l.fc1.forward(&l.norm2.forward(&x)?)?;
            let y = match self.act {
                ClipAct::QuickGelu => (&y * candle_nn::ops::sigmoid(&(&y * 1.702)?)?)?,
                ClipAct::Gelu => y.gelu()?,
            };
            x = (l.fc2.forward(&y)? + r)?;
        }
        self.final_norm.forward(&x)
    }
}

/// Token ids of `n` prompts of a CLIP text encoder's full length (BOS, then ids in range).
pub fn clip_ids(c: &ClipConfig, n: usize, dev: &Device) -> Result<Tensor> {
    let (s, v) = (c.max_position_embeddings, c.vocab_size as u32);
    let ids: Vec<u32> = (0..n * s).map(|i| (i as u32 * 7 + 1) % v).collect();
    Ok(Tensor::from_vec(ids, (n, s), dev)?)
}
