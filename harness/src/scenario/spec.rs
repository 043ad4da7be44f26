//! The scenario TOML (ARCHITECTURE.md §6), parsed strictly: unknown keys and wrong types are errors
//! that name the file, the line and the key.
use crate::error::bad_file;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub use crate::vocab::{
    Attention, Checkpointing, Compute, Kernels, KvKind, KvWindow, Mode, Ops, Optimizer,
    PoolRelease, Precision, QMatmul, Resolution, Trainable, TrainableKind, VaeDecode,
    MAX_LORA_RANK,
};

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

fn default_kv_window() -> Vec<KvWindow> {
    vec![KvWindow::Model]
}
fn default_kv() -> Vec<KvKind> {
    vec![KvKind::Preallocated]
}
fn default_decode_steps() -> usize {
    16
}
fn default_decode_every() -> usize {
    8
}
fn default_repeats() -> usize {
    1
}
fn default_optimizer() -> Vec<Optimizer> {
    vec![Optimizer::Adamw]
}
fn default_ckpt() -> Vec<Checkpointing> {
    vec![Checkpointing::None]
}
fn default_accum() -> Vec<i64> {
    vec![1]
}
fn default_trainable() -> Vec<Trainable> {
    vec![Trainable::Full]
}
fn default_kernels() -> Vec<Kernels> {
    vec![Kernels::Reference]
}
fn default_compute() -> Vec<Compute> {
    vec![Compute::F32]
}

