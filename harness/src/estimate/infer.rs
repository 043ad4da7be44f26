//! The analytic inference estimate: the features of an inference point and the breakdown
//! they give (weights, KV cache, the prefill's largest transient, the logits).
use super::device::device_terms;
use super::{Attention, Breakdown, Overflow, Query, Runtime};
use crate::checked::Checked;
use crate::features::{self as feat, Features, InferShape};
use crate::model::Config;
use crate::record::Phase;

/// Inference features of the point (`features::infer`, what `sweep` writes into the CSV), for
/// the `total` phase with the prompt filling the context.
pub fn infer_features(c: &Config, q: &Query) -> Result<Features, Overflow> {
    // A count past usize (a 32-bit target) is an overflow too.
    let size = |v: u64| usize::try_from(v).map_err(|_| Overflow::new("activations"));
    let shape = InferShape {
        batch: size(q.batch)?,
        context: size(q.context)?,
        prompt_len: size(q.context)?,
        kv: q.kv_cache,
        kv_window: q.kv_window,
        dtype_bytes: size(q.act_bytes())?,
        mla: q.mla_cache(),
    };
    let f = feat::infer(c, &shape, Phase::Total, shape.context)?;
    Ok(Features {
        weight_bytes: q.weight_bytes.unwrap_or(f.weight_bytes),
        ..f
    })
}

pub(super) fn analytic_infer(c: &Config, q: &Query) -> Result<Breakdown, Overflow> {
    let w = q.act_bytes();
    let f = infer_features(c, q)?;
    let bs = Checked::from(q.batch) * q.context;
    // The largest per-layer transient of the prefill: the MLP intermediates (gate, up and
    // their product; a fused `gate_up_proj` holds its 2I output beside the activation and
    // the product: 4I) plus f32 norm copies, or the materialized attention scores with their
    // f32 softmax copies, beside what the attention holds then: K and V repeated to every head
    // (grouped-query attention), the additive mask (one per sequence), the query, the
    // residual stream and the normalized input.
    let mlp_tensors: u64 = if c.fused_gate_up { 4 } else { 3 };
    let dense = bs
        * (Checked::new(mlp_tensors) * c.intermediate_size * w + Checked::new(8) * c.hidden_size);
    let mlp = match &c.moe {
        Some(m) if m.dense_layers.is_empty() => moe_transient(c, m, bs, w, q.runtime),
        Some(m) => dense.max(moe_transient(c, m, bs, w, q.runtime)),
        None => dense,
    };
    let scores = match q.attention {
        Attention::Flash | Attention::Sdpa => Checked::ZERO,
        Attention::Eager | Attention::Sliced => {
            // K and V over the batch's `bs` cached tokens, expanded to every head.
            let repeated = if c.num_kv_heads < c.num_heads {
                bs * 2u64 * c.num_heads * c.head_dim * w
            } else {
                Checked::ZERO
            };
            bs * c.num_heads * q.context * (w + 8)
                + repeated
                + bs * q.context * w
                + bs * (Checked::from(c.num_heads * c.head_dim) + c.hidden_size * 2) * w
        }
    };
    Ok(Breakdown {
        weights: f.weight_bytes,
        kv: f.kv_bytes,
        activations: mlp.max(scores).bytes("activations")?,
        logits: prefill_logits(c, q).bytes("logits")?,
        dequant: q.dequant_bytes,
        source: "analytic".into(),
        ..device_terms(q)
    })
}

/// The logits at the prefill's end. transformers 5 (and candle) computes the LM head at the last
/// position only (`logits_to_keep`) and upcasts it: b · vocab in f32. transformers 4.39 (the
/// torch-2.2 stack) has no `logits_to_keep`: the head runs over every prompt position, and
/// `logits.float()` copies them all to f32 while the 16-bit ones are live, b · s · vocab ·
/// (e + 4) (an f32 model's `.float()` is the tensor itself: 4). Read from a memory snapshot of
/// the probe's prefill on the emulated GPU (Llama-3.2-1B, two batch sizes and prompt lengths).
fn prefill_logits(c: &Config, q: &Query) -> Checked {
    let b = Checked::from(q.batch) * c.vocab_size;
    match q.runtime {
        Runtime::Torch if q.stack.transformers_major() < 5 => {
            let e = q.act_bytes();
            b * q.context * if e < 4 { e + 4 } else { 4 }
        }
        _ => b * 4u64,
    }
}

