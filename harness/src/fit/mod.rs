//! `fit`: per-group non-negative least squares of measured peaks on analytic terms
//! (DESIGN.md §9), with held-out error by k-fold over points and leave-one-context-out.
//!
//! A group is (architecture, backend, precision, mode, kv_cache — or for training the optimizer,
//! checkpointing and kind of trainable set —, phase, target). The terms are
//! the CSV's `feature_*` columns, a constant, and one derived term computed from the same row:
//! `attn` = batch · s · T · dtype bytes (query tokens × attended tokens: the attention-score
//! family, b·heads·s² up to a per-model factor). The same function computes the terms from a
//! `Config` in `estimate`, so a fit and an estimate can never disagree on a definition.
//!
//! Two model shapes are fitted per group: one linear model on every term, and the max of
//! linear candidates (resident terms + the largest transient family, DESIGN.md §9). The max
//! model is kept only where its k-fold held-out error is smaller.
//!
//! Terms whose coefficient depends on the model (act, attn, and a constant such as the f32
//! copy of a bf16 matrix on CPU) transfer to other models of the architecture only roughly;
//! weights and KV are exact bytes and carry over.
pub mod nnls;

use crate::features::Features;
use crate::record::{Phase, Record, Status};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Term names, in column order.
pub const TERMS: [&str; 7] = [
    "const",
    "weight",
    "kv",
    "act",
    "logits",
    "attn",
    "optimizer",
];
pub const N_TERMS: usize = TERMS.len();
/// Coefficient a term keeps when it does not vary inside a group (it cannot be identified
/// there): weights, KV and optimizer state are resident bytes, counted once.
const PRIOR: [f64; N_TERMS] = [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0];

pub type Terms = [f64; N_TERMS];

/// The measured quantity a fit predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    PeakAllocated,
    PeakReserved,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::PeakAllocated, Target::PeakReserved];
    pub fn as_str(&self) -> &'static str {
        match self {
            Target::PeakAllocated => "peak_allocated",
            Target::PeakReserved => "peak_reserved",
        }
    }
    pub fn of(&self, r: &Record) -> Option<u64> {
        match self {
            Target::PeakAllocated => r.peak_allocated,
            Target::PeakReserved => r.peak_reserved,
        }
    }
}

/// Query tokens `s` and attended tokens `T` of a phase.
pub fn phase_tokens(phase: Phase, prompt_len: u64, kv_tokens: u64) -> (u64, u64) {
    match phase {
        Phase::Load | Phase::Warmup => (0, 0),
        Phase::Decode => (1, kv_tokens),
        Phase::Prefill | Phase::Total => (prompt_len, prompt_len),
        // Training rows: the caller passes the sequence length (the `context` column).
        Phase::Forward | Phase::Backward | Phase::Optimizer | Phase::StepTotal => {
            (prompt_len, prompt_len)
        }
    }
}

/// The regression terms of one point and phase.
pub fn terms(f: &Features, batch: u64, s: u64, t: u64, dtype_bytes: u64) -> Terms {
    [
        1.0,
        f.weight_bytes as f64,
        f.kv_bytes as f64,
        f.act_bytes as f64,
        f.logits_bytes as f64,
        (batch * s * t * dtype_bytes) as f64,
        f.optimizer_bytes as f64,
    ]
}

/// Bytes per element of a precision column (16-bit activations for the mixed policies).
pub fn precision_bytes(p: &str) -> Option<u64> {
    match p {
        "f32" => Some(4),
        "f16" | "bf16" | "mixed-bf16" | "mixed-f16" => Some(2),
        _ => None,
    }
}

