//! [`estimate`]: the analytic breakdown, with the uncertain rows (runtime constant,
//! activations, logits) from a fitted group of constants where one answers the query, and the
//! allocator's reserve.
use super::device::with_reserve;
use super::infer::{analytic_infer, infer_features};
use super::train::{analytic_train, grad_bytes, train_features};
use super::{Backend, Breakdown, Mode, Overflow, Query, Sharding};
use crate::checked::Checked;
use crate::fit::{self, Constants, GroupKey, Target, TrainGroup};
use crate::model::Config;
use crate::record::Phase;
use crate::terms::{self, Term, Terms};
use crate::vocab::{Ops, Runtime};

/// The group of fitted constants that answers a query on `backend`: for inference the `total`
/// phase of the same architecture, precision and cache kind; for training the `step_total`
/// phase of the same architecture, precision, optimizer, checkpointing and kind of trainable
/// set. None for a sharded training job (the fits know one GPU) or no optimizer.
pub fn group_key(c: &Config, q: &Query, backend: Backend) -> Option<GroupKey> {
    let (kv_cache, train, phase) = match q.mode {
        // Encoders have no fitted groups yet: analytic only.
        Mode::Encode | Mode::Generate => return None,
        Mode::Infer => (Some(q.kv_cache), None, Phase::Total),
        Mode::Train => {
            if q.gpus > 1 && q.sharding != Sharding::Ddp || !q.optimizer.updates() {
                return None;
            }
            let group = TrainGroup {
                optimizer: q.runtime_optimizer(),
                checkpointing: q.checkpointing,
                trainable: q.trainable.kind(),
                first_step: false,
            };
            (None, Some(group), Phase::StepTotal)
        }
    };
    Some(GroupKey {
        architecture: c.architecture.name().to_string(),
        backend,
        precision: q.precision,
        mode: q.mode,
        kv_cache,
        train,
        ops: Ops::default(),
        phase,
    })
}

/// The terms of a query in a phase, by the definitions `fit` uses for CSV rows.
pub fn query_terms(c: &Config, q: &Query, phase: Phase) -> Result<Terms, Overflow> {
    Ok(match q.mode {
        Mode::Infer | Mode::Encode | Mode::Generate => terms::terms(
            &infer_features(c, q)?,
            q.batch,
            q.context,
            q.context,
            q.act_bytes(),
        ),
        // The steady state: every step after the first holds the optimizer state throughout;
        // gradients are live from the backward on.
        Mode::Train => terms::train_terms(
            &train_features(c, q)?,
            q.batch,
            q.context,
            1,
            true,
            q.act_bytes(),
            if phase == Phase::Forward {
                0
            } else {
                grad_bytes(c, q)?
            },
        ),
    })
}

/// The fitted group for a query ([`group_key`]) on the constants' own backend, with the
/// query's terms in that group's phase. For training, a step's peak is the largest of its
/// phases' peaks (that is how `step_total` is measured), so where the forward, backward and
/// optimizer groups are all fitted, the phase predicting the most answers; else the
/// `step_total` group. An overflow: the query's terms exceed 64-bit bytes.
pub fn fitted_group<'a>(
    c: &'a Constants,
    cfg: &Config,
    q: &Query,
) -> Result<Option<(&'a fit::GroupFit, Terms)>, Overflow> {
    let Some(key) = group_key(cfg, q, c.backend) else {
        return Ok(None);
    };
    let at = |g: &'a fit::GroupFit| Ok((g, query_terms(cfg, q, g.key.phase)?));
    if q.mode == Mode::Train {
        let phases: Option<Vec<_>> = fit::STEP_PHASES
            .iter()
            .map(|ph| {
                let k = GroupKey {
                    phase: *ph,
                    ..key.clone()
                };
                c.find(&k, Target::PeakAllocated)
            })
            .collect();
        if let Some(p) = phases {
            let p = p.into_iter().map(at).collect::<Result<Vec<_>, _>>()?;
            return Ok(p
                .into_iter()
                .max_by(|a, b| a.0.model.predict(&a.1).total_cmp(&b.0.model.predict(&b.1))));
        }
    }
    c.find(&key, Target::PeakAllocated).map(at).transpose()
}