/// The largest transient of a sparse MoE layer over `tokens` tokens at `w` bytes an
/// activation, in the grouped form transformers ≥ 5 runs by default (and vramlab's candle
/// model): S = tokens · k routed rows whatever the routing, which bounds the eager per-expert
/// loop too (one expert's tokens at a time: tokens · k / E balanced, all tokens at worst).
/// The router's logits and f32 probabilities (E · (w + 4)), top-k's f32 weights and int64
/// indices (12 · k), the f32 norm copies and residual (8 · hidden) a token; a row's sort keys,
/// permutation and weight (20), its gathered input (hidden · w, alive to the end) and the
/// larger of the gate/up output with SiLU's output and the product (4 · expert_size · w) or,
/// at the end, the down projection's output beside the weighted outputs and their
/// un-permuted copy (hidden · (w + 2 · w′), w′ the weighting's width: w, or 4 where the
/// router's weights are f32, DeepSeek's). A shared expert runs on every token
/// afterwards (3 · its size · w, as a dense MLP). Under `runtime` torch a model whose
/// transformers implementation runs every expert on every token ([`Moe::dense_dispatch`],
/// Llama 4) has E rows a token instead of k.
///
/// [`Moe::dense_dispatch`]: crate::model::config::Moe::dense_dispatch
fn moe_transient(
    c: &Config,
    m: &crate::model::config::Moe,
    tokens: Checked,
    w: u64,
    runtime: Runtime,
) -> Checked {
    let (d, f) = (c.hidden_size as u64, m.expert_size as u64);
    // transformers' Llama 4 runs every expert on every token: E rows a token.
    let k = match runtime {
        Runtime::Torch if m.dense_dispatch() => m.experts as u64,
        _ => m.top_k as u64,
    };
    let per_token = Checked::new(m.experts as u64) * (w + 4) + 12 * k + 8 * d;
    // The weighting's width: DeepSeek's routers keep their weights in f32, so the weighted
    // outputs and their un-permuted copy are f32.
    let weighted = if m.f32_routing_weights() { w.max(4) } else { w };
    let per_row = Checked::new(20) + d * w + (4 * f * w).max(d * w + 2 * d * weighted);
    let routed = tokens * per_token + tokens * k * per_row;
    let shared = tokens * (Checked::new(3) * m.shared_size * w + 8 * d);
    routed.max(shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::{estimate, gpu_fit, preset, q};
    use crate::estimate::KvWindow;
    use crate::model::KvKind;
    use crate::units::gb_gib;

    fn infer_features(c: &Config, q: &Query) -> Features {
        super::infer_features(c, q).unwrap()
    }

    #[test]
    fn design_guide_example_13b_bf16() {
        // Llama-2-13B's published config.json (the design guide's "13B").
        let json = serde_json::json!({"model_type": "llama", "vocab_size": 32000,
            "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 40,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false});
        let m = Config::from_json(std::path::Path::new("llama-2-13b"), &json).unwrap();
        // Embedding and head 2 · 32000 · 5120; per layer q, k, v, o 4 · 5120², gate, up,
        // down 3 · 5120 · 13824 and two norms; the final norm.
        let params =
            2 * 32_000 * 5120 + 40 * (4 * 5120 * 5120 + 3 * 5120 * 13_824 + 2 * 5120) + 5120;
        assert_eq!(params, 13_015_864_320);
        assert_eq!(m.param_count(), params);
        let e = estimate(&m, &q(), None);
        assert_eq!(e.weights, 2 * params);
        assert_eq!(gb_gib(e.weights), "26.0 GB (24.2 GiB)");
    }

    #[test]
    fn llama31_8b_kv_per_token_bf16() {
        let m = preset("presets/llama-3.1-8b");
        // 2 (K,V) · 32 layers · 8 kv heads · 128 head_dim · 2 B
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(2 * 32 * 8 * 128 * 2));
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(131_072));
        let e = estimate(
            &m,
            &Query {
                batch: 2,
                context: 1000,
                ..q()
            },
            None,
        );
        assert_eq!(e.kv, 131_072 * 2 * 1000);
    }

    #[test]
    fn inference_features_by_hand() {
        // SmolLM2-135M: 30 layers, 3 kv heads of 64, hidden 576, vocab 49152.
        let m = preset("smollm2-135m");
        let qq = Query {
            batch: 3,
            context: 200,
            ..q()
        };
        let f = infer_features(&m, &qq);
        assert_eq!(f.weight_bytes, 134_515_008 * 2);
        assert_eq!(f.kv_bytes, 2 * 30 * 3 * 64 * 2 * 200 * 3);
        assert_eq!(f.act_bytes, 3 * 200 * 576 * 30 * 2);
        assert_eq!(f.logits_bytes, 3 * 49_152 * 2);
        assert_eq!(f.optimizer_bytes, 0);
        let growing = Query {
            kv_cache: KvKind::Growing,
            ..qq
        };
        assert_eq!(infer_features(&m, &growing), f);
    }

    #[test]
    fn sliding_window_caps_the_kv_cache() {
        // Mistral-7B-v0.1: sliding_window 4096; 2 (K,V) · 32 layers · 8 kv heads · 128 · 2 B.
        let m = preset("mistral-7b-v0.1");
        assert_eq!(m.sliding_window, Some(4096));
        let per_token = 2 * 32 * 8 * 128 * 2;
        assert_eq!(m.kv_bytes_per_token(2).get(), Some(per_token));
        let at = |context, kv_window| Query {
            batch: 2,
            context,
            kv_window,
            ..q()
        };
        let kv = |qq: Query| estimate(&m, &qq, None).kv;
        assert_eq!(kv(at(8192, KvWindow::Model)), 4096 * per_token * 2);
        assert_eq!(kv(at(8192, KvWindow::Full)), 8192 * per_token * 2);
        assert_eq!(kv(at(32_768, KvWindow::Model)), 4096 * per_token * 2);
        // Within the window the two agree.
        assert_eq!(kv(at(1000, KvWindow::Model)), 1000 * per_token * 2);
        assert_eq!(kv(at(1000, KvWindow::Full)), 1000 * per_token * 2);
        // A model without a window ignores the option.
        let llama = preset("llama-3.1-8b");
        let full = estimate(&llama, &at(8192, KvWindow::Full), None).kv;
        assert_eq!(estimate(&llama, &at(8192, KvWindow::Model), None).kv, full);
        // A capped cache holds more sequences of 8192 tokens in the same budget.
        let g = |w| gpu_fit(&m, &at(8192, w), "h100-80", 80_000_000_000);
        let (capped, uncapped) = (g(KvWindow::Model), g(KvWindow::Full));
        let tokens = capped.kv_capacity_tokens.unwrap();
        assert_eq!(capped.max_concurrency.unwrap(), tokens as f64 / 4096.0);
        assert!(capped.max_concurrency > uncapped.max_concurrency);
        assert!(capped.largest_batch > uncapped.largest_batch);
    }
}
