//! The training estimate's LoRA terms under PyTorch (peft), beside `tests.rs`.
use super::*;
use crate::estimate::test_support::{estimate, preset, q};
use crate::estimate::Mode;

/// peft's `lora_dropout` per token and layer of Mistral-7B (h = q = 4096, I = 14336, e = 2),
/// by the rule measured with saved-tensor hooks on the emulated GPU (one layer, each target
/// alone and together, peft 0.11 and 0.21): every adapter keeps a 1-byte mask of its input;
/// 16-bit adapters also keep their own dropout output (e·in), and the inputs only they saved go
/// (the input norm's output for q/k/v, the post-attention norm's for gate/up, the product for
/// down), while o's input stays (the attention saves it). In a query: once a layer, and with
/// checkpointing only in the recomputed layer.
#[test]
fn lora_dropout_keeps_masks_and_16_bit_outputs() {
    use crate::vocab::LoraTargets;
    let m = preset("mistral-7b-v0.1");
    let (h, i) = (4096u64, 14_336u64);
    let per = |t: &str, f32_adapters: bool, dropout: bool| {
        crate::model::saved::llama_saved_per_token_in(
            &m,
            2,
            Some(16),
            t.parse::<LoraTargets>().unwrap(),
            f32_adapters,
            dropout,
        )
    };
    let delta = |t: &str, f32_adapters| per(t, f32_adapters, true) - per(t, f32_adapters, false);
    // f32 adapters (peft >= 0.12): the masks alone.
    assert_eq!(delta("peft", true), 2 * h);
    assert_eq!(delta("attention", true), 4 * h);
    assert_eq!(delta("all-linear", true), 6 * h + i);
    // 16-bit adapters (peft 0.11): 3 B per input element each, less the inputs freed.
    assert_eq!(delta("peft", false), 2 * 3 * h - 2 * h);
    assert_eq!(delta("attention", false), 4 * 3 * h - 2 * h);
    assert_eq!(delta("o", false), 3 * h);
    assert_eq!(delta("gate", false), 3 * h - 2 * h);
    assert_eq!(delta("down", false), 3 * i - 2 * i);
    assert_eq!(
        delta("all-linear", false),
        6 * 3 * h + 3 * i - 2 * h - 2 * h - 2 * i
    );
    // A query: every layer holds it without checkpointing, the recomputed layer alone with.
    let tokens = 2 * 512;
    let lora = |checkpointing, dropout| Query {
        mode: Mode::Train,
        batch: 2,
        context: 512,
        trainable: crate::vocab::Trainable::Lora(16),
        lora_targets: "attention".parse().unwrap(),
        peft_f32_adapters: false,
        lora_dropout: dropout,
        checkpointing,
        ..q()
    };
    let acts = |c, d| estimate(&m, &lora(c, d), None).activations;
    let none = crate::vocab::Checkpointing::None;
    assert_eq!(
        acts(none, true) - acts(none, false),
        32 * delta("attention", false) * tokens
    );
    let layer = crate::vocab::Checkpointing::Layer;
    assert_eq!(
        acts(layer, true) - acts(layer, false),
        delta("attention", false) * tokens
    );
}
