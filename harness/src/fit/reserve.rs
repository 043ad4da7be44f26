//! The caching allocator's reserve: what PyTorch's CUDA caching allocator holds beyond the
//! bytes its tensors occupy (peak reserved − peak allocated: segment rounding, blocks split and
//! cached for later requests, fragmentation). It is not analytic: it depends on the order and
//! sizes of the program's allocations, so `fit` measures it per class of run
//! ([`ReserveClass`]), across every model of the CSVs (docs/src/concepts/memory.md,
//! "allocated, reserved and NVML used"; docs/src/concepts/fit-and-estimate.md, "The
//! allocator's reserve").
//!
//! The mechanism sets the model's shape. The pool's slack comes from blocks that a phase frees
//! and the next cannot reuse whole: the per-layer transients (∝ `act`), the logits and their
//! f32 loss copies (∝ `logits`), eager attention's scores (∝ `attn`), a growing KV cache
//! (∝ `kv`), the weights' segments (∝ `weight`: rounding and the blocks a load or a mixed
//! precision cast leaves) and a constant of small-pool segments. A preallocated KV cache is
//! allocated once, each layer's K and V in their own segments, and leaves no slack: its
//! inference classes ([`INFER_TERMS`]) have no KV term. A growing cache concatenates each
//! layer's K and V into a new block every step and frees the old one, so inference with it is a
//! class of its own, with every term of [`RESERVE_TERMS`]. So a class's reserve is a non-negative linear model of those terms, computed by the same functions as
//! every fitted term ([`crate::terms`]), fitted by NNLS on every point of the class. No term is
//! a maximum over the class: each coefficient is fitted, and the fit states its
//! leave-one-model-out error, which `estimate` turns into the range of its verdicts.
use crate::record::{Phase, Record, Status};
use crate::terms::{Term, Terms};
use crate::vocab::{Attention, Backend, Checkpointing, KvKind, Mode, Precision, Trainable};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The terms a reserve is linear in (see the module's doc for the mechanism of each).
pub const RESERVE_TERMS: [Term; 6] = [
    Term::Const,
    Term::Weight,
    Term::Kv,
    Term::Act,
    Term::Logits,
    Term::Attn,
];

/// The terms of an inference run: [`RESERVE_TERMS`] without the KV cache, which a preallocated
/// cache fills exactly (a KV coefficient fitted on grouped-query models overcharged multi-head
/// ones: docs/src/concepts/fit-and-estimate.md, "The allocator's reserve").
pub const INFER_TERMS: [Term; 5] = [
    Term::Const,
    Term::Weight,
    Term::Act,
    Term::Logits,
    Term::Attn,
];

/// The terms of a loaded model: only its weights (and the constant) are in the pool.
const LOAD_TERMS: [Term; 2] = [Term::Const, Term::Weight];

/// The runs one reserve model describes: a model loaded (the `load` phase, whatever runs
/// next), or a whole run (`total`, each training step's `step_total`) by mode, attention
/// (eager materializes the scores; flash and SDPA do not), activation checkpointing
/// (recomputation frees and reallocates every layer's activations in the backward), whether
/// only LoRA adapters train (the base's gradients and optimizer state never enter the pool),
/// mixed precision (f32 master weights and their 16-bit copies), and for inference whether the
/// KV cache grows (each step's concatenation frees the step before's blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReserveClass {
    pub load: bool,
    pub mode: Mode,
    pub attention: Attention,
    pub checkpointing: Checkpointing,
    pub lora: bool,
    pub mixed: bool,
    /// Inference with a growing KV cache (absent from fits written before it: preallocated).
    #[serde(default)]
    pub growing: bool,
}

