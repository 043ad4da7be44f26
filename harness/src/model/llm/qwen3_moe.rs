//! Qwen3-MoE (`model_type = "qwen3_moe"`, Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 decoder
//! (per-head q/k RMSNorm, explicit `head_dim`, no biases) whose MLPs are sparse mixtures of
//! `num_experts` SwiGLU experts of `moe_intermediate_size`, `num_experts_per_tok` a token,
//! the top-k weights renormalized with `norm_topk_prob` (true in the published configs), and
//! no shared expert. Dense layers as Qwen2-MoE's (`mlp_only_layers`, `decoder_sparse_step`).
use super::qwen2_moe::{qwen_moe_hf_json, QwenMoeJson};
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::Config;
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

pub struct Qwen3MoeArch;

impl Architecture for Qwen3MoeArch {
    fn name(&self) -> &'static str {
        "qwen3_moe"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_moe"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: QwenMoeJson = parse_json(path, v)?;
        checked(
            path,
            Config {
                qk_norm: true,
                sliding_window: j.qwen.window(),
                moe: Some(j.moe(path, false)?),
                ..j.qwen.base.config(&Qwen3MoeArch, "qwen3_moe", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = qwen_moe_hf_json(c, "Qwen3MoeForCausalLM");
        v["attention_bias"] = c.qkv_bias.into();
        v
    }
}
