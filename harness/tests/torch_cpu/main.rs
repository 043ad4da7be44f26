//! The torch probe on CPU, through `scripts/torch-cpu.sh`, on a tiny synthetic llama
//! (each torch AdamW implementation) and on the real SmolLM2-135M GGUF (the for-loop one):
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
#[path = "../common/mod.rs"]
mod common;
use common::{models, one_line_exit_2, root, vramlab, SMOLLM2_PARAMS};
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

/// Runs scripts/torch-cpu.sh on `scenario` into `out` with one more option (`flag value`).
fn torch_cpu_sh(scenario: &Path, out: &Path, flag: &str, value: &str) {
    let python = std::env::var("VRAMLAB_TORCH_PYTHON").expect(
        "VRAMLAB_TORCH_PYTHON is not set: these tests run from scripts/test.sh, after scripts/torch-env.sh",
    );
    let st = std::process::Command::new(root().join("scripts/torch-cpu.sh"))
        .arg(scenario)
        .arg("--out")
        .arg(out)
        .args([flag, value])
        .env("VRAMLAB_TORCH_PYTHON", python)
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
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
}

fn torch_cpu(scenario: &Path, out: &Path, implementation: &str) -> Vec<Record> {
    torch_cpu_sh(scenario, out, "--torch-optim", implementation);
    let rows = ok_preload_rows(out);
    for r in &rows {
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

fn probe_without_torch(scenario_text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(&scenario, scenario_text).unwrap();
    std::process::Command::new("python3")
        .arg(root().join("harness/python/vramlab/probe"))
        .arg(&scenario)
        .args(["--device", "cpu", "--out"])
        .arg(dir.path().join("o.csv"))
        .env_remove("LD_PRELOAD")
        .env("VRAMLAB_BIN", assert_cmd::cargo::cargo_bin("vramlab"))
        .current_dir(root())
        .output()
        .unwrap()
}

const SMALL: &str = "name = \"s\"\n[model]\nsource = \"synthetic:c.json\"\n[sweep]\n\
    mode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [8]\n";

// ------------------------------------------------------------------------- generation --

/// A tiny Stable Diffusion directory in the diffusers layout (the configs vramlab writes: a
/// two-block UNet, a four-block VAE, a two-layer CLIP), with weights written by vramlab's own
/// synthetic writer, so that diffusers and transformers load the file candle loads.
fn tiny_sd(dir: &Path) -> vramlab::model::diffusion::sd::SdConfig {
    for (c, json) in [
        (
            "unet",
            r#"{"in_channels": 4, "out_channels": 4, "block_out_channels": [32, 64],
                "layers_per_block": 1, "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
                "attention_head_dim": 2, "sample_size": 8}"#,
        ),
        (
            "vae",
            r#"{"block_out_channels": [32, 32, 32, 32], "layers_per_block": 1, "sample_size": 64}"#,
        ),
        (
            "text_encoder",
            r#"{"architectures": ["CLIPTextModel"], "vocab_size": 100, "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "max_position_embeddings": 77, "hidden_act": "quick_gelu", "projection_dim": 32}"#,
        ),
    ] {
        std::fs::create_dir_all(dir.join(c)).unwrap();
        std::fs::write(dir.join(c).join("config.json"), json).unwrap();
    }
    let cfg = vramlab::model::diffusion::sd::SdConfig::from_dir(dir).unwrap();
    let sd = vramlab::model::diffusion::sd::Sd::new(
        cfg.clone(),
        candle_core::DType::F32,
        candle_core::DType::F32,
    );
    vramlab::workload::generate::write_synthetic(&sd, dir).unwrap();
    cfg
}

/// The torch probe on a generation scenario, with `--attention`.
fn run_generate(scenario: &Path, out: &Path, attention: &str) {
    torch_cpu_sh(scenario, out, "--attention", attention);
}

/// The rows of a torch probe CSV, each asserted ok and measured by the preload meter.
fn ok_preload_rows(csv_path: &Path) -> Vec<Record> {
    let rows: Vec<Record> = csv::Reader::from_path(csv_path)
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
    }
    rows
}

/// The rows of a generation CSV; every row ok, generation rows of the cpu meter.
fn generate_rows(csv_path: &Path, attention: &str) -> Vec<Record> {
    let rows = ok_preload_rows(csv_path);
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r.mode, vramlab::vocab::Mode::Generate);
        assert_eq!(r.attention.to_string(), attention);
    }
    rows
}

/// `key=value` of a row's message.
fn message_value(r: &Record, key: &str) -> u64 {
    r.message
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{}: no {key} in `{}`", r.point_id, r.message))
        .parse()
        .unwrap()
}

fn act(r: &Record) -> u64 {
    r.peak_allocated.unwrap() - r.baseline_allocated.unwrap()
}

