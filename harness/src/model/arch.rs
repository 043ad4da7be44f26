//! The [`Architecture`] trait and the registry of architectures.
//!
//! One file per architecture under `llm/` (`llm/llama.rs`, `llm/qwen2.rs`, ...) holds everything
//! about it: its `config.json` (a serde struct) and how it normalizes into [`Config`], its tensor
//! shapes (the single source for synthetic weights, preflight, features and estimate), the
//! HF-json export, its LoRA targets, and how its trainable and inference models are built.
//! Adding an architecture is one new file under `llm/` plus one line in
//! [`REGISTRY`](super::llm::REGISTRY).
use super::config::{Moe, MoeNaming};
use super::saved::{llama_saved_per_token, rms_norm_saved};
use super::{Config, KvCache, Trainable};
use crate::error::bad_file;
use crate::vocab::Ops;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// HF-named tensors (variables for training, plain tensors for inference).
pub type Tensors = HashMap<String, Tensor>;

/// What an architecture's inference model is: a causal decoder (prefill + decode with a KV
/// cache) or an encoder (one forward over the batch, no cache).
pub enum InferenceModel {
    Decoder(Box<dyn Decoder>),
    Encoder(Box<dyn Encoder>),
}

/// A causal decoder, run with a KV cache.
pub trait Decoder {
    fn config(&self) -> &Config;
    /// The compute dtype (also the KV cache's).
    fn dtype(&self) -> DType;
    fn device(&self) -> &Device;
    /// Runs the model on token ids (b, s) at positions pos..pos+s, appending to `cache` when
    /// given. Returns logits (b, s, vocab), or (b, 1, vocab) for the last position only when
    /// `last_only` (what a generation step needs).
    fn forward(
        &self,
        ids: &Tensor,
        pos: usize,
        cache: Option<&mut KvCache>,
        last_only: bool,
    ) -> candle_core::Result<Tensor>;
    /// Switches the op implementations (an inference group shares one loaded model).
    fn set_ops(&mut self, ops: Ops) -> Result<()>;
}

/// An encoder, run once over the batch.
pub trait Encoder {
    fn config(&self) -> &Config;
    fn device(&self) -> &Device;
    /// Token ids (b, s) → the encoder's output (its pooled embedding, (b, hidden)).
    fn encode(&self, ids: &Tensor) -> candle_core::Result<Tensor>;
}

/// Whether an architecture's inference is a decoder or an encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Decoder,
    Encoder,
}

