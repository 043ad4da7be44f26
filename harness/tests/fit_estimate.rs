//! `vramlab fit` and `vramlab estimate` through the real binary. Expected figures are computed
//! here from the published shapes, independently of the formulas in the crate.
mod common;
use assert_cmd::Command;
use common::{estimate_json, estimate_row as row, root};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use std::path::{Path, PathBuf};
use vramlab::export::{csv::CsvExporter, Exporter};
use vramlab::fit::{Constants, GroupKey, Target};
use vramlab::record::{Phase, Record, Status};
use vramlab::terms::record_terms;

/// Llama-3.1-8B: 2·128256·4096 (embedding + untied head) + 32 layers ×
/// (q, o: 4096² each; k, v: 1024·4096 each; MLP 3·14336·4096; 2 norms) + final norm.
const LLAMA31_8B_PARAMS: u64 = 2 * 128_256 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14_336 * 4096 + 2 * 4096)
    + 4096;

fn vramlab() -> Command {
    let mut c = Command::cargo_bin("vramlab").unwrap();
    c.current_dir(root());
    c
}

#[test]
fn llama31_8b_train_does_not_fit_h100_and_names_the_fsdp_degree() {
    let args = [
        "--model",
        "presets/llama-3.1-8b",
        "--mode",
        "train",
        "--optimizer",
        "adamw",
        "--precision",
        "mixed-bf16",
        "--batch",
        "1",
        "--context",
        "4096",
        "--gpu",
        "h100-80",
    ];
    let j = estimate_json(&args);
    let p = LLAMA31_8B_PARAMS;
    assert_eq!(j["model"]["params"].as_u64().unwrap(), p);
    assert_eq!(
        row(&j, "weights") + row(&j, "gradients") + row(&j, "optimizer state"),
        16 * p
    );
    assert_eq!(j["gpu"]["fits"], false);

    // Independently: FSDP over n GPUs shards ZeRO's mixed-precision states, 16-bit weights (2)
    // and gradients (2) and AdamW's K = 12 (f32 master, m and v); the loss's three f32 tensors
    // per logit at its backward, b·s·V·12 (torch); the cuBLAS workspace (2 × 4096 KiB + 8 × 16
    // KiB); on more than one GPU FSDP's unsharded 16-bit copies: the root unit (embeddings,
    // head, final norm: all but the 32 layers) and its gradient, two layers (the one computed
    // and the prefetched next) and one layer's gradient; the allocator's reserve, the class's
    // fitted model on the query's terms (its derivation from the emulated sweep is
    // tests/reserve.rs's), where a rank's weight term is its own shard of the 16-bit weights
    // instead of the one GPU's f32 masters, taken at the high end of its held-out error, the
    // figure verdicts judge: reserved ÷ (1 + the class's smallest error); the catalogue's CUDA
    // context; 10% headroom on the H100-80GB's catalogued bytes (`vramlab gpus`, the GPU's
    // `gpu_bytes` here). The activations, the same at every degree, are a sharded query's row
    // (on one GPU the step's moment is this peak, with none; the layer formula's tests are
    // estimate/train/tests.rs).
    let reserve = row(&j, "allocator reserve") as f64;
    let class = (false, "train", "sdpa", "none", false, true);
    let table = common::reserve_table(common::RESERVE_CONSTANTS, class);
    let error_min = table["error_min"].as_float().unwrap();
    let c_weight = table["coefficients"]["weight"].as_float().unwrap();
    let sharded: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--gpus", "2", "--sharding", "fsdp"])
        .collect();
    let activations = row(&estimate_json(&sharded), "activations");
    let fixed = activations + 4096 * 128_256 * 12 + 2 * (4096 << 10) + 8 * (16 << 10);
    let layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14_336 * 4096 + 2 * 4096;
    let root = p - 32 * layer;
    let gathered = (2 * root + 3 * layer) * 2;
    let per_gpu = |n: u64| {
        let allocated =
            [2, 2, 12].iter().map(|b| (b * p).div_ceil(n)).sum::<u64>() + fixed + gathered;
        let reserve = reserve + c_weight * ((2 * p).div_ceil(n) as f64 - (4 * p) as f64);
        let reserved = allocated as f64 + reserve;
        let high = (reserved / (1.0 + error_min) - allocated as f64).ceil() as u64;
        allocated + high.max(reserve.ceil() as u64) + vramlab::gpu::CONTEXT_BYTES
    };
    let h100 = j["gpu"]["gpu_bytes"].as_u64().unwrap();
    assert_eq!(
        h100,
        vramlab::gpu::by_name("h100-80gb").unwrap().total_bytes
    );
    let budget = (h100 as f64 * 0.9) as u64;
    let want = (2..64).find(|&n| per_gpu(n) <= budget).unwrap();
    assert_eq!(j["gpu"]["min_fsdp_gpus"].as_u64().unwrap(), want);

    vramlab()
        .arg("estimate")
        .args(args)
        .assert()
        .success()
        .stdout(contains("does NOT fit"))
        .stdout(contains(format!(
            "smallest FSDP (ZeRO-3) degree that fits h100-80gb: {want} GPUs"
        )))
        .stdout(contains("gradients"))
        .stdout(contains("GiB"));
}

