//! Gemma 2 (`model_type = "gemma2"`) and Gemma 3's text decoder (`gemma3_text`): the llama
//! decoder with interleaved local and global attention and Gemma's own layer.
//! - `layer_types`: Gemma 2 alternates sliding (even layers, window 4,096) and full layers;
//!   Gemma 3 has five sliding layers (window 1,024) to each full one (`sliding_window_pattern`
//!   6 in older configs). A sliding layer's KV cache holds at most its window, so at long
//!   contexts the full layers hold nearly all of the cache (Gemma-3-27B at 128k: 10 full layers
//!   of 62 hold 94% of it).
//! - Four RMSNorms a layer (input, post-attention, pre- and post-feedforward), each scaling by
//!   (1 + weight) in f32; embeddings scaled by √hidden; a tied 256k-token head; GELU (tanh)
//!   gating; queries scaled by `query_pre_attn_scalar`^(-1/2) with head_dim 256 (9B) or 128.
//! - Gemma 2: tanh soft-capping of the attention scores (50) and the logits (30), which
//!   transformers computes in eager attention only. Gemma 3: per-head q/k RMSNorm, and RoPE θ
//!   10,000 on the sliding layers, `rope_theta` (1,000,000) on the full ones.
//!
//! vramlab-kernels' fused ops compute llama's RMSNorm, not Gemma's: Gemma runs the reference
//! ops (the fused ones are refused in one line).
use super::llama::{decoder_hf_json, DecoderJson};
use crate::error::bad_file;
use crate::model::arch::{checked, layer_types, parse_json, Architecture};
use crate::model::config::{Gemma, HiddenAct};
use crate::model::vision::{multimodal_parts, nest_multimodal, VisionKind};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;

/// The keys of a Gemma 2/3 text `config.json`.
#[derive(Clone, Debug, Deserialize)]
struct GemmaJson {
    #[serde(flatten)]
    base: DecoderJson,
    sliding_window: Option<usize>,
    /// Gemma 3's older configs: one full layer in every `sliding_window_pattern`.
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
    /// Gemma 3's older configs: the sliding layers' RoPE θ.
    rope_local_base_freq: Option<f64>,
}

impl GemmaJson {
    /// The normalized config: `period` is the default interleave (a full layer every
    /// `period`-th), `theta` the default (global, local) RoPE θ.
    fn config(
        &self,
        path: &Path,
        v: &Value,
        arch: &'static dyn Architecture,
        model_type: &str,
        period: usize,
    ) -> Result<Config> {
        let base = self.base.config(arch, model_type, true);
        let period = self.sliding_window_pattern.unwrap_or(period);
        let layer_types = layer_types(path, self.layer_types.as_deref(), base.num_layers, period)?;
        if let Some(act) = self.hidden_activation.as_deref() {
            if act != "gelu_pytorch_tanh" {
                return Err(bad_file(
                    path,
                    format!("hidden_activation `{act}`: only gelu_pytorch_tanh is implemented"),
                ));
            }
        }
        // transformers ≥ 5 writes Gemma 3's θ per layer type under `rope_parameters`.
        let theta = |kind: &str| {
            v.pointer(&format!("/rope_parameters/{kind}/rope_theta"))
                .and_then(Value::as_f64)
        };
        let local = theta("sliding_attention").or(self.rope_local_base_freq);
        let rope_theta = theta("full_attention").unwrap_or(base.rope_theta);
        Ok(Config {
            sliding_window: self.sliding_window,
            layer_types,
            hidden_act: HiddenAct::Gelu,
            rope_theta,
            gemma: Some(Gemma {
                query_pre_attn_scalar: self.query_pre_attn_scalar.unwrap_or(base.head_dim as f64),
                attn_softcap: self.attn_logit_softcapping,
                final_softcap: self.final_logit_softcapping,
                local_rope_theta: local.filter(|&l| l != rope_theta),
            }),
            ..base
        })
    }
}

/// The Gemma keys of a config, as `config.json` writes them.
fn gemma_hf_json(c: &Config, class: &str) -> Value {
    let mut v = decoder_hf_json(c, class);
    v["hidden_activation"] = "gelu_pytorch_tanh".into();
    v["hidden_act"] = "gelu_pytorch_tanh".into();
    v["sliding_window"] = c.sliding_window.into();
    v["layer_types"] = c.layer_types.iter().map(|t| t.as_str()).collect();
    if let Some(g) = &c.gemma {
        v["query_pre_attn_scalar"] = g.query_pre_attn_scalar.into();
        v["attn_logit_softcapping"] = g.attn_softcap.into();
        v["final_logit_softcapping"] = g.final_softcap.into();
        if let Some(local) = g.local_rope_theta {
            v["rope_local_base_freq"] = local.into();
        }
    }
    v
}

pub struct Gemma2Arch;

impl Architecture for Gemma2Arch {
    fn name(&self) -> &'static str {
        "gemma2"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["gemma2"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: GemmaJson = parse_json(path, v)?;
        checked(path, j.config(path, v, &Gemma2Arch, "gemma2", 2)?)
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        gemma_hf_json(c, "Gemma2ForCausalLM")
    }
}

/// transformers' `Gemma3TextConfig` defaults for the keys that change memory or the model
/// (the published multimodal configs give few text keys).
fn gemma3_defaults() -> Vec<(&'static str, Value)> {
    vec![
        ("vocab_size", json!(262_208)),
        ("hidden_size", json!(2304)),
        ("intermediate_size", json!(9216)),
        ("num_hidden_layers", json!(26)),
        ("num_attention_heads", json!(8)),
        ("num_key_value_heads", json!(4)),
        ("head_dim", json!(256)),
        ("max_position_embeddings", json!(131_072)),
        ("rms_norm_eps", json!(1e-6)),
        ("rope_theta", json!(1_000_000.0)),
        ("rope_local_base_freq", json!(10_000.0)),
        ("query_pre_attn_scalar", json!(256)),
        ("sliding_window", json!(4096)),
        ("tie_word_embeddings", json!(true)),
    ]
}

/// Gemma 3's text decoder (`gemma3_text`), and the multimodal `gemma3` whose `text_config` it
/// is, with its SigLIP tower counted as stored.
pub struct Gemma3TextArch;

impl Architecture for Gemma3TextArch {
    fn name(&self) -> &'static str {
        "gemma3_text"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["gemma3_text", "gemma3"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let (text, vision) = multimodal_parts(path, v, VisionKind::Siglip, &gemma3_defaults())?;
        let j: GemmaJson = parse_json(path, &text)?;
        let model_type = v["model_type"].as_str().unwrap_or("gemma3_text");
        let c = j.config(path, &text, &Gemma3TextArch, model_type, 6)?;
        checked(
            path,
            Config {
                qk_norm: true,
                vision,
                ..c
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = gemma_hf_json(c, "Gemma3ForCausalLM");
        v["model_type"] = "gemma3_text".into();
        nest_multimodal(
            v,
            c.vision.as_ref(),
            "gemma3",
            "Gemma3ForConditionalGeneration",
        )
    }
}
