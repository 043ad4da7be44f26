//! GPT-2 from differentiable candle ops only: learned positions, pre-LayerNorm blocks, fused
//! qkv projection, GELU (tanh approximation, like HF's `gelu_new`), Conv1D weight layout
//! (stored (in, out)), and a head tied to the token embedding.
//!
//! The same model serves StarCoder (`gpt_bigcode.rs`): there the projections are `nn.Linear`
//! (stored (out, in)), the tensors carry a `transformer.` prefix, and attention is multi-query
//! (one K/V head, so the fused `c_attn` is d + 2·head_dim wide). See [`Layout`].
//!
//! Tensor names are HF's `model.safetensors` names without the `transformer.` prefix (GPT-2's
//! checkpoint was saved from `GPT2Model`). Its checkpoint also stores each layer's causal-mask
//! buffer `h.N.attn.bias` (1, 1, 1024, 1024), 12 of them for gpt2: they are not parameters, so
//! [`Gpt2Arch::tensor_shapes`] does not list them, the loader never reads them (it loads by
//! the listed names), and the estimate does not count them. LayerNorm and softmax run in f32
//! and cast back (see `nn`).
use crate::model::arch::{
    checked, no_ops, parse_json, Architecture, Decoder, InferenceModel, Tensors,
};
use crate::model::config::HiddenAct;
use crate::model::nn::{attention, embedding, lm_loss, split_heads, Causal, Linear, Named, Norm};
use crate::model::{Config, KvCache, Trainable};
use crate::vocab::Ops;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// How a GPT-2-shaped checkpoint stores its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Prefix of every tensor name ("" for GPT-2, "transformer." for StarCoder).
    pub prefix: &'static str,
    /// Projections stored (in, out) (GPT-2's Conv1D) rather than (out, in).
    pub conv1d: bool,
}

pub const GPT2_LAYOUT: Layout = Layout {
    prefix: "",
    conv1d: true,
};

/// GPT-2's `config.json` keys.
#[derive(Clone, Debug, Deserialize)]
struct Gpt2Json {
    vocab_size: usize,
    n_embd: usize,
    n_inner: Option<usize>,
    n_layer: usize,
    n_head: usize,
    n_positions: usize,
    layer_norm_epsilon: Option<f64>,
    activation_function: Option<String>,
    resid_pdrop: Option<f64>,
    embd_pdrop: Option<f64>,
}

/// GPT-2 (`model_type = "gpt2"`).
pub struct Gpt2Arch;

/// The GPT-2-shaped tensors of `c` in layout `l`: the fused `c_attn` is d + 2·kv_heads·head_dim
/// wide (3·d for GPT-2's multi-head attention).
pub fn shapes(c: &Config, l: Layout) -> Vec<(String, Vec<usize>)> {
    let (d, f) = (c.hidden_size, c.intermediate_size);
    let qkv = d + 2 * c.num_kv_heads * c.head_dim;
    let w = |i: usize, o: usize| if l.conv1d { vec![i, o] } else { vec![o, i] };
    let p = l.prefix;
    let mut out = vec![
        (format!("{p}wte.weight"), vec![c.vocab_size, d]),
        (format!("{p}wpe.weight"), vec![c.max_position_embeddings, d]),
    ];
    for i in 0..c.num_layers {
        for (name, shape) in [
            ("ln_1.weight", vec![d]),
            ("ln_1.bias", vec![d]),
            ("attn.c_attn.weight", w(d, qkv)),
            ("attn.c_attn.bias", vec![qkv]),
            ("attn.c_proj.weight", w(d, d)),
            ("attn.c_proj.bias", vec![d]),
            ("ln_2.weight", vec![d]),
            ("ln_2.bias", vec![d]),
            ("mlp.c_fc.weight", w(d, f)),
            ("mlp.c_fc.bias", vec![f]),
            ("mlp.c_proj.weight", w(f, d)),
            ("mlp.c_proj.bias", vec![d]),
        ] {
            out.push((format!("{p}h.{i}.{name}"), shape));
        }
    }
    out.push((format!("{p}ln_f.weight"), vec![d]));
    out.push((format!("{p}ln_f.bias"), vec![d]));
    out
}

