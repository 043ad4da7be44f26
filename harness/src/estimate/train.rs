//! The analytic training estimate: model states under data parallelism and the ZeRO stages,
//! activations as transformers' own layer keeps them under torch (the llama family, GPT-2 and
//! StarCoder) or by
//! Korthikanti et al. (with autocast's extra), logits, the optimizer step's transient, the
//! training step's two moments (the loss's backward and the optimizer step), and the features
//! of a training point.
use super::device::device_terms;
use super::{Attention, Breakdown, Optimizer, Overflow, Query, Runtime, Sharding};
use crate::checked::Checked;
use crate::features::{self as feat, Features, TrainShape};
use crate::model::Config;
use crate::record::Phase;
use crate::vocab::{Checkpointing, Trainable};

/// How much of a layer's activations the backward recomputes instead of keeping
/// (Korthikanti et al. §4–5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Everything the backward needs is kept.
    None,
    /// The attention core (scores, softmax, dropout) is recomputed: the 5·a·s/h term goes.
    Selective,
    /// Only each layer's input is kept (2·s·b·h at 16 bits); the layer is recomputed.
    Full,
}

/// Activation bytes one transformer layer keeps for the backward, per GPU, by Korthikanti et
/// al. ("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
/// Table 2) at 16-bit activations with 1-byte dropout masks: s·b·h·(10 + 24/t + 5·a·s/(h·t))
/// under `t`-way tensor parallelism, with the 10 (layer norms, their outputs and the two
/// dropout masks after attention and MLP, replicated across the tensor-parallel group) also
/// divided by `t` under sequence parallelism; selective recomputation drops the score term,
/// full recomputation keeps only the layer's input (2·s·b·h, divided by `t` under sequence
/// parallelism). `scores` is false when the attention kernel never materializes them (flash,
/// SDPA), which is the selective case. Other activation widths scale everything by
/// `act_bytes / 2` except the dropout masks, which are 1 byte (torch's bool) at any width:
/// the two masks of s·b·h bytes and, with the scores, the attention-probability mask of
/// a·s²·b bytes.
#[allow(clippy::too_many_arguments)] // the formula's own variables
pub fn layer_activations(
    c: &Config,
    batch: u64,
    seq: u64,
    act_bytes: u64,
    scores: bool,
    recompute: Recompute,
    tp: u64,
    sequence_parallel: bool,
) -> Checked {
    let (b, s, t) = (batch, seq, tp.max(1));
    let sbh = Checked::from(s) * b * c.hidden_size;
    let replicated = if sequence_parallel {
        sbh * 10u64 / t
    } else {
        sbh * 10u64
    };
    let masks = if sequence_parallel {
        sbh * 2u64 / t
    } else {
        sbh * 2u64
    };
    let score = |per_elem: u64| {
        if scores {
            Checked::new(per_elem) * c.num_heads * s * s * b / t
        } else {
            Checked::ZERO
        }
    };
    // (16-bit bytes, of which 1-byte masks)
    let (at16, mask_bytes) = match recompute {
        Recompute::Full => (
            sbh * 2u64 / if sequence_parallel { t } else { 1 },
            Checked::ZERO,
        ),
        Recompute::Selective => (replicated + sbh * 24u64 / t, masks),
        Recompute::None => (replicated + sbh * 24u64 / t + score(5), masks + score(1)),
    };
    at16.saturating_sub(mask_bytes) * act_bytes / 2 + mask_bytes
}

/// What torch autocast (AMP: f32 weights, 16-bit compute) keeps per layer beyond
/// Korthikanti's all-16-bit accounting, following transformers' layer code: the residual
/// stream stays f32 (the weights and embeddings are f32), so both layer norms save f32 inputs
/// (+2·s·b·h each); softmax is on autocast's float32 list, so the saved attention
/// probabilities are f32 (+2·a·s²·b) when the scores are materialized; and autocast casts a
/// non-leaf input afresh for every matmul (its cast cache holds only leaf weights), so
/// separate q, k and v projections save three 16-bit copies of their input, two more than the
/// formula's one (+4·s·b·h; none with a fused qkv projection).
fn autocast_extra(c: &Config, b: u64, s: u64, scores: bool) -> Checked {
    let sbh = Checked::from(s) * b * c.hidden_size;
    let norms = sbh * 4u64;
    let casts = if c.fused_qkv {
        Checked::ZERO
    } else {
        sbh * 4u64
    };
    let softmax = if scores {
        Checked::new(2) * c.num_heads * s * s * b
    } else {
        Checked::ZERO
    };
    norms + casts + softmax
}

