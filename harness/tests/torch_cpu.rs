//! The torch probe on CPU (issue 10), through `scripts/torch-cpu.sh`, on a tiny synthetic llama
//! and on the real SmolLM2-135M GGUF, for each torch AdamW implementation:
//! - gradients after backward = parameter bytes (+ ≤ 1 KiB per parameter tensor);
//! - AdamW state after step 1 = 2 × parameter bytes (+ ≤ 1 KiB per state tensor: torch 2.15
//!   `torch/optim/adam.py` lines 169-183 create `step`, `exp_avg`, `exp_avg_sq` per parameter);
//! - the step-2 optimizer transient, against what torch's adam.py allocates:
//!   - for-loop, line 545 `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: two
//!     temporaries of one parameter's size at once, 2 × the largest tensor;
//!   - foreach, line 791 `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`: one copy
//!     of every parameter, 1 × parameter bytes;
//!   - fused, line 878 `torch._fused_adamw_`: in place, nothing of parameter size;
//! - the CSV is accepted by `vramlab fit`.
//!
//! The parameter figures are derived independently, from the config through vramlab's
//! `Config::tensor_shapes` (checked against the by-hand SmolLM2 count).
//!
//! These need torch: they are `#[ignore]`d, and scripts/test.sh runs them after
//! scripts/torch-env.sh, with VRAMLAB_TORCH_PYTHON set. Each probe is a process of its own, so
//! the counts are the probe's alone. The bad-input tests below need no torch and always run.
mod common;
use common::{models, root, vramlab, SMOLLM2_PARAMS};
use std::path::{Path, PathBuf};
use vramlab::model::Config;
use vramlab::record::{Phase, Record, Status};
use vramlab::vocab::{Attention, Kernels, MeterKind};

const KIB: u64 = 1024;

/// What the derivations need from a config: parameter count, tensor count, largest tensor.
struct Params {
    count: u64,
    tensors: u64,
    largest: u64,
}

fn params(config: &Path) -> Params {
    let cfg = Config::from_file(config).unwrap();
    let sizes: Vec<u64> = cfg
        .tensor_shapes()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), cfg.param_count());
    Params {
        count: cfg.param_count(),
        tensors: sizes.len() as u64,
        largest: *sizes.iter().max().unwrap(),
    }
}

fn torch_cpu(scenario: &Path, out: &Path, implementation: &str) -> Vec<Record> {
    let python = std::env::var("VRAMLAB_TORCH_PYTHON").expect(
        "VRAMLAB_TORCH_PYTHON is not set: these tests run from scripts/test.sh, after scripts/torch-env.sh",
    );
    let st = std::process::Command::new(root().join("scripts/torch-cpu.sh"))
        .arg(scenario)
        .arg("--out")
        .arg(out)
        .args(["--torch-optim", implementation])
        .env("VRAMLAB_TORCH_PYTHON", python)
        .env("VRAMLAB_MODELS", models())
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "torch-cpu.sh {} failed: {}",
        scenario.display(),
        String::from_utf8_lossy(&st.stderr)
    );
    let rows: Vec<Record> = csv::Reader::from_path(out)
        .unwrap()
        .deserialize()
        .map(|r| r.unwrap())
        .collect();
    for r in &rows {
        assert_eq!(
            r.status,
            Some(Status::Ok),
            "{} {:?}: {}",
            r.point_id,
            r.phase,
            r.message
        );
        assert_eq!(r.meter, MeterKind::CpuPreload);
        assert_eq!(
            (r.kernels, r.attention),
            (Kernels::Reference, Attention::Eager)
        );
    }
    rows
}

fn row<'a>(rows: &'a [Record], point: &str, phase: Phase, step: u64) -> &'a Record {
    rows.iter()
        .find(|r| r.point_id == point && r.phase == Some(phase) && r.step == Some(step))
        .unwrap_or_else(|| panic!("no {phase:?} row of step {step} for {point}"))
}

/// Checks the acceptance figures of one training point; `bytes` per master parameter.
fn check_training(rows: &[Record], point: &str, p: &Params, bytes: u64, implementation: &str) {
    let pb = p.count * bytes;
    let fwd1 = row(rows, point, Phase::Forward, 1);
    let bwd1 = row(rows, point, Phase::Backward, 1);
    let opt1 = row(rows, point, Phase::Optimizer, 1);
    let opt2 = row(rows, point, Phase::Optimizer, 2);
    assert_eq!(
        fwd1.param_count, p.count,
        "{point}: torch's parameter count"
    );
    assert_eq!(
        fwd1.optimizer.to_string(),
        format!("adamw-{implementation}")
    );
    let start = fwd1.baseline_allocated.unwrap();
    let grads = bwd1.end_allocated.unwrap() - start;
    let state = opt1.end_allocated.unwrap() - start;
    let transient = opt2.peak_allocated.unwrap() - opt2.baseline_allocated.unwrap();
    eprintln!(
        "{point} [{implementation}]: params {pb} B in {} tensors (largest {} B); grads {grads} B \
         (+{}), AdamW state {state} B (+{} over 2x), step-2 transient {transient} B",
        p.tensors,
        p.largest * bytes,
        grads as i64 - pb as i64,
        state as i64 - 2 * pb as i64,
    );
    assert!(
        (pb..=pb + KIB * p.tensors).contains(&grads),
        "{point}: gradients {grads} B, parameters {pb} B"
    );
    assert!(
        (2 * pb..=2 * pb + KIB * 3 * p.tensors).contains(&state),
        "{point}: AdamW state {state} B, 2 x parameters {} B",
        2 * pb
    );
    let slack = KIB * p.tensors;
    let expected = match implementation {
        "for-loop" => 2 * p.largest * bytes,
        "foreach" => pb,
        "fused" => 0,
        other => panic!("{other}"),
    };
    assert!(
        (expected..=expected + slack).contains(&transient),
        "{point} [{implementation}]: step-2 transient {transient} B, adam.py says {expected} B"
    );
}

