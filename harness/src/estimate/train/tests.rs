use super::*;
use crate::estimate::test_support::{estimate, matrices_and_vectors, preset, q};
use crate::estimate::{Compute, Mode, OptimizerImpl, Precision, Trainable};

fn model_states(p: u64, t: u64, adapters: u64, q: &Query) -> Breakdown {
    super::model_states(p, t, adapters, None, q).unwrap()
}

#[test]
fn zero_stages_divide_the_right_states() {
    // Llama-3.2-1B: 1,235,814,400 parameters (estimate::model's published counts).
    let m = preset("llama-3.2-1b");
    let p = 1_235_814_400;
    assert_eq!(m.param_count(), p);
    let base = Query {
        mode: Mode::Train,
        precision: Precision::MixedBf16,
        gpus: 4,
        ..q()
    };
    let at = |s: Sharding| {
        estimate(
            &m,
            &Query {
                sharding: s,
                ..base
            },
            None,
        )
    };
    let (d, z1, z2, z3) = (
        at(Sharding::Ddp),
        at(Sharding::Zero1),
        at(Sharding::Zero2),
        at(Sharding::Zero3),
    );
    // DDP, torch AMP: 4 (f32 weights) + 4 (grads) + 8 (m, v) = 16 B/param, plus the
    // 16-bit weight copies. ZeRO, DeepSpeed's layout: 2 (16-bit weights) + 2 (16-bit
    // grads) + K = 12 (f32 master, m, v) = 16 B/param. The count divides by 8 exactly.
    assert_eq!(p % 8, 0);
    assert_eq!((d.weights, d.gradients, d.optimizer), (4 * p, 4 * p, 8 * p));
    assert_eq!(d.weight_copies, 2 * p);
    assert_eq!(
        (z1.weights, z1.gradients, z1.optimizer),
        (2 * p, 2 * p, 3 * p)
    );
    assert_eq!(
        (z2.weights, z2.gradients, z2.optimizer),
        (2 * p, p / 2, 3 * p)
    );
    assert_eq!(
        (z3.weights, z3.gradients, z3.optimizer),
        (p / 2, p / 2, 3 * p)
    );
    assert_eq!(z1.weight_copies + z2.weight_copies + z3.weight_copies, 0);
    assert_eq!(at(Sharding::Fsdp), z3);
    assert_eq!(d.activations, z3.activations);
}

#[test]
fn zero_paper_figure_1() {
    // ZeRO (arXiv:1910.02054) Figure 1: Ψ = 7.5B, K = 12, N_d = 64; per-device model
    // states (2 + 2 + K)Ψ = 120 GB, P_os 2Ψ + 2Ψ + KΨ/N_d, P_os+g 2Ψ + (2 + K)Ψ/N_d,
    // P_os+g+p (2 + 2 + K)Ψ/N_d.
    let psi: u64 = 7_500_000_000;
    let states = |sharding, gpus| {
        let q = Query {
            mode: Mode::Train,
            precision: Precision::MixedF16,
            sharding,
            gpus,
            ..q()
        };
        let b = model_states(psi, psi, 0, &q);
        b.weights + b.gradients + b.optimizer
    };
    assert_eq!(states(Sharding::Ddp, 1), 16 * psi);
    assert_eq!(states(Sharding::Zero1, 64), 4 * psi + 12 * psi / 64);
    assert_eq!(states(Sharding::Zero2, 64), 2 * psi + 14 * psi / 64);
    assert_eq!(states(Sharding::Zero3, 64), 16 * psi / 64);
    assert_eq!(states(Sharding::Zero3, 64), 1_875_000_000);
}

