//! Sweep, fit and estimate end to end: held-out errors, refusals, CPU constants never for a GPU query.
use super::*;

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