#[test]
fn llama31_8b_kv_per_token_and_13b_weights() {
    let j = estimate_json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--context",
        "1",
    ]);
    assert_eq!(row(&j, "KV cache"), 2 * 32 * 8 * 128 * 2);
    assert_eq!(row(&j, "KV cache"), 131_072);
    assert_eq!(row(&j, "weights"), 2 * LLAMA31_8B_PARAMS);
    // KV line: the tokens an H100-80GB's budget holds after everything but the KV cache.
    let j = estimate_json(&[
        "--model",
        "llama-3.1-8b",
        "--context",
        "8192",
        "--gpu",
        "h100-80",
    ]);
    // Judged at the high end of NVML used's range (the reserve's held-out error).
    let rest: u64 = j["nvml_high_bytes"].as_u64().unwrap() - row(&j, "KV cache");
    let budget = (j["gpu"]["gpu_bytes"].as_u64().unwrap() as f64 * 0.9) as u64;
    assert_eq!(
        j["gpu"]["kv_capacity_tokens"].as_u64().unwrap(),
        (budget - rest) / 131_072
    );
}

#[test]
fn smollm2_preset_weights_match_the_gguf_loader() {
    let j = estimate_json(&["--model", "presets/smollm2-135m", "--precision", "f32"]);
    // docs/src/reference/architectures.md: the GGUF holds 134,515,008 parameters.
    assert_eq!(row(&j, "weights"), 134_515_008 * 4);
    let gguf = common::smollm2_gguf();
    let src = vramlab::model::Source::Gguf(gguf.clone());
    let cfg = src.config().unwrap();
    let dev = candle_core::Device::Cpu;
    let tensors =
        vramlab::model::weights::load(&src, &cfg, candle_core::DType::F32, &dev, |_, _| {})
            .unwrap();
    let loaded: u64 = tensors.values().map(|t| (t.elem_count() * 4) as u64).sum();
    assert_eq!(loaded, row(&j, "weights"));
    let g = estimate_json(&["--model", gguf.to_str().unwrap(), "--precision", "f32"]);
    assert_eq!(row(&g, "weights"), loaded);
}

#[test]
fn mistral_kv_window_caps_the_cache() {
    // Mistral-7B-v0.1: sliding_window 4096; 2 (K,V) · 32 layers · 8 kv heads · 128 · 2 B.
    let per_token = 2 * 32 * 8 * 128 * 2;
    let kv = |flags: &[&str]| {
        let mut args = vec![
            "--model",
            "mistral-7b-v0.1",
            "--context",
            "8192",
            "--batch",
            "2",
        ];
        args.extend_from_slice(flags);
        let j = estimate_json(&args);
        assert_eq!(j["model"]["architecture"], "mistral");
        assert_eq!(j["model"]["config"]["sliding_window"], 4096);
        assert_eq!(j["model"]["params"].as_u64().unwrap(), 7_241_732_096);
        row(&j, "KV cache")
    };
    assert_eq!(kv(&["--kv-window", "model"]), 4096 * per_token * 2);
    assert_eq!(kv(&["--kv-window", "full"]), 8192 * per_token * 2);
    // The default caps at the window under either runtime: transformers' StaticCache and
    // generate()'s DynamicCache keep 4096 tokens of this config, as candle's cache does.
    assert_eq!(kv(&[]), 4096 * per_token * 2);
    assert_eq!(kv(&["--runtime", "candle"]), 4096 * per_token * 2);
    vramlab()
        .args([
            "estimate",
            "--model",
            "mistral-7b-v0.1",
            "--kv-window",
            "half",
        ])
        .assert()
        .code(2);
}

