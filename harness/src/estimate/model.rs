//! Which model `estimate` answers for: a preset, an HF directory, a `config.json`, a GGUF file
//! or a Hugging Face Hub id ([`super::hub`]), resolved to its name and normalized [`Config`]
//! (every architecture of the registry).
use super::hub::{self, HubId};
use crate::error::{bad_file, InputError};
use crate::model::quant::Checkpoint;
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
    (
        "llama-3.1-70b",
        include_str!("../../presets/llama-3.1-70b/config.json"),
    ),
    (
        "llama-3.3-70b",
        include_str!("../../presets/llama-3.3-70b/config.json"),
    ),
    (
        "qwen2.5-72b",
        include_str!("../../presets/qwen2.5-72b/config.json"),
    ),
    (
        "mixtral-8x7b",
        include_str!("../../presets/mixtral-8x7b/config.json"),
    ),
    (
        "mixtral-8x22b",
        include_str!("../../presets/mixtral-8x22b/config.json"),
    ),
    (
        "qwen1.5-moe-a2.7b",
        include_str!("../../presets/qwen1.5-moe-a2.7b/config.json"),
    ),
    (
        "qwen3-30b-a3b",
        include_str!("../../presets/qwen3-30b-a3b/config.json"),
    ),
    (
        "qwen3-235b-a22b",
        include_str!("../../presets/qwen3-235b-a22b/config.json"),
    ),
    (
        "gemma-2-9b",
        include_str!("../../presets/gemma-2-9b/config.json"),
    ),
    (
        "gemma-2-27b",
        include_str!("../../presets/gemma-2-27b/config.json"),
    ),
    (
        "gemma-3-1b",
        include_str!("../../presets/gemma-3-1b/config.json"),
    ),
    (
        "gpt-oss-20b",
        include_str!("../../presets/gpt-oss-20b/config.json"),
    ),
    (
        "gpt-oss-120b",
        include_str!("../../presets/gpt-oss-120b/config.json"),
    ),
    (
        "deepseek-v2-lite",
        include_str!("../../presets/deepseek-v2-lite/config.json"),
    ),
    (
        "deepseek-v3",
        include_str!("../../presets/deepseek-v3/config.json"),
    ),
    (
        "llama-4-scout",
        include_str!("../../presets/llama-4-scout/config.json"),
    ),
    (
        "gemma-3-27b",
        include_str!("../../presets/gemma-3-27b/config.json"),
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
    /// A Hub model's stored checkpoint bytes (its index's `metadata.total_size`, or its single
    /// `model.safetensors`'s size), where the Hub gives them; shown, never used in a figure.
    pub stored_bytes: Option<u64>,
    /// The checkpoint's `quantization_config` (AWQ, GPTQ, MXFP4, FP8, bitsandbytes), read here
    /// and not into [`Config`], which describes the architecture: the format the weights are
    /// loaded in (`model::quant`).
    pub quant: Option<Checkpoint>,
}

impl Resolved {
    fn from_json(name: &str, path: &Path, v: &Value) -> Result<Resolved> {
        Ok(Resolved {
            name: name.to_string(),
            config: Config::from_json(path, v)?,
            gguf: None,
            stored_bytes: None,
            quant: Checkpoint::from_config_json(path, v)?,
        })
    }
}