/// Estimates a query. Weights, KV cache, gradients and optimizer state are always the
/// analytic (exact) bytes; where a fitted group applies, it supplies only the uncertain rows
/// (runtime constant, activations, logits), each term at its fitted coefficient or, where the
/// group could not identify it, at the analytic prior the fit held it at (and subtracted:
/// the fitted constant is consistent with it). Device rows are the sourced defaults.
///
/// An [`Overflow`] when a row or the total exceeds 2^64 B: a breakdown returned is one whose
/// [`Breakdown::total`] fits.
pub fn estimate(
    c: &Config,
    q: &Query,
    constants: Option<&Constants>,
) -> Result<Breakdown, Overflow> {
    let e = with_reserve(fitted(c, q, constants)?, c, q, constants)?;
    e.total_high()?;
    Ok(e)
}

/// [`estimate`]'s rows without the allocator's reserve, before the total is checked.
fn fitted(c: &Config, q: &Query, constants: Option<&Constants>) -> Result<Breakdown, Overflow> {
    let mut e = match q.mode {
        Mode::Infer => analytic_infer(c, q)?,
        // One forward over the batch: no cache, no LM head.
        Mode::Encode | Mode::Generate => Breakdown {
            kv: 0,
            logits: 0,
            ..analytic_infer(c, q)?
        },
        Mode::Train => analytic_train(c, q)?,
    };
    if q.runtime == Runtime::Torch && q.stack.transformers_major() < 5 {
        let per_layer = c
            .architecture
            .transformers4_buffers_per_layer(c, q.state_bytes());
        e.buffers = (Checked::from(per_layer) * c.num_layers).bytes("model buffers")?;
    }
    let fitted = match constants {
        Some(k) => fitted_group(k, c, q)?,
        None => None,
    };
    let Some((g, x)) = fitted else {
        return Ok(e);
    };
    e.source = format!(
        "fitted {} ({}, {} model)",
        g.key.label(),
        g.target.as_str(),
        g.model.kind()
    );
    // Bytes of `terms` in the resident part and the active candidate.
    let part = |terms: &[&str], resident_const: bool| -> Checked {
        let idx = |t: &str| Term::from_name(t).expect("a term name").index();
        let mut sum = 0.0;
        for t in terms {
            if *t != "const" || resident_const {
                sum += g.model.get(t) * x[idx(t)];
            }
        }
        if let Some(c) = g.model.active(&x) {
            for t in terms {
                if *t != "const" || !resident_const {
                    sum += c.get(*t).copied().unwrap_or(0.0) * x[idx(t)];
                }
            }
        }
        Checked::from_f64(sum)
    };
    // The fitted phases (forward, backward, optimizer) already carry the step's transient.
    e.step_transient = 0;
    e.runtime_constant = part(&["const"], true).bytes("runtime constant")?;
    e.activations = part(&["act", "attn"], true).bytes("activations")?;
    // The head family's constant (a converted weight) belongs with the logits.
    e.logits = part(&["logits", "const"], false).bytes("logits")?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::{estimate, preset, q};
    use crate::estimate::{fits_in, gpu_fit, Optimizer, Precision, Runtime};
    use crate::model::KvKind;
    use crate::vocab::Checkpointing;

    /// Constants with absurd coefficients (KV 0, weights 0.1, a huge constant) for the llama
    /// inference `total` group and the three AdamW training phases.
    fn wild_constants() -> Constants {
        let mut group = Vec::new();
        let key = |mode, kv_cache, train, phase| GroupKey {
            architecture: "llama".into(),
            backend: Backend::Cuda,
            precision: Precision::Bf16,
            mode,
            kv_cache,
            train,
            ops: Ops::default(),
            phase,
        };
        let mut keys = vec![key(
            Mode::Infer,
            Some(KvKind::Preallocated),
            None,
            Phase::Total,
        )];
        let adamw = TrainGroup {
            optimizer: Optimizer::AdamwForeach,
            checkpointing: Checkpointing::None,
            trainable: crate::vocab::TrainableKind::Full,
            first_step: false,
        };
        for ph in fit::STEP_PHASES {
            keys.push(key(Mode::Train, None, Some(adamw), ph));
        }
        for k in keys {
            let coef = [
                ("const", 3e9),
                ("weight", 0.1),
                ("kv", 0.0),
                ("act", 9.0),
                ("logits", 5.0),
                ("attn", 1.0),
                ("optimizer", 0.0),
                ("grad", 0.0),
            ]
            .into_iter()
            .map(|(t, v)| (t.to_string(), v))
            .collect();
            group.push(fit::GroupFit {
                key: k,
                target: Target::PeakAllocated,
                rows: 9,
                points: 9,
                r2: 1.0,
                conservative: false,
                model: fit::Model {
                    coef,
                    ..Default::default()
                },
                kfold: None,
                loco: None,
            });
        }
        Constants {
            schema: fit::CONSTANTS_SCHEMA,
            vramlab_version: "test".into(),
            runtime: Runtime::Torch,
            backend: Backend::Cuda,
            device: "test".into(),
            models: vec![],
            fit_error: None,
            terms: crate::terms::TERMS.iter().map(|t| t.to_string()).collect(),
            sources: vec![],
            group,
            generation: vec![],
            reserve: vec![],
        }
    }

    #[test]
    fn constants_never_change_the_exact_rows() {
        let m = preset("llama-3.1-8b");
        let c = wild_constants();
        let infer = Query {
            batch: 3,
            context: 2048,
            ..q()
        };
        let train = Query {
            mode: Mode::Train,
            batch: 2,
            context: 1024,
            ..q()
        };
        for query in [infer, train] {
            let (a, f) = (estimate(&m, &query, None), estimate(&m, &query, Some(&c)));
            assert!(f.source.starts_with("fitted"), "{}", f.source);
            assert_eq!(
                (a.weights, a.kv, a.gradients, a.optimizer, a.weight_copies),
                (f.weights, f.kv, f.gradients, f.optimizer, f.weight_copies)
            );
            // The fitted constant does answer the uncertain row.
            assert_eq!(f.runtime_constant, 3_000_000_000);
        }
        // Llama-3.1-8B at 2048 tokens × 3: 2 (K,V) · 32 layers · 8 kv heads · 128 · 2 B per token.
        assert_eq!(
            estimate(&m, &infer, Some(&c)).kv,
            2 * 32 * 8 * 128 * 2 * 2048 * 3
        );
    }

    /// A query whose figures exceed 2^64 B is an overflow naming the figure, in every build
    /// profile (the arithmetic is checked, never wrapped or saturated); the searches treat an
    /// overflowing candidate as one that does not fit.
    #[test]
    fn figures_past_64_bits_are_an_overflow() {
        let m = preset("llama-3.1-8b");
        let huge = Query {
            batch: u64::MAX,
            ..q()
        };
        let e = super::estimate(&m, &huge, None).unwrap_err();
        assert_eq!(e.figure, "KV cache");
        assert!(!fits_in(&m, &huge, None, u64::MAX));
        let train = Query {
            mode: Mode::Train,
            context: u64::MAX,
            ..q()
        };
        assert_eq!(
            super::estimate(&m, &train, None).unwrap_err().figure,
            "activations"
        );
        // Every row fits, their sum does not.
        let rows = Breakdown {
            weights: u64::MAX - 1,
            kv: 2,
            ..Default::default()
        };
        assert_eq!(rows.total().unwrap_err().figure, "total");
        // Fitted coefficients past 2^64 B overflow instead of saturating.
        let mut c = wild_constants();
        for g in &mut c.group {
            g.model.coef.insert("const".into(), 1e30);
        }
        let e = super::estimate(&m, &q(), Some(&c)).unwrap_err();
        assert_eq!(e.figure, "runtime constant");
        // A representable query whose searches reach past 2^64 B: those candidates do not fit.
        let wide = Query {
            batch: 1 << 30,
            ..q()
        };
        let g = gpu_fit(&m, &wide, None, "h100-80", 80_000_000_000, 0.1).unwrap();
        assert!(!g.fits);
        assert_eq!((g.largest_context, g.kv_capacity_tokens), (0, Some(0)));
    }
}
