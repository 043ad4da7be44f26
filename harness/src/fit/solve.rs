//! The models a group is fitted with (ARCHITECTURE.md §9): exact terms enter with coefficient 1
//! and are never fitted; the uncertain terms are solved by non-negative least squares
//! ([`super::nnls`]), admitted while the group's design identifies them and held at their
//! analytic prior otherwise. Two shapes: one linear model on every term ([`fit_linear`]), and
//! the resident terms plus the largest of the transient families ([`fit_max`]).
use super::groups::Sample;
use super::nnls;
use crate::terms::{Term, Terms};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `coef · terms`, plus the largest of the `candidates` (each `cand · terms`) when there are
/// any: a phase's peak is resident bytes plus the largest transient (ARCHITECTURE.md §9).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Coefficient per term name: the resident part (the whole model when linear). The exact
    /// terms ([`Term::EXACT`]) are always here with coefficient 1.
    pub coef: BTreeMap<String, f64>,
    /// Uncertain terms the group's design cannot identify (rank-deficient, or fewer points
    /// than free terms), held at their analytic prior ([`Term::prior`]): term → why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, String>,
    /// Transient families, of which the largest counts (empty: a single linear model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<BTreeMap<String, f64>>,
}

fn dot(coef: &BTreeMap<String, f64>, x: &Terms) -> f64 {
    Term::ALL
        .iter()
        .zip(x)
        .map(|(t, v)| coef.get(t.name()).copied().unwrap_or(0.0) * v)
        .sum()
}

impl Model {
    pub fn predict(&self, x: &Terms) -> f64 {
        dot(&self.coef, x) + self.active(x).map(|c| dot(c, x)).unwrap_or(0.0)
    }

    /// The candidate that is largest at `x`.
    pub fn active(&self, x: &Terms) -> Option<&BTreeMap<String, f64>> {
        self.candidates
            .iter()
            .max_by(|a, b| dot(a, x).total_cmp(&dot(b, x)))
    }

    pub fn kind(&self) -> &'static str {
        if self.candidates.is_empty() {
            "linear"
        } else {
            "max"
        }
    }

    /// The coefficient of one term (0 when absent).
    pub fn get(&self, term: &str) -> f64 {
        self.coef.get(term).copied().unwrap_or(0.0)
    }

    /// Whether `term` was held at its prior rather than fitted.
    pub fn is_held(&self, term: &str) -> bool {
        self.held.contains_key(term)
    }
}

/// Numerical rank of the columns `cols` of `a`, each scaled to unit norm.
pub(crate) fn rank(a: &DMatrix<f64>, cols: &[usize]) -> usize {
    let m = DMatrix::from_fn(a.nrows(), cols.len(), |i, k| {
        let c = a.column(cols[k]);
        a[(i, cols[k])] / c.norm().max(f64::MIN_POSITIVE)
    });
    let sv = m.singular_values();
    let top = sv.iter().copied().fold(0.0, f64::max);
    sv.iter().filter(|&&v| v > 1e-9 * top.max(1e-300)).count()
}

/// NNLS of the uncertain terms: `resident` terms on every row and the terms of
/// `families[assign[i]]` on row i. Exact terms enter with coefficient 1 (subtracted from the
/// target, never fitted). Uncertain columns are admitted in order while they raise the rank
/// and there are more points than admitted terms; the others are held at their prior.
fn solve(samples: &[Sample], resident: &[Term], families: &[&[Term]], assign: &[usize]) -> Model {
    let mut cols: Vec<(Option<usize>, Term)> = resident
        .iter()
        .filter(|t| !t.is_exact())
        .map(|&t| (None, t))
        .collect();
    for (f, fam) in families.iter().enumerate() {
        cols.extend(fam.iter().map(|&t| (Some(f), t)));
    }
    let full = DMatrix::from_fn(samples.len(), cols.len(), |i, k| match cols[k] {
        (None, t) => samples[i].x[t.index()],
        (Some(f), t) if assign[i] == f => samples[i].x[t.index()],
        _ => 0.0,
    });
    let mut points: Vec<&str> = samples.iter().map(|s| s.point.as_str()).collect();
    points.sort();
    points.dedup();
    // Columns that are zero on every row carry no term here (and predict nothing).
    let present: Vec<usize> = (0..cols.len())
        .filter(|&k| full.column(k).iter().any(|v| *v != 0.0))
        .collect();
    let mut keep: Vec<usize> = Vec::new();
    let mut held: Vec<usize> = Vec::new();
    for &k in &present {
        let mut trial = keep.clone();
        trial.push(k);
        if trial.len() < points.len().max(2) && rank(&full, &trial) == trial.len() {
            keep = trial;
        } else {
            held.push(k);
        }
    }
    let prior = samples[0].prior;
    let a = DMatrix::from_fn(samples.len(), keep.len(), |i, k| full[(i, keep[k])]);
    let b = DVector::from_iterator(
        samples.len(),
        samples.iter().enumerate().map(|(i, s)| {
            s.y - Term::EXACT.iter().map(|t| s.x[t.index()]).sum::<f64>()
                - held
                    .iter()
                    .map(|&k| prior[cols[k].1.index()] * full[(i, k)])
                    .sum::<f64>()
        }),
    );
    let sol = nnls::nnls(&a, &b);
    let mut coef: BTreeMap<String, f64> = Term::EXACT
        .iter()
        .map(|t| (t.name().to_string(), 1.0))
        .collect();
    let mut candidates = vec![BTreeMap::new(); families.len()];
    let mut put = |k: usize, v: f64| {
        let (f, t) = cols[k];
        let map = match f {
            None => &mut coef,
            Some(f) => &mut candidates[f],
        };
        map.insert(t.name().to_string(), v);
    };
    for (i, &k) in keep.iter().enumerate() {
        put(k, sol[i]);
    }
    for &k in &held {
        put(k, prior[cols[k].1.index()]);
    }
    let held = held
        .iter()
        .map(|&k| {
            let t = cols[k].1;
            (
                t.name().to_string(),
                format!(
                    "held at analytic prior {}: not identified ({} of {} free terms identifiable from {} points)",
                    prior[t.index()],
                    keep.len(),
                    present.len(),
                    points.len()
                ),
            )
        })
        .collect();
    Model {
        coef,
        held,
        candidates,
    }
}