/// A `config.json` file's JSON.
fn read_json(file: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(file).map_err(|e| bad_file(file, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| bad_file(file, format!("not valid JSON: {e}")))
}

/// Resolves `--model`: an existing HF directory, `config.json` or `.gguf` file, a preset name
/// (with or without a leading `presets/`), or else a Hub id `ORG/NAME[@REVISION]`, fetched
/// into the cache (or read from it under `HF_HUB_OFFLINE`).
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
                stored_bytes: None,
                quant: None,
            });
        }
        return Resolved::from_json(&name, &file, &read_json(&file)?);
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
        None => match HubId::parse(spec) {
            Some(id) => {
                let fetched = hub::fetch(&id)?;
                let v = read_json(&fetched.config)?;
                Ok(Resolved {
                    stored_bytes: fetched.stored_bytes,
                    ..Resolved::from_json(&id.spec, &fetched.config, &v)?
                })
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
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::KvWindow;

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
        // The 70B class: 80 layers of d 8,192 with 8 KV heads.
        assert_eq!(count("llama-3.1-70b"), 70_553_706_496);
        assert_eq!(count("llama-3.3-70b"), 70_553_706_496);
        assert_eq!(count("qwen2.5-72b"), 72_706_203_648);
        // Gemma: tied 256k embeddings, four norms a layer.
        assert_eq!(count("gemma-2-9b"), 9_241_705_984);
        assert_eq!(count("gemma-2-27b"), 27_227_128_320);
        assert_eq!(count("gemma-3-1b"), 999_885_952);
    }

    #[test]
    fn interleaved_local_layers_cap_only_their_own_cache() {
        // Gemma-2-9B: 42 layers alternating sliding (window 4,096) and full; a layer holds
        // 2 (K, V) · 8 KV heads · 256 · 2 B = 8,192 B a token in bf16.
        let c = resolve("gemma-2-9b").unwrap().config;
        let per_layer = 2 * 8 * 256 * 2;
        let kv = |tokens: usize| {
            c.kv_bytes(tokens, KvWindow::Model, 2, Default::default())
                .get()
                .unwrap()
        };
        assert_eq!(kv(8192), 21 * per_layer * 8192 + 21 * per_layer * 4096);
        assert_eq!(kv(1000), 42 * per_layer * 1000);
        assert_eq!(
            c.kv_bytes(8192, KvWindow::Full, 2, Default::default())
                .get(),
            Some(42 * per_layer * 8192)
        );
        // Gemma-3-1B: 26 layers, one full in six (layers 5, 11, 17, 23), window 512.
        let g3 = resolve("gemma-3-1b").unwrap().config;
        let full: Vec<usize> = (0..26).filter(|&i| g3.layer_window(i).is_none()).collect();
        assert_eq!(full, [5, 11, 17, 23]);
        assert_eq!(g3.kv_tokens_held(32_768, KvWindow::Model), 32_768);
    }

    #[test]
    fn moe_presets_total_and_active_parameters() {
        // (total, active) as the model cards round them. Mixtral's and Qwen's active counts
        // include the embedding; gpt-oss's and DeepSeek's leave it out (`false`), ours always
        // includes it. The exact totals are checked against transformers' own models in
        // tests/architectures.rs.
        for (n, total, active, with_embedding) in [
            ("mixtral-8x7b", 46.7e9, 12.9e9, true),
            ("mixtral-8x22b", 140.6e9, 39.2e9, true),
            ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, true),
            ("qwen3-30b-a3b", 30.5e9, 3.3e9, true),
            ("qwen3-235b-a22b", 235.1e9, 22.2e9, true),
            ("gpt-oss-20b", 20.91e9, 3.61e9, false),
            ("gpt-oss-120b", 116.83e9, 5.13e9, false),
            // DeepSeek-V3's 685B on the Hub adds the 14B multi-token-prediction layer, which
            // inference does not run.
            ("deepseek-v2-lite", 15.7e9, 2.4e9, false),
            ("deepseek-v3", 671.0e9, 37.0e9, false),
        ] {
            let c = resolve(n).unwrap().config;
            let embedding = if with_embedding {
                0.0
            } else {
                (c.vocab_size * c.hidden_size) as f64
            };
            let t = c.param_count() as f64;
            let a = c.active_params().get().unwrap() as f64 - embedding;
            assert!((t / total - 1.0).abs() < 0.002, "{n}: {t}");
            assert!((a / active - 1.0).abs() < 0.025, "{n}: {a}");
        }
        // DeepSeek-V3's multi-token-prediction layer: 685B stored in all.
        let v3 = resolve("deepseek-v3").unwrap().config;
        let stored = (v3.params() + v3.mtp_params()).get().unwrap() as f64;
        assert!((stored / 684.5e9 - 1.0).abs() < 0.002, "{stored}");
    }

    #[test]
    fn unknown_model_lists_presets() {
        let e = resolve("no-such-model").unwrap_err().to_string();
        assert!(e.contains("llama-3.1-8b"), "{e}");
    }
}
