//! The architectures qwen3, phi3 and gpt_bigcode and the published parameter
//! counts of every preset architecture, derived by hand from the shapes:
//! - parameter counts of the published configs (harness/presets/), through `Config`, and the
//!   weight bytes `estimate` prints for them;
//! - a tiny real-shaped variant of each new architecture (same structure, small dims) through
//!   the real binary: an inference sweep (both KV kinds; exact load and KV figures) and a
//!   training sweep (full and LoRA; gradients and AdamW state);
//! - in process: every parameter gets a gradient, LoRA adapts the documented targets, and the
//!   logits of one full forward equal those of prefill + decode steps through the KV cache
//!   (which catches KV, RoPE, position and sliding-window mistakes);
//! - against transformers (needs torch, `#[ignore]`d; scripts/test.sh runs it after
//!   scripts/torch-env.sh): HF's own checkpoint of each tiny variant (its names, its
//!   config.json) loads, and the logits equal HF's eager forward to 1e-4
//!   (scripts/arch_reference.py writes them).
//!
//! Sources of the presets (config.json as published on the Hugging Face hub):
//! - qwen3-0.6b: Qwen/Qwen3-0.6B;
//! - phi-3-mini-4k: microsoft/Phi-3-mini-4k-instruct;
//! - starcoderbase-1b: bigcode/starcoderbase-1b; starcoder-15.5b: bigcode/starcoder (the
//!   architecture of bigcode/octocoder, which ../shared/peers/published.json measures).
mod common;
use candle_core::{DType, Device, Tensor};
use common::{root, vramlab};
use std::collections::HashMap;
use std::path::Path;
use vramlab::model::{weights, Config, Decoder, InferenceModel, KvCache, KvKind, Source};
use vramlab::record::{Phase, Record, Status};
use vramlab::scenario::spec::{Checkpointing, KvWindow, Trainable};
use vramlab::workload::training;

#[path = "architectures/tinies.rs"]
mod tinies;
use tinies::*;

fn preset(name: &str) -> Config {
    Config::from_file(&root().join(format!("harness/presets/{name}/config.json"))).unwrap()
}

/// Writes the tiny configs as `<dir>/<name>.json`.
fn write_tinies(dir: &Path) {
    for t in &TINIES {
        std::fs::write(dir.join(format!("{}.json", t.name)), t.json).unwrap();
    }
}

fn tiny(name: &str) -> &'static Tiny {
    TINIES.iter().find(|t| t.name == name).unwrap()
}

/// The tiny variant a row belongs to (model ids are `synthetic-<name>`).
fn tiny_of(r: &Record) -> &'static Tiny {
    tiny(r.model_id.strip_prefix("synthetic-").unwrap())
}

/// Runs `vramlab sweep` over the tiny variants (written in `dir`) with the `[sweep]`
/// table `axes`, and returns its rows (all of them `ok`).
fn sweep(dir: &Path, axes: &str) -> Vec<Record> {
    write_tinies(dir);
    let sources: Vec<String> = TINIES
        .iter()
        .map(|t| format!("\"synthetic:{}/{}.json\"", dir.display(), t.name))
        .collect();
    let sc = dir.join("s.toml");
    std::fs::write(
        &sc,
        format!(
            "name = \"arch\"\n[model]\nsource = [{}]\n[sweep]\n{axes}",
            sources.join(", ")
        ),
    )
    .unwrap();
    let out = dir.join("out.csv");
    vramlab()
        .args(["sweep", "--quiet", "--out"])
        .arg(&out)
        .arg(&sc)
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&out).unwrap();
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
    rows
}

fn bytes_of(precision: &str) -> u64 {
    match precision {
        "f32" => 4,
        "bf16" | "f16" => 2,
        p => panic!("precision {p}"),
    }
}

/// Synthetic f32 weights of `cfg` written and loaded by the real loader.
fn load(cfg: &Config) -> HashMap<String, Tensor> {
    let dir = tempfile::tempdir().unwrap();
    vramlab::model::synth::write(cfg, DType::F32, 5, dir.path()).unwrap();
    weights::load(
        &Source::Hf(dir.path().into()),
        cfg,
        DType::F32,
        &Device::Cpu,
        |_, _| {},
    )
    .unwrap()
}

fn tiny_config(t: &Tiny) -> Config {
    Config::from_json(Path::new(t.name), &serde_json::from_str(t.json).unwrap()).unwrap()
}

/// Seeded weights of `cfg` uniform in ±0.5, norms included: larger than the synthetic
/// weights' ±0.02 (whose LayerNorm weights, not named `*norm.weight`, would make GPT-2-shaped
/// logits nearly zero and the comparison below weak).
fn random_weights(cfg: &Config, seed: u64) -> HashMap<String, Tensor> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    cfg.tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
            (name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap())
        })
        .collect()
}

fn decoder(cfg: &Config) -> Box<dyn Decoder> {
    let t = random_weights(cfg, 21);
    match cfg.architecture.inference(cfg, t, DType::F32).unwrap() {
        InferenceModel::Decoder(d) => d,
        InferenceModel::Encoder(_) => panic!("{} is a decoder", cfg.architecture),
    }
}

#[path = "architectures/counts.rs"]
mod counts;
#[path = "architectures/forward.rs"]
mod forward;
#[path = "architectures/sweeps.rs"]
mod sweeps;
