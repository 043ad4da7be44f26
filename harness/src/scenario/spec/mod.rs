//! The scenario TOML (ARCHITECTURE.md §6), parsed strictly: unknown keys and wrong types are errors
//! that name the file, the line and the key.
//!
//! This file holds the TOML's structs and the parse; `defaults.rs` the defaults of the keys a
//! table may leave out, `validate.rs` the checks of language-model tables, `pipeline.rs` those
//! of generation and fine-tuning tables (diffusion pipelines).
use crate::error::bad_file;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub use crate::vocab::{
    Attention, Checkpointing, Compute, Kernels, KvKind, KvWindow, Mode, Ops, Optimizer,
    PoolRelease, Precision, QMatmul, Resolution, Trainable, TrainableKind, VaeDecode,
    MAX_LORA_RANK,
};

mod defaults;
mod pipeline;
mod validate;

pub use pipeline::{is_pipeline_source, NO_LORA_REASON};

/// A string or a list of strings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`, or a list of them (an axis).
    pub source: OneOrMany,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Model sources for this table only (default: `[model] source`).
    #[serde(default)]
    pub source: Option<OneOrMany>,
    pub mode: Vec<Mode>,
    pub precision: Vec<Precision>,
    pub batch: Vec<i64>,
    /// Total tokens per sequence: the preallocated KV capacity; prompt + decode steps fill it.
    /// Not used by `generate` (its text length is the text encoder's).
    #[serde(default)]
    pub context: Vec<i64>,
    #[serde(default = "defaults::default_kv")]
    pub kv_cache: Vec<KvKind>,
    /// `model` (cap a sliding-window model's cache at its window) and/or `full`.
    #[serde(default = "defaults::default_kv_window")]
    pub kv_window: Vec<KvWindow>,
    #[serde(default = "defaults::default_decode_steps")]
    pub decode_steps: usize,
    /// Prompt tokens; default `context − decode_steps`.
    #[serde(default)]
    pub prompt_len: Option<usize>,
    /// A decode row every this many steps (and at the last step).
    #[serde(default = "defaults::default_decode_every")]
    pub decode_every: usize,
    #[serde(default = "defaults::default_repeats")]
    pub repeats: usize,
    /// `reference` and/or `fused` (norms, RoPE, SwiGLU, softmax); llama family.
    #[serde(default = "defaults::default_kernels")]
    pub kernels: Vec<Kernels>,
    /// The compute dtype (activations, KV, dense tensors) of quantized precisions
    /// (`native`, `q8_0`, ...); dense precisions compute in their own dtype.
    #[serde(default = "defaults::default_compute")]
    pub compute: Vec<Compute>,
    /// How quantized precisions' linear layers multiply: `auto` (candle's `QMatMul`) and/or
    /// `dequantize` (dequantize each weight per product, to measure that transient).
    #[serde(default = "defaults::default_qmatmul")]
    pub qmatmul: Vec<QMatmul>,
    /// `eager` and/or `flash`; llama family.
    #[serde(default = "defaults::default_attention")]
    pub attention: Vec<Attention>,
    // Training axes (mode = "train"); `context` is the training sequence length.
    #[serde(default = "defaults::default_optimizer")]
    pub optimizer: Vec<Optimizer>,
    #[serde(default = "defaults::default_ckpt")]
    pub checkpointing: Vec<Checkpointing>,
    /// Micro-batches per optimizer step; must divide every batch.
    #[serde(default = "defaults::default_accum")]
    pub grad_accum: Vec<i64>,
    #[serde(default = "defaults::default_trainable")]
    pub trainable: Vec<Trainable>,
    /// Optimizer steps per training point (rows for each).
    #[serde(default = "defaults::default_train_steps")]
    pub train_steps: usize,
    #[serde(default = "defaults::default_lr")]
    pub lr: f64,
    // Generation axes (mode = "generate", docs/src/guides/generation.md).
    /// Output images `WxH`, multiples of 8.
    #[serde(default)]
    pub resolution: Vec<Resolution>,
    /// Output frames per video (video models: `4k+1` for Wan); absent: 1 (image models). A
    /// fine-tuning point (mode = "train" on Wan) caches latents of (frames − 1)/4 + 1 frames.
    #[serde(default)]
    pub frames: Option<Vec<usize>>,
    /// Classifier-free guidance on and/or off (on doubles the denoiser's batch). Absent: what
    /// the model's pipeline runs, on (SD, Wan) or off (the guidance-distilled FLUX).
    #[serde(default)]
    pub cfg: Option<Vec<bool>>,
    #[serde(default = "defaults::default_vae_decode")]
    pub vae_decode: Vec<VaeDecode>,
    /// The tile side of `vae_decode = "tiled"`, in output pixels.
    #[serde(default = "defaults::default_tile")]
    pub tile: usize,
    /// The overlap of neighbouring tiles, in output pixels.
    #[serde(default = "defaults::default_overlap")]
    pub overlap: usize,
    /// The VAE's dtype; empty: what the model's real pipeline uses.
    #[serde(default)]
    pub vae_precision: Vec<Precision>,
    /// Denoising steps per generation point (a row each).
    #[serde(default = "defaults::default_denoise_steps")]
    pub denoise_steps: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    #[serde(default = "defaults::default_device")]
    pub device: String,
    pub model: ModelSpec,
    /// CUDA pool option: `keep` (release threshold u64::MAX, like PyTorch's caching
    /// allocator; the default) or `release` (threshold 0). Ignored on CPU.
    #[serde(default)]
    pub pool_release: PoolRelease,
    /// One `[sweep]` table, or several `[[sweep]]` tables (e.g. one for inference and one for
    /// training), expanded one after the other.
    pub sweep: Sweeps,
    /// What runs the points: `candle` (vramlab's own workloads, the default) or `torch` (the
    /// torch probe, one worker process per group, on `device = "emu:GPU"` or `cuda:N`).
    #[serde(default)]
    pub runtime: crate::vocab::Runtime,
    /// The torch probe's software stacks (`default`, `torch-2.2`; not `torch-1.10`, whose torch
    /// the probe cannot run): the whole scenario once
    /// under each, one CSV each. Needs `runtime = "torch"`.
    #[serde(default)]
    pub stack: Vec<crate::vocab::Stack>,
}

