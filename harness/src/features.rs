//! Analytic features of a point and phase, computed from the normalized [`Config`] alone
//! (ARCHITECTURE.md §9). They fill the `feature_*` CSV columns; `fit` regresses on them.
use crate::model::{Config, KvKind};
use crate::record::Phase;
use crate::vocab::Trainable;

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
}

/// Features of an inference phase. `kv_tokens` is the live token count at the phase's end
/// (what the cache holds: at most a capped window).
pub fn infer(cfg: &Config, p: &InferShape, phase: Phase, kv_tokens: usize) -> Features {
    let (b, w) = (p.batch as u64, p.dtype_bytes as u64);
    let weight_bytes = counts(cfg, Trainable::Full).params * w;
    if phase == Phase::Load {
        return Features {
            weight_bytes,
            ..Default::default()
        };
    }
    let held = match p.kv {
        KvKind::Preallocated => cfg.kv_tokens_held(p.context, p.kv_window),
        KvKind::Growing => cfg.kv_tokens_held(kv_tokens, p.kv_window),
    } as u64;
    let s = match phase {
        Phase::Decode => 1,
        _ => p.prompt_len as u64,
    };
    Features {
        weight_bytes,
        kv_bytes: cfg.kv_bytes_per_token(p.dtype_bytes) * held * b,
        act_bytes: b * s * (cfg.hidden_size * cfg.num_layers) as u64 * w,
        logits_bytes: b * cfg.vocab_size as u64 * w,
        optimizer_bytes: 0,
    }
}

/// Features of an encoder's phase (`mode = "encode"`): one forward over `batch` sequences of
/// `seq` tokens, no cache and no LM head.
pub fn encode(
    cfg: &Config,
    batch: usize,
    seq: usize,
    dtype_bytes: usize,
    phase: Phase,
) -> Features {
    let w = dtype_bytes as u64;
    let weight_bytes = cfg.param_count() * w;
    if phase == Phase::Load {
        return Features {
            weight_bytes,
            ..Default::default()
        };
    }
    Features {
        weight_bytes,
        act_bytes: (batch * seq * cfg.hidden_size * cfg.num_layers) as u64 * w,
        ..Default::default()
    }
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
}

/// Parameters of the LoRA adapters a trainable set adds: rank · (in + out) per target module
/// (zero unless `lora-rN`).
pub fn adapter_params(cfg: &Config, trainable: Trainable) -> u64 {
    counts(cfg, trainable).adapters
}

/// Parameters the optimizer updates.
pub fn trainable_params(cfg: &Config, trainable: Trainable) -> u64 {
    counts(cfg, trainable).trainable
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
}

/// Counts of `cfg` under `trainable`, from the tensor list ([`Config::tensor_shapes`]). The
/// list names every tensor (~100 µs for an 8B model) and `estimate`'s searches ask for one
/// config hundreds of times, so each thread remembers the last few answers. The memo holds
/// no heap memory (a sweep measures this process's allocations): it is keyed by a 64-bit
/// hash of the whole config's `Debug` form (every field, so a changed field is a new key)
/// and the trainable set.
pub fn counts(cfg: &Config, trainable: Trainable) -> Counts {
    use std::hash::{Hash, Hasher};
    struct HashWrite<'a>(&'a mut std::hash::DefaultHasher);
    impl std::fmt::Write for HashWrite<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    const SLOTS: usize = 8;
    type Memo = [Option<(u64, Counts)>; SLOTS];
    thread_local!(static MEMO: std::cell::Cell<Memo> = const { std::cell::Cell::new([None; SLOTS]) });
    let mut h = std::hash::DefaultHasher::new();
    std::fmt::write(&mut HashWrite(&mut h), format_args!("{cfg:?}")).expect("hashing cannot fail");
    trainable.hash(&mut h);
    let key = h.finish();
    let mut memo = MEMO.get();
    if let Some((_, c)) = memo.iter().flatten().find(|(k, _)| *k == key) {
        return *c;
    }
    let shapes = cfg.tensor_shapes();
    let size = |s: &[usize]| s.iter().product::<usize>() as u64;
    let adapters = match trainable {
        Trainable::Lora(r) => shapes
            .iter()
            .filter_map(|(n, s)| crate::model::lora_target(cfg, n, s))
            .map(|(_, i, o)| r as u64 * (i + o) as u64)
            .sum(),
        _ => 0,
    };
    let c = Counts {
        params: cfg.param_count(),
        trainable: shapes
            .iter()
            .filter(|(n, _)| !crate::model::is_frozen(cfg, trainable, n))
            .map(|(_, s)| size(s))
            .sum::<u64>()
            + adapters,
        adapters,
        largest_tensor: shapes.iter().map(|(_, s)| size(s)).max().unwrap_or(0),
    };
    memo.rotate_right(1);
    memo[0] = Some((key, c));
    MEMO.set(memo);
    c
}

