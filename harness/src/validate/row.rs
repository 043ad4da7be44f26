//! One published measurement of a peers file (`results/peers/published.json`), typed: every
//! value the estimator or the emulated column reads is a field spelled as the rest of vramlab
//! spells it (the vocabulary's precision, optimizer, trainable set, attention and stack, the
//! GPU catalogue's key, the metric's name, a preset name), read once by serde. The source's
//! own words stay beside them for people (`model`, `framework`, `quote`, `notes`) and are never
//! parsed. A row with an unknown key, an unknown value or a missing one is one line naming the
//! file, the row and the key (exit 2).
use super::Metric;
use crate::error::bad_file;
use crate::estimate::{Recompute, Sharding};
use crate::vocab::{
    Attention, GenModel, KvCacheDtype, LoraTargets, Mode, Optimizer, OptimizerImpl, Precision,
    Resolution, Stack, Trainable,
};
use anyhow::Result;
use serde::{Deserialize, Deserializer};
use std::path::Path;

/// One published measurement.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRow {
    pub id: String,
    /// Where the figure is published (a URL, with the file or table where it helps).
    pub source: String,
    /// The figure as the source prints it, verbatim.
    pub quote: String,
    /// The software the source ran, in its words (shown in the emulated column's note).
    pub framework: String,
    /// The model as the source names it (an HF id, or the paper's words).
    pub model: String,
    /// The preset the estimator reads: a built-in LLM preset (`vramlab estimate --model`), a
    /// generation preset (`sdxl`, …) for a `generate` row, or `gpt3-175b` (the paper's shapes).
    #[serde(default)]
    pub preset: Option<String>,
    /// Instead of a preset: a parameter count only (a paper's "7.5B-parameter" model).
    #[serde(default)]
    pub params: Option<u64>,
    /// The card's GPU catalogue key (`vramlab gpus`); null for a formula or an uncatalogued card.
    #[serde(deserialize_with = "present")]
    pub gpu: Option<String>,
    /// The installable stack closest to the row's software (`validate --emulate` runs it);
    /// null for the default stack.
    #[serde(deserialize_with = "present")]
    pub stack: Option<Stack>,
    /// The CUDA version the source states (`"11.2"`), if it states one: before 11.7 (eager
    /// module loading) the CUDA context is [`super::CUDA_CONTEXT_EAGER_LOADING`].
    #[serde(deserialize_with = "present")]
    pub cuda: Option<CudaVersion>,
    /// The CUDA context the source measured on its own driver, MiB, if it measured one.
    #[serde(default)]
    pub context_mib: Option<u64>,
    pub mode: Mode,
    /// Null only for bitsandbytes weights (`bnb_weights`).
    #[serde(deserialize_with = "present")]
    pub precision: Option<Precision>,
    #[serde(default)]
    pub bnb_weights: Option<BnbWeights>,
    pub optimizer: PeerOptimizer,
    /// Training rows: the trainable set.
    #[serde(default)]
    pub trainable: Option<Trainable>,
    /// LoRA rows: the modules the adapters sit on, as `estimate --lora-targets` writes them
    /// (absent: peft's default for the architecture).
    #[serde(default)]
    pub lora_targets: Option<LoraTargets>,
    /// LoRA rows: peft's `lora_dropout` (absent: 0, none).
    #[serde(default)]
    pub lora_dropout: f64,
    /// Sequences per step on each GPU (images per prompt in a generation row).
    #[serde(deserialize_with = "present")]
    pub batch: Option<u64>,
    /// Tokens per sequence (training), or the prompt's tokens (inference); null where the
    /// source does not state it.
    #[serde(deserialize_with = "present")]
    pub context: Option<u64>,
    /// Inference rows: the tokens generated after the prompt (`max_new_tokens`).
    #[serde(default)]
    pub new_tokens: u64,
    /// Training rows: what the backward recomputes (`full` is layer checkpointing).
    #[serde(default)]
    pub recompute: Option<Recompute>,
    /// Training rows: how the model states are spread over `gpus`.
    #[serde(default)]
    pub sharding: Option<Sharding>,
    #[serde(default = "one")]
    pub gpus: u64,
    /// Training rows: gradient accumulation steps.
    #[serde(default)]
    pub grad_accum: Option<u64>,
    /// A formula's tensor-parallel degree.
    #[serde(default = "one")]
    pub tensor_parallel: u64,
    #[serde(default)]
    pub sequence_parallel: bool,
    pub attention: Attention,
    pub metric: Metric,
    pub value_bytes: u64,
    /// The program vramlab carries that reproduces the row (`validate --emulate`).
    #[serde(default)]
    pub program: Option<Program>,
    /// Generation rows: the output size (absent: the pipeline's default).
    #[serde(default)]
    pub resolution: Option<Resolution>,
    /// Generation rows: diffusers' `guidance_scale` (CFG above 1; absent: the default, which
    /// guides).
    #[serde(default)]
    pub guidance_scale: Option<f64>,
    /// Generation rows: the pipeline's setup calls beyond the defaults.
    #[serde(default)]
    pub setup: Vec<Setup>,
    /// Generation rows: `num_inference_steps`.
    #[serde(default)]
    pub steps: Option<u64>,
    /// vLLM startup rows (metric `vllm-available-kv`): the engine's settings.
    #[serde(default)]
    pub serving: Option<ServingRow>,
    /// The collector's notes, for people.
    pub notes: String,
}