/// A single linear model on every term.
pub fn fit_linear(samples: &[Sample]) -> Model {
    solve(samples, &Term::ALL, &[], &[])
}

fn sse(m: &Model, samples: &[Sample]) -> f64 {
    samples
        .iter()
        .map(|s| (s.y - m.predict(&s.x)).powi(2))
        .sum()
}

/// Resident terms ([`Term::RESIDENT`]) plus the largest of the transient families
/// ([`Term::FAMILIES`]), fitted by alternating between NNLS for a fixed assignment of rows to
/// families and re-assigning each row to the family that is largest there. Several starts
/// (split by the attention term); the lowest squared error wins.
pub fn fit_max(samples: &[Sample]) -> Model {
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let attn = |i: usize| samples[i].x[Term::Attn.index()];
    order.sort_by(|&i, &j| attn(i).total_cmp(&attn(j)));
    let mut best: Option<(f64, Model)> = None;
    for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let cut = (q * samples.len() as f64) as usize;
        let mut assign = vec![0; samples.len()];
        for &i in &order[..cut] {
            assign[i] = 1;
        }
        let mut m = solve(samples, &Term::RESIDENT, &Term::FAMILIES, &assign);
        for _ in 0..25 {
            let next: Vec<usize> = samples
                .iter()
                .map(|s| {
                    (0..Term::FAMILIES.len())
                        .max_by(|&a, &b| {
                            dot(&m.candidates[a], &s.x).total_cmp(&dot(&m.candidates[b], &s.x))
                        })
                        .expect("families")
                })
                .collect();
            if next == assign {
                break;
            }
            assign = next;
            m = solve(samples, &Term::RESIDENT, &Term::FAMILIES, &assign);
        }
        let e = sse(&m, samples);
        if best.as_ref().is_none_or(|(b, _)| e < *b) {
            best = Some((e, m));
        }
    }
    best.expect("at least one start").1
}

/// Raises the constant until no sample is under-predicted by more than `tolerance` (relative):
/// an upper envelope for `--conservative`.
pub fn make_conservative(m: &mut Model, samples: &[Sample], tolerance: f64) {
    let lift = samples
        .iter()
        .map(|s| (1.0 - tolerance) * s.y - m.predict(&s.x))
        .fold(0.0, f64::max);
    *m.coef.entry(Term::Const.name().into()).or_insert(0.0) += lift;
}

/// Coefficient of determination of `m` on `samples`.
pub fn r2(m: &Model, samples: &[Sample]) -> f64 {
    let mean = samples.iter().map(|s| s.y).sum::<f64>() / samples.len() as f64;
    let ss_tot: f64 = samples.iter().map(|s| (s.y - mean).powi(2)).sum();
    let ss_res: f64 = samples
        .iter()
        .map(|s| (s.y - m.predict(&s.x)).powi(2))
        .sum();
    if ss_tot == 0.0 {
        if ss_res == 0.0 {
            1.0
        } else {
            0.0
        }
    } else {
        1.0 - ss_res / ss_tot
    }
}