impl ReserveClass {
    pub fn new(
        mode: Mode,
        attention: Attention,
        checkpointing: Checkpointing,
        trainable: Trainable,
        precision: Precision,
        kv_cache: KvKind,
    ) -> ReserveClass {
        let train = mode == Mode::Train;
        ReserveClass {
            load: false,
            mode,
            // What the pool sees: scores materialized or not.
            attention: match attention {
                Attention::Eager | Attention::Sliced => Attention::Eager,
                Attention::Flash | Attention::Sdpa => Attention::Sdpa,
            },
            checkpointing: if train {
                checkpointing
            } else {
                Checkpointing::None
            },
            lora: train && matches!(trainable, Trainable::Lora(_)),
            mixed: train && precision.is_mixed(),
            growing: mode == Mode::Infer && kv_cache == KvKind::Growing,
        }
    }

    /// A model's weights loaded, nothing run.
    pub const LOAD: ReserveClass = ReserveClass {
        load: true,
        mode: Mode::Infer,
        attention: Attention::Eager,
        checkpointing: Checkpointing::None,
        lora: false,
        mixed: false,
        growing: false,
    };

    /// "train sdpa, checkpointing layer, LoRA, mixed"; "infer eager"; "infer sdpa, growing
    /// cache"; "load".
    pub fn label(&self) -> String {
        if self.load {
            return "load".into();
        }
        let mut s = format!("{} {}", self.mode, self.attention);
        if self.mode == Mode::Train {
            s += &format!(", checkpointing {}", self.checkpointing);
            if self.lora {
                s += ", LoRA";
            }
            if self.mixed {
                s += ", mixed";
            }
        }
        if self.growing {
            s += ", growing cache";
        }
        s
    }

    fn terms(&self) -> &'static [Term] {
        if self.load {
            &LOAD_TERMS
        } else if self.mode == Mode::Infer && !self.growing {
            &INFER_TERMS
        } else {
            &RESERVE_TERMS
        }
    }

    /// The class's terms of a row or query: the others are zero.
    fn design(&self, t: &Terms) -> Vec<f64> {
        self.terms().iter().map(|x| t[x.index()]).collect()
    }
}

/// One class's fitted reserve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReserveFit {
    pub class: ReserveClass,
    /// Points measured (each point at its step with the largest reserve).
    pub points: usize,
    pub models: Vec<String>,
    /// Reserve bytes = Σ coefficient × term, by term name ([`RESERVE_TERMS`]; a loaded
    /// model's: the constant and the weights), NNLS over every point of the class.
    pub coefficients: BTreeMap<String, f64>,
    /// How the error range below was taken: "held out by model" (each model's points predicted
    /// by the fit of the others), or "in sample" (a class of one model).
    pub error_by: String,
    /// Relative error of the predicted peak reserved, (predicted − measured) / measured: the
    /// smallest, the median of its absolute value, and the largest.
    pub error_min: f64,
    pub error_median: f64,
    pub error_max: f64,
}

/// A class's points: (model, peak allocated, peak reserved, terms).
#[derive(Clone)]
struct Point {
    model: String,
    allocated: u64,
    reserved: u64,
    terms: Terms,
}

