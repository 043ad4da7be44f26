//! `vramlab estimate --emulate`: the instant estimate beside PyTorch's allocator on the emulated card, and the stacks.
use super::*;

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn estimate_emulate_answers_with_pytorchs_allocator_and_a_verdict() {
    let base = [&SMOLLM2_BF16_TRAIN[..], &["--context", "256"]].concat();
    let fits: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--batch", "2", "--emulate", "l4"])
        .collect();
    let e = estimate_emulated(&fits);
    assert_eq!(e["fits"], true, "{e}");
    assert!(e["gpu"].as_str().unwrap().ends_with("(emulated)"));
    // Weights, gradients and AdamW's two moments in bf16: 2 + 2 + 4 bytes per parameter stay
    // resident at the step; allocated can only be above them.
    let params = 134_515_008u64;
    assert!(u(&e["max_memory_allocated"]) > 8 * params, "{e}");
    assert!(u(&e["max_memory_reserved"]) >= u(&e["max_memory_allocated"]));
    assert!(u(&e["nvml_used"]) > u(&e["max_memory_reserved"]));
    // The logits alone at batch 128 × 2048 tokens × 49,152 vocabulary in bf16 are 25.8 GB:
    // more than an L4's 23.6 GB.
    let big: Vec<&str> = base[..6]
        .iter()
        .copied()
        .chain(["--context", "2048", "--batch", "128", "--emulate", "l4"])
        .collect();
    let e = estimate_emulated(&big);
    assert_eq!(e["fits"], false, "{e}");
    assert_eq!(e["status"], "oom", "{e}");
}

/// With neither `--python` nor `$VRAMLAB_TORCH_PYTHON`, `estimate --emulate` runs the default
/// stack that `scripts/torch-env.sh` installed in the torch cache (python3 on PATH, which may
/// have no torch, is the last resort): the same answer as naming that Python.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn estimate_emulate_finds_the_installed_torch_environment_by_itself() {
    let query = [
        &ESTIMATE_SMOLLM2[..],
        &["--context", "256", "--emulate", "l4"],
    ]
    .concat();
    let named = estimate_json(&query[4..]);
    let py = torch_python();
    // .../vramlab-torch/venv/bin/python: the cache is three folders up.
    let cache = Path::new(&py).ancestors().nth(3).unwrap();
    let found: Value = serde_json::from_str(&ok_stdout(
        Command::cargo_bin("vramlab")
            .unwrap()
            .args(&query)
            .env_remove("VRAMLAB_TORCH_PYTHON")
            .env("VRAMLAB_TORCH_CACHE", cache),
    ))
    .unwrap();
    assert_eq!(found["emulated"]["status"], "ok", "{found}");
    assert_eq!(found["emulated"]["torch"], named["emulated"]["torch"]);
    assert_eq!(
        found["emulated"]["max_memory_allocated"],
        named["emulated"]["max_memory_allocated"]
    );
}

/// The analytic and the emulated verdicts judge one card's bytes at one headroom, and never
/// contradict each other: Llama-3.1-8B inference (bf16, batch 1, 4,096 tokens) on an RTX 4090,
/// which PyTorch's own allocator fits, is never "does not fit" analytically (issue 40's first
/// query). `--gpu rtx4090` and `--emulate rtx4090` are the same card.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn analytic_and_emulated_verdicts_judge_the_same_card_and_never_flip() {
    let j = estimate_json(&[
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "rtx4090",
        "--emulate",
        "rtx4090",
    ]);
    let (g, e) = (&j["gpu"], &j["emulated"]);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(g["gpu_bytes"], e["gpu_total_bytes"]);
    assert_eq!(g["budget_bytes"], e["budget_bytes"]);
    // The emulated NVML figure is the allocator's reserved plus the same context the
    // estimate's CUDA context row holds.
    assert_eq!(
        u(&e["nvml_used"]) - u(&e["max_memory_reserved"]),
        vramlab::gpu::CONTEXT_BYTES
    );
    let context_row = j["breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "CUDA context")
        .unwrap()["bytes"]
        .clone();
    assert_eq!(u(&context_row), vramlab::gpu::CONTEXT_BYTES);
    // Allocated is the exact part: within 2 %.
    let (a, ea) = (u(&j["allocated_bytes"]), u(&e["max_memory_allocated"]));
    assert!((a as f64 / ea as f64 - 1.0).abs() < 0.02, "{a} vs {ea}");
    // The emulated run fits with headroom; the analytic verdict may be borderline, not "no".
    assert_eq!(e["fits_with_headroom"], true, "{e}");
    assert_ne!(g["verdict"], "does-not-fit", "{g}");
    assert!(u(&g["total_low_bytes"]) <= u(&e["budget_bytes"]));
}