/// The terms of a training phase. Activation, logits and score terms count one micro-batch
/// (`batch / grad_accum`, what a forward holds at once) over `seq` tokens; the optimizer term
/// counts only when the state is live in the phase (`optimizer_live`: from the first optimizer
/// phase on; AdamW creates it lazily in step 1, like PyTorch).
pub fn train_terms(
    f: &Features,
    batch: u64,
    seq: u64,
    grad_accum: u64,
    optimizer_live: bool,
    dtype_bytes: u64,
) -> Terms {
    let ga = grad_accum.max(1);
    let f = Features {
        act_bytes: f.act_bytes / ga,
        logits_bytes: f.logits_bytes / ga,
        optimizer_bytes: if optimizer_live { f.optimizer_bytes } else { 0 },
        ..*f
    };
    terms(&f, batch / ga, seq, seq, dtype_bytes)
}

/// The terms of a CSV row, or `None` for a row that cannot be fitted (not ok, no features).
pub fn record_terms(r: &Record) -> Option<Terms> {
    if r.status != Some(Status::Ok) {
        return None;
    }
    let f = Features {
        weight_bytes: r.feature_weight_bytes?,
        kv_bytes: r.feature_kv_bytes?,
        act_bytes: r.feature_act_bytes?,
        logits_bytes: r.feature_logits_bytes?,
        optimizer_bytes: r.feature_optimizer_bytes.unwrap_or(0),
    };
    let bytes = precision_bytes(&r.precision)?;
    let phase = r.phase?;
    if r.mode == "train" && phase != Phase::Load {
        let live = r.step.unwrap_or(1) > 1 || matches!(phase, Phase::Optimizer | Phase::StepTotal);
        return Some(train_terms(
            &f,
            r.batch,
            r.context,
            r.grad_accum.unwrap_or(1),
            live,
            bytes,
        ));
    }
    let (s, t) = phase_tokens(phase, r.prompt_len.unwrap_or(0), r.kv_tokens.unwrap_or(0));
    Some(terms(&f, r.batch, s, t, bytes))
}

/// The `train` part of a training row's group: optimizer, checkpointing and the kind of
/// trainable set (`full`, `frozen-embeddings`, `lora`: the rank only scales the adapters).
pub fn train_group(optimizer: &str, checkpointing: &str, trainable: &str) -> String {
    let kind = if trainable.starts_with("lora-r") {
        "lora"
    } else {
        trainable
    };
    format!("{optimizer}+{checkpointing}+{kind}")
}

/// What identifies a group of rows fitted together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey {
    pub architecture: String,
    pub backend: String,
    pub precision: String,
    pub mode: String,
    pub kv_cache: String,
    /// Training rows: `optimizer+checkpointing+trainable kind` ([`train_group`]), with
    /// `+step1` for the first step's rows; empty for inference.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub train: String,
    /// `kernels+attention` ([`ops_group`]) when not the default `reference+eager`; empty for
    /// the default (as in every constants file written before these axes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ops: String,
    pub phase: String,
}

/// The `ops` part of a group: empty for `reference` kernels with `eager` attention (what
/// every schema-1 row ran), else `kernels+attention`.
pub fn ops_group(kernels: &str, attention: &str) -> String {
    let (k, a) = (
        if kernels.is_empty() {
            "reference"
        } else {
            kernels
        },
        if attention.is_empty() {
            "eager"
        } else {
            attention
        },
    );
    if (k, a) == ("reference", "eager") {
        String::new()
    } else {
        format!("{k}+{a}")
    }
}

impl GroupKey {
    pub fn of(r: &Record) -> Option<GroupKey> {
        let phase = serde_json::to_value(r.phase?).ok()?.as_str()?.to_string();
        Some(GroupKey {
            architecture: r.architecture.clone(),
            backend: r.backend.clone(),
            precision: r.precision.clone(),
            mode: r.mode.clone(),
            kv_cache: r.kv_cache.clone(),
            // The first step is its own group: its optimizer state is created inside it, so
            // its forward and backward run without the state that later steps carry.
            train: if r.mode == "train" {
                let g = train_group(&r.optimizer, &r.checkpointing, &r.trainable);
                if r.step == Some(1) {
                    g + "+step1"
                } else {
                    g
                }
            } else {
                String::new()
            },
            ops: ops_group(&r.kernels, &r.attention),
            phase,
        })
    }
    pub fn label(&self) -> String {
        let ops = if self.ops.is_empty() {
            String::new()
        } else {
            format!("/{}", self.ops)
        };
        format!(
            "{}/{}/{}/{}/{}{ops}/{}",
            self.architecture,
            self.backend,
            self.precision,
            self.mode,
            if self.train.is_empty() {
                &self.kv_cache
            } else {
                &self.train
            },
            self.phase
        )
    }
}

