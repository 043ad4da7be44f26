//! GPTBigCode (`model_type = "gpt_bigcode"`): StarCoder, StarCoderBase, SantaCoder, OctoCoder.
//! GPT-2's model (see [`super::gpt2`]) with three differences:
//! - multi-query attention (`multi_query: true`): one K/V head shared by every query head, so
//!   the fused `c_attn` is d + 2·head_dim wide and the KV cache holds 2 · L · 1 · head_dim
//!   elements per token (StarCoder-15.5B: 2 · 40 · 128 = 10,240, against 491,520 for the same
//!   model with multi-head attention);
//! - `nn.Linear` projections, stored (out, in), where GPT-2 has Conv1D;
//! - tensor names with the `transformer.` prefix of HF's `GPTBigCodeForCausalLM` checkpoints.
//!
//! Like GPT-2: learned positions (`wpe`), pre-LayerNorm blocks with biases, GELU with the tanh
//! approximation (`gelu_pytorch_tanh`), and a head tied to `wte` (a stored `lm_head.weight`
//! copy, where a checkpoint has one, is not loaded: transformers ties it to `wte`).
//!
//! Not supported, with a clear error: `multi_query: false` (its `c_attn` interleaves q, k and
//! v per head), an untied head, and an exact-erf `activation_function`.
use super::gpt2::{gpt2_config, gpt2_hf_json, shapes, Gpt2, Gpt2Arch, Layout};
use crate::error::bad_file;
use crate::model::arch::{parse_json, Architecture, InferenceModel, Tensors};
use crate::model::{Config, Trainable};
use crate::vocab::Ops;
use anyhow::Result;
use candle_core::DType;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// How HF's `GPTBigCodeForCausalLM` stores its tensors.
pub const BIGCODE_LAYOUT: Layout = Layout {
    prefix: "transformer.",
    conv1d: false,
};

/// The keys GPTBigCode adds to GPT-2's (HF's defaults when absent).
#[derive(Clone, Debug, Deserialize)]
struct BigCodeJson {
    multi_query: Option<bool>,
    activation_function: Option<String>,
    tie_word_embeddings: Option<bool>,
}

/// The activation names that mean GELU with the tanh approximation (candle's `gelu`).
const TANH_GELU: [&str; 2] = ["gelu_pytorch_tanh", "gelu_new"];

pub struct GptBigCodeArch;

impl Architecture for GptBigCodeArch {
    fn torch_saved_per_token(&self, c: &Config, e: u64, lora: Option<u64>) -> Option<(u64, u64)> {
        super::gpt2::gpt2_saved_per_token(c, e, lora)
    }
    fn name(&self) -> &'static str {
        "gpt_bigcode"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_bigcode"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: BigCodeJson = parse_json(path, v)?;
        if !j.multi_query.unwrap_or(true) {
            return Err(bad_file(
                path,
                "multi_query = false is not supported (gpt_bigcode with one K/V head only)",
            ));
        }
        if j.tie_word_embeddings == Some(false) {
            return Err(bad_file(
                path,
                "tie_word_embeddings = false is not supported for gpt_bigcode (its head is wte)",
            ));
        }
        if let Some(a) = j
            .activation_function
            .filter(|a| !TANH_GELU.contains(&a.as_str()))
        {
            return Err(bad_file(
                path,
                format!(
                    "activation_function = \"{a}\" is not supported (expected one of {})",
                    TANH_GELU.join(", ")
                ),
            ));
        }
        gpt2_config(&GptBigCodeArch, "gpt_bigcode", path, v, Some(1))
    }
    fn tensor_shapes(&self, c: &Config) -> Vec<(String, Vec<usize>)> {
        shapes(c, BIGCODE_LAYOUT)
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = gpt2_hf_json(c, "GPTBigCodeForCausalLM");
        v["multi_query"] = true.into();
        v["activation_function"] = TANH_GELU[0].into();
        v
    }
    /// PEFT's default for gpt_bigcode: the fused `c_attn` (an `nn.Linear`, so the default
    /// (out, in) reading of its shape holds).
    fn lora_targets(&self) -> &'static [&'static str] {
        Gpt2Arch.lora_targets()
    }
    fn is_embedding(&self, name: &str) -> bool {
        Gpt2Arch.is_embedding(name)
    }
    fn trainable(
        &self,
        c: &Config,
        t: Tensors,
        compute: DType,
        ops: Ops,
    ) -> Result<Box<dyn Trainable>> {
        Gpt2::trainable(c, t, compute, ops, BIGCODE_LAYOUT)
    }
    fn inference(&self, c: &Config, t: Tensors, compute: DType) -> Result<InferenceModel> {
        Gpt2::decoder(c, t, compute, BIGCODE_LAYOUT)
    }
}
