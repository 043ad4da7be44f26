//! `vramlab estimate` on checkpoint formats as loaded (`quantization_config`), QLoRA and
//! bitsandbytes' optimizers, through the real binary: a published AWQ checkpoint's tensors to
//! the byte, the report's weights row and JSON format, and the flags each refuses in one line.
mod common;
use common::{named_u64, ok_stdout, one_line_exit_2, vramlab};
use serde_json::Value;

const AWQ: &str = "harness/tests/data/qwen2.5-0.5b-instruct-awq";

fn json(args: &[&str]) -> Value {
    let out = vramlab().arg("estimate").args(args).arg("--json").output();
    serde_json::from_slice(&ok_stdout(out.unwrap())).unwrap()
}

fn refused(args: &[&str], needle: &str) {
    one_line_exit_2(
        &vramlab().arg("estimate").args(args).output().unwrap(),
        needle,
    );
}

/// Qwen/Qwen2.5-0.5B-Instruct-AWQ (revision db09cd27ead7fee40cdee309693cf83601b9c899, its
/// `config.json` in harness/tests/data): the shapes and dtypes of layer 0's tensors as the
/// published `model.safetensors` stores them (int32 `qweight` and `qzeros`, f16 `scales`,
/// biases and norms). Every layer has these; outside the layers the f16 embedding (151,936 ×
/// 896, tied to the head) and the final norm. The estimate's weights are these bytes exactly.
#[test]
fn a_published_awq_checkpoint_to_the_byte() {
    let layer0: &[(&str, &[u64], u64)] = &[
        ("input_layernorm.weight", &[896], 2),
        ("mlp.down_proj.qweight", &[4864, 112], 4),
        ("mlp.down_proj.qzeros", &[38, 112], 4),
        ("mlp.down_proj.scales", &[38, 896], 2),
        ("mlp.gate_proj.qweight", &[896, 608], 4),
        ("mlp.gate_proj.qzeros", &[7, 608], 4),
        ("mlp.gate_proj.scales", &[7, 4864], 2),
        ("mlp.up_proj.qweight", &[896, 608], 4),
        ("mlp.up_proj.qzeros", &[7, 608], 4),
        ("mlp.up_proj.scales", &[7, 4864], 2),
        ("post_attention_layernorm.weight", &[896], 2),
        ("self_attn.k_proj.bias", &[128], 2),
        ("self_attn.k_proj.qweight", &[896, 16], 4),
        ("self_attn.k_proj.qzeros", &[7, 16], 4),
        ("self_attn.k_proj.scales", &[7, 128], 2),
        ("self_attn.o_proj.qweight", &[896, 112], 4),
        ("self_attn.o_proj.qzeros", &[7, 112], 4),
        ("self_attn.o_proj.scales", &[7, 896], 2),
        ("self_attn.q_proj.bias", &[896], 2),
        ("self_attn.q_proj.qweight", &[896, 112], 4),
        ("self_attn.q_proj.qzeros", &[7, 112], 4),
        ("self_attn.q_proj.scales", &[7, 896], 2),
        ("self_attn.v_proj.bias", &[128], 2),
        ("self_attn.v_proj.qweight", &[896, 16], 4),
        ("self_attn.v_proj.qzeros", &[7, 16], 4),
        ("self_attn.v_proj.scales", &[7, 128], 2),
    ];
    let layer: u64 = layer0
        .iter()
        .map(|(_, shape, b)| shape.iter().product::<u64>() * b)
        .sum();
    let published = 24 * layer + 151_936 * 896 * 2 + 896 * 2;
    let v = json(&["--model", AWQ, "--context", "1024"]);
    let weights = &v["weights"];
    assert_eq!(weights["bytes"].as_u64(), Some(published));
    assert_eq!(
        weights["format"],
        serde_json::json!({"method": "awq", "bits": 4, "group": 128})
    );
    assert_eq!(
        v["breakdown"][0]["name"],
        "weights (awq linears, bf16 rest)"
    );
    assert_eq!(v["breakdown"][0]["bytes"].as_u64(), Some(published));
    // The dequantization buffer: the largest matrix (4,864 × 896) in bf16.
    assert_eq!(
        named_u64(&v, "breakdown", "dequantization buffer", "bytes"),
        4864 * 896 * 2
    );
}

/// gpt-oss-20b's MXFP4 experts (the preset's `quantization_config`): the weights are its
/// published `model.safetensors.index.json`'s `metadata.total_size`, 13,761,264,768 B
/// (openai/gpt-oss-20b), to the byte. Full training dequantizes them (bf16 weights).
#[test]
fn gpt_oss_mxfp4_is_its_published_total_size() {
    let v = json(&["--model", "gpt-oss-20b", "--context", "1024"]);
    assert_eq!(v["weights"]["bytes"].as_u64(), Some(13_761_264_768));
    assert_eq!(
        v["breakdown"][0]["name"],
        "weights (mxfp4 experts, bf16 rest)"
    );
    let train = json(&[
        "--model",
        "gpt-oss-20b",
        "--mode",
        "train",
        "--context",
        "256",
    ]);
    assert!(train["weights"].is_null());
    assert!(train["notes"]
        .to_string()
        .contains("dequantized for full training"));
}

