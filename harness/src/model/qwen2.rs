//! Qwen2 / Qwen2.5 (`model_type = "qwen2"`): the llama decoder with biases on the q, k and v
//! projections (none on o), tied or separate embeddings. Its `sliding_window` applies only
//! with `use_sliding_window = true` (no released Qwen2.5 sets it).
use super::arch::{checked, parse_json, Architecture};
use super::llama::{decoder_hf_json, DecoderJson};
use super::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct Qwen2Json {
    #[serde(flatten)]
    base: DecoderJson,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}

pub struct Qwen2Arch;

impl Architecture for Qwen2Arch {
    fn name(&self) -> &'static str {
        "qwen2"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen2"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: Qwen2Json = parse_json(path, v)?;
        let window = j
            .sliding_window
            .filter(|_| j.use_sliding_window == Some(true));
        checked(
            path,
            Config {
                qkv_bias: true,
                o_bias: false,
                sliding_window: window,
                ..j.base.config(&Qwen2Arch, "qwen2", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "Qwen2ForCausalLM");
        v["use_sliding_window"] = c.sliding_window.is_some().into();
        v["sliding_window"] = c.sliding_window.into();
        v
    }
}
