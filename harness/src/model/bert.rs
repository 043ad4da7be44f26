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
use super::nn::{attention, embedding, split_heads, Linear, Named, Norm};
use super::{Config, Trainable};
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::collections::HashMap;

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
    pub fn new(cfg: &Config, t: HashMap<String, Tensor>, compute: DType) -> Result<Self> {
        let mut t = Named(t);
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