pub trait Architecture: Sync + Send {
    /// The name in the CSV's `architecture` column, constants and estimates.
    fn name(&self) -> &'static str;
    /// The `model_type` values of `config.json` (and GGUF `general.architecture`) it reads.
    fn model_types(&self) -> &'static [&'static str];
    fn role(&self) -> Role {
        Role::Decoder
    }
    /// Normalizes an HF `config.json` (already parsed; `path` is for error messages).
    fn parse(&self, path: &Path, v: &Value) -> Result<Config>;
    /// Every stored parameter tensor with its HF name and shape, in load order. Default: the
    /// llama decoder family's (every variant its normalized config describes).
    fn tensor_shapes(&self, c: &Config) -> Vec<(String, Vec<usize>)> {
        decoder_shapes(c)
    }
    /// The config written back as an HF `config.json` (what `synth-weights` writes).
    fn to_hf_json(&self, c: &Config) -> Value;
    /// The modules LoRA adapts (PEFT's defaults for the architecture). Default: the
    /// attention's query and value projections of the llama family.
    fn lora_targets(&self) -> &'static [&'static str] {
        &["self_attn.q_proj", "self_attn.v_proj"]
    }
    /// (in, out) features of a LoRA target's weight of `shape`: HF's `nn.Linear` stores
    /// (out, in); GPT-2's Conv1D overrides this.
    fn lora_in_out(&self, shape: &[usize]) -> Option<(usize, usize)> {
        match shape {
            &[o, i] => Some((i, o)),
            _ => None,
        }
    }
    /// Bytes per token that transformers' implementation keeps for the backward under PyTorch:
    /// (one decoder layer's, the model's outside its layers, beside the token ids and labels),
    /// with activations of `e` bytes, SDPA without a mask (flash or memory-efficient, no
    /// repeated K and V) and `lora` the rank of adapters on the query and value projections
    /// (`None`: every weight trained). `None` where vramlab has no such accounting for the
    /// architecture (the estimate falls back to Korthikanti's). Default: the llama family's
    /// ([`llama_saved_per_token`], and outside the final RMSNorm: its f32 input and root, and
    /// where the head trains its 16-bit cast and its output, which `lm_head` saves).
    fn torch_saved_per_token(&self, c: &Config, e: u64, lora: Option<u64>) -> Option<(u64, u64)> {
        // Gemma's four norms and soft-capping, gpt-oss's sinks and MLA are not this layer.
        if c.gemma.is_some() || c.attention_sinks || c.mla.is_some() {
            return None;
        }
        let (h, trained) = (c.hidden_size as u64, lora.is_none());
        let head = if trained { e * h } else { 0 };
        let outside = rms_norm_saved(h, 1, e, trained) + head;
        Some((llama_saved_per_token(c, e, lora), outside))
    }
    /// Bytes per decoder layer of the buffers transformers 4.x builds beside the parameters
    /// (`e`: the model's dtype), which transformers 5 no longer keeps: 0 unless the
    /// architecture's 4.39 attention carries its own rotary cache ([`rotary_caches_per_layer`]).
    fn transformers4_buffers_per_layer(&self, _c: &Config, _e: u64) -> u64 {
        0
    }
    /// Embedding tables (what `trainable = "frozen-embeddings"` freezes): token, position and
    /// token-type embeddings. A tied LM head is the token embedding, so it freezes with it.
    fn is_embedding(&self, name: &str) -> bool {
        name.contains("embed")
    }
    /// The model for training (tensors are variables; activations in `compute`). Default:
    /// the llama decoder family's model (the reference ops only for a variant vramlab-kernels
    /// does not compute: Gemma's norms, gpt-oss's sinks).
    fn trainable(
        &self,
        c: &Config,
        t: Tensors,
        compute: DType,
        ops: Ops,
    ) -> Result<Box<dyn Trainable>> {
        if c.reference_ops_only() {
            no_ops(self.name(), ops)?;
        }
        Ok(Box::new(super::Llama::new(c, t, compute)?.with_ops(ops)))
    }
    /// The model for inference. Default: the llama decoder family's model.
    fn inference(&self, c: &Config, t: Tensors, compute: DType) -> Result<InferenceModel> {
        Ok(InferenceModel::Decoder(Box::new(super::Llama::new(
            c, t, compute,
        )?)))
    }
    /// The model for inference of a quantized point: `q` holds the quantized matrices and
    /// embedding, `t` the dense tensors (in `compute`). Default: the llama decoder family's
    /// (the only family GGUF files are read for).
    fn inference_quantized(
        &self,
        c: &Config,
        t: Tensors,
        q: super::nn::QTensors,
        qmatmul: crate::vocab::QMatmul,
        compute: DType,
    ) -> Result<InferenceModel> {
        Ok(InferenceModel::Decoder(Box::new(super::Llama::quantized(
            c, t, q, qmatmul, compute,
        )?)))
    }
}

/// A `Copy` handle on a registered architecture; compares by name.
#[derive(Clone, Copy)]
pub struct Arch(&'static dyn Architecture);

impl Arch {
    pub fn get(&self) -> &'static dyn Architecture {
        self.0
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }
}

impl From<&'static dyn Architecture> for Arch {
    fn from(a: &'static dyn Architecture) -> Self {
        Arch(a)
    }
}

impl std::ops::Deref for Arch {
    type Target = dyn Architecture;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}
impl Eq for Arch {}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The end of a decoder's forward over `s` new tokens (hidden states `x` (b, s, d)): marks
/// them held in `cache`, and keeps the last position only when `last_only` (a generation
/// step needs no other logits).
pub fn last_positions(
    x: Tensor,
    s: usize,
    cache: Option<&mut KvCache>,
    last_only: bool,
) -> candle_core::Result<Tensor> {
    if let Some(cache) = cache {
        cache.advance(s);
    }
    if last_only && s > 1 {
        x.narrow(1, s - 1, 1)?.contiguous()
    } else {
        Ok(x)
    }
}

