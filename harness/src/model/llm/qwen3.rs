//! Qwen3 (`model_type = "qwen3"`): the llama decoder with a per-head RMSNorm of q and k
//! (`q_norm`, `k_norm`, head_dim weights each) applied before RoPE, an explicit `head_dim`
//! (Qwen3-0.6B: 16 heads × 128 = 2048 ≠ hidden_size 1024), and no q/k/v bias unless
//! `attention_bias` (which then biases o too, as in HF's `Qwen3Attention`). The norms add
//! 2 · head_dim parameters per layer and nothing to the KV cache.
//!
//! Tied embeddings: Qwen3-0.6B's config says `tie_word_embeddings: true`, yet its checkpoint
//! also stores an `lm_head.weight` copy. transformers ties the head to the embedding (one
//! tensor in memory) and vLLM skips the copy; vramlab's loader reads only the listed tensors,
//! so the copy is never loaded and the count is the tied one (see tests/architectures.rs).
use super::qwen2::{qwen_hf_json, QwenJson};
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::Config;
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

pub struct Qwen3Arch;

impl Architecture for Qwen3Arch {
    fn name(&self) -> &'static str {
        "qwen3"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: QwenJson = parse_json(path, v)?;
        checked(
            path,
            Config {
                qk_norm: true,
                sliding_window: j.window(),
                ..j.base.config(&Qwen3Arch, "qwen3", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = qwen_hf_json(c, "Qwen3ForCausalLM");
        v["attention_bias"] = c.qkv_bias.into();
        v
    }
}