/// What vLLM holds of gpt-oss-20b follows the `--gpu`'s MXFP4 kernel: on an A100 (Marlin) the
/// experts are padded to hidden 3,072 and intermediate 2,944, which adds 768 experts × (their
/// padded − their stored bytes); on an H100 (Triton) nothing. A vLLM user on an A100 quotes
/// "Model loading took 13.72 GiB" (myoceane.fr, April 2026): within 2%.
#[test]
fn gpt_oss_in_vllm_follows_the_gpus_kernel() {
    let stored = 13_761_264_768u64;
    // Per expert: gate_up 2I × H and down H × I at 4.25 bits, biases (2I + H) in bf16.
    let per = |h: u64, i: u64| 3 * i * h * 17 / 32 + (2 * i + h) * 2;
    let a100 = json(&[
        "--model",
        "gpt-oss-20b",
        "--gpu",
        "a100-80gb",
        "--context",
        "1024",
    ]);
    let v = &a100["weights"]["vllm"];
    assert_eq!(v["kernel"], "Marlin");
    assert_eq!(
        (v["hidden"].as_u64(), v["intermediate"].as_u64()),
        (Some(3072), Some(2944))
    );
    let marlin = stored + 768 * (per(3072, 2944) - per(2880, 2880));
    assert_eq!(v["bytes"].as_u64(), Some(marlin));
    let quoted = 13.72 * (1u64 << 30) as f64;
    assert!((marlin as f64 / quoted - 1.0).abs() < 0.02);
    let h100 = json(&[
        "--model",
        "gpt-oss-20b",
        "--gpu",
        "h100",
        "--context",
        "1024",
    ]);
    assert_eq!(h100["weights"]["vllm"]["bytes"].as_u64(), Some(stored));
    assert!(json(&["--model", "gpt-oss-20b", "--context", "1024"])["weights"]["vllm"].is_null());
}

#[test]
fn qlora_and_paged_optimizers_say_what_they_are() {
    let v = json(&[
        "--model",
        "qwen2.5-0.5b",
        "--mode",
        "train",
        "--trainable",
        "qlora-r8",
        "--optimizer",
        "paged-adamw-8bit",
        "--context",
        "512",
    ]);
    assert_eq!(
        v["breakdown"][0]["name"],
        "weights (nf4 linears, bf16 rest and adapters)"
    );
    assert_eq!(v["weights"]["format"]["method"], "bnb4");
    assert_eq!(v["query"]["optimizer"], "paged-adamw-8bit");
    assert_eq!(v["query"]["trainable"], "qlora-r8");
    let notes = v["notes"].to_string();
    assert!(notes.contains("paged"), "{notes}");
    assert!(notes.contains("evict"), "{notes}");
}

#[test]
fn what_the_formats_refuse() {
    refused(
        &["--model", AWQ, "--mode", "train", "--trainable", "qlora-r8"],
        "QLoRA quantizes a dense checkpoint to NF4 at load",
    );
    refused(
        &["--model", AWQ, "--mode", "train"],
        "a quantized checkpoint's weights do not train",
    );
    refused(
        &["--model", AWQ, "--precision", "q4k"],
        "--precision q4k is not for it",
    );
    refused(
        &["--model", "qwen2.5-0.5b", "--trainable", "qlora-r8"],
        "it needs --mode train",
    );
    refused(
        &[
            "--model",
            "qwen2.5-0.5b",
            "--mode",
            "train",
            "--trainable",
            "qlora-r8",
            "--precision",
            "mixed-bf16",
        ],
        "--precision mixed-bf16 is not for it",
    );
    refused(
        &[
            "--model",
            "qwen2.5-0.5b",
            "--mode",
            "train",
            "--optimizer",
            "adamw-8bit",
            "--runtime",
            "candle",
        ],
        "bitsandbytes' optimizers run under PyTorch",
    );
    refused(
        &[
            "--model",
            "qwen2.5-0.5b",
            "--mode",
            "train",
            "--trainable",
            "qlora-r8",
            "--emulate",
            "a100-80gb",
        ],
        "needs its CUDA kernels",
    );
    // transformers 4.39's StaticCache is one layer's: the emulated run cannot hold a
    // preallocated cache under that stack, and the refusal comes before any Python runs (the
    // stack's interpreter need only exist).
    let cache = tempfile::tempdir().unwrap();
    let python = cache.path().join("stacks/torch-2.2/venv/bin/python");
    std::fs::create_dir_all(python.parent().unwrap()).unwrap();
    std::fs::write(&python, "").unwrap();
    one_line_exit_2(
        &vramlab()
            .args([
                "estimate",
                "--model",
                "llama-3.2-1b",
                "--stack",
                "torch-2.2",
            ])
            .args(["--emulate", "a100-80gb"])
            .env("VRAMLAB_TORCH_CACHE", cache.path())
            .output()
            .unwrap(),
        "pass --kv-cache growing",
    );
    // LoRA dropout is a probability, and peft's: not candle's, not on a full fine-tune.
    for (args, needle) in [
        (&["--lora-dropout", "1"][..], "a probability in [0, 1)"),
        (&["--lora-dropout", "0.1"][..], "needs --trainable lora-rN"),
        (
            &[
                "--lora-dropout",
                "0.1",
                "--trainable",
                "lora-r8",
                "--runtime",
                "candle",
            ][..],
            "candle LoRA has no dropout",
        ),
    ] {
        let mut all = vec!["--model", "qwen2.5-0.5b", "--mode", "train"];
        all.extend_from_slice(args);
        refused(&all, needle);
    }
}
