//! The normalized [`Config`] every other part uses. Each architecture's file parses its own
//! `config.json` into it (see [`super::arch`]); this file holds what is common: the fields, the
//! shape invariants and the counts. Reading a file and dispatching on `model_type`
//! (`Config::from_file`, `Config::from_json`) live with the registry, in `model/llm/mod.rs`.
use super::arch::{Arch, Architecture};
pub use super::vision::{Vision, VisionKind};
use crate::checked::Checked;
pub use crate::vocab::KvWindow;
use serde_json::Value;
mod moe;
pub use moe::{Moe, MoeNaming, Routing};

/// The normalized model description. All sizes are element counts, not bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub architecture: Arch,
    /// `model_type` as written in config.json (llama, mistral, qwen2, ...).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Bias on the q, k and v projections (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama with `attention_bias`).
    pub o_bias: bool,
    /// BERT token-type vocabulary (0 for decoders).
    pub type_vocab_size: usize,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// One fused `qkv_proj` weight instead of q, k and v (Phi-3).
    pub fused_qkv: bool,
    /// One fused `gate_up_proj` weight instead of gate and up (Phi-3).
    pub fused_gate_up: bool,
    /// Sliding-window attention: each token attends to the last `window` tokens, so a KV
    /// cache never needs more (Mistral). None: full attention.
    pub sliding_window: Option<usize>,
    /// Each layer's attention where a model interleaves local and global layers (Gemma 2/3,
    /// gpt-oss): `Sliding` layers attend within `sliding_window`, `Full` ones to every token.
    /// Empty: every layer attends within `sliding_window` (to every token when it is None).
    pub layer_types: Vec<LayerAttention>,
    /// Learned position embeddings (GPT-2, BERT, StarCoder) instead of RoPE: no `rope_theta`,
    /// and the heads split `hidden_size` exactly.
    pub learned_positions: bool,
    /// The MLP's activation as transformers computes it, which decides what its backward saves.
    pub hidden_act: HiddenAct,
    /// Dropout on the embeddings and after attention and the MLP in training (GPT-2's and
    /// StarCoder's `embd_pdrop` and `resid_pdrop`, 0.1 unless the config says otherwise): each
    /// keeps a 1-byte mask per element for the backward.
    pub dropout: bool,
    /// A sparse mixture-of-experts MLP in place of the dense one (Mixtral, Qwen2-MoE,
    /// Qwen3-MoE). None: every layer's MLP is dense, `intermediate_size` wide.
    pub moe: Option<Moe>,
    /// Gemma 2/3's decoder (None: the llama family's): RMSNorm scaling by (1 + weight) in
    /// f32, a norm after attention and on both sides of the MLP, embeddings scaled by
    /// √hidden, GELU (tanh) gating, and the scoring below.
    pub gemma: Option<Gemma>,
    /// A learned sink logit per attention head, which takes part in the softmax and is then
    /// dropped (gpt-oss's `self_attn.sinks`).
    pub attention_sinks: bool,
    /// DeepSeek's multi-head latent attention (None: q/k/v projections). `head_dim` is then
    /// the query and key head (qk_nope + qk_rope), `num_kv_heads` every head.
    pub mla: Option<Mla>,
    /// Multi-token-prediction layers the checkpoint stores beyond `num_layers` and inference
    /// does not run (DeepSeek-V3's `num_nextn_predict_layers`); not in the tensor list.
    pub mtp_layers: usize,
    /// Chunked local attention (Llama 4's `attention_chunk_size`): a `Chunked` layer's query
    /// attends only to the keys of its own chunk of this many tokens, so its KV cache never
    /// needs more.
    pub attention_chunk: Option<usize>,
    /// Llama 4's attention (None: the llama family's).
    pub llama4: Option<Llama4Attention>,
    /// The vision tower a multimodal checkpoint stores beside the text decoder (Llama 4,
    /// Gemma 3): in the tensor list and the weights, never run by a text query.
    pub vision: Option<Vision>,
}

