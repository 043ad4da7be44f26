//! `fit`: per-group non-negative least squares of measured peaks on analytic terms
//! (ARCHITECTURE.md §9), with held-out error by k-fold over points and leave-one-context-out.
//!
//! A group is (architecture, backend, precision, mode, kv_cache — or for training the optimizer,
//! checkpointing and kind of trainable set —, phase, target). The terms are
//! the CSV's `feature_*` columns, a constant, and one derived term computed from the same row:
//! `attn` = batch · s · T · dtype bytes (query tokens × attended tokens: the attention-score
//! family, b·heads·s² up to a per-model factor). The same function computes the terms from a
//! `Config` in `estimate`, so a fit and an estimate can never disagree on a definition.
//!
//! Two model shapes are fitted per group: one linear model on every term, and the max of
//! linear candidates (resident terms + the largest transient family, ARCHITECTURE.md §9). The max
//! model is kept only where its k-fold held-out error is smaller.
//!
//! Terms whose coefficient depends on the model (act, attn, and a constant such as the f32
//! copy of a bf16 matrix on CPU) transfer to other models of the architecture only roughly;
//! weights and KV are exact bytes and carry over.
pub mod gen_terms;
pub mod generate;
pub mod nnls;
pub mod reserve;

use crate::features::Features;
use crate::record::{Phase, Record, Status};
use crate::vocab::{
    Backend, Checkpointing, KvKind, Mode, Ops, Optimizer, Precision, Trainable, TrainableKind,
};
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Term names, in column order.
pub const TERMS: [&str; 8] = [
    "const",
    "weight",
    "kv",
    "act",
    "logits",
    "attn",
    "optimizer",
    "grad",
];
pub const N_TERMS: usize = TERMS.len();
/// Exact terms: weights, KV cache, optimizer state and gradients are known to the byte from
/// shapes and dtypes (and verified exactly on CPU). They enter every prediction with a
/// coefficient of exactly 1 and are never fitted: a fit only sees the target minus them.
pub const EXACT: [usize; 4] = [1, 2, 6, 7];
/// The uncertain terms a fit estimates, in the order they are admitted when the design
/// cannot identify them all: the runtime constant first, then per-token activations, logits
/// and attention scores.
pub const UNCERTAIN: [usize; 4] = [0, 3, 4, 5];

/// The analytic prior coefficient of an uncertain term, held when a group cannot identify it
/// (docs/src/concepts/fit-and-estimate.md): training activations follow Korthikanti et al. (34 B
/// per token·hidden per layer at 16 bits = 17 × `act`), training logits the 16-bit logits plus
/// their f32 loss copy ((bytes + 4) / bytes × `logits`), inference logits the f32 last-position
/// logits (4 / bytes × `logits`); the inference transient per layer, the attention scores (zero
/// under fused attention) and the runtime constant (zero without a measurement) have no
/// model-independent coefficient, so their prior is 0 and `estimate` uses its analytic row.
pub fn prior(term: usize, mode: Mode, dtype_bytes: u64) -> f64 {
    let b = dtype_bytes.max(1) as f64;
    match (TERMS[term], mode) {
        ("weight" | "kv" | "optimizer" | "grad", _) => 1.0,
        ("act", Mode::Train) => 17.0,
        ("logits", Mode::Train) => (b + 4.0) / b,
        ("logits", _) => 4.0 / b,
        _ => 0.0,
    }
}

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
        // Generation rows carry no token terms (the fit reads LLM rows).
        Phase::Load | Phase::Warmup | Phase::TextEncode | Phase::Denoise | Phase::VaeDecode => {
            (0, 0)
        }
        Phase::Decode => (1, kv_tokens),
        Phase::Prefill | Phase::Total => (prompt_len, prompt_len),
        // Training rows: the caller passes the sequence length (the `context` column).
        Phase::Forward | Phase::Backward | Phase::Optimizer | Phase::StepTotal => {
            (prompt_len, prompt_len)
        }
    }
}

/// The regression terms of one point and phase (no gradients live: inference, forward).
pub fn terms(f: &Features, batch: u64, s: u64, t: u64, dtype_bytes: u64) -> Terms {
    with_grads(f, batch, s, t, dtype_bytes, 0)
}