/// Per-GPU model states (weights, 16-bit weight copies, gradients, optimizer state) of
/// training `t` of `p` parameters (`adapters` of them LoRA adapters outside `p`), following the
/// ZeRO paper (Rajbhandari et al., arXiv:1910.02054, §3 and Figure 1). Under data parallelism
/// (DDP) mixed precision is torch AMP's layout: f32 weights, f32 gradients and f32 Adam
/// moments (4 + 4 + 8 B per parameter) plus autocast's 16-bit copies of the weights. Under a
/// ZeRO stage it is DeepSpeed's: 16-bit weights and gradients (2 + 2 B) and an optimizer state
/// of K = 12 B (f32 master weights and both moments); stage 1 shards the optimizer state,
/// stage 2 also the gradients, stage 3 (= FSDP) also the weights, each over `gpus`.
/// `bnb_state`: a bitsandbytes optimizer's whole state (`optimizer::bitsandbytes_state`, per
/// tensor), in place of the moments' bytes per parameter.
pub fn model_states(
    p: u64,
    t: u64,
    adapters: u64,
    bnb_state: Option<u64>,
    q: &Query,
) -> Result<Breakdown, Overflow> {
    let n = q.gpus.max(1);
    let shard = |bytes: Checked, sharded: bool, figure: &str| {
        if sharded { bytes.div_ceil(n) } else { bytes }.bytes(figure)
    };
    let (s1, s2, s3) = match q.sharding {
        Sharding::Ddp => (false, false, false),
        Sharding::Zero1 => (true, false, false),
        Sharding::Zero2 => (true, true, false),
        Sharding::Zero3 | Sharding::Fsdp => (true, true, true),
    };
    let zero_mixed = q.precision.is_mixed() && q.sharding != Sharding::Ddp;
    let wb = q.state_bytes();
    // Stored weight and gradient bytes per parameter: 16-bit under a ZeRO stage's mixed
    // precision, where the f32 master copy is part of the optimizer state.
    let (w, g) = if zero_mixed { (2u64, 2u64) } else { (wb, wb) };
    // Under a ZeRO stage's mixed precision the state also holds the f32 master weights.
    let master = if zero_mixed { wb } else { 0 };
    let opt_per_param = match q.optimizer {
        _ if bnb_state.is_some() => master,
        o if o.is_adamw() => 2 * wb + master,
        o if o.is_sgd() => master,
        _ => 0,
    };
    let (p, t) = (Checked::from(p), Checked::from(t));
    let opt = t * opt_per_param + bnb_state.unwrap_or(0);
    let grads = if q.optimizer.updates() {
        t * g
    } else {
        Checked::ZERO
    };
    // A quantized base (QLoRA) is its exact block bytes; the adapters are dense.
    let base = q.weight_bytes.map_or(p * w, Checked::from);
    let states = Breakdown {
        weights: shard(base + Checked::from(adapters) * w, s3, "weights")?,
        weight_copies: if q.precision.is_mixed() && !zero_mixed {
            shard(p * 2u64, s3, "weight copies")?
        } else {
            0
        },
        gradients: shard(grads, s2, "gradients")?,
        optimizer: shard(opt, s1, "optimizer state")?,
        ..Default::default()
    };
    if !q.offload {
        return Ok(states);
    }
    // FSDP's CPU offload: the shards (and so the optimizer step) live on the host; the GPU holds
    // only what each unit all-gathers for its compute, the `gathered` row.
    let host = [
        states.weights,
        states.weight_copies,
        states.gradients,
        states.optimizer,
    ]
    .into_iter()
    .map(Checked::from)
    .sum::<Checked>()
    .bytes("host-offloaded states")?;
    Ok(Breakdown {
        host_offloaded: host,
        ..Default::default()
    })
}