/// Features of a training phase (the same for each of a step's phases, except `load`).
/// `weight_bytes` counts LoRA adapters with the base weights.
pub fn train(cfg: &Config, p: &TrainShape, phase: Phase) -> Features {
    let n = counts(cfg, p.trainable);
    let weight_bytes = (n.params + n.adapters) * p.weight_bytes as u64;
    if phase == Phase::Load {
        return Features {
            weight_bytes,
            ..Default::default()
        };
    }
    let (b, s, c) = (p.batch as u64, p.seq as u64, p.compute_bytes as u64);
    Features {
        weight_bytes,
        kv_bytes: 0,
        act_bytes: b * s * (cfg.hidden_size * cfg.num_layers) as u64 * c,
        logits_bytes: b * s * cfg.vocab_size as u64 * c,
        optimizer_bytes: if p.adamw {
            2 * n.trainable * p.weight_bytes as u64
        } else {
            0
        },
    }
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
        };
        let f = infer(&c, &shape, Phase::Prefill, 100);
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
        );
        assert_eq!(g.kv_bytes, 46_080 * 107 * 2);
        assert_eq!(g.act_bytes, 2 * 576 * 30 * 4);
        assert_eq!(infer(&c, &shape, Phase::Load, 0).kv_bytes, 0);
    }

    #[test]
    fn counts_follow_every_change_of_the_config() {
        let c = cfg();
        let full = counts(&c, Trainable::Full);
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
        assert_eq!(counts(&deeper, Trainable::Full).params, full.params + layer);
        let r2 = counts(&c, Trainable::Lora(2));
        assert_eq!(r2.adapters, 30 * 2 * (576 + 576 + 576 + 192));
        assert_eq!((r2.trainable, r2.params), (r2.adapters, full.params));
        assert_eq!(counts(&c, Trainable::Full), full);
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
        };
        let f = train(&c, &t, Phase::Backward);
        assert_eq!(f.optimizer_bytes, 2 * 134_515_008 * 4);
        assert_eq!(f.logits_bytes, 2 * 64 * 49_152 * 2);
        let frozen = train(
            &c,
            &TrainShape {
                trainable: Trainable::FrozenEmbeddings,
                ..t
            },
            Phase::Backward,
        );
        assert_eq!(frozen.optimizer_bytes, 2 * (134_515_008 - 49_152 * 576) * 4);
        let sgd = train(&c, &TrainShape { adamw: false, ..t }, Phase::Optimizer);
        assert_eq!(sgd.optimizer_bytes, 0);
        // LoRA r8 on q (576→576) and v (576→192) of 30 layers: 8·(576+576 + 576+192) each.
        let lora = TrainShape {
            trainable: Trainable::Lora(8),
            ..t
        };
        let adapters = 30 * 8 * (576 + 576 + 576 + 192);
        assert_eq!(adapter_params(&c, lora.trainable), adapters);
        let f = train(&c, &lora, Phase::Optimizer);
        assert_eq!(f.optimizer_bytes, 2 * adapters * 4);
        assert_eq!(f.weight_bytes, (134_515_008 + adapters) * 4);
    }
}
