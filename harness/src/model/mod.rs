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

use crate::scenario::spec::Ops;
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

/// Whether trainable set `set` freezes tensor `name`: `frozen-embeddings` the embedding tables,
/// `lora-rN` every base weight (only the adapters, named by [`nn::lora_names`], train). The one rule
/// the training workload and the analytic features share.
pub fn is_frozen(set: crate::scenario::spec::Trainable, name: &str) -> bool {
    use crate::scenario::spec::Trainable;
    match set {
        Trainable::Full => false,
        Trainable::FrozenEmbeddings => is_embedding(name),
        Trainable::Lora(_) => !name.contains(".lora_"),
    }
}

/// The modules LoRA adapts, PEFT's defaults per architecture: the attention's query and value
/// projections (GPT-2's fused `c_attn`).
pub fn lora_targets(arch: Architecture) -> &'static [&'static str] {
    match arch {
        Architecture::Llama => &["self_attn.q_proj", "self_attn.v_proj"],
        Architecture::Gpt2 => &["attn.c_attn"],
        Architecture::Bert => &["attention.self.query", "attention.self.value"],
    }
}

/// For a LoRA target weight `name` of `shape`: its module name and (in, out) features.
/// GPT-2's Conv1D weights are stored (in, out), the others (out, in).
pub fn lora_target<'a>(
    arch: Architecture,
    name: &'a str,
    shape: &[usize],
) -> Option<(&'a str, usize, usize)> {
    let module = name.strip_suffix(".weight")?;
    if !lora_targets(arch).iter().any(|t| module.ends_with(t)) {
        return None;
    }
    match (arch, shape) {
        (Architecture::Gpt2, &[i, o]) => Some((module, i, o)),
        (_, &[o, i]) => Some((module, i, o)),
        _ => None,
    }
}

/// Builds the model of `cfg`'s architecture for training from HF-named tensors, running the
/// op implementations `ops` (fused kernels and flash attention: llama family only so far).
pub fn build_trainable(
    cfg: &Config,
    tensors: std::collections::HashMap<String, candle_core::Tensor>,
    compute: DType,
    ops: Ops,
) -> anyhow::Result<Box<dyn Trainable>> {
    if cfg.architecture != Architecture::Llama && ops != Ops::default() {
        anyhow::bail!(
            "kernels = \"{}\" / attention = \"{}\": only the llama family runs vramlab-kernels so far ({} uses reference + eager)",
            ops.kernels.as_str(),
            ops.attention.as_str(),
            cfg.architecture.as_str()
        );
    }
    Ok(match cfg.architecture {
        Architecture::Llama => Box::new(Llama::new(cfg, tensors, compute)?.with_ops(ops)),
        Architecture::Gpt2 => Box::new(gpt2::Gpt2::new(cfg, tensors, compute)?),
        Architecture::Bert => Box::new(bert::Bert::new(cfg, tensors, compute)?),
    })
}