/// Issue 40's five queries: allocated within 3% of PyTorch's own allocator on the emulated card
/// (training through transformers' layer accounting, `Architecture::torch_saved_per_token`),
/// the emulated NVML used inside the analytic range, and the analytic verdict the emulated one
/// or borderline (its held-out range spans the budget), never the opposite. NVML used is within
/// 5% on the first four; Llama-3.2-1B mixed bf16's reserve is fitted high (the mixed class,
/// docs/src/results/emulated-reserve.md) and is held to its range only.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_instant_estimate_agrees_with_the_emulated_gpu_on_the_issues_queries() {
    let queries: [&[&str]; 5] = [
        &[
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "rtx4090",
            "--emulate",
            "rtx4090",
        ],
        &["--model", "qwen2.5-7b", "--gpu", "l4", "--emulate", "l4"],
        &[
            "--model",
            "qwen3-0.6b",
            "--mode",
            "train",
            "--precision",
            "bf16",
            "--batch",
            "4",
            "--context",
            "1024",
            "--gpu",
            "a100-80",
            "--emulate",
            "a100-80",
        ],
        &[
            "--model",
            "llama-3.1-8b",
            "--mode",
            "train",
            "--trainable",
            "lora-r16",
            "--batch",
            "4",
            "--context",
            "2048",
            "--checkpointing",
            "--gpu",
            "a100-80",
            "--emulate",
            "a100-80",
        ],
        &[
            "--model",
            "llama-3.2-1b",
            "--mode",
            "train",
            "--precision",
            "mixed-bf16",
            "--batch",
            "8",
            "--context",
            "2048",
            "--gpu",
            "a100-80",
            "--emulate",
            "a100-80",
        ],
    ];
    for (i, q) in queries.into_iter().enumerate() {
        let j = estimate_json(q);
        let (g, e) = (&j["gpu"], &j["emulated"]);
        assert_eq!(e["status"], "ok", "{q:?}: {e}");
        let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
        let alloc = err(u(&j["allocated_bytes"]), u(&e["max_memory_allocated"]));
        let used = err(u(&j["nvml_bytes"]), u(&e["nvml_used"]));
        assert!(alloc.abs() <= 0.03, "{q:?}: allocated {alloc:+.4}");
        // The last query's reserve is held to its range only.
        assert!(i == 4 || used.abs() <= 0.05, "{q:?}: NVML used {used:+.4}");
        // The emulated figure lies inside the analytic range, and the verdicts agree.
        assert!(
            u(&j["nvml_low_bytes"]) <= u(&e["nvml_used"])
                && u(&e["nvml_used"]) <= u(&j["nvml_high_bytes"]),
            "{q:?}: {j}"
        );
        let fits = e["fits_with_headroom"].as_bool().unwrap();
        let verdict = g["verdict"].as_str().unwrap();
        assert!(
            verdict == "borderline" || (verdict == "fits") == fits,
            "{q:?}: analytic {verdict}, emulated fits {fits}"
        );
    }
}

