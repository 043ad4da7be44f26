//! Shared helpers for integration tests.
#![allow(dead_code)]
use std::path::PathBuf;

mod generation;
// Not every test binary uses the generation helpers.
#[allow(unused_imports)]
pub use generation::*;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A program or file of the emulator tests (`harness/tests/data/emulate/NAME`).
pub fn emulate_data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/emulate")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The torch environment's python (`$VRAMLAB_TORCH_PYTHON`, from scripts/torch-env.sh).
pub fn torch_python() -> String {
    std::env::var("VRAMLAB_TORCH_PYTHON")
        .expect("VRAMLAB_TORCH_PYTHON: the torch environment's python (scripts/torch-env.sh)")
}

/// `$VRAMLAB_MODELS`, default `<root>/.cache/models`.
pub fn models() -> PathBuf {
    std::env::var_os("VRAMLAB_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/models"))
}

/// The real SmolLM2-135M GGUF. Fails (does not skip) when it is missing.
pub fn smollm2_gguf() -> PathBuf {
    let p = models().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-test-models.sh first",
        p.display()
    );
    p
}

/// The vramlab binary, run from the workspace root with VRAMLAB_MODELS set.
pub fn vramlab() -> assert_cmd::Command {
    let mut c = assert_cmd::Command::cargo_bin("vramlab").expect("binary built");
    c.current_dir(root()).env("VRAMLAB_MODELS", models());
    c
}

/// SmolLM2-135M's parameter count from its published shapes, by hand (not from `Config`):
/// embedding (tied) + 30 layers × (q, k, v, o, gate, up, down, 2 norms) + final norm.
pub const SMOLLM2_PARAMS: u64 = {
    let (v, d, f, kv, l) = (49_152u64, 576u64, 1_536u64, 192u64, 30u64);
    v * d + l * (d * d + 2 * d * kv + d * d + 3 * d * f + 2 * d) + d
};
pub const SMOLLM2_TENSORS: u64 = 1 + 30 * 9 + 1;
/// 2 · L · n_kv · head_dim = 2 · 30 · 3 · 64 elements of K and V per token.
pub const SMOLLM2_KV_ELEMS_PER_TOKEN: u64 = 2 * 30 * 3 * 64;

/// max |t| over all elements, as f32.
pub fn max_abs(t: &candle_core::Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// max |a − b| over all elements, as f32.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    max_abs(&(a - b).unwrap())
}

/// The columns that must be identical between runs (ARCHITECTURE.md §4: allocated figures and
/// features; timestamps, run ids, RSS and device_used may differ).
pub fn stable(r: &vramlab::record::Record) -> impl PartialEq + std::fmt::Debug {
    (
        r.point_id.clone(),
        r.phase,
        r.step,
        r.kv_tokens,
        r.baseline_allocated,
        r.peak_allocated,
        r.end_allocated,
        (
            r.feature_weight_bytes,
            r.feature_kv_bytes,
            r.feature_act_bytes,
            r.feature_logits_bytes,
            r.feature_optimizer_bytes,
        ),
        r.status,
    )
}

/// A preallocated cache of `bpt` bytes per token: allocated whole in the prefill (its
/// `context` tokens, plus at most 512 B of metadata for each of SmolLM2's 60 K/V tensors),
/// and constant through the decode rows.
pub fn check_preallocated_kv(
    id: &str,
    pre: &vramlab::record::Record,
    decodes: &[&vramlab::record::Record],
    bpt: u64,
) {
    let kv = bpt * pre.context * pre.batch;
    assert_eq!(pre.feature_kv_bytes, Some(kv), "{id}");
    let grown = pre.end_allocated.unwrap() - pre.baseline_allocated.unwrap();
    // 60 cache tensors (K and V per layer) of metadata, plus the (batch, 1) next-token ids.
    assert!(
        grown >= kv && grown - kv <= 512 * 60,
        "{id}: cache grew {grown}, expected {kv} + <= 30720"
    );
    let ends: Vec<u64> = decodes.iter().map(|r| r.end_allocated.unwrap()).collect();
    assert!(
        ends.iter().all(|&e| e == pre.end_allocated.unwrap()),
        "{id}: {ends:?}"
    );
}