fn one() -> u64 {
    1
}

/// A key that must be present, null allowed (serde treats a missing `Option` as null
/// otherwise).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// A vLLM engine startup's settings, as the source's command line and log state them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingRow {
    /// The vLLM release the source ran.
    pub vllm: VllmVersion,
    /// `--max-model-len` (tokens).
    pub max_model_len: u64,
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// The tokens of the profile run's forward: `--max-num-batched-tokens` with chunked
    /// prefill; without it (vLLM's V0 engine), `max(max_model_len, 2048)`.
    pub max_num_batched_tokens: u64,
    /// `--max-num-seqs`.
    pub max_num_seqs: u64,
    pub kv_cache_dtype: KvCacheDtype,
    /// Whether the engine captured CUDA graphs (false: `--enforce-eager`).
    pub cuda_graphs: bool,
}

/// A vLLM release, `MAJOR.MINOR.PATCH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct VllmVersion(pub u64, pub u64, pub u64);

impl TryFrom<String> for VllmVersion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || format!("vLLM version `{s}` must be MAJOR.MINOR.PATCH, e.g. 0.19.0");
        let parts: Vec<u64> = s
            .split('.')
            .map(|p| p.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [a, b, c] => Ok(VllmVersion(a, b, c)),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// A CUDA version, `MAJOR.MINOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct CudaVersion(pub u64, pub u64);

impl TryFrom<String> for CudaVersion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || format!("CUDA version `{s}` must be MAJOR.MINOR, e.g. 11.2");
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        Ok(CudaVersion(
            a.parse().map_err(|_| bad())?,
            b.parse().map_err(|_| bad())?,
        ))
    }
}

/// Weights bitsandbytes quantized at load (no estimator precision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, strum::Display)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum BnbWeights {
    /// `load_in_8bit` (LLM.int8).
    Int8,
    /// `load_in_4bit` with its default fp4 quant type.
    Fp4,
}

/// The optimizer a row ran: the vocabulary's, or one the estimator does not model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum PeerOptimizer {
    Known(Optimizer),
    /// transformers' Adafactor (factored second moments).
    Adafactor,
    /// bitsandbytes' `Adam8bit` (Adam, not AdamW).
    Adam8bit,
}

impl TryFrom<String> for PeerOptimizer {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "adafactor" => Ok(PeerOptimizer::Adafactor),
            "adam-8bit" => Ok(PeerOptimizer::Adam8bit),
            _ => s.parse().map(PeerOptimizer::Known).map_err(|_| {
                use strum::IntoEnumIterator;
                let known: Vec<&str> = Optimizer::iter().map(|o| o.as_str()).collect();
                format!(
                    "unknown optimizer `{s}` (known: {}, adafactor, adam-8bit)",
                    known.join(", ")
                )
            }),
        }
    }
}