/// [`terms`] with `grad_bytes` of gradients live in the phase.
pub fn with_grads(
    f: &Features,
    batch: u64,
    s: u64,
    t: u64,
    dtype_bytes: u64,
    grad_bytes: u64,
) -> Terms {
    [
        1.0,
        f.weight_bytes as f64,
        f.kv_bytes as f64,
        f.act_bytes as f64,
        f.logits_bytes as f64,
        // In reals: a query's b·s·T can exceed 64 bits (the estimate's bytes then overflow);
        // exact where the integer product is below 2^53, as every measured point's is.
        batch as f64 * s as f64 * t as f64 * dtype_bytes as f64,
        f.optimizer_bytes as f64,
        grad_bytes as f64,
    ]
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
    grad_bytes: u64,
) -> Terms {
    let ga = grad_accum.max(1);
    let f = Features {
        act_bytes: f.act_bytes / ga,
        logits_bytes: f.logits_bytes / ga,
        optimizer_bytes: if optimizer_live { f.optimizer_bytes } else { 0 },
        ..*f
    };
    with_grads(&f, batch / ga, seq, seq, dtype_bytes, grad_bytes)
}

/// Gradient bytes live in a training phase of a row: from the backward on (candle drops the
/// gradient store after the optimizer step, so a forward holds none). AdamW rows know them
/// exactly (half the state: m and v per trainable parameter); SGD rows of full training
/// update every weight; otherwise 0 (the constant absorbs them).
fn grad_bytes(r: &Record, f: &Features, phase: Phase) -> u64 {
    if !matches!(phase, Phase::Backward | Phase::Optimizer | Phase::StepTotal) {
        return 0;
    }
    match (r.optimizer, r.trainable) {
        (o, _) if o.is_adamw() => f.optimizer_bytes / 2,
        (o, Some(Trainable::Full)) if o.is_sgd() => f.weight_bytes,
        _ => 0,
    }
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
    let bytes = r.precision.act_bytes();
    let phase = r.phase?;
    if r.mode == Mode::Train && phase != Phase::Load {
        let live = r.step.unwrap_or(1) > 1 || matches!(phase, Phase::Optimizer | Phase::StepTotal);
        return Some(train_terms(
            &f,
            r.batch,
            r.context,
            r.grad_accum.unwrap_or(1),
            live,
            bytes,
            grad_bytes(r, &f, phase),
        ));
    }
    let (s, t) = phase_tokens(phase, r.prompt_len.unwrap_or(0), r.kv_tokens.unwrap_or(0));
    Some(terms(&f, r.batch, s, t, bytes))
}

/// The `train` part of a training row's group: the optimizer as it ran, checkpointing, the
/// kind of trainable set (`full`, `frozen-embeddings`, `lora`: the rank only scales the
/// adapters), and whether the rows are the first step's. Written `adamw+none+full[+step1]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TrainGroup {
    pub optimizer: Optimizer,
    pub checkpointing: Checkpointing,
    pub trainable: TrainableKind,
    /// The first step is its own group: its optimizer state is created inside it, so its
    /// forward and backward run without the state that later steps carry.
    pub first_step: bool,
}

impl std::fmt::Display for TrainGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let step1 = if self.first_step { "+step1" } else { "" };
        write!(
            f,
            "{}+{}+{}{step1}",
            self.optimizer, self.checkpointing, self.trainable
        )
    }
}

impl std::str::FromStr for TrainGroup {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |e: &dyn std::fmt::Display| format!("training group `{s}`: {e}");
        let parts: Vec<&str> = s.split('+').collect();
        let (o, c, t, first_step) = match parts[..] {
            [o, c, t] => (o, c, t, false),
            [o, c, t, "step1"] => (o, c, t, true),
            _ => return Err(bad(&"expected optimizer+checkpointing+trainable[+step1]")),
        };
        Ok(TrainGroup {
            optimizer: o.parse().map_err(|e| bad(&e))?,
            checkpointing: c.parse().map_err(|e| bad(&e))?,
            trainable: t.parse().map_err(|e| bad(&e))?,
            first_step,
        })
    }
}