#[test]
fn korthikanti_table_2() {
    // Korthikanti et al. (arXiv:2205.05198) Table 2 with GPT-3 175B's h = 12288, a = 96,
    // s = 2048, b = 1, t = 8, at 16 bits.
    let m = gpt3_175b();
    let (s, b, h, a, t) = (2048u64, 1u64, 12288u64, 96u64, 8u64);
    let sbh = s * b * h;
    let at = |bytes, scores, r, tp, sp| {
        layer_activations(&m, b, s, bytes, scores, r, tp, sp)
            .get()
            .unwrap()
    };
    let l = |scores, r, tp, sp| at(2, scores, r, tp, sp);
    assert_eq!(
        l(true, Recompute::None, 1, false),
        sbh * 34 + 5 * a * s * s * b
    );
    assert_eq!(
        l(true, Recompute::None, t, false),
        sbh * 10 + sbh * 24 / t + 5 * a * s * s * b / t
    );
    assert_eq!(
        l(true, Recompute::None, t, true),
        sbh * 34 / t + 5 * a * s * s * b / t
    );
    assert_eq!(
        l(true, Recompute::Selective, t, false),
        sbh * 10 + sbh * 24 / t
    );
    assert_eq!(l(true, Recompute::Selective, t, true), sbh * 34 / t);
    assert_eq!(l(true, Recompute::Full, 1, false), 2 * sbh);
    // Flash attention keeps no scores: the selective figure.
    assert_eq!(
        l(false, Recompute::None, 1, false),
        l(true, Recompute::Selective, 1, false)
    );
    // f32 activations: twice the bytes, except the dropout masks, which stay 1 byte: the
    // two after attention and MLP (s·b·h each) and the attention probabilities' (a·s²·b).
    let masks = 2 * sbh + a * s * s * b;
    assert_eq!(
        at(4, true, Recompute::None, 1, false),
        2 * l(true, Recompute::None, 1, false) - masks
    );
    assert_eq!(
        at(4, false, Recompute::None, 1, false),
        2 * l(false, Recompute::None, 1, false) - 2 * sbh
    );
    assert_eq!(
        at(4, true, Recompute::Selective, t, true),
        2 * l(true, Recompute::Selective, t, true) - 2 * sbh / t
    );
    // Full recomputation keeps no mask: the layer input at its own width.
    assert_eq!(at(4, true, Recompute::Full, 1, false), 4 * sbh);
}

/// GPT-3 175B's shapes (Brown et al. 2020, Table 2.1) as a GPT-2 config.
fn gpt3_175b() -> Config {
    let json = serde_json::json!({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 12288,
        "n_layer": 96, "n_head": 96, "n_positions": 2048});
    Config::from_json(std::path::Path::new("gpt3-175b"), &json).unwrap()
}

#[test]
fn lora_and_frozen_embeddings_shrink_the_training_states() {
    let m = preset("llama-3.1-8b");
    // Per layer and rank: q (4096 → 4096) and v (4096 → 1024), A and B each.
    assert_eq!(
        feat::adapter_params(&m, Trainable::Lora(1)),
        Ok(32 * ((4096 + 4096) + (4096 + 1024)))
    );
    // candle holds every row at once: the states as they are (on torch the loss's moment
    // has no gradients yet).
    let lora = Query {
        mode: Mode::Train,
        precision: Precision::Bf16,
        trainable: Trainable::Lora(16),
        runtime: Runtime::Candle,
        ..q()
    };
    let e = estimate(&m, &lora, None);
    // PEFT prints "trainable params: 6,815,744" for this configuration.
    let adapters = 6_815_744;
    assert_eq!(e.gradients, adapters * 2);
    assert_eq!(e.optimizer, adapters * 4);
    let params = m.param_count();
    assert_eq!(e.weights, (params + adapters) * 2);
    let frozen = estimate(
        &m,
        &Query {
            trainable: Trainable::FrozenEmbeddings,
            ..lora
        },
        None,
    );
    // Llama-3.1-8B's input embedding (128256 × 4096) is untied from its head.
    assert_eq!(
        feat::trainable_params(&m, Trainable::FrozenEmbeddings),
        Ok(params - 128_256 * 4096)
    );
    assert_eq!(frozen.gradients, (params - 128_256 * 4096) * 2);
    assert_eq!(frozen.weights, params * 2);
}

