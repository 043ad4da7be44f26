//! The groups a fit solves separately: which rows go together ([`GroupKey`], [`TrainGroup`]),
//! the measured quantity ([`Target`]), and one row's terms and target ([`Sample`]).
use crate::record::{Phase, Record};
use crate::terms::{priors, record_terms, Terms};
use crate::vocab::{
    Backend, Checkpointing, KvKind, Mode, Ops, Optimizer, Precision, TrainableKind,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// The analytic prior coefficient of each term ([`crate::terms::Term::prior`]) for the row's
    /// mode and dtype.
    pub prior: Terms,
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
            prior: priors(r.mode, r.precision.act_bytes()),
            point: r.point_id.clone(),
            context: r.context,
            step: r.step.unwrap_or(0),
            row: format!("{} {phase} step {}", r.point_id, r.step.unwrap_or(0)),
        })
    }
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

#[cfg(test)]
pub(super) mod testing {
    use super::*;

    /// An inference sample of terms `x` and target `y` (priors of 4-byte inference).
    pub fn sample(x: Terms, y: f64, point: &str, context: u64) -> Sample {
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
}
