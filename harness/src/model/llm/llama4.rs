//! Llama 4 (`model_type = "llama4_text"`, and the multimodal `llama4` whose `text_config` it
//! is: Llama-4-Scout and Maverick): a llama decoder with
//! - MoE layers (every `interleave_moe_layer_step`-th, or those `moe_layers` lists; all of
//!   them in Scout, every second in Maverick) of `num_local_experts` SwiGLU experts of
//!   `intermediate_size`, stored stacked (`feed_forward.experts.gate_up_proj`, E × hidden ×
//!   2·f, gate then up; `down_proj`, E × f × hidden), a router (E × hidden, no bias) whose top
//!   k logits pass a sigmoid and scale each expert's *input*, and a shared expert of
//!   `intermediate_size` that sees every token; the other layers' dense MLP is
//!   `intermediate_size_mlp` wide;
//! - chunked local attention: three layers in four (`no_rope_layers` 1) rotate q and k in
//!   adjacent pairs, L2-normalize them (`use_qk_norm`, no weight) and attend within their own
//!   chunk of `attention_chunk_size` (8,192) tokens, so their KV cache holds at most a chunk;
//!   every fourth layer has no RoPE (NoPE), attends to every token and scales its queries by
//!   1 + attn_scale · ln(1 + ⌊(p + 1)/floor_scale⌋) (`attn_temperature_tuning`): at long
//!   contexts those 12 of 48 layers hold nearly all of the cache;
//! - an untied 202,048-token head.
//!
//! The multimodal checkpoints also store the vision tower and its projector
//! ([`crate::model::vision`]): counted as stored weights, never run by a text query.
//! transformers runs every expert on every token (the routed input is zero for the experts a
//! token is not sent to); vramlab's candle model runs the grouped form, as vLLM does.
use super::llama::{decoder_hf_json, DecoderJson};
use crate::error::bad_file;
use crate::model::arch::{checked, parse_json, Architecture};
use crate::model::config::{LayerAttention, Llama4Attention, Moe, MoeNaming, Routing};
use crate::model::vision::{multimodal_parts, nest_multimodal, VisionKind};
use crate::model::Config;
use anyhow::Result;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
struct Llama4Json {
    #[serde(flatten)]
    base: DecoderJson,
    intermediate_size_mlp: usize,
    num_local_experts: usize,
    num_experts_per_tok: usize,
    interleave_moe_layer_step: usize,
    moe_layers: Option<Vec<usize>>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: usize,
    attention_chunk_size: Option<usize>,
    use_qk_norm: bool,
    /// A boolean; the published Scout and Maverick configs write 4 (transformers 5's strict
    /// config rejects that; vramlab reads any nonzero number as on).
    attn_temperature_tuning: Value,
    attn_scale: f64,
    floor_scale: f64,
    layer_types: Option<Vec<String>>,
}

/// transformers' `Llama4TextConfig` defaults for the keys that change memory or the model.
fn defaults() -> Vec<(&'static str, Value)> {
    vec![
        ("vocab_size", json!(202048)),
        ("max_position_embeddings", json!(4096 * 32)),
        ("rms_norm_eps", json!(1e-5)),
        ("rope_theta", json!(500000.0)),
        ("head_dim", json!(128)),
        ("intermediate_size_mlp", json!(16384)),
        ("num_local_experts", json!(16)),
        ("num_experts_per_tok", json!(1)),
        ("interleave_moe_layer_step", json!(1)),
        ("no_rope_layer_interval", json!(4)),
        ("attention_chunk_size", json!(8192)),
        ("use_qk_norm", json!(true)),
        ("attn_temperature_tuning", json!(true)),
        ("attn_scale", json!(0.1)),
        ("floor_scale", json!(8192)),
        ("tie_word_embeddings", json!(false)),
    ]
}

pub struct Llama4Arch;