/// QLoRA, analytically: llama-3.1-8b's base at Q4_K's block bytes (every matrix 144 B
/// per 256 weights, every vector in the f32 compute dtype), rank-16 adapters on q and v
/// (6,815,744 parameters, PEFT's figure) in f32 with their f32 gradients and AdamW's two
/// f32 moments; bf16 compute halves the adapters' bytes, not the base's blocks' share.
#[test]
fn qlora_base_at_block_bytes_adapters_in_the_compute_dtype() {
    let m = preset("llama-3.1-8b");
    let (matrices, vectors) = matrices_and_vectors(&m);
    let adapters = 6_815_744;
    for (compute, cb) in [(Compute::F32, 4), (Compute::Bf16, 2)] {
        let base = matrices / 256 * 144 + vectors * cb;
        let plan =
            crate::model::gguf::plan_config(&m, candle_core::quantized::GgmlDType::Q4K).unwrap();
        let dtype = Precision::Q4k.dtypes(compute).1;
        assert_eq!(crate::model::gguf::plan_bytes(&plan, dtype), base);
        let e = estimate(
            &m,
            &Query {
                mode: Mode::Train,
                precision: Precision::Q4k,
                compute,
                weight_bytes: Some(base),
                trainable: Trainable::Lora(16),
                optimizer: Optimizer::Adamw,
                runtime: Runtime::Candle,
                ..q()
            },
            None,
        );
        assert_eq!(e.weights, base + adapters * cb, "{compute}");
        assert_eq!(e.gradients, adapters * cb, "{compute}");
        assert_eq!(e.optimizer, 2 * adapters * cb, "{compute}");
        assert_eq!(e.weight_copies, 0);
    }
}

/// QLoRA (`qlora-r16`) on Llama-3.1-8B: the 224 linears of the layers in NF4 with double
/// quantization, by bitsandbytes' rule per matrix of n weights (n/2 packed, a 64 B code
/// table, a byte per 64-block, an f32 offset, an f32 per 256 blocks and a 1 KiB map), the
/// embedding, head and norms in bf16, the rank-16 adapters (6,815,744, PEFT's count) in bf16
/// with their gradients and AdamW's bf16 moments, and the dequantization buffer of the
/// largest matrix (14,336 × 4,096) in bf16.
#[test]
fn qlora_nf4_base_and_adapter_states() {
    let m = preset("llama-3.1-8b");
    let nf4 = |n: u64| n / 2 + 64 + n / 64 + 4 + (n / 64).div_ceil(256) * 4 + 1024;
    let (sq, kv, mlp) = (4096 * 4096, 1024 * 4096, 14_336 * 4096);
    let base = 32 * (2 * nf4(sq) + 2 * nf4(kv) + 3 * nf4(mlp));
    let dense = (2 * 128_256 * 4096 + 32 * 2 * 4096 + 4096) * 2;
    let adapters = 6_815_744;
    let t = Query {
        mode: Mode::Train,
        trainable: Trainable::Qlora(16),
        optimizer_impl: OptimizerImpl::Fused,
        context: 512,
        ..q()
    };
    let e = estimate(&m, &t, None);
    assert_eq!(e.weights, base + dense + adapters * 2);
    assert_eq!(e.optimizer, adapters * 2 * 2);
    assert_eq!(e.dequant, mlp * 2);
    let states = super::model_states(m.param_count(), adapters, adapters, None, &t).unwrap();
    assert_eq!(states.gradients, adapters * 2);
    // The same base as the query carries it from `estimate`'s flags.
    let k = crate::model::quant::Checkpoint::qlora();
    assert_eq!(
        t.with_checkpoint(&m, &k).unwrap().weight_bytes,
        Some(base + dense)
    );
}