pub(super) fn analytic_train(c: &Config, q: &Query) -> Result<Breakdown, Overflow> {
    // All parameters, the updated ones (gradients and optimizer state follow them) and the
    // LoRA adapters.
    let counts = feat::counts_in(c, q.trainable, q.lora_targets)?;
    let feat::Counts {
        params: p,
        trainable: t,
        adapters,
        ..
    } = counts;
    let bnb = super::optimizer::bitsandbytes_state(c, q.trainable, q.lora_targets, q.optimizer)?;
    // QLoRA's base at bitsandbytes' NF4 bytes, where the query does not carry them already.
    let qlora;
    let q = match (q.trainable, q.weight_bytes) {
        (Trainable::Qlora(_), None) => {
            qlora = q
                .with_checkpoint(c, &crate::model::quant::Checkpoint::qlora())
                .expect("bitsandbytes 4-bit stores every shape");
            &qlora
        }
        _ => q,
    };
    let states = model_states(p, t, adapters, bnb, q)?;
    let (b, s) = (q.batch, q.context);
    let aw = q.act_bytes();
    let scores = q.attention == Attention::Eager;
    let layers = c.num_layers;
    // Mixed precision on torch: the torch probe runs checkpointed layers under autocast (torch's
    // own recomputation re-enters it), and otherwise the model on 16-bit casts of its f32
    // masters (`weight copies`), whose activations are the 16-bit ones: transformers' layer
    // count. Korthikanti's count takes autocast's extra in both cases (the HF Trainer's
    // `bf16=True` / `fp16=True`, as the published BERT rows ran).
    let amp = q.runtime == Runtime::Torch && q.precision.is_mixed();
    let autocast = amp && q.checkpointing == Checkpointing::Layer;
    let hf = if q.runtime == Runtime::Torch && !scores && !autocast {
        torch_saved(c, q)
    } else {
        None
    };
    let per_layer = match hf {
        Some((layer, _)) => Checked::from(layer) * b * s,
        None => {
            layer_activations(c, b, s, aw, scores, Recompute::None, 1, false)
                + if amp {
                    autocast_extra(c, b, s, scores)
                } else {
                    Checked::ZERO
                }
        }
    };
    let outside = hf.map_or(Checked::ZERO, |(_, outside)| Checked::from(outside) * b * s);
    // Under autocast the residual stream, and so each checkpointed layer input, is f32.
    let input = layer_activations(c, b, s, aw, scores, Recompute::Full, 1, false)
        * if amp { 2u64 } else { 1 };
    // The one layer being recomputed under checkpointing (none without).
    let recompute = if q.checkpointing == Checkpointing::Layer {
        per_layer
    } else {
        Checked::ZERO
    };
    // LoRA on the routed experts: peft's merged expert weights, each sparse layer's kept for
    // the backward (one layer's at a time under checkpointing, which recomputes them).
    let merged = crate::model::arch::lora_merged_experts(c, q.state_bytes(), q.lora_targets);
    let sparse = c.moe.as_ref().map_or(0, |m| {
        (0..c.num_layers).filter(|&i| m.is_sparse(i)).count() as u64
    });
    // And at the backward, one layer's gradient of them.
    let merged = Checked::from(merged)
        * if q.checkpointing == Checkpointing::Layer {
            2 * sparse.min(1)
        } else {
            sparse + sparse.min(1)
        };
    let activations = if q.checkpointing == Checkpointing::Layer {
        // Every layer's input, plus the one layer being recomputed.
        input * layers + per_layer
    } else {
        per_layer * layers
    } + outside
        + merged;
    let activations = activations.bytes("activations")?;
    let logits = lm_head_bytes(c, q, recompute)?;
    let gathered = fsdp_gathered(c, q, &counts)?;
    // The step's transient, over this GPU's share of the updated parameters.
    let transient = if states.optimizer == 0 {
        Checked::ZERO
    } else {
        let updated = if q.sharding == Sharding::Ddp {
            t
        } else {
            t.div_ceil(q.gpus.max(1))
        };
        step_transient(c, q, updated)?
    };
    // Under torch a training step has two moments. At the loss's backward the activations and
    // the loss's tensors are held, and no gradient yet: the previous step's
    // `zero_grad(set_to_none=True)` freed them. At the optimizer step the gradients and the
    // step's transient are held, and the activations and the 16-bit weight copies (autocast's,
    // or the casts a mixed-precision forward runs on) are freed. The peak is the larger, and
    // the rows are its own.
    let held = (Checked::from(activations) + logits + gathered).bytes("activations")?;
    let (transient, grads) = (
        transient.bytes("optimizer step transient")?,
        states.gradients,
    );
    // That holds where vramlab counts transformers' own layer (its backward starts at the loss,
    // whose tensors dwarf a layer's), on one GPU. Elsewhere every row is held at once, and the
    // transient beyond the activations: candle; layers counted by Korthikanti's formula; and
    // several GPUs, where DDP keeps its gradient buckets and FSDP's allocator holds far more
    // than its tensors (the fms Mistral-7B rows of `vramlab validate`: 18.7 GB over 36.8 GB
    // allocated), which the reserve does not model yet, so the sum stands in for it on the safe
    // side.
    let moments = hf.is_some() && !q.offload && q.gpus <= 1;
    let step_moment = (Checked::from(grads) + transient).bytes("gradients")?;
    let copies = states.weight_copies;
    let (states, activations, logits, gathered, step_transient) = if !moments {
        let step = transient.saturating_sub(held);
        (states, activations, logits, gathered, step)
    } else if held + copies >= step_moment {
        let states = Breakdown {
            gradients: 0,
            ..states
        };
        (states, activations, logits, gathered, 0)
    } else {
        let states = Breakdown {
            weight_copies: 0,
            ..states
        };
        (states, 0, 0, 0, transient)
    };
    Ok(Breakdown {
        activations,
        logits,
        gathered,
        step_transient,
        dequant: q.dequant_bytes,
        source: "analytic".into(),
        ..device_terms(q)
    }
    .with_states(&states))
}

