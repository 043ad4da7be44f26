//! HF `config.json` (or GGUF metadata) → the normalized [`Config`] every other part uses.
use crate::error::bad_file;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Model families vramlab implements. `Llama` covers Llama 2/3, Mistral, Qwen2, SmolLM2 and
/// TinyLlama (GQA, RoPE, RMSNorm, SwiGLU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    /// GPT-2: LayerNorm, learned positions, GELU (tanh), Conv1D weight layout, tied head.
    Gpt2,
    /// BERT encoder: post-LayerNorm, learned positions and token types, GELU (erf), pooler.
    Bert,
}

impl Architecture {
    pub fn as_str(&self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Gpt2 => "gpt2",
            Architecture::Bert => "bert",
        }
    }
}

/// The normalized model description. All sizes are element counts, not bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub architecture: Architecture,
    /// `model_type` as written in config.json (llama, mistral, qwen2).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Bias on the q, k and v projections (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama with `attention_bias`).
    pub o_bias: bool,
    /// BERT token-type vocabulary (0 for decoders).
    #[serde(default)]
    pub type_vocab_size: usize,
}

fn get<'a>(path: &Path, v: &'a Value, key: &str) -> Result<&'a Value> {
    v.get(key)
        .filter(|x| !x.is_null())
        .ok_or_else(|| bad_file(path, format!("missing config key `{key}`")))
}

fn usize_key(path: &Path, v: &Value, key: &str) -> Result<usize> {
    let x = get(path, v, key)?;
    match x.as_u64() {
        Some(n) if n > 0 => Ok(n as usize),
        _ => Err(bad_file(
            path,
            format!("config key `{key}` must be a positive integer, got {x}"),
        )),
    }
}

fn opt_usize(path: &Path, v: &Value, key: &str) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => usize_key(path, v, key).map(Some),
    }
}

fn opt_f64(path: &Path, v: &Value, key: &str, default: f64) -> Result<f64> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_f64().ok_or_else(|| {
            bad_file(
                path,
                format!("config key `{key}` must be a number, got {x}"),
            )
        }),
    }
}

fn opt_bool(path: &Path, v: &Value, key: &str, default: bool) -> Result<bool> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_bool().ok_or_else(|| {
            bad_file(
                path,
                format!("config key `{key}` must be true or false, got {x}"),
            )
        }),
    }
}