/// A fitting method: [`fit_linear`] or [`fit_max`].
pub type Fitter = fn(&[Sample]) -> Model;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::groups::testing::sample;
    use crate::fit::heldout::{kfold, leave_one_context_out, select, ErrStats};
    use crate::terms::priors;
    use crate::vocab::Mode;

    #[test]
    fn exact_terms_enter_with_coefficient_one_and_the_rest_is_solved() {
        // peak = 1000 (weights) + kv (exact, coefficient 1) + 50 + 3·act
        let pts: Vec<Sample> = (1..=6)
            .map(|i| {
                let (kv, act) = (10.0 * i as f64, (i * i) as f64);
                let x = [1.0, 1000.0, kv, act, 0.0, 0.0, 0.0, 0.0];
                sample(x, 1050.0 + kv + 3.0 * act, &format!("p{i}"), 64 * i)
            })
            .collect();
        let m = fit_linear(&pts);
        assert_eq!((m.get("weight"), m.get("kv")), (1.0, 1.0));
        assert!(m.held.is_empty(), "{m:?}");
        assert!((m.get("const") - 50.0).abs() < 1e-6, "{m:?}");
        assert!((m.get("act") - 3.0).abs() < 1e-9);
        assert!((r2(&m, &pts) - 1.0).abs() < 1e-12);
        let h = kfold("g", &pts, 3, fit_linear);
        assert_eq!(h.len(), 6);
        assert!(ErrStats::of(&h).unwrap().worst < 1e-9);
        assert_eq!(leave_one_context_out("g", &pts, fit_linear).len(), 6);
    }

    #[test]
    fn max_of_two_families_recovers_the_switch() {
        // peak = 100 + max(2·act + 3·attn, 40 + logits): the head constant wins for small act.
        let pts: Vec<Sample> = (1..=12)
            .map(|i| {
                let (act, attn, logits) = (i as f64, (i * i) as f64 / 4.0, 4.0);
                let x = [1.0, 0.0, 0.0, act, logits, attn, 0.0, 0.0];
                let y = 100.0 + (2.0 * act + 3.0 * attn).max(40.0 + logits);
                sample(x, y, &format!("p{i}"), 16 * i)
            })
            .collect();
        let m = fit_max(&pts);
        assert_eq!(m.kind(), "max");
        for s in &pts {
            assert!((m.predict(&s.x) - s.y).abs() < 1e-6 * s.y, "{m:?}");
        }
        let (_, hk, _) = select("g", &pts, 4);
        assert!(ErrStats::of(&hk).unwrap().median < 1e-6);
    }

    #[test]
    fn conservative_envelope_bounds_under_prediction() {
        let pts: Vec<Sample> = [(1.0, 10.0), (2.0, 30.0), (3.0, 25.0), (4.0, 42.0)]
            .iter()
            .map(|&(a, y)| sample([1.0, 0.0, 0.0, a, 0.0, 0.0, 0.0, 0.0], y, "p", 1))
            .collect();
        let mut m = fit_linear(&pts);
        make_conservative(&mut m, &pts, 0.01);
        for s in &pts {
            assert!(m.predict(&s.x) >= 0.99 * s.y - 1e-9);
        }
    }

    #[test]
    fn a_four_point_group_holds_what_it_cannot_identify_and_keeps_exact_terms() {
        // The shape of a `total` group: batch {1, 4} × context {128, 512}. Four points and four
        // uncertain terms (const, act ∝ b·s, logits ∝ b, attn ∝ b·s²): NNLS alone would trade
        // the KV term away; here KV and weights stay exact and at most three terms are fitted.
        let mut pts = Vec::new();
        for (b, s) in [(1u64, 128u64), (1, 512), (4, 128), (4, 512)] {
            let (kv, act, logits, attn) = (
                (46_080 * b * s) as f64,
                (69_120 * b * s) as f64,
                (196_608 * b) as f64,
                (b * s * s * 2) as f64,
            );
            let x = [1.0, 5e8, kv, act, logits, attn, 0.0, 0.0];
            let y = 5e8 + kv + 3e7 + 0.7 * act + 2.0 * logits + 0.1 * attn;
            let mut smp = sample(x, y, &format!("b{b}/c{s}"), s);
            smp.prior = priors(Mode::Infer, 2);
            pts.push(smp);
        }
        for m in [fit_linear(&pts), fit_max(&pts)] {
            assert_eq!((m.get("weight"), m.get("kv")), (1.0, 1.0), "{m:?}");
            assert_eq!((m.get("optimizer"), m.get("grad")), (1.0, 1.0));
            // Fitted terms leave a residual degree of freedom: fewer than the 4 points.
            let fitted = m.coef.len() - Term::EXACT.len()
                + m.candidates.iter().map(|c| c.len()).sum::<usize>()
                - m.held.len();
            assert!(fitted < 4, "{m:?}");
            for (t, why) in &m.held {
                let term = Term::from_name(t).unwrap();
                assert!(why.starts_with("held at analytic prior"), "{why}");
                let coef = m
                    .coef
                    .get(t)
                    .or_else(|| m.candidates.iter().find_map(|c| c.get(t)))
                    .copied();
                assert_eq!(coef, Some(term.prior(Mode::Infer, 2)), "{t}: {m:?}");
            }
        }
        // The linear fit cannot identify all four uncertain terms; it says so in the file.
        let m = fit_linear(&pts);
        assert!(!m.held.is_empty(), "{m:?}");
        let text = toml::to_string(&m).unwrap();
        assert!(text.contains("[held]"), "{text}");
    }
}