crate::vocab::serde_as_text!(TrainGroup);

/// What identifies a group of rows fitted together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupKey {
    pub architecture: String,
    pub backend: Backend,
    pub precision: Precision,
    pub mode: Mode,
    /// Inference rows; written `""` for training groups.
    #[serde(with = "crate::vocab::blank")]
    pub kv_cache: Option<KvKind>,
    /// Training rows ([`TrainGroup`]); absent for inference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<TrainGroup>,
    /// `kernels+attention` when not the default `reference+eager`; absent for the default (as
    /// in every constants file written before these axes).
    #[serde(default, skip_serializing_if = "is_default_ops", with = "ops_text")]
    pub ops: Ops,
    pub phase: Phase,
}

fn is_default_ops(o: &Ops) -> bool {
    *o == Ops::default()
}

/// `Ops` in a constants file: `kernels+attention`.
mod ops_text {
    use crate::vocab::Ops;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(o: &Ops, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{}+{}", o.kernels, o.attention))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Ops, D::Error> {
        let text = String::deserialize(d)?;
        let (k, a) = text
            .split_once('+')
            .ok_or_else(|| D::Error::custom(format!("ops `{text}`: expected kernels+attention")))?;
        Ok(Ops {
            kernels: k.parse().map_err(D::Error::custom)?,
            attention: a.parse().map_err(D::Error::custom)?,
        })
    }
}

impl GroupKey {
    /// A row's group: None for a row without a phase, a training row without its
    /// checkpointing and trainable set, or a generation row (no fitted terms yet).
    pub fn of(r: &Record) -> Option<GroupKey> {
        let train = match r.mode {
            Mode::Generate => return None,
            Mode::Train => Some(TrainGroup {
                optimizer: r.optimizer,
                checkpointing: r.checkpointing?,
                trainable: r.trainable?.kind(),
                first_step: r.step == Some(1),
            }),
            Mode::Infer | Mode::Encode => None,
        };
        Some(GroupKey {
            architecture: r.architecture.clone(),
            backend: r.backend,
            precision: r.precision,
            mode: r.mode,
            kv_cache: r.kv_cache,
            train,
            ops: Ops {
                kernels: r.kernels,
                attention: r.attention,
            },
            phase: r.phase?,
        })
    }
    pub fn label(&self) -> String {
        let ops = if is_default_ops(&self.ops) {
            String::new()
        } else {
            format!("/{}+{}", self.ops.kernels, self.ops.attention)
        };
        let kind = match (&self.train, self.kv_cache) {
            (Some(t), _) => t.to_string(),
            (None, Some(kv)) => kv.to_string(),
            (None, None) => String::new(),
        };
        format!(
            "{}/{}/{}/{}/{kind}{ops}/{}",
            self.architecture, self.backend, self.precision, self.mode, self.phase
        )
    }
}

/// One fitted row: its terms, its measured target, and names for reports.
#[derive(Clone, Debug)]
pub struct Sample {
    pub x: Terms,
    pub y: f64,
    /// The analytic prior coefficient of each term ([`prior`]) for the row's mode and dtype.
    pub prior: Terms,
    pub point: String,
    pub context: u64,
    /// The training step (0 for inference rows).
    pub step: u64,
    /// "point_id phase step" — how the worst row is named.
    pub row: String,
}

/// The priors of every term for a mode and dtype width.
pub fn priors(mode: Mode, dtype_bytes: u64) -> Terms {
    std::array::from_fn(|j| prior(j, mode, dtype_bytes))
}

impl Sample {
    pub fn of(r: &Record, target: Target) -> Option<Sample> {
        let y = target.of(r)? as f64;
        let phase = GroupKey::of(r)?.phase;
        Some(Sample {
            x: record_terms(r)?,
            y,
            prior: priors(r.mode, r.precision.act_bytes()),
            point: r.point_id.clone(),
            context: r.context,
            step: r.step.unwrap_or(0),
            row: format!("{} {phase} step {}", r.point_id, r.step.unwrap_or(0)),
        })
    }
}

