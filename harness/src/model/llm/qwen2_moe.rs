//! Qwen2-MoE (`model_type = "qwen2_moe"`, Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): the Qwen2
//! decoder (q/k/v biases) whose MLPs are sparse mixtures of `num_experts` SwiGLU experts of
//! `moe_intermediate_size`, `num_experts_per_tok` a token, plus a shared expert of
//! `shared_expert_intermediate_size` that sees every token, scaled by a sigmoid gate
//! (`shared_expert_gate`, 1 × hidden). The top-k weights are renormalized only with
//! `norm_topk_prob`. Layers listed in `mlp_only_layers`, or off the `decoder_sparse_step`
//! (layer i is sparse when (i + 1) is a multiple of it), keep a dense MLP of
//! `intermediate_size`.
use super::qwen2::{qwen_hf_json, QwenJson};
use crate::error::bad_file;
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::config::{Moe, MoeNaming, Routing};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The keys of a Qwen MoE `config.json` (Qwen2-MoE and Qwen3-MoE).
#[derive(Clone, Debug, Deserialize)]
pub struct QwenMoeJson {
    #[serde(flatten)]
    pub qwen: QwenJson,
    /// transformers ≥ 5 writes Qwen3-MoE's as `num_local_experts`.
    #[serde(alias = "num_local_experts")]
    num_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
}

impl QwenMoeJson {
    /// The mixture of experts the keys describe; `shared` whether the architecture has a
    /// shared expert (Qwen2-MoE) or not (Qwen3-MoE).
    pub fn moe(&self, path: &Path, shared: bool) -> Result<Moe> {
        let step = self.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return Err(bad_file(
                path,
                "decoder_sparse_step must be positive, got 0",
            ));
        }
        let only = self.mlp_only_layers.clone().unwrap_or_default();
        let mut dense: Vec<usize> = (0..self.qwen.base.num_hidden_layers)
            .filter(|i| !(i + 1).is_multiple_of(step))
            .chain(only)
            .collect();
        dense.sort_unstable();
        dense.dedup();
        let shared_size = if shared {
            self.shared_expert_intermediate_size.unwrap_or(0)
        } else {
            0
        };
        Ok(Moe {
            experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            expert_size: self.moe_intermediate_size,
            shared_size,
            shared_gate: shared_size > 0,
            norm_topk: self.norm_topk_prob.unwrap_or(false),
            dense_layers: dense,
            naming: MoeNaming::Qwen,
            routing: Routing::SoftmaxTopK,
            clamped_glu: None,
        })
    }
}

/// The Qwen MoE keys of a config, as `config.json` writes them: the dense layers as
/// `mlp_only_layers` with `decoder_sparse_step` 1 (`class` is its `architectures`).
pub fn qwen_moe_hf_json(c: &Config, class: &str) -> Value {
    let mut v = qwen_hf_json(c, class);
    if let Some(m) = &c.moe {
        v["num_experts"] = m.experts.into();
        v["num_experts_per_tok"] = m.top_k.into();
        v["moe_intermediate_size"] = m.expert_size.into();
        v["shared_expert_intermediate_size"] = m.shared_size.into();
        v["norm_topk_prob"] = m.norm_topk.into();
        v["decoder_sparse_step"] = 1.into();
        v["mlp_only_layers"] = m.dense_layers.clone().into();
    }
    v
}

pub struct Qwen2MoeArch;

impl Architecture for Qwen2MoeArch {
    fn name(&self) -> &'static str {
        "qwen2_moe"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen2_moe"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: QwenMoeJson = parse_json(path, v)?;
        checked(
            path,
            Config {
                qkv_bias: true,
                o_bias: false,
                sliding_window: j.qwen.window(),
                moe: Some(j.moe(path, true)?),
                ..j.qwen.base.config(&Qwen2MoeArch, "qwen2_moe", false)
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        qwen_moe_hf_json(c, "Qwen2MoeForCausalLM")
    }
}