impl PeerOptimizer {
    /// The estimator's optimizer and torch implementation (`adamw` alone is torch's default
    /// on CUDA, foreach), or why it has none.
    pub fn split(self) -> std::result::Result<(Optimizer, OptimizerImpl), String> {
        let o =
            match self {
                PeerOptimizer::Known(o) => o,
                PeerOptimizer::Adafactor => {
                    return Err(
                        "Adafactor (factored second moments) is not an estimator optimizer".into(),
                    )
                }
                PeerOptimizer::Adam8bit => return Err(
                    "bitsandbytes' Adam8bit (8-bit Adam, not AdamW) is not an estimator optimizer"
                        .into(),
                ),
            };
        Ok(match o {
            Optimizer::AdamwForLoop => (Optimizer::Adamw, OptimizerImpl::ForLoop),
            Optimizer::AdamwForeach => (Optimizer::Adamw, OptimizerImpl::Foreach),
            Optimizer::AdamwFused => (Optimizer::Adamw, OptimizerImpl::Fused),
            Optimizer::SgdForLoop => (Optimizer::Sgd, OptimizerImpl::ForLoop),
            Optimizer::SgdForeach => (Optimizer::Sgd, OptimizerImpl::Foreach),
            Optimizer::SgdFused => (Optimizer::Sgd, OptimizerImpl::Fused),
            o => (o, OptimizerImpl::Foreach),
        })
    }
}

/// The peer programs vramlab carries (`harness/python/.../peer_*.py`, `validate --emulate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// transformers' single-GPU training guide: the HF Trainer on bert-large (a `infer` row
    /// loads the model only).
    HfTrainer,
    /// fms-acceleration's fine-tuning benchmark (fms-hf-tuning's SFT on the HF Trainer).
    FmsSft,
    /// HF's "Exploring simple optimizations for SDXL" notebook.
    SdxlNotebook,
}

/// A diffusers pipeline's setup call beyond the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// `enable_vae_slicing()`.
    VaeSlicing,
    /// `enable_vae_tiling()`.
    VaeTiling,
    /// `enable_model_cpu_offload()`.
    ModelCpuOffload,
    /// `enable_sequential_cpu_offload()`.
    SequentialCpuOffload,
    /// `pipe.vae = AutoencoderTiny(...)` (TAESD).
    TinyAutoencoder,
    /// `torch.compile` of the UNet.
    TorchCompile,
    /// Text embeddings computed first, the encoders dropped.
    PrecomputedEmbeddings,
}

impl Setup {
    /// Why the estimator does not model it (`None`: it does).
    pub fn not_modelled(self) -> Option<&'static str> {
        Some(match self {
            Setup::VaeSlicing | Setup::VaeTiling => return None,
            Setup::ModelCpuOffload | Setup::SequentialCpuOffload => {
                "CPU offloading (weights moved to the host between uses) is not modelled"
            }
            Setup::TinyAutoencoder => {
                "the Tiny AutoEncoder (TAESD) is not a VAE the estimator knows"
            }
            Setup::TorchCompile => {
                "torch.compile's fused kernels change the activations; not modelled"
            }
            Setup::PrecomputedEmbeddings => {
                "precomputed text embeddings (encoders not loaded) are not modelled"
            }
        })
    }
}

impl PeerRow {
    /// The generation preset of a `generate` row.
    pub fn pipeline(&self) -> Option<GenModel> {
        self.preset.as_deref().and_then(|p| p.parse().ok())
    }