/// `[sweep]` or `[[sweep]]`: deserialized by hand so that errors inside a table keep their
/// line and key (serde's untagged enums would replace them with a generic message).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sweeps(pub Vec<SweepSpec>);

impl<'de> Deserialize<'de> for Sweeps {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Sweeps;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a [sweep] table or [[sweep]] tables")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> std::result::Result<Sweeps, A::Error> {
                let one = SweepSpec::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(Sweeps(vec![one]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                s: A,
            ) -> std::result::Result<Sweeps, A::Error> {
                let all =
                    Vec::<SweepSpec>::deserialize(serde::de::value::SeqAccessDeserializer::new(s))?;
                Ok(Sweeps(all))
            }
        }
        d.deserialize_any(V)
    }
}

/// 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

impl Spec {
    /// Parses and validates a scenario; errors name `path`, the line and the key.
    pub fn parse(path: &Path, text: &str) -> Result<Spec> {
        let spec: Spec = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(sp) => bad_file(path, format!("line {}: {msg}", line_of(text, sp.start))),
                None => bad_file(path, msg),
            }
        })?;
        spec.validate()
            .map_err(|(at, e)| match at.and_then(|(i, k)| key_line(text, i, k)) {
                Some(line) => bad_file(path, format!("line {line}: {e}")),
                None => bad_file(path, e),
            })?;
        Ok(spec)
    }

    pub fn load(path: &Path) -> Result<(Spec, String)> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read scenario: {e}")))?;
        Ok((Spec::parse(path, &text)?, text))
    }
}

/// The 1-based line of `key = ...` in the `table`-th `[sweep]`/`[[sweep]]` table of `text`.
pub fn key_line(text: &str, table: usize, key: &str) -> Option<usize> {
    let (mut cur, mut count) = (None, 0usize);
    for (n, line) in text.lines().enumerate() {
        let t = line.split('#').next().unwrap_or("").trim();
        if t.starts_with('[') {
            let name: String = t
                .chars()
                .filter(|c| !matches!(c, '[' | ']' | ' '))
                .collect();
            cur = (name == "sweep").then_some(count);
            count += usize::from(name == "sweep");
        } else if cur == Some(table) {
            let rest = t.strip_prefix(key).map(str::trim_start);
            if rest.is_some_and(|r| r.starts_with('=')) {
                return Some(n + 1);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "t"
[model]
source = "gguf:/m.gguf"
[sweep]
mode = ["infer"]
precision = ["f32", "bf16"]
batch = [1, 2]
context = [64]
"#;

    #[test]
    fn parses_with_defaults() {
        let s = Spec::parse(Path::new("t.toml"), OK).unwrap();
        assert_eq!(s.device, "cpu");
        assert_eq!(s.sweep.0[0].kv_cache, vec![KvKind::Preallocated]);
        assert_eq!(s.sweep.0[0].decode_steps, 16);
    }

    #[test]
    fn unknown_key_names_file_line_key() {
        let bad = OK.replace("context = [64]", "context = [64]\nbogus = 1");
        let e = Spec::parse(Path::new("s/t.toml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("s/t.toml: line 10: unknown field `bogus`"),
            "{e}"
        );
    }

    #[test]
    fn several_sweep_tables() {
        let two = OK.replace("[sweep]", "[[sweep]]")
            + "[[sweep]]\nmode = [\"train\"]\nprecision = [\"mixed-bf16\"]\nbatch = [2]\ncontext = [16]\n";
        let s = Spec::parse(Path::new("t.toml"), &two).unwrap();
        assert_eq!(s.sweep.0.len(), 2);
        assert_eq!(s.sweep.0[1].precision, vec![Precision::MixedBf16]);
        // Errors inside the second table still name the line and key.
        let bad = two.replace("context = [16]", "context = [16]\nbogus = 1");
        let e = Spec::parse(Path::new("t.toml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 15: unknown field `bogus`"), "{e}");
    }

    #[test]
    fn value_errors_name_the_line_of_their_key() {
        let two = OK.replace("[sweep]", "[[sweep]]")
            + "[[sweep]]  # second\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [0]\ncontext = [16]\n";
        let e = Spec::parse(Path::new("t.toml"), &two)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 13: [sweep] `batch` must be positive"),
            "{e}"
        );
        assert_eq!(key_line(&two, 0, "batch"), Some(8));
        assert_eq!(key_line(&two, 2, "batch"), None);
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[64]", "[64]\nlr = nan"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 10: [sweep] `lr` must be a positive number"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_and_bad_values() {
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "\"one\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 8") && e.contains("invalid type"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "[0]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`batch` must be positive, got 0"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "[]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`batch` is an empty list"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[64]", "[8]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot hold"), "{e}");
    }
}
