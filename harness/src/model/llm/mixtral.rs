//! Mixtral (`model_type = "mixtral"`): the Mistral decoder whose every MLP is a sparse mixture
//! of `num_local_experts` SwiGLU experts, each `intermediate_size` wide, with a router
//! (`block_sparse_moe.gate`, experts × hidden, no bias) sending each token to the
//! `num_experts_per_tok` most probable, their softmax weights renormalized to sum to 1.
//! Memory holds every expert (Mixtral-8x7B: 46.7B parameters) while a token runs through two
//! (12.9B "active"); the KV cache is the attention's, as Mistral's.
use super::llama::{decoder_hf_json, DecoderJson};
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::config::{Moe, MoeNaming, Routing};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct MixtralJson {
    #[serde(flatten)]
    base: DecoderJson,
    sliding_window: Option<usize>,
    num_local_experts: usize,
    num_experts_per_tok: usize,
}

pub struct MixtralArch;

impl Architecture for MixtralArch {
    fn name(&self) -> &'static str {
        "mixtral"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["mixtral"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: MixtralJson = parse_json(path, v)?;
        let base = j.base.config(&MixtralArch, "mixtral", false);
        checked(
            path,
            Config {
                sliding_window: j.sliding_window,
                moe: Some(Moe {
                    experts: j.num_local_experts,
                    top_k: j.num_experts_per_tok,
                    expert_size: base.intermediate_size,
                    shared_size: 0,
                    shared_gate: false,
                    norm_topk: true,
                    dense_layers: vec![],
                    naming: MoeNaming::Mixtral,
                    routing: Routing::SoftmaxTopK,
                    clamped_glu: None,
                }),
                ..base
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "MixtralForCausalLM");
        v["sliding_window"] = c.sliding_window.into();
        if let Some(m) = &c.moe {
            v["num_local_experts"] = m.experts.into();
            v["num_experts_per_tok"] = m.top_k.into();
        }
        v
    }
}