/// `vramlab validate --against-emulator` on the small grid CI runs (scenarios/agreement/ci.toml:
/// Mistral-7B, outside the reserve's calibration corpus, inference at 2,048 and 8,192 tokens on
/// an RTX 4090, a batch of 8 × 8,192 that runs out of memory on an L4, and LoRA training on an
/// L4): no verdict flips (exit 0), each emulated NVML used lies inside the analytic range and
/// within 5% of the analytic figure, allocated within 3% (the 8,192-token queries hold the
/// 4,096-token window, as transformers' StaticCache does), every error is the JSON's own
/// figures' ratio, and the query that ran out of memory is compared at four times the card's
/// memory (its figures on the card are where it stopped).
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_instant_estimate_agrees_with_the_emulated_gpu_on_a_grid() {
    let out = vramlab()
        .args([
            "validate",
            "--against-emulator",
            "scenarios/agreement/ci.toml",
            "--json",
        ])
        .env("VRAMLAB_TORCH_PYTHON", torch_python())
        .assert()
        .success();
    let j: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(j["failed"].as_array().unwrap().len(), 0, "{j}");
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let oom: Vec<_> = rows.iter().map(|r| r["emulated_oom"] == true).collect();
    assert_eq!(oom, [false, false, true, false], "{j}");
    assert_eq!(rows[2]["emulated_fits"], false, "{j}");
    for r in rows {
        for (figure, bound) in [("allocated", 0.03), ("nvml_used", 0.05)] {
            let f = &r[figure];
            let want = u(&f["analytic_bytes"]) as f64 / u(&f["emulated_bytes"]) as f64 - 1.0;
            let got = f["error"].as_f64().unwrap();
            assert!((got - want).abs() < 1e-12, "{r}");
            assert!(got.abs() <= bound, "{figure}: {r}");
        }
        let used = u(&r["nvml_used"]["emulated_bytes"]);
        assert!(
            u(&r["nvml_low_bytes"]) <= used && used <= u(&r["nvml_high_bytes"]),
            "{r}"
        );
        assert_eq!(r["inside_range"], true);
        assert_eq!(r["verdicts_agree"], true, "{r}");
    }
    assert_eq!(j["summary"]["verdicts_flipped"], 0);
}