/// Deserializes `config.json` into an architecture's serde struct; serde's messages name the
/// key ("missing config key `num_hidden_layers`").
pub fn parse_json<T: DeserializeOwned>(path: &Path, v: &Value) -> Result<T> {
    serde_json::from_value(v.clone()).map_err(|e| {
        let msg = e.to_string().replace("missing field", "missing config key");
        bad_file(path, msg)
    })
}

/// Finishes a normalized config: validates it and names the file on failure.
/// What transformers 4.39's llama, Mistral and Qwen2 attention keep per layer
/// (`*RotaryEmbedding`): cos and sin caches of max_position_embeddings × head_dim in the model's
/// dtype (`e` bytes), and the f32 `inv_freq` (head_dim / 2 values). Mistral-7B: 16.8 MB a
/// layer, 537 MB in all; transformers 5 computes them per forward from one `inv_freq`. Counted
/// with `named_buffers()` of each model under the torch-2.2 stack.
pub fn rotary_caches_per_layer(c: &Config, e: u64) -> u64 {
    let (pos, d) = (c.max_position_embeddings as u64, c.head_dim as u64);
    2 * pos * d * e + 4 * (d / 2)
}

pub fn checked(path: &Path, c: Config) -> Result<Config> {
    c.validate().map_err(|e| bad_file(path, e))?;
    Ok(c)
}

/// For an architecture that runs only candle's reference ops and eager attention: Ok for the
/// default `Ops`, else a one-line error naming it (vramlab-kernels serve the llama family).
pub fn no_ops(name: &str, ops: Ops) -> Result<()> {
    if ops != Ops::default() {
        anyhow::bail!(
            "kernels = \"{}\" / attention = \"{}\": only the llama family runs vramlab-kernels so far ({name} uses reference + eager)",
            ops.kernels.as_str(),
            ops.attention.as_str(),
        );
    }
    Ok(())
}

/// A config's `layer_types` (transformers' names), or where it has none, a full layer every
/// `period`-th (layer i is full when (i + 1) is a multiple of it) and sliding ones between, as
/// transformers fills it in (Gemma 2 and gpt-oss: 2, Gemma 3: 6).
pub fn layer_types(
    path: &Path,
    names: Option<&[String]>,
    layers: usize,
    period: usize,
) -> Result<Vec<crate::model::config::LayerAttention>> {
    use crate::model::config::LayerAttention;
    match names {
        Some(names) => names
            .iter()
            .map(|n| {
                LayerAttention::parse(n).ok_or_else(|| {
                    bad_file(path, format!("unknown layer type `{n}` in layer_types"))
                })
            })
            .collect(),
        None if period == 0 => Err(bad_file(
            path,
            "sliding_window_pattern must be positive, got 0",
        )),
        None => Ok((0..layers)
            .map(|i| match (i + 1).is_multiple_of(period) {
                true => LayerAttention::Full,
                false => LayerAttention::Sliding,
            })
            .collect()),
    }
}

