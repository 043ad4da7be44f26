//! The llama implementation is right: greedy decoding of real SmolLM2 weights (GGUF,
//! dequantized, q/k un-permuted) continues a fixed prompt with a fixed, sensible text.
mod common;
use vramlab::model::{gguf, Source};
use vramlab::scenario::spec::{Attention, Kernels, Ops};
use vramlab::scenario::Precision;
use vramlab::vocab::Compute;

fn decode(vocab: &[String], ids: &[u32]) -> String {
    ids.iter()
        .map(|&t| vocab[t as usize].as_str())
        .collect::<String>()
        .replace('Ġ', " ")
        .replace('Ċ', "\n")
}

fn check(precision: Precision) {
    check_with(precision, Ops::default());
}

/// The same tokens with vramlab-kernels: flash attention in the prefill (and decode), and
/// the fused norms, RoPE and SwiGLU.
fn check_with(precision: Precision, ops: Ops) {
    let path = common::smollm2_gguf();
    let vocab = gguf::vocab(&path).unwrap();
    // "The capital of France is" in SmolLM2's vocabulary.
    let prompt = [504u32, 3575, 282, 4649, 314];
    assert_eq!(decode(&vocab, &prompt), "The capital of France is");
    let mut model =
        vramlab::cmd::generate::load(&Source::Gguf(path.clone()), precision, Compute::F32).unwrap();
    model.set_ops(ops).unwrap();
    let out = vramlab::workload::inference::generate(model.as_ref(), &prompt, 6).unwrap();
    let text = decode(&vocab, &out);
    assert_eq!(
        out,
        [7042, 30, 198, 198, 504, 2988],
        "{precision:?} {ops:?}: got {text:?}, expected \" Paris.\\n\\nThe answer\""
    );
    assert_eq!(text, " Paris.\n\nThe answer");
}

#[test]
fn smollm2_greedy_f32() {
    check(Precision::F32);
}

#[test]
fn smollm2_greedy_bf16() {
    check(Precision::Bf16);
}

#[test]
fn smollm2_greedy_flash_f32() {
    let flash = Ops {
        attention: Attention::Flash,
        ..Ops::default()
    };
    check_with(Precision::F32, flash);
    check_with(
        Precision::F32,
        Ops {
            kernels: Kernels::Fused,
            ..flash
        },
    );
}

#[test]
fn smollm2_greedy_flash_bf16() {
    check_with(
        Precision::Bf16,
        Ops {
            attention: Attention::Flash,
            ..Ops::default()
        },
    );
}
