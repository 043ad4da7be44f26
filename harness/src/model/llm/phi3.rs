//! Phi-3 (`model_type = "phi3"`): the llama decoder with one fused `qkv_proj` (q, then k, then
//! v rows) and one fused `gate_up_proj` (gate rows, then up rows), no biases (HF's
//! `Phi3Attention` ignores `attention_bias`), separate embeddings by default.
//!
//! Fusion changes no parameter count and no KV byte; it changes what LoRA adapts. PEFT has no
//! default target for phi3 (it asks for `target_modules`); vramlab adapts the fused
//! `qkv_proj`, what PEFT's defaults pick for every fused-qkv architecture (gpt2 `c_attn`,
//! codegen `qkv_proj`, gpt_neox `query_key_value`): one A (r, d) and B (q + 2·kv, r) a layer.
//!
//! `sliding_window` (2047 for Phi-3-mini-4k) masks attention as in HF and, with
//! `kv_window = "model"`, caps the KV cache at the window like Mistral's.
use super::llama::{decoder_hf_json, DecoderJson};
use crate::error::bad_file;
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct Phi3Json {
    #[serde(flatten)]
    base: DecoderJson,
    sliding_window: Option<usize>,
    /// RoPE on a fraction of each head (Phi-4-mini: 0.75); Phi-3 rotates whole heads.
    partial_rotary_factor: Option<f64>,
}

pub struct Phi3Arch;

impl Architecture for Phi3Arch {
    fn name(&self) -> &'static str {
        "phi3"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["phi3"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: Phi3Json = parse_json(path, v)?;
        if let Some(f) = j.partial_rotary_factor.filter(|&f| f != 1.0) {
            return Err(bad_file(
                path,
                format!("partial_rotary_factor = {f} is not supported (RoPE on whole heads only)"),
            ));
        }
        checked(
            path,
            Config {
                fused_qkv: true,
                fused_gate_up: true,
                qkv_bias: false,
                o_bias: false,
                sliding_window: j.sliding_window,
                ..j.base.config(&Phi3Arch, "phi3", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "Phi3ForCausalLM");
        v["sliding_window"] = c.sliding_window.into();
        v
    }
    /// The fused q/k/v projection (see the module doc).
    fn lora_targets(&self) -> &'static [&'static str] {
        &["self_attn.qkv_proj"]
    }
}