impl Config {
    /// Reads and normalizes an HF `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(path, format!("not valid JSON: {e}")))?;
        Self::from_json(path, &v)
    }

    /// Normalizes an already parsed `config.json`; `path` is only used in error messages.
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        if !v.is_object() {
            return Err(bad_file(path, "config.json must be a JSON object"));
        }
        let model_type = get(path, v, "model_type")?
            .as_str()
            .ok_or_else(|| bad_file(path, "config key `model_type` must be a string"))?
            .to_string();
        let (qkv_default, tie_default) = match model_type.as_str() {
            "llama" | "mistral" => (false, false),
            "qwen2" => (true, false),
            "gpt2" => return Self::gpt2_from_json(path, v),
            "bert" => return Self::bert_from_json(path, v),
            other => {
                return Err(bad_file(
                    path,
                    format!(
                        "unknown architecture `model_type = \"{other}\"` (supported: llama, mistral, qwen2, gpt2, bert)"
                    ),
                ))
            }
        };
        let hidden_size = usize_key(path, v, "hidden_size")?;
        let num_heads = usize_key(path, v, "num_attention_heads")?;
        let num_kv_heads = opt_usize(path, v, "num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = opt_usize(path, v, "head_dim")?.unwrap_or(hidden_size / num_heads);
        let attention_bias = opt_bool(path, v, "attention_bias", false)?;
        let cfg = Config {
            architecture: Architecture::Llama,
            vocab_size: usize_key(path, v, "vocab_size")?,
            hidden_size,
            intermediate_size: usize_key(path, v, "intermediate_size")?,
            num_layers: usize_key(path, v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            max_position_embeddings: usize_key(path, v, "max_position_embeddings")?,
            rope_theta: opt_f64(path, v, "rope_theta", 10_000.0)?,
            norm_eps: opt_f64(path, v, "rms_norm_eps", 1e-6)?,
            tie_word_embeddings: opt_bool(path, v, "tie_word_embeddings", tie_default)?,
            qkv_bias: qkv_default || attention_bias,
            o_bias: attention_bias,
            type_vocab_size: 0,
            model_type,
        };
        cfg.validate().map_err(|e| bad_file(path, e))?;
        Ok(cfg)
    }

    fn gpt2_from_json(path: &Path, v: &Value) -> Result<Self> {
        let d = usize_key(path, v, "n_embd")?;
        let heads = usize_key(path, v, "n_head")?;
        let cfg = Config {
            architecture: Architecture::Gpt2,
            model_type: "gpt2".into(),
            vocab_size: usize_key(path, v, "vocab_size")?,
            hidden_size: d,
            intermediate_size: opt_usize(path, v, "n_inner")?.unwrap_or(d.saturating_mul(4)),
            num_layers: usize_key(path, v, "n_layer")?,
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: d / heads,
            max_position_embeddings: usize_key(path, v, "n_positions")?,
            rope_theta: 0.0,
            norm_eps: opt_f64(path, v, "layer_norm_epsilon", 1e-5)?,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: true,
            type_vocab_size: 0,
        };
        cfg.validate().map_err(|e| bad_file(path, e))?;
        Ok(cfg)
    }

    fn bert_from_json(path: &Path, v: &Value) -> Result<Self> {
        let d = usize_key(path, v, "hidden_size")?;
        let heads = usize_key(path, v, "num_attention_heads")?;
        let cfg = Config {
            architecture: Architecture::Bert,
            model_type: "bert".into(),
            vocab_size: usize_key(path, v, "vocab_size")?,
            hidden_size: d,
            intermediate_size: usize_key(path, v, "intermediate_size")?,
            num_layers: usize_key(path, v, "num_hidden_layers")?,
            num_heads: heads,
            num_kv_heads: heads,
            head_dim: d / heads,
            max_position_embeddings: usize_key(path, v, "max_position_embeddings")?,
            rope_theta: 0.0,
            norm_eps: opt_f64(path, v, "layer_norm_eps", 1e-12)?,
            tie_word_embeddings: false,
            qkv_bias: true,
            o_bias: true,
            type_vocab_size: opt_usize(path, v, "type_vocab_size")?.unwrap_or(2),
        };
        cfg.validate().map_err(|e| bad_file(path, e))?;
        Ok(cfg)
    }

    /// Shape invariants the implementation relies on, and bounds that keep every size
    /// computation (shapes, parameter and byte counts) far from overflow: values beyond them
    /// come from a corrupt file, not a real model.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (key, v, max) in [
            ("vocab_size", self.vocab_size, 1usize << 24),
            ("hidden_size", self.hidden_size, 1 << 20),
            ("intermediate_size", self.intermediate_size, 1 << 22),
            ("num_hidden_layers", self.num_layers, 10_000),
            ("num_attention_heads", self.num_heads, 1 << 16),
            ("num_key_value_heads", self.num_kv_heads, 1 << 16),
            ("head_dim", self.head_dim, 1 << 16),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 27,
            ),
            ("type_vocab_size", self.type_vocab_size, 1 << 16),
        ] {
            if v > max {
                return Err(format!("{key} = {v} is implausibly large (at most {max})"));
            }
        }
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(format!("{key} must be positive, got 0"));
            }
        }
        if self.head_dim == 0 {
            return Err(format!(
                "head_dim is 0: hidden_size ({}) is smaller than num_attention_heads ({})",
                self.hidden_size, self.num_heads
            ));
        }
        if self.architecture != Architecture::Llama
            && self.num_heads * self.head_dim != self.hidden_size
        {
            return Err(format!(
                "hidden_size ({}) is not a multiple of the number of attention heads ({})",
                self.hidden_size, self.num_heads
            ));
        }
        if !(self.rope_theta.is_finite() && self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err("rope_theta and the norm epsilon must be finite, the epsilon >= 0".into());
        }
        if self.architecture == Architecture::Llama && self.rope_theta <= 0.0 {
            return Err(format!(
                "rope_theta must be positive, got {}",
                self.rope_theta
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.architecture == Architecture::Llama && !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        let params: u128 = self
            .tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().map(|&d| d as u128).product::<u128>())
            .sum();
        if params > 1_000_000_000_000_000 {
            return Err(format!(
                "the shapes add up to {params} parameters: implausibly large"
            ));
        }
        Ok(())
    }

    /// Writes the config back as an HF `config.json` (what `synth-weights` puts beside the weights).
    pub fn to_hf_json(&self) -> Value {
        match self.architecture {
            Architecture::Gpt2 => {
                return serde_json::json!({
                    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                    "vocab_size": self.vocab_size, "n_embd": self.hidden_size,
                    "n_inner": self.intermediate_size, "n_layer": self.num_layers,
                    "n_head": self.num_heads, "n_positions": self.max_position_embeddings,
                    "layer_norm_epsilon": self.norm_eps,
                })
            }
            Architecture::Bert => {
                return serde_json::json!({
                    "architectures": ["BertModel"], "model_type": "bert",
                    "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                    "intermediate_size": self.intermediate_size,
                    "num_hidden_layers": self.num_layers,
                    "num_attention_heads": self.num_heads,
                    "max_position_embeddings": self.max_position_embeddings,
                    "type_vocab_size": self.type_vocab_size, "layer_norm_eps": self.norm_eps,
                    "hidden_act": "gelu",
                })
            }
            Architecture::Llama => {}
        }
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_bias,
            "hidden_act": "silu",
        })
    }

    /// Every parameter tensor with its HF name and shape, in load order. This is the single
    /// list that synthetic weights, shape checks and the weight-bytes feature use.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        match self.architecture {
            Architecture::Llama => self.llama_shapes(),
            Architecture::Gpt2 => self.gpt2_shapes(),
            Architecture::Bert => self.bert_shapes(),
        }
    }

    /// GPT-2 names as in HF's `model.safetensors` (no `transformer.` prefix); Conv1D weights
    /// are stored (in, out).
    fn gpt2_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        let mut out = vec![
            ("wte.weight".to_string(), vec![self.vocab_size, d]),
            (
                "wpe.weight".to_string(),
                vec![self.max_position_embeddings, d],
            ),
        ];
        for i in 0..self.num_layers {
            for (name, shape) in [
                ("ln_1.weight", vec![d]),
                ("ln_1.bias", vec![d]),
                ("attn.c_attn.weight", vec![d, 3 * d]),
                ("attn.c_attn.bias", vec![3 * d]),
                ("attn.c_proj.weight", vec![d, d]),
                ("attn.c_proj.bias", vec![d]),
                ("ln_2.weight", vec![d]),
                ("ln_2.bias", vec![d]),
                ("mlp.c_fc.weight", vec![d, f]),
                ("mlp.c_fc.bias", vec![f]),
                ("mlp.c_proj.weight", vec![f, d]),
                ("mlp.c_proj.bias", vec![d]),
            ] {
                out.push((format!("h.{i}.{name}"), shape));
            }
        }
        out.push(("ln_f.weight".to_string(), vec![d]));
        out.push(("ln_f.bias".to_string(), vec![d]));
        out
    }

    /// BERT names as in sentence-transformers' MiniLM (no `bert.` prefix).
    fn bert_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        let mut out = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![self.vocab_size, d],
            ),
            (
                "embeddings.position_embeddings.weight".to_string(),
                vec![self.max_position_embeddings, d],
            ),
            (
                "embeddings.token_type_embeddings.weight".to_string(),
                vec![self.type_vocab_size, d],
            ),
            ("embeddings.LayerNorm.weight".to_string(), vec![d]),
            ("embeddings.LayerNorm.bias".to_string(), vec![d]),
        ];
        for i in 0..self.num_layers {
            for (name, shape) in [
                ("attention.self.query.weight", vec![d, d]),
                ("attention.self.query.bias", vec![d]),
                ("attention.self.key.weight", vec![d, d]),
                ("attention.self.key.bias", vec![d]),
                ("attention.self.value.weight", vec![d, d]),
                ("attention.self.value.bias", vec![d]),
                ("attention.output.dense.weight", vec![d, d]),
                ("attention.output.dense.bias", vec![d]),
                ("attention.output.LayerNorm.weight", vec![d]),
                ("attention.output.LayerNorm.bias", vec![d]),
                ("intermediate.dense.weight", vec![f, d]),
                ("intermediate.dense.bias", vec![f]),
                ("output.dense.weight", vec![d, f]),
                ("output.dense.bias", vec![d]),
                ("output.LayerNorm.weight", vec![d]),
                ("output.LayerNorm.bias", vec![d]),
            ] {
                out.push((format!("encoder.layer.{i}.{name}"), shape));
            }
        }
        out.push(("pooler.dense.weight".to_string(), vec![d, d]));
        out.push(("pooler.dense.bias".to_string(), vec![d]));
        out
    }

    fn llama_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f, hd) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let (q, kv) = (self.num_heads * hd, self.num_kv_heads * hd);
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            vec![self.vocab_size, d],
        )];
        for i in 0..self.num_layers {
            let p = format!("model.layers.{i}");
            let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
            push("input_layernorm.weight", vec![d]);
            push("self_attn.q_proj.weight", vec![q, d]);
            push("self_attn.k_proj.weight", vec![kv, d]);
            push("self_attn.v_proj.weight", vec![kv, d]);
            if self.qkv_bias {
                push("self_attn.q_proj.bias", vec![q]);
                push("self_attn.k_proj.bias", vec![kv]);
                push("self_attn.v_proj.bias", vec![kv]);
            }
            push("self_attn.o_proj.weight", vec![d, q]);
            if self.o_bias {
                push("self_attn.o_proj.bias", vec![d]);
            }
            push("post_attention_layernorm.weight", vec![d]);
            push("mlp.gate_proj.weight", vec![f, d]);
            push("mlp.up_proj.weight", vec![f, d]);
            push("mlp.down_proj.weight", vec![d, f]);
        }
        out.push(("model.norm.weight".to_string(), vec![d]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![self.vocab_size, d]));
        }
        out
    }

    /// Number of parameter tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensor_shapes().len()
    }

    /// Total parameter count (tied embeddings counted once).
    pub fn param_count(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// K and V bytes for one token of one sequence: 2 · L · n_kv · head_dim · dtype bytes.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> u64 {
        (2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm2() -> Value {
        json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
               "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
               "rms_norm_eps": 1e-5, "tie_word_embeddings": true})
    }

    #[test]
    fn smollm2_param_count_matches_the_gguf() {
        let c = Config::from_json(Path::new("c.json"), &smollm2()).unwrap();
        assert_eq!(c.head_dim, 64);
        // DESIGN.md §7: the GGUF holds 134,515,008 parameters.
        assert_eq!(c.param_count(), 134_515_008);
        // 2 · 30 · 3 · 64 · 4 B = 46,080 B per token in f32.
        assert_eq!(c.kv_bytes_per_token(4), 46_080);
        assert_eq!(c.tensor_count(), 1 + 30 * 9 + 1);
    }

    #[test]
    fn missing_key_names_it() {
        let mut v = smollm2();
        v.as_object_mut().unwrap().remove("num_hidden_layers");
        let e = Config::from_json(Path::new("x/config.json"), &v).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x/config.json: missing config key `num_hidden_layers`"
        );
    }

    #[test]
    fn unknown_architecture() {
        let mut v = smollm2();
        v["model_type"] = json!("mamba");
        let e = Config::from_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("unknown architecture"), "{e}");
    }

    #[test]
    fn minilm_and_gpt2_counts() {
        let bert = json!({"model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
            "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12,
            "max_position_embeddings": 512, "type_vocab_size": 2});
        let c = Config::from_json(Path::new("c.json"), &bert).unwrap();
        // all-MiniLM-L6-v2: 22,713,216 parameters (its model card says 22.7M).
        assert_eq!(c.param_count(), 22_713_216);
        let back = Config::from_json(Path::new("c.json"), &c.to_hf_json()).unwrap();
        assert_eq!(back, c);
        let gpt2 = json!({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
            "n_layer": 12, "n_head": 12, "n_positions": 1024});
        let g = Config::from_json(Path::new("c.json"), &gpt2).unwrap();
        // GPT-2 small: 124,439,808 parameters.
        assert_eq!(g.param_count(), 124_439_808);
        assert_eq!(
            Config::from_json(Path::new("c.json"), &g.to_hf_json()).unwrap(),
            g
        );
    }

    #[test]
    fn qwen2_has_qkv_bias_and_roundtrips() {
        let mut v = smollm2();
        v["model_type"] = json!("qwen2");
        let c = Config::from_json(Path::new("c.json"), &v).unwrap();
        assert!(c.qkv_bias && !c.o_bias);
        let back = Config::from_json(Path::new("c.json"), &c.to_hf_json()).unwrap();
        assert_eq!(back, c);
    }
}
