//! What FSDP holds on each rank beyond its shards: the units it gathers, and, under
//! transformers 4.x with LoRA and checkpointing, the layers' inputs and their gradients.
use super::super::{Query, Runtime, Sharding};
use crate::checked::Checked;
use crate::estimate::Overflow;
use crate::features as feat;
use crate::model::Config;
use crate::vocab::{Checkpointing, Trainable};

/// What FSDP (full shard over `gpus` > 1) holds beyond the activations when LoRA trains with
/// checkpointing under transformers 4.x (the torch-2.2 stack), a hold measured on the emulated
/// GPU (`vramlab validate`'s fms-acceleration LoRA rows on two GPUs, matched to the byte there):
/// peft's wrap policy leaves each decoder layer an FSDP unit of frozen weights only, for which
/// FSDP1 registers its reshard hook (`_register_post_backward_reshard_only_hook`, through
/// `register_multi_grad_hook`) on the unit's inputs. transformers 4.x checkpoints the layer's
/// `__call__`, so those inputs are the reentrant recompute's detached leaves, and the hook's
/// closure keeps their `AccumulateGrad` nodes, hence each input and the gradient the backward
/// accumulates into it, until `_finalize_params` at the end of the backward. The peak is then
/// the first layer's backward: every layer's input, `layers − 1` input gradients, the layer
/// recomputed and its MLP's three gradient buffers of `intermediate` elements. transformers 5
/// checkpoints `forward` inside the unit (`modeling_layers.py`), and the hook then holds only
/// the embedding output: no term (the default stack, measured the same way). `input` is one
/// layer's checkpointed input.
pub(super) fn fsdp_held_input_grads(c: &Config, q: &Query, input: Checked) -> Checked {
    let lora = matches!(q.trainable, Trainable::Lora(_) | Trainable::Qlora(_));
    // FSDP's own hooks: DeepSpeed's ZeRO-3 (`--sharding zero3`) hooks modules its own way,
    // and was not measured.
    let fsdp = q.gpus > 1 && q.sharding == Sharding::Fsdp;
    if !(lora
        && fsdp
        && q.runtime == Runtime::Torch
        && q.checkpointing == Checkpointing::Layer
        && q.stack.transformers_major() < 5)
    {
        return Checked::ZERO;
    }
    let mlp_grads =
        Checked::from(q.batch) * q.context * c.intermediate_size as u64 * 3u64 * q.act_bytes();
    input * (c.num_layers.saturating_sub(1) as u64) + mlp_grads
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::{estimate, preset, q};
    use crate::estimate::{Mode, Precision};

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

    /// FSDP's held inputs and gradients under transformers 4.x: LoRA with checkpointing on 2
    /// GPUs adds `layers − 1` layer inputs and three MLP gradients of `intermediate` elements
    /// per token to the activations, and the loss's row shrinks by as much (the peak is the
    /// first layer's backward now); nothing on the default stack (transformers 5), on one GPU,
    /// without checkpointing, for full training, or under DeepSpeed's ZeRO-3.
    #[test]
    fn fsdp_holds_lora_input_gradients_under_transformers_4() {
        let m = preset("mistral-7b-v0.1");
        let (b, s) = (4u64, 4096u64);
        let on = |sharding, stack, gpus, checkpointing, trainable| {
            estimate(
                &m,
                &Query {
                    mode: Mode::Train,
                    precision: Precision::F16,
                    trainable,
                    gpus,
                    sharding,
                    checkpointing,
                    batch: b,
                    context: s,
                    runtime: Runtime::Torch,
                    stack,
                    ..q()
                },
                None,
            )
        };
        let at = |stack, gpus, checkpointing, trainable| {
            on(Sharding::Fsdp, stack, gpus, checkpointing, trainable)
        };
        let (old, new) = (crate::vocab::Stack::Torch22, crate::vocab::Stack::Default);
        let (ck, lora) = (Checkpointing::Layer, Trainable::Lora(16));
        let held = at(old, 2, ck, lora);
        let plain = at(new, 2, ck, lora);
        let (h, l, i) = (4096u64, 32u64, 14_336u64);
        let want = b * s * ((l - 1) * h * 2 + 3 * i * 2);
        assert_eq!(held.activations - plain.activations, want);
        // The loss's row is what it holds beyond the recomputed layer and the held tensors: at
        // 4 × 4,096 tokens of a 32,000 vocabulary, less than them (no row).
        assert_eq!(held.logits, 0);
        assert!(plain.logits > 0);
        for (stack, gpus, checkpointing, trainable) in [
            (new, 2, ck, lora),
            (old, 1, ck, lora),
            (old, 2, Checkpointing::None, lora),
            (old, 2, ck, Trainable::Full),
        ] {
            let e = at(stack, gpus, checkpointing, trainable);
            let base = at(new, gpus, checkpointing, trainable);
            assert_eq!(
                e.activations, base.activations,
                "{stack:?} {gpus} {checkpointing:?} {trainable:?}"
            );
        }
        // DeepSpeed's ZeRO-3 hooks modules its own way (not measured): nothing held.
        let zero3 = |stack| on(Sharding::Zero3, stack, 2, ck, lora).activations;
        assert_eq!(zero3(old), zero3(new));
    }
}
