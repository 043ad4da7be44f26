//! Rotary position embedding for the llama family: rotate-half RoPE (the default), Llama 4's
//! paired RoPE, Gemma 3's local θ, and Llama 4's query temperature on its NoPE layers.
use crate::model::Config;
use candle_core::{DType, Device, Tensor, D};

fn rotate_half(x: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// The RoPE tables of a forward: the global layers' and, where the sliding layers use their
/// own θ (Gemma 3), theirs.
pub struct Rope {
    global: (Tensor, Tensor),
    local: Option<(Tensor, Tensor)>,
}

impl Rope {
    pub fn new(
        cfg: &Config,
        pos: usize,
        s: usize,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Self> {
        let local = match cfg.gemma.as_ref().and_then(|g| g.local_rope_theta) {
            Some(theta) => Some(rope_tables(cfg.head_dim, theta, pos, s, dtype, dev)?),
            None => None,
        };
        Ok(Rope {
            global: rope_tables(cfg.head_dim, cfg.rope_theta, pos, s, dtype, dev)?,
            local,
        })
    }

    /// Layer `i`'s tables.
    pub fn of(&self, cfg: &Config, i: usize) -> &(Tensor, Tensor) {
        match &self.local {
            Some(local) if cfg.layer_window(i).is_some() => local,
            _ => &self.global,
        }
    }
}

/// cos and sin tables (s, head_dim `hd`) of RoPE θ `theta` for positions pos..pos+s, in
/// `dtype`.
fn rope_tables(
    hd: usize,
    theta: f64,
    pos: usize,
    s: usize,
    dtype: DType,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / hd as f64) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, hd / 2), dev)?;
    let t = Tensor::arange(pos as u32, (pos + s) as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((s, 1))?;
    let f = t.broadcast_mul(&inv)?;
    let f = Tensor::cat(&[&f, &f], D::Minus1)?;
    Ok((f.cos()?.to_dtype(dtype)?, f.sin()?.to_dtype(dtype)?))
}

pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?
}

/// RoPE on adjacent pairs (x₂ᵢ, x₂ᵢ₊₁) in f32, cast back: Llama 4's complex product
/// (`view_as_complex` of the last dimension in pairs). The tables' first halves hold each
/// pair's angle.
pub fn apply_rope_pairs(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let (b, h, s, hd) = x.dims4()?;
    let half = hd / 2;
    let f32 = |t: &Tensor| t.narrow(D::Minus1, 0, half)?.to_dtype(DType::F32);
    let (cos, sin) = (f32(cos)?, f32(sin)?);
    let x32 = x.to_dtype(DType::F32)?.reshape((b, h, s, half, 2))?;
    let x1 = x32.narrow(4, 0, 1)?.squeeze(4)?;
    let x2 = x32.narrow(4, 1, 1)?.squeeze(4)?;
    let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let r2 = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
    Tensor::stack(&[r1, r2], 4)?
        .reshape((b, h, s, hd))?
        .to_dtype(x.dtype())
}

/// Llama 4's query scale on its NoPE layers for positions pos..pos+s, as (1, 1, s, 1) in f32:
/// 1 + attn_scale · ln(1 + ⌊(p + 1) / floor_scale⌋).
pub fn nope_temperature(
    (scale, floor): (f64, f64),
    pos: usize,
    s: usize,
    dev: &Device,
) -> candle_core::Result<Tensor> {
    let t: Vec<f32> = (pos..pos + s)
        .map(|p| (1.0 + scale * (((p + 1) as f64) / floor).floor().ln_1p()) as f32)
        .collect();
    Tensor::from_vec(t, (1, 1, s, 1), dev)
}
