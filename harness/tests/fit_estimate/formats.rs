//! Quantized formats, the best format that fits, QLoRA, overflow, every GPU name and the borderline verdict.
use super::*;

/// `estimate --gpu --best-format`: SmolLM2-135M's 576-wide rows make the K formats
/// impossible (named in the table); with room for everything the best is f32 (the dense
/// precision of the default f32 compute); with a budget just above Q8_0's total it is Q8_0,
/// and the rest of the report is for Q8_0.
#[test]
fn best_format_picks_the_most_bits_that_fit() {
    let j = estimate_json(&["--model", "smollm2-135m", "--gpu", "h200", "--best-format"]);
    let b = &j["best_format"];
    assert_eq!(b["best"], "f32", "{b}");
    let formats = b["formats"].as_array().unwrap();
    let names: Vec<&str> = formats
        .iter()
        .map(|f| f["precision"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f32", "q8_0", "q4_1", "q4_0", "q6k", "q5k", "q4k"]);
    for f in &formats[4..] {
        assert!(
            f["impossible"]
                .as_str()
                .unwrap()
                .contains("not a multiple of the 256-weight block"),
            "{f}"
        );
        assert_eq!(f["fits"], false);
    }
    let total = |i: usize| formats[i]["total_bytes"].as_u64().unwrap();
    assert!(total(0) > total(1) && total(1) > total(2) && total(2) > total(3));
    // A 10 GB GPU whose headroom leaves Q8_0's total and 100 B.
    let headroom = format!("{:.17}", 1.0 - (total(1) as f64 + 100.0) / 1e10);
    let j = estimate_json(&[
        "--model",
        "smollm2-135m",
        "--gpu",
        "10gb",
        "--headroom",
        &headroom,
        "--best-format",
    ]);
    let b = &j["best_format"];
    assert_eq!(b["best"], "q8_0", "{b}");
    assert_eq!(b["formats"][0]["fits"], false);
    assert_eq!(j["query"]["precision"], "q8_0");
    assert_eq!(j["total_bytes"].as_u64(), Some(total(1)));
    // --best-format chooses the precision; naming one too is refused in one line.
    vramlab()
        .args([
            "estimate",
            "--model",
            "smollm2-135m",
            "--gpu",
            "h200",
            "--best-format",
            "--weights",
            "q4_0",
        ])
        .assert()
        .code(2)
        .stderr(contains("--best-format chooses the precision"));
}

/// QLoRA estimated analytically: `--mode train --trainable lora-r16 --weights q4k` keeps the
/// base at Q4_K's block bytes (the inference estimate's weights) and adds the rank-16
/// adapters (6,815,744 on llama-3.1-8b, PEFT's figure) and AdamW's two moments in the bf16
/// compute dtype. Training a quantized base without LoRA is refused.
#[test]
fn qlora_estimate_base_blocks_and_adapters() {
    let base = estimate_json(&[
        "--model",
        "llama-3.1-8b",
        "--weights",
        "q4k",
        "--compute",
        "bf16",
    ]);
    let blocks = base["weights"]["bytes"].as_u64().unwrap();
    let j = estimate_json(&[
        "--model",
        "llama-3.1-8b",
        "--mode",
        "train",
        "--trainable",
        "lora-r16",
        "--weights",
        "q4k",
        "--compute",
        "bf16",
    ]);
    let adapters = 6_815_744;
    assert_eq!(row(&j, "weights"), blocks + adapters * 2);
    // On one GPU under torch the loss's backward is this peak: no gradient yet (the previous
    // step's `zero_grad(set_to_none=True)`), the adapters' AdamW moments held.
    assert_eq!(row(&j, "gradients"), 0);
    assert!(row(&j, "logits") > 0);
    assert_eq!(row(&j, "optimizer state"), adapters * 4);
    vramlab()
        .args([
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--mode",
            "train",
            "--weights",
            "q4k",
        ])
        .assert()
        .code(2)
        .stderr(contains("QLoRA: --mode train --trainable lora-rN"));
}

/// Figures past 64-bit bytes are bad input naming the flag, for an LLM and for a generation
/// pipeline, in text and JSON: never a wrapped total beside saturated rows.
#[test]
fn an_estimate_past_64_bit_bytes_exits_2_naming_the_flag() {
    let max = u64::MAX.to_string();
    for json in [false, true] {
        let with = |args: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            if json {
                v.push("--json".into());
            }
            v
        };
        let llm = with(&["--model", "llama-3.1-8b", "--batch", &max]);
        let llm: Vec<&str> = llm.iter().map(String::as_str).collect();
        overflows(&llm, &format!("--batch {max}"), "KV cache");
        let sd = with(&["--model", "sd15", "--resolution", "99999992x99999992"]);
        let sd: Vec<&str> = sd.iter().map(String::as_str).collect();
        overflows(
            &sd,
            "--resolution 99999992x99999992",
            "vae_decode activations",
        );
    }
    // Training, with a GPU to fit: the context alone.
    overflows(
        &[
            "--model",
            "llama-3.1-8b",
            "--mode",
            "train",
            "--context",
            &max,
            "--gpu",
            "h100",
        ],
        &format!("--context {max}"),
        "activations",
    );
    // Two flags that each overflow alone are both named.
    overflows(
        &[
            "--model",
            "llama-3.1-8b",
            "--batch",
            &max,
            "--context",
            &max,
        ],
        &format!("--batch {max} --context {max}"),
        "KV cache",
    );
    // A config.json past the shape bounds is refused before any arithmetic.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    let json = serde_json::json!({"model_type": "llama", "vocab_size": 32000,
        "hidden_size": 1u64 << 40, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 4096});
    std::fs::write(&cfg, json.to_string()).unwrap();
    vramlab()
        .args(["estimate", "--model", cfg.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(contains("hidden_size = 1099511627776 is implausibly large"));
}

/// A large query that still fits 64 bits: the total is the sum of its rows.
#[test]
fn a_large_representable_query_totals_its_rows() {
    let j = estimate_json(&["--model", "llama-3.1-8b", "--batch", "1000000"]);
    let rows: u128 = j["breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| u128::from(r["bytes"].as_u64().unwrap()))
        .sum();
    let total = j["total_bytes"].as_u64().unwrap();
    assert_eq!(u128::from(total), rows);
    // Beyond any GPU of the catalog, and said so.
    assert!(total > 1_000_000_000_000_000, "{total}");
    assert!(j["smallest_gpu_gb"].is_null());
    assert!(row(&j, "KV cache") > 500_000_000_000_000);
}

/// One catalogue: every name people type for a GPU gives the bytes `vramlab gpus --json`
/// lists, and the analytic verdict between the reserve's median and largest ratio is
/// "borderline", naming the `--emulate` command that settles it.
#[test]
fn every_gpu_name_judges_the_catalogued_bytes_and_borderline_says_how_to_settle() {
    let out = vramlab().args(["gpus", "--json"]).assert().success();
    let cat: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let entry = |key: &str| {
        cat["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap_or_else(|| panic!("{key} is catalogued"))
            .clone()
    };
    let rtx = entry("rtx-4090");
    for name in ["rtx-4090", "rtx4090", "RTX 4090", "NVIDIA GeForce RTX 4090"] {
        let j = estimate_json(&["--model", "llama-3.1-8b", "--gpu", name]);
        assert_eq!(j["gpu"]["gpu_bytes"], rtx["total_bytes"], "{name}");
        assert_eq!(j["gpu"]["gpu"], "rtx-4090", "{name}");
    }
    // Each catalogued GPU's budget is its bytes less the headroom, whatever its class.
    for g in cat["gpus"].as_array().unwrap() {
        let key = g["key"].as_str().unwrap();
        let j = estimate_json(&[
            "--model",
            "smollm2-135m",
            "--gpu",
            key,
            "--headroom",
            "0.25",
        ]);
        let total = g["total_bytes"].as_u64().unwrap();
        assert_eq!(j["gpu"]["gpu_bytes"].as_u64(), Some(total), "{key}");
        assert_eq!(
            j["gpu"]["budget_bytes"].as_u64(),
            Some((total as f64 * 0.75) as u64),
            "{key}"
        );
        assert_eq!(j["gpu"]["verdict"], "fits", "{key}");
    }
    // The verdict's range: the figure with the reserve at the ends of its fitted error.
    let j = estimate_json(&["--model", "llama-3.1-8b", "--gpu", "rtx4090"]);
    let (budget, total, low, high) = (
        j["gpu"]["budget_bytes"].as_u64().unwrap(),
        j["total_bytes"].as_u64().unwrap(),
        j["gpu"]["total_low_bytes"].as_u64().unwrap(),
        j["gpu"]["total_high_bytes"].as_u64().unwrap(),
    );
    assert_eq!(high, j["nvml_high_bytes"].as_u64().unwrap());
    assert_eq!(low, j["nvml_low_bytes"].as_u64().unwrap());
    let reserve = row(&j, "allocator reserve");
    assert!(
        low < total && total < high && total - low <= reserve,
        "{low} {total} {high} {reserve}"
    );
    let want = match (high <= budget, low <= budget) {
        (true, _) => "fits",
        (false, true) => "borderline",
        (false, false) => "does-not-fit",
    };
    assert_eq!(j["gpu"]["verdict"], want);
    assert_eq!(j["gpu"]["fits"], high <= budget);
    if want == "borderline" {
        let cmd = j["settle_with"].as_str().unwrap();
        assert!(cmd.ends_with("--emulate rtx-4090"), "{cmd}");
        assert!(cmd.contains("--model llama-3.1-8b --gpu rtx4090"), "{cmd}");
        vramlab()
            .args(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx4090"])
            .assert()
            .success()
            .stdout(contains("borderline").and(contains("--emulate rtx-4090")));
    } else {
        assert!(j.get("settle_with").is_none());
    }
    // A GPU the catalogue does not hold is one line naming `vramlab gpus`.
    vramlab()
        .args(["estimate", "--model", "gpt2", "--gpu", "l40"])
        .assert()
        .code(2)
        .stderr(contains("unknown --gpu `l40`").and(contains("vramlab gpus")));
}

/// Issue 40, item 3: the analytic allocated figure against every `ok` point of the emulated
/// calibration corpus (PyTorch's own caching allocator on the emulated A100-80GB, the default
/// stack; docs/src/results/emulated-corpus.md): each point's largest peak allocated over its
/// steps (its `total` or `step_total` rows), against `estimate`'s allocated for the same query (runtime torch, AdamW
/// foreach as the probe runs it, the point's attention, precision, trainable set and
/// checkpointing). Training within 2% everywhere (transformers' own layer counted, the peak the
/// larger of the loss's backward and the optimizer step); inference (SDPA, and eager with its
/// scores, softmax copies, repeated K and V and mask) within −2%..+3%, the 3% on SmolLM2's
/// smallest shapes, where a few MB of small blocks are a percent.
/// The catalogued card of an emulated row's `device_name` ("NVIDIA A100-SXM4-80GB (emulated)").
fn card(device_name: &str) -> vramlab::gpu::Gpu {
    let name = device_name.trim_end_matches(" (emulated)");
    vramlab::gpu::by_name(name).unwrap_or_else(|| panic!("no catalogued GPU `{name}`"))
}

#[test]
fn the_analytic_allocated_meets_the_emulated_corpus() {
    use std::collections::BTreeMap;
    use vramlab::estimate::{Mode, OptimizerImpl, Query};
    let rows = vramlab::export::csv::read(&root().join(common::RESERVE_CSVS[0])).unwrap();
    let mut peak: BTreeMap<&str, (&Record, u64)> = BTreeMap::new();
    // A point's `total` (inference) or `step_total` (training, per step) rows span its phases;
    // a point past the card has an `oom` row instead.
    let spans = |r: &&Record| matches!(r.phase, Some(Phase::Total | Phase::StepTotal));
    for r in rows
        .iter()
        .filter(|r| r.status == Some(Status::Ok))
        .filter(spans)
    {
        let a = r.peak_allocated.unwrap_or(0);
        let e = peak.entry(r.point_id.as_str()).or_insert((r, a));
        if a > e.1 {
            *e = (r, a);
        }
    }
    assert!(peak.len() > 250, "{} points", peak.len());
    let mut worst = BTreeMap::new();
    for (id, (r, emulated)) in &peak {
        // The corpus's sources are the presets' configs (scenarios/emu-corpus-llm.toml).
        let preset = r.model_id.strip_prefix("synthetic-").unwrap();
        let m = vramlab::estimate::resolve(&format!("harness/presets/{preset}"))
            .or_else(|_| vramlab::estimate::resolve(preset))
            .unwrap()
            .config;
        let q = Query {
            mode: r.mode,
            precision: r.precision,
            batch: r.batch,
            context: r.context,
            optimizer: r.optimizer,
            optimizer_impl: OptimizerImpl::Foreach,
            checkpointing: r
                .checkpointing
                .unwrap_or(vramlab::vocab::Checkpointing::None),
            trainable: r.trainable.unwrap_or(vramlab::estimate::Trainable::Full),
            // The corpus's probe added its adapters as forward hooks in the model's dtype.
            peft_f32_adapters: false,
            attention: r.attention,
            kv_cache: r.kv_cache.unwrap_or(vramlab::model::KvKind::Preallocated),
            kv_window: vramlab::estimate::KvWindow::Full,
            // The card the row ran on, whose compute capability sizes the cuBLAS workspace.
            compute_capability: Some(card(&r.device_name).compute_capability),
            ..Query::default()
        };
        let e = vramlab::estimate::estimate(&m, &q, None).unwrap();
        let error = e.allocated().unwrap() as f64 / *emulated as f64 - 1.0;
        let (low, high) = match r.mode {
            Mode::Train => (-0.02, 0.02),
            _ => (-0.02, 0.03),
        };
        assert!(
            (low..=high).contains(&error),
            "{id}: analytic {} B, emulated {emulated} B, {error:+.4}",
            e.allocated().unwrap()
        );
        let w = worst.entry((r.mode, r.attention)).or_insert(0.0f64);
        *w = w.max(error.abs());
    }
    eprintln!("worst |error| by (mode, attention): {worst:?}");
}

/// `--weights q4k` on a preset: every matrix at Q4_K's 144 B per 256 weights (scales
/// included), the 1-D norms dense in the f32 compute dtype, to the byte, by hand from
/// Llama-3.1-8B's published shapes; and the bits per weight that gives.
#[test]
fn preset_requantized_weights_are_the_block_formula() {
    let (v, d, f, kv, l) = (128_256u64, 4_096u64, 14_336u64, 1_024u64, 32u64);
    let matrices = 2 * v * d + l * (2 * d * d + 2 * d * kv + 3 * d * f);
    let norms = (2 * l + 1) * d;
    let bytes = matrices / 256 * 144 + norms * 4;
    let j = estimate_json(&["--model", "llama-3.1-8b", "--weights", "q4k"]);
    assert_eq!(row(&j, "weights"), bytes);
    assert_eq!(j["weights"]["bytes"], bytes);
    let bits = j["weights"]["bits_per_weight"].as_f64().unwrap();
    assert!((bits - bytes as f64 * 8.0 / (matrices + norms) as f64).abs() < 1e-9);
    assert!(bits > 4.5 && bits < 4.51, "{bits}");
    // Q8_0: 34 B per 32 weights.
    let j = estimate_json(&["--model", "llama-3.1-8b", "--weights", "q8_0"]);
    assert_eq!(row(&j, "weights"), matrices / 32 * 34 + norms * 4);
}
