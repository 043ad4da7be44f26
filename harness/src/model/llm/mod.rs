//! The language-model architectures, one file each, every one registered in [`REGISTRY`]: its
//! `config.json` and how it normalizes into [`Config`], its tensor shapes, the HF-json export,
//! its LoRA targets, and its trainable and inference models. The registry is the only place
//! that names them all: reading a `config.json` ([`Config::from_json`]) and finding an
//! architecture by `model_type` ([`Arch::of_model_type`]) go through it, so the architecture
//! files depend on [`super::arch`] and [`super::config`], never the other way round.
pub mod bert;
pub mod deepseek;
pub mod gemma;
pub mod gpt2;
pub mod gpt_bigcode;
pub mod gpt_oss;
pub mod llama;
pub mod llama4;
pub mod mistral;
pub mod mixtral;
pub mod phi3;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;

use super::arch::{Arch, Architecture};
use super::Config;
use crate::error::bad_file;
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

/// Every architecture vramlab implements. Adding one: a new file under `llm/` and one line
/// here.
pub static REGISTRY: &[&dyn Architecture] = &[
    &super::llm::llama::LlamaArch,
    &super::llm::mistral::MistralArch,
    &super::llm::qwen2::Qwen2Arch,
    &super::llm::gpt2::Gpt2Arch,
    &super::llm::bert::BertArch,
    &super::llm::qwen3::Qwen3Arch,
    &super::llm::phi3::Phi3Arch,
    &super::llm::gpt_bigcode::GptBigCodeArch,
    &super::llm::mixtral::MixtralArch,
    &super::llm::qwen2_moe::Qwen2MoeArch,
    &super::llm::qwen3_moe::Qwen3MoeArch,
    &super::llm::gemma::Gemma2Arch,
    &super::llm::gemma::Gemma3TextArch,
    &super::llm::gpt_oss::GptOssArch,
    &super::llm::deepseek::DeepSeekV2Arch,
    &super::llm::deepseek::DeepSeekV3Arch,
    &super::llm::llama4::Llama4Arch,
];

impl Arch {
    /// The architecture of `config.json`'s `model_type` (or a GGUF's `general.architecture`).
    pub fn of_model_type(model_type: &str) -> Option<Arch> {
        REGISTRY
            .iter()
            .find(|a| a.model_types().contains(&model_type))
            .map(|a| Arch::from(*a))
    }

    /// Every `model_type` the registry reads, for error messages.
    pub fn known_model_types() -> String {
        REGISTRY
            .iter()
            .flat_map(|a| a.model_types().iter().copied())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Config {
    /// Reads and normalizes an HF `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(path, format!("not valid JSON: {e}")))?;
        Self::from_json(path, &v)
    }

    /// Normalizes an already parsed `config.json` through its architecture's parser (chosen by
    /// `model_type`); `path` is only used in error messages.
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        if !v.is_object() {
            return Err(bad_file(path, "config.json must be a JSON object"));
        }
        let model_type = v
            .get("model_type")
            .filter(|x| !x.is_null())
            .ok_or_else(|| bad_file(path, "missing config key `model_type`"))?
            .as_str()
            .ok_or_else(|| bad_file(path, "config key `model_type` must be a string"))?;
        let arch = Arch::of_model_type(model_type).ok_or_else(|| {
            bad_file(
                path,
                format!(
                    "unknown architecture `model_type = \"{model_type}\"` (supported: {})",
                    Arch::known_model_types()
                ),
            )
        })?;
        arch.parse(path, v)
    }
}
