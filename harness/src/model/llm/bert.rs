//! BERT encoder (MiniLM and friends) from differentiable candle ops only: word + position +
//! token-type embeddings, post-LayerNorm layers with biased self-attention (no causal mask),
//! exact GELU (`gelu_erf`), and the pooler (dense + tanh).
//!
//! Tensor names are sentence-transformers' (no `bert.` prefix; see [`Config::tensor_shapes`]).
//! All sequences are full length: there is no padding and no attention mask, and every token
//! has token type 0.
//!
//! Training loss (what [`Trainable::loss`] computes, `targets` are ignored): a mean-pooled
//! regression. The last hidden state is averaged over tokens (the sentence-transformers
//! embedding), passed through the pooler (dense + tanh), and compared by mean squared error
//! with a fixed target of 0.5 in every dimension. The pooler is in the loss so that every
//! parameter of the checkpoint receives a gradient.
use crate::model::arch::{
    checked, no_ops, parse_json, Architecture, Encoder, InferenceModel, Role, Tensors,
};
use crate::model::nn::{attention, embedding, split_heads, Linear, Named, Norm};
use crate::model::{Config, Trainable};
use crate::vocab::Ops;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// BERT's `config.json` keys.
#[derive(Clone, Debug, Deserialize)]
struct BertJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    max_position_embeddings: usize,
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
}

/// BERT encoders (`model_type = "bert"`).
pub struct BertArch;

impl Architecture for BertArch {
    /// No transformers-layer accounting yet: the estimate uses Korthikanti's.
    fn torch_saved_per_token(&self, _: &Config, _: u64, _: Option<u64>) -> Option<(u64, u64)> {
        None
    }
    fn name(&self) -> &'static str {
        "bert"
    }
    fn model_types(&self) -> &'static [&'static str] {
        &["bert"]
    }
    fn role(&self) -> Role {
        Role::Encoder
    }
    fn parse(&self, path: &Path, v: &Value) -> Result<Config> {
        let j: BertJson = parse_json(path, v)?;
        let (d, heads) = (j.hidden_size, j.num_attention_heads);
        checked(
            path,
            Config {
                vocab_size: j.vocab_size,
                hidden_size: d,
                intermediate_size: j.intermediate_size,
                num_layers: j.num_hidden_layers,
                num_heads: heads,
                num_kv_heads: heads,
                head_dim: d / heads.max(1),
                max_position_embeddings: j.max_position_embeddings,
                norm_eps: j.layer_norm_eps.unwrap_or(1e-12),
                qkv_bias: true,
                o_bias: true,
                type_vocab_size: j.type_vocab_size.unwrap_or(2),
                learned_positions: true,
                ..Config::new(&BertArch, "bert")
            },
        )
    }
    /// Names as in sentence-transformers' MiniLM (no `bert.` prefix).
    fn tensor_shapes(&self, c: &Config) -> Vec<(String, Vec<usize>)> {
        let (d, f) = (c.hidden_size, c.intermediate_size);
        let mut out = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![c.vocab_size, d],
            ),
            (
                "embeddings.position_embeddings.weight".to_string(),
                vec![c.max_position_embeddings, d],
            ),
            (
                "embeddings.token_type_embeddings.weight".to_string(),
                vec![c.type_vocab_size, d],
            ),
            ("embeddings.LayerNorm.weight".to_string(), vec![d]),
            ("embeddings.LayerNorm.bias".to_string(), vec![d]),
        ];
        for i in 0..c.num_layers {
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
    fn to_hf_json(&self, c: &Config) -> Value {
        serde_json::json!({
            "architectures": ["BertModel"], "model_type": "bert",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "max_position_embeddings": c.max_position_embeddings,
            "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.norm_eps,
            "hidden_act": "gelu",
        })
    }
    fn lora_targets(&self) -> &'static [&'static str] {
        &["attention.self.query", "attention.self.value"]
    }
    fn trainable(
        &self,
        c: &Config,
        t: Tensors,
        compute: DType,
        ops: Ops,
    ) -> Result<Box<dyn Trainable>> {
        no_ops(self.name(), ops)?;
        Ok(Box::new(Bert::new(c, t, compute)?))
    }
    fn inference(&self, c: &Config, t: Tensors, compute: DType) -> Result<InferenceModel> {
        Ok(InferenceModel::Encoder(Box::new(Bert::new(c, t, compute)?)))
    }
}

/// The regression target of the training loss, in every dimension.
pub const POOLED_TARGET: f64 = 0.5;

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    intermediate: Linear,
    output: Linear,
    out_norm: Norm,
}

