//! The analytic training estimate: model states under data parallelism and the ZeRO stages,
//! activations as transformers' own layer keeps them under torch (the llama family, GPT-2 and
//! StarCoder) or by
//! Korthikanti et al. (with autocast's extra), logits, the optimizer step's transient, the
//! training step's two moments (the loss's backward and the optimizer step), and the features
//! of a training point.
mod fsdp;

use super::device::device_terms;
use super::{Attention, Breakdown, Optimizer, Overflow, Query, Runtime, Sharding};
use crate::checked::Checked;
use crate::features::{self as feat, Features, TrainShape};
use crate::model::Config;
use crate::record::Phase;
use crate::vocab::{Checkpointing, Trainable};
pub use fsdp::fsdp_gathered;
use fsdp::fsdp_held_input_grads;

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
    let merged = crate::model::saved::lora_merged_experts(c, q.state_bytes(), q.lora_targets);
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
    // FSDP1 under transformers 4.x holds every layer's checkpointed input and its gradient to
    // the end of the backward (`fsdp_held_input_grads`): the backward's peak moves to the first
    // layer's, beside its MLP's three gradient buffers.
    let held = fsdp_held_input_grads(c, q, input);
    let activations = if q.checkpointing == Checkpointing::Layer {
        // Every layer's input, plus the one layer being recomputed.
        input * layers + per_layer + held
    } else {
        per_layer * layers
    } + outside
        + merged;
    let activations = activations.bytes("activations")?;
    let logits = lm_head_bytes(c, q, recompute + held)?;
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
    // `--lora-targets` other than peft's default, or `--lora-dropout`: the llama family's layer
    // on those targets (the CLI refuses them for the other families), with peft's f32 adapters
    // where the activations are 16-bit.
    let f32_adapters = q.peft_f32_adapters && q.act_bytes() < 4;
    let llama = !matches!(c.architecture.name(), "gpt2" | "gpt_bigcode" | "bert");
    let layer = match lora {
        Some(_) if llama && (f32_adapters || q.lora_dropout || !q.lora_targets.is_default()) => {
            crate::model::saved::llama_saved_per_token_in(
                c,
                q.act_bytes(),
                lora,
                q.lora_targets,
                f32_adapters,
                q.lora_dropout,
            )
        }
        _ => layer,
    };
    Some((layer, 16 + outside))
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
        Runtime::Torch | Runtime::Vllm => Ok((n * 12u64)
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
        targets: q.lora_targets,
    };
    feat::train(c, &shape, Phase::StepTotal)
}

#[cfg(test)]
mod lora_tests;
#[cfg(test)]
mod tests;