/// The normalized config of a GPT-2-shaped `config.json` (GPT-2's keys; StarCoder adds
/// `multi_query`).
pub fn gpt2_config(
    arch: &'static dyn Architecture,
    model_type: &str,
    path: &Path,
    v: &Value,
    kv_heads: Option<usize>,
) -> Result<Config> {
    let j: Gpt2Json = parse_json(path, v)?;
    // transformers' defaults where the config is silent: GPT-2's `gelu_new`, StarCoder's
    // `gelu_pytorch_tanh`; dropout 0.1 for both.
    let act = j.activation_function.as_deref().unwrap_or(match kv_heads {
        Some(_) => "gelu_pytorch_tanh",
        None => "gelu_new",
    });
    let hidden_act = match act {
        "gelu" | "gelu_pytorch_tanh" => HiddenAct::Gelu,
        // gelu_new and the other Python-written variants keep their intermediates.
        _ => HiddenAct::GeluNew,
    };
    let dropout = j.resid_pdrop.unwrap_or(0.1) > 0.0 || j.embd_pdrop.unwrap_or(0.1) > 0.0;
    let d = j.n_embd;
    let heads = j.n_head;
    checked(
        path,
        Config {
            vocab_size: j.vocab_size,
            hidden_size: d,
            intermediate_size: j.n_inner.unwrap_or(d.saturating_mul(4)),
            num_layers: j.n_layer,
            num_heads: heads,
            num_kv_heads: kv_heads.unwrap_or(heads),
            head_dim: d / heads.max(1),
            max_position_embeddings: j.n_positions,
            norm_eps: j.layer_norm_epsilon.unwrap_or(1e-5),
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: true,
            learned_positions: true,
            hidden_act,
            dropout,
            ..Config::new(arch, model_type)
        },
    )
}

/// What one GPT-2-shaped layer of transformers (GPT-2, StarCoder's GPT-BigCode) keeps for the
/// backward per token under PyTorch, and what the model keeps outside its layers, with every
/// weight trained (`None` under LoRA: Korthikanti's count), checked against
/// `saved_tensors_hooks` on the emulated GPU like the llama family's
/// ([`llama_saved_per_token`](crate::model::saved::llama_saved_per_token)):
/// - each LayerNorm saves its input (e·h) and its f32 mean and reciprocal deviation (8 B), and
///   the projection after it its output (e·h);
/// - attention (SDPA): the fused `c_attn` output, whose views q, k and v are (e·(q + 2kv)),
///   the output, which `c_proj` saves too (e·q), and the f32 log-sum-exp per head;
/// - the MLP: the activation's input (one-op GELU) or four tensors (`gelu_new`), and
///   `c_proj`'s input, each e·I;
/// - dropout: a 1-byte mask after attention and after the MLP (h each), and on the embeddings.
///
/// Outside the layers: the embeddings' dropout mask and the final LayerNorm with the output
/// the tied head saves.
pub fn gpt2_saved_per_token(c: &Config, e: u64, lora: Option<u64>) -> Option<(u64, u64)> {
    if lora.is_some() {
        return None;
    }
    let u = |v: usize| v as u64;
    let (h, i, heads) = (u(c.hidden_size), u(c.intermediate_size), u(c.num_heads));
    let (q, kv) = (heads * u(c.head_dim), u(c.num_kv_heads * c.head_dim));
    let mask = if c.dropout { h } else { 0 };
    let mlp = match c.hidden_act {
        HiddenAct::GeluNew => 5 * e * i,
        HiddenAct::Gelu | HiddenAct::Silu => 2 * e * i,
    };
    let norm = e * h + 8;
    let layer = 2 * norm + 2 * e * h + e * (q + 2 * kv) + 4 * heads + e * q + 2 * mask + mlp;
    Some((layer, mask + norm + e * h))
}

