//! Where a model's weights come from: `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`.
use super::{gguf, Config};
use crate::error::{bad_file, InputError};
use anyhow::Result;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An HF directory: config.json plus model.safetensors or a sharded index.
    Hf(PathBuf),
    /// A GGUF file, dequantized on load.
    Gguf(PathBuf),
    /// Real shapes from a config.json, seeded random values, written to safetensors first.
    Synthetic(PathBuf),
}

/// Expands `${VAR}` from the environment. `VRAMLAB_MODELS` defaults to `.cache/models`.
pub fn expand_env(s: &str) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..]
            .find('}')
            .ok_or_else(|| format!("unclosed `${{` in `{s}`"))?;
        let var = &rest[i + 2..i + end];
        let val = match (std::env::var(var), var) {
            (Ok(v), _) => v,
            (Err(_), "VRAMLAB_MODELS") => ".cache/models".to_string(),
            (Err(_), _) => return Err(format!("environment variable `{var}` is not set")),
        };
        out.push_str(&val);
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Source {
    /// Parses `kind:path`, expanding `${VAR}`.
    pub fn parse(s: &str) -> std::result::Result<Source, InputError> {
        let (kind, path) = s.split_once(':').ok_or_else(|| {
            InputError::arg(format!(
                "model source `{s}` must be `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`"
            ))
        })?;
        let path = PathBuf::from(expand_env(path).map_err(InputError::arg)?);
        match kind {
            "hf" => Ok(Source::Hf(path)),
            "gguf" => Ok(Source::Gguf(path)),
            "synthetic" => Ok(Source::Synthetic(path)),
            other => Err(InputError::arg(format!(
                "unknown model source kind `{other}` in `{s}` (expected hf, gguf or synthetic)"
            ))),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Source::Hf(p) | Source::Gguf(p) | Source::Synthetic(p) => p,
        }
    }

    /// The `weight_source` CSV column.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Hf(_) => "safetensors",
            Source::Gguf(_) => "gguf",
            Source::Synthetic(_) => "synthetic",
        }
    }

    /// A short stable name for point ids and the `model_id` column.
    pub fn model_id(&self) -> String {
        let p = self.path();
        let name = |p: &Path| {
            p.file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string())
        };
        match self {
            Source::Hf(_) => name(p),
            Source::Gguf(_) => p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| name(p)),
            Source::Synthetic(_) => {
                let base = if p.file_name().is_some_and(|n| n == "config.json") {
                    p.parent().map(name).unwrap_or_else(|| name(p))
                } else {
                    p.file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_else(|| name(p))
                };
                format!("synthetic-{base}")
            }
        }
    }

    /// The config.json path of an HF directory or a synthetic source.
    pub fn config_path(&self) -> PathBuf {
        match self {
            Source::Hf(dir) => dir.join("config.json"),
            Source::Gguf(p) | Source::Synthetic(p) => {
                if p.is_dir() {
                    p.join("config.json")
                } else {
                    p.clone()
                }
            }
        }
    }

    /// Reads the normalized config without loading any weights.
    pub fn config(&self) -> Result<Config> {
        match self {
            Source::Gguf(p) => gguf::config(p),
            _ => {
                let c = self.config_path();
                if !c.exists() {
                    return Err(bad_file(&c, "does not exist"));
                }
                Config::from_file(&c)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_ids() {
        let s = Source::parse("gguf:/m/SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
        assert_eq!(s.model_id(), "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(s.kind(), "gguf");
        let s = Source::parse("synthetic:presets/qwen2.5-0.5b/config.json").unwrap();
        assert_eq!(s.model_id(), "synthetic-qwen2.5-0.5b");
        assert!(Source::parse("nope").is_err());
        assert!(Source::parse("zip:x").is_err());
    }

    #[test]
    fn env_expansion() {
        std::env::set_var("VRAMLAB_TEST_X", "/a");
        assert_eq!(expand_env("${VRAMLAB_TEST_X}/b").unwrap(), "/a/b");
        assert!(expand_env("${VRAMLAB_SURELY_UNSET_VAR}").is_err());
        assert!(expand_env("${oops").is_err());
    }
}
