//! The scenario TOML (DESIGN.md §6), parsed strictly: unknown keys and wrong types are errors
//! that name the file, the line and the key.
use crate::error::bad_file;
use crate::model::KvKind;
use anyhow::Result;
use candle_core::DType;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Infer,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Infer => "infer",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    F16,
    Bf16,
}

impl Precision {
    pub fn as_str(&self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        }
    }
    /// The dtype weights are stored in.
    pub fn dtype(&self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }
}

/// A string or a list of strings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`, or a list of them (an axis).
    pub source: OneOrMany,
}

fn default_kv() -> Vec<KvKind> {
    vec![KvKind::Preallocated]
}
fn default_decode_steps() -> usize {
    16
}
fn default_decode_every() -> usize {
    8
}
fn default_repeats() -> usize {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    pub mode: Vec<Mode>,
    pub precision: Vec<Precision>,
    pub batch: Vec<i64>,
    /// Total tokens per sequence: the preallocated KV capacity; prompt + decode steps fill it.
    pub context: Vec<i64>,
    #[serde(default = "default_kv")]
    pub kv_cache: Vec<KvKind>,
    #[serde(default = "default_decode_steps")]
    pub decode_steps: usize,
    /// Prompt tokens; default `context − decode_steps`.
    #[serde(default)]
    pub prompt_len: Option<usize>,
    /// A decode row every this many steps (and at the last step).
    #[serde(default = "default_decode_every")]
    pub decode_every: usize,
    #[serde(default = "default_repeats")]
    pub repeats: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    #[serde(default = "default_device")]
    pub device: String,
    pub model: ModelSpec,
    pub sweep: SweepSpec,
}

fn default_device() -> String {
    "cpu".into()
}

/// 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

impl Spec {
    /// Parses and validates a scenario; errors name `path`, the line and the key.
    pub fn parse(path: &Path, text: &str) -> Result<Spec> {
        let spec: Spec = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(sp) => bad_file(path, format!("line {}: {msg}", line_of(text, sp.start))),
                None => bad_file(path, msg),
            }
        })?;
        spec.validate().map_err(|e| bad_file(path, e))?;
        Ok(spec)
    }

    pub fn load(path: &Path) -> Result<(Spec, String)> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read scenario: {e}")))?;
        Ok((Spec::parse(path, &text)?, text))
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let s = &self.sweep;
        let nonempty = |key: &str, n: usize| {
            if n == 0 {
                Err(format!("[sweep] `{key}` is an empty list: nothing to run"))
            } else {
                Ok(())
            }
        };
        nonempty("mode", s.mode.len())?;
        nonempty("precision", s.precision.len())?;
        nonempty("batch", s.batch.len())?;
        nonempty("context", s.context.len())?;
        nonempty("kv_cache", s.kv_cache.len())?;
        if self.model.source.to_vec().is_empty() {
            return Err("[model] `source` is an empty list".into());
        }
        for &b in &s.batch {
            if b <= 0 {
                return Err(format!("[sweep] `batch` must be positive, got {b}"));
            }
        }
        for &c in &s.context {
            if c <= 0 {
                return Err(format!("[sweep] `context` must be positive, got {c}"));
            }
            let prompt = s.prompt_len.unwrap_or((c as usize).saturating_sub(s.decode_steps));
            if prompt == 0 || prompt + s.decode_steps > c as usize {
                return Err(format!(
                    "[sweep] context {c} cannot hold prompt_len {prompt} + decode_steps {}",
                    s.decode_steps
                ));
            }
        }
        if s.decode_every == 0 {
            return Err("[sweep] `decode_every` must be at least 1".into());
        }
        if s.repeats == 0 {
            return Err("[sweep] `repeats` must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "t"
[model]
source = "gguf:/m.gguf"
[sweep]
mode = ["infer"]
precision = ["f32", "bf16"]
batch = [1, 2]
context = [64]
"#;

    #[test]
    fn parses_with_defaults() {
        let s = Spec::parse(Path::new("t.toml"), OK).unwrap();
        assert_eq!(s.device, "cpu");
        assert_eq!(s.sweep.kv_cache, vec![KvKind::Preallocated]);
        assert_eq!(s.sweep.decode_steps, 16);
    }

    #[test]
    fn unknown_key_names_file_line_key() {
        let bad = OK.replace("context = [64]", "context = [64]\nbogus = 1");
        let e = Spec::parse(Path::new("s/t.toml"), &bad).unwrap_err().to_string();
        assert!(e.starts_with("s/t.toml: line 11: unknown field `bogus`"), "{e}");
    }

    #[test]
    fn wrong_type_and_bad_values() {
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "\"one\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 8") && e.contains("invalid type"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "[0]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`batch` must be positive, got 0"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[1, 2]", "[]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`batch` is an empty list"), "{e}");
        let e = Spec::parse(Path::new("t.toml"), &OK.replace("[64]", "[8]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot hold"), "{e}");
    }
}