/// The issue's query (Mistral-7B, LoRA r16, fp16, checkpointing, batch 8, 4,096 tokens) gets
/// a verdict on an A100-40GB, and the verdict flips where the run's own figures say: at a
/// capacity of its peak device bytes plus the context every cudaMalloc of the unconstrained run
/// still succeeds, so the same run fits; one byte less than its allocated peak plus the context
/// cannot hold the tensors it had live at once, so PyTorch gives up, whatever it frees.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn estimate_emulate_verdict_flips_at_the_capacity_its_own_figures_give() {
    let query = [
        "--model",
        "mistral-7b-v0.1",
        "--mode",
        "train",
        "--precision",
        "f16",
        "--context",
        "4096",
        "--checkpointing",
        "--optimizer-impl",
        "foreach",
        "--attention",
        "flash",
        "--batch",
        "8",
        "--trainable",
        "lora-r16",
    ];
    let on = |gpu: &str, memory: Option<u64>| {
        let mut args: Vec<String> = query.iter().map(|s| s.to_string()).collect();
        args.extend(["--emulate".into(), gpu.into()]);
        if let Some(m) = memory {
            args.extend(["--emulate-memory".into(), m.to_string()]);
        }
        estimate_emulated(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let verdict = on("a100-40gb", None);
    assert!(verdict["fits"].is_boolean(), "{verdict}");
    let roomy = on("a100-80gb", None);
    assert_eq!(roomy["fits"], true, "{roomy}");
    let context = vramlab::gpu::CONTEXT_BYTES;
    let just = on("a100-80gb", Some(u(&roomy["nvml_used"])));
    assert_eq!(just["fits"], true, "{just}");
    assert_eq!(just["max_memory_allocated"], roomy["max_memory_allocated"]);
    assert!(just["gpu"].as_str().unwrap().contains(" at "), "{just}");
    let short = on(
        "a100-80gb",
        Some(u(&roomy["max_memory_allocated"]) + context - 1),
    );
    assert_eq!(short["fits"], false, "{short}");
    assert_eq!(short["status"], "oom", "{short}");
    // The A100-40GB's verdict is the same comparison at its own capacity.
    let total = u(&verdict["gpu_total_bytes"]);
    if u(&roomy["max_memory_allocated"]) + context > total {
        assert_eq!(verdict["fits"], false, "{verdict}");
    }
    if u(&roomy["nvml_used"]) <= total {
        assert_eq!(verdict["fits"], true, "{verdict}");
    }
}

/// `estimate --emulate GPU --stack torch-2.2`: the same query under the older stack, found in
/// the torch cache where `scripts/torch-env.sh --stack torch-2.2` installed it.
#[test]
#[ignore = "needs the torch-2.2 stack (scripts/torch-env.sh --stack torch-2.2; scripts/test.sh)"]
fn estimate_emulate_runs_under_a_named_stack() {
    let py = std::env::var("VRAMLAB_TORCH22_PYTHON")
        .expect("VRAMLAB_TORCH22_PYTHON: scripts/torch-env.sh --stack torch-2.2");
    // .../stacks/torch-2.2/venv/bin/python → the cache folder four levels up.
    let cache = Path::new(&py).ancestors().nth(5).unwrap().to_path_buf();
    let stdout = ok_stdout(
        Command::cargo_bin("vramlab")
            .unwrap()
            .args(ESTIMATE_SMOLLM2)
            .args(["--mode", "train", "--precision", "bf16", "--context", "256"])
            .args(["--emulate", "a100-40gb", "--stack", "torch-2.2"])
            .env("VRAMLAB_TORCH_CACHE", &cache),
    );
    let e = serde_json::from_str::<Value>(&stdout).unwrap()["emulated"].clone();
    assert!(e["torch"].as_str().unwrap().starts_with("2.2.2"), "{e}");
    assert_eq!(e["fits"], true, "{e}");
    // bf16 weights, gradients and AdamW's two moments: 2 + 2 + 4 bytes per parameter.
    assert!(u(&e["max_memory_allocated"]) > 8 * 134_515_008, "{e}");
}

/// transformers 4.39 and peft 0.11 (the torch-2.2 stack): the rotary caches each decoder layer
/// keeps (`model buffers`, derived here from the config) and LoRA dropout's masks and float16
/// outputs. Llama-3.2-1B with LoRA on q, k, v and o: allocated within 2% of PyTorch's allocator
/// on the emulated card with and without dropout, and the bytes dropout adds within 5% of what it
/// adds there.
#[test]
#[ignore = "needs the torch-2.2 stack (scripts/torch-env.sh --stack torch-2.2; scripts/test.sh)"]
fn transformers_4_rotary_caches_and_lora_dropout_meet_the_emulated_gpu() {
    let py = std::env::var("VRAMLAB_TORCH22_PYTHON")
        .expect("VRAMLAB_TORCH22_PYTHON: scripts/torch-env.sh --stack torch-2.2");
    let cache = Path::new(&py).ancestors().nth(5).unwrap().to_path_buf();
    let run = |dropout: &str| -> Value {
        let stdout = ok_stdout(
            Command::cargo_bin("vramlab")
                .unwrap()
                .args([
                    "estimate",
                    "--runtime",
                    "torch",
                    "--json",
                    "--model",
                    "llama-3.2-1b",
                ])
                .args(["--mode", "train", "--precision", "bf16", "--batch", "4"])
                .args(["--context", "512", "--trainable", "lora-r16"])
                .args(["--lora-targets", "attention", "--lora-dropout", dropout])
                .args(["--stack", "torch-2.2", "--emulate", "a100-80gb"])
                .env("VRAMLAB_TORCH_CACHE", &cache),
        );
        serde_json::from_str(&stdout).unwrap()
    };
    let (with, without) = (run("0.1"), run("0"));
    // 16 layers of cos and sin over 131,072 positions × 64 in bf16, and a 32-value f32 inv_freq.
    let buffers = with["breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "model buffers")
        .map(|r| u(&r["bytes"]));
    assert_eq!(buffers, Some(16 * (2 * 131_072 * 64 * 2 + 32 * 4)));
    let allocated = |j: &Value| {
        assert_eq!(j["emulated"]["status"], "ok", "{j}");
        (
            u(&j["allocated_bytes"]),
            u(&j["emulated"]["max_memory_allocated"]),
        )
    };
    let ((a1, e1), (a0, e0)) = (allocated(&with), allocated(&without));
    for (a, e) in [(a1, e1), (a0, e0)] {
        assert!((a as f64 / e as f64 - 1.0).abs() <= 0.02, "{a} vs {e}");
    }
    let (da, de) = (a1 - a0, e1 - e0);
    assert!(
        (da as f64 / de as f64 - 1.0).abs() <= 0.05,
        "dropout: {da} vs {de}"
    );
}

#[test]
#[ignore = "needs the torch-2.2 stack (scripts/torch-env.sh --stack torch-2.2; scripts/test.sh)"]
fn the_torch_2_2_stack_runs_on_cuda_12_stubs_with_the_same_exact_terms() {
    let py = std::env::var("VRAMLAB_TORCH22_PYTHON")
        .expect("VRAMLAB_TORCH22_PYTHON: scripts/torch-env.sh --stack torch-2.2");
    let r = emulate_with(&py, &["--gpu", "a100-40gb"], &data("bert_step.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.json["cuda"].as_str().unwrap().starts_with("12."),
        "{}",
        r.json
    );
    let e = r.expect.expect("EXPECT line");
    let phases = r.json["phases"].as_array().unwrap();
    let end = |name: &str| {
        u(&phases
            .iter()
            .find(|p| p["name"] == name && p["step"] == 1)
            .unwrap()["end_allocated"])
    };
    assert_eq!(end("load"), u(&e["state"]));
    assert_eq!(end("optimizer") - end("backward"), 2 * u(&e["params"]));
    // A full fine-tune (the embedding's backward included) runs on torch 2.2 too.
    let full = emulate_with(&py, &["--gpu", "a100-40gb"], &data("mistral_full.py"), &[]);
    assert_eq!(full.code, 0, "{}", full.stderr);
    assert_eq!(full.json["steps"].as_array().unwrap().len(), 3);
}

/// The torch-1.10 stack (PyPI's CUDA 10.2 build, for transformers' 2022 training guide) reads
/// the emulated GPU through CUDA 10's struct layouts and runs cuBLAS, which that build links in:
/// the properties torch reports are the catalogue's, and the allocator's figures are exact.
#[test]
#[ignore = "needs the torch-1.10 stack (scripts/torch-env.sh --stack torch-1.10; scripts/test.sh)"]
fn the_torch_1_10_stack_runs_on_cuda_10_layouts() {
    let py = std::env::var("VRAMLAB_TORCH110_PYTHON")
        .expect("VRAMLAB_TORCH110_PYTHON: scripts/torch-env.sh --stack torch-1.10");
    let r = emulate_with(&py, &["--gpu", "v100-16gb"], &data("cuda10_props.py"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["cuda"], "10.2", "{}", r.json);
    let (e, gpu) = (r.expect.expect("EXPECT line"), &r.json["gpu"]);
    let name = gpu["name"].as_str().unwrap();
    assert_eq!(
        Some(e["name"].as_str().unwrap()),
        name.strip_suffix(" (emulated)")
    );
    assert_eq!(e["total"], gpu["total_bytes"]);
    assert_eq!(e["cc"], gpu["compute_capability"]);
    let cat = vramlab::gpu::resolve(Some("v100-16gb"), None).unwrap();
    assert_eq!(u(&e["sms"]), u64::from(cat.sms));
    // x and x @ x: 1024 x 1024 float32 each, whole 2 MiB-rounded blocks.
    assert_eq!(u(&e["allocated"]), 2 * 1024 * 1024 * 4);
    assert_eq!(e["shape"], serde_json::json!([1024, 1024]));
    assert_eq!(
        u(&r.json["run"]["max_memory_allocated"]),
        2 * 1024 * 1024 * 4
    );
}
