//! The terms of a language-model phase: the CSV's `feature_*` columns, a constant, and one
//! derived term computed from the same row: `attn` = batch · s · T · dtype bytes (query tokens ×
//! attended tokens: the attention-score family, b·heads·s² up to a per-model factor). `fit`
//! computes them from a CSV row ([`record_terms`]) and `estimate` from a `Config` and a query
//! ([`terms`], [`train_terms`]), with the same functions.
//!
//! Terms whose coefficient depends on the model (act, attn, and a constant such as the f32
//! copy of a bf16 matrix on CPU) transfer to other models of the architecture only roughly;
//! weights and KV are exact bytes and carry over.
use crate::features::Features;
use crate::record::{Phase, Record, Status};
use crate::vocab::{Mode, Trainable};

/// One term of a language-model phase: a column of [`Terms`] (`t as usize`, [`Term::index`]),
/// named in constants files by [`Term::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Term {
    /// The runtime constant: 1 on every row.
    Const,
    /// Parameter storage bytes (exact).
    Weight,
    /// KV-cache bytes (exact).
    Kv,
    /// Per-token activations: b · s · hidden · layers · bytes.
    Act,
    /// Logits: b · s_out · vocab · bytes.
    Logits,
    /// Attention scores: b · s · T · bytes.
    Attn,
    /// Optimizer state bytes (exact).
    Optimizer,
    /// Gradient bytes live in the phase (exact).
    Grad,
}

/// The number of terms: the width of [`Terms`].
pub const N_TERMS: usize = Term::ALL.len();

/// The terms of one row or query, indexed by [`Term::index`].
pub type Terms = [f64; N_TERMS];

impl Term {
    /// Every term, in column order (`Term::ALL[i] as usize == i`).
    pub const ALL: [Term; 8] = [
        Term::Const,
        Term::Weight,
        Term::Kv,
        Term::Act,
        Term::Logits,
        Term::Attn,
        Term::Optimizer,
        Term::Grad,
    ];

    /// Exact terms: weights, KV cache, optimizer state and gradients are known to the byte from
    /// shapes and dtypes (and verified exactly on CPU). They enter every prediction with a
    /// coefficient of exactly 1 and are never fitted: a fit only sees the target minus them.
    pub const EXACT: [Term; 4] = [Term::Weight, Term::Kv, Term::Optimizer, Term::Grad];

    /// The uncertain terms a fit estimates, in the order they are admitted when the design
    /// cannot identify them all: the runtime constant first, then per-token activations, logits
    /// and attention scores.
    pub const UNCERTAIN: [Term; 4] = [Term::Const, Term::Act, Term::Logits, Term::Attn];

    /// Terms of the resident part of a max model (ARCHITECTURE.md §9): the constant and the
    /// exact terms.
    pub const RESIDENT: [Term; 5] = [
        Term::Const,
        Term::Weight,
        Term::Kv,
        Term::Optimizer,
        Term::Grad,
    ];

    /// The transient families a max model chooses between: the per-layer transients (MLP
    /// intermediates ∝ act, attention scores ∝ attn), and the head (a constant such as a
    /// converted weight, plus the logits).
    pub const FAMILIES: [&'static [Term]; 2] =
        [&[Term::Act, Term::Attn], &[Term::Const, Term::Logits]];

    /// The term's name in constants files and reports. Part of the constants format: files on
    /// disk key their coefficients by these names.
    pub const fn name(self) -> &'static str {
        match self {
            Term::Const => "const",
            Term::Weight => "weight",
            Term::Kv => "kv",
            Term::Act => "act",
            Term::Logits => "logits",
            Term::Attn => "attn",
            Term::Optimizer => "optimizer",
            Term::Grad => "grad",
        }
    }

