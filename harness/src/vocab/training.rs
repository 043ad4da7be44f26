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
        /// bitsandbytes' `AdamW8bit`: both moments as uint8 with an f32 absmax per 256
        /// elements (block-wise); tensors under 4,096 elements (`min_8bit_size`) keep f32
        /// moments. One fused kernel a tensor updates in place (estimate only).
        #[serde(rename = "adamw-8bit")]
        #[strum(serialize = "adamw-8bit")]
        #[value(name = "adamw-8bit")]
        Adamw8bit,
        /// bitsandbytes' `PagedAdamW`: f32 moments (8 B a parameter) in CUDA unified memory,
        /// which the driver may evict to the host under memory pressure (estimate only).
        PagedAdamw,
        /// bitsandbytes' `PagedAdamW8bit`: `adamw-8bit`'s state, paged as `paged-adamw`
        /// (estimate only).
        #[serde(rename = "paged-adamw-8bit")]
        #[strum(serialize = "paged-adamw-8bit")]
        #[value(name = "paged-adamw-8bit")]
        PagedAdamw8bit,
    }
}

impl Optimizer {
    /// Whether it keeps AdamW's two moments per parameter (bitsandbytes' too).
    pub fn is_adamw(&self) -> bool {
        matches!(
            self,
            Optimizer::Adamw
                | Optimizer::AdamwFused
                | Optimizer::AdamwForeach
                | Optimizer::AdamwForLoop
        ) || self.is_bitsandbytes()
    }
    /// Whether it is one of bitsandbytes' AdamW optimizers (torch only, estimate only).
    pub fn is_bitsandbytes(&self) -> bool {
        matches!(
            self,
            Optimizer::Adamw8bit | Optimizer::PagedAdamw | Optimizer::PagedAdamw8bit
        )
    }
    /// Whether its moments are 8-bit (block-wise quantized).
    pub fn is_8bit(&self) -> bool {
        matches!(self, Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit)
    }
    /// Whether its state lives in CUDA unified memory (paged to the host under pressure).
    pub fn is_paged(&self) -> bool {
        matches!(self, Optimizer::PagedAdamw | Optimizer::PagedAdamw8bit)
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
        if self.is_bitsandbytes() {
            // bitsandbytes' optimizers are their own implementation.
            return *self;
        }
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

/// What a training point updates: `full`, `frozen-embeddings`, `lora-rN` (rank-N LoRA
/// adapters on the architecture's LoRA targets, base weights frozen), or `qlora-rN` (the same
/// adapters on a base loaded by bitsandbytes in NF4 with double quantization; estimate only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Trainable {
    Full,
    FrozenEmbeddings,
    Lora(u32),
    Qlora(u32),
}

/// The largest LoRA rank a scenario may ask for.
pub const MAX_LORA_RANK: u32 = 4096;

impl std::str::FromStr for Trainable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Trainable::Full),
            "frozen-embeddings" => Ok(Trainable::FrozenEmbeddings),
            _ => {
                let (rank, set): (_, fn(u32) -> Trainable) = match s.strip_prefix("qlora-r") {
                    Some(r) => (Some(r), Trainable::Qlora),
                    None => (s.strip_prefix("lora-r"), Trainable::Lora),
                };
                match rank.map(str::parse::<u32>) {
                    Some(Ok(r)) if (1..=MAX_LORA_RANK).contains(&r) => Ok(set(r)),
                    Some(_) => Err(format!(
                        "LoRA rank in `{s}` must be an integer from 1 to {MAX_LORA_RANK}"
                    )),
                    None => Err(format!(
                        "unknown trainable set `{s}`, expected `full`, `frozen-embeddings`, `lora-rN` or `qlora-rN` (e.g. `lora-r8`)"
                    )),
                }
            }
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
            Trainable::Qlora(r) => write!(f, "qlora-r{r}"),
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
            Trainable::Qlora(_) => TrainableKind::Qlora,
        }
    }

    /// The rank of its LoRA adapters (`lora-rN` and `qlora-rN`), if any.
    pub fn lora_rank(&self) -> Option<u32> {
        match self {
            Trainable::Lora(r) | Trainable::Qlora(r) => Some(*r),
            Trainable::Full | Trainable::FrozenEmbeddings => None,
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
        /// LoRA on a bitsandbytes NF4 base (estimate only).
        Qlora,
    }
}

