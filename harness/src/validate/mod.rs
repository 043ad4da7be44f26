//! `validate`: the estimator against published memory measurements (a peers file such as
//! `results/peers/published.json`, with its sources in `results/peers/SOURCES.md`).
//!
//! Each row names a model, a configuration and a metric in the collector's words. This module
//! reads those words at the boundary, once, into the estimator's vocabulary ([`Query`],
//! [`Metric`]); a row the estimator cannot express (Adafactor, 8-bit Adam, bitsandbytes
//! weights, a prompt length the source does not state) becomes [`Outcome::NotExpressible`]
//! with the reason, never dropped. An unknown metric or mode is bad input.
//!
//! Nothing here is tuned to the rows: every figure is the estimator's (weights, gradients,
//! optimizer state, activations by Korthikanti et al., device terms with their sourced
//! defaults), summed over the terms the row's metric includes.
use crate::error::bad_file;
use crate::estimate::{
    self, layer_activations, model_states, Attention, Backend, Breakdown, Mode, Optimizer,
    OptimizerImpl, Precision, Query, Recompute, Resolved, Runtime, Sharding, Trainable,
};
use crate::vocab::MAX_LORA_RANK;

use crate::fit::Constants;
use crate::model::Config;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub mod emulated;
mod generate;
mod metric;

pub use metric::Metric;
use metric::METRIC_PHRASES;

/// One published measurement, as the collector wrote it.
#[derive(Clone, Debug, Deserialize)]
pub struct PeerRow {
    pub id: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub framework: String,
    pub model: String,
    /// The card, in the source's words ("NVIDIA Tesla V100-SXM2 16GB").
    #[serde(default)]
    pub gpu: String,
    pub mode: String,
    pub precision: String,
    /// Absent from generation rows.
    #[serde(default)]
    pub optimizer: String,
    /// Images per prompt in a generation row.
    pub batch: Option<u64>,
    pub seq_len: Option<u64>,
    pub gradient_checkpointing: Option<bool>,
    pub metric: String,
    pub value_bytes: u64,
    #[serde(default)]
    pub notes: String,
    /// Generation rows: the output size as `WIDTHxHEIGHT` (or `width` and `height`); absent,
    /// the notes' `WIDTHxHEIGHT`, else the pipeline's default size.
    #[serde(default)]
    pub resolution: Option<String>,
    #[serde(default)]
    pub width: Option<usize>,
    #[serde(default)]
    pub height: Option<usize>,
    /// Generation rows: diffusers' `guidance_scale` (CFG runs above 1; absent, the pipeline's
    /// default, which guides).
    #[serde(default)]
    pub guidance_scale: Option<f64>,
}

/// The result for one row.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    Estimated {
        estimate_bytes: u64,
        /// (estimate − measured) / measured, in percent.
        error_pct: f64,
        /// The estimator rows the metric includes, with their bytes.
        terms: Vec<Term>,
    },
    NotExpressible {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    pub name: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Validated {
    pub id: String,
    /// The model as the estimator knows it (preset name, or the row's words).
    pub model: String,
    pub metric: Metric,
    pub includes: &'static str,
    pub measured_bytes: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// `--emulate`: the row's program on the emulated GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulated: Option<emulated::Column>,
}

impl Validated {
    pub fn error_pct(&self) -> Option<f64> {
        match &self.outcome {
            Outcome::Estimated { error_pct, .. } => Some(*error_pct),
            Outcome::NotExpressible { .. } => None,
        }
    }
}

/// Median and worst absolute error over the estimated rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub estimated: usize,
    pub not_expressible: usize,
    pub median_abs_error_pct: Option<f64>,
    pub worst_abs_error_pct: Option<f64>,
    pub worst_id: Option<String>,
}

pub fn summarize(rows: &[Validated]) -> Summary {
    let mut errs: Vec<(f64, &str)> = rows
        .iter()
        .filter_map(|r| r.error_pct().map(|e| (e.abs(), r.id.as_str())))
        .collect();
    errs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = errs.len();
    let median = (n > 0).then(|| {
        if n % 2 == 1 {
            errs[n / 2].0
        } else {
            (errs[n / 2 - 1].0 + errs[n / 2].0) / 2.0
        }
    });
    Summary {
        estimated: n,
        not_expressible: rows.len() - n,
        median_abs_error_pct: median,
        worst_abs_error_pct: errs.last().map(|e| e.0),
        worst_id: errs.last().map(|e| e.1.to_string()),
    }
}