/// What a transformers model keeps for the backward per token under PyTorch, where vramlab has
/// its layers' accounting (`Architecture::torch_saved_per_token`): (one decoder layer's bytes,
/// the bytes outside the layers, with the token ids and the labels, int64 each). The loss's own
/// tensors are the `logits` row.
fn torch_saved(c: &Config, q: &Query) -> Option<(u64, u64)> {
    let lora = q.trainable.lora_rank().map(u64::from);
    let (layer, outside) = c
        .architecture
        .torch_saved_per_token(c, q.act_bytes(), lora)?;
    // `--lora-targets` other than peft's default: the llama family's layer on those targets
    // (the CLI refuses them for the other families).
    // (the CLI refuses them for the other families), with peft's f32 adapters where the
    // activations are 16-bit.
    let f32_adapters = q.peft_f32_adapters && q.act_bytes() < 4;
    let llama = !matches!(c.architecture.name(), "gpt2" | "gpt_bigcode" | "bert");
    let layer = match lora {
        Some(_) if llama && (f32_adapters || !q.lora_targets.is_default()) => {
            crate::model::arch::llama_saved_per_token_in(
                c,
                q.act_bytes(),
                lora,
                q.lora_targets,
                f32_adapters,
            )
        }
        _ => layer,
    };
    Some((layer, 16 + outside))
}