/// Llama 4's attention: RoPE on most layers and none (NoPE) on every fourth, an L2 norm of
/// q and k (no weight) on the RoPE layers, and the NoPE layers' queries scaled up with the
/// position.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama4Attention {
    /// Whether layer i rotates q and k (transformers' `no_rope_layers`, 1 = RoPE).
    pub rope_layers: Vec<bool>,
    /// The L2 norm of q and k per head on the RoPE layers (`use_qk_norm`).
    pub l2_qk_norm: bool,
    /// The NoPE layers' query scale, 1 + attn_scale · ln(1 + ⌊(p + 1) / floor_scale⌋) at
    /// position p: (attn_scale, floor_scale) where `attn_temperature_tuning` is on.
    pub temperature: Option<(f64, f64)>,
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank
/// projection, keys and values from one compressed latent of `kv_lora_rank` per token plus a
/// shared rotary key of `qk_rope_head_dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mla {
    /// The queries' low rank (None: a full `q_proj`; DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

/// What a KV cache holds a token and layer of multi-head latent attention; runtimes differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MlaCache {
    /// The compressed latent and the rotary key, (kv_lora_rank + qk_rope_head_dim) values:
    /// transformers ≥ 5 (its cache is written "while the latent KV is still compressed"),
    /// vLLM, SGLang. DeepSeek-V3's 576 a token and layer.
    #[default]
    Latent,
    /// K and V expanded to every head, heads · (qk_nope + qk_rope + v_head_dim) values:
    /// transformers 4.x (the torch-2.2 stack). DeepSeek-V3's 40,960, 71 times more.
    Expanded,
}

/// What Gemma 2/3 change in the attention and the head.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma {
    /// Queries scale by `query_pre_attn_scalar`^(-1/2), not head_dim^(-1/2).
    pub query_pre_attn_scalar: f64,
    /// tanh soft-capping of the attention scores (Gemma 2: 50; Gemma 3: none).
    pub attn_softcap: Option<f64>,
    /// tanh soft-capping of the logits (Gemma 2: 30; Gemma 3: none).
    pub final_softcap: Option<f64>,
    /// RoPE θ of the sliding layers where it differs from `rope_theta` (Gemma 3: 10,000 local,
    /// 1,000,000 global).
    pub local_rope_theta: Option<f64>,
}

/// A layer's attention span (transformers' `layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier token (`full_attention`).
    Full,
    /// The last `sliding_window` tokens (`sliding_attention`).
    Sliding,
    /// The tokens of the query's own chunk of `attention_chunk` (`chunked_attention`, Llama 4).
    Chunked,
}

