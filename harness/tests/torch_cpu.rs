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
    // One implementation on the real model (the tiny llama above runs all three): the for-loop,
    // whose transient is the model's own largest tensor (the tied embedding), twice.
    {
        let implementation = "for-loop";
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
        .arg(root().join("scripts/torch_probe"))
        .arg(&scenario)
        .args(["--device", "cpu", "--out"])
        .arg(dir.path().join("o.csv"))
        .env_remove("LD_PRELOAD")
        .current_dir(root())
        .output()
        .unwrap()
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

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_sd_on_diffusers_rows_steps_and_decode_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-sd");
    let cfg = tiny_sd(&model);
    let scenario = gen_scenario(
        dir.path(),
        "tiny-sd-torch",
        &model,
        "resolution = [\"64x128\"]\nbatch = [1, 2]\ncfg = [true, false]\n\
         vae_decode = [\"full\", \"sliced\", \"tiled\"]\ntile = 64\noverlap = 16\n",
    );
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("gen-{attention}.csv"));
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        let mut cfg_act = std::collections::HashMap::new();
        for (w, h) in [(64u64, 128u64)] {
            for b in [1u64, 2] {
                for guidance in ["cfg", "nocfg"] {
                    for dec in ["full", "sliced", "tiled-t64o16"] {
                        let point = format!("tiny-sd/generate/f32/{w}x{h}/b{b}/{guidance}/{dec}");
                        let (denoise, decode) =
                            check_point(&rows, &point, &["text_encoder", "unet", "vae"], 2);
                        check_steps_and_decode(&denoise, decode, b, 1, w, h);
                        cfg_act.insert((w, h, b, guidance), act(denoise[1]));
                    }
                }
            }
        }
        // The same configs, the same file as candle's.
        check_loads(&rows, &cfg.components(), |c| cfg.params(c));
        // CFG doubles the denoiser's batch: CFG at batch 1 is batch 2 without it (± 1 %).
        let (w, h) = (64u64, 128u64);
        let (c1, n2) = (cfg_act[&(w, h, 1, "cfg")], cfg_act[&(w, h, 2, "nocfg")]);
        eprintln!("{attention} {w}x{h}: denoise cfg b1 {c1} B, nocfg b2 {n2} B");
        assert!(c1.abs_diff(n2) as f64 <= 0.01 * n2 as f64, "{c1} vs {n2}");
    }
}

/// A tiny FLUX.1 transformer (FluxTransformer2DModel from `transformer/config.json`, random
/// values) with a tiny 16-channel VAE: the same rows; no text encoder in the directory, so
/// `text_encode` makes the T5 and CLIP outputs' shapes.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_flux_on_diffusers_rows_steps_and_decode_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-flux");
    tiny_flux(&model);
    let scenario = gen_scenario(
        dir.path(),
        "tiny-flux-torch",
        &model,
        "resolution = [\"128x128\", \"128x64\"]\nbatch = [1, 2]\n\
         vae_decode = [\"full\", \"tiled\"]\ntile = 64\noverlap = 16\n",
    );
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("flux-{attention}.csv"));
        // No `cfg` in the table: FLUX's default is off (guidance-distilled), as vramlab's.
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        for (w, h) in [(128u64, 128u64), (128, 64)] {
            for b in [1u64, 2] {
                for dec in ["full", "tiled-t64o16"] {
                    let point = format!("tiny-flux/generate/f32/{w}x{h}/b{b}/nocfg/{dec}");
                    let (denoise, decode) = check_point(&rows, &point, &["transformer", "vae"], 2);
                    check_steps_and_decode(&denoise, decode, b, 1, w, h);
                    assert!(rows
                        .iter()
                        .filter(|r| r.point_id == point)
                        .all(|r| r.architecture == "flux"));
                }
            }
        }
    }
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

