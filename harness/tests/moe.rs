//! Mixture-of-experts models through `vramlab estimate` (the architectures themselves, their
//! parameter counts and their candle models are in tests/architectures.rs):
//! - the JSON gives `model.params` (every stored expert: the weights row) and
//!   `model.active_params` (what a token runs through), derived here from the config by hand;
//! - bad MoE keys are one line and exit 2;
//! - with torch (`#[ignore]`d; scripts/test.sh runs it): the instant estimate agrees with
//!   PyTorch's own allocator running transformers' models on the emulated card, inference and
//!   LoRA training, and the verdicts agree.
mod common;
use common::{one_line_exit_2, torch_python, vramlab};
use serde_json::Value;

fn estimate_json(args: &[&str]) -> Value {
    let out = vramlab()
        .args(["estimate", "--json"])
        .args(args)
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[test]
fn total_and_active_parameters_by_hand() {
    // Mixtral-8x7B: V 32,000, d 4,096, 32 layers, 32 heads × 128, 8 KV heads, 8 experts of
    // 14,336 (gate, up, down), top-2, untied head. Per layer: attention 2 × 4,096² + 2 ×
    // 1,024 × 4,096 = 41,943,040; router 8 × 4,096; experts 8 × 3 × 4,096 × 14,336; norms
    // 2 × 4,096.
    let expert: u64 = 3 * 4096 * 14_336;
    let layer: u64 = 41_943_040 + 8 * 4096 + 8 * expert + 2 * 4096;
    let total = 2 * 32_000 * 4096 + 32 * layer + 4096;
    let j = estimate_json(&["--model", "mixtral-8x7b", "--precision", "bf16"]);
    assert_eq!(u(&j["model"]["params"]), total);
    assert_eq!(total, 46_702_792_704);
    // A token runs through 2 of the 8 experts: 6 idle experts a layer.
    assert_eq!(u(&j["model"]["active_params"]), total - 32 * 6 * expert);
    let weights = j["breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "weights")
        .unwrap();
    assert_eq!(
        u(&weights["bytes"]),
        2 * total,
        "the weights row holds every expert"
    );
    // A dense model's active count is its count.
    let j = estimate_json(&["--model", "llama-3.1-70b"]);
    assert_eq!(j["model"]["params"], j["model"]["active_params"]);
}

#[test]
fn bad_moe_keys_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let preset: Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("harness/presets/qwen3-30b-a3b/config.json"))
            .unwrap(),
    )
    .unwrap();
    for (key, value, needle) in [
        (
            "num_experts_per_tok",
            serde_json::json!(129),
            "num_experts_per_tok = 129",
        ),
        (
            "num_experts_per_tok",
            serde_json::json!(0),
            "num_experts_per_tok = 0",
        ),
        ("num_experts", serde_json::json!(0), "at least one expert"),
        (
            "mlp_only_layers",
            serde_json::json!([48]),
            "layer 48 is outside",
        ),
        (
            "decoder_sparse_step",
            serde_json::json!(0),
            "decoder_sparse_step",
        ),
        (
            "num_experts",
            serde_json::json!(1u64 << 40),
            "implausibly large",
        ),
    ] {
        let mut v = preset.clone();
        v[key] = value;
        estimate_fails(dir.path(), &v, needle);
    }
    let mut v = preset;
    v.as_object_mut().unwrap().remove("num_experts");
    estimate_fails(dir.path(), &v, "missing config key `num_experts`");
    // DeepSeek without its latent rank.
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("harness/presets/deepseek-v3/config.json"))
            .unwrap(),
    )
    .unwrap();
    v.as_object_mut().unwrap().remove("kv_lora_rank");
    estimate_fails(dir.path(), &v, "missing config key `kv_lora_rank`");
    // Llama 4: its text keys nested under `text_config`, each error naming the file.
    let scout: Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("harness/presets/llama-4-scout/config.json"))
            .unwrap(),
    )
    .unwrap();
    for (key, value, needle) in [
        (
            "moe_layers",
            serde_json::json!([48]),
            "moe_layers lists layer 48",
        ),
        (
            "no_rope_layers",
            serde_json::json!([1, 0]),
            "no_rope_layers lists 2 layers",
        ),
        (
            "attention_chunk_size",
            serde_json::json!(0),
            "attention_chunk_size must be positive",
        ),
        // A window beyond the context limit and a million tokens: a corrupt value.
        (
            "attention_chunk_size",
            serde_json::json!(1u64 << 40),
            "larger than the context limit",
        ),
        (
            "attn_temperature_tuning",
            serde_json::json!("yes"),
            "attn_temperature_tuning",
        ),
        (
            "num_experts_per_tok",
            serde_json::json!(17),
            "num_experts_per_tok = 17",
        ),
    ] {
        let mut v = scout.clone();
        v["text_config"][key] = value;
        estimate_fails(dir.path(), &v, needle);
    }
    let mut v = scout.clone();
    v["vision_config"]["patch_size"] = 0.into();
    estimate_fails(dir.path(), &v, "patch_size = 0");
    let mut v = scout;
    v["text_config"] = "none".into();
    estimate_fails(dir.path(), &v, "text_config is not an object");
    // A sliding window past any context (Mistral's key).
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::root().join("harness/presets/mistral-7b-v0.1/config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    v["sliding_window"] = (1u64 << 33).into();
    estimate_fails(
        dir.path(),
        &v,
        "sliding_window = 8589934592 is larger than the context limit",
    );
}

