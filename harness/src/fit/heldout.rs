//! Held-out error of a fit: k-fold over points ([`kfold`]), leave one context out
//! ([`leave_one_context_out`]), the choice between the linear and the max model ([`select`]),
//! and training steps predicted as the envelope of their phases ([`envelope_kfold`]).
use super::groups::Sample;
use super::solve::{fit_linear, fit_max, Fitter, Model};
use crate::record::Phase;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One held-out prediction.
#[derive(Clone, Debug)]
pub struct Heldout {
    pub group: String,
    pub row: String,
    pub measured: f64,
    pub predicted: f64,
}

impl Heldout {
    /// Signed relative error (predicted − measured) / measured.
    pub fn rel(&self) -> f64 {
        (self.predicted - self.measured) / self.measured
    }
}

/// Median, p95 and worst absolute relative error of a set of held-out predictions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrStats {
    pub n: usize,
    pub median: f64,
    pub p95: f64,
    pub worst: f64,
    pub worst_row: String,
}

impl ErrStats {
    pub fn of(h: &[Heldout]) -> Option<ErrStats> {
        if h.is_empty() {
            return None;
        }
        let mut e: Vec<f64> = h.iter().map(|x| x.rel().abs()).collect();
        e.sort_by(f64::total_cmp);
        let q = |p: f64| e[((p * (e.len() - 1) as f64).round() as usize).min(e.len() - 1)];
        let w = h
            .iter()
            .max_by(|a, b| a.rel().abs().total_cmp(&b.rel().abs()))
            .expect("non-empty");
        Some(ErrStats {
            n: e.len(),
            median: q(0.5),
            p95: q(0.95),
            worst: w.rel().abs(),
            worst_row: format!(
                "{} [{}] measured {} predicted {:.0} ({:+.2}%)",
                w.row,
                w.group,
                w.measured,
                w.predicted,
                100.0 * w.rel()
            ),
        })
    }

    pub fn line(&self) -> String {
        format!(
            "median {:.3}%  p95 {:.3}%  worst {:.3}% ({} rows; worst: {})",
            100.0 * self.median,
            100.0 * self.p95,
            100.0 * self.worst,
            self.n,
            self.worst_row
        )
    }
}

/// Fits on the samples `train` says true for and predicts the others.
fn holdout(
    group: &str,
    samples: &[Sample],
    fitter: Fitter,
    train: impl Fn(&Sample) -> bool,
) -> Vec<Heldout> {
    let (tr, te): (Vec<Sample>, Vec<Sample>) = samples.iter().cloned().partition(|s| train(s));
    if tr.is_empty() || te.is_empty() {
        return Vec::new();
    }
    let m = fitter(&tr);
    te.iter()
        .map(|s| Heldout {
            group: group.to_string(),
            row: s.row.clone(),
            measured: s.y,
            predicted: m.predict(&s.x),
        })
        .collect()
}

/// FNV-1a: a stable, seedless hash that spreads grid points over folds (sorted ids would put
/// one context in each fold and make k-fold a leave-one-context-out in disguise).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fold of each point of `samples` (spread by hash) and the number of folds, at most
/// `k`; None when fewer than two folds are possible.
fn point_folds(samples: &[Sample], k: usize) -> Option<(BTreeMap<&str, usize>, usize)> {
    let mut points: Vec<&str> = samples.iter().map(|s| s.point.as_str()).collect();
    points.sort_by_key(|p| (fnv1a(p), *p));
    points.dedup();
    let k = k.min(points.len());
    (k >= 2).then(|| {
        let folds = points
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, i % k))
            .collect();
        (folds, k)
    })
}

/// k-fold over points: the rows of one point are always held out together.
pub fn kfold(group: &str, samples: &[Sample], k: usize, fitter: Fitter) -> Vec<Heldout> {
    let Some((folds, k)) = point_folds(samples, k) else {
        return Vec::new();
    };
    let fold = |s: &Sample| folds[s.point.as_str()];
    (0..k)
        .flat_map(|f| holdout(group, samples, fitter, |s| fold(s) != f))
        .collect()
}

