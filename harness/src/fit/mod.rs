//! `fit`: per-group non-negative least squares of measured peaks on analytic terms
//! (ARCHITECTURE.md §9), with held-out error by k-fold over points and leave-one-context-out.
//!
//! A group is (architecture, backend, precision, mode, kv_cache — or for training the optimizer,
//! checkpointing and kind of trainable set —, phase, target). The terms are `crate::terms`'
//! ([`crate::terms::Term`]): the same functions compute them from a CSV row here and from a
//! `Config` in `estimate`, so a fit and an estimate can never disagree on a definition.
//!
//! Two model shapes are fitted per group: one linear model on every term, and the max of
//! linear candidates (resident terms + the largest transient family, ARCHITECTURE.md §9). The max
//! model is kept only where its k-fold held-out error is smaller.
//!
//! By job: `groups.rs` (which rows are fitted together, one row's sample), `solve.rs` (the
//! models and their NNLS, `nnls.rs` the solver), `heldout.rs` (held-out error and the choice of
//! model), `constants.rs` (the constants file), this file ([`fit_all`]); generation rows in
//! `generate.rs`, the caching allocator's reserve in `reserve.rs`. (The serving estimate's terms
//! are fitted in `estimate/serving_fit.rs`.)
mod constants;
pub mod generate;
mod groups;
mod heldout;
pub mod nnls;
pub mod reserve;
mod solve;

pub use constants::{Constants, FitReport, GroupFit, Runtime, CONSTANTS_SCHEMA};
pub use groups::{group_samples, GroupKey, Sample, Target, TrainGroup};
pub use heldout::{
    envelope_kfold, kfold, leave_one_context_out, select, ErrStats, Heldout, STEP_PHASES,
};
pub(crate) use solve::rank;
pub use solve::{fit_linear, fit_max, make_conservative, r2, Fitter, Model};

use crate::record::{Phase, Record};
use crate::vocab::Mode;
use std::collections::BTreeMap;

