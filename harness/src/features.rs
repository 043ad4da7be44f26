//! Analytic features of a point and phase, computed from the normalized [`Config`] alone
//! (ARCHITECTURE.md §9). They fill the `feature_*` CSV columns; `fit` regresses on them.
use crate::checked::{Checked, Overflow};
use crate::model::{Config, KvKind};
use crate::record::Phase;
use crate::vocab::{LoraTargets, Trainable};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// Parameter storage bytes at the point's precision (exact).
    pub weight_bytes: u64,
    /// KV bytes the cache holds at the end of the phase: capacity tokens for `preallocated`,
    /// live tokens for `growing`.
    pub kv_bytes: u64,
    /// Activation term b · s · hidden · layers · bytes, with s the tokens the phase processes.
    pub act_bytes: u64,
    /// Logits b · s_out · vocab · bytes (inference computes the last position only).
    pub logits_bytes: u64,
    /// Optimizer state bytes (zero for inference).
    pub optimizer_bytes: u64,
}

/// What [`infer`] needs to know about an inference point.
#[derive(Clone, Copy, Debug)]
pub struct InferShape {
    pub batch: usize,
    pub context: usize,
    pub prompt_len: usize,
    pub kv: KvKind,
    pub kv_window: crate::model::config::KvWindow,
    pub dtype_bytes: usize,
    /// What a multi-head latent attention layer caches (the runtime's choice).
    pub mla: crate::model::config::MlaCache,
}

impl Features {
    /// The features of checked figures, or the [`Overflow`] of the first that exceeds 64 bits.
    fn checked(
        weight: Checked,
        kv: Checked,
        act: Checked,
        logits: Checked,
        optimizer: Checked,
    ) -> Result<Features, Overflow> {
        Ok(Features {
            weight_bytes: weight.bytes("weights")?,
            kv_bytes: kv.bytes("KV cache")?,
            act_bytes: act.bytes("activations")?,
            logits_bytes: logits.bytes("logits")?,
            optimizer_bytes: optimizer.bytes("optimizer state")?,
        })
    }

    /// The `load` phase's features: the weights alone.
    fn load(weight: Checked) -> Result<Features, Overflow> {
        Ok(Features {
            weight_bytes: weight.bytes("weights")?,
            ..Default::default()
        })
    }
}

/// Features of an inference phase. `kv_tokens` is the live token count at the phase's end
/// (what the cache holds: at most a capped window). An overflow: a figure past 2^64 B.
pub fn infer(
    cfg: &Config,
    p: &InferShape,
    phase: Phase,
    kv_tokens: usize,
) -> Result<Features, Overflow> {
    let (b, w) = (Checked::from(p.batch), p.dtype_bytes);
    let weight = Checked::from(counts(cfg, Trainable::Full)?.params) * w;
    if phase == Phase::Load {
        return Features::load(weight);
    }
    let held = match p.kv {
        KvKind::Preallocated => p.context,
        KvKind::Growing => kv_tokens,
    };
    let s = match phase {
        Phase::Decode => 1,
        _ => p.prompt_len,
    };
    Features::checked(
        weight,
        cfg.kv_bytes(held, p.kv_window, p.dtype_bytes, p.mla) * b,
        b * s * cfg.hidden_size * cfg.num_layers * w,
        b * cfg.vocab_size * w,
        Checked::ZERO,
    )
}

/// Features of an encoder's phase (`mode = "encode"`): one forward over `batch` sequences of
/// `seq` tokens, no cache and no LM head.
pub fn encode(
    cfg: &Config,
    batch: usize,
    seq: usize,
    dtype_bytes: usize,
    phase: Phase,
) -> Result<Features, Overflow> {
    let weight = cfg.params() * dtype_bytes;
    if phase == Phase::Load {
        return Features::load(weight);
    }
    let act = Checked::from(batch) * seq * cfg.hidden_size * cfg.num_layers * dtype_bytes;
    Features::checked(weight, Checked::ZERO, act, Checked::ZERO, Checked::ZERO)
}

