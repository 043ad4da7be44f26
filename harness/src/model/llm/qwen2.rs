//! Qwen2 / Qwen2.5 (`model_type = "qwen2"`): the llama decoder with biases on the q, k and v
//! projections (none on o), tied or separate embeddings. Its `sliding_window` applies only
//! with `use_sliding_window = true` (no released Qwen2.5 sets it).
use super::llama::{decoder_hf_json, DecoderJson};
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The keys of a Qwen `config.json` (Qwen2 and Qwen3): the llama decoder's, and a sliding
/// window that applies only with `use_sliding_window = true`.
#[derive(Clone, Debug, Deserialize)]
pub struct QwenJson {
    #[serde(flatten)]
    pub base: DecoderJson,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}

impl QwenJson {
    /// The sliding window in effect (None unless `use_sliding_window = true`).
    pub fn window(&self) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.use_sliding_window == Some(true))
    }
}

/// The Qwen keys of a config, as `config.json` writes them (`class` is its `architectures`).
pub fn qwen_hf_json(c: &Config, class: &str) -> Value {
    let mut v = decoder_hf_json(c, class);
    v["use_sliding_window"] = c.sliding_window.is_some().into();
    v["sliding_window"] = c.sliding_window.into();
    v
}

pub struct Qwen2Arch;

impl Architecture for Qwen2Arch {
    fn transformers4_buffers_per_layer(&self, c: &Config, e: u64) -> u64 {
        crate::model::arch::rotary_caches_per_layer(c, e)
    }
    fn name(&self) -> &'static str {
        "qwen2"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen2"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: QwenJson = parse_json(path, v)?;
        checked(
            path,
            Config {
                qkv_bias: true,
                o_bias: false,
                sliding_window: j.window(),
                ..j.base.config(&Qwen2Arch, "qwen2", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        qwen_hf_json(c, "Qwen2ForCausalLM")
    }
}
