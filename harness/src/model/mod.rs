//! Models. The core: the [`Architecture`] trait and its registry (`arch.rs`), the normalized
//! [`Config`], model sources and weight loading (`source.rs`, `weights.rs`, `gguf/`), synthetic
//! weights, the KV cache, trainable sets and the building blocks (`nn/`). Then [`llm`], one file
//! per language-model architecture of the registry, and [`diffusion`], the generation
//! pipelines behind the [`Pipeline`](diffusion::Pipeline) trait.
pub mod arch;
pub mod config;
pub mod diffusion;
pub mod gguf;
pub mod kv;
pub mod llm;
pub mod nn;
pub mod quant;
pub mod saved;
pub mod source;
pub mod synth;
pub mod trainable;
pub mod vision;
pub mod weights;

pub use arch::{Arch, Architecture, Decoder, Encoder, InferenceModel, Role};
pub use config::Config;
pub use kv::{KvCache, KvKind};
pub use llm::llama::Llama;
pub use source::Source;
pub use trainable::Trainable;

use crate::vocab::LoraTargets;
use candle_core::DType;

/// Bytes of one element of `dtype`.
pub fn dtype_bytes(dtype: DType) -> usize {
    dtype.size_in_bytes()
}

/// Whether trainable set `set` freezes tensor `name` of `cfg`'s architecture:
/// `frozen-embeddings` the embedding tables, `lora-rN` every base weight (only the adapters,
/// named by [`nn::lora_names`], train). The one rule the training workload and the analytic
/// features share.
pub fn is_frozen(cfg: &Config, set: crate::vocab::Trainable, name: &str) -> bool {
    use crate::vocab::Trainable;
    match set {
        Trainable::Full => false,
        Trainable::FrozenEmbeddings => cfg.architecture.is_embedding(name),
        Trainable::Lora(_) | Trainable::Qlora(_) => !name.contains(".lora_"),
    }
}

/// Whether tensor `name` lies inside the decoder (or encoder) layers: its name holds a layer
/// index (`model.layers.3.…`, `h.3.…`). What is outside is FSDP's root unit and stays dense
/// under a checkpoint's quantization.
pub fn in_layer(name: &str) -> bool {
    name.split('.')
        .any(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

/// For a LoRA target weight `name` of `shape`: its module name and (in, out) features.
pub fn lora_target<'a>(
    cfg: &Config,
    name: &'a str,
    shape: &[usize],
) -> Option<(&'a str, usize, usize)> {
    lora_target_in(cfg, name, shape, LoraTargets::DEFAULT)
}

/// [`lora_target`] for the targets `targets` (the architecture's own where they are the
/// default). A stacked expert tensor (E, in, out), which peft adapts through
/// `target_parameters` with E adapters of rank r in one (A: r·E × in, B: out × r·E), counts as
/// (E·in, E·out).
pub fn lora_target_in<'a>(
    cfg: &Config,
    name: &'a str,
    shape: &[usize],
    targets: LoraTargets,
) -> Option<(&'a str, usize, usize)> {
    use crate::vocab::LoraTarget as T;
    let arch = cfg.architecture;
    if targets.is_default() {
        let module = name.strip_suffix(".weight")?;
        if !arch.lora_targets().iter().any(|t| module.ends_with(t)) {
            return None;
        }
        let (i, o) = arch.lora_in_out(shape)?;
        return Some((module, i, o));
    }
    let (module, routed) = match name.strip_suffix(".weight") {
        Some(m) => (m, m.contains(".experts.")),
        // gpt-oss's and Llama 4's stacked experts: `….experts.gate_up_proj` (E, in, out).
        None if shape.len() == 3 && name.contains(".experts.") => (name, true),
        None => return None,
    };
    let leaf = module.rsplit('.').next()?;
    let hit = |ts: &[T]| ts.iter().any(|&t| targets.contains(t));
    let wanted = match (routed, leaf) {
        (true, _) => hit(&[T::Experts]),
        (false, "q_proj" | "q_a_proj" | "q_b_proj") => hit(&[T::Q]),
        (false, "k_proj") => hit(&[T::K]),
        (false, "v_proj") => hit(&[T::V]),
        (false, "kv_a_proj_with_mqa" | "kv_b_proj") => hit(&[T::K, T::V]),
        (false, "qkv_proj") => hit(&[T::Q, T::K, T::V]),
        (false, "o_proj") => hit(&[T::O]),
        (false, "gate_proj") => hit(&[T::Gate]),
        (false, "up_proj") => hit(&[T::Up]),
        (false, "gate_up_proj") => hit(&[T::Gate, T::Up]),
        (false, "down_proj") => hit(&[T::Down]),
        _ => false,
    };
    if !wanted {
        return None;
    }
    // transformers ≥ 5 stacks per-expert checkpoints (Mixtral's w1/w3/w2, Qwen's and
    // DeepSeek's gate/up/down) at load into `gate_up_proj` (E, 2f, d) and `down_proj`: peft
    // adapts the fused gate/up with one A, so one expert's gate stands for both, (d, 2f), and
    // its up adds none.
    if routed && shape.len() == 2 {
        return match leaf {
            "gate_proj" | "w1" => Some((module, shape[1], 2 * shape[0])),
            "up_proj" | "w3" => None,
            _ => arch.lora_in_out(shape).map(|(i, o)| (module, i, o)),
        };
    }
    match shape {
        &[e, i, o] => Some((module, e * i, e * o)),
        _ => {
            let (i, o) = arch.lora_in_out(shape)?;
            Some((module, i, o))
        }
    }
}