    /// What no serde type says: the keys a mode needs, and values that must resolve.
    fn check(&self) -> std::result::Result<(), String> {
        if self.value_bytes == 0 {
            return Err("key `value_bytes`: 0".into());
        }
        match (&self.preset, self.params) {
            (None, None) => return Err("key `preset` missing (or `params`)".into()),
            (Some(_), Some(_)) => return Err("keys `preset` and `params`: give one".into()),
            _ => {}
        }
        if let Some(p) = &self.preset {
            let known = match self.mode {
                Mode::Generate => self.pipeline().is_some(),
                _ => p == super::GPT3_175B.0 || crate::estimate::resolve(p).is_ok(),
            };
            if !known {
                return Err(format!("key `preset`: unknown preset `{p}`"));
            }
        }
        if let Some(g) = &self.gpu {
            if crate::gpu::by_name(g).is_none_or(|c| c.key != *g) {
                return Err(format!(
                    "key `gpu`: `{g}` is not a GPU catalogue key (known: {})",
                    crate::gpu::names().join(", ")
                ));
            }
        }
        if self.precision.is_none() && self.bnb_weights.is_none() {
            return Err("key `precision` is null without `bnb_weights`".into());
        }
        match self.mode {
            Mode::Train => {
                for (key, missing) in [
                    ("trainable", self.trainable.is_none()),
                    ("recompute", self.recompute.is_none()),
                    ("sharding", self.sharding.is_none()),
                ] {
                    if missing {
                        return Err(format!("key `{key}` missing (a training row)"));
                    }
                }
            }
            Mode::Encode => return Err("key `mode`: `encode` is not a peers mode".into()),
            Mode::Infer | Mode::Generate => {}
        }
        let lora = self.trainable.and_then(|t| t.lora_rank()).is_some();
        if !lora && (self.lora_targets.is_some() || self.lora_dropout != 0.0) {
            return Err("keys `lora_targets` and `lora_dropout` are a LoRA row's".into());
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(format!(
                "key `lora_dropout`: {} is not in [0, 1)",
                self.lora_dropout
            ));
        }
        if self.gpus == 0 || self.tensor_parallel == 0 {
            return Err("keys `gpus` and `tensor_parallel` are at least 1".into());
        }
        match (&self.serving, self.metric == Metric::VllmAvailableKv) {
            (None, true) => return Err("key `serving` missing (a vLLM startup row)".into()),
            (Some(_), false) => {
                return Err(format!(
                    "key `serving`: only a `vllm-available-kv` row has one (this row's metric is \
                     `{}`)",
                    self.metric.as_str()
                ))
            }
            (Some(v), true) => {
                if self.mode != Mode::Infer || self.gpu.is_none() {
                    return Err("a vLLM startup row is mode `infer` on a catalogued `gpu`".into());
                }
                if !(v.gpu_memory_utilization > 0.0 && v.gpu_memory_utilization <= 1.0) {
                    return Err(format!(
                        "key `serving`: gpu_memory_utilization {} is not in (0, 1]",
                        v.gpu_memory_utilization
                    ));
                }
                if v.max_model_len == 0 || v.max_num_batched_tokens == 0 || v.max_num_seqs == 0 {
                    return Err("key `serving`: max_model_len, max_num_batched_tokens and \
                                max_num_seqs are at least 1"
                        .into());
                }
            }
            (None, false) => {}
        }
        Ok(())
    }
}

/// The key a row's serde error is about: the first whose removal changes the error (serde
/// stops at the first bad value; without that key the row either reads or misses it).
fn culprit(row: &serde_json::Map<String, serde_json::Value>, error: &str) -> Option<String> {
    row.keys()
        .find(|k| {
            let mut without = row.clone();
            without.remove(*k);
            match PeerRow::deserialize(serde_json::Value::Object(without)) {
                Ok(_) => true,
                Err(e) => e.to_string() != error,
            }
        })
        .cloned()
}

/// Reads a peers file: a JSON array of typed rows. Bad input is one line naming the file, the
/// row and the key.
pub fn load(path: &Path) -> Result<Vec<PeerRow>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let values: Vec<serde_json::Value> = serde_json::from_str(&text).map_err(|e| {
        bad_file(
            path,
            format!("not a peers file (a JSON array of rows): {e}"),
        )
    })?;
    if values.is_empty() {
        return Err(bad_file(path, "no rows"));
    }
    let mut rows = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let name = match v.get("id").and_then(|id| id.as_str()) {
            Some(id) => format!("row {} (`{id}`)", i + 1),
            None => format!("row {}", i + 1),
        };
        let row = match PeerRow::deserialize(&v) {
            Ok(r) => r,
            Err(e) => {
                let e = e.to_string();
                // serde names the key of a missing or unknown field itself.
                let named = e.starts_with("missing field") || e.starts_with("unknown field");
                let key = v
                    .as_object()
                    .filter(|_| !named)
                    .and_then(|o| culprit(o, &e))
                    .map(|k| format!("key `{k}`: "))
                    .unwrap_or_default();
                return Err(bad_file(path, format!("{name}: {key}{e}")));
            }
        };
        row.check()
            .map_err(|e| bad_file(path, format!("{name}: {e}")))?;
        rows.push(row);
    }
    Ok(rows)
}