/// bitsandbytes' optimizers on the same adapters: AdamW8bit keeps two bytes an element and
/// an f32 absmax per 256 for both moments (every adapter here has 4,096 elements or more:
/// A 16 × 4,096, B 4,096 × 16 and 1,024 × 16), plus the two shared 1 KiB maps; PagedAdamW
/// keeps f32 moments whatever the parameter's dtype (8 B an element).
#[test]
fn eight_bit_and_paged_adamw_state() {
    let m = preset("llama-3.1-8b");
    let adapters: u64 = 6_815_744;
    let blocks_per_layer = (3 * 65_536 + 16_384) / 256;
    let at = |optimizer| {
        estimate(
            &m,
            &Query {
                mode: Mode::Train,
                trainable: Trainable::Qlora(16),
                optimizer,
                context: 512,
                ..q()
            },
            None,
        )
    };
    let e = at(Optimizer::Adamw8bit);
    assert_eq!(
        e.optimizer,
        2 * adapters + 32 * 2 * blocks_per_layer * 4 + 2048
    );
    assert_eq!(e.step_transient, 0);
    assert_eq!(at(Optimizer::PagedAdamw8bit).optimizer, e.optimizer);
    assert_eq!(at(Optimizer::PagedAdamw).optimizer, 8 * adapters);
    // Full training of SmolLM2-135M: its 61 norms of 576 stay 32-bit (under
    // `min_8bit_size`); every matrix is whole 256-blocks.
    let m = preset("smollm2-135m");
    let norms = 61 * 576;
    let matrices = m.param_count() - norms;
    let full = estimate(
        &m,
        &Query {
            mode: Mode::Train,
            optimizer: Optimizer::Adamw8bit,
            ..q()
        },
        None,
    );
    assert_eq!(
        full.optimizer,
        2 * matrices + 2 * (matrices / 256) * 4 + 8 * norms + 2048
    );
}

/// FSDP's CPU offload moves each rank's shards of weights, gradients and optimizer state to
/// the host, byte for byte (the ZeRO layout of mixed precision: 2 + 2 + 12 B per parameter
/// over N), and with them the optimizer step; what the units all-gather, the activations
/// and the logits stay on the GPU.
#[test]
fn cpu_offload_moves_the_shards_and_the_step_to_the_host() {
    let m = preset("smollm2-135m");
    let params = feat::counts(&m, Trainable::Full).unwrap().params;
    let run = |offload| {
        estimate(
            &m,
            &Query {
                mode: Mode::Train,
                precision: Precision::MixedBf16,
                gpus: 4,
                sharding: Sharding::Fsdp,
                offload,
                ..q()
            },
            None,
        )
    };
    let (on, off) = (run(true), run(false));
    assert_eq!(on.host_offloaded, (params * 16).div_ceil(4));
    assert_eq!(
        on.host_offloaded,
        off.weights + off.weight_copies + off.gradients + off.optimizer
    );
    assert_eq!(off.host_offloaded, 0);
    for b in [
        on.weights,
        on.weight_copies,
        on.gradients,
        on.optimizer,
        on.step_transient,
    ] {
        assert_eq!(b, 0);
    }
    assert_eq!(
        (on.gathered, on.activations, on.logits),
        (off.gathered, off.activations, off.logits)
    );
}

#[test]
fn korthikanti_activations() {
    let m = preset("llama-3.1-8b");
    // candle (torch counts transformers' own layer: the next test).
    let t = Query {
        mode: Mode::Train,
        batch: 2,
        context: 1024,
        runtime: Runtime::Candle,
        ..q()
    };
    // 16-bit, flash: L · 34 · s · b · h
    assert_eq!(
        estimate(&m, &t, None).activations,
        32 * 34 * 1024 * 2 * 4096
    );
    let eager = Query {
        attention: Attention::Eager,
        ..t
    };
    let per_layer = 34 * 1024 * 2 * 4096 + 5 * 32 * 1024 * 1024 * 2;
    assert_eq!(estimate(&m, &eager, None).activations, 32 * per_layer);
    let ck = Query {
        checkpointing: Checkpointing::Layer,
        ..t
    };
    assert_eq!(
        estimate(&m, &ck, None).activations,
        32 * 1024 * 2 * 4096 * 2 + 34 * 1024 * 2 * 4096
    );
}