    /// The term's column in [`Terms`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The term named `name` ([`Term::name`]), if any.
    pub fn from_name(name: &str) -> Option<Term> {
        Term::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether the term is one of the [`Term::EXACT`] terms.
    pub fn is_exact(self) -> bool {
        Term::EXACT.contains(&self)
    }

    /// The analytic prior coefficient of the term, held when a group cannot identify it
    /// (docs/src/concepts/fit-and-estimate.md): exact terms 1; training activations follow
    /// Korthikanti et al. (34 B per token·hidden per layer at 16 bits = 17 × `act`), training
    /// logits the 16-bit logits plus their f32 loss copy ((bytes + 4) / bytes × `logits`),
    /// inference logits the f32 last-position logits (4 / bytes × `logits`); the inference
    /// transient per layer, the attention scores (zero under fused attention) and the runtime
    /// constant (zero without a measurement) have no model-independent coefficient, so their
    /// prior is 0 and `estimate` uses its analytic row.
    pub fn prior(self, mode: Mode, dtype_bytes: u64) -> f64 {
        let b = dtype_bytes.max(1) as f64;
        match (self, mode) {
            (Term::Weight | Term::Kv | Term::Optimizer | Term::Grad, _) => 1.0,
            (Term::Act, Mode::Train) => 17.0,
            (Term::Logits, Mode::Train) => (b + 4.0) / b,
            (Term::Logits, _) => 4.0 / b,
            (Term::Const | Term::Act | Term::Attn, _) => 0.0,
        }
    }
}

/// Term names, in column order: [`Term::name`] of [`Term::ALL`].
pub const TERMS: [&str; N_TERMS] = {
    let mut names = [""; N_TERMS];
    let mut i = 0;
    while i < N_TERMS {
        names[i] = Term::ALL[i].name();
        i += 1;
    }
    names
};

/// The priors of every term ([`Term::prior`]) for a mode and dtype width.
pub fn priors(mode: Mode, dtype_bytes: u64) -> Terms {
    Term::ALL.map(|t| t.prior(mode, dtype_bytes))
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
    Term::ALL.map(|term| match term {
        Term::Const => 1.0,
        Term::Weight => f.weight_bytes as f64,
        Term::Kv => f.kv_bytes as f64,
        Term::Act => f.act_bytes as f64,
        Term::Logits => f.logits_bytes as f64,
        // In reals: a query's b·s·T can exceed 64 bits (the estimate's bytes then overflow);
        // exact where the integer product is below 2^53, as every measured point's is.
        Term::Attn => batch as f64 * s as f64 * t as f64 * dtype_bytes as f64,
        Term::Optimizer => f.optimizer_bytes as f64,
        Term::Grad => grad_bytes as f64,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_columns_are_the_constants_format() {
        // Constants files on disk key coefficients by these names, in this column order.
        assert_eq!(
            TERMS,
            [
                "const",
                "weight",
                "kv",
                "act",
                "logits",
                "attn",
                "optimizer",
                "grad"
            ]
        );
        for (i, t) in Term::ALL.into_iter().enumerate() {
            assert_eq!((t as usize, t.index()), (i, i));
            assert_eq!(Term::from_name(t.name()), Some(t));
        }
        assert_eq!(Term::from_name("bogus"), None);
    }

    #[test]
    fn exact_uncertain_and_resident_partition_the_terms() {
        let exact: Vec<Term> = Term::ALL.into_iter().filter(|t| t.is_exact()).collect();
        assert_eq!(exact, Term::EXACT);
        let mut all: Vec<Term> = Term::EXACT.into_iter().chain(Term::UNCERTAIN).collect();
        all.sort();
        assert_eq!(all, Term::ALL);
        let resident: Vec<Term> = Term::ALL
            .into_iter()
            .filter(|t| t.is_exact() || *t == Term::Const)
            .collect();
        assert_eq!(resident, Term::RESIDENT);
        // Every uncertain term but the constant (in both) is in exactly one family.
        for t in Term::UNCERTAIN {
            let n = Term::FAMILIES.iter().filter(|f| f.contains(&t)).count();
            assert_eq!(n, 1, "{t:?}");
        }
        for t in Term::EXACT {
            assert_eq!(t.prior(Mode::Infer, 2), 1.0);
            assert_eq!(t.prior(Mode::Train, 2), 1.0);
        }
    }

    #[test]
    fn priors_follow_the_mode_and_dtype() {
        let p = priors(Mode::Train, 2);
        assert_eq!(p[Term::Act.index()], 17.0);
        assert_eq!(p[Term::Logits.index()], 3.0);
        assert_eq!(priors(Mode::Infer, 2)[Term::Logits.index()], 2.0);
        assert_eq!(priors(Mode::Infer, 4)[Term::Const.index()], 0.0);
        assert_eq!(priors(Mode::Infer, 4)[Term::Attn.index()], 0.0);
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
}