#[test]
fn gpt2_has_an_analytic_path_and_bad_input_exits_2() {
    let j = estimate_json(&["--model", "gpt2", "--context", "1024", "--precision", "f32"]);
    // 50257·768 + 1024·768 + 12·(12·768² + 13·768) + 2·768
    assert_eq!(j["model"]["params"].as_u64().unwrap(), 124_439_808);
    assert_eq!(row(&j, "KV cache"), 2 * 12 * 768 * 4 * 1024);
    vramlab()
        .args(["estimate", "--model", "no-such-model"])
        .assert()
        .code(2)
        .stderr(contains("presets:"));
    vramlab()
        .args(["estimate", "--model", "gpt2", "--gpu", "toaster"])
        .assert()
        .code(2)
        .stderr(contains("unknown --gpu"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("c.toml");
    std::fs::write(&bad, "schema = 'x'").unwrap();
    vramlab()
        .args([
            "estimate",
            "--model",
            "gpt2",
            "--constants",
            bad.to_str().unwrap(),
        ])
        .assert()
        .code(2)
        .stderr(contains("c.toml"));
}

/// Sweeps `scenario`, fits on the rows `held` rejects, and returns every row, the constants
/// file and the sorted relative errors of the held-out rows' predicted peak allocated bytes.
fn sweep_fit_heldout(
    dir: &Path,
    scenario: &str,
    held: impl Fn(&Record) -> bool,
) -> (Vec<Record>, PathBuf, Vec<f64>) {
    let csv = dir.join("synth.csv");
    vramlab()
        .args(["sweep", "--quiet", scenario, "--out", csv.to_str().unwrap()])
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&csv).unwrap();
    let train = dir.join("train.csv");
    let mut w = CsvExporter::create(&train).unwrap();
    for r in rows.iter().filter(|r| !held(r)) {
        w.write(r).unwrap();
    }
    drop(w);
    let constants = dir.join("constants.toml");
    vramlab()
        .args([
            "fit",
            train.to_str().unwrap(),
            "--out",
            constants.to_str().unwrap(),
        ])
        .assert()
        .success()
        .stdout(contains("held-out k-fold by point"))
        .stdout(contains("leave-one-context-out"));
    let c: Constants = toml::from_str(&std::fs::read_to_string(&constants).unwrap()).unwrap();
    let mut err: Vec<f64> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| held(r) && r.status == Some(Status::Ok))
    {
        // The row as phase `phase` of the same point and step: its group and its terms (the
        // optimizer state's liveness depends on the phase in the first step).
        let predict = |phase: Phase| {
            let as_phase = Record {
                phase: Some(phase),
                ..r.clone()
            };
            let k = GroupKey::of(&as_phase).unwrap();
            let g = c.find(&k, Target::PeakAllocated).expect("a fitted group");
            g.model.predict(&record_terms(&as_phase).unwrap())
        };
        // A training step's peak is the envelope of its phases' (as `estimate` predicts it).
        let predicted = if r.phase == Some(Phase::StepTotal) {
            [Phase::Forward, Phase::Backward, Phase::Optimizer]
                .map(predict)
                .into_iter()
                .fold(0.0, f64::max)
        } else {
            predict(r.phase.unwrap())
        };
        let measured = r.peak_allocated.unwrap() as f64;
        err.push((predicted - measured).abs() / measured);
    }
    err.sort_by(f64::total_cmp);
    (rows, constants, err)
}

/// `estimate --json` of the fit-synth model in f32 at (batch, context) with `constants`:
/// asserts that the source names the fitted group `source` and returns the total bytes.
fn fitted_estimate(constants: &Path, mode: &str, (b, c): (u32, u32), source: &str) -> f64 {
    let (b, c) = (b.to_string(), c.to_string());
    let j = estimate_json(&[
        "--model",
        "scenarios/fit-synth/config.json",
        "--mode",
        mode,
        "--precision",
        "f32",
        "--batch",
        &b,
        "--context",
        &c,
        "--constants",
        constants.to_str().unwrap(),
        "--runtime",
        "candle",
        "--backend",
        "cpu",
    ]);
    let got = j["source"].as_str().unwrap();
    assert!(got.starts_with(source), "{got}");
    j["total_bytes"].as_u64().unwrap() as f64
}

/// Median ≤ 1% and p95 ≤ 3% over at least `min_rows` held-out rows.
fn assert_heldout(what: &str, err: &[f64], min_rows: usize) {
    assert!(err.len() >= min_rows, "{what}: {} held-out rows", err.len());
    let q = |p: f64| err[((p * (err.len() - 1) as f64).round()) as usize];
    eprintln!(
        "{what} held-out peak_allocated: {} rows, median {:.3}%, p95 {:.3}%, worst {:.3}%",
        err.len(),
        100.0 * q(0.5),
        100.0 * q(0.95),
        100.0 * err[err.len() - 1]
    );
    assert!(
        q(0.5) <= 0.01 && q(0.95) <= 0.03,
        "{what}: median {} p95 {}",
        q(0.5),
        q(0.95)
    );
}

