//! Models: config normalization, weight loading, and our own differentiable implementations.
pub mod config;
pub mod gguf;
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