pub struct Bert {
    cfg: Config,
    /// The dtype activations are computed in (weights are cast to it at use when they differ).
    compute: DType,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    emb_norm: Norm,
    layers: Vec<Layer>,
    pooler: Linear,
}

impl Bert {
    /// Builds the model from HF-named tensors (consumed); activations run in `compute`.
    /// Tensors may be variables (training) or plain (inference).
    pub fn new(cfg: &Config, t: Tensors, compute: DType) -> Result<Self> {
        let mut t = Named::dense(t);
        let word = t.take("embeddings.word_embeddings.weight")?;
        let position = t.take("embeddings.position_embeddings.weight")?;
        let token_type = t.take("embeddings.token_type_embeddings.weight")?;
        let emb_norm = t.norm("embeddings.LayerNorm")?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("encoder.layer.{i}");
            let mut lin = |m: &str| t.linear(&format!("{p}.{m}"), true);
            layers.push(Layer {
                query: lin("attention.self.query")?,
                key: lin("attention.self.key")?,
                value: lin("attention.self.value")?,
                attn_out: lin("attention.output.dense")?,
                intermediate: lin("intermediate.dense")?,
                output: lin("output.dense")?,
                attn_norm: t.norm(&format!("{p}.attention.output.LayerNorm"))?,
                out_norm: t.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let pooler = t.linear("pooler.dense", true)?;
        Ok(Bert {
            cfg: cfg.clone(),
            compute,
            word,
            position,
            token_type,
            emb_norm,
            layers,
            pooler,
        })
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.compute
    }

    /// Last hidden states (b, s, d) for token ids (b, s).
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = self.embed(ids)?;
        for i in 0..self.layers.len() {
            x = self.layer(i, &x)?;
        }
        Ok(x)
    }

    /// Mean over tokens of the last hidden states (b, s, d) → (b, d): the sentence-transformers
    /// embedding (before its optional normalization) when there is no padding.
    pub fn mean_pool(x: &Tensor) -> candle_core::Result<Tensor> {
        x.mean(1)
    }

    /// The pooler on pooled states (b, d): dense + tanh, (b, d).
    pub fn pool(&self, pooled: &Tensor) -> candle_core::Result<Tensor> {
        self.pooler
            .forward(&pooled.unsqueeze(1)?)?
            .squeeze(1)?
            .tanh()
    }

    /// Sentence embeddings (b, d) of token ids (b, s): mean pooling of [`Bert::forward`].
    pub fn encode(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        Self::mean_pool(&self.forward(ids)?)
    }
}

impl Trainable for Bert {
    fn config(&self) -> &Config {
        &self.cfg
    }

    /// Word rows + position rows 0..s + token type 0, then LayerNorm. Rows are gathered in the
    /// weights' dtype, then cast to the compute dtype.
    fn embed(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let s = ids.dim(1)?;
        let word = embedding(&self.word, ids, self.compute)?;
        let pos = self.position.narrow(0, 0, s)?.to_dtype(self.compute)?;
        let typ = self.token_type.narrow(0, 0, 1)?.to_dtype(self.compute)?;
        let x = word.broadcast_add(&pos)?.broadcast_add(&typ)?;
        self.emb_norm.forward(&x, self.cfg.norm_eps)
    }

    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn layer(&self, i: usize, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, l) = (&self.cfg, &self.layers[i]);
        let q = split_heads(&l.query.forward(x)?, c.num_heads)?;
        let k = split_heads(&l.key.forward(x)?, c.num_heads)?;
        let v = split_heads(&l.value.forward(x)?, c.num_heads)?;
        let a = l.attn_out.forward(&attention(&q, &k, &v, None, false)?)?;
        let x = l.attn_norm.forward(&(x + a)?, c.norm_eps)?;
        let m = l.output.forward(&l.intermediate.forward(&x)?.gelu_erf()?)?;
        l.out_norm.forward(&(x + m)?, c.norm_eps)
    }

    /// Mean-pooled regression (see the module doc): MSE in f32 between
    /// `tanh(pooler(mean_s(x)))` and [`POOLED_TARGET`]. `targets` are ignored.
    fn loss(&self, x: &Tensor, _targets: &Tensor) -> candle_core::Result<Tensor> {
        let p = self.pool(&Self::mean_pool(x)?)?.to_dtype(DType::F32)?;
        (p - POOLED_TARGET)?.sqr()?.mean_all()
    }
}

impl Encoder for Bert {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn device(&self) -> &Device {
        self.word.device()
    }

    /// The sentence embedding: mean pooling of the last hidden states.
    fn encode(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        Bert::encode(self, ids)
    }
}