/// `estimate --model DIR/config.json` of `v` fails in one line naming the file and `needle`.
fn estimate_fails(dir: &std::path::Path, v: &Value, needle: &str) {
    let path = dir.join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let out = vramlab()
        .args(["estimate", "--model"])
        .arg(&path)
        .output()
        .unwrap();
    one_line_exit_2(&out, needle);
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
}

/// The instant estimate against transformers' MoE models on PyTorch's allocator over the
/// emulated card: allocated within 1%, NVML used within 5%, the verdicts the same. Besides the
/// presets: DeepSeek-V2-Lite's f32 routing weights (the weighted outputs are f32) and Llama 4's
/// dense dispatch (transformers runs all 16 experts on every token) on an 8-layer Scout text
/// decoder, which one H100 holds.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_instant_estimate_agrees_with_the_emulated_gpu_on_moe() {
    let dir = tempfile::tempdir().unwrap();
    let scout: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("harness/presets/llama-4-scout/config.json"))
            .unwrap(),
    )
    .unwrap();
    let mut text = scout["text_config"].clone();
    text["num_hidden_layers"] = 8.into();
    text["no_rope_layers"] = serde_json::json!([]);
    text["attn_temperature_tuning"] = true.into();
    std::fs::write(dir.path().join("config.json"), text.to_string()).unwrap();
    let scout8 = dir.path().to_str().unwrap();
    let queries: [&[&str]; 5] = [
        &[
            "--model",
            "deepseek-v2-lite",
            "--batch",
            "2",
            "--context",
            "8192",
            "--gpu",
            "h100",
            "--emulate",
            "h100",
        ],
        &[
            "--model",
            scout8,
            "--batch",
            "1",
            "--context",
            "8192",
            "--gpu",
            "h100",
            "--emulate",
            "h100",
        ],
        &[
            "--model",
            "qwen3-30b-a3b",
            "--batch",
            "8",
            "--context",
            "4096",
            "--gpu",
            "h100",
            "--emulate",
            "h100",
        ],
        &[
            "--model",
            "mixtral-8x7b",
            "--batch",
            "4",
            "--context",
            "4096",
            "--gpu",
            "h200",
            "--emulate",
            "h200",
        ],
        &[
            "--model",
            "qwen3-30b-a3b",
            "--mode",
            "train",
            "--trainable",
            "lora-r16",
            "--batch",
            "2",
            "--context",
            "1024",
            "--checkpointing",
            "--gpu",
            "h200",
            "--emulate",
            "h200",
        ],
    ];
    for q in queries {
        let j = estimate_json(&[&["--runtime", "torch", "--python", &torch_python()], q].concat());
        let (g, e) = (&j["gpu"], &j["emulated"]);
        assert_eq!(e["status"], "ok", "{q:?}: {e}");
        let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
        let alloc = err(u(&j["allocated_bytes"]), u(&e["max_memory_allocated"]));
        let used = err(u(&j["nvml_bytes"]), u(&e["nvml_used"]));
        assert!(alloc.abs() <= 0.01, "{q:?}: allocated {alloc:+.4}");
        assert!(used.abs() <= 0.05, "{q:?}: NVML used {used:+.4}");
        let fits = e["fits_with_headroom"].as_bool().unwrap();
        let verdict = g["verdict"].as_str().unwrap();
        assert!(
            verdict == "borderline" || (verdict == "fits") == fits,
            "{q:?}: analytic {verdict}, emulated fits {fits}"
        );
    }
}

/// `estimate --json` of a `lora-r16` training step of `model` on `targets`, under torch.
fn lora_r16(model: &str, targets: &str, more: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--model",
        model,
        "--mode",
        "train",
        "--trainable",
        "lora-r16",
        "--lora-targets",
        targets,
        "--runtime",
        "torch",
    ];
    args.extend_from_slice(more);
    estimate_json(&args)
}