impl Architecture for Llama4Arch {
    fn name(&self) -> &'static str {
        "llama4"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["llama4_text", "llama4"]
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let (text, vision) = multimodal_parts(path, v, VisionKind::Llama4, &defaults())?;
        let j: Llama4Json = parse_json(path, &text)?;
        let model_type = v["model_type"].as_str().unwrap_or("llama4_text");
        let base = j.base.config(&Llama4Arch, model_type, false);
        let layers = base.num_layers;
        if j.interleave_moe_layer_step == 0 || j.no_rope_layer_interval == 0 {
            return Err(bad_file(
                path,
                "interleave_moe_layer_step and no_rope_layer_interval must be positive",
            ));
        }
        // transformers: an empty `no_rope_layers` means the default, a NoPE layer every
        // `no_rope_layer_interval`-th.
        let rope_layers: Vec<bool> = match j.no_rope_layers.filter(|l| !l.is_empty()) {
            Some(l) => l.iter().map(|&r| r != 0).collect(),
            None => (0..layers)
                .map(|i| !(i + 1).is_multiple_of(j.no_rope_layer_interval))
                .collect(),
        };
        if rope_layers.len() != layers {
            return Err(bad_file(
                path,
                format!(
                    "no_rope_layers lists {} layers, the model has {layers}",
                    rope_layers.len()
                ),
            ));
        }
        let moe_layers = j.moe_layers.unwrap_or_else(|| {
            (j.interleave_moe_layer_step - 1..layers)
                .step_by(j.interleave_moe_layer_step)
                .collect()
        });
        if let Some(&i) = moe_layers.iter().find(|&&i| i >= layers) {
            return Err(bad_file(
                path,
                format!("moe_layers lists layer {i}, outside the model's {layers} layers"),
            ));
        }
        let layer_types = match j.layer_types.as_deref() {
            Some(names) => crate::model::arch::layer_types(path, Some(names), layers, 1)?,
            None => rope_layers
                .iter()
                .map(|&rope| match rope && j.attention_chunk_size.is_some() {
                    true => LayerAttention::Chunked,
                    false => LayerAttention::Full,
                })
                .collect(),
        };
        let temperature = match &j.attn_temperature_tuning {
            Value::Bool(on) => *on,
            Value::Number(n) => n.as_f64() != Some(0.0),
            other => {
                return Err(bad_file(
                    path,
                    format!("attn_temperature_tuning must be a boolean, got {other}"),
                ))
            }
        };
        checked(
            path,
            Config {
                intermediate_size: j.intermediate_size_mlp,
                layer_types,
                attention_chunk: j.attention_chunk_size,
                llama4: Some(Llama4Attention {
                    rope_layers,
                    l2_qk_norm: j.use_qk_norm,
                    temperature: temperature.then_some((j.attn_scale, j.floor_scale)),
                }),
                moe: Some(Moe {
                    experts: j.num_local_experts,
                    top_k: j.num_experts_per_tok,
                    expert_size: base.intermediate_size,
                    shared_size: base.intermediate_size,
                    shared_gate: false,
                    norm_topk: false,
                    dense_layers: (0..layers).filter(|i| !moe_layers.contains(i)).collect(),
                    naming: MoeNaming::Llama4,
                    routing: Routing::SigmoidTopKInput,
                    clamped_glu: None,
                }),
                vision,
                ..base
            },
        )
    }
    fn to_hf_json(&self, c: &Config) -> Value {
        let mut v = decoder_hf_json(c, "Llama4ForCausalLM");
        v["model_type"] = "llama4_text".into();
        v["attention_bias"] = c.o_bias.into();
        v["intermediate_size_mlp"] = c.intermediate_size.into();
        v["attention_chunk_size"] = c.attention_chunk.into();
        v["layer_types"] = c.layer_types.iter().map(|t| t.as_str()).collect();
        if let Some(m) = &c.moe {
            v["intermediate_size"] = m.expert_size.into();
            v["num_local_experts"] = m.experts.into();
            v["num_experts_per_tok"] = m.top_k.into();
            let moe: Vec<usize> = (0..c.num_layers).filter(|&i| m.is_sparse(i)).collect();
            v["moe_layers"] = moe.into();
        }
        if let Some(a) = &c.llama4 {
            let rope: Vec<u8> = a.rope_layers.iter().map(|&r| r as u8).collect();
            v["no_rope_layers"] = rope.into();
            v["use_qk_norm"] = a.l2_qk_norm.into();
            v["attn_temperature_tuning"] = a.temperature.is_some().into();
            if let Some((scale, floor)) = a.temperature {
                v["attn_scale"] = scale.into();
                // transformers' strict config takes an integer.
                v["floor_scale"] = match floor.fract() == 0.0 {
                    true => (floor as u64).into(),
                    false => floor.into(),
                };
            }
        }
        nest_multimodal(
            v,
            c.vision.as_ref(),
            "llama4",
            "Llama4ForConditionalGeneration",
        )
    }
}
