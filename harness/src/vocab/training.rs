//! Training options: the optimizer and its torch implementation, activation checkpointing,
//! and the trainable set (full, frozen embeddings or LoRA of a rank).
use serde::{Deserialize, Serialize};

vocab! {
    /// The optimizer a row ran: a scenario's choice (`sgd`, `adamw`, `adamw-fused`), `none` for
    /// inference rows, and on the torch probe the `torch.optim` implementation it forced
    /// (`adamw-foreach`, …; `adamw-fused` is `AdamW(fused=True)` there).
    #[derive(Default, clap::ValueEnum)]
    case = "kebab-case";
    pub enum Optimizer {
        /// No optimizer: an inference or encode row.
        #[default]
        None,
        /// Plain SGD (no state).
        Sgd,
        /// candle-nn's AdamW (allocates temporaries of several times each parameter tensor).
        Adamw,
        /// An in-place fused AdamW with no temporaries: vramlab-kernels' on candle,
        /// `torch.optim.AdamW(fused=True)` on the torch probe.
        AdamwFused,
        /// `torch.optim.AdamW(foreach=True)`: the multi-tensor path.
        AdamwForeach,
        /// `torch.optim.AdamW(foreach=False)`: one parameter at a time.
        AdamwForLoop,
        /// `torch.optim.SGD(foreach=True)`.
        SgdForeach,
        /// `torch.optim.SGD(foreach=False)`.
        SgdForLoop,
        /// `torch.optim.SGD(fused=True)`.
        SgdFused,
    }
}

impl Optimizer {
    /// Whether it keeps AdamW's two moments per parameter.
    pub fn is_adamw(&self) -> bool {
        matches!(
            self,
            Optimizer::Adamw
                | Optimizer::AdamwFused
                | Optimizer::AdamwForeach
                | Optimizer::AdamwForLoop
        )
    }
    /// Whether it is SGD (no state), in any implementation.
    pub fn is_sgd(&self) -> bool {
        matches!(
            self,
            Optimizer::Sgd | Optimizer::SgdForeach | Optimizer::SgdForLoop | Optimizer::SgdFused
        )
    }
    /// Whether it updates parameters at all (not `none`).
    pub fn updates(&self) -> bool {
        *self != Optimizer::None
    }
    /// What a scenario may ask for (the torch implementations are the probe's
    /// `--torch-optim`, `none` is what inference rows record).
    pub fn is_scenario_choice(&self) -> bool {
        matches!(
            self,
            Optimizer::Sgd | Optimizer::Adamw | Optimizer::AdamwFused
        )
    }
    /// The torch implementation of this optimizer (`adamw` + `foreach` = `adamw-foreach`);
    /// `none` stays `none`.
    pub fn torch(&self, imp: OptimizerImpl) -> Optimizer {
        match (self.is_adamw(), self.is_sgd(), imp) {
            (true, _, OptimizerImpl::Foreach) => Optimizer::AdamwForeach,
            (true, _, OptimizerImpl::ForLoop) => Optimizer::AdamwForLoop,
            (true, _, OptimizerImpl::Fused) => Optimizer::AdamwFused,
            (_, true, OptimizerImpl::Foreach) => Optimizer::SgdForeach,
            (_, true, OptimizerImpl::ForLoop) => Optimizer::SgdForLoop,
            (_, true, OptimizerImpl::Fused) => Optimizer::SgdFused,
            (false, false, _) => Optimizer::None,
        }
    }
}

vocab! {
    /// How a torch optimizer step runs over the parameters (its transient differs,
    /// ARCHITECTURE.md §9).
    #[derive(clap::ValueEnum)]
    case = "kebab-case";
    pub enum OptimizerImpl {
        /// torch's multi-tensor path (the CUDA default): `_foreach_sqrt` of v allocates one
        /// temporary per parameter at once ≈ 1 × the trainable parameter bytes.
        Foreach,
        /// One parameter at a time: temporaries of the largest tensor only.
        ForLoop,
        /// `fused=True`: one kernel, no temporaries (≈ 0).
        Fused,
    }
}

vocab! {
    /// Activation checkpointing of a training point.
    case = "lowercase";
    pub enum Checkpointing {
        None,
        /// Keep each layer's input only; recompute the layer in backward.
        Layer,
    }
}

/// What a training point updates: `full`, `frozen-embeddings`, or `lora-rN` (rank-N LoRA
/// adapters on the architecture's LoRA targets, base weights frozen).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Trainable {
    Full,
    FrozenEmbeddings,
    Lora(u32),
}

/// The largest LoRA rank a scenario may ask for.
pub const MAX_LORA_RANK: u32 = 4096;

impl std::str::FromStr for Trainable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Trainable::Full),
            "frozen-embeddings" => Ok(Trainable::FrozenEmbeddings),
            _ => match s.strip_prefix("lora-r").map(str::parse::<u32>) {
                Some(Ok(r)) if (1..=MAX_LORA_RANK).contains(&r) => Ok(Trainable::Lora(r)),
                Some(_) => Err(format!(
                    "LoRA rank in `{s}` must be an integer from 1 to {MAX_LORA_RANK}"
                )),
                None => Err(format!(
                    "unknown trainable set `{s}`, expected `full`, `frozen-embeddings` or `lora-rN` (e.g. `lora-r8`)"
                )),
            },
        }
    }
}

serde_as_text!(Trainable);

impl std::fmt::Display for Trainable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trainable::Full => f.write_str("full"),
            Trainable::FrozenEmbeddings => f.write_str("frozen-embeddings"),
            Trainable::Lora(r) => write!(f, "lora-r{r}"),
        }
    }
}

impl Trainable {
    /// The scenario and CSV spelling.
    pub fn label(&self) -> String {
        self.to_string()
    }

    /// The kind of set, without a LoRA rank: what fitted groups share.
    pub fn kind(&self) -> TrainableKind {
        match self {
            Trainable::Full => TrainableKind::Full,
            Trainable::FrozenEmbeddings => TrainableKind::FrozenEmbeddings,
            Trainable::Lora(_) => TrainableKind::Lora,
        }
    }
}

vocab! {
    /// A trainable set without its LoRA rank (the rank only scales the adapters).
    case = "kebab-case";
    pub enum TrainableKind {
        Full,
        FrozenEmbeddings,
        Lora,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all<T: strum::IntoEnumIterator>() -> Vec<T> {
        T::iter().collect()
    }

    /// What the torch probe writes (`{optimizer}-{impl}`) reads back as the vocabulary's
    /// implementation variant.
    #[test]
    fn torch_optimizers() {
        for o in [Optimizer::Sgd, Optimizer::Adamw] {
            for i in all::<OptimizerImpl>() {
                let t = o.torch(i);
                assert_eq!(t.to_string(), format!("{o}-{i}"));
                assert_eq!((t.is_adamw(), t.is_sgd()), (o.is_adamw(), o.is_sgd()));
                assert!(!t.is_scenario_choice() || t == Optimizer::AdamwFused);
            }
        }
        assert_eq!(Optimizer::None.torch(OptimizerImpl::Fused), Optimizer::None);
    }
}