/// One fitted row: its terms, its measured target, and names for reports.
#[derive(Clone, Debug)]
pub struct Sample {
    pub x: Terms,
    pub y: f64,
    pub point: String,
    pub context: u64,
    /// The training step (0 for inference rows).
    pub step: u64,
    /// "point_id phase step" — how the worst row is named.
    pub row: String,
}

impl Sample {
    pub fn of(r: &Record, target: Target) -> Option<Sample> {
        let y = target.of(r)? as f64;
        let phase = GroupKey::of(r)?.phase;
        Some(Sample {
            x: record_terms(r)?,
            y,
            point: r.point_id.clone(),
            context: r.context,
            step: r.step.unwrap_or(0),
            row: format!("{} {phase} step {}", r.point_id, r.step.unwrap_or(0)),
        })
    }
}

/// `coef · terms`, plus the largest of the `candidates` (each `cand · terms`) when there are
/// any: a phase's peak is resident bytes plus the largest transient (DESIGN.md §9).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Coefficient per term name: the resident part (the whole model when linear).
    pub coef: BTreeMap<String, f64>,
    /// Terms held at their prior because they do not vary in the group.
    #[serde(default)]
    pub fixed: Vec<String>,
    /// Transient families, of which the largest counts (empty: a single linear model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<BTreeMap<String, f64>>,
}

fn dot(coef: &BTreeMap<String, f64>, x: &Terms) -> f64 {
    TERMS
        .iter()
        .zip(x)
        .map(|(n, v)| coef.get(*n).copied().unwrap_or(0.0) * v)
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
}

/// Terms of the resident part of a max model: the constant, weights, KV and optimizer state.
const RESIDENT: [usize; 4] = [0, 1, 2, 6];
/// The transient families a max model chooses between: the per-layer transients (MLP
/// intermediates ∝ act, attention scores ∝ attn), and the head (a constant such as a converted
/// weight, plus the logits).
const FAMILIES: [&[usize]; 2] = [&[3, 5], &[0, 4]];

/// NNLS with `resident` terms on every row and the terms of `families[assign[i]]` on row i.
/// Resident terms that are constant across the samples keep their prior coefficient (and are
/// subtracted from the target); the rest and the constant are solved.
fn solve(samples: &[Sample], resident: &[usize], families: &[&[usize]], assign: &[usize]) -> Model {
    let varies = |j: usize| {
        let v0 = samples[0].x[j];
        samples
            .iter()
            .any(|s| (s.x[j] - v0).abs() > 1e-9 * v0.abs().max(1.0))
    };
    let fixed: Vec<usize> = resident
        .iter()
        .copied()
        .filter(|&j| j != 0 && !varies(j))
        .collect();
    let mut cols: Vec<(Option<usize>, usize)> = resident
        .iter()
        .filter(|j| !fixed.contains(j))
        .map(|&j| (None, j))
        .collect();
    for (f, fam) in families.iter().enumerate() {
        cols.extend(fam.iter().map(|&j| (Some(f), j)));
    }
    let a = DMatrix::from_fn(samples.len(), cols.len(), |i, k| match cols[k] {
        (None, j) => samples[i].x[j],
        (Some(f), j) if assign[i] == f => samples[i].x[j],
        _ => 0.0,
    });
    let b = DVector::from_iterator(
        samples.len(),
        samples
            .iter()
            .map(|s| s.y - fixed.iter().map(|&j| PRIOR[j] * s.x[j]).sum::<f64>()),
    );
    let sol = nnls::nnls(&a, &b);
    let mut coef: BTreeMap<String, f64> = fixed
        .iter()
        .map(|&j| (TERMS[j].to_string(), PRIOR[j]))
        .collect();
    let mut candidates = vec![BTreeMap::new(); families.len()];
    for (k, &(f, j)) in cols.iter().enumerate() {
        let map = match f {
            None => &mut coef,
            Some(f) => &mut candidates[f],
        };
        map.insert(TERMS[j].to_string(), sol[k]);
    }
    Model {
        coef,
        fixed: fixed
            .iter()
            .filter(|&&j| samples[0].x[j] != 0.0)
            .map(|&j| TERMS[j].to_string())
            .collect(),
        candidates,
    }
}

