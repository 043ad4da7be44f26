//! The caching allocator's reserve: what PyTorch's CUDA caching allocator holds beyond the
//! bytes its tensors occupy (peak reserved − peak allocated: segment rounding, blocks split and
//! cached for later requests, fragmentation). It is not analytic: it depends on the order and
//! sizes of the program's allocations, so `fit` measures it, as a ratio of the peak allocated,
//! per class of run ([`ReserveClass`]), across every model of the CSVs (docs/src/concepts/memory.md,
//! "allocated, reserved and NVML used").
//!
//! The ratio `estimate` applies is the class's largest (an upper envelope: under-predicting
//! the reserve is what runs users out of memory), and its leave-one-model-out check says how
//! far that envelope lands from a model the fit never saw.
use crate::record::{Phase, Record, Status};
use crate::vocab::{Backend, Checkpointing, Mode, Trainable};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The runs one reserve ratio describes: a model loaded (the `load` phase, whatever runs
/// next), or a whole run (`total`, each training step's `step_total`) by mode, activation
/// checkpointing (recomputation frees and reallocates every layer's activations in the
/// backward) and whether only LoRA adapters train (the base's gradients and optimizer state
/// never enter the pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReserveClass {
    pub load: bool,
    pub mode: Mode,
    pub checkpointing: Checkpointing,
    pub lora: bool,
}

impl ReserveClass {
    pub fn new(mode: Mode, checkpointing: Checkpointing, trainable: Trainable) -> ReserveClass {
        let train = mode == Mode::Train;
        ReserveClass {
            load: false,
            mode,
            checkpointing: if train {
                checkpointing
            } else {
                Checkpointing::None
            },
            lora: train && matches!(trainable, Trainable::Lora(_)),
        }
    }

    /// A model's weights loaded, nothing run.
    pub const LOAD: ReserveClass = ReserveClass {
        load: true,
        mode: Mode::Infer,
        checkpointing: Checkpointing::None,
        lora: false,
    };

    /// "train, checkpointing layer, LoRA"; "load".
    pub fn label(&self) -> String {
        if self.load {
            return "load".into();
        }
        let mut s = self.mode.to_string();
        if self.mode == Mode::Train {
            s += &format!(", checkpointing {}", self.checkpointing);
            if self.lora {
                s += ", LoRA";
            }
        }
        s
    }
}

/// One class's fitted reserve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReserveFit {
    pub class: ReserveClass,
    /// Points measured (each point's largest ratio over its steps).
    pub points: usize,
    pub models: Vec<String>,
    /// Reserve ÷ allocated at the peak: the median and the largest over the points.
    pub ratio_median: f64,
    pub ratio_max: f64,
    /// Leave one model out: each model's reserved peaks predicted as allocated × (1 + the
    /// largest ratio of the other models); the smallest and largest relative error
    /// (predicted − measured) / measured. None with a single model.
    pub heldout_min: Option<f64>,
    pub heldout_max: Option<f64>,
}

/// The ratio a class's points give: (model, peak allocated, peak reserved) per point.
type Point = (String, u64, u64);

fn ratio(p: &Point) -> f64 {
    (p.2.saturating_sub(p.1)) as f64 / p.1 as f64
}

/// The per-point peaks of `records` that describe the caching allocator: CUDA rows of a
/// torch meter (measured or emulated) with both peaks, at the `load` phase and at the point's
/// whole-run phase (`total` for inference, each step's `step_total` for training), each point
/// at its step with the largest ratio.
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
                r.checkpointing.unwrap_or(Checkpointing::None),
                r.trainable.unwrap_or(Trainable::Full),
            ),
            _ => continue,
        };
        if r.backend != Backend::Cuda
            || r.meter.runtime() != crate::vocab::Runtime::Torch
            || r.status != Some(Status::Ok)
        {
            continue;
        }
        let (Some(a), Some(res)) = (r.peak_allocated, r.peak_reserved) else {
            continue;
        };
        if a == 0 {
            continue;
        }
        let p = (r.model_id.clone(), a, res);
        let slot = out.entry(class).or_default();
        match slot.get(&r.point_id) {
            Some(old) if ratio(old) >= ratio(&p) => {}
            _ => {
                slot.insert(r.point_id.clone(), p);
            }
        }
    }
    out
}

fn largest_ratio<'a>(ps: impl Iterator<Item = &'a Point>) -> f64 {
    ps.map(ratio).fold(0.0, f64::max)
}