/// The adapters of `--trainable lora-r16` on `targets`, from the weights row (the base at bf16
/// plus the adapters at the same width).
fn adapters(model: &str, targets: &str) -> u64 {
    let j = lora_r16(model, targets, &[]);
    let weights = j["breakdown"][0]["bytes"].as_u64().unwrap();
    (weights - 2 * u(&j["model"]["params"])) / 2
}

/// `--lora-targets`' adapters by hand: r · (in + out) a module; peft adapts transformers' stacked
/// experts (E, in, out) with A (r·E × in) and B (out × r·E), one A for the fused gate/up.
#[test]
fn lora_targets_count_their_adapters_by_hand() {
    // Llama-3.1-8B, all-linear: q (4096 → 4096), k and v (4096 → 1024), o (4096 → 4096),
    // gate and up (4096 → 14336), down (14336 → 4096), 32 layers.
    let per_layer =
        (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14_336) + (14_336 + 4096);
    assert_eq!(adapters("llama-3.1-8b", "all-linear"), 16 * 32 * per_layer);
    assert_eq!(
        adapters("llama-3.1-8b", "peft"),
        16 * 32 * ((4096 + 4096) + (4096 + 1024))
    );
    // Qwen3-30B-A3B's experts: 128 of 768 on d 2048, 48 layers; gate/up (2048 → 2 × 768) and
    // down (768 → 2048) per expert.
    assert_eq!(
        adapters("qwen3-30b-a3b", "experts"),
        16 * 48 * 128 * ((2048 + 2 * 768) + (768 + 2048))
    );
    // Mixtral's per-expert checkpoint stacks the same way at load (8 of 14336 on d 4096).
    assert_eq!(
        adapters("mixtral-8x7b", "experts"),
        16 * 32 * 8 * ((4096 + 2 * 14_336) + (14_336 + 4096))
    );
    // What the targets cannot be: one line, exit 2.
    for (args, needle) in [
        (
            &[
                "--model",
                "mixtral-8x7b",
                "--trainable",
                "lora-r8",
                "--lora-targets",
                "gate",
            ][..],
            "no module of --model mixtral-8x7b",
        ),
        (
            &[
                "--model",
                "gpt2",
                "--trainable",
                "lora-r8",
                "--lora-targets",
                "q",
            ][..],
            "gpt2 takes peft's default",
        ),
        (
            &["--model", "gpt2", "--lora-targets", "q"][..],
            "adapters need --trainable",
        ),
    ] {
        let out = vramlab()
            .args(["estimate", "--mode", "train", "--runtime", "torch"])
            .args(args)
            .output()
            .unwrap();
        one_line_exit_2(&out, needle);
    }
    // An unknown name is clap's usage error (exit 2, with its pointer to --help).
    let out = vramlab()
        .args(["estimate", "--model", "gpt2", "--trainable", "lora-r8"])
        .args(["--lora-targets", "wq"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown LoRA target `wq` (known: peft,"),
        "{err}"
    );
}

/// LoRA through peft on the emulated GPU, as `--lora-targets` estimates it: peft ≥ 0.12's f32
/// adapters (each saves an f32 copy of its input) on Llama-3.1-8B, peft's default and all
/// linear layers, within 1% of `max_memory_allocated`; and Qwen3-30B-A3B's experts through
/// `target_parameters`, whose merged expert weights each layer keeps for the backward (57 GB
/// here), within 4% (the estimate is 2% under: not yet explained).
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn lora_targets_agree_with_peft_on_the_emulated_gpu() {
    for (model, targets, shape, tolerance) in [
        ("llama-3.1-8b", "peft", ["4", "2048"], 0.01),
        ("llama-3.1-8b", "all-linear", ["4", "2048"], 0.01),
        ("qwen3-30b-a3b", "experts", ["2", "1024"], 0.04),
    ] {
        let python = torch_python();
        let j = lora_r16(
            model,
            targets,
            &[
                "--batch",
                shape[0],
                "--context",
                shape[1],
                "--gpu",
                "h200",
                "--emulate",
                "h200",
                "--python",
                &python,
            ],
        );
        let e = &j["emulated"];
        assert_eq!(e["status"], "ok", "{model} {targets}: {e}");
        let err = u(&j["allocated_bytes"]) as f64 / u(&e["max_memory_allocated"]) as f64 - 1.0;
        assert!(
            err.abs() <= tolerance,
            "{model} {targets}: allocated {err:+.4}"
        );
    }
}