/// The rows of one generation point, checked for shape: a load row per `components`, one
/// text_encode, `steps` denoise rows numbered from 1, one vae_decode, a total whose
/// peak_phase is the phase of the highest peak. Returns (denoise rows, vae_decode row).
fn check_point<'a>(
    rows: &'a [Record],
    point: &str,
    components: &[&str],
    steps: u64,
) -> (Vec<&'a Record>, &'a Record) {
    let mine: Vec<&Record> = rows.iter().filter(|r| r.point_id == point).collect();
    let of = |p: Phase| mine.iter().copied().filter(move |r| r.phase == Some(p));
    let loads: Vec<String> = of(Phase::Load)
        .map(|r| r.component.map(|c| c.to_string()).unwrap_or_default())
        .collect();
    assert_eq!(loads, components, "{point}: load rows");
    assert_eq!(of(Phase::TextEncode).count(), 1, "{point}");
    let denoise: Vec<&Record> = of(Phase::Denoise).collect();
    let numbers: Vec<u64> = denoise.iter().map(|r| r.step.unwrap()).collect();
    assert_eq!(
        numbers,
        (1..=steps).collect::<Vec<_>>(),
        "{point}: denoise steps"
    );
    let decode: Vec<&Record> = of(Phase::VaeDecode).collect();
    assert_eq!(decode.len(), 1, "{point}");
    let total: Vec<&Record> = of(Phase::Total).collect();
    assert_eq!(total.len(), 1, "{point}");
    let top = mine
        .iter()
        .filter(|r| r.phase != Some(Phase::Total))
        .max_by_key(|r| r.peak_allocated.unwrap())
        .unwrap();
    assert_eq!(total[0].peak_phase, top.phase, "{point}: peak_phase");
    assert_eq!(total[0].peak_allocated, top.peak_allocated, "{point}");
    (denoise, decode[0])
}

/// `NAME.toml` in `dir`: a CPU generation scenario on the diffusers directory `model`, f32,
/// with the further [sweep] lines `sweep`.
fn gen_scenario(dir: &Path, name: &str, model: &Path, sweep: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\ndevice = \"cpu\"\n[model]\nsource = \"diffusers:{}\"\n\
             [sweep]\nmode = [\"generate\"]\nprecision = [\"f32\"]\n{sweep}",
            model.display()
        ),
    )
    .unwrap();
    path
}

/// diffusers' and transformers' modules hold the parameters vramlab counts from the same
/// configs (`params` of a component): every row's param_count is their sum, each component's
/// load row has its weights × 4 bytes as feature_weight_bytes and keeps at least those.
fn check_loads(
    rows: &[Record],
    components: &[vramlab::vocab::Component],
    params: impl Fn(vramlab::vocab::Component) -> u64,
) {
    let total: u64 = components.iter().map(|&c| params(c)).sum();
    assert!(rows.iter().all(|r| r.param_count == total));
    for r in rows.iter().filter(|r| r.phase == Some(Phase::Load)) {
        let c = r.component.unwrap();
        let bytes = params(c) * 4;
        assert_eq!(r.feature_weight_bytes, Some(bytes), "{c}");
        let kept = r.end_allocated.unwrap() - r.baseline_allocated.unwrap();
        assert!(
            kept >= bytes,
            "{c}: load kept {kept} B for {bytes} B of weights"
        );
    }
}

/// Two denoising steps peak at the same byte count above their start (± 0.1 %); the decoded
/// images (videos of `frames`) are b·3·frames·H·W·4 bytes, and the decode phase keeps exactly what a fresh tensor of that
/// shape holds in the same process (its data plus torch's tensor and storage objects, a few
/// hundred bytes).
fn check_steps_and_decode(
    denoise: &[&Record],
    decode: &Record,
    b: u64,
    frames: u64,
    w: u64,
    h: u64,
) {
    let point = &decode.point_id;
    let (a, c) = (act(denoise[0]), act(denoise[1]));
    assert!(
        a.abs_diff(c) as f64 <= 0.001 * a as f64,
        "{point}: denoise steps {a} vs {c}"
    );
    let want = b * 3 * frames * w * h * 4;
    assert_eq!(message_value(decode, "output_bytes"), want, "{point}");
    let fresh = message_value(decode, "fresh_tensor_bytes");
    assert!(
        fresh >= want && fresh - want < 1024,
        "{point}: fresh tensor {fresh} B for {want} B"
    );
    let kept = decode.end_allocated.unwrap() - decode.baseline_allocated.unwrap();
    assert_eq!(kept, fresh, "{point}: the decode keeps exactly its output");
}

fn tiny_flux(dir: &Path) {
    for (c, json) in [
        (
            "transformer",
            r#"{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64,
                "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16,
                "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
                "guidance_embeds": true, "axes_dims_rope": [4, 6, 6]}"#,
        ),
        (
            "vae",
            r#"{"_class_name": "AutoencoderKL", "latent_channels": 16,
                "block_out_channels": [32, 32, 32, 32], "layers_per_block": 1,
                "scaling_factor": 0.3611, "shift_factor": 0.1159, "use_quant_conv": false,
                "use_post_quant_conv": false, "sample_size": 64}"#,
        ),
    ] {
        std::fs::create_dir_all(dir.join(c)).unwrap();
        std::fs::write(dir.join(c).join("config.json"), json).unwrap();
    }
}

mod generation;
mod llm;