/// The reserve of every class the records cover.
pub fn fit(records: &[Record]) -> Vec<ReserveFit> {
    points(records)
        .into_iter()
        .map(|(class, ps)| {
            let ps: Vec<Point> = ps.into_values().collect();
            let mut models: Vec<String> = ps.iter().map(|p| p.0.clone()).collect();
            models.sort();
            models.dedup();
            let mut ratios: Vec<f64> = ps.iter().map(ratio).collect();
            ratios.sort_by(f64::total_cmp);
            let errors: Vec<f64> = if models.len() < 2 {
                Vec::new()
            } else {
                models
                    .iter()
                    .flat_map(|m| {
                        let rho = largest_ratio(ps.iter().filter(|p| &p.0 != m));
                        ps.iter()
                            .filter(move |p| &p.0 == m)
                            .map(move |p| (p.1 as f64 * (1.0 + rho) - p.2 as f64) / p.2 as f64)
                    })
                    .collect()
            };
            ReserveFit {
                class,
                points: ps.len(),
                models,
                ratio_median: ratios[ratios.len() / 2],
                ratio_max: *ratios.last().expect("a class has points"),
                heldout_min: errors.iter().copied().reduce(f64::min),
                heldout_max: errors.iter().copied().reduce(f64::max),
            }
        })
        .collect()
}

/// The ratios reserve ÷ allocated that a class's fit gives: the largest (what `estimate`
/// applies: under-predicting the reserve runs users out of memory), the median (the low end of
/// the range the fit saw, which makes a verdict "borderline"), and where they come from.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    pub max: f64,
    pub median: f64,
    pub how: String,
}

/// The reserve ratios for a run of `class`: the class's, or, for a class the fit did not see,
/// those of the class with the largest ratio (the envelope of what was measured, named in the
/// note). None without fits.
pub fn reserve_ratio(fits: &[ReserveFit], class: ReserveClass) -> Option<Ratio> {
    match fits.iter().find(|f| f.class == class) {
        Some(f) => Some(Ratio {
            max: f.ratio_max,
            median: f.ratio_median,
            how: format!(
                "the largest reserve/allocated ratio of {} ({:.1}% over {} points of {} models; \
                 median {:.1}%)",
                class.label(),
                100.0 * f.ratio_max,
                f.points,
                f.models.len(),
                100.0 * f.ratio_median
            ),
        }),
        None => {
            let f = fits
                .iter()
                .max_by(|a, b| a.ratio_max.total_cmp(&b.ratio_max))?;
            Some(Ratio {
                max: f.ratio_max,
                median: f.ratio_median,
                how: format!(
                    "no {} points: the largest ratio of any class ({}, {:.1}%; median {:.1}%)",
                    class.label(),
                    f.class.label(),
                    100.0 * f.ratio_max,
                    100.0 * f.ratio_median
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(model: &str, point: &str, mode: Mode, phase: Phase, a: u64, res: u64) -> Record {
        Record {
            model_id: model.into(),
            point_id: point.into(),
            mode,
            phase: Some(phase),
            backend: Backend::Cuda,
            meter: crate::vocab::MeterKind::TorchEmulated,
            status: Some(Status::Ok),
            peak_allocated: Some(a),
            peak_reserved: Some(res),
            trainable: Some(Trainable::Full),
            checkpointing: Some(Checkpointing::None),
            ..Record::default()
        }
    }

    #[test]
    fn each_point_counts_once_at_its_worst_step_and_the_held_out_model_is_predicted() {
        let rs = vec![
            rec("a", "a/1", Mode::Train, Phase::StepTotal, 1000, 1100),
            rec("a", "a/1", Mode::Train, Phase::StepTotal, 1000, 1300),
            rec("a", "a/1", Mode::Train, Phase::Backward, 1000, 9000),
            rec("b", "b/1", Mode::Train, Phase::StepTotal, 2000, 2200),
            rec("b", "b/1", Mode::Infer, Phase::Total, 2000, 2100),
        ];
        let f = fit(&rs);
        let train = f.iter().find(|f| f.class.mode == Mode::Train).unwrap();
        assert_eq!(train.points, 2);
        assert_eq!(train.ratio_max, 0.3);
        assert_eq!(train.ratio_median, 0.3);
        // a predicted with b's 10%: 1100 against 1300; b with a's 30%: 2600 against 2200.
        assert_eq!(train.heldout_min, Some((1100.0 - 1300.0) / 1300.0));
        assert_eq!(train.heldout_max, Some((2600.0 - 2200.0) / 2200.0));
        let infer = ReserveClass::new(Mode::Infer, Checkpointing::Layer, Trainable::Full);
        assert_eq!(reserve_ratio(&f, infer).unwrap().max, 0.05);
        let unseen = ReserveClass::new(Mode::Train, Checkpointing::Layer, Trainable::Full);
        let r = reserve_ratio(&f, unseen).unwrap();
        assert_eq!((r.max, r.median), (0.3, 0.3));
    }
}
