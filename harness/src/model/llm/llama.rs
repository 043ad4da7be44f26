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
use crate::model::arch::{checked, parse_json, Architecture, Decoder, Tensors};
use crate::model::config::HiddenAct;
use crate::model::kv::chunk_keys;
use crate::model::nn::moe::SparseMoe;
use crate::model::nn::rope::{apply_rope, apply_rope_pairs, nope_temperature, Rope};
use crate::model::nn::{
    attention_scored, embedding, gemma_rms_norm, lm_loss, rms_norm, split_heads, unit_rms, Causal,
    Linear, Named, QTensors, Scoring, Weight,
};
use crate::model::{Config, KvCache, Trainable};
use crate::vocab::{Attention, Kernels, Ops, QMatmul};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The keys of a llama-family `config.json` (Llama 2/3, SmolLM2, TinyLlama; Mistral, Qwen2,
/// Qwen3 and Phi-3 flatten it into theirs).
#[derive(Clone, Debug, Deserialize)]
pub struct DecoderJson {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub max_position_embeddings: usize,
    pub rope_theta: Option<f64>,
    /// transformers ≥ 5 writes `rope_theta` here instead of at the top level.
    pub rope_parameters: Option<RopeParameters>,
    pub rms_norm_eps: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
}

/// transformers ≥ 5's `rope_parameters` (its other keys do not change memory).
#[derive(Clone, Debug, Deserialize)]
pub struct RopeParameters {
    pub rope_theta: Option<f64>,
}

impl DecoderJson {
    /// The normalized config; `tie_default` is the architecture's default for
    /// `tie_word_embeddings` when the file omits it.
    pub fn config(
        &self,
        arch: &'static dyn Architecture,
        model_type: &str,
        tie_default: bool,
    ) -> Config {
        let heads = self.num_attention_heads;
        let attention_bias = self.attention_bias.unwrap_or(false);
        Config {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / heads.max(1)),
            max_position_embeddings: self.max_position_embeddings,
            rope_theta: self
                .rope_theta
                .or(self.rope_parameters.as_ref().and_then(|r| r.rope_theta))
                .unwrap_or(10_000.0),
            norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(tie_default),
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            ..Config::new(arch, model_type)
        }
    }
}

/// The llama-family keys of a config, as `config.json` writes them (each architecture adds
/// its own: `architectures`, biases, window).
pub fn decoder_hf_json(c: &Config, class: &str) -> Value {
    serde_json::json!({
        "architectures": [class],
        "model_type": c.model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
    })
}

/// Llama 2/3, SmolLM2, TinyLlama (`model_type = "llama"`).
pub struct LlamaArch;

impl Architecture for LlamaArch {
    fn transformers4_buffers_per_layer(&self, c: &Config, e: u64) -> u64 {
        crate::model::arch::rotary_caches_per_layer(c, e)
    }
    fn name(&self) -> &'static str {
        "llama"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["llama"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: DecoderJson = parse_json(path, v)?;
        checked(path, j.config(&LlamaArch, "llama", false))
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "LlamaForCausalLM");
        v["attention_bias"] = c.o_bias.into();
        v
    }
}