/// transformers' llama layer, in closed form per token (e = 2, flash, no mask): two norms
/// 2·(4h + 4 + 2h) and their outputs 2·2h, attention 2·(2q + 2kv) + 4a, MLP 4·2I; with
/// LoRA the casts, the post-attention norm's output and the product go, and two adapters
/// add 2·r·2. Qwen3 adds its q and k norms: 6q + 4a + 6kv + 4·kv_heads.
#[test]
fn transformers_layer_activations() {
    let m = preset("llama-3.1-8b");
    let (h, qd, kv, a, i) = (4096u64, 4096u64, 1024u64, 32u64, 14_336u64);
    let per = |lora| crate::model::saved::llama_saved_per_token(&m, 2, lora);
    assert_eq!(per(None), 20 * h + 8 + 4 * kv + 4 * a + 8 * i);
    assert_eq!(
        per(Some(16)),
        8 * h + 8 + 2 * h + 4 * qd + 4 * kv + 4 * a + 6 * i + 4 * 16
    );
    let t = Query {
        mode: Mode::Train,
        batch: 8,
        context: 1024,
        optimizer_impl: OptimizerImpl::Fused,
        ..q()
    };
    let tokens = 8 * 1024;
    // Outside the layers: ids and labels, the final norm with its cast and output.
    let outside = 16 + 4 * h + 4 + 2 * h + 2 * h;
    assert_eq!(
        estimate(&m, &t, None).activations,
        (32 * per(None) + outside) * tokens
    );
    let qwen3 = preset("qwen3-0.6b");
    let (h, qd, kv, a, i, kvh) = (1024u64, 2048u64, 1024u64, 16u64, 3072u64, 8u64);
    assert_eq!(
        crate::model::saved::llama_saved_per_token(&qwen3, 2, None),
        16 * h + 8 + 4 * qd + 4 * kv + 4 * a + 8 * i + 6 * qd + 4 * a + 6 * kv + 4 * kvh
    );
}

/// transformers' GPT-2-shaped layer per token (e = 2, SDPA, dropout 0.1): two LayerNorms
/// 2·(2h + 8) and the projections' inputs after them 2·2h, the fused `c_attn` output
/// 2·(q + 2kv), the log-sum-exp 4a, the attention output 2q, two dropout masks 2h, and the
/// MLP: StarCoder's one-op GELU keeps its input and `c_proj`'s (2·2I), GPT-2's `gelu_new`
/// four tensors and `c_proj`'s (5·2I).
#[test]
fn transformers_gpt2_layer_activations() {
    let per = |name: &str| {
        let m = preset(name);
        m.architecture.torch_saved_per_token(&m, 2, None).unwrap()
    };
    let (h, q, kv, a, i) = (2048u64, 2048u64, 128u64, 16u64, 8192u64);
    let layer = 2 * (2 * h + 8) + 4 * h + 2 * (q + 2 * kv) + 4 * a + 2 * q + 2 * h;
    assert_eq!(
        per("starcoderbase-1b"),
        (layer + 4 * i, h + (2 * h + 8) + 2 * h)
    );
    let (h, q, kv, a, i) = (768u64, 768u64, 768u64, 12u64, 3072u64);
    let layer = 2 * (2 * h + 8) + 4 * h + 2 * (q + 2 * kv) + 4 * a + 2 * q + 2 * h;
    assert_eq!(per("gpt2"), (layer + 10 * i, h + (2 * h + 8) + 2 * h));
    // LoRA: not counted here (Korthikanti's count).
    let m = preset("gpt2");
    assert_eq!(m.architecture.torch_saved_per_token(&m, 2, Some(16)), None);
}