/// A tiny llama (untied LM head), built by transformers' LlamaForCausalLM.from_config.
fn tiny(dir: &Path) -> (PathBuf, PathBuf) {
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1024,
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}"#,
    )
    .unwrap();
    let scenario = dir.join("tiny.toml");
    std::fs::write(
        &scenario,
        format!(
            r#"name = "tiny-torch"
device = "cpu"
[model]
source = "synthetic:{}"
[[sweep]]
mode = ["train"]
precision = ["f32", "mixed-bf16"]
batch = [1, 2]
context = [16, 32]
optimizer = ["adamw"]
train_steps = 2
[[sweep]]
mode = ["infer"]
precision = ["f32"]
batch = [1, 2]
context = [32, 64]
kv_cache = ["preallocated", "growing"]
decode_steps = 8
decode_every = 4
"#,
            config.display()
        ),
    )
    .unwrap();
    (config, scenario)
}

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_llama_gradients_state_and_transients_per_implementation() {
    let dir = tempfile::tempdir().unwrap();
    let (config, scenario) = tiny(dir.path());
    let p = params(&config);
    for implementation in ["foreach", "for-loop", "fused"] {
        let out = dir.path().join(format!("tiny-{implementation}.csv"));
        let rows = torch_cpu(&scenario, &out, implementation);
        for (precision, bytes) in [("f32", 4), ("mixed-bf16", 4)] {
            for (b, c) in [(1, 16), (2, 32)] {
                let point =
                    format!("synthetic-tiny/train/{precision}/b{b}/c{c}/adamw/none/ga1/full");
                let point = point.replace("synthetic-tiny", &rows[0].model_id);
                check_training(&rows, &point, &p, bytes, implementation);
            }
        }
        if implementation == "foreach" {
            let constants = dir.path().join("tiny.toml.fit");
            vramlab()
                .arg("fit")
                .arg(&out)
                .arg("--out")
                .arg(&constants)
                .assert()
                .success();
            assert!(std::fs::read_to_string(&constants)
                .unwrap()
                .contains("llama"));
        }
    }
}

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn smollm2_gguf_gradients_state_and_transients_per_implementation() {
    let gguf = common::smollm2_gguf();
    let p = params(&root().join("harness/presets/smollm2-135m/config.json"));
    assert_eq!(p.count, SMOLLM2_PARAMS);
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("smollm2.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"smollm2-torch\"\ndevice = \"cpu\"\n[model]\nsource = \"gguf:{}\"\n\
             [sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [64]\n\
             optimizer = [\"adamw\"]\ntrain_steps = 2\n",
            gguf.display()
        ),
    )
    .unwrap();
    for implementation in ["foreach", "for-loop", "fused"] {
        let out = dir.path().join(format!("smollm2-{implementation}.csv"));
        let rows = torch_cpu(&scenario, &out, implementation);
        let point = "SmolLM2-135M-Instruct.Q4_1/train/f32/b1/c64/adamw/none/ga1/full";
        check_training(&rows, point, &p, 4, implementation);
        let load = rows
            .iter()
            .find(|r| r.point_id == point && r.phase == Some(Phase::Load))
            .unwrap();
        assert_eq!(load.feature_weight_bytes, Some(SMOLLM2_PARAMS * 4));
        vramlab()
            .arg("fit")
            .arg(&out)
            .arg("--out")
            .arg(dir.path().join("smollm2.fit.toml"))
            .assert()
            .success();
    }
}

fn probe_without_torch(scenario_text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(&scenario, scenario_text).unwrap();
    std::process::Command::new("python3")
        .arg(root().join("scripts/torch_probe.py"))
        .arg(&scenario)
        .args(["--device", "cpu", "--out"])
        .arg(dir.path().join("o.csv"))
        .env_remove("LD_PRELOAD")
        .current_dir(root())
        .output()
        .unwrap()
}

fn one_line_exit_2(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

const SMALL: &str = "name = \"s\"\n[model]\nsource = \"synthetic:c.json\"\n[sweep]\n\
    mode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [8]\n";

#[test]
fn an_unrunnable_scenario_is_one_line_and_exit_2() {
    let out = probe_without_torch(&format!("{SMALL}kernels = \"fused\"\n"));
    one_line_exit_2(&out, "cannot run `kernels = \"fused\"`");
    let out = probe_without_torch(&format!("{SMALL}trainable = [\"lora-rx\"]\n"));
    one_line_exit_2(&out, "cannot run `trainable = \"lora-rx\"`");
}

#[test]
fn cpu_without_the_preload_meter_is_one_line_and_exit_2() {
    let out = probe_without_torch(SMALL);
    one_line_exit_2(&out, "LD_PRELOAD=libvramlab_preload.so");
}
