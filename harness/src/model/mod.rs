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
    let module = name.strip_suffix(".weight")?;
    let arch = cfg.architecture;
    if !arch.lora_targets().iter().any(|t| module.ends_with(t)) {
        return None;
    }
    let (i, o) = arch.lora_in_out(shape)?;
    Some((module, i, o))
}
