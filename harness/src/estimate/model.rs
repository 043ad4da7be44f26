//! What `estimate` needs to know about a model: its shape, from a preset, an HF directory, a
//! `config.json` or a GGUF file. The llama family goes through the normalized [`Config`];
//! Every architecture goes through the normalized `Config` (llama family, gpt2, bert).
use crate::error::{bad_file, InputError};
use crate::model::{gguf, Config};
use crate::vocab::Trainable;
use anyhow::Result;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// Built-in presets: published `config.json` files (harness/presets/NAME/config.json).
pub const PRESETS: &[(&str, &str)] = &[
    ("gpt2", include_str!("../../presets/gpt2/config.json")),
    (
        "llama-3.1-8b",
        include_str!("../../presets/llama-3.1-8b/config.json"),
    ),
    (
        "llama-3.2-1b",
        include_str!("../../presets/llama-3.2-1b/config.json"),
    ),
    (
        "mistral-7b-v0.1",
        include_str!("../../presets/mistral-7b-v0.1/config.json"),
    ),
    (
        "qwen2.5-0.5b",
        include_str!("../../presets/qwen2.5-0.5b/config.json"),
    ),
    (
        "qwen2.5-7b",
        include_str!("../../presets/qwen2.5-7b/config.json"),
    ),
    (
        "smollm2-1.7b",
        include_str!("../../presets/smollm2-1.7b/config.json"),
    ),
    (
        "smollm2-135m",
        include_str!("../../presets/smollm2-135m/config.json"),
    ),
    (
        "tinyllama-1.1b",
        include_str!("../../presets/tinyllama-1.1b/config.json"),
    ),
    (
        "qwen3-0.6b",
        include_str!("../../presets/qwen3-0.6b/config.json"),
    ),
    (
        "phi-3-mini-4k",
        include_str!("../../presets/phi-3-mini-4k/config.json"),
    ),
    (
        "starcoderbase-1b",
        include_str!("../../presets/starcoderbase-1b/config.json"),
    ),
    (
        "starcoder-15.5b",
        include_str!("../../presets/starcoder-15.5b/config.json"),
    ),
];

/// The shape facts every formula uses. Sizes are element counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shape {
    pub name: String,
    /// `llama` (llama, mistral, qwen2), `gpt2` or `bert`.
    pub architecture: String,
    pub params: u64,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub vocab: u64,
    pub max_position: u64,
    /// Parameters of the embedding tables (what `frozen-embeddings` freezes).
    pub embedding_params: u64,
    /// Parameters of rank-1 LoRA adapters on the query and value projections (`lora-rN`
    /// adds N times this).
    pub lora_params_per_rank: u64,
}

impl Shape {
    pub fn from_config(name: &str, c: &Config) -> Shape {
        Shape {
            name: name.to_string(),
            architecture: c.architecture.name().to_string(),
            params: c.param_count(),
            layers: c.num_layers as u64,
            hidden: c.hidden_size as u64,
            heads: c.num_heads as u64,
            kv_heads: c.num_kv_heads as u64,
            head_dim: c.head_dim as u64,
            ffn: c.intermediate_size as u64,
            vocab: c.vocab_size as u64,
            max_position: c.max_position_embeddings as u64,
            embedding_params: c.param_count()
                - crate::features::trainable_params(c, Trainable::FrozenEmbeddings),
            lora_params_per_rank: crate::features::adapter_params(c, Trainable::Lora(1)),
        }
    }

    /// Parameters a trainable set updates, and the adapter parameters it adds.
    pub fn trainable_params(&self, set: Trainable) -> (u64, u64) {
        match set {
            Trainable::Full => (self.params, 0),
            Trainable::FrozenEmbeddings => (self.params - self.embedding_params, 0),
            Trainable::Lora(r) => {
                let a = r as u64 * self.lora_params_per_rank;
                (a, a)
            }
        }
    }

    /// Parses a `config.json` value.
    pub fn from_json(name: &str, path: &Path, v: &Value) -> Result<Shape> {
        Ok(Self::from_config(name, &Config::from_json(path, v)?))
    }

    /// K and V bytes per token of one sequence.
    pub fn kv_bytes_per_token(&self, dtype_bytes: u64) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes
    }
}

/// Resolves `--model`: an existing HF directory, `config.json` or `.gguf` file, or a preset
/// name (with or without a leading `presets/`).
pub fn resolve(spec: &str) -> Result<Shape> {
    let p = Path::new(spec);
    if p.exists() {
        let file = if p.is_dir() {
            p.join("config.json")
        } else {
            p.to_path_buf()
        };
        let name = if p.is_dir() {
            p
        } else {
            p.parent().filter(|d| d.file_name().is_some()).unwrap_or(p)
        }
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| spec.to_string());
        if file.extension().is_some_and(|e| e == "gguf") {
            return Ok(Shape::from_config(&name, &gguf::config(&file)?));
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| bad_file(&file, format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(&file, format!("not valid JSON: {e}")))?;
        return Shape::from_json(&name, &file, &v);
    }
    let key = spec
        .trim_end_matches('/')
        .trim_end_matches("/config.json")
        .trim_start_matches("presets/")
        .to_ascii_lowercase();
    match PRESETS.iter().find(|(n, _)| *n == key) {
        Some((n, text)) => {
            let v: Value = serde_json::from_str(text).expect("built-in presets are valid JSON");
            Shape::from_json(n, Path::new(&format!("presets/{n}/config.json")), &v)
        }
        None => Err(InputError::arg(format!(
            "--model `{spec}` is neither a file, a directory nor a preset (presets: {})",
            PRESETS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses() {
        for (n, _) in PRESETS {
            let s = resolve(n).unwrap();
            assert!(s.params > 100_000_000, "{n}: {}", s.params);
        }
    }

    #[test]
    fn published_parameter_counts() {
        // Hand-computed from the published shapes (and the counts their model cards give).
        let count = |n: &str| resolve(n).unwrap().params;
        assert_eq!(count("gpt2"), 124_439_808);
        assert_eq!(count("llama-3.1-8b"), 8_030_261_248);
        assert_eq!(count("llama-3.2-1b"), 1_235_814_400);
        assert_eq!(count("mistral-7b-v0.1"), 7_241_732_096);
        assert_eq!(count("tinyllama-1.1b"), 1_100_048_384);
        assert_eq!(count("qwen2.5-0.5b"), 494_032_768);
        assert_eq!(count("qwen2.5-7b"), 7_615_616_512);
        assert_eq!(count("smollm2-1.7b"), 1_711_376_384);
        assert_eq!(count("presets/smollm2-135m"), 134_515_008);
    }

    #[test]
    fn unknown_model_lists_presets() {
        let e = resolve("no-such-model").unwrap_err().to_string();
        assert!(e.contains("llama-3.1-8b"), "{e}");
    }
}
