//! The umT5 encoder (transformers' UMT5EncoderModel, Wan's text encoder) as candle modules:
//! T5 blocks (RMS norm, unscaled attention with a relative-position bias, gated-GELU
//! feed-forward) where, unlike T5, every layer has its own relative-attention bias.
//! The gate's GELU is transformers' `gelu_new`, the tanh approximation (candle's `gelu`).
//! Tensor names are transformers' (`shared`, `encoder.block.{i}.layer.{0,1}...`).
use super::config::{FeedForwardProj, UmT5Config};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{embedding, linear_no_bias, Embedding, Linear, VarBuilder};

const EPS: f32 = 1e-6;

struct Layer {
    norm1: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    bias: Embedding,
    norm2: Tensor,
    wi: Vec<Linear>,
    wo: Linear,
}

/// UMT5EncoderModel.
pub struct UmT5Encoder {
    cfg: UmT5Config,
    shared: Embedding,
    layers: Vec<Layer>,
    final_norm: Tensor,
}

impl UmT5Encoder {
    pub fn new(c: &UmT5Config, vb: VarBuilder) -> Result<Self> {
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        let enc = vb.pp("encoder");
        let layers = (0..c.num_layers)
            .map(|i| {
                let b = enc.pp(format!("block.{i}"));
                let a = b.pp("layer.0.SelfAttention");
                let f = b.pp("layer.1.DenseReluDense");
                let wi = match c.feed_forward_proj {
                    FeedForwardProj::GatedGelu => vec![
                        linear_no_bias(d, c.d_ff, f.pp("wi_0"))?,
                        linear_no_bias(d, c.d_ff, f.pp("wi_1"))?,
                    ],
                    FeedForwardProj::Relu => vec![linear_no_bias(d, c.d_ff, f.pp("wi"))?],
                };
                Ok(Layer {
                    norm1: b.get(d, "layer.0.layer_norm.weight")?,
                    q: linear_no_bias(d, inner, a.pp("q"))?,
                    k: linear_no_bias(d, inner, a.pp("k"))?,
                    v: linear_no_bias(d, inner, a.pp("v"))?,
                    o: linear_no_bias(inner, d, a.pp("o"))?,
                    bias: embedding(
                        c.relative_attention_num_buckets,
                        c.num_heads,
                        a.pp("relative_attention_bias"),
                    )?,
                    norm2: b.get(d, "layer.1.layer_norm.weight")?,
                    wi,
                    wo: linear_no_bias(c.d_ff, d, f.pp("wo"))?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(UmT5Encoder {
            cfg: c.clone(),
            shared: embedding(c.vocab_size, d, vb.pp("shared"))?,
            layers,
            final_norm: enc.get(d, "final_layer_norm.weight")?,
        })
    }

    /// T5's bidirectional relative-position buckets (len, len): key position − query position.
    fn buckets(&self, len: usize, dev: &Device) -> Result<Tensor> {
        let nb = self.cfg.relative_attention_num_buckets / 2;
        let exact = nb / 2;
        let max_d = self.cfg.relative_attention_max_distance as f64;
        let mut v = Vec::with_capacity(len * len);
        for q in 0..len as i64 {
            for k in 0..len as i64 {
                let rel = k - q;
                let base = if rel > 0 { nb } else { 0 };
                let n = rel.unsigned_abs() as usize;
                let b = if n < exact {
                    n
                } else {
                    let large = exact as f64
                        + ((n as f64 / exact as f64).ln() / (max_d / exact as f64).ln())
                            * (nb - exact) as f64;
                    (large as usize).min(nb - 1)
                };
                v.push((base + b) as u32);
            }
        }
        Tensor::from_vec(v, (len, len), dev)
    }

    /// The last hidden state (b, len, d_model) of token ids (b, len).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, len) = ids.dims2()?;
        let (h, dk) = (self.cfg.num_heads, self.cfg.d_kv);
        let buckets = self.buckets(len, ids.device())?;
        let mut x = self.shared.forward(ids)?;
        let dt = x.dtype();
        for l in &self.layers {
            let n = candle_nn::ops::rms_norm(&x, &l.norm1, EPS)?;
            let heads = |t: Tensor| -> Result<Tensor> {
                t.reshape((b, len, h, dk))?.transpose(1, 2)?.contiguous()
            };
            let (q, k, v) = (
                heads(l.q.forward(&n)?)?,
                heads(l.k.forward(&n)?)?,
                heads(l.v.forward(&n)?)?,
            );
            drop(n);
            // (len, len, heads) → (1, heads, len, len).
            let bias = l.bias.forward(&buckets)?.permute((2, 0, 1))?.unsqueeze(0)?;
            let scores = q.matmul(&k.t()?)?.broadcast_add(&bias.to_dtype(dt)?)?;
            let p =
                candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(dt)?;
            drop(scores);
            let a = p.matmul(&v)?.transpose(1, 2)?.reshape((b, len, h * dk))?;
            x = (x + l.o.forward(&a)?)?;
            let n = candle_nn::ops::rms_norm(&x, &l.norm2, EPS)?;
            let hid = match l.wi.as_slice() {
                [g, u] => (g.forward(&n)?.gelu()? * u.forward(&n)?)?,
                [w] => w.forward(&n)?.relu()?,
                _ => unreachable!("one or two input projections"),
            };
            x = (x + l.wo.forward(&hid)?)?;
        }
        candle_nn::ops::rms_norm(&x, &self.final_norm, EPS)
    }
}