/// What FSDP full shard (ZeRO-3 or FSDP over `gpus` > 1) holds unsharded on each rank at the
/// backward's peak, beyond the rank's shards, as FSDP2's `fully_shard` per decoder layer and at
/// the root runs it (docs/src/concepts/fit-and-estimate.md, "Several GPUs"):
/// - the root unit (every tensor outside the decoder layers: the embeddings, the final norm, an
///   untied head) all-gathered for the whole forward and backward (the root does not reshard
///   after its forward), and its gradient, unsharded until the reduce-scatter at the end;
/// - the decoder layer being computed and the next one, prefetched, all-gathered, and one
///   layer's unsharded gradient before its reduce-scatter.
///
/// Elements in the compute dtype (under mixed precision FSDP's MixedPrecisionPolicy gathers
/// 16-bit copies). Gradients follow the `trainable` (`t`) parameters: none for frozen ones,
/// and LoRA's adapters, a sliver of a layer, are left out.
pub fn fsdp_gathered(c: &Config, q: &Query, n: &feat::Counts) -> Result<u64, Overflow> {
    if q.gpus <= 1 || !matches!(q.sharding, Sharding::Zero3 | Sharding::Fsdp) {
        return Ok(0);
    }
    let root = Checked::from(n.outside_layers);
    let stack = Checked::from(n.params).saturating_sub(root);
    let layer = stack.div_ceil(c.num_layers.max(1) as u64);
    let t = Checked::from(n.trainable);
    // Trainable parameters outside the layers, and whether the layers' own are trained.
    let root_grad = t.saturating_sub(stack).min(root);
    let layer_grad = if stack.saturating_sub(t) == Checked::ZERO {
        layer
    } else {
        Checked::ZERO
    };
    let e = if q.precision.is_mixed() {
        2
    } else {
        q.state_bytes()
    };
    ((root + layer * 2u64 + root_grad + layer_grad) * e).bytes("FSDP gathered")
}

/// The LM head's share of a training peak (ARCHITECTURE.md §9). Encoders train through a pooled
/// head (a sequence classifier, or vramlab's pooled regression): no per-token logits.
/// - candle: the logits in the compute dtype and their f32 log-softmax, beside every activation.
/// - torch: transformers' causal-LM loss upcasts the logits to f32, and its backward holds three
///   f32 tensors per logit at once (log-softmax's saved output, its gradient and the gradient of
///   its input), beside every stored activation: 12 B per logit. The 16-bit logits are gone by
///   then (the model's output is dropped before `backward`). The layer that checkpointing
///   recomputes (`recompute`) is not live at that moment, since the loss's backward ends before
///   the first recomputation, so the row is what the loss holds beyond it: the peak is the larger
///   of the two moments, and the rows add up to it.
fn lm_head_bytes(c: &Config, q: &Query, recompute: Checked) -> Result<u64, Overflow> {
    if c.architecture.role() == crate::model::arch::Role::Encoder {
        return Ok(0);
    }
    let n = Checked::from(q.batch) * q.context * c.vocab_size;
    match q.runtime {
        Runtime::Candle => (n * (q.act_bytes() + 4)).bytes("logits"),
        Runtime::Torch => Ok((n * 12u64)
            .bytes("logits")?
            .saturating_sub(recompute.bytes("activations")?)),
    }
}

/// The AdamW step's transient bytes over `t` updated parameters (ARCHITECTURE.md §9): candle-nn's
/// about 14 × the largest tensor (measured on CPU, docs/src/results/cpu-train-smollm2-kernels.md);
/// torch foreach 1 × the parameter bytes (the `_foreach_sqrt` of v); for-loop one temporary of the
/// largest tensor; fused none, and bitsandbytes' optimizers none (one in-place kernel a tensor,
/// `optimizer::`). SGD keeps no state and has no transient here.
fn step_transient(c: &Config, q: &Query, t: u64) -> Result<Checked, Overflow> {
    let wb = q.state_bytes();
    let n = feat::counts_in(c, q.trainable, q.lora_targets)?;
    let largest = Checked::from(n.largest_tensor.min(t)) * wb;
    Ok(match q.runtime_optimizer() {
        Optimizer::Adamw => largest * 14u64,
        Optimizer::AdamwForeach => Checked::from(t) * wb,
        Optimizer::AdamwForLoop => largest,
        // In place, one kernel (vramlab-kernels' on candle, `fused=True` on torch); SGD
        // keeps no state.
        Optimizer::AdamwFused
        | Optimizer::Adamw8bit
        | Optimizer::PagedAdamw
        | Optimizer::PagedAdamw8bit
        | Optimizer::None
        | Optimizer::Sgd
        | Optimizer::SgdForeach
        | Optimizer::SgdForLoop
        | Optimizer::SgdFused => Checked::ZERO,
    })
}