/// Leave one context out: fit on every other context, predict this one (extrapolation at the
/// ends of the grid). Needs at least three contexts, so that two remain to tell the terms
/// linear in s from those quadratic in s.
pub fn leave_one_context_out(group: &str, samples: &[Sample], fitter: Fitter) -> Vec<Heldout> {
    let mut ctx: Vec<u64> = samples.iter().map(|s| s.context).collect();
    ctx.sort();
    ctx.dedup();
    if ctx.len() < 3 {
        return Vec::new();
    }
    ctx.iter()
        .flat_map(|&c| holdout(group, samples, fitter, |s| s.context != c))
        .collect()
}

/// The error score models are compared by: median + p95 of the held-out error.
fn score(h: &[Heldout]) -> f64 {
    ErrStats::of(h)
        .map(|e| e.median + e.p95)
        .unwrap_or(f64::INFINITY)
}

/// Fits a group both ways and keeps the one with the smaller k-fold error (the max model only
/// when it measurably wins). Returns the model and its k-fold and leave-one-context-out errors.
pub fn select(label: &str, samples: &[Sample], k: usize) -> (Model, Vec<Heldout>, Vec<Heldout>) {
    let lin = kfold(label, samples, k, fit_linear);
    let max = kfold(label, samples, k, fit_max);
    let (fitter, hk): (Fitter, _) = if score(&max) < score(&lin) {
        (fit_max, max)
    } else {
        (fit_linear, lin)
    };
    (
        fitter(samples),
        hk,
        leave_one_context_out(label, samples, fitter),
    )
}

/// The phases a training step's peak is the envelope of.
pub const STEP_PHASES: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

/// k-fold by point over the `step_total` samples of a training group: each fold refits the
/// forward, backward and optimizer groups (`phases`, with the fitter the full fit chose)
/// without the fold's points and predicts each held-out step as the largest of its phases'
/// predictions (the same point and step, each with its own terms).
pub fn envelope_kfold(
    group: &str,
    step: &[Sample],
    phases: &[(&[Sample], Fitter)],
    k: usize,
) -> Vec<Heldout> {
    let Some((folds, k)) = point_folds(step, k) else {
        return Vec::new();
    };
    let fold = |p: &str| folds.get(p).copied();
    let mut out = Vec::new();
    for f in 0..k {
        let models: Vec<(&[Sample], Model)> = phases
            .iter()
            .map(|(samples, fitter)| {
                let train: Vec<Sample> = samples
                    .iter()
                    .filter(|s| fold(&s.point) != Some(f))
                    .cloned()
                    .collect();
                (*samples, fitter(&train))
            })
            .collect();
        for s in step.iter().filter(|s| fold(&s.point) == Some(f)) {
            let predicted = models
                .iter()
                .filter_map(|(samples, m)| {
                    let x = samples
                        .iter()
                        .find(|p| p.point == s.point && p.step == s.step)?;
                    Some(m.predict(&x.x))
                })
                .fold(f64::NEG_INFINITY, f64::max);
            if predicted.is_finite() {
                out.push(Heldout {
                    group: group.to_string(),
                    row: s.row.clone(),
                    measured: s.y,
                    predicted,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::groups::testing::sample;

    #[test]
    fn training_steps_are_the_envelope_of_their_phases() {
        // backward = 1000 + 5·act (activations), optimizer = 1800 + 0·act (update transient):
        // the step is their max, which switches regime inside the grid.
        let (mut bwd, mut opt, mut step) = (Vec::new(), Vec::new(), Vec::new());
        for i in 1..=12u64 {
            let act = 20.0 * i as f64;
            let x = [1.0, 0.0, 0.0, act, 0.0, 0.0, 0.0, 0.0];
            let p = format!("p{i}");
            let (b, o) = (1000.0 + 5.0 * act, 1800.0);
            bwd.push(sample(x, b, &p, 64));
            opt.push(sample(x, o, &p, 64));
            step.push(sample(x, f64::max(b, o), &p, 64));
        }
        let phases: [(&[Sample], Fitter); 2] = [(&bwd, fit_linear), (&opt, fit_linear)];
        let h = envelope_kfold("g", &step, &phases, 4);
        assert_eq!(h.len(), 12);
        let worst = h.iter().map(|x| x.rel().abs()).fold(0.0, f64::max);
        assert!(worst < 1e-9, "worst {worst}");
        // A single linear fit of the steps cannot follow the switch.
        let lin = kfold("g", &step, 4, fit_linear);
        assert!(lin.iter().map(|x| x.rel().abs()).fold(0.0, f64::max) > 0.01);
    }
}