/// The attention's input projections: separate q, k, v, or Phi-3's fused `qkv_proj`.
enum Qkv {
    Split { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// The MLP's gate and up projections: separate, or Phi-3's fused `gate_up_proj`.
enum GateUp {
    Split { gate: Linear, up: Linear },
    Fused(Linear),
}

/// A layer's MLP: dense (gate and up, then down), or a sparse mixture of experts.
enum Mlp {
    Dense { gate_up: GateUp, down: Linear },
    Sparse(SparseMoe),
}

struct Layer {
    input_norm: Tensor,
    qkv: Qkv,
    /// Qwen3's per-head RMSNorm weights of q and k (head_dim each).
    qk_norm: Option<(Tensor, Tensor)>,
    /// gpt-oss's sink logit per head.
    sinks: Option<Tensor>,
    o: Linear,
    post_norm: Tensor,
    /// Gemma's norms before and after the MLP (its `post_norm` follows the attention).
    ff_norms: Option<(Tensor, Tensor)>,
    mlp: Mlp,
}

pub struct Llama {
    cfg: Config,
    /// The dtype activations are computed in (weights are cast to it at use when they differ).
    compute: DType,
    /// The token embedding (dense, or quantized: rows are dequantized as they are gathered).
    embed: Weight,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Option<Weight>,
    ops: Ops,
}

impl Llama {
    /// Builds the model from HF-named tensors (consumed); activations run in `compute`.
    /// Tensors may be variables (training) or plain (inference).
    pub fn new(cfg: &Config, t: Tensors, compute: DType) -> Result<Self> {
        Self::build(cfg, Named::dense(t), compute)
    }

    /// The model of a quantized point: the matrices and the embedding in `q` stay quantized
    /// (their products run through `QMatMul`, or dequantize per product under
    /// `QMatmul::Dequantize`), the dense tensors `t` (norms) are in `compute`.
    pub fn quantized(
        cfg: &Config,
        t: Tensors,
        q: QTensors,
        qmatmul: QMatmul,
        compute: DType,
    ) -> Result<Self> {
        Self::build(cfg, Named(t, q, qmatmul), compute)
    }

    fn build(cfg: &Config, mut t: Named, compute: DType) -> Result<Self> {
        let embed = t.weight("model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let mut lin = |m: &str, bias: bool| t.linear(&format!("{p}.{m}"), bias);
            let qkv = if cfg.fused_qkv {
                Qkv::Fused(lin("self_attn.qkv_proj", false)?)
            } else {
                Qkv::Split {
                    q: lin("self_attn.q_proj", cfg.qkv_bias)?,
                    k: lin("self_attn.k_proj", cfg.qkv_bias)?,
                    v: lin("self_attn.v_proj", cfg.qkv_bias)?,
                }
            };
            let o = lin("self_attn.o_proj", cfg.o_bias)?;
            let mlp = match &cfg.moe {
                Some(m) if m.is_sparse(i) => Mlp::Sparse(SparseMoe::load(&mut t, m, &p)?),
                _ => {
                    let m = cfg.mlp_module();
                    let gate_up = if cfg.fused_gate_up {
                        GateUp::Fused(lin(&format!("{m}.gate_up_proj"), false)?)
                    } else {
                        GateUp::Split {
                            gate: lin(&format!("{m}.gate_proj"), false)?,
                            up: lin(&format!("{m}.up_proj"), false)?,
                        }
                    };
                    Mlp::Dense {
                        gate_up,
                        down: lin(&format!("{m}.down_proj"), false)?,
                    }
                }
            };
            let qk_norm = if cfg.qk_norm {
                Some((
                    t.take(&format!("{p}.self_attn.q_norm.weight"))?,
                    t.take(&format!("{p}.self_attn.k_norm.weight"))?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                input_norm: t.take(&format!("{p}.input_layernorm.weight"))?,
                post_norm: t.take(&format!("{p}.post_attention_layernorm.weight"))?,
                sinks: match cfg.attention_sinks {
                    true => Some(t.take(&format!("{p}.self_attn.sinks"))?),
                    false => None,
                },
                ff_norms: match cfg.gemma {
                    Some(_) => Some((
                        t.take(&format!("{p}.pre_feedforward_layernorm.weight"))?,
                        t.take(&format!("{p}.post_feedforward_layernorm.weight"))?,
                    )),
                    None => None,
                },
                qkv,
                qk_norm,
                o,
                mlp,
            });
        }
        let norm = t.take("model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(t.weight("lm_head.weight")?)
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

    fn norm(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        match (self.ops.kernels, &self.cfg.gemma) {
            (_, Some(_)) => gemma_rms_norm(x, w, self.cfg.norm_eps),
            (Kernels::Reference, None) => rms_norm(x, w, self.cfg.norm_eps),
            (Kernels::Fused, None) => vramlab_kernels::rms_norm(x, w, self.cfg.norm_eps),
        }
    }

    fn rope(&self, x: &Tensor, (cos, sin): &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
        match (self.ops.kernels, &self.cfg.llama4) {
            (_, Some(_)) => apply_rope_pairs(x, cos, sin),
            (Kernels::Reference, None) => apply_rope(x, cos, sin),
            (Kernels::Fused, None) => vramlab_kernels::rope(x, cos, sin),
        }
    }

    /// q (b, h, s, hd), k and v (b, kvh, total, hd) → (b, s, h·hd), under the mask `causal`.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: Causal,
        sinks: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let fused = self.ops.kernels == Kernels::Fused;
        match self.ops.attention {
            Attention::Eager => {
                let scoring = match &self.cfg.gemma {
                    Some(g) => Scoring {
                        scale: Some(1.0 / g.query_pre_attn_scalar.sqrt()),
                        softcap: g.attn_softcap,
                        sinks,
                    },
                    None => Scoring {
                        sinks,
                        ..Scoring::default()
                    },
                };
                attention_scored(q, k, v, Some(causal), fused, scoring)
            }
            // Refused by the scenario (`sdpa` is the torch probe's).
            Attention::Sdpa => Err(candle_core::Error::Msg(
                "attention `sdpa` is PyTorch's kernel, not a candle op".into(),
            )),
            // Refused by the scenario (`sliced` is the generation UNet's).
            Attention::Sliced => Err(candle_core::Error::Msg(
                "attention `sliced` is for generation points (mode = \"generate\")".into(),
            )),
            Attention::Flash => {
                let (b, h, s, hd) = q.dims4()?;
                let scale = 1.0 / (hd as f32).sqrt();
                let mask = vramlab_kernels::AttnMask {
                    causal: true,
                    window: causal.window,
                };
                vramlab_kernels::flash_attention(q, k, v, scale, mask)?.reshape((b, s, h * hd))
            }
        }
    }

    /// q (b, h, s, hd), k and v (b, kvh, s, hd) of hidden states (b, s, d).
    fn project(&self, l: &Layer, h: &Tensor) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let c = &self.cfg;
        match &l.qkv {
            Qkv::Split { q, k, v } => Ok((
                split_heads(&q.forward(h)?, c.num_heads)?,
                split_heads(&k.forward(h)?, c.num_kv_heads)?,
                split_heads(&v.forward(h)?, c.num_kv_heads)?,
            )),
            Qkv::Fused(qkv) => {
                let y = qkv.forward(h)?;
                let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
                Ok((
                    split_heads(&y.narrow(2, 0, q)?, c.num_heads)?,
                    split_heads(&y.narrow(2, q, kv)?, c.num_kv_heads)?,
                    split_heads(&y.narrow(2, q + kv, kv)?, c.num_kv_heads)?,
                ))
            }
        }
    }

    fn block(
        &self,
        i: usize,
        x: &Tensor,
        pos: usize,
        rope: &Rope,
        cache: Option<&mut KvCache>,
    ) -> candle_core::Result<Tensor> {
        let l = &self.layers[i];
        let rope = rope.of(&self.cfg, i);
        let h = self.norm(x, &l.input_norm)?;
        let (q, k, v) = self.project(l, &h)?;
        let (q, k) = match &l.qk_norm {
            Some((qn, kn)) => (self.norm(&q, qn)?, self.norm(&k, kn)?),
            None => (q, k),
        };
        // Llama 4: RoPE and then the L2 norm of q and k on most layers; on its NoPE layers
        // neither, and the queries scaled with the position.
        let l4 = self.cfg.llama4.as_ref();
        let rotates = l4.is_none_or(|a| a.rope_layers[i]);
        let (q, k) = match rotates {
            true => (self.rope(&q, rope)?, self.rope(&k, rope)?),
            false => (q, k),
        };
        let (q, k) = match l4 {
            Some(a) if a.l2_qk_norm && rotates => {
                let eps = self.cfg.norm_eps;
                (unit_rms(&q, eps)?, unit_rms(&k, eps)?)
            }
            _ => (q, k),
        };
        let q = match l4.and_then(|a| a.temperature) {
            Some(t) if !rotates => {
                let scale = nope_temperature(t, pos, q.dim(2)?, q.device())?;
                q.to_dtype(DType::F32)?
                    .broadcast_mul(&scale)?
                    .to_dtype(q.dtype())?
            }
            _ => q,
        };
        let ring = cache.as_ref().map(|c| c.ring_ordered(i));
        let (k, v) = match cache {
            Some(cache) => cache.append(i, &k, &v)?,
            None => (k, v),
        };
        // A query at position p sees keys in (p - window, p]: a decode step's query attends to
        // the window's last keys (the whole cache once it is capped at the window).
        let window = self.cfg.layer_window(i);
        let (k, v) = match window {
            Some(w) if q.dim(2)? == 1 && k.dim(2)? > w => {
                let t = k.dim(2)?;
                (k.narrow(2, t - w, w)?, v.narrow(2, t - w, w)?)
            }
            _ => (k, v),
        };
        // A chunked layer's decode step sees its own chunk's keys.
        let chunk = self.cfg.layer_chunk(i);
        let (k, v) = match (chunk, ring) {
            (Some(c), Some(ring)) if q.dim(2)? == 1 => chunk_keys(ring, (k, v), pos, c)?,
            _ => (k, v),
        };
        let causal = Causal { pos, window, chunk };
        let attn =
            l.o.forward(&self.attend(&q, &k, &v, causal, l.sinks.as_ref())?)?;
        // Gemma normalizes the attention's output, then the MLP's input with its own norm.
        let (x, h) = match &l.ff_norms {
            Some((pre, _)) => {
                let x = (x + self.norm(&attn, &l.post_norm)?)?;
                let h = self.norm(&x, pre)?;
                (x, h)
            }
            None => {
                let x = (x + attn)?;
                let h = self.norm(&x, &l.post_norm)?;
                (x, h)
            }
        };
        let act = |gate: &Tensor, up: &Tensor| match (self.ops.kernels, self.cfg.hidden_act) {
            (_, HiddenAct::Gelu) => gate.gelu()? * up,
            (Kernels::Reference, _) => gate.silu()? * up,
            (Kernels::Fused, _) => vramlab_kernels::swiglu(gate, up),
        };
        let y = match &l.mlp {
            Mlp::Dense { gate_up, down } => {
                let (gate, up) = match gate_up {
                    GateUp::Split { gate, up } => (gate.forward(&h)?, up.forward(&h)?),
                    GateUp::Fused(gu) => {
                        let y = gu.forward(&h)?;
                        let f = self.cfg.intermediate_size;
                        (y.narrow(2, 0, f)?, y.narrow(2, f, f)?)
                    }
                };
                down.forward(&act(&gate, &up)?)?
            }
            Mlp::Sparse(moe) => moe.forward(&h, &act)?,
        };
        match &l.ff_norms {
            Some((_, post)) => x + self.norm(&y, post)?,
            None => x + y,
        }
    }

    fn head(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.norm(x, &self.norm)?;
        let logits = Linear {
            w: self.lm_head.as_ref().unwrap_or(&self.embed).clone(),
            b: None,
            transposed: false,
            lora: None,
        }
        .forward(&x)?;
        // Gemma 2's tanh soft-capping of the logits.
        match self.cfg.gemma.as_ref().and_then(|g| g.final_softcap) {
            Some(cap) => (logits / cap)?.tanh()? * cap,
            None => Ok(logits),
        }
    }
}

impl Trainable for Llama {
    fn config(&self) -> &Config {
        &self.cfg
    }

    /// Gathers rows in the weights' dtype, then casts (so a mixed policy's embedding
    /// gradient lands on the f32 variable without casting the whole table).
    fn embed(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let x = match &self.embed {
            Weight::Dense(table) => embedding(table, ids, self.compute)?,
            // candle gathers the rows of a quantized table and dequantizes them (f32).
            Weight::Quant(q, _) => q.embedding(ids)?.to_dtype(self.compute)?,
        };
        // Gemma scales its embeddings by √hidden.
        match self.cfg.gemma {
            Some(_) => x * (self.cfg.hidden_size as f64).sqrt(),
            None => Ok(x),
        }
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer(&self, i: usize, x: &Tensor) -> candle_core::Result<Tensor> {
        let rope = Rope::new(&self.cfg, 0, x.dim(1)?, self.compute, x.device())?;
        self.block(i, x, 0, &rope, None)
    }

    fn loss(&self, x: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        lm_loss(&self.head(x)?, targets)
    }
}

impl Decoder for Llama {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn dtype(&self) -> DType {
        self.compute
    }

    fn device(&self) -> &Device {
        self.norm.device()
    }

    fn set_ops(&mut self, ops: Ops) -> Result<()> {
        if self.cfg.reference_ops_only() {
            crate::model::arch::no_ops(self.cfg.architecture.name(), ops)?;
        }
        self.ops = ops;
        Ok(())
    }

    /// Runs the model on token ids (b, s) at positions pos..pos+s, appending to `cache` when
    /// given. Returns logits (b, s, vocab), or (b, 1, vocab) for the last position only when
    /// `last_only` (what a generation step needs).
    fn forward(
        &self,
        ids: &Tensor,
        pos: usize,
        mut cache: Option<&mut KvCache>,
        last_only: bool,
    ) -> candle_core::Result<Tensor> {
        let s = ids.dim(1)?;
        let rope = Rope::new(&self.cfg, pos, s, self.compute, ids.device())?;
        let mut x = self.embed(ids)?;
        for i in 0..self.layers.len() {
            x = self.block(i, &x, pos, &rope, cache.as_deref_mut())?;
        }
        self.head(&crate::model::arch::last_positions(x, s, cache, last_only)?)
    }
}