/// Wan2.1 T2V on diffusers (transformers' UMT5EncoderModel, WanTransformer3DModel,
/// AutoencoderKLWan) on the tiny Wan config of tests/wan.rs (`common::tiny_wan`), with the
/// weights of vramlab's own synthetic writer, at two frame counts: a load row per component of
/// its analytic parameters × 4 bytes, equal denoising steps (CFG as a second transformer call),
/// the decoded videos' b·3·frames·H·W·4 bytes, the `frames` column, and the ids of
/// `vramlab sweep --dry-run`.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_wan_on_diffusers_rows_steps_and_decode_output() {
    use vramlab::model::diffusion::Pipeline;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-wan");
    let cfg = common::tiny_wan();
    let f32 = candle_core::DType::F32;
    let wan = vramlab::model::diffusion::wan::Wan::new(cfg.clone(), f32, f32);
    vramlab::workload::generate::write_synthetic(&wan, &model).unwrap();
    let scenario = gen_scenario(
        dir.path(),
        "tiny-wan-torch",
        &model,
        "resolution = [\"48x32\"]\nframes = [5, 9]\nbatch = [1, 2]\n\
         cfg = [true, false]\nvae_decode = [\"full\", \"sliced\", \"tiled\"]\ntile = 16\n\
         overlap = 8\n",
    );
    let dry = vramlab()
        .args(["sweep", "--dry-run"])
        .arg(&scenario)
        .output()
        .unwrap();
    let want_ids: Vec<String> = String::from_utf8(common::ok_stdout(dry))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("wan-{attention}.csv"));
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        let mut ids: Vec<String> = Vec::new();
        for r in &rows {
            if ids.last() != Some(&r.point_id) {
                ids.push(r.point_id.clone());
            }
        }
        assert_eq!(ids, want_ids, "the probe's points are vramlab's");
        for (w, h) in [(48u64, 32u64)] {
            for frames in [5u64, 9] {
                for b in [1u64, 2] {
                    for guidance in ["cfg", "nocfg"] {
                        for dec in ["full", "sliced", "tiled-t16o8"] {
                            let point = format!(
                                "tiny-wan/generate/f32/{w}x{h}/f{frames}/b{b}/{guidance}/{dec}"
                            );
                            let (denoise, decode) = check_point(
                                &rows,
                                &point,
                                &["text_encoder", "transformer", "vae"],
                                2,
                            );
                            check_steps_and_decode(&denoise, decode, b, frames, w, h);
                            assert!(rows
                                .iter()
                                .filter(|r| r.point_id == point)
                                .all(|r| r.architecture == "wan" && r.frames == Some(frames)));
                        }
                    }
                }
            }
        }
        check_loads(&rows, &wan.components(), |c| cfg.params_analytic(c));
    }
}

#[test]
fn an_unrunnable_generation_scenario_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    tiny_flux(&dir.path().join("flux"));
    let scenario = |source: &str, extra: &str| {
        format!(
            "name = \"g\"\ndevice = \"cpu\"\n[model]\nsource = \"{source}\"\n[sweep]\n\
             mode = [\"generate\"]\nprecision = [\"f32\"]\nresolution = [\"64x64\"]\nbatch = [1]\n{extra}"
        )
    };
    let flux = format!("diffusers:{}", dir.path().join("flux").display());
    let out = probe_without_torch(&scenario(&flux, "cfg = [true]\n"));
    one_line_exit_2(
        &out,
        "cfg = true: flux (FLUX) runs without classifier-free guidance",
    );
    let out = probe_without_torch(&scenario(&flux, "cfg = [false]\nattention = [\"flash\"]\n"));
    one_line_exit_2(&out, "cannot run `attention = \"flash\"` for generation");
    let out = probe_without_torch(&scenario(&flux, "cfg = [false]\nframes = [5]\n"));
    one_line_exit_2(&out, "frames = 5: flux is an image model");
    // A Wan directory as far as the probe reads it without torch: what vramlab's Wan pipeline
    // refuses, the probe refuses.
    let wan = dir.path().join("wan");
    std::fs::create_dir_all(wan.join("transformer")).unwrap();
    std::fs::write(wan.join("transformer/config.json"), "{}").unwrap();
    std::fs::write(
        wan.join("model_index.json"),
        r#"{"_class_name": "WanPipeline"}"#,
    )
    .unwrap();
    let wan = format!("diffusers:{}", wan.display());
    for (extra, needle) in [
        ("", "`frames` is missing: wan is a video model"),
        ("frames = [6]\n", "frames = 6: wan decodes 4k+1 frames"),
        (
            "frames = [5]\nattention = [\"sliced\"]\n",
            "Wan's DiT has no sliced attention",
        ),
    ] {
        one_line_exit_2(&probe_without_torch(&scenario(&wan, extra)), needle);
    }
    let empty = format!("diffusers:{}", dir.path().display());
    let out = probe_without_torch(&scenario(&empty, ""));
    one_line_exit_2(&out, "neither unet/config.json nor transformer/config.json");
}