/// A growing cache of `bpt` bytes per token: each decode row holds exactly its new tokens
/// more than the prefill.
pub fn check_growing_kv(
    id: &str,
    pre: &vramlab::record::Record,
    decodes: &[&vramlab::record::Record],
    bpt: u64,
) {
    for d in decodes {
        let t = d.step.unwrap();
        assert_eq!(d.kv_tokens, Some(pre.prompt_len.unwrap() + t));
        assert_eq!(
            d.end_allocated.unwrap() - pre.end_allocated.unwrap(),
            bpt * t * pre.batch,
            "{id} step {t}"
        );
        assert_eq!(
            d.feature_kv_bytes,
            Some(bpt * d.kv_tokens.unwrap() * d.batch)
        );
    }
}

/// The records of a vramlab CSV, read back through the crate's own reader.
pub fn read_rows(path: &std::path::Path) -> Vec<vramlab::record::Record> {
    vramlab::export::csv::read(path).unwrap()
}

/// `field` of the entry named `name` in the array `list` of an estimate's JSON: an exact row's
/// `bytes` (`"exact"`) or a phase's `peak_bytes` (`"phases"`). Panics naming a missing entry.
pub fn named_u64(v: &serde_json::Value, list: &str, name: &str, field: &str) -> u64 {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no `{list}` array"))
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no `{name}` in `{list}`"))[field]
        .as_u64()
        .unwrap()
}

/// A command's stdout, after asserting that it succeeded (its stderr in the failure message).
pub fn ok_stdout(out: std::process::Output) -> Vec<u8> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A phase's activations: its peak over its baseline.
pub fn act(m: &vramlab::meter::PhaseMemory) -> f64 {
    (m.peak_allocated - m.baseline_allocated) as f64
}
/// Exit 2 with one line on stderr (no panic) that says `needle`.
pub fn one_line_exit_2(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
}

/// The rows of one fine-tuning point: a `load` row, then `forward`, `backward`, `optimizer` and
/// `step_total` rows for steps 1..=`steps`, all ok and in mode train.
pub fn assert_train_rows(rows: &[&vramlab::record::Record], steps: u64, what: &str) {
    let phases: Vec<String> = rows
        .iter()
        .map(|r| {
            let step = r.step.map(|s| s.to_string()).unwrap_or_default();
            format!("{}{step}", r.phase.unwrap().as_str())
        })
        .collect();
    let mut want = vec!["load".to_string()];
    for s in 1..=steps {
        for ph in ["forward", "backward", "optimizer", "step_total"] {
            want.push(format!("{ph}{s}"));
        }
    }
    assert_eq!(phases, want, "{what}");
    for r in rows {
        assert_eq!(r.status, Some(vramlab::record::Status::Ok), "{what}");
        assert_eq!(r.mode, vramlab::vocab::Mode::Train, "{what}");
    }
}

/// The rows of two fine-tuning steps (`training::run_steps`): the gradients held at the end of
/// step 1's backward are the adapters' `lora_bytes`, AdamW's state at the end of its optimizer
/// phase twice that, each over the live bytes before the step plus ≤ 1 KiB of bookkeeping per
/// adapter tensor (`tensors`); step 2's forward and backward peaks over its baseline equal step
/// 1's (±0.1 %, plus one page: gemm allocates a packing buffer the first time a rayon worker
/// packs a given shape, and which worker runs which product depends on the scheduler; seen once
/// under load: 2,176 B at step 1 of a 1.2 MB tiny backward). Returns (gradients, state) bytes.
pub fn check_lora_steps(
    rows: &[vramlab::workload::inference::PhaseResult],
    lora_bytes: i64,
    tensors: usize,
    what: &str,
) -> (i64, i64) {
    use vramlab::record::Phase;
    let at = |step: u64, ph: Phase| {
        rows.iter()
            .find(|r| r.step == Some(step) && r.phase == ph)
            .unwrap()
            .mem
    };
    let before = at(1, Phase::Forward).baseline_allocated as i64;
    let grads = at(1, Phase::Backward).end_allocated as i64 - before;
    let state = at(1, Phase::Optimizer).end_allocated as i64 - before;
    let slack = 1024 * tensors as i64;
    println!("{what}: adapters {lora_bytes} B, gradients {grads} B, AdamW state {state} B");
    assert!(
        grads >= lora_bytes && grads - lora_bytes <= slack,
        "{what}: gradients {grads} vs the adapters' {lora_bytes}"
    );
    assert!(
        state >= 2 * lora_bytes && state - 2 * lora_bytes <= slack,
        "{what}: AdamW state {state} vs 2 × {lora_bytes}"
    );
    for ph in [Phase::Forward, Phase::Backward] {
        let over = |s| (at(s, ph).peak_allocated - at(s, Phase::Forward).baseline_allocated) as f64;
        let (p1, p2) = (over(1), over(2));
        println!("  {ph:?} peak over the step's baseline: {p1} then {p2}");
        assert!(
            (p2 - p1).abs() <= 1e-3 * p1 + 4096.0,
            "{what} {ph:?}: {p1} then {p2}"
        );
    }
    (grads, state)
}