/// `coef · terms`, plus the largest of the `candidates` (each `cand · terms`) when there are
/// any: a phase's peak is resident bytes plus the largest transient (ARCHITECTURE.md §9).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Coefficient per term name: the resident part (the whole model when linear). The exact
    /// terms ([`EXACT`]) are always here with coefficient 1.
    pub coef: BTreeMap<String, f64>,
    /// Uncertain terms the group's design cannot identify (rank-deficient, or fewer points
    /// than free terms), held at their analytic prior ([`prior`]): term → why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, String>,
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

    /// Whether `term` was held at its prior rather than fitted.
    pub fn is_held(&self, term: &str) -> bool {
        self.held.contains_key(term)
    }
}

/// Terms of the resident part of a max model: the constant and the exact terms.
const RESIDENT: [usize; 5] = [0, 1, 2, 6, 7];
/// The transient families a max model chooses between: the per-layer transients (MLP
/// intermediates ∝ act, attention scores ∝ attn), and the head (a constant such as a converted
/// weight, plus the logits).
const FAMILIES: [&[usize]; 2] = [&[3, 5], &[0, 4]];

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
fn solve(samples: &[Sample], resident: &[usize], families: &[&[usize]], assign: &[usize]) -> Model {
    let mut cols: Vec<(Option<usize>, usize)> = resident
        .iter()
        .filter(|j| !EXACT.contains(j))
        .map(|&j| (None, j))
        .collect();
    for (f, fam) in families.iter().enumerate() {
        cols.extend(fam.iter().map(|&j| (Some(f), j)));
    }
    let full = DMatrix::from_fn(samples.len(), cols.len(), |i, k| match cols[k] {
        (None, j) => samples[i].x[j],
        (Some(f), j) if assign[i] == f => samples[i].x[j],
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
            s.y - EXACT.iter().map(|&j| s.x[j]).sum::<f64>()
                - held
                    .iter()
                    .map(|&k| prior[cols[k].1] * full[(i, k)])
                    .sum::<f64>()
        }),
    );
    let sol = nnls::nnls(&a, &b);
    let mut coef: BTreeMap<String, f64> =
        EXACT.iter().map(|&j| (TERMS[j].to_string(), 1.0)).collect();
    let mut candidates = vec![BTreeMap::new(); families.len()];
    let mut put = |k: usize, v: f64| {
        let (f, j) = cols[k];
        let map = match f {
            None => &mut coef,
            Some(f) => &mut candidates[f],
        };
        map.insert(TERMS[j].to_string(), v);
    };
    for (i, &k) in keep.iter().enumerate() {
        put(k, sol[i]);
    }
    for &k in &held {
        put(k, prior[cols[k].1]);
    }
    let held = held
        .iter()
        .map(|&k| {
            let j = cols[k].1;
            (
                TERMS[j].to_string(),
                format!(
                    "held at analytic prior {}: not identified ({} of {} free terms identifiable from {} points)",
                    prior[j],
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
    let all: Vec<usize> = (0..N_TERMS).collect();
    solve(samples, &all, &[], &[])
}

fn sse(m: &Model, samples: &[Sample]) -> f64 {
    samples
        .iter()
        .map(|s| (s.y - m.predict(&s.x)).powi(2))
        .sum()
}

/// Resident terms plus the largest of the transient `FAMILIES`, fitted by alternating
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

/// The constants schema this build reads and writes (2: exact terms never fitted, held
/// terms, provenance).
pub const CONSTANTS_SCHEMA: u32 = 2;

pub use crate::vocab::Runtime;

/// The constants file `fit` writes and `estimate --constants` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constants {
    pub schema: u32,
    pub vramlab_version: String,
    /// Where the constants came from: the runtime, backend and device that measured the rows,
    /// and the models measured.
    pub runtime: Runtime,
    pub backend: Backend,
    pub device: String,
    pub models: Vec<String>,
    /// Held-out error of the fit over all groups (k-fold by point, peak allocated).
    pub fit_error: Option<ErrStats>,
    pub terms: Vec<String>,
    pub sources: Vec<String>,
    pub group: Vec<GroupFit>,
    /// Generation groups (mode = "generate", [`generate`]); absent in files written before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generation: Vec<generate::GenGroupFit>,
    /// The caching allocator's reserve per class of run ([`reserve`]; torch on CUDA only);
    /// absent in files written before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserve: Vec<reserve::ReserveFit>,
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
            terms: TERMS.iter().map(|s| s.to_string()).collect(),
            sources,
            group,
            generation: Vec::new(),
            reserve: reserve::fit(records),
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
        let schema = toml::from_str::<toml::Table>(text)
            .ok()
            .and_then(|t| t.get("schema").and_then(|v| v.as_integer()));
        if let Some(v) = schema.filter(|&v| v != CONSTANTS_SCHEMA as i64) {
            return Err(bad_file(
                path,
                format!(
                    "constants schema {v} is not the supported {CONSTANTS_SCHEMA} (refit with `vramlab fit`)"
                ),
            ));
        }
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

    /// Whether these constants may answer a query for `runtime` on `backend`: Ok(None) when
    /// they match; a one-line error naming `path` when they do not (their uncertain terms
    /// describe another runtime or device); Ok(Some(warning)) with `allow_transfer`.
    pub fn check_query(
        &self,
        path: &std::path::Path,
        runtime: Runtime,
        backend: Backend,
        allow_transfer: bool,
    ) -> anyhow::Result<Option<String>> {
        if self.runtime == runtime && self.backend == backend {
            return Ok(None);
        }
        let what = format!(
            "constants measured with {} on {} ({}) answer a {} query on {}",
            self.runtime.as_str(),
            self.backend,
            self.device,
            runtime.as_str(),
            backend
        );
        if allow_transfer {
            return Ok(Some(format!(
                "{what} (--allow-transfer: their runtime constant, activations and logits may not hold there)"
            )));
        }
        Err(crate::error::bad_file(
            path,
            format!("{what}; refusing (pass --allow-transfer to use them anyway)"),
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
            prior: priors(Mode::Infer, 4),
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
    fn terms_from_features() {
        let f = Features {
            weight_bytes: 7,
            kv_bytes: 5,
            act_bytes: 3,
            logits_bytes: 2,
            optimizer_bytes: 1,
        };
        // attn = b · s · T · bytes = 2 · 3 · 4 · 2
        assert_eq!(
            terms(&f, 2, 3, 4, 2),
            [1.0, 7.0, 5.0, 3.0, 2.0, 48.0, 1.0, 0.0]
        );
        assert_eq!(phase_tokens(Phase::Decode, 96, 100), (1, 100));
        assert_eq!(phase_tokens(Phase::Prefill, 96, 96), (96, 96));
    }

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
        for s in &pts {
            let batch = s.x[4] / (49_152.0 * 4.0);
            assert!(batch == 1.0 || batch == 4.0, "{}: logits {}", s.row, s.x[4]);
            assert_eq!(s.x[3], (576 * 30 * 4) as f64 * batch, "{}", s.row);
            let kv = (2 * 30 * 3 * 64 * 4 * s.context) as f64 * batch;
            assert_eq!(s.x[2], kv, "{}", s.row);
            assert_eq!(s.x[1], pts[0].x[1], "{}", s.row);
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
            let fitted = m.coef.len() - EXACT.len()
                + m.candidates.iter().map(|c| c.len()).sum::<usize>()
                - m.held.len();
            assert!(fitted < 4, "{m:?}");
            for (t, why) in &m.held {
                let j = TERMS.iter().position(|n| n == t).unwrap();
                assert!(why.starts_with("held at analytic prior"), "{why}");
                let coef = m
                    .coef
                    .get(t)
                    .or_else(|| m.candidates.iter().find_map(|c| c.get(t)))
                    .copied();
                assert_eq!(coef, Some(prior(j, Mode::Infer, 2)), "{t}: {m:?}");
            }
        }
        // The linear fit cannot identify all four uncertain terms; it says so in the file.
        let m = fit_linear(&pts);
        assert!(!m.held.is_empty(), "{m:?}");
        let text = toml::to_string(&m).unwrap();
        assert!(text.contains("[held]"), "{text}");
    }
}