fn default_qmatmul() -> Vec<QMatmul> {
    vec![QMatmul::Auto]
}
fn default_attention() -> Vec<Attention> {
    vec![Attention::Eager]
}
fn default_train_steps() -> usize {
    1
}
fn default_lr() -> f64 {
    1e-4
}
fn default_vae_decode() -> Vec<VaeDecode> {
    vec![VaeDecode::Full]
}
fn default_tile() -> usize {
    256
}
fn default_overlap() -> usize {
    64
}
fn default_denoise_steps() -> usize {
    2
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
    #[serde(default = "default_kv")]
    pub kv_cache: Vec<KvKind>,
    /// `model` (cap a sliding-window model's cache at its window) and/or `full`.
    #[serde(default = "default_kv_window")]
    pub kv_window: Vec<KvWindow>,
    #[serde(default = "default_decode_steps")]
    pub decode_steps: usize,
    /// Prompt tokens; default `context − decode_steps`.
    #[serde(default)]
    pub prompt_len: Option<usize>,
    /// A decode row every this many steps (and at the last step).
    #[serde(default = "default_decode_every")]
    pub decode_every: usize,
    #[serde(default = "default_repeats")]
    pub repeats: usize,
    /// `reference` and/or `fused` (norms, RoPE, SwiGLU, softmax); llama family.
    #[serde(default = "default_kernels")]
    pub kernels: Vec<Kernels>,
    /// The compute dtype (activations, KV, dense tensors) of quantized precisions
    /// (`native`, `q8_0`, ...); dense precisions compute in their own dtype.
    #[serde(default = "default_compute")]
    pub compute: Vec<Compute>,
    /// How quantized precisions' linear layers multiply: `auto` (candle's `QMatMul`) and/or
    /// `dequantize` (dequantize each weight per product, to measure that transient).
    #[serde(default = "default_qmatmul")]
    pub qmatmul: Vec<QMatmul>,
    /// `eager` and/or `flash`; llama family.
    #[serde(default = "default_attention")]
    pub attention: Vec<Attention>,
    // Training axes (mode = "train"); `context` is the training sequence length.
    #[serde(default = "default_optimizer")]
    pub optimizer: Vec<Optimizer>,
    #[serde(default = "default_ckpt")]
    pub checkpointing: Vec<Checkpointing>,
    /// Micro-batches per optimizer step; must divide every batch.
    #[serde(default = "default_accum")]
    pub grad_accum: Vec<i64>,
    #[serde(default = "default_trainable")]
    pub trainable: Vec<Trainable>,
    /// Optimizer steps per training point (rows for each).
    #[serde(default = "default_train_steps")]
    pub train_steps: usize,
    #[serde(default = "default_lr")]
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
    #[serde(default = "default_vae_decode")]
    pub vae_decode: Vec<VaeDecode>,
    /// The tile side of `vae_decode = "tiled"`, in output pixels.
    #[serde(default = "default_tile")]
    pub tile: usize,
    /// The overlap of neighbouring tiles, in output pixels.
    #[serde(default = "default_overlap")]
    pub overlap: usize,
    /// The VAE's dtype; empty: what the model's real pipeline uses.
    #[serde(default)]
    pub vae_precision: Vec<Precision>,
    /// Denoising steps per generation point (a row each).
    #[serde(default = "default_denoise_steps")]
    pub denoise_steps: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    #[serde(default = "default_device")]
    pub device: String,
    pub model: ModelSpec,
    /// CUDA pool option: `keep` (release threshold u64::MAX, like PyTorch's caching
    /// allocator; the default) or `release` (threshold 0). Ignored on CPU.
    #[serde(default)]
    pub pool_release: PoolRelease,
    /// One `[sweep]` table, or several `[[sweep]]` tables (e.g. one for inference and one for
    /// training), expanded one after the other.
    pub sweep: Sweeps,
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

fn default_device() -> String {
    "cpu".into()
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

    /// On error: the message, and where it is (the index of the sweep table and the key).
    fn validate(&self) -> std::result::Result<(), Invalid> {
        if self.sweep.0.is_empty() {
            return Err((None, "no [sweep] table: nothing to run".into()));
        }
        let n = &self.name;
        if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\\', '\0']) {
            return Err((
                None,
                format!(
                    "`name` must be a plain file name (it names results/<name>.csv), got {n:?}"
                ),
            ));
        }
        if self.model.source.to_vec().is_empty() {
            return Err((None, "[model] `source` is an empty list".into()));
        }
        for (i, s) in self.sweep.0.iter().enumerate() {
            let sources = s.source.as_ref().unwrap_or(&self.model.source).to_vec();
            // A diffusion pipeline generates, or (Wan) fine-tunes its denoiser with LoRA; the
            // LLM modes mean nothing to it.
            let is_pipeline = |src: &String| is_pipeline_source(src);
            let pipeline = sources.iter().find(|src| is_pipeline(src));
            if let Some(src) = pipeline {
                let mode = |msg: String| Err((Some((i, "mode")), msg));
                if let Some(m) = s
                    .mode
                    .iter()
                    .find(|m| !matches!(m, Mode::Generate | Mode::Train))
                {
                    return mode(format!(
                        "[sweep] mode `{m}` on the diffusion pipeline `{src}`: a pipeline runs mode = [\"generate\"] or (Wan2.1's and SD's LoRA) [\"train\"]"
                    ));
                }
                if s.mode.contains(&Mode::Train) {
                    if let Some(src) = sources.iter().find(|src| {
                        src.strip_prefix("synthetic:")
                            .and_then(|m| m.parse::<crate::vocab::GenModel>().ok())
                            .is_some_and(|m| !m.trains())
                    }) {
                        return mode(format!(
                            "[sweep] mode `train` on the diffusion pipeline `{src}`: {}",
                            NO_LORA_REASON
                        ));
                    }
                    if let Some(src) = sources.iter().find(|src| !is_pipeline(src)) {
                        return mode(format!(
                            "[sweep] mode `train` on a diffusion pipeline runs alone in its [sweep] table (`{src}` is a language model)"
                        ));
                    }
                    validate_finetune(s).map_err(|(k, e)| (Some((i, k)), e))?;
                    continue;
                }
            }
            validate_sweep(s, &sources).map_err(|(k, e)| (Some((i, k)), e))?;
            if let (Some(p), Some(src)) = (
                s.precision.iter().find(|p| p.is_quantized()),
                sources.iter().find(|s| !s.starts_with("gguf:")),
            ) {
                return Err((
                    Some((i, "precision")),
                    format!(
                        "[sweep] precision `{}` needs a `gguf:` source (quantized weights come from a GGUF file), got `{src}`",
                        p.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }
}

pub use crate::model::diffusion::denoiser::NO_LORA_REASON;

/// Whether a model source is a diffusion pipeline (`diffusers:DIR`, or `synthetic:` with a
/// generation preset's name).
pub fn is_pipeline_source(src: &str) -> bool {
    src.starts_with("diffusers:")
        || src
            .strip_prefix("synthetic:")
            .is_some_and(|m| m.parse::<crate::vocab::GenModel>().is_ok())
}

/// A validation failure: where (sweep table index and key), and the message.
type Invalid = (Option<(usize, &'static str)>, String);

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

/// The axes of a fine-tuning table (mode = "train" on a diffusion pipeline): one line naming
/// the key for each mistake (the model itself is checked when the sweep reads it).
fn validate_finetune(s: &SweepSpec) -> std::result::Result<(), (&'static str, String)> {
    if s.mode.len() > 1 {
        return Err((
            "mode",
            "[sweep] mode \"train\" on a diffusion pipeline runs alone in its [sweep] table".into(),
        ));
    }
    for (key, n) in [
        ("precision", s.precision.len()),
        ("batch", s.batch.len()),
        ("resolution", s.resolution.len()),
        ("attention", s.attention.len()),
        ("optimizer", s.optimizer.len()),
        ("trainable", s.trainable.len()),
        ("checkpointing", s.checkpointing.len()),
        ("grad_accum", s.grad_accum.len()),
    ] {
        if n == 0 {
            return Err((
                key,
                format!("[sweep] `{key}` is an empty list (or missing): a denoiser's fine-tuning needs it"),
            ));
        }
    }
    if let Some(a) = s
        .attention
        .iter()
        .find(|a| !matches!(a, Attention::Eager | Attention::Flash))
    {
        return Err((
            "attention",
            format!("[sweep] attention `{a}`: a denoiser trains with `eager` or `flash`"),
        ));
    }
    if let Some(p) = s
        .precision
        .iter()
        .find(|p| p.is_mixed() || p.is_quantized())
    {
        return Err((
            "precision",
            format!("[sweep] precision `{p}`: a denoiser's LoRA points run f32, f16 or bf16 (base weights and adapters in that dtype)"),
        ));
    }
    if let Some(t) = s.trainable.iter().find(|t| t.kind() != TrainableKind::Lora) {
        return Err((
            "trainable",
            format!("[sweep] trainable `{t}`: a denoiser is fine-tuned with LoRA only (`lora-rN`)"),
        ));
    }
    if let Some(o) = s.optimizer.iter().find(|o| !o.is_scenario_choice()) {
        return Err((
            "optimizer",
            format!("[sweep] optimizer `{o}` is not a scenario choice: use `sgd`, `adamw` or `adamw-fused`"),
        ));
    }
    if s.train_steps == 0 || s.train_steps as i64 > MAX_STEPS {
        return Err((
            "train_steps",
            format!("[sweep] `train_steps` must be from 1 to {MAX_STEPS}"),
        ));
    }
    if !(s.lr.is_finite() && s.lr > 0.0) {
        return Err((
            "lr",
            format!("[sweep] `lr` must be a positive number, got {}", s.lr),
        ));
    }
    for &b in &s.batch {
        if !(1..=MAX_BATCH).contains(&b) {
            return Err((
                "batch",
                format!("[sweep] `batch` must be from 1 to {MAX_BATCH}, got {b}"),
            ));
        }
        if let Some(n) = s.grad_accum.iter().find(|&&n| n <= 0 || b % n != 0) {
            return Err((
                "grad_accum",
                format!("[sweep] grad_accum {n} must be positive and divide batch {b}"),
            ));
        }
    }
    if s.repeats == 0 || s.repeats as i64 > MAX_REPEATS {
        return Err((
            "repeats",
            format!("[sweep] `repeats` must be from 1 to {MAX_REPEATS}"),
        ));
    }
    Ok(())
}

/// The generation axes: one line naming the key for each mistake.
fn validate_generate(
    s: &SweepSpec,
    sources: &[String],
) -> std::result::Result<(), (&'static str, String)> {
    if s.mode.len() > 1 {
        return Err((
            "mode",
            "[sweep] mode \"generate\" runs alone in its [sweep] table (its axes differ)".into(),
        ));
    }
    if s.resolution.is_empty() {
        return Err((
            "resolution",
            "[sweep] `resolution` is an empty list (or missing): mode \"generate\" needs e.g. [\"512x512\"]".into(),
        ));
    }
    if let Some(r) = s
        .resolution
        .iter()
        .find(|r| !r.width.is_multiple_of(8) || !r.height.is_multiple_of(8))
    {
        return Err((
            "resolution",
            format!("[sweep] resolution `{r}` is not a multiple of 8 (the VAE's factor)"),
        ));
    }
    if s.frames.as_ref().is_some_and(|f| f.is_empty()) {
        return Err((
            "frames",
            "[sweep] `frames` is an empty list: nothing to run".into(),
        ));
    }
    if s.vae_decode.contains(&VaeDecode::Tiled) {
        if s.tile == 0
            || !s.tile.is_multiple_of(8)
            || !s.overlap.is_multiple_of(8)
            || s.overlap >= s.tile
        {
            return Err((
                "tile",
                format!(
                    "[sweep] tile {} / overlap {}: both multiples of 8 pixels, overlap smaller than the tile",
                    s.tile, s.overlap
                ),
            ));
        }
        if let Some(r) = s.resolution.iter().find(|r| s.tile > r.width.min(r.height)) {
            return Err((
                "tile",
                format!(
                    "[sweep] tile {} is larger than the image {r} (vae_decode = \"tiled\")",
                    s.tile
                ),
            ));
        }
    }
    // Wan's DiT is vramlab's own and runs vramlab-kernels' flash attention; SD's UNet and
    // FLUX's transformer are candle-transformers'.
    let wan_only = sources.iter().all(|src| {
        src.strip_prefix("synthetic:")
            .and_then(|m| m.parse::<crate::vocab::GenModel>().ok())
            == Some(crate::vocab::GenModel::Wan21T2v13b)
    });
    if let Some(a) = s.attention.iter().find(|a| {
        let runs = matches!(a, Attention::Eager | Attention::Sliced)
            || (wan_only && **a == Attention::Flash);
        !runs
    }) {
        return Err((
            "attention",
            format!("[sweep] attention `{a}` is not available for this generation model: SD's UNet and FLUX's transformer attend through candle-transformers (vramlab-kernels' flash attention runs in the llama family and Wan2.1's DiT); use `eager` or `sliced`"),
        ));
    }
    if let Some(p) = s
        .precision
        .iter()
        .chain(&s.vae_precision)
        .find(|p| p.is_mixed() || p.is_quantized())
    {
        return Err((
            "precision",
            format!("[sweep] precision `{p}`: generation points run f32, f16 or bf16"),
        ));
    }
    if s.denoise_steps < 2 {
        return Err((
            "denoise_steps",
            "[sweep] `denoise_steps` must be at least 2 (the test that a step's peak does not grow needs two)".into(),
        ));
    }
    Ok(())
}

const MAX_BATCH: i64 = 1 << 20;
const MAX_CONTEXT: i64 = 1 << 27;
const MAX_REPEATS: i64 = 10_000;
const MAX_STEPS: i64 = 1 << 20;

fn validate_sweep(
    s: &SweepSpec,
    sources: &[String],
) -> std::result::Result<(), (&'static str, String)> {
    {
        let nonempty = |key: &'static str, n: usize| {
            if n == 0 {
                Err((
                    key,
                    format!("[sweep] `{key}` is an empty list: nothing to run"),
                ))
            } else {
                Ok(())
            }
        };
        nonempty("mode", s.mode.len())?;
        nonempty("precision", s.precision.len())?;
        nonempty("batch", s.batch.len())?;
        if let Some(m) = s.mode.iter().find(|m| **m != Mode::Generate) {
            if s.context.is_empty() {
                return Err((
                    "context",
                    format!("[sweep] missing field `context` (mode `{m}` needs it)"),
                ));
            }
        }
        if s.mode.contains(&Mode::Generate) {
            validate_generate(s, sources)?;
        } else if s.frames.is_some() {
            return Err((
                "frames",
                "[sweep] `frames` is for mode = \"generate\" (video models)".into(),
            ));
        } else if s.attention.contains(&Attention::Sliced) {
            return Err((
                "attention",
                "[sweep] attention `sliced` is for mode = \"generate\" (the UNet's sliced attention)".into(),
            ));
        }
        nonempty("kv_cache", s.kv_cache.len())?;
        nonempty("kv_window", s.kv_window.len())?;
        nonempty("kernels", s.kernels.len())?;
        nonempty("attention", s.attention.len())?;
        if s.attention.contains(&Attention::Sdpa) {
            return Err((
                "attention",
                "[sweep] attention `sdpa` is PyTorch's kernel (the torch probe's `--attention sdpa`); vramlab's models run `eager` or `flash`".into(),
            ));
        }
        nonempty("compute", s.compute.len())?;
        nonempty("qmatmul", s.qmatmul.len())?;
        if let Some(p) = s.precision.iter().find(|p| p.is_quantized()) {
            let lora = s.trainable.iter().find(|t| t.kind() == TrainableKind::Lora);
            if let (true, Some(t)) = (s.mode.contains(&Mode::Train), lora) {
                return Err((
                    "trainable",
                    format!(
                        "[sweep] trainable `{t}` on precision `{}` is QLoRA, which cannot run: candle 0.11.1's QMatMul records no backward (it applies the QTensor with `apply_op1_no_bwd`), so no gradient reaches the adapters below a quantized layer; `vramlab estimate --mode train --trainable {t} --weights {}` estimates it",
                        p.as_str(),
                        p.as_str()
                    ),
                ));
            }
            if let Some(m) = s.mode.iter().find(|m| **m != Mode::Infer) {
                return Err((
                    "precision",
                    format!(
                        "[sweep] precision `{}` keeps GGUF weights quantized, which runs inference only (mode `{}` needs f32, f16, bf16 or mixed-*)",
                        p.as_str(),
                        m.as_str()
                    ),
                ));
            }
        }
        let train = s.mode.contains(&Mode::Train);
        if train {
            nonempty("optimizer", s.optimizer.len())?;
            if let Some(o) = s.optimizer.iter().find(|o| !o.is_scenario_choice()) {
                return Err((
                    "optimizer",
                    format!("[sweep] optimizer `{o}` is not a scenario choice: use `sgd`, `adamw` or `adamw-fused` (torch's implementations are the probe's `--torch-optim`)"),
                ));
            }
            nonempty("checkpointing", s.checkpointing.len())?;
            nonempty("grad_accum", s.grad_accum.len())?;
            nonempty("trainable", s.trainable.len())?;
            if s.train_steps == 0 {
                return Err((
                    "train_steps",
                    "[sweep] `train_steps` must be at least 1".into(),
                ));
            }
            for &n in &s.grad_accum {
                if n <= 0 {
                    return Err((
                        "grad_accum",
                        format!("[sweep] `grad_accum` must be positive, got {n}"),
                    ));
                }
                if let Some(b) = s.batch.iter().find(|&&b| b > 0 && b % n != 0) {
                    return Err((
                        "grad_accum",
                        format!("[sweep] grad_accum {n} does not divide batch {b}"),
                    ));
                }
            }
        }
        if s.mode.contains(&Mode::Infer) {
            if let Some(p) = s.precision.iter().find(|p| p.is_mixed()) {
                return Err((
                    "precision",
                    format!(
                        "[sweep] precision `{}` is a training policy; inference points need f32, f16 or bf16",
                        p.as_str()
                    ),
                ));
            }
        }
        // Upper bounds far beyond any real run: they keep the size arithmetic downstream
        // (bytes = batch · context · ...) from overflowing on a typo.
        for (key, v, max) in [
            (
                "batch",
                s.batch.iter().copied().max().unwrap_or(0),
                MAX_BATCH,
            ),
            (
                "context",
                s.context.iter().copied().max().unwrap_or(0),
                MAX_CONTEXT,
            ),
            ("decode_steps", s.decode_steps as i64, MAX_CONTEXT),
            ("prompt_len", s.prompt_len.unwrap_or(0) as i64, MAX_CONTEXT),
            ("repeats", s.repeats as i64, MAX_REPEATS),
            ("train_steps", s.train_steps as i64, MAX_STEPS),
        ] {
            // (TOML integers are i64, so the usize ones convert back exactly.)
            if v > max {
                return Err((
                    key,
                    format!("[sweep] `{key}` = {v} is too large (at most {max})"),
                ));
            }
        }
        if !(s.lr.is_finite() && s.lr > 0.0) {
            return Err((
                "lr",
                format!("[sweep] `lr` must be a positive number, got {}", s.lr),
            ));
        }
        for &b in &s.batch {
            if b <= 0 {
                return Err((
                    "batch",
                    format!("[sweep] `batch` must be positive, got {b}"),
                ));
            }
        }
        for &c in &s.context {
            if c <= 0 {
                return Err((
                    "context",
                    format!("[sweep] `context` must be positive, got {c}"),
                ));
            }
            let prompt = s
                .prompt_len
                .unwrap_or((c as usize).saturating_sub(s.decode_steps));
            let infer = s.mode.contains(&Mode::Infer);
            if infer && (prompt == 0 || prompt + s.decode_steps > c as usize) {
                let key = if s.prompt_len.is_some() {
                    "prompt_len"
                } else {
                    "context"
                };
                return Err((
                    key,
                    format!(
                        "[sweep] context {c} cannot hold prompt_len {prompt} + decode_steps {}",
                        s.decode_steps
                    ),
                ));
            }
        }
        if s.decode_every == 0 {
            return Err((
                "decode_every",
                "[sweep] `decode_every` must be at least 1".into(),
            ));
        }
        if s.repeats == 0 {
            return Err(("repeats", "[sweep] `repeats` must be at least 1".into()));
        }
        Ok(())
    }
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

    /// Wan2.1 fine-tunes (mode train, no `context`) and generates with flash attention; SD 1.5
    /// fine-tunes but generates without flash, FLUX does not fine-tune, each refused on the
    /// key's line.
    #[test]
    fn wan_trains_and_runs_flash_sd_trains_flux_does_not() {
        let wan = "name = \"w\"\n[model]\nsource = \"synthetic:wan2.1-t2v-1.3b\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\nresolution = [\"128x128\"]\nframes = [5]\ntrainable = [\"lora-r16\"]\nattention = [\"flash\"]\n";
        let s = Spec::parse(Path::new("w.toml"), wan).unwrap();
        assert_eq!(s.sweep.0[0].frames, Some(vec![5]));
        let gen = wan
            .replace("[\"train\"]", "[\"generate\"]")
            .replace("trainable = [\"lora-r16\"]\n", "");
        Spec::parse(Path::new("w.toml"), &gen).unwrap();
        Spec::parse(Path::new("s.toml"), &wan.replace("wan2.1-t2v-1.3b", "sd15")).unwrap();
        let flux = wan.replace("wan2.1-t2v-1.3b", "flux-dev");
        let e = Spec::parse(Path::new("f.toml"), &flux)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "line 5: [sweep] mode `train` on the diffusion pipeline `synthetic:flux-dev`"
            ),
            "{e}"
        );
        let e = Spec::parse(Path::new("s.toml"), &gen.replace("wan2.1-t2v-1.3b", "sd15"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 10: [sweep] attention `flash` is not available"),
            "{e}"
        );
        let e = Spec::parse(Path::new("w.toml"), &wan.replace("lora-r16", "full"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 10: [sweep] trainable `full`"), "{e}");
    }
}
