//! Mistral (`model_type = "mistral"`): the llama decoder with sliding-window attention. Each
//! token attends to the last `sliding_window` tokens (4096 for Mistral-7B-v0.1; `null` from
//! v0.2 on), so a KV cache never needs more than the window: with `kv_window = "model"` the
//! cache is preallocated at min(context, window) tokens and written as a ring buffer, the
//! memory vLLM and HF use; `kv_window = "full"` keeps every token.
use super::llama::{decoder_hf_json, DecoderJson};
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct MistralJson {
    #[serde(flatten)]
    base: DecoderJson,
    sliding_window: Option<usize>,
}

pub struct MistralArch;

impl Architecture for MistralArch {
    fn transformers4_buffers_per_layer(&self, c: &Config, e: u64) -> u64 {
        crate::model::arch::rotary_caches_per_layer(c, e)
    }
    fn name(&self) -> &'static str {
        "mistral"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["mistral"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: MistralJson = parse_json(path, v)?;
        checked(
            path,
            Config {
                sliding_window: j.sliding_window,
                ..j.base.config(&MistralArch, "mistral", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "MistralForCausalLM");
        v["sliding_window"] = c.sliding_window.into();
        v
    }
}