/// Fits every group for both targets, with held-out error.
pub fn fit_all(
    records: &[Record],
    sources: Vec<String>,
    conservative: bool,
    k: usize,
) -> FitReport {
    let mut group = Vec::new();
    let mut heldout = BTreeMap::new();
    let mut envelope = BTreeMap::new();
    for target in Target::ALL {
        let (mut all_k, mut all_l) = (Vec::new(), Vec::new());
        let groups = group_samples(records, target);
        for (key, samples) in &groups {
            let key = key.clone();
            let label = key.label();
            let (mut model, hk, hl) = select(&label, samples, k);
            if conservative {
                make_conservative(&mut model, samples, 0.01);
            }
            let mut points: Vec<&str> = samples.iter().map(|s| s.point.as_str()).collect();
            points.sort();
            points.dedup();
            group.push(GroupFit {
                key,
                target,
                rows: samples.len(),
                points: points.len(),
                r2: r2(&model, samples),
                conservative,
                kfold: ErrStats::of(&hk),
                loco: ErrStats::of(&hl),
                model,
            });
            all_k.extend(hk);
            all_l.extend(hl);
        }
        heldout.insert(target.as_str(), (all_k, all_l));
        let mut env = Vec::new();
        for (key, step) in groups
            .iter()
            .filter(|(k, _)| k.mode == Mode::Train && k.phase == Phase::StepTotal)
        {
            let phases: Option<Vec<(&[Sample], Fitter)>> = STEP_PHASES
                .iter()
                .map(|ph| {
                    let pk = GroupKey {
                        phase: *ph,
                        ..key.clone()
                    };
                    let fitted = group.iter().find(|g| g.key == pk && g.target == target)?;
                    let fitter: Fitter = if fitted.model.kind() == "max" {
                        fit_max
                    } else {
                        fit_linear
                    };
                    Some((groups.get(&pk)?.as_slice(), fitter))
                })
                .collect();
            if let Some(phases) = phases {
                env.extend(envelope_kfold(&key.label(), step, &phases, k));
            }
        }
        envelope.insert(target.as_str(), env);
    }
    let distinct = |f: fn(&Record) -> String| {
        let mut v: Vec<String> = records.iter().map(f).collect();
        v.sort();
        v.dedup();
        v
    };
    let fit_error = heldout
        .get(Target::PeakAllocated.as_str())
        .and_then(|(k, _)| ErrStats::of(k));
    FitReport {
        constants: Constants {
            schema: CONSTANTS_SCHEMA,
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            runtime: records
                .first()
                .map(|r| r.meter.runtime())
                .unwrap_or(Runtime::Candle),
            // `vramlab fit` refuses CSVs of several backends (`cmd/fit.rs`).
            backend: records.first().map(|r| r.backend).unwrap_or_default(),
            device: distinct(|r| r.device_name.clone()).join("+"),
            models: distinct(|r| r.model_id.clone()),
            fit_error,
            terms: crate::terms::TERMS.iter().map(|s| s.to_string()).collect(),
            sources,
            group,
            generation: Vec::new(),
            reserve: reserve::fit(records),
        },
        heldout,
        envelope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::terms::Term;

    /// The group of the 16 decode rows of SmolLM2-135M (llama, CPU, f32, preallocated KV) in
    /// the committed results/cpu/cpu-smollm2.csv: batch {1, 4} × context {128, 512} × 4 decode
    /// steps, read by the crate's own reader, with each row's terms from its own `feature_*`
    /// columns ([`Sample::of`]). A re-measured file changes the figures, never the fixture.
    const SMOLLM2_DECODE: &str = "llama/cpu/f32/infer/preallocated/decode";

    fn smollm2_decode() -> Vec<Sample> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/cpu/cpu-smollm2.csv");
        let rows = crate::export::csv::read(&path).unwrap();
        let pts: Vec<Sample> = rows
            .iter()
            .filter(|r| GroupKey::of(r).is_some_and(|k| k.label() == SMOLLM2_DECODE))
            .map(|r| Sample::of(r, Target::PeakAllocated).expect("an ok row with features"))
            .collect();
        assert_eq!(pts.len(), 16, "{}: {SMOLLM2_DECODE}", path.display());
        pts
    }

    #[test]
    fn collinear_exactly_linear_decode_group_is_fitted_exactly() {
        let pts = smollm2_decode();
        // The design, from SmolLM2-135M's shapes (hidden 576, 30 layers, 3 KV heads of 64,
        // vocabulary 49,152; f32), per sequence: logits = 49,152 · 4 B, act = one decode
        // token's hidden state per layer = 576 · 30 · 4 B, KV = 2 · 30 · 3 · 64 · 4 B per
        // token of the preallocated capacity (the context). So act ∝ logits ∝ batch, and every
        // row holds the same weights.
        let x = |s: &Sample, t: Term| s.x[t.index()];
        for s in &pts {
            let batch = x(s, Term::Logits) / (49_152.0 * 4.0);
            let logits = x(s, Term::Logits);
            assert!(batch == 1.0 || batch == 4.0, "{}: logits {logits}", s.row);
            let act = (576 * 30 * 4) as f64 * batch;
            assert_eq!(x(s, Term::Act), act, "{}", s.row);
            let kv = (2 * 30 * 3 * 64 * 4 * s.context) as f64 * batch;
            assert_eq!(x(s, Term::Kv), kv, "{}", s.row);
            assert_eq!(x(s, Term::Weight), x(&pts[0], Term::Weight), "{}", s.row);
        }
        let m = fit_linear(&pts);
        // Exact solution: weights·1 + kv·1 (exact) + const + c·act (act ∝ logits: logits is
        // not identified and is held at its prior, the act coefficient absorbs the rest).
        assert_eq!((m.get("weight"), m.get("kv")), (1.0, 1.0));
        assert!(m.is_held("logits"), "{m:?}");
        for s in &pts {
            assert!((m.predict(&s.x) - s.y).abs() < 1e-6 * s.y, "{m:?}");
        }
        assert!((r2(&m, &pts) - 1.0).abs() < 1e-9);
        // Held out point by point (4 points, so each of the k = 5 folds holds at most one):
        // each held-out point is still identified by the other three.
        let (_, hk, loco) = select("g", &pts, 5);
        assert_eq!(hk.len(), 16);
        assert!(ErrStats::of(&hk).unwrap().worst < 1e-6, "{hk:?}");
        // Two contexts only: leave-one-context-out needs three, so it reports nothing.
        assert!(loco.is_empty(), "{loco:?}");
    }
}