/// GPT-2's keys of a config, as `config.json` writes them.
pub fn gpt2_hf_json(c: &Config, class: &str) -> Value {
    serde_json::json!({
        "architectures": [class], "model_type": c.model_type,
        "vocab_size": c.vocab_size, "n_embd": c.hidden_size,
        "n_inner": c.intermediate_size, "n_layer": c.num_layers,
        "n_head": c.num_heads, "n_positions": c.max_position_embeddings,
        "layer_norm_epsilon": c.norm_eps,
    })
}

impl Architecture for Gpt2Arch {
    fn torch_saved_per_token(&self, c: &Config, e: u64, lora: Option<u64>) -> Option<(u64, u64)> {
        gpt2_saved_per_token(c, e, lora)
    }
    fn name(&self) -> &'static str {
        "gpt2"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt2"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        gpt2_config(&Gpt2Arch, "gpt2", path, v, None)
    }
    fn tensor_shapes(&self, c: &Config) -> Vec<(String, Vec<usize>)> {
        shapes(c, GPT2_LAYOUT)
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        gpt2_hf_json(c, "GPT2LMHeadModel")
    }
    /// PEFT's default for GPT-2: the fused `c_attn`.
    fn lora_targets(&self) -> &'static [&'static str] {
        &["attn.c_attn"]
    }
    /// Conv1D weights are stored (in, out).
    fn lora_in_out(&self, shape: &[usize]) -> Option<(usize, usize)> {
        match shape {
            &[i, o] => Some((i, o)),
            _ => None,
        }
    }
    fn is_embedding(&self, name: &str) -> bool {
        name.ends_with("wte.weight") || name.ends_with("wpe.weight")
    }
    fn trainable(
        &self,
        c: &Config,
        t: Tensors,
        compute: DType,
        ops: Ops,
    ) -> Result<Box<dyn Trainable>> {
        Gpt2::trainable(c, t, compute, ops, GPT2_LAYOUT)
    }
    fn inference(&self, c: &Config, t: Tensors, compute: DType) -> Result<InferenceModel> {
        Gpt2::decoder(c, t, compute, GPT2_LAYOUT)
    }
}

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
    /// Builds GPT-2 from HF-named tensors (consumed); activations run in `compute`.
    /// Tensors may be variables (training) or plain (inference).
    pub fn new(cfg: &Config, t: Tensors, compute: DType) -> Result<Self> {
        Self::with_layout(cfg, t, compute, GPT2_LAYOUT)
    }

    /// Builds the model from tensors stored in `layout`.
    pub fn with_layout(cfg: &Config, t: Tensors, compute: DType, layout: Layout) -> Result<Self> {
        let mut t = Named::dense(t);
        let p = layout.prefix;
        let dense = |t: &mut Named, m: &str| {
            if layout.conv1d {
                t.conv1d(m)
            } else {
                t.linear(m, true)
            }
        };
        let wte = t.take(&format!("{p}wte.weight"))?;
        let wpe = t.take(&format!("{p}wpe.weight"))?;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let h = format!("{p}h.{i}");
            blocks.push(Block {
                ln_1: t.norm(&format!("{h}.ln_1"))?,
                c_attn: dense(&mut t, &format!("{h}.attn.c_attn"))?,
                attn_proj: dense(&mut t, &format!("{h}.attn.c_proj"))?,
                ln_2: t.norm(&format!("{h}.ln_2"))?,
                c_fc: dense(&mut t, &format!("{h}.mlp.c_fc"))?,
                mlp_proj: dense(&mut t, &format!("{h}.mlp.c_proj"))?,
            });
        }
        let ln_f = t.norm(&format!("{p}ln_f"))?;
        Ok(Gpt2 {
            cfg: cfg.clone(),
            compute,
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    /// The model for training of a GPT-2-shaped checkpoint stored in `layout` (reference ops
    /// only).
    pub fn trainable(
        cfg: &Config,
        t: Tensors,
        compute: DType,
        ops: Ops,
        layout: Layout,
    ) -> Result<Box<dyn Trainable>> {
        no_ops(cfg.architecture.name(), ops)?;
        Ok(Box::new(Self::with_layout(cfg, t, compute, layout)?))
    }

    /// The inference model of a GPT-2-shaped checkpoint stored in `layout`.
    pub fn decoder(
        cfg: &Config,
        t: Tensors,
        compute: DType,
        layout: Layout,
    ) -> Result<InferenceModel> {
        Ok(InferenceModel::Decoder(Box::new(Self::with_layout(
            cfg, t, compute, layout,
        )?)))
    }

    /// Logits (b, s, vocab) of the final hidden states (b, s, d): ln_f, then the tied head.
    pub fn head(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.ln_f.forward(x, self.cfg.norm_eps)?;
        Linear::new(self.wte.clone(), None).forward(&x)
    }

    /// Logits (b, s, vocab) for token ids (b, s) at positions 0..s, without a cache.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        Decoder::forward(self, ids, 0, None, false)
    }

    /// Token rows plus position rows pos..pos+s (both gathered in the weights' dtype, then
    /// cast).
    fn embed_at(&self, ids: &Tensor, pos: usize) -> candle_core::Result<Tensor> {
        let s = ids.dim(1)?;
        let tok = embedding(&self.wte, ids, self.compute)?;
        let positions = self.wpe.narrow(0, pos, s)?.to_dtype(self.compute)?;
        tok.broadcast_add(&positions)
    }

    /// Block `i` on hidden states (b, s, d) at positions pos..pos+s, appending K and V to
    /// `cache` when given.
    fn block(
        &self,
        i: usize,
        x: &Tensor,
        pos: usize,
        cache: Option<&mut KvCache>,
    ) -> candle_core::Result<Tensor> {
        let (c, l) = (&self.cfg, &self.blocks[i]);
        let (d, kv) = (c.hidden_size, c.num_kv_heads * c.head_dim);
        let h = l.ln_1.forward(x, c.norm_eps)?;
        let qkv = l.c_attn.forward(&h)?;
        let q = split_heads(&qkv.narrow(2, 0, d)?, c.num_heads)?;
        let k = split_heads(&qkv.narrow(2, d, kv)?, c.num_kv_heads)?;
        let v = split_heads(&qkv.narrow(2, d + kv, kv)?, c.num_kv_heads)?;
        let (k, v) = match cache {
            Some(cache) => cache.append(i, &k, &v)?,
            None => (k, v),
        };
        let causal = Causal {
            pos,
            ..Causal::default()
        };
        let x = (x + l
            .attn_proj
            .forward(&attention(&q, &k, &v, Some(causal), false)?)?)?;
        let h = l.ln_2.forward(&x, c.norm_eps)?;
        let m = l.mlp_proj.forward(&l.c_fc.forward(&h)?.gelu()?)?;
        x + m
    }
}

impl Trainable for Gpt2 {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn embed(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        self.embed_at(ids, 0)
    }

    fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    fn layer(&self, i: usize, x: &Tensor) -> candle_core::Result<Tensor> {
        self.block(i, x, 0, None)
    }

    /// Causal LM cross-entropy over all positions (`targets` are the next-token ids).
    fn loss(&self, x: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        lm_loss(&self.head(x)?, targets)
    }
}

impl Decoder for Gpt2 {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn dtype(&self) -> DType {
        self.compute
    }

    fn device(&self) -> &Device {
        self.wte.device()
    }

    fn set_ops(&mut self, ops: Ops) -> Result<()> {
        no_ops(self.cfg.architecture.name(), ops)
    }

    fn forward(
        &self,
        ids: &Tensor,
        pos: usize,
        mut cache: Option<&mut KvCache>,
        last_only: bool,
    ) -> candle_core::Result<Tensor> {
        let s = ids.dim(1)?;
        let mut x = self.embed_at(ids, pos)?;
        for i in 0..self.blocks.len() {
            x = self.block(i, &x, pos, cache.as_deref_mut())?;
        }
        self.head(&crate::model::arch::last_positions(x, s, cache, last_only)?)
    }
}
