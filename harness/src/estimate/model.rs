//! Which model `estimate` answers for: a preset, an HF directory, a `config.json` or a GGUF
//! file, resolved to its name and normalized [`Config`] (every architecture of the registry).
use crate::error::{bad_file, InputError};
use crate::model::{gguf, Config};
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

/// Built-in presets: published `config.json` files (harness/presets/NAME/config.json).
pub const PRESETS: &[(&str, &str)] = &[
    (
        "bert-large-uncased",
        include_str!("../../presets/bert-large-uncased/config.json"),
    ),
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

/// A model `--model` named: its name and normalized [`Config`]. Every figure `estimate`
/// gives is computed from the config (`Config`'s counts and `crate::features`), never stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub name: String,
    pub config: Config,
    /// The GGUF file `--model` named, if it is one (its tensor types give exact quantized
    /// weight bytes).
    pub gguf: Option<std::path::PathBuf>,
}

impl Resolved {
    fn from_json(name: &str, path: &Path, v: &Value) -> Result<Resolved> {
        Ok(Resolved {
            name: name.to_string(),
            config: Config::from_json(path, v)?,
            gguf: None,
        })
    }
}

/// Resolves `--model`: an existing HF directory, `config.json` or `.gguf` file, or a preset
/// name (with or without a leading `presets/`).
pub fn resolve(spec: &str) -> Result<Resolved> {
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
            return Ok(Resolved {
                name,
                config: gguf::config(&file)?,
                gguf: Some(file),
            });
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| bad_file(&file, format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(&file, format!("not valid JSON: {e}")))?;
        return Resolved::from_json(&name, &file, &v);
    }
    let key = spec
        .trim_end_matches('/')
        .trim_end_matches("/config.json")
        .trim_start_matches("presets/")
        .to_ascii_lowercase();
    match PRESETS.iter().find(|(n, _)| *n == key) {
        Some((n, text)) => {
            let v: Value = serde_json::from_str(text).expect("built-in presets are valid JSON");
            Resolved::from_json(n, Path::new(&format!("presets/{n}/config.json")), &v)
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
            let p = resolve(n).unwrap().config.param_count();
            assert!(p > 100_000_000, "{n}: {p}");
        }
    }

    #[test]
    fn published_parameter_counts() {
        // Hand-computed from the published shapes (and the counts their model cards give).
        let count = |n: &str| resolve(n).unwrap().config.param_count();
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
