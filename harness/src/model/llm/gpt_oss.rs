//! gpt-oss (`model_type = "gpt_oss"`, gpt-oss-20b and gpt-oss-120b): a mixture-of-experts
//! decoder with
//! - attention: q/k/v/o biases, 64 heads of 64 with 8 KV heads, a learned sink logit per head
//!   (`self_attn.sinks`) that each query's softmax includes and then drops, and layers
//!   alternating a 128-token sliding window (even layers) and full attention (`layer_types`):
//!   at long contexts the full layers hold nearly all of the KV cache;
//! - MoE MLPs on every layer: a router with a bias (`mlp.router`) picks the top k logits and
//!   softmaxes over those k; each expert's gate and up are one stacked tensor whose output
//!   interleaves them (`mlp.experts.gate_up_proj`, E × hidden × 2·f, with a bias), activated
//!   by a clamped GLU, (up + 1) · gate · σ(1.702 · gate) with gate ≤ 7 and |up| ≤ 7, then
//!   `down_proj` (E × f × hidden, with a bias);
//! - an untied 201,088-token head.
//!
//! The tensors are transformers' names of the dequantized model. The published checkpoints
//! store the experts in MXFP4 (`*_blocks` of packed E2M1 values and `*_scales`, one E8M0 per
//! 32), everything else in bf16: the estimate's weights follow the checkpoint's
//! `quantization_config`. vramlab's candle model runs the dequantized experts; its sinks are
//! in eager attention only (vramlab-kernels' flash attention and fused ops are refused).
use super::llama::{decoder_hf_json, DecoderJson};
use crate::error::bad_file;
use crate::model::arch::{checked, layer_types, parse_json, Architecture};
use crate::model::config::{Moe, MoeNaming, Routing};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct GptOssJson {
    #[serde(flatten)]
    base: DecoderJson,
    num_local_experts: usize,
    num_experts_per_tok: Option<usize>,
    /// The published configs repeat `num_experts_per_tok` under this name.
    experts_per_token: Option<usize>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
}

pub struct GptOssArch;

impl Architecture for GptOssArch {
    fn name(&self) -> &'static str {
        "gpt_oss"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: GptOssJson = parse_json(path, v)?;
        let top_k = j
            .num_experts_per_tok
            .or(j.experts_per_token)
            .ok_or_else(|| bad_file(path, "missing config key `num_experts_per_tok`"))?;
        let mut base = j.base.config(&GptOssArch, "gpt_oss", false);
        // transformers' default is biased attention.
        let bias = j.base.attention_bias.unwrap_or(true);
        let layer_types = layer_types(path, j.layer_types.as_deref(), base.num_layers, 2)?;
        base.moe = Some(Moe {
            experts: j.num_local_experts,
            top_k,
            expert_size: base.intermediate_size,
            shared_size: 0,
            shared_gate: false,
            norm_topk: false,
            dense_layers: vec![],
            naming: MoeNaming::GptOss,
            routing: Routing::TopKSoftmax,
            clamped_glu: Some((
                j.swiglu_alpha.unwrap_or(1.702),
                j.swiglu_limit.unwrap_or(7.0),
            )),
        });
        checked(
            path,
            Config {
                qkv_bias: bias,
                o_bias: bias,
                sliding_window: j.sliding_window,
                layer_types,
                attention_sinks: true,
                ..base
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "GptOssForCausalLM");
        v["attention_bias"] = c.qkv_bias.into();
        v["sliding_window"] = c.sliding_window.into();
        v["layer_types"] = c.layer_types.iter().map(|t| t.as_str()).collect();
        if let Some(m) = &c.moe {
            v["num_local_experts"] = m.experts.into();
            v["num_experts_per_tok"] = m.top_k.into();
            if let Some((alpha, limit)) = m.clamped_glu {
                v["swiglu_alpha"] = alpha.into();
                v["swiglu_limit"] = limit.into();
            }
        }
        v
    }
}
