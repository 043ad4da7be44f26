//! DeepSeek-V2 (`model_type = "deepseek_v2"`, DeepSeek-V2-Lite) and DeepSeek-V3
//! (`deepseek_v3`, also R1): multi-head latent attention and a mixture of experts.
//! - **MLA.** Queries through a low-rank `q_a_proj` → `q_a_layernorm` → `q_b_proj`
//!   (`q_lora_rank`; a full `q_proj` when null, as in V2-Lite); keys and values from one
//!   compressed latent per token, `kv_a_proj_with_mqa` (`kv_lora_rank` + `qk_rope_head_dim`,
//!   the latter a rotary key shared by every head) → `kv_a_layernorm` → `kv_b_proj`, which
//!   expands it to each head's `qk_nope_head_dim` key part and `v_head_dim` value. A KV cache
//!   holds the latent and the rotary key (576 values a token and layer in V3) in
//!   transformers ≥ 5, vLLM and SGLang; transformers 4.x held the expanded K and V of every
//!   head (128 · (192 + 128) = 40,960 values in V3, 71 times more)
//!   ([`MlaCache`](crate::model::config::MlaCache)).
//! - **MoE.** The first `first_k_dense_replace` layers are dense (`intermediate_size`); the
//!   others route each token to `num_experts_per_tok` of `n_routed_experts` experts of
//!   `moe_intermediate_size`, plus `n_shared_experts` shared experts run as one MLP
//!   (`mlp.shared_experts`). V2 routes by softmax (greedy or group-limited), V3 by sigmoid
//!   scores with a correction bias within the best `topk_group` of `n_group` groups.
//!   transformers keeps V3's router weight in f32 and its correction bias as a buffer (0.2 GB
//!   over bf16 in all of V3, not counted).
//! - **Multi-token prediction.** V3's checkpoint stores `num_nextn_predict_layers` more
//!   layers (one: an MoE decoder layer with its own embedding, head and projection, 11.7B
//!   parameters) that inference does not run: transformers does not build them and vLLM loads
//!   them only for MTP speculative decoding. They are not in the weights; the estimate names
//!   them ([`Config::mtp_layers`]).
//!
//! vramlab runs these in the estimate (analytic, and transformers' own models on the emulated
//! GPU); candle sweeps of MLA are refused in one line.
use super::llama::{decoder_hf_json, DecoderJson};
use crate::error::bad_file;
use crate::model::arch::{checked, parse_json, Architecture, InferenceModel, Tensors};
use crate::model::config::{Mla, Moe, MoeNaming, Routing};
use crate::model::{Config, Trainable};
use crate::vocab::Ops;
use anyhow::Result;
use candle_core::DType;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct DeepSeekJson {
    #[serde(flatten)]
    base: DecoderJson,
    q_lora_rank: Option<usize>,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    n_routed_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    n_shared_experts: Option<usize>,
    first_k_dense_replace: Option<usize>,
    norm_topk_prob: Option<bool>,
    scoring_func: Option<String>,
    num_nextn_predict_layers: Option<usize>,
}

