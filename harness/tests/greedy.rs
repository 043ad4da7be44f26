//! The llama implementation is right: greedy decoding of real SmolLM2 weights (GGUF,
//! dequantized, q/k un-permuted) continues a fixed prompt with a fixed, sensible text.
mod common;
use vramlab::model::{gguf, Source};
use vramlab::scenario::spec::{Attention, Kernels, Ops};
use vramlab::scenario::Precision;
use vramlab::vocab::{Compute, QMatmul};

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
    let mut model = vramlab::cmd::decode::load(
        &Source::Gguf(path.clone()),
        precision,
        Compute::F32,
        QMatmul::Auto,
    )
    .unwrap();
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

/// Greedy tokens of the quantized model (weights kept in QTensors, products through QMatMul)
/// in `compute`, with a KV cache of kind `kv`.
fn quantized_tokens(
    precision: Precision,
    compute: Compute,
    kv: vramlab::model::KvKind,
) -> Vec<u32> {
    quantized_tokens_via(precision, compute, QMatmul::Auto, kv)
}

/// [`quantized_tokens`] with the products run by `qmatmul`.
fn quantized_tokens_via(
    precision: Precision,
    compute: Compute,
    qmatmul: QMatmul,
    kv: vramlab::model::KvKind,
) -> Vec<u32> {
    let path = common::smollm2_gguf();
    let model =
        vramlab::cmd::decode::load(&Source::Gguf(path), precision, compute, qmatmul).unwrap();
    vramlab::workload::inference::generate_with(
        model.as_ref(),
        &[504u32, 3575, 282, 4649, 314],
        6,
        kv,
    )
    .unwrap()
}

/// The Q4_1 file's own blocks, f32 compute: the same " Paris.\n\nThe answer" as the dequantized
/// model, with both KV caches (candle quantizes the activations to Q8_1 blocks for the dot
/// products, which moves logits slightly but not these argmaxes).
#[test]
fn smollm2_greedy_native_f32_both_kv_kinds() {
    use vramlab::model::KvKind;
    for kv in [KvKind::Preallocated, KvKind::Growing] {
        assert_eq!(
            quantized_tokens(Precision::Native, Compute::F32, kv),
            [7042, 30, 198, 198, 504, 2988],
            "{kv:?}"
        );
    }
}

/// `qmatmul = dequantize`: each product dequantizes the Q4_1 blocks to f32 and multiplies
/// densely (no Q8_1 activations), which is the dense f32 model of the same weights: its
/// tokens are the dense f32 run's.
#[test]
fn smollm2_greedy_native_dequantize_f32() {
    assert_eq!(
        quantized_tokens_via(
            Precision::Native,
            Compute::F32,
            QMatmul::Dequantize,
            vramlab::model::KvKind::Preallocated
        ),
        [7042, 30, 198, 198, 504, 2988]
    );
}

/// bf16 compute on the Q4_1 blocks: " Paris.\n\nThe United" (the sixth argmax changes), the
/// same on every run and with both KV caches.
#[test]
fn smollm2_greedy_native_bf16_is_deterministic() {
    use vramlab::model::KvKind;
    let expected = [7042u32, 30, 198, 198, 504, 1797];
    let path = common::smollm2_gguf();
    let vocab = gguf::vocab(&path).unwrap();
    assert_eq!(decode(&vocab, &expected), " Paris.\n\nThe United");
    for kv in [KvKind::Preallocated, KvKind::Growing, KvKind::Preallocated] {
        assert_eq!(
            quantized_tokens(Precision::Native, Compute::Bf16, kv),
            expected,
            "{kv:?}"
        );
    }
}

/// Re-quantized to Q8_0 (f32 compute): still " Paris.\n\nThe answer".
#[test]
fn smollm2_greedy_q8_0() {
    assert_eq!(
        quantized_tokens(
            Precision::Q8_0,
            Compute::F32,
            vramlab::model::KvKind::Growing
        ),
        [7042, 30, 198, 198, 504, 2988]
    );
}
