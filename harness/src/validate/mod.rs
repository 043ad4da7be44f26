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
use crate::estimate::{
    self, layer_activations, model_states, Attention, Backend, Breakdown, Mode, Precision, Query,
    Recompute, Resolved, Runtime,
};

use crate::fit::Constants;
use crate::model::Config;
use anyhow::Result;
use serde::Serialize;
use std::path::Path;

pub mod emulated;
mod generate;
mod metric;
mod row;
mod serving;

pub use metric::Metric;
pub use row::{load, BnbWeights, PeerOptimizer, PeerRow, Program, ServingRow, Setup, VllmVersion};

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

/// CUDA context before lazy module loading (CUDA < 11.7): 1343 MiB, what the transformers
/// docs measured after `torch.ones((1, 1)).to("cuda")` with CUDA 11.2 on a V100
/// (docs/source/en/model_memory_anatomy.md). Since CUDA 11.7 (`CUDA_MODULE_LOADING=LAZY`)
/// the estimator's default [`estimate::CUDA_CONTEXT`] applies.
pub const CUDA_CONTEXT_EAGER_LOADING: u64 = 1343 << 20;

/// GPT-3 175B's shapes (Brown et al. 2020, Table 2.1: d_model 12288, 96 layers, 96 heads,
/// context 2048) as a GPT-2 config (GPT-3 shares GPT-2's architecture and tokenizer): the
/// `preset` of the papers' formula rows.
pub(crate) const GPT3_175B: (&str, &str) = (
    "gpt3-175b",
    r#"{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 12288,
    "n_layer": 96, "n_head": 96, "n_positions": 2048}"#,
);

/// What the estimator knows of a row's model.
enum ModelRef {
    Config(Box<Resolved>),
    /// Only a parameter count (a paper's "7.5B-parameter" model).
    Params(u64),
}

/// The row's preset (checked when the file was read) or parameter count.
fn model_ref(r: &PeerRow) -> std::result::Result<ModelRef, String> {
    let Some(preset) = &r.preset else {
        return Ok(ModelRef::Params(r.params.unwrap_or(0)));
    };
    if preset == GPT3_175B.0 {
        let v: serde_json::Value = serde_json::from_str(GPT3_175B.1).expect("built-in JSON");
        let config = Config::from_json(Path::new(GPT3_175B.0), &v).map_err(|e| e.to_string())?;
        return Ok(ModelRef::Config(Box::new(Resolved {
            name: preset.clone(),
            config,
            gguf: None,
            stored_bytes: None,
            quant: None,
        })));
    }
    estimate::resolve(preset)
        .map(|c| ModelRef::Config(Box::new(c)))
        .map_err(|e| e.to_string())
}

/// A row's estimate as (model, estimator rows), or (model, why it cannot be expressed).
pub(crate) type RowEstimate = std::result::Result<(String, Vec<(String, u64)>), (String, String)>;

/// The dense precision a row's weights are in, or why it is not an estimator precision.
pub(crate) fn precision(r: &PeerRow) -> std::result::Result<Precision, String> {
    match (r.precision, r.bnb_weights) {
        (_, Some(b)) => Err(format!(
            "bitsandbytes {b} weights are not an estimator precision"
        )),
        (Some(p), None) if !p.is_quantized() => Ok(p),
        (p, None) => Err(format!(
            "precision `{}` is a GGUF quantization, not a torch row's",
            p.map_or("null", |p| p.as_str())
        )),
    }
}

/// Estimates one row (`constants` where their architecture matches the row's model).
pub fn validate_row(
    r: &PeerRow,
    constants: Option<&Constants>,
    emulate: Option<&emulated::Options>,
) -> Result<Validated> {
    let metric = r.metric;
    let rows = match (r.mode, r.pipeline()) {
        _ if metric == Metric::VllmAvailableKv => serving::estimate_row(r),
        (Mode::Generate, Some(m)) => generate::estimate_row(r, m, constants),
        (_, Some(m)) => Err((
            m.to_string(),
            format!(
                "{} of a diffusion pipeline is not an estimator mode",
                r.mode
            ),
        )),
        _ => estimate_row(r, constants).map(|(m, b)| {
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
    constants: Option<&Constants>,
) -> std::result::Result<(String, Breakdown), (String, String)> {
    let (metric, mode) = (r.metric, r.mode);
    let mref = model_ref(r).map_err(|e| (r.model.clone(), e))?;
    let name = match &mref {
        ModelRef::Config(c) => c.name.clone(),
        ModelRef::Params(p) => format!("{p} params"),
    };
    let fail = |why: String| (name.clone(), why);
    let precision = precision(r).map_err(fail)?;
    let (optimizer, optimizer_impl) = r.optimizer.split().map_err(fail)?;
    let recompute = r.recompute.unwrap_or(Recompute::None);
    // The row's software: what its transformers holds (FSDP's held input gradients under
    // transformers 4.x, `estimate::train`) and how its peft keeps adapters. torch-1.10's rows
    // keep the default stack (it runs the published programs only). The reserve stays the
    // default stack's fit: the torch-2.2 fit (three smaller models) puts the fms rows' NVML
    // figures 12% to 56% over.
    let stack = r
        .stack
        .filter(|s| s.without_probe().is_none())
        .unwrap_or_default();
    let q = Query {
        mode,
        precision,
        batch: r.batch.unwrap_or(1),
        context: r.context.unwrap_or(1) + if mode == Mode::Infer { r.new_tokens } else { 0 },
        optimizer,
        checkpointing: if recompute == Recompute::None {
            crate::vocab::Checkpointing::None
        } else {
            crate::vocab::Checkpointing::Layer
        },
        sharding: r.sharding.unwrap_or(estimate::Sharding::Ddp),
        gpus: r.gpus,
        trainable: r.trainable.unwrap_or(crate::vocab::Trainable::Full),
        lora_targets: r.lora_targets.unwrap_or_default(),
        lora_dropout: r.lora_dropout > 0.0,
        peft_f32_adapters: stack.peft_f32_adapters(),
        attention: r.attention,
        runtime: Runtime::Torch,
        backend: Backend::Cuda,
        optimizer_impl,
        stack,
        reserve_stack: Some(crate::vocab::Stack::Default),
        compute_capability: r.gpu.as_deref().and_then(crate::gpu::compute_capability),
        ..Query::default()
    };
    let over = |o: estimate::Overflow| fail(o.to_string());
    let b = match (metric, &mref) {
        (Metric::ModelStates, ModelRef::Params(p)) => {
            model_states(*p, *p, 0, None, &q).map_err(over)?
        }
        (Metric::LayerActivations, ModelRef::Config(c)) => {
            let (Some(b), Some(s)) = (r.batch, r.context) else {
                return Err(fail("batch or sequence length not stated".into()));
            };
            Breakdown {
                activations: layer_activations(
                    &c.config,
                    b,
                    s,
                    precision.act_bytes(),
                    r.attention == Attention::Eager,
                    recompute,
                    r.tensor_parallel,
                    r.sequence_parallel,
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
            let mut e = match (mode, r.batch, r.context) {
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
            if r.cuda.is_some_and(|v| v < row::CudaVersion(11, 7)) {
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
            validate_row(r, constants, emulate)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