vocab! {
    /// A kind of module LoRA adapts (`--lora-targets`), by what it does in a decoder layer.
    case = "lowercase";
    pub enum LoraTarget {
        /// The query projection (`q_proj`; MLA's `q_a_proj` and `q_b_proj`; a fused `qkv_proj`).
        Q,
        /// The key projection (`k_proj`; MLA's `kv_a_proj_with_mqa` and `kv_b_proj`).
        K,
        /// The value projection (`v_proj`; MLA's KV projections).
        V,
        /// The attention's output projection (`o_proj`).
        O,
        /// The gate projection of a dense MLP or a shared expert (`gate_proj`, a fused
        /// `gate_up_proj`).
        Gate,
        /// The up projection of a dense MLP or a shared expert.
        Up,
        /// The down projection of a dense MLP or a shared expert.
        Down,
        /// Every routed expert's projections (peft's `target_parameters` on the stacked expert
        /// tensors of transformers ≥ 5).
        Experts,
    }
}

/// The modules LoRA adapts: a set of [`LoraTarget`]s, or empty for the architecture's
/// default (peft's: the query and value projections of the llama family).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LoraTargets(u8);

serde_as_text!(LoraTargets);

impl LoraTargets {
    /// The architecture's default (peft's `target_modules=None`).
    pub const DEFAULT: LoraTargets = LoraTargets(0);

    /// Whether this is the architecture's default.
    pub fn is_default(self) -> bool {
        self.0 == 0
    }

    /// Whether `t` is in the set (never for the default, which the architecture names).
    pub fn contains(self, t: LoraTarget) -> bool {
        self.0 & (1 << t as u8) != 0
    }

    /// The targets in the set, in the vocabulary's order.
    pub fn iter(self) -> impl Iterator<Item = LoraTarget> {
        use strum::IntoEnumIterator;
        LoraTarget::iter().filter(move |&t| self.contains(t))
    }

    fn of(targets: &[LoraTarget]) -> Self {
        LoraTargets(targets.iter().fold(0, |m, &t| m | (1 << t as u8)))
    }
}

impl std::str::FromStr for LoraTargets {
    type Err = String;
    /// `peft` (the default), `attention` (q,k,v,o), `all-linear` (q,k,v,o,gate,up,down), or a
    /// comma list of targets (`q,k,v,o,experts`); the groups combine with targets
    /// (`all-linear,experts`).
    fn from_str(s: &str) -> Result<Self, String> {
        use LoraTarget::*;
        let mut set = Vec::new();
        for word in s.split(',').map(str::trim) {
            match word {
                "peft" | "default" if s.trim() == word => return Ok(LoraTargets::DEFAULT),
                "attention" => set.extend([Q, K, V, O]),
                "all-linear" => set.extend([Q, K, V, O, Gate, Up, Down]),
                w => set.push(w.parse().map_err(|_| {
                    format!(
                        "unknown LoRA target `{w}` (known: peft, attention, all-linear, q, k, v, \
                         o, gate, up, down, experts)"
                    )
                })?),
            }
        }
        Ok(LoraTargets::of(&set))
    }
}

impl std::fmt::Display for LoraTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_default() {
            return f.write_str("peft");
        }
        let words: Vec<String> = self.iter().map(|t| t.to_string()).collect();
        f.write_str(&words.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_targets_read_and_write_back() {
        let t: LoraTargets = "all-linear,experts".parse().unwrap();
        assert_eq!(t.to_string(), "q,k,v,o,gate,up,down,experts");
        assert_eq!(t.to_string().parse::<LoraTargets>(), Ok(t));
        let qv: LoraTargets = "v, q".parse().unwrap();
        assert!(qv.contains(LoraTarget::Q) && !qv.contains(LoraTarget::K));
        assert_eq!("peft".parse::<LoraTargets>(), Ok(LoraTargets::DEFAULT));
        assert!("q,wq".parse::<LoraTargets>().unwrap_err().contains("`wq`"));
    }

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