/// Gradient bytes of a training query (unsharded: fits know one GPU).
pub fn grad_bytes(c: &Config, q: &Query) -> Result<u64, Overflow> {
    if !q.optimizer.updates() {
        Ok(0)
    } else {
        (Checked::from(feat::counts_in(c, q.trainable, q.lora_targets)?.trainable)
            * q.state_bytes())
        .bytes("gradients")
    }
}

/// Training features of the point (`features::train`, what `sweep` writes into the CSV).
pub fn train_features(c: &Config, q: &Query) -> Result<Features, Overflow> {
    let size = |v: u64| usize::try_from(v).map_err(|_| Overflow::new("activations"));
    let shape = TrainShape {
        batch: size(q.batch)?,
        seq: size(q.context)?,
        weight_bytes: size(q.state_bytes())?,
        compute_bytes: size(q.act_bytes())?,
        adamw: q.optimizer.is_adamw(),
        trainable: q.trainable,
    };
    feat::train(c, &shape, Phase::StepTotal)
}

#[cfg(test)]
mod tests {
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
            let plan = crate::model::gguf::plan_config(&m, candle_core::quantized::GgmlDType::Q4K)
                .unwrap();
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

    /// FSDP's unsharded copies on SmolLM2-135M (tied embedding): the root unit is the
    /// embedding and the final norm, 49,152 × 576 + 576; a layer is its four attention
    /// projections (9 query heads, 3 key-value heads of 64), three MLP matrices of 1,536 and two
    /// norms. Nothing on one GPU or under ZeRO-2; no root gradient with frozen embeddings; no
    /// gradient at all under LoRA; 16-bit copies under mixed precision.
    #[test]
    fn fsdp_gathered_is_the_root_unit_and_two_layers_with_their_gradients() {
        let m = preset("smollm2-135m");
        let root = 49_152 * 576 + 576;
        let layer = 2 * 576 * 576 + 2 * 192 * 576 + 3 * 1_536 * 576 + 2 * 576;
        let fsdp = |precision, trainable, gpus, sharding| {
            estimate(
                &m,
                &Query {
                    mode: Mode::Train,
                    precision,
                    trainable,
                    gpus,
                    sharding,
                    ..q()
                },
                None,
            )
            .gathered
        };
        let (f32, bf16) = (Precision::F32, Precision::Bf16);
        assert_eq!(
            fsdp(f32, Trainable::Full, 8, Sharding::Fsdp),
            (2 * root + 3 * layer) * 4
        );
        assert_eq!(
            fsdp(Precision::MixedBf16, Trainable::Full, 2, Sharding::Zero3),
            (2 * root + 3 * layer) * 2
        );
        assert_eq!(
            fsdp(bf16, Trainable::FrozenEmbeddings, 2, Sharding::Fsdp),
            (root + 576 + 3 * layer) * 2
        );
        assert_eq!(
            fsdp(bf16, Trainable::Lora(16), 2, Sharding::Fsdp),
            (root + 2 * layer) * 2
        );
        assert_eq!(fsdp(bf16, Trainable::Full, 1, Sharding::Fsdp), 0);
        assert_eq!(fsdp(bf16, Trainable::Full, 8, Sharding::Zero2), 0);
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
        let per = |lora| crate::model::arch::llama_saved_per_token(&m, 2, lora);
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
            crate::model::arch::llama_saved_per_token(&qwen3, 2, None),
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
        let layer = crate::model::arch::llama_saved_per_token(&m, 2, None) * b * s;
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
}