/// Reads a peers file: a JSON array of rows. Malformed input is one line naming the file.
pub fn load(path: &Path) -> Result<Vec<PeerRow>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let rows: Vec<PeerRow> = serde_json::from_str(&text).map_err(|e| {
        bad_file(
            path,
            format!("not a peers file (a JSON array of rows): {e}"),
        )
    })?;
    if rows.is_empty() {
        return Err(bad_file(path, "no rows"));
    }
    for r in &rows {
        if Metric::parse(&r.metric).is_none() {
            let known: Vec<&str> = METRIC_PHRASES.iter().map(|(p, _)| *p).collect();
            return Err(bad_file(
                path,
                format!(
                    "row `{}`: unknown metric `{}` (known: {})",
                    r.id,
                    r.metric,
                    known.join("; ")
                ),
            ));
        }
        if r.value_bytes == 0 {
            return Err(bad_file(path, format!("row `{}`: value_bytes is 0", r.id)));
        }
    }
    Ok(rows)
}

/// CUDA context before lazy module loading (CUDA < 11.7): 1343 MiB, what the transformers
/// docs measured after `torch.ones((1, 1)).to("cuda")` with CUDA 11.2 on a V100
/// (docs/source/en/model_memory_anatomy.md). Since CUDA 11.7 (`CUDA_MODULE_LOADING=LAZY`)
/// the estimator's default [`estimate::CUDA_CONTEXT`] applies.
pub const CUDA_CONTEXT_EAGER_LOADING: u64 = 1343 << 20;

/// GPT-3 175B's shapes (Brown et al. 2020, Table 2.1: d_model 12288, 96 layers, 96 heads,
/// context 2048) as a GPT-2 config (GPT-3 shares GPT-2's architecture and tokenizer).
const GPT3_175B: &str = r#"{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 12288,
    "n_layer": 96, "n_head": 96, "n_positions": 2048}"#;