/// A single linear model on every term.
pub fn fit_linear(samples: &[Sample]) -> Model {
    let all: Vec<usize> = (0..N_TERMS).collect();
    solve(samples, &all, &[], &[])
}

fn sse(m: &Model, samples: &[Sample]) -> f64 {
    samples
        .iter()
        .map(|s| (s.y - m.predict(&s.x)).powi(2))
        .sum()
}

/// Resident terms plus the largest of the transient [`FAMILIES`], fitted by alternating
/// between NNLS for a fixed assignment of rows to families and re-assigning each row to the
/// family that is largest there. Several starts (split by the attention term); the lowest
/// squared error wins.
pub fn fit_max(samples: &[Sample]) -> Model {
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by(|&i, &j| samples[i].x[5].total_cmp(&samples[j].x[5]));
    let mut best: Option<(f64, Model)> = None;
    for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let cut = (q * samples.len() as f64) as usize;
        let mut assign = vec![0; samples.len()];
        for &i in &order[..cut] {
            assign[i] = 1;
        }
        let mut m = solve(samples, &RESIDENT, &FAMILIES, &assign);
        for _ in 0..25 {
            let next: Vec<usize> = samples
                .iter()
                .map(|s| {
                    (0..FAMILIES.len())
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
            m = solve(samples, &RESIDENT, &FAMILIES, &assign);
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
    *m.coef.entry("const".into()).or_insert(0.0) += lift;
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

/// Fits on the samples `keep` says true for and predicts the others.
/// A fitting method: [`fit_linear`] or [`fit_max`].
pub type Fitter = fn(&[Sample]) -> Model;

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

/// A fitted group, as the constants file stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupFit {
    #[serde(flatten)]
    pub key: GroupKey,
    pub target: Target,
    pub rows: usize,
    pub points: usize,
    pub r2: f64,
    pub conservative: bool,
    #[serde(flatten)]
    pub model: Model,
    pub kfold: Option<ErrStats>,
    pub loco: Option<ErrStats>,
}

/// The constants file `fit` writes and `estimate --constants` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constants {
    pub schema: u32,
    pub vramlab_version: String,
    pub terms: Vec<String>,
    pub sources: Vec<String>,
    pub group: Vec<GroupFit>,
}

/// Everything `fit` computes from a set of records.
pub struct FitReport {
    pub constants: Constants,
    /// Held-out predictions over all groups, per target: (k-fold, leave-one-context-out).
    pub heldout: BTreeMap<&'static str, (Vec<Heldout>, Vec<Heldout>)>,
    /// Per target, k-fold held-out predictions of training steps (`step_total` rows) as the
    /// envelope of their forward, backward and optimizer fits: how `estimate` predicts them.
    pub envelope: BTreeMap<&'static str, Vec<Heldout>>,
}

/// The phases a training step's peak is the envelope of.
pub const STEP_PHASES: [&str; 3] = ["forward", "backward", "optimizer"];

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

/// Groups the fittable rows of `records` for `target`.
pub fn group_samples(records: &[Record], target: Target) -> BTreeMap<GroupKey, Vec<Sample>> {
    let mut groups: BTreeMap<GroupKey, Vec<Sample>> = BTreeMap::new();
    for r in records {
        if let (Some(k), Some(s)) = (GroupKey::of(r), Sample::of(r, target)) {
            groups.entry(k).or_default().push(s);
        }
    }
    groups
}

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
            .filter(|(k, _)| k.mode == "train" && k.phase == "step_total")
        {
            let phases: Option<Vec<(&[Sample], Fitter)>> = STEP_PHASES
                .iter()
                .map(|ph| {
                    let pk = GroupKey {
                        phase: ph.to_string(),
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
    FitReport {
        constants: Constants {
            schema: 1,
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            terms: TERMS.iter().map(|s| s.to_string()).collect(),
            sources,
            group,
        },
        heldout,
        envelope,
    }
}

impl Constants {
    /// Reads a constants file written by `vramlab fit`. Every error names `path` on one line
    /// (with the line and key when TOML has them).
    pub fn load(path: &std::path::Path) -> anyhow::Result<Constants> {
        use crate::error::bad_file;
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
        Constants::parse(path, &text)
    }

    /// [`Constants::load`] on text already read; `path` is only used in messages.
    pub fn parse(path: &std::path::Path, text: &str) -> anyhow::Result<Constants> {
        use crate::error::bad_file;
        let c: Constants = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            let at = match e.span() {
                Some(sp) => format!(
                    "line {}: ",
                    text[..sp.start.min(text.len())].matches('\n').count() + 1
                ),
                None => String::new(),
            };
            bad_file(path, format!("not a vramlab constants file: {at}{msg}"))
        })?;
        if c.schema != 1 {
            return Err(bad_file(
                path,
                format!("constants schema {} is not the supported 1", c.schema),
            ));
        }
        Ok(c)
    }

    /// Errors when the file has no group at all for `architecture` (constants fitted on
    /// another model family say nothing about this one).
    pub fn check_architecture(
        &self,
        path: &std::path::Path,
        architecture: &str,
    ) -> anyhow::Result<()> {
        if self.group.is_empty()
            || self
                .group
                .iter()
                .any(|g| g.key.architecture == architecture)
        {
            return Ok(());
        }
        let mut have: Vec<&str> = self
            .group
            .iter()
            .map(|g| g.key.architecture.as_str())
            .collect();
        have.sort();
        have.dedup();
        Err(crate::error::bad_file(
            path,
            format!(
                "constants fitted for {} cannot estimate a {architecture} model (refit on {architecture} CSVs, or drop --constants)",
                have.join(", ")
            ),
        ))
    }

    /// The group fitted for this key and target, if any.
    pub fn find(&self, key: &GroupKey, target: Target) -> Option<&GroupFit> {
        self.group
            .iter()
            .find(|g| &g.key == key && g.target == target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(x: Terms, y: f64, point: &str, context: u64) -> Sample {
        Sample {
            x,
            y,
            point: point.into(),
            context,
            step: 2,
            row: point.into(),
        }
    }

    #[test]
    fn training_steps_are_the_envelope_of_their_phases() {
        // backward = 1000 + 5·act (activations), optimizer = 1800 + 0·act (update transient):
        // the step is their max, which switches regime inside the grid.
        let (mut bwd, mut opt, mut step) = (Vec::new(), Vec::new(), Vec::new());
        for i in 1..=12u64 {
            let act = 20.0 * i as f64;
            let x = [1.0, 0.0, 0.0, act, 0.0, 0.0, 0.0];
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

    #[test]
    fn constant_weights_keep_their_prior_and_the_rest_is_solved() {
        // peak = 1000 (weights, coefficient 1) + 50 + 2·kv + 3·act
        let pts: Vec<Sample> = (1..=6)
            .map(|i| {
                let (kv, act) = (10.0 * i as f64, (i * i) as f64);
                let x = [1.0, 1000.0, kv, act, 0.0, 0.0, 0.0];
                sample(x, 1050.0 + 2.0 * kv + 3.0 * act, &format!("p{i}"), 64 * i)
            })
            .collect();
        let m = fit_linear(&pts);
        assert_eq!(m.get("weight"), 1.0);
        assert_eq!(m.fixed, vec!["weight".to_string()]);
        assert!((m.get("const") - 50.0).abs() < 1e-6, "{m:?}");
        assert!((m.get("kv") - 2.0).abs() < 1e-9 && (m.get("act") - 3.0).abs() < 1e-9);
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
                let x = [1.0, 0.0, 0.0, act, logits, attn, 0.0];
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
            .map(|&(a, y)| sample([1.0, 0.0, 0.0, a, 0.0, 0.0, 0.0], y, "p", 1))
            .collect();
        let mut m = fit_linear(&pts);
        make_conservative(&mut m, &pts, 0.01);
        for s in &pts {
            assert!(m.predict(&s.x) >= 0.99 * s.y - 1e-9);
        }
    }

    #[test]
    fn terms_from_features() {
        let f = Features {
            weight_bytes: 7,
            kv_bytes: 5,
            act_bytes: 3,
            logits_bytes: 2,
            optimizer_bytes: 1,
        };
        // attn = b · s · T · bytes = 2 · 3 · 4 · 2
        assert_eq!(terms(&f, 2, 3, 4, 2), [1.0, 7.0, 5.0, 3.0, 2.0, 48.0, 1.0]);
        assert_eq!(phase_tokens(Phase::Decode, 96, 100), (1, 100));
        assert_eq!(phase_tokens(Phase::Prefill, 96, 96), (96, 96));
    }

    /// The 16 decode rows of llama/cpu/f32/infer/preallocated/decode in
    /// results/cpu/cpu-smollm2.csv (peak_allocated): collinear (act ∝ logits ∝ batch,
    /// kv = capacity · batch · const) and exactly linear.
    fn smollm2_decode() -> Vec<Sample> {
        let mut v = Vec::new();
        for (b, cap, y) in [
            (1u64, 128u64, 547_433_153.0),
            (1, 512, 565_127_873.0),
            (4, 128, 565_731_533.0),
            (4, 512, 636_510_413.0),
        ] {
            for step in [8u64, 16, 24, 32] {
                let t = cap - 32 + step;
                let x = [
                    1.0,
                    538_060_032.0,
                    (46_080 * b * cap) as f64,
                    (69_120 * b) as f64,
                    (196_608 * b) as f64,
                    (b * t * 4) as f64,
                    0.0,
                ];
                v.push(Sample {
                    x,
                    y,
                    point: format!("b{b}/c{cap}"),
                    context: cap,
                    step,
                    row: format!("b{b}/c{cap} step {step}"),
                });
            }
        }
        v
    }

    #[test]
    fn collinear_exactly_linear_decode_group_is_fitted_exactly() {
        let pts = smollm2_decode();
        let m = fit_linear(&pts);
        // Exact solution: weights·1 (held, constant) + kv·1 + const + c·act (act ∝ logits).
        assert_eq!(m.fixed, vec!["weight".to_string()]);
        assert!((m.get("kv") - 1.0).abs() < 1e-6, "{m:?}");
        for s in &pts {
            assert!((m.predict(&s.x) - s.y).abs() < 1e-6 * s.y, "{m:?}");
        }
        assert!((r2(&m, &pts) - 1.0).abs() < 1e-9);
        // Each held-out point is still identified by the other three.
        let (_, hk, _) = select("g", &pts, 5);
        assert_eq!(hk.len(), 16);
        assert!(ErrStats::of(&hk).unwrap().worst < 1e-6, "{hk:?}");
    }
}