/// The tiny fine-tuning runs' spec: batch 2 of 7 text tokens, AdamW at lr 1e-3, no
/// checkpointing or accumulation, `steps` steps.
pub fn tiny_train_spec(steps: usize) -> vramlab::workload::training::TrainSpec {
    vramlab::workload::training::TrainSpec {
        batch: 2,
        seq: 7,
        optimizer: vramlab::vocab::Optimizer::Adamw,
        checkpointing: vramlab::vocab::Checkpointing::None,
        grad_accum: 1,
        steps,
        lr: 1e-3,
    }
}

/// The committed emulated sweeps the built-in allocator reserve (default stack) is fitted on.
pub const RESERVE_CSVS: [&str; 2] = [
    "results/emulated/a100-80gb-emu-corpus-llm.csv",
    "results/emulated/a100-80gb-emu-reserve-llm.csv",
];
/// The built-in reserve fit of the default stack.
pub const RESERVE_CONSTANTS: &str = "results/emulated/a100-80gb-emu-reserve-llm.constants.toml";

/// A reserve class as a constants file spells it: `load`, `mode`, `attention`,
/// `checkpointing`, `lora`, `mixed`, `growing` (inference with a growing KV cache).
pub type ReserveKey = (
    bool,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
    bool,
);

/// The `[[reserve]]` table of `class` in the constants file `constants`.
pub fn reserve_table(constants: &str, class: ReserveKey) -> toml::Value {
    let text = std::fs::read_to_string(root().join(constants)).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    let (load, mode, attention, ck, lora, mixed, growing) = class;
    v["reserve"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            let c = &t["class"];
            c["load"].as_bool() == Some(load)
                && c["mode"].as_str() == Some(mode)
                && c["attention"].as_str() == Some(attention)
                && c["checkpointing"].as_str() == Some(ck)
                && c["lora"].as_bool() == Some(lora)
                && c["mixed"].as_bool() == Some(mixed)
                && c["growing"].as_bool() == Some(growing)
        })
        .unwrap_or_else(|| panic!("{constants}: no reserve class {class:?}"))
        .clone()
}

/// The coefficients by term name of `class`'s reserve model in `constants`.
pub fn reserve_coefficients(
    constants: &str,
    class: ReserveKey,
) -> std::collections::BTreeMap<String, f64> {
    reserve_table(constants, class)["coefficients"]
        .as_table()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_float().unwrap()))
        .collect()
}

/// A reserve model evaluated the way the documentation states it: Σ coefficient × term over
/// the terms in the constants format's order (const, weight, kv, act, logits, attn), rounded
/// up to a byte.
pub fn reserve_of(c: &std::collections::BTreeMap<String, f64>, terms: &[(&str, f64)]) -> u64 {
    let at = |name: &str| terms.iter().find(|t| t.0 == name).map_or(0.0, |t| t.1);
    ["const", "weight", "kv", "act", "logits", "attn"]
        .iter()
        .map(|t| c.get(*t).copied().unwrap_or(0.0) * at(t))
        .sum::<f64>()
        .max(0.0)
        .ceil() as u64
}

/// `vramlab estimate ARGS --json`, which must succeed, parsed.
pub fn estimate_json(args: &[&str]) -> serde_json::Value {
    let out = vramlab()
        .arg("estimate")
        .args(args)
        .arg("--json")
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

/// The bytes of the breakdown row `name` of an estimate's JSON.
pub fn estimate_row(j: &serde_json::Value, name: &str) -> u64 {
    j["breakdown"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {j}"))["bytes"]
        .as_u64()
        .unwrap()
}

/// `estimate --runtime vllm --enforce-eager --json` of `preset` on `gpu`, with `more` flags.
pub fn serving_estimate(preset: &str, gpu: &str, more: &[&str]) -> serde_json::Value {
    let base = ["--model", preset, "--runtime", "vllm", "--gpu", gpu];
    estimate_json(&[&base[..], &["--enforce-eager"], more].concat())
}

/// The committed scenarios (scenarios/*.toml), in order.
pub fn scenarios() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    assert!(!v.is_empty());
    v
}
