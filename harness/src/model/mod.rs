//! Models: config normalization, weight loading, and our own differentiable implementations.
pub mod bert;
pub mod config;
pub mod gguf;
pub mod gpt2;
pub mod kv;
pub mod llama;
pub mod nn;
pub mod source;
pub mod synth;
pub mod trainable;
pub mod weights;

pub use config::{Architecture, Config};
pub use kv::{KvCache, KvKind};
pub use llama::Llama;
pub use source::Source;
pub use trainable::Trainable;

use candle_core::DType;

/// Bytes of one element of `dtype`.
pub fn dtype_bytes(dtype: DType) -> usize {
    dtype.size_in_bytes()
}

/// Embedding tables (what `trainable = "frozen-embeddings"` freezes): token, position and
/// token-type embeddings. A tied LM head is the token embedding, so it freezes with it.
pub fn is_embedding(name: &str) -> bool {
    name.contains("embed") || name.starts_with("wte.") || name.starts_with("wpe.")
}

/// Builds the model of `cfg`'s architecture for training from HF-named tensors.
pub fn build_trainable(
    cfg: &Config,
    tensors: std::collections::HashMap<String, candle_core::Tensor>,
    compute: DType,
) -> anyhow::Result<Box<dyn Trainable>> {
    Ok(match cfg.architecture {
        Architecture::Llama => Box::new(Llama::new(cfg, tensors, compute)?),
        Architecture::Gpt2 => Box::new(gpt2::Gpt2::new(cfg, tensors, compute)?),
        Architecture::Bert => Box::new(bert::Bert::new(cfg, tensors, compute)?),
    })
}