/// What [`train`] needs to know about a training point.
#[derive(Clone, Copy, Debug)]
pub struct TrainShape {
    pub batch: usize,
    pub seq: usize,
    /// Bytes of the variables (weights, gradients, optimizer state).
    pub weight_bytes: usize,
    /// Bytes of the compute dtype (activations).
    pub compute_bytes: usize,
    pub adamw: bool,
    pub trainable: Trainable,
    /// The modules LoRA adapts (`--lora-targets`).
    pub targets: LoraTargets,
}

/// Parameters of the LoRA adapters a trainable set adds: rank · (in + out) per target module
/// (zero unless `lora-rN`).
pub fn adapter_params(cfg: &Config, trainable: Trainable) -> Result<u64, Overflow> {
    Ok(counts(cfg, trainable)?.adapters)
}

/// Parameters the optimizer updates.
pub fn trainable_params(cfg: &Config, trainable: Trainable) -> Result<u64, Overflow> {
    Ok(counts(cfg, trainable)?.trainable)
}

/// The parameter counts of a config under a trainable set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Every stored parameter ([`Config::param_count`]).
    pub params: u64,
    /// Parameters the optimizer updates, adapters included.
    pub trainable: u64,
    /// LoRA adapter parameters (zero unless `lora-rN`).
    pub adapters: u64,
    /// Elements of the largest stored tensor.
    pub largest_tensor: u64,
    /// Parameters outside the decoder layers (embeddings, final norm, an untied head): the
    /// tensors whose name holds no layer index. FSDP's root unit.
    pub outside_layers: u64,
}

/// Counts of `cfg` under `trainable`, from the tensor list ([`Config::tensor_shapes`]). The
/// list names every tensor (~100 µs for an 8B model) and `estimate`'s searches ask for one
/// config hundreds of times, so each thread remembers the last few answers. The memo holds
/// no heap memory (a sweep measures this process's allocations): it is keyed by a 64-bit
/// hash of the whole config's `Debug` form (every field, so a changed field is a new key)
/// and the trainable set. An overflow: a config whose counts exceed 64 bits.
pub fn counts(cfg: &Config, trainable: Trainable) -> Result<Counts, Overflow> {
    counts_in(cfg, trainable, LoraTargets::DEFAULT)
}

/// [`counts`] with LoRA adapters on `targets` (`--lora-targets`).
pub fn counts_in(
    cfg: &Config,
    trainable: Trainable,
    targets: LoraTargets,
) -> Result<Counts, Overflow> {
    use std::hash::{Hash, Hasher};
    struct HashWrite<'a>(&'a mut std::hash::DefaultHasher);
    impl std::fmt::Write for HashWrite<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    const SLOTS: usize = 8;
    // `None`: the counts overflow.
    type Memo = [Option<(u64, Option<Counts>)>; SLOTS];
    thread_local!(static MEMO: std::cell::Cell<Memo> = const { std::cell::Cell::new([None; SLOTS]) });
    let mut h = std::hash::DefaultHasher::new();
    std::fmt::write(&mut HashWrite(&mut h), format_args!("{cfg:?}")).expect("hashing cannot fail");
    trainable.hash(&mut h);
    targets.hash(&mut h);
    let key = h.finish();
    let mut memo = MEMO.get();
    let overflow = || Overflow::new("parameter count");
    if let Some((_, c)) = memo.iter().flatten().find(|(k, _)| *k == key) {
        return c.ok_or_else(overflow);
    }
    let shapes = cfg.tensor_shapes();
    let adapters = match trainable {
        Trainable::Lora(r) | Trainable::Qlora(r) => shapes
            .iter()
            .filter_map(|(n, s)| crate::model::lora_target_in(cfg, n, s, targets))
            .map(|(_, i, o)| (Checked::from(i) + o) * u64::from(r))
            .sum(),
        _ => Checked::ZERO,
    };
    let trainable_base: Checked = shapes
        .iter()
        .filter(|(n, _)| !crate::model::is_frozen(cfg, trainable, n))
        .map(|(_, s)| Checked::product(s))
        .sum();
    let largest = shapes
        .iter()
        .map(|(_, s)| Checked::product(s))
        .fold(Checked::ZERO, Checked::max);
    // A decoder layer's tensors have the layer's index in their name (model.layers.3.…).
    let outside: Checked = shapes
        .iter()
        .filter(|(n, _)| !crate::model::in_layer(n))
        .map(|(_, s)| Checked::product(s))
        .sum();
    let c = (|| {
        Some(Counts {
            params: cfg.params().get()?,
            trainable: (trainable_base + adapters).get()?,
            adapters: adapters.get()?,
            largest_tensor: largest.get()?,
            outside_layers: outside.get()?,
        })
    })();
    memo.rotate_right(1);
    memo[0] = Some((key, c));
    MEMO.set(memo);
    c.ok_or_else(overflow)
}