impl DeepSeekJson {
    fn config(
        &self,
        path: &Path,
        arch: &'static dyn Architecture,
        model_type: &str,
    ) -> Result<Config> {
        let base = self.base.config(arch, model_type, false);
        let dense = self.first_k_dense_replace.unwrap_or(0);
        if dense > base.num_layers {
            return Err(bad_file(
                path,
                format!(
                    "first_k_dense_replace = {dense} exceeds num_hidden_layers = {}",
                    base.num_layers
                ),
            ));
        }
        let routing = match self.scoring_func.as_deref() {
            None | Some("softmax") => Routing::SoftmaxTopK,
            Some("sigmoid") => Routing::SigmoidGrouped,
            Some(f) => return Err(bad_file(path, format!("unknown scoring_func `{f}`"))),
        };
        let shared = self.n_shared_experts.unwrap_or(0);
        Ok(Config {
            head_dim: self.qk_nope_head_dim + self.qk_rope_head_dim,
            num_kv_heads: base.num_heads,
            mla: Some(Mla {
                q_lora_rank: self.q_lora_rank,
                kv_lora_rank: self.kv_lora_rank,
                qk_nope_head_dim: self.qk_nope_head_dim,
                qk_rope_head_dim: self.qk_rope_head_dim,
                v_head_dim: self.v_head_dim,
            }),
            moe: Some(Moe {
                experts: self.n_routed_experts,
                top_k: self.num_experts_per_tok,
                expert_size: self.moe_intermediate_size,
                shared_size: shared.saturating_mul(self.moe_intermediate_size),
                shared_gate: false,
                norm_topk: self.norm_topk_prob.unwrap_or(false),
                dense_layers: (0..dense).collect(),
                naming: MoeNaming::DeepSeek,
                routing,
                clamped_glu: None,
            }),
            mtp_layers: self.num_nextn_predict_layers.unwrap_or(0),
            ..base
        })
    }
}

fn deepseek_hf_json(c: &Config, class: &str) -> Value {
    let mut v = decoder_hf_json(c, class);
    if let Some(m) = &c.mla {
        v["q_lora_rank"] = m.q_lora_rank.into();
        v["kv_lora_rank"] = m.kv_lora_rank.into();
        v["qk_nope_head_dim"] = m.qk_nope_head_dim.into();
        v["qk_rope_head_dim"] = m.qk_rope_head_dim.into();
        v["v_head_dim"] = m.v_head_dim.into();
        v["head_dim"] = m.qk_rope_head_dim.into();
    }
    if let Some(m) = &c.moe {
        v["n_routed_experts"] = m.experts.into();
        v["num_experts_per_tok"] = m.top_k.into();
        v["moe_intermediate_size"] = m.expert_size.into();
        v["n_shared_experts"] = (m.shared_size / m.expert_size.max(1)).into();
        v["first_k_dense_replace"] = m.dense_layers.len().into();
        v["norm_topk_prob"] = m.norm_topk.into();
        v["scoring_func"] = match m.routing {
            Routing::SigmoidGrouped => "sigmoid",
            _ => "softmax",
        }
        .into();
    }
    v["num_nextn_predict_layers"] = c.mtp_layers.into();
    v
}

/// The refusal of a candle sweep of multi-head latent attention.
fn refused(c: &Config) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: multi-head latent attention runs in `vramlab estimate` only (analytic, or \
         transformers on the emulated GPU with --emulate); candle sweeps of it are not implemented",
        c.architecture
    )
}

macro_rules! deepseek_arch {
    ($ty:ident, $name:literal, $class:literal) => {
        pub struct $ty;

        impl Architecture for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn model_types(&self) -> &'static [&'static str] {
                &[$name]
            }
            fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
                let j: DeepSeekJson = parse_json(path, v)?;
                checked(path, j.config(path, &$ty, $name)?)
            }
            fn to_hf_json(&self, c: &Config) -> Value {
                deepseek_hf_json(c, $class)
            }
            /// MLA's layer is not the llama accounting: the estimate uses Korthikanti's.
            fn torch_saved_per_token(
                &self,
                _: &Config,
                _: u64,
                _: Option<u64>,
            ) -> Option<(u64, u64)> {
                None
            }
            fn trainable(
                &self,
                c: &Config,
                _: Tensors,
                _: DType,
                _: Ops,
            ) -> Result<Box<dyn Trainable>> {
                Err(refused(c))
            }
            fn inference(&self, c: &Config, _: Tensors, _: DType) -> Result<InferenceModel> {
                Err(refused(c))
            }
        }
    };
}

deepseek_arch!(DeepSeekV2Arch, "deepseek_v2", "DeepseekV2ForCausalLM");
deepseek_arch!(DeepSeekV3Arch, "deepseek_v3", "DeepseekV3ForCausalLM");