#[test]
fn the_lm_head_row_is_the_losss_backward_on_torch_and_the_logits_on_candle() {
    // Llama-3.1-8B, 16-bit, flash, batch 16 × 1024 tokens: N = b·s·V logits. Fused AdamW
    // (no transient): the loss's backward is the peak, checkpointed too.
    let m = preset("llama-3.1-8b");
    let (b, s, h, layers) = (16u64, 1024u64, 4096u64, 32u64);
    let n = b * s * 128_256;
    let t = Query {
        mode: Mode::Train,
        batch: b,
        context: s,
        optimizer_impl: OptimizerImpl::Fused,
        ..q()
    };
    let on = |runtime, checkpointing| {
        estimate(
            &m,
            &Query {
                runtime,
                checkpointing,
                ..t
            },
            None,
        )
    };
    // candle: the 16-bit logits and their f32 log-softmax.
    assert_eq!(on(Runtime::Candle, Checkpointing::None).logits, n * (2 + 4));
    // torch: three f32 tensors per logit at the loss's backward, beside every activation.
    assert_eq!(on(Runtime::Torch, Checkpointing::None).logits, n * 12);
    // Checkpointed: the layer inputs are live at both moments, and the peak is the larger
    // of the loss's backward and one recomputed layer (transformers' count), beside the
    // ids, labels and final norm.
    let ck = on(Runtime::Torch, Checkpointing::Layer);
    let sbh = s * b * h;
    let layer = crate::model::saved::llama_saved_per_token(&m, 2, None) * b * s;
    let outside = (16 + 8 * h + 4) * b * s;
    assert_eq!(
        ck.activations + ck.logits,
        layers * 2 * sbh + outside + (12 * n).max(layer)
    );
}

#[test]
fn a_training_peak_is_the_larger_of_backward_and_optimizer_step() {
    let m = preset("llama-3.1-8b");
    let t = Query {
        mode: Mode::Train,
        precision: Precision::MixedBf16,
        batch: 1,
        context: 128,
        ..q()
    };
    let at = |runtime, optimizer_impl| {
        estimate(
            &m,
            &Query {
                runtime,
                optimizer_impl,
                ..t
            },
            None,
        )
    };
    // On torch the step's moment is the peak here: f32 weights, gradients and moments
    // (4 + 4 + 8 B per parameter) and the transient; the activations and the 16-bit
    // weight copies are freed by then.
    let params = m.param_count();
    let fused = at(Runtime::Torch, OptimizerImpl::Fused);
    assert_eq!(fused.step_transient, 0);
    assert_eq!(
        (fused.activations, fused.logits, fused.weight_copies),
        (0, 0, 0)
    );
    let tensors = |e: &Breakdown| e.allocated().unwrap() - e.cublas_workspace;
    assert_eq!(tensors(&fused), 16 * params);
    // foreach: `_foreach_sqrt(v)` over every f32 parameter at once.
    let foreach = at(Runtime::Torch, OptimizerImpl::Foreach);
    assert_eq!(foreach.step_transient, 4 * params);
    assert_eq!(tensors(&foreach), 20 * params);
    // candle-nn: ≈ 14 × the largest tensor (the 128256 × 4096 embedding, f32), over
    // candle's own backward (no autocast: all activations in the compute dtype).
    let candle = at(Runtime::Candle, OptimizerImpl::Foreach);
    assert_eq!(
        candle.step_transient,
        (14 * 128_256 * 4096 * 4u64).saturating_sub(candle.activations + candle.logits)
    );
    // At a long context the loss's backward dominates: no gradient yet, no transient, the
    // 16-bit copies held beside the activations.
    let long = estimate(
        &m,
        &Query {
            context: 65_536,
            ..t
        },
        None,
    );
    assert_eq!((long.step_transient, long.gradients), (0, 0));
    assert_eq!(long.weight_copies, 2 * params);
    assert_eq!(
        tensors(&long),
        (4 + 2 + 8) * params + long.activations + long.logits
    );
}