/// Sweep a synthetic llama on CPU, fit on most points, and predict the held-out points' peak
/// allocated bytes from the written constants: median ≤ 1%, p95 ≤ 3%.
#[test]
fn synthetic_sweep_fit_estimate_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    // Hold out a diagonal of the (batch, context) grid: inside the grid, never a whole axis value.
    let held = |r: &Record| (r.batch + r.context / 48) & 3 == 0;
    let (rows, constants, err) = sweep_fit_heldout(dir.path(), "scenarios/fit-synth.toml", held);
    assert_heldout("inference", &err, 40);

    // `estimate` picks the fitted group for the same architecture, precision and cache kind.
    let est = fitted_estimate(
        &constants,
        "infer",
        (2, 96),
        "fitted llama/cpu/f32/infer/preallocated/total",
    );
    // That point was held out; the estimate fills the whole context with prompt (96 tokens,
    // the sweep's prompt was 88), so it may exceed the measurement, but not by much.
    let measured = rows
        .iter()
        .find(|r| {
            r.batch == 2
                && r.context == 96
                && r.kv_cache == Some(vramlab::vocab::KvKind::Preallocated)
                && r.phase == Some(Phase::Total)
        })
        .and_then(|r| r.peak_allocated)
        .unwrap() as f64;
    assert!(
        (est - measured).abs() / measured < 0.05,
        "estimate {est} measured {measured}"
    );
}

#[test]
fn fit_rejects_unusable_input_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.toml");
    vramlab()
        .args(["fit", "/nonexistent/x.csv", "--out", out.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(contains("/nonexistent/x.csv"));
    // A CSV with the header only has nothing to fit.
    let empty = dir.path().join("empty.csv");
    drop(CsvExporter::create(&empty).unwrap());
    vramlab()
        .args([
            "fit",
            empty.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .assert()
        .code(2)
        .stderr(contains("no fittable rows"));
    assert!(!out.exists());
}

/// The same for training rows (forward, backward, optimizer and step_total of two AdamW
/// steps), then `estimate --mode train --constants` on a held-out point against its measured
/// steady-state step.
#[test]
fn synthetic_training_fit_estimate_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let held = |r: &Record| (r.batch + r.context / 32) & 3 == 0;
    let (rows, constants, err) =
        sweep_fit_heldout(dir.path(), "scenarios/fit-train-synth.toml", held);
    assert_heldout("training", &err, 30);
    // At b3/c32 the backward peak (activations) and the optimizer peak (AdamW's update
    // transients) are within 2% of each other: the envelope must pick the right one.
    let est = fitted_estimate(
        &constants,
        "train",
        (3, 32),
        "fitted llama/cpu/f32/train/adamw+none+full/backward",
    );
    let measured = rows
        .iter()
        .find(|r| {
            (r.batch, r.context, r.step) == (3, 32, Some(2)) && r.phase == Some(Phase::StepTotal)
        })
        .and_then(|r| r.peak_allocated)
        .unwrap() as f64;
    assert!(
        (est - measured).abs() / measured < 0.03,
        "estimate {est} measured {measured}"
    );
}

/// CPU candle constants answering a torch query on an H200: refused in one line (exit 2);
/// with --allow-transfer a warning line, and the exact KV bytes whatever the constants say.
#[test]
fn cpu_constants_are_refused_for_a_gpu_query_and_never_change_exact_terms() {
    let c = "results/cpu/cpu-smollm2.constants.toml";
    let base = [
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--constants",
        c,
        "--gpu",
        "h200",
    ];
    let out = vramlab().args(base).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(c) && err.contains("--allow-transfer"), "{err}");
    let out = vramlab()
        .args(base)
        .args(["--allow-transfer", "--json"])
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(err.starts_with("warning: "), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert!(j["constants"].as_str().unwrap().contains("on cpu"), "{j}");
    // 2 (K, V) · 32 layers · 8 KV heads · 128 head_dim · 2 B · 4096 tokens.
    assert_eq!(row(&j, "KV cache"), 2 * 32 * 8 * 128 * 2 * 4096);
    let analytic = estimate_json(&["--model", "llama-3.1-8b"]);
    for r in ["weights", "KV cache", "gradients", "optimizer state"] {
        assert_eq!(row(&j, r), row(&analytic, r), "{r}");
    }
    // Constants of another schema or runtime are one-line errors naming the file.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join(c)).unwrap();
    for (name, bad) in [
        ("old.toml", text.replacen("schema = 3", "schema = 2", 1)),
        (
            "rt.toml",
            text.replacen("runtime = \"candle\"", "runtime = \"jax\"", 1),
        ),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, bad).unwrap();
        let out = vramlab()
            .args(["estimate", "--model", "llama-3.1-8b", "--constants"])
            .arg(&p)
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(name), "{err}");
    }
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

/// Runs `vramlab estimate args...` and checks the overflow error: exit 2, nothing on stdout,
/// one line on stderr naming `flag` and the figure, no panic (the test binary is a debug build,
/// where unchecked arithmetic would panic).
fn overflows(args: &[&str], flag: &str, figure: &str) {
    let out = vramlab().arg("estimate").args(args).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert_eq!(
        err.trim_end(),
        format!("error: {flag}: the estimate's byte figures exceed 2^64 B ({figure})")
    );
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