impl LayerAttention {
    /// transformers' name (`full_attention`, `sliding_attention`).
    pub fn as_str(self) -> &'static str {
        match self {
            LayerAttention::Full => "full_attention",
            LayerAttention::Sliding => "sliding_attention",
            LayerAttention::Chunked => "chunked_attention",
        }
    }

    /// Reads transformers' name; None for another.
    pub fn parse(s: &str) -> Option<Self> {
        [
            LayerAttention::Full,
            LayerAttention::Sliding,
            LayerAttention::Chunked,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// The MLP activation of a config, as transformers runs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HiddenAct {
    /// SiLU in a gated MLP (the llama family): one op, saving its input.
    #[default]
    Silu,
    /// One-op GELU (`gelu`, `gelu_pytorch_tanh`): saves its input.
    Gelu,
    /// GPT-2's `gelu_new`, written in Python ops: its backward keeps four tensors of the MLP's
    /// width (its input and three intermediates).
    GeluNew,
}

impl Config {
    /// A config with every size given and every flag off: what each architecture's parser
    /// fills in.
    pub fn new(architecture: &'static dyn Architecture, model_type: &str) -> Config {
        Config {
            architecture: Arch::from(architecture),
            model_type: model_type.into(),
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_layers: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            max_position_embeddings: 0,
            rope_theta: 0.0,
            norm_eps: 0.0,
            tie_word_embeddings: false,
            qkv_bias: false,
            o_bias: false,
            type_vocab_size: 0,
            qk_norm: false,
            fused_qkv: false,
            fused_gate_up: false,
            sliding_window: None,
            layer_types: Vec::new(),
            learned_positions: false,
            hidden_act: HiddenAct::Silu,
            dropout: false,
            moe: None,
            gemma: None,
            attention_sinks: false,
            mla: None,
            mtp_layers: 0,
            attention_chunk: None,
            llama4: None,
            vision: None,
        }
    }

    /// Shape invariants the implementation relies on, and bounds that keep every size
    /// computation (shapes, parameter and byte counts) far from overflow: values beyond them
    /// come from a corrupt file, not a real model.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (key, v, max) in [
            ("vocab_size", self.vocab_size, 1usize << 24),
            ("hidden_size", self.hidden_size, 1 << 20),
            ("intermediate_size", self.intermediate_size, 1 << 22),
            ("num_hidden_layers", self.num_layers, 10_000),
            ("num_attention_heads", self.num_heads, 1 << 16),
            ("num_key_value_heads", self.num_kv_heads, 1 << 16),
            ("head_dim", self.head_dim, 1 << 16),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 27,
            ),
            ("type_vocab_size", self.type_vocab_size, 1 << 16),
        ] {
            if v > max {
                return Err(format!("{key} = {v} is implausibly large (at most {max})"));
            }
        }
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(format!("{key} must be positive, got 0"));
            }
        }
        if let Some(m) = &self.moe {
            m.validate(self.num_layers)?;
        }
        if let Some(g) = &self.gemma {
            let positive = |v: Option<f64>| v.is_none_or(|v| v.is_finite() && v > 0.0);
            if !(positive(Some(g.query_pre_attn_scalar))
                && positive(g.attn_softcap)
                && positive(g.final_softcap)
                && positive(g.local_rope_theta))
            {
                return Err(
                    "query_pre_attn_scalar, the soft-caps and the local RoPE θ must be positive"
                        .into(),
                );
            }
        }
        if self.sliding_window == Some(0) {
            return Err("sliding_window must be positive or null, got 0".into());
        }
        if !self.layer_types.is_empty() && self.layer_types.len() != self.num_layers {
            return Err(format!(
                "layer_types lists {} layers, the model has {}",
                self.layer_types.len(),
                self.num_layers
            ));
        }
        if self.sliding_window.is_none() && self.layer_types.contains(&LayerAttention::Sliding) {
            return Err(
                "layer_types has sliding_attention layers but sliding_window is null".into(),
            );
        }
        if self.attention_chunk.is_none() && self.layer_types.contains(&LayerAttention::Chunked) {
            return Err(
                "layer_types has chunked_attention layers but attention_chunk_size is null".into(),
            );
        }
        if self.attention_chunk == Some(0) {
            return Err("attention_chunk_size must be positive or null, got 0".into());
        }
        for (key, v) in [
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.attention_chunk),
        ] {
            // Phi-3.5's window (262,144) is twice its context: harmless. One beyond both the
            // context and a million tokens is a corrupt value.
            if let Some(w) = v.filter(|&w| w > self.max_position_embeddings.max(1 << 20)) {
                return Err(format!(
                    "{key} = {w} is larger than the context limit (max_position_embeddings = {}) and a million tokens",
                    self.max_position_embeddings
                ));
            }
        }
        if let Some(l) = &self.llama4 {
            if l.rope_layers.len() != self.num_layers {
                return Err(format!(
                    "Llama 4's RoPE layers list {} layers, the model has {}",
                    l.rope_layers.len(),
                    self.num_layers
                ));
            }
            if let Some((scale, floor)) = l.temperature {
                if !(scale.is_finite() && floor.is_finite() && floor >= 1.0) {
                    return Err(format!(
                        "attn_scale ({scale}) must be finite and floor_scale ({floor}) at least 1"
                    ));
                }
            }
        }
        if let Some(v) = &self.vision {
            v.validate()?;
        }
        if self.head_dim == 0 {
            return Err(format!(
                "head_dim is 0: hidden_size ({}) is smaller than num_attention_heads ({})",
                self.hidden_size, self.num_heads
            ));
        }
        if self.learned_positions && self.num_heads * self.head_dim != self.hidden_size {
            return Err(format!(
                "hidden_size ({}) is not a multiple of the number of attention heads ({})",
                self.hidden_size, self.num_heads
            ));
        }
        if !(self.rope_theta.is_finite() && self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err("rope_theta and the norm epsilon must be finite, the epsilon >= 0".into());
        }
        if !self.learned_positions && self.rope_theta <= 0.0 {
            return Err(format!(
                "rope_theta must be positive, got {}",
                self.rope_theta
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.learned_positions && !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        let params: u128 = self
            .tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().map(|&d| d as u128).product::<u128>())
            .sum();
        if params > 1_000_000_000_000_000 {
            return Err(format!(
                "the shapes add up to {params} parameters: implausibly large"
            ));
        }
        Ok(())
    }

    /// Writes the config back as an HF `config.json` (what `synth-weights` puts beside the weights).
    pub fn to_hf_json(&self) -> Value {
        self.architecture.to_hf_json(self)
    }

    /// Every parameter tensor with its HF name and shape, in load order: the single list that
    /// synthetic weights, shape checks, features and estimates use (its architecture's).
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.architecture.tensor_shapes(self)
    }

    /// Number of parameter tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensor_shapes().len()
    }

    /// Total parameter count (tied embeddings counted once), overflow-checked: what the
    /// estimate reads, since a config built past [`Config::validate`]'s bounds can exceed 64 bits.
    pub fn params(&self) -> Checked {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| Checked::product(s))
            .sum()
    }

    /// [`Config::params`] of a validated config (every file-read config is: its bounds keep
    /// the count under 10^18).
    pub fn param_count(&self) -> u64 {
        self.params()
            .get()
            .expect("Config::validate bounds the parameter count")
    }

    /// Whether the llama decoder runs this config with candle's reference ops and eager
    /// attention only: vramlab-kernels' fused RMSNorm, RoPE and flash attention compute
    /// neither Gemma's (1 + w) norms and soft-capping, gpt-oss's sinks, nor Llama 4's paired
    /// RoPE, NoPE layers and chunked masks.
    pub fn reference_ops_only(&self) -> bool {
        self.gemma.is_some() || self.attention_sinks || self.llama4.is_some()
    }

    /// Parameters of the multi-token-prediction layers the checkpoint stores and inference
    /// does not run: each a decoder layer like the last, its own embedding and head (V × d
    /// each), the projection of the concatenated hidden states (d × 2d) and three norms
    /// (DeepSeek-V3's `enorm`, `hnorm`, `shared_head.norm`).
    pub fn mtp_params(&self) -> Checked {
        if self.mtp_layers == 0 {
            return Checked::ZERO;
        }
        let last = format!("model.layers.{}.", self.num_layers - 1);
        let layer: Checked = self
            .tensor_shapes()
            .iter()
            .filter(|(n, _)| n.starts_with(&last))
            .map(|(_, s)| Checked::product(s))
            .sum();
        let d = self.hidden_size;
        let extra =
            Checked::new(2) * self.vocab_size * d + Checked::new(2) * d * d + Checked::new(3) * d;
        (layer + extra) * self.mtp_layers
    }

    /// Parameters one token runs through: every stored one, less the routed experts it is not
    /// sent to (experts − top_k per MoE layer). The count MoE model cards give as "active"
    /// (Mixtral-8x7B: 12.9B of 46.7B). Equal to [`Config::params`] for a dense model.
    pub fn active_params(&self) -> Checked {
        let idle = match &self.moe {
            Some(m) => {
                let sparse = (0..self.num_layers).filter(|&i| m.is_sparse(i)).count();
                m.expert_params(self.hidden_size) * (m.experts - m.top_k.min(m.experts)) * sparse
            }
            None => Checked::ZERO,
        };
        self.params().saturating_sub(idle)
    }

    /// K and V bytes for one token of one sequence in every layer: 2 · L · n_kv · head_dim ·
    /// dtype bytes (what a cache holding every token adds a token).
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> Checked {
        Checked::new(2) * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
    }

    /// Values a layer's cache holds a token: K and V of every KV head, or multi-head latent
    /// attention's latent or expanded form.
    pub fn kv_values_per_layer_token(&self, mla: MlaCache) -> Checked {
        match (&self.mla, mla) {
            (Some(m), MlaCache::Latent) => Checked::from(m.kv_lora_rank) + m.qk_rope_head_dim,
            (Some(m), MlaCache::Expanded) => {
                Checked::from(self.num_heads)
                    * (Checked::from(m.qk_nope_head_dim) + m.qk_rope_head_dim + m.v_head_dim)
            }
            (None, _) => Checked::new(2) * self.num_kv_heads * self.head_dim,
        }
    }

    /// The sliding window layer `i` attends within (None: every token, or its chunk).
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        match self.layer_types.get(i) {
            Some(LayerAttention::Full | LayerAttention::Chunked) => None,
            _ => self.sliding_window,
        }
    }

    /// The chunk layer `i` attends within (Llama 4's chunked layers; None: another kind).
    pub fn layer_chunk(&self, i: usize) -> Option<usize> {
        match self.layer_types.get(i) {
            Some(LayerAttention::Chunked) => self.attention_chunk,
            _ => None,
        }
    }

    /// The most tokens layer `i` ever attends to, and so its cache needs per sequence: its
    /// sliding window or its chunk (None: every token).
    pub fn layer_span(&self, i: usize) -> Option<usize> {
        self.layer_window(i).or(self.layer_chunk(i))
    }

    /// The module that holds layer MLPs (`feed_forward` in Llama 4, `mlp` elsewhere; Mixtral's
    /// sparse ones are under [`Moe::module`]).
    pub fn mlp_module(&self) -> &'static str {
        match &self.moe {
            Some(m) if m.naming == MoeNaming::Llama4 => "feed_forward",
            _ => "mlp",
        }
    }

    /// Tokens layer `i`'s KV cache holds per sequence after `tokens` tokens, under `window`:
    /// all of them with full attention, at most its sliding window with [`KvWindow::Model`].
    pub fn layer_kv_tokens(&self, i: usize, tokens: usize, window: KvWindow) -> usize {
        match (window, self.layer_span(i)) {
            (KvWindow::Model, Some(w)) => tokens.min(w),
            _ => tokens,
        }
    }

    /// Tokens a KV cache holds per sequence after `tokens` tokens, under `window`: the most any
    /// layer holds (all of them where a layer attends to every token).
    pub fn kv_tokens_held(&self, tokens: usize, window: KvWindow) -> usize {
        (0..self.num_layers.max(1))
            .map(|i| self.layer_kv_tokens(i, tokens, window))
            .max()
            .unwrap_or(tokens)
    }

    /// K and V bytes one sequence's cache holds after `tokens` tokens under `window`: each
    /// layer's 2 · n_kv · head_dim · dtype bytes a token (multi-head latent attention: as
    /// `mla` says), times the tokens it holds (a windowed layer at most its window).
    pub fn kv_bytes(
        &self,
        tokens: usize,
        window: KvWindow,
        dtype_bytes: usize,
        mla: MlaCache,
    ) -> Checked {
        let per_layer = self.kv_values_per_layer_token(mla) * dtype_bytes;
        (0..self.num_layers)
            .map(|i| per_layer * self.layer_kv_tokens(i, tokens, window))
            .sum()
    }
}

#[cfg(test)]
mod tests;