/// Model names of the rows that are not preset names: (leading words, preset or config).
enum Known {
    Preset(&'static str),
    Json(&'static str, &'static str),
}
const MODEL_ALIASES: &[(&str, Known)] = &[
    // OctoCoder is StarCoder (15.5B, gpt_bigcode) instruction-tuned: the same config.json.
    ("bigcode/octocoder", Known::Preset("starcoder-15.5b")),
    ("bigcode/starcoder", Known::Preset("starcoder-15.5b")),
    ("gpt-3 175b", Known::Json("gpt3-175b", GPT3_175B)),
];

/// What the estimator knows of a row's model.
enum ModelRef {
    Config(Box<Resolved>),
    /// Only a parameter count ("generic 7.5B-parameter transformer").
    Params(u64),
}

fn model_ref(words: &str) -> Option<ModelRef> {
    let lower = words.trim().to_ascii_lowercase();
    for (prefix, known) in MODEL_ALIASES {
        if lower.starts_with(prefix) {
            return match known {
                Known::Preset(p) => estimate::resolve(p)
                    .ok()
                    .map(|r| ModelRef::Config(Box::new(r))),
                Known::Json(name, text) => {
                    let v: serde_json::Value = serde_json::from_str(text).expect("built-in JSON");
                    Config::from_json(Path::new(name), &v).ok().map(|config| {
                        ModelRef::Config(Box::new(Resolved {
                            name: name.to_string(),
                            config,
                            gguf: None,
                            stored_bytes: None,
                            quant: None,
                        }))
                    })
                }
            };
        }
    }
    // An HF id: its last component as a preset name ("meta-llama/Llama-3.1-8B").
    let last = lower.rsplit('/').next().unwrap_or(&lower);
    if let Ok(r) = estimate::resolve(last) {
        return Some(ModelRef::Config(Box::new(r)));
    }
    // "generic 7.5B-parameter transformer": a parameter count only.
    lower.split_whitespace().find_map(|w| {
        let n = w.strip_suffix("b-parameter")?;
        let v: f64 = n.parse().ok()?;
        Some(ModelRef::Params((v * 1e9).round() as u64))
    })
}

/// The first integer after `key` in `text` ("N_d=64" → 64).
pub(crate) fn number_after(text: &str, key: &str) -> Option<u64> {
    let i = text.find(key)? + key.len();
    let digits: String = text[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The CUDA version a row's framework states ("CUDA 11.2" → (11, 2)).
fn cuda_version(framework: &str) -> Option<(u64, u64)> {
    let i = framework.find("CUDA ")? + 5;
    let mut it = framework[i..].split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

pub(crate) type Expressed<T> = std::result::Result<T, String>;

/// A row's estimate as (model, estimator rows), or (model, why it cannot be expressed).
pub(crate) type RowEstimate = std::result::Result<(String, Vec<(String, u64)>), (String, String)>;

pub(crate) fn precision(words: &str) -> Expressed<Precision> {
    let first = words
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    Ok(match first.as_str() {
        "fp32" | "f32" => Precision::F32,
        "fp16" | "f16" => Precision::F16,
        "bf16" => Precision::Bf16,
        "mixed-fp16" | "mixed-f16" => Precision::MixedF16,
        "mixed-bf16" => Precision::MixedBf16,
        "int8" | "int4" | "nf4" | "fp4" => {
            return Err(format!(
                "{first} weights (bitsandbytes quantization) are not an estimator precision"
            ))
        }
        _ => return Err(format!("precision `{words}` is not an estimator precision")),
    })
}

/// The trainable set a row's notes state: LoRA of the rank after "lora r=" where they name
/// LoRA, else every weight.
pub(crate) fn trainable(lower_notes: &str) -> Expressed<Trainable> {
    if !lower_notes.contains("lora") {
        return Ok(Trainable::Full);
    }
    match number_after(lower_notes, "lora r=").map(u32::try_from) {
        Some(Ok(r)) if (1..=MAX_LORA_RANK).contains(&r) => Ok(Trainable::Lora(r)),
        _ => Err("LoRA without a rank (\"LoRA r=N\") in the notes".into()),
    }
}

fn optimizer(words: &str) -> Expressed<(Optimizer, OptimizerImpl)> {
    let lower = words.to_ascii_lowercase();
    let first = lower.split_whitespace().next().unwrap_or("");
    // transformers' own AdamW (`adamw_hf`, the Trainer default before 4.x's `adamw_torch`)
    // updates one parameter at a time.
    let imp = if lower.contains("adamw_hf") {
        OptimizerImpl::ForLoop
    } else if lower.contains("fused") {
        OptimizerImpl::Fused
    } else {
        OptimizerImpl::Foreach
    };
    Ok(match first {
        "none" | "n/a" => (Optimizer::None, imp),
        "adamw" | "adam" => (Optimizer::Adamw, imp),
        "sgd" => (Optimizer::Sgd, imp),
        "adafactor" => {
            return Err("Adafactor (factored second moments) is not an estimator optimizer".into())
        }
        _ if lower.contains("8bit") || lower.contains("8-bit") => {
            return Err("8-bit Adam (bitsandbytes) is not an estimator optimizer".into())
        }
        _ => return Err(format!("optimizer `{words}` is not an estimator optimizer")),
    })
}

/// Estimates one row (`constants` where their architecture matches the row's model).
pub fn validate_row(
    path: &Path,
    r: &PeerRow,
    constants: Option<&Constants>,
    emulate: Option<&emulated::Options>,
) -> Result<Validated> {
    let metric = Metric::parse(&r.metric)
        .ok_or_else(|| bad_file(path, format!("row `{}`: unknown metric", r.id)))?;
    let mode = match r.mode.trim().to_ascii_lowercase().as_str() {
        "training" | "train" => Mode::Train,
        "inference" | "infer" => Mode::Infer,
        "generation" | "generate" | "text-to-image" | "image generation" => Mode::Generate,
        m => {
            return Err(bad_file(
                path,
                format!(
                    "row `{}`: unknown mode `{m}` (training, inference, generation)",
                    r.id
                ),
            ))
        }
    };
    // A diffusion pipeline's row is a generation whatever its mode says ("inference").
    let rows = match generate::model(&r.model) {
        Some(m) if mode != Mode::Train => generate::estimate_row(r, m, constants),
        Some(m) => Err((
            m.to_string(),
            "training a diffusion pipeline is not an estimator mode".into(),
        )),
        None if mode == Mode::Generate => Err((
            r.model.clone(),
            format!("no generation preset for model `{}`", r.model),
        )),
        None => estimate_row(r, metric, mode, constants).map(|(m, b)| {
            let rows = b.rows().into_iter().map(|(n, v)| (n.to_string(), v));
            (m, rows.collect())
        }),
    };
    let (model, outcome) = match rows {
        Ok((model, rows)) => {
            let terms: Vec<Term> = rows
                .into_iter()
                .filter(|(n, bytes)| metric.counts(n) && *bytes > 0)
                .map(|(name, bytes)| Term { name, bytes })
                .collect();
            let est: u64 = terms.iter().map(|t| t.bytes).sum();
            let err = 100.0 * (est as f64 - r.value_bytes as f64) / r.value_bytes as f64;
            (
                model,
                Outcome::Estimated {
                    estimate_bytes: est,
                    error_pct: err,
                    terms,
                },
            )
        }
        Err((model, reason)) => (model, Outcome::NotExpressible { reason }),
    };
    Ok(Validated {
        id: r.id.clone(),
        model,
        metric,
        includes: metric.includes(),
        measured_bytes: r.value_bytes,
        outcome,
        emulated: match emulate {
            Some(o) => Some(emulated::column(r, metric, o)?),
            None => None,
        },
    })
}

/// The estimator's breakdown for a row, or why it cannot express it (with the model name).
fn estimate_row(
    r: &PeerRow,
    metric: Metric,
    mode: Mode,
    constants: Option<&Constants>,
) -> std::result::Result<(String, Breakdown), (String, String)> {
    let Some(mref) = model_ref(&r.model) else {
        return Err((
            r.model.clone(),
            format!("no preset or config for model `{}`", r.model),
        ));
    };
    let name = match &mref {
        ModelRef::Config(c) => c.name.clone(),
        ModelRef::Params(p) => format!("{p} params"),
    };
    let fail = |why: String| (name.clone(), why);
    let precision = precision(&r.precision).map_err(fail)?;
    let (optimizer, optimizer_impl) = optimizer(&r.optimizer).map_err(fail)?;
    let text = format!("{} {}", r.metric, r.notes);
    let lower = text.to_ascii_lowercase();
    // ZeRO stage and data-parallel degree ("ZeRO-3 across N_d=64"); tensor parallelism
    // ("tensor parallel t=8"), sequence parallelism and selective recomputation.
    let sharding = match number_after(&text, "ZeRO-") {
        Some(1) => Sharding::Zero1,
        Some(2) => Sharding::Zero2,
        Some(3) => Sharding::Zero3,
        _ if lower.contains("fsdp") => Sharding::Fsdp,
        _ => Sharding::Ddp,
    };
    let gpus = number_after(&text, "N_d=")
        .or_else(|| number_after(&lower, "num_gpus="))
        .unwrap_or(1);
    let trainable = trainable(&lower).map_err(fail)?;
    // Eager (transformers' default before 4.36, and "explicit (non-flash)" attention) unless
    // the row names flash attention.
    let flash = lower.replace("non-flash", "").contains("flash");
    let attention = if flash && !lower.contains("eager") {
        Attention::Flash
    } else {
        Attention::Eager
    };
    let new_tokens = number_after(&r.notes, "max_new_tokens=").unwrap_or(0);
    let q = Query {
        mode,
        precision,
        batch: r.batch.unwrap_or(1),
        context: r.seq_len.unwrap_or(1) + if mode == Mode::Infer { new_tokens } else { 0 },
        optimizer,
        checkpointing: if r.gradient_checkpointing.unwrap_or(false) {
            crate::vocab::Checkpointing::Layer
        } else {
            crate::vocab::Checkpointing::None
        },
        sharding,
        gpus,
        trainable,
        attention,
        runtime: Runtime::Torch,
        backend: Backend::Cuda,
        optimizer_impl,
        ..Query::default()
    };
    let over = |o: estimate::Overflow| fail(o.to_string());
    let b = match (metric, &mref) {
        (Metric::ModelStates, ModelRef::Params(p)) => {
            model_states(*p, *p, 0, None, &q).map_err(over)?
        }
        (Metric::LayerActivations, ModelRef::Config(c)) => {
            let (Some(b), Some(s)) = (r.batch, r.seq_len) else {
                return Err(fail("batch or sequence length not stated".into()));
            };
            let recompute = match r.gradient_checkpointing {
                Some(true) if lower.contains("selective") => Recompute::Selective,
                Some(true) => Recompute::Full,
                _ => Recompute::None,
            };
            let tp = number_after(&r.metric, "t=").unwrap_or(1);
            let sp = lower.contains("sequence parallel");
            Breakdown {
                activations: layer_activations(
                    &c.config,
                    b,
                    s,
                    precision.act_bytes(),
                    attention == Attention::Eager,
                    recompute,
                    tp,
                    sp,
                )
                .bytes("activations")
                .map_err(over)?,
                ..Default::default()
            }
        }
        (Metric::LayerActivations, ModelRef::Params(_)) => {
            return Err(fail(
                "the metric needs the model's shapes, not only its size".into(),
            ))
        }
        (_, ModelRef::Params(_)) => {
            return Err(fail("a measured figure needs the model's shapes".into()))
        }
        (_, ModelRef::Config(c)) => {
            let cfg = &c.config;
            // Constants answer only for the architecture they were fitted on.
            let k = constants.filter(|k| {
                k.check_architecture(Path::new(""), cfg.architecture.name())
                    .is_ok()
            });
            let mut e = match (mode, r.batch, r.seq_len) {
                // Model states do not depend on the batch or the sequence.
                (Mode::Train, _, _) if metric == Metric::ModelStates => {
                    estimate::estimate(cfg, &q, k).map_err(over)?
                }
                // Weights loaded, no forward pass: no cuBLAS handle yet.
                (Mode::Infer, None, None) => estimate::with_reserve_of(
                    estimate::estimate(cfg, &q, k).map_err(over)?.weights_only(),
                    &q,
                    k,
                    crate::fit::reserve::ReserveClass::LOAD,
                    &estimate::query_terms(cfg, &q, crate::record::Phase::Load).map_err(over)?,
                )
                .map_err(over)?,
                (_, Some(_), Some(_)) => estimate::estimate(cfg, &q, k).map_err(over)?,
                (Mode::Infer, Some(_), None) => {
                    return Err(fail("prompt length not stated in the source".into()))
                }
                _ => return Err(fail("batch or sequence length not stated".into())),
            };
            if cuda_version(&r.framework).is_some_and(|v| v < (11, 7)) {
                e.cuda_context = CUDA_CONTEXT_EAGER_LOADING;
            }
            e
        }
    };
    Ok((name, b))
}

impl Breakdown {
    /// Weights and the device's context and rounding only (a model loaded, nothing run: no
    /// cuBLAS handle yet).
    fn weights_only(self) -> Breakdown {
        Breakdown {
            weights: self.weights,
            cuda_context: self.cuda_context,
            allocator_reserve: self.allocator_reserve,
            reserve_source: self.reserve_source,
            source: self.source,
            ..Default::default()
        }
    }
}

/// Validates every row of a peers file; with `emulate`, also runs each row's program on the
/// emulated GPU (a line on stderr per row that runs).
pub fn validate(
    path: &Path,
    constants: Option<&Constants>,
    emulate: Option<&emulated::Options>,
) -> Result<Vec<Validated>> {
    let rows = load(path)?;
    let n = rows.len();
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            if emulate.is_some() && emulated::program(r).is_ok() {
                eprintln!("validate --emulate: row {}/{n} {} ...", i + 1, r.id);
            }
            validate_row(path, r, constants, emulate)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse_by_leading_phrase() {
        assert_eq!(
            Metric::parse("nvidia-smi used (NVML, whole device)"),
            Some(Metric::NvmlUsed)
        );
        assert_eq!(
            Metric::parse("torch.cuda.max_memory_allocated"),
            Some(Metric::MaxAllocated)
        );
        assert_eq!(Metric::parse("peak RSS"), None);
    }

    #[test]
    fn cuda_versions_and_numbers() {
        assert_eq!(cuda_version("driver 460.91.03, CUDA 11.2"), Some((11, 2)));
        assert_eq!(cuda_version("PyTorch 2.x"), None);
        assert_eq!(number_after("ZeRO-3 across N_d=64 ranks", "N_d="), Some(64));
    }

    #[test]
    fn median_of_even_and_odd() {
        let row = |id: &str, e: f64| Validated {
            id: id.into(),
            model: "m".into(),
            metric: Metric::NvmlUsed,
            includes: "",
            measured_bytes: 1,
            outcome: Outcome::Estimated {
                estimate_bytes: 1,
                error_pct: e,
                terms: vec![],
            },
            emulated: None,
        };
        let s = summarize(&[row("a", -1.0), row("b", 3.0), row("c", -7.0)]);
        assert_eq!(s.median_abs_error_pct, Some(3.0));
        assert_eq!(s.worst_id.as_deref(), Some("c"));
        let s = summarize(&[row("a", -1.0), row("b", 3.0)]);
        assert_eq!(s.median_abs_error_pct, Some(2.0));
    }
}