/// Features of a training phase (the same for each of a step's phases, except `load`).
/// `weight_bytes` counts LoRA adapters with the base weights.
pub fn train(cfg: &Config, p: &TrainShape, phase: Phase) -> Result<Features, Overflow> {
    let n = counts_in(cfg, p.trainable, p.targets)?;
    let weight = (Checked::from(n.params) + n.adapters) * p.weight_bytes;
    if phase == Phase::Load {
        return Features::load(weight);
    }
    let (bs, c) = (Checked::from(p.batch) * p.seq, p.compute_bytes);
    Features::checked(
        weight,
        Checked::ZERO,
        bs * cfg.hidden_size * cfg.num_layers * c,
        bs * cfg.vocab_size * c,
        if p.adamw {
            Checked::new(2) * n.trainable * p.weight_bytes
        } else {
            Checked::ZERO
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        let v = serde_json::json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "max_position_embeddings": 8192, "tie_word_embeddings": true});
        Config::from_json(std::path::Path::new("c"), &v).unwrap()
    }

    #[test]
    fn hand_computed() {
        let c = cfg();
        let shape = InferShape {
            batch: 2,
            context: 128,
            prompt_len: 100,
            kv: KvKind::Preallocated,
            kv_window: Default::default(),
            dtype_bytes: 4,
            mla: Default::default(),
        };
        let f = infer(&c, &shape, Phase::Prefill, 100).unwrap();
        assert_eq!(f.weight_bytes, 134_515_008 * 4);
        assert_eq!(f.kv_bytes, 46_080 * 128 * 2);
        assert_eq!(f.act_bytes, 2 * 100 * 576 * 30 * 4);
        assert_eq!(f.logits_bytes, 2 * 49_152 * 4);
        let g = infer(
            &c,
            &InferShape {
                kv: KvKind::Growing,
                ..shape
            },
            Phase::Decode,
            107,
        )
        .unwrap();
        assert_eq!(g.kv_bytes, 46_080 * 107 * 2);
        assert_eq!(g.act_bytes, 2 * 576 * 30 * 4);
        assert_eq!(infer(&c, &shape, Phase::Load, 0).unwrap().kv_bytes, 0);
    }

    #[test]
    fn counts_follow_every_change_of_the_config() {
        let c = cfg();
        let full = counts(&c, Trainable::Full).unwrap();
        assert_eq!(full.params, 134_515_008);
        assert_eq!(full.trainable, full.params);
        assert_eq!(full.largest_tensor, 49_152 * 576);
        // A config one field away is counted afresh, not served from the memo.
        let deeper = Config {
            num_layers: 31,
            ..c.clone()
        };
        // One more layer: two norms, q and o (576²), k and v (192 · 576), the MLP (3 · 576 · 1536).
        let layer = 2 * 576 + 2 * 576 * 576 + 2 * 192 * 576 + 3 * 576 * 1536;
        assert_eq!(
            counts(&deeper, Trainable::Full).unwrap().params,
            full.params + layer
        );
        let r2 = counts(&c, Trainable::Lora(2)).unwrap();
        assert_eq!(r2.adapters, 30 * 2 * (576 + 576 + 576 + 192));
        assert_eq!((r2.trainable, r2.params), (r2.adapters, full.params));
        assert_eq!(counts(&c, Trainable::Full), Ok(full));
    }

    #[test]
    fn training_features_by_hand() {
        let c = cfg();
        let t = TrainShape {
            batch: 2,
            seq: 64,
            weight_bytes: 4,
            compute_bytes: 2,
            adamw: true,
            trainable: Trainable::Full,
            targets: LoraTargets::DEFAULT,
        };
        let f = train(&c, &t, Phase::Backward).unwrap();
        assert_eq!(f.optimizer_bytes, 2 * 134_515_008 * 4);
        assert_eq!(f.logits_bytes, 2 * 64 * 49_152 * 2);
        let frozen = train(
            &c,
            &TrainShape {
                trainable: Trainable::FrozenEmbeddings,
                ..t
            },
            Phase::Backward,
        )
        .unwrap();
        assert_eq!(frozen.optimizer_bytes, 2 * (134_515_008 - 49_152 * 576) * 4);
        let sgd = train(&c, &TrainShape { adamw: false, ..t }, Phase::Optimizer).unwrap();
        assert_eq!(sgd.optimizer_bytes, 0);
        // LoRA r8 on q (576→576) and v (576→192) of 30 layers: 8·(576+576 + 576+192) each.
        let lora = TrainShape {
            trainable: Trainable::Lora(8),
            ..t
        };
        let adapters = 30 * 8 * (576 + 576 + 576 + 192);
        assert_eq!(adapter_params(&c, lora.trainable), Ok(adapters));
        let f = train(&c, &lora, Phase::Optimizer).unwrap();
        assert_eq!(f.optimizer_bytes, 2 * adapters * 4);
        assert_eq!(f.weight_bytes, (134_515_008 + adapters) * 4);
    }

    /// Figures past 2^64 B are an overflow naming the figure, never a wrapped or saturated
    /// value; counts of a config beyond `Config::validate`'s bounds overflow too.
    #[test]
    fn figures_past_64_bits_overflow() {
        let c = cfg();
        let shape = InferShape {
            batch: usize::MAX,
            context: 128,
            prompt_len: 100,
            kv: KvKind::Preallocated,
            kv_window: Default::default(),
            dtype_bytes: 2,
            mla: Default::default(),
        };
        let e = infer(&c, &shape, Phase::Prefill, 100).unwrap_err();
        assert_eq!(e.figure, "KV cache");
        // The weights alone still fit.
        assert!(infer(&c, &shape, Phase::Load, 0).is_ok());
        let t = TrainShape {
            batch: 1 << 40,
            seq: 1 << 20,
            weight_bytes: 4,
            compute_bytes: 2,
            adamw: true,
            trainable: Trainable::Full,
            targets: LoraTargets::DEFAULT,
        };
        assert_eq!(
            train(&c, &t, Phase::Forward).unwrap_err().figure,
            "activations"
        );
        assert_eq!(
            encode(&c, 1 << 40, 1 << 20, 4, Phase::Forward)
                .unwrap_err()
                .figure,
            "activations"
        );
        let huge = Config {
            hidden_size: 1 << 40,
            intermediate_size: 1 << 40,
            head_dim: 1 << 34,
            ..c.clone()
        };
        assert_eq!(
            counts(&huge, Trainable::Full).unwrap_err().figure,
            "parameter count"
        );
        // The memo remembers the overflow, too.
        assert!(counts(&huge, Trainable::Full).is_err());
        assert!(huge.params().is_overflow());
        let kv_heads = Config {
            num_kv_heads: 1 << 62,
            ..c
        };
        assert!(kv_heads.kv_bytes_per_token(2).is_overflow());
    }
}