impl Point {
    fn reserve(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// The per-point peaks of `records` that describe the caching allocator: CUDA rows of a
/// torch meter (measured or emulated) with both peaks and features, at the `load` phase and at
/// the point's whole-run phase (`total` for inference, each step's `step_total` for training),
/// each point at its step with the largest reserve.
fn points(records: &[Record]) -> BTreeMap<ReserveClass, BTreeMap<String, Point>> {
    let mut out: BTreeMap<ReserveClass, BTreeMap<String, Point>> = BTreeMap::new();
    for r in records {
        let whole = match r.mode {
            Mode::Train => Phase::StepTotal,
            _ => Phase::Total,
        };
        let class = match r.phase {
            Some(Phase::Load) => ReserveClass::LOAD,
            Some(p) if p == whole => ReserveClass::new(
                r.mode,
                r.attention,
                r.checkpointing.unwrap_or(Checkpointing::None),
                r.trainable.unwrap_or(Trainable::Full),
                r.precision,
                r.kv_cache.unwrap_or(KvKind::Preallocated),
            ),
            _ => continue,
        };
        if r.backend != Backend::Cuda
            || r.meter.runtime() != crate::vocab::Runtime::Torch
            || r.status != Some(Status::Ok)
        {
            continue;
        }
        // A load row carries only its weights' feature, all its class reads.
        let terms = if class.load {
            r.feature_weight_bytes.map(|w| {
                let mut t = [0.0; crate::terms::N_TERMS];
                t[Term::Const.index()] = 1.0;
                t[Term::Weight.index()] = w as f64;
                t
            })
        } else {
            crate::terms::record_terms(r)
        };
        let (Some(a), Some(res), Some(terms)) = (r.peak_allocated, r.peak_reserved, terms) else {
            continue;
        };
        if a == 0 {
            continue;
        }
        let p = Point {
            model: r.model_id.clone(),
            allocated: a,
            reserved: res,
            terms,
        };
        let slot = out.entry(class).or_default();
        match slot.get(&r.point_id) {
            Some(old) if old.reserve() >= p.reserve() => {}
            _ => {
                slot.insert(r.point_id.clone(), p);
            }
        }
    }
    out
}

/// The NNLS coefficients of `class`'s terms over `ps`.
fn solve(class: &ReserveClass, ps: &[&Point]) -> Vec<f64> {
    let n = class.terms().len();
    let a = DMatrix::from_fn(ps.len(), n, |i, j| class.design(&ps[i].terms)[j]);
    let b = DVector::from_iterator(ps.len(), ps.iter().map(|p| p.reserve() as f64));
    super::nnls::nnls(&a, &b).iter().copied().collect()
}

fn dot(c: &[f64], x: &[f64]) -> f64 {
    c.iter().zip(x).map(|(c, x)| c * x).sum::<f64>().max(0.0)
}

/// (predicted − measured) / measured peak reserved of `p` under coefficients `c`.
fn error(class: &ReserveClass, c: &[f64], p: &Point) -> f64 {
    let predicted = p.allocated as f64 + dot(c, &class.design(&p.terms));
    (predicted - p.reserved as f64) / p.reserved as f64
}

/// The reserve of every class the records cover.
pub fn fit(records: &[Record]) -> Vec<ReserveFit> {
    fit_with_errors(records)
        .into_iter()
        .map(|(f, _)| f)
        .collect()
}

/// [`fit`], with each class's per-point relative errors (held out by model, or in sample).
pub fn fit_with_errors(records: &[Record]) -> Vec<(ReserveFit, Vec<f64>)> {
    points(records)
        .into_iter()
        .map(|(class, ps)| {
            let ps: Vec<Point> = ps.into_values().collect();
            let all: Vec<&Point> = ps.iter().collect();
            let mut models: Vec<String> = ps.iter().map(|p| p.model.clone()).collect();
            models.sort();
            models.dedup();
            let c = solve(&class, &all);
            let (error_by, errors): (&str, Vec<f64>) = if models.len() < 2 {
                (
                    "in sample",
                    ps.iter().map(|p| error(&class, &c, p)).collect(),
                )
            } else {
                let errors = models
                    .iter()
                    .flat_map(|m| {
                        let train: Vec<&Point> = ps.iter().filter(|p| &p.model != m).collect();
                        let c = solve(&class, &train);
                        ps.iter()
                            .filter(|p| &p.model == m)
                            .map(|p| error(&class, &c, p))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                ("held out by model", errors)
            };
            let fit = ReserveFit {
                class,
                points: ps.len(),
                models,
                coefficients: class
                    .terms()
                    .iter()
                    .zip(&c)
                    .map(|(t, c)| (t.name().to_string(), *c))
                    .collect(),
                error_by: error_by.into(),
                error_min: errors.iter().copied().fold(0.0, f64::min),
                error_median: median_abs(&errors),
                error_max: errors.iter().copied().fold(0.0, f64::max),
            };
            (fit, errors)
        })
        .collect()
}

/// The median of the absolute values of `xs` (0 for none).
pub fn median_abs(xs: &[f64]) -> f64 {
    let mut abs: Vec<f64> = xs.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    match abs.len() {
        0 => 0.0,
        n if n % 2 == 1 => abs[n / 2],
        n => (abs[n / 2 - 1] + abs[n / 2]) / 2.0,
    }
}

/// The reserve `estimate` applies to one run: the fitted figure and the range its errors
/// give, in bytes (reals; the caller rounds up), and where they come from.
#[derive(Clone, Debug, PartialEq)]
pub struct Reserve {
    pub central: f64,
    /// The reserve if the prediction of the peak reserved is as high as the fit's largest
    /// error (over-predicted): the low end of the range.
    pub low: f64,
    /// The reserve if it is as low as the fit's smallest error (under-predicted): the high
    /// end, what a conservative verdict judges.
    pub high: f64,
    pub how: String,
}

impl ReserveFit {
    /// The reserve bytes this class's model predicts for terms `t` (never negative).
    pub fn predict(&self, t: &Terms) -> f64 {
        let c: Vec<f64> = self
            .class
            .terms()
            .iter()
            .map(|x| self.coefficients.get(x.name()).copied().unwrap_or(0.0))
            .collect();
        dot(&c, &self.class.design(t))
    }
}

/// The reserve of a run of `class` with terms `t` and `allocated` bytes at its peak: the
/// class's fit; for a class the fit did not see, the fit of the same mode (else of any class)
/// that predicts the most for this run, named in the note. None without fits.
pub fn reserve_for(
    fits: &[ReserveFit],
    class: ReserveClass,
    t: &Terms,
    allocated: f64,
) -> Option<Reserve> {
    let (f, unseen) = match fits.iter().find(|f| f.class == class) {
        Some(f) => (f, false),
        None => {
            let same_mode: Vec<&ReserveFit> = fits
                .iter()
                .filter(|f| f.class.load == class.load && f.class.mode == class.mode)
                .collect();
            let pool: Vec<&ReserveFit> = if same_mode.is_empty() {
                fits.iter().collect()
            } else {
                same_mode
            };
            let f = pool
                .into_iter()
                .max_by(|a, b| a.predict(t).total_cmp(&b.predict(t)))?;
            (f, true)
        }
    };
    let central = f.predict(t);
    let reserved = allocated + central;
    let high = reserved / (1.0 + f.error_min) - allocated;
    let low = (reserved / (1.0 + f.error_max) - allocated).max(0.0);
    let fitted = format!(
        "{} ({} points of {} models; {} {:+.1}% .. {:+.1}% on reserved, median |{:.1}%|)",
        f.class.label(),
        f.points,
        f.models.len(),
        f.error_by,
        100.0 * f.error_min,
        100.0 * f.error_max,
        100.0 * f.error_median
    );
    Some(Reserve {
        central,
        low: low.min(central),
        high: high.max(central),
        how: if unseen {
            format!(
                "no {} points: the class predicting the most for this run, {fitted}",
                class.label()
            )
        } else {
            format!("the reserve model of {fitted}")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A training row of model `m` whose reserve is exactly 2 MiB + 0.25 × act (act = its
    /// `feature_act_bytes`), at its `step_total`.
    fn rec(m: &str, batch: u64, act: u64, allocated: u64, reserve: u64) -> Record {
        Record {
            model_id: m.into(),
            point_id: format!("{m}/b{batch}"),
            mode: Mode::Train,
            phase: Some(Phase::StepTotal),
            backend: Backend::Cuda,
            meter: crate::vocab::MeterKind::TorchEmulated,
            status: Some(Status::Ok),
            batch,
            context: 16,
            peak_allocated: Some(allocated),
            peak_reserved: Some(allocated + reserve),
            trainable: Some(Trainable::Full),
            checkpointing: Some(Checkpointing::None),
            attention: Attention::Sdpa,
            feature_weight_bytes: Some(0),
            feature_kv_bytes: Some(0),
            feature_act_bytes: Some(act),
            feature_logits_bytes: Some(0),
            feature_optimizer_bytes: Some(0),
            ..Record::default()
        }
    }

    #[test]
    fn a_linear_reserve_is_recovered_and_predicts_the_held_out_model_exactly() {
        let mut rs = Vec::new();
        for (i, m) in ["a", "b", "c"].iter().enumerate() {
            for b in [1u64, 4] {
                let act = (i as u64 + 1) * b * (64 << 20);
                rs.push(rec(m, b, act, 10 * act, (2 << 20) + act / 4));
            }
        }
        // A worse step of the same point counts; a smaller one does not replace it.
        let mut smaller = rs[0].clone();
        smaller.peak_reserved = Some(smaller.peak_allocated.unwrap());
        rs.push(smaller);
        let f = fit(&rs);
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!((f.points, f.models.len()), (6, 3));
        assert_eq!(f.error_by, "held out by model");
        assert!((f.coefficients["act"] - 0.25).abs() < 1e-9, "{f:?}");
        assert!(
            (f.coefficients["const"] - (2 << 20) as f64).abs() < 1.0,
            "{f:?}"
        );
        assert!(
            f.error_min.abs() < 1e-9 && f.error_max.abs() < 1e-9,
            "{f:?}"
        );
        // A run of the class: the model's figure, with no range (no error).
        let mut t = [0.0; crate::terms::N_TERMS];
        t[Term::Const.index()] = 1.0;
        t[Term::Act.index()] = 1e9;
        let class = ReserveClass::new(
            Mode::Train,
            Attention::Flash,
            Checkpointing::None,
            Trainable::Full,
            Precision::Bf16,
            KvKind::Preallocated,
        );
        assert_eq!(class, f.class, "flash and SDPA are one class");
        let r = reserve_for(std::slice::from_ref(f), class, &t, 1e10).unwrap();
        assert!((r.central - (2.5e8 + (2 << 20) as f64)).abs() < 1.0);
        assert!((r.high - r.central).abs() < 1e-3 && (r.low - r.central).abs() < 1e-3);
        // An unseen class of the same mode answers with it, and says so.
        let ck = ReserveClass::new(
            Mode::Train,
            Attention::Sdpa,
            Checkpointing::Layer,
            Trainable::Full,
            Precision::Bf16,
            KvKind::Preallocated,
        );
        let r = reserve_for(std::slice::from_ref(f), ck, &t, 1e10).unwrap();
        assert!(
            r.how
                .starts_with("no train sdpa, checkpointing layer points"),
            "{}",
            r.how
        );
    }

    #[test]
    fn the_range_is_the_error_on_reserved() {
        let f = ReserveFit {
            class: ReserveClass::LOAD,
            points: 2,
            models: vec!["a".into(), "b".into()],
            coefficients: [("const".to_string(), 100.0), ("weight".to_string(), 0.0)]
                .into_iter()
                .collect(),
            error_by: "held out by model".into(),
            error_min: -0.5,
            error_median: 0.1,
            error_max: 0.25,
        };
        let t = [0.0; crate::terms::N_TERMS];
        let t = {
            let mut t = t;
            t[Term::Const.index()] = 1.0;
            t
        };
        // Reserved 1,000 + 100: under-predicted by half at worst (2,200 reserved), over by a
        // quarter (880, under the allocated bytes: no reserve).
        let r = reserve_for(&[f], ReserveClass::LOAD, &t, 1000.0).unwrap();
        assert_eq!((r.central, r.high, r.low), (100.0, 1200.0, 0.0));
    }
}