/// The decoder family's tensors (HF names), in load order, for every variant the normalized
/// config can describe: q/k/v or fused `qkv_proj`, optional biases, Qwen3's per-head q/k
/// norms, gate/up or fused `gate_up_proj`, tied or separate head.
pub fn decoder_shapes(c: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, f, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let (q, kv) = (c.num_heads * hd, c.num_kv_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, d],
    )];
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
        push("input_layernorm.weight", vec![d]);
        if let Some(m) = &c.mla {
            // Multi-head latent attention: queries (low-rank or full), the compressed KV
            // latent with the shared rotary key, its norm, and its expansion to every head.
            let (h, nope, rope, v) = (
                c.num_heads,
                m.qk_nope_head_dim,
                m.qk_rope_head_dim,
                m.v_head_dim,
            );
            match m.q_lora_rank {
                Some(r) => {
                    push("self_attn.q_a_proj.weight", vec![r, d]);
                    push("self_attn.q_a_layernorm.weight", vec![r]);
                    push("self_attn.q_b_proj.weight", vec![h * (nope + rope), r]);
                }
                None => push("self_attn.q_proj.weight", vec![h * (nope + rope), d]),
            }
            push(
                "self_attn.kv_a_proj_with_mqa.weight",
                vec![m.kv_lora_rank + rope, d],
            );
            push("self_attn.kv_a_layernorm.weight", vec![m.kv_lora_rank]);
            push(
                "self_attn.kv_b_proj.weight",
                vec![h * (nope + v), m.kv_lora_rank],
            );
            push("self_attn.o_proj.weight", vec![d, h * v]);
        } else if c.fused_qkv {
            push("self_attn.qkv_proj.weight", vec![q + 2 * kv, d]);
        } else {
            push("self_attn.q_proj.weight", vec![q, d]);
            push("self_attn.k_proj.weight", vec![kv, d]);
            push("self_attn.v_proj.weight", vec![kv, d]);
            if c.qkv_bias {
                push("self_attn.q_proj.bias", vec![q]);
                push("self_attn.k_proj.bias", vec![kv]);
                push("self_attn.v_proj.bias", vec![kv]);
            }
        }
        if c.qk_norm {
            push("self_attn.q_norm.weight", vec![hd]);
            push("self_attn.k_norm.weight", vec![hd]);
        }
        if c.mla.is_none() {
            push("self_attn.o_proj.weight", vec![d, q]);
        }
        if c.o_bias {
            push("self_attn.o_proj.bias", vec![d]);
        }
        if c.attention_sinks {
            push("self_attn.sinks", vec![c.num_heads]);
        }
        push("post_attention_layernorm.weight", vec![d]);
        if c.gemma.is_some() {
            push("pre_feedforward_layernorm.weight", vec![d]);
            push("post_feedforward_layernorm.weight", vec![d]);
        }
        match &c.moe {
            Some(m) if m.is_sparse(i) => out.extend(moe_shapes(m, &p, d)),
            _ => {
                let m = c.mlp_module();
                if c.fused_gate_up {
                    push(&format!("{m}.gate_up_proj.weight"), vec![2 * f, d]);
                } else {
                    push(&format!("{m}.gate_proj.weight"), vec![f, d]);
                    push(&format!("{m}.up_proj.weight"), vec![f, d]);
                }
                push(&format!("{m}.down_proj.weight"), vec![d, f]);
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.vocab_size, d]));
    }
    if let Some(v) = &c.vision {
        out.extend(v.shapes(d));
    }
    out
}

/// A sparse MoE layer's tensors under layer prefix `p` (hidden size `d`), in load order: the
/// router, each routed expert's gate, up and down, then the shared expert and its gate.
fn moe_shapes(m: &Moe, p: &str, d: usize) -> Vec<(String, Vec<usize>)> {
    let (f, e) = (m.expert_size, m.experts);
    if m.naming == MoeNaming::GptOss {
        let q = format!("{p}.mlp");
        return vec![
            (format!("{q}.router.weight"), vec![e, d]),
            (format!("{q}.router.bias"), vec![e]),
            (format!("{q}.experts.gate_up_proj"), vec![e, d, 2 * f]),
            (format!("{q}.experts.gate_up_proj_bias"), vec![e, 2 * f]),
            (format!("{q}.experts.down_proj"), vec![e, f, d]),
            (format!("{q}.experts.down_proj_bias"), vec![e, d]),
        ];
    }
    if m.naming == MoeNaming::Llama4 {
        let q = format!("{p}.feed_forward");
        let s = m.shared_size;
        return vec![
            (format!("{q}.experts.gate_up_proj"), vec![e, d, 2 * f]),
            (format!("{q}.experts.down_proj"), vec![e, f, d]),
            (format!("{q}.router.weight"), vec![e, d]),
            (format!("{q}.shared_expert.gate_proj.weight"), vec![s, d]),
            (format!("{q}.shared_expert.up_proj.weight"), vec![s, d]),
            (format!("{q}.shared_expert.down_proj.weight"), vec![d, s]),
        ];
    }
    let mut out = vec![(
        format!("{p}.{}.gate.weight", m.module()),
        vec![m.experts, d],
    )];
    for j in 0..m.experts {
        let [g, u, dn] = m.expert_names(p, j);
        out.extend([(g, vec![f, d]), (u, vec![f, d]), (dn, vec![d, f])]);
    }
    if m.shared_size > 0 {
        let (s, q) = (m.shared_size, m.shared_module(p));
        out.extend([
            (format!("{q}.gate_proj.weight"), vec![s, d]),
            (format!("{q}.up_proj.weight"), vec![s, d]),
            (format!("{q}.down_proj.weight"), vec![d, s]),
        ]);
    }
    if m.shared_gate {
        out.push((format!("{p}.mlp.shared_expert_gate.weight"), vec![1, d]));
    }
    out
}
