//! The Wan2.1 DiT (diffusers' WanTransformer3DModel) as candle modules: the patch embedding
//! (a conv3d of kernel = stride = patch, i.e. a linear over each patch's pixels), time and
//! text embeddings, `num_layers` blocks of self-attention with 3D RoPE over (frame, row,
//! column), cross-attention to the text and a GELU feed-forward, each modulated by the
//! timestep (shift, scale, gate), and the modulated output projection, unpatchified.
//!
//! Tensor names are diffusers' (the checkpoint's: the output modulation is the stored
//! `scale_shift_table` of (1, 2, dim)). [`Attention::Eager`] materializes the scores in the
//! activations' dtype (candle has no SDPA kernel on the CPU); [`Attention::Flash`] runs
//! vramlab-kernels' tiled attention, which never holds them.
//!
//! Training (LoRA, `workload/finetune.rs`): the blocks' dense layers are [`Linear`]
//! (adapters attach with [`WanDit::linears_mut`]), every op on the blocks' path records a
//! backward, and the forward is split into [`WanDit::embed`], [`WanDit::condition`],
//! [`WanDit::block`] and [`WanDit::head`] so that checkpointing can re-run one block.
use super::config::{QkNorm, WanTransformerConfig};
use crate::model::nn::Linear;
use crate::vocab::Attention;
use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{linear, VarBuilder};

/// LayerNorm over the last dimension, without affine parameters (Wan's `norm1`, `norm3`,
/// `norm_out`), in f32 as diffusers' FP32LayerNorm.
fn layer_norm(x: &Tensor, eps: f64) -> Result<Tensor> {
    let dt = x.dtype();
    let x = x.to_dtype(DType::F32)?;
    let mean = x.mean_keepdim(D::Minus1)?;
    let x = x.broadcast_sub(&mean)?;
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dt)
}

/// `x · (1 + scale) + shift`, the modulation vectors (b, 1, dim).
fn modulate(x: &Tensor, shift: &Tensor, scale: &Tensor) -> Result<Tensor> {
    x.broadcast_mul(&(scale + 1.0)?)?.broadcast_add(shift)
}

/// A block's dense layer (diffusers' `nn.Linear` with a bias), as [`Linear`]: a
/// LoRA adapter can be attached to it, and under training its frozen weight takes no
/// gradient.
fn dense(i: usize, o: usize, vb: VarBuilder) -> Result<Linear> {
    Ok(Linear::new(
        vb.get((o, i), "weight")?,
        Some(vb.get(o, "bias")?),
    ))
}

/// Self- or cross-attention of a block (diffusers' WanAttention).
struct Attn {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm_q: Option<Tensor>,
    norm_k: Option<Tensor>,
    heads: usize,
    eps: f64,
    kind: Attention,
}

impl Attn {
    fn new(c: &WanTransformerConfig, kind: Attention, vb: VarBuilder) -> Result<Self> {
        let d = c.dim();
        let norm = |n: &str| -> Result<Option<Tensor>> {
            match c.qk_norm {
                Some(QkNorm::RmsNormAcrossHeads) => {
                    Some(vb.get(d, &format!("{n}.weight"))).transpose()
                }
                None => Ok(None),
            }
        };
        Ok(Attn {
            q: dense(d, d, vb.pp("to_q"))?,
            k: dense(d, d, vb.pp("to_k"))?,
            v: dense(d, d, vb.pp("to_v"))?,
            out: dense(d, d, vb.pp("to_out.0"))?,
            norm_q: norm("norm_q")?,
            norm_k: norm("norm_k")?,
            heads: c.num_attention_heads,
            eps: c.eps,
            kind,
        })
    }

    /// The dense layers and their module names under the block's `prefix`.
    fn linears_mut(&mut self, prefix: &str) -> Vec<(String, &mut Linear)> {
        vec![
            (format!("{prefix}.to_q"), &mut self.q),
            (format!("{prefix}.to_k"), &mut self.k),
            (format!("{prefix}.to_v"), &mut self.v),
            (format!("{prefix}.to_out.0"), &mut self.out),
        ]
    }

    /// Attention of `x` (b, n, dim) over `ctx` (b, m, dim) (itself when None), RoPE (cos, sin)
    /// on q and k for self-attention.
    fn forward(
        &self,
        x: &Tensor,
        ctx: Option<&Tensor>,
        rope: Option<&(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let (b, n, d) = x.dims3()?;
        let ctx = ctx.unwrap_or(x);
        let m = ctx.dim(1)?;
        let hd = d / self.heads;
        // vramlab-kernels' RMSNorm: fused like candle-nn's, but with a backward.
        let norm = |t: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
            match w {
                Some(w) => vramlab_kernels::rms_norm(&t, w, self.eps),
                None => Ok(t),
            }
        };
        let heads = |t: Tensor, len: usize| -> Result<Tensor> {
            t.reshape((b, len, self.heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let mut q = heads(norm(self.q.forward(x)?, &self.norm_q)?, n)?;
        let mut k = heads(norm(self.k.forward(ctx)?, &self.norm_k)?, m)?;
        let v = heads(self.v.forward(ctx)?, m)?;
        if let Some((cos, sin)) = rope {
            // candle-nn's fused `rope_i` records no backward: under training (q tracks a
            // LoRA adapter) its composition from differentiable ops runs instead.
            let rope_i = |t: &Tensor| {
                if t.track_op() {
                    candle_nn::rotary_emb::rope_i_slow(t, cos, sin)
                } else {
                    candle_nn::rotary_emb::rope_i(t, cos, sin)
                }
            };
            q = rope_i(&q)?;
            k = rope_i(&k)?;
        }
        let y = crate::model::nn::attend(q, k, &v, self.kind)?;
        self.out.forward(&y)
    }
}

struct Block {
    attn1: Attn,
    attn2: Attn,
    norm2: Option<(Tensor, Tensor)>,
    ff1: Linear,
    ff2: Linear,
    table: Tensor,
    eps: f64,
}

impl Block {
    fn new(c: &WanTransformerConfig, attention: Attention, vb: VarBuilder) -> Result<Self> {
        let d = c.dim();
        Ok(Block {
            attn1: Attn::new(c, attention, vb.pp("attn1"))?,
            attn2: Attn::new(c, attention, vb.pp("attn2"))?,
            norm2: if c.cross_attn_norm {
                Some((vb.get(d, "norm2.weight")?, vb.get(d, "norm2.bias")?))
            } else {
                None
            },
            ff1: dense(d, c.ffn_dim, vb.pp("ffn.net.0.proj"))?,
            ff2: dense(c.ffn_dim, d, vb.pp("ffn.net.2"))?,
            table: vb.get((1, 6, d), "scale_shift_table")?,
            eps: c.eps,
        })
    }

    /// Every dense layer of the block with its module name under `prefix` (musubi-tuner's Wan
    /// LoRA targets: all `nn.Linear` of a WanAttentionBlock).
    fn linears_mut(&mut self, prefix: &str) -> Vec<(String, &mut Linear)> {
        let mut v = self.attn1.linears_mut(&format!("{prefix}.attn1"));
        v.extend(self.attn2.linears_mut(&format!("{prefix}.attn2")));
        v.push((format!("{prefix}.ffn.net.0.proj"), &mut self.ff1));
        v.push((format!("{prefix}.ffn.net.2"), &mut self.ff2));
        v
    }

    /// `x` (b, n, dim), `temb` (b, 6, dim), `ctx` (b, m, dim).
    fn forward(
        &self,
        x: &Tensor,
        temb: &Tensor,
        ctx: &Tensor,
        rope: &(Tensor, Tensor),
    ) -> Result<Tensor> {
        let mods = self.table.broadcast_add(temb)?;
        let m = |i: usize| mods.narrow(1, i, 1);
        let (shift, scale, gate) = (m(0)?, m(1)?, m(2)?);
        let (c_shift, c_scale, c_gate) = (m(3)?, m(4)?, m(5)?);
        let h = modulate(&layer_norm(x, self.eps)?, &shift, &scale)?;
        let a = self.attn1.forward(&h, None, Some(rope))?;
        drop(h);
        let x = (x + a.broadcast_mul(&gate)?)?;
        let h = match &self.norm2 {
            Some((w, b)) => layer_norm(&x, self.eps)?
                .broadcast_mul(w)?
                .broadcast_add(b)?,
            None => x.clone(),
        };
        let x = (&x + self.attn2.forward(&h, Some(ctx), None)?)?;
        drop(h);
        let h = modulate(&layer_norm(&x, self.eps)?, &c_shift, &c_scale)?;
        let f = self.ff2.forward(&self.ff1.forward(&h)?.gelu()?)?;
        x + f.broadcast_mul(&c_gate)?
    }
}

/// What every block and the output head read besides the hidden states: the timestep's
/// modulation, the projected text, the RoPE tables and the latents' shape. None of it depends
/// on a trainable (LoRA) tensor.
pub struct Cond {
    temb: Tensor,
    tproj: Tensor,
    ctx: Tensor,
    rope: (Tensor, Tensor),
    /// The latents' (b, c, f, h, w).
    shape: (usize, usize, usize, usize, usize),
}

/// WanTransformer3DModel.
pub struct WanDit {
    cfg: WanTransformerConfig,
    patch: Tensor,
    patch_bias: Tensor,
    time1: candle_nn::Linear,
    time2: candle_nn::Linear,
    time_proj: candle_nn::Linear,
    text1: candle_nn::Linear,
    text2: candle_nn::Linear,
    blocks: Vec<Block>,
    table: Tensor,
    proj_out: candle_nn::Linear,
}

impl WanDit {
    /// The transformer over `vb`'s tensors, its attention run as `attention` (`eager` or
    /// `flash`; anything else is an error).
    pub fn new(c: &WanTransformerConfig, vb: VarBuilder, attention: Attention) -> Result<Self> {
        if !matches!(attention, Attention::Eager | Attention::Flash) {
            candle_core::bail!("attention `{attention}`: the Wan DiT runs `eager` or `flash`");
        }
        let d = c.dim();
        let [pt, ph, pw] = c.patch_size;
        let pe = vb.pp("patch_embedding");
        let ce = vb.pp("condition_embedder");
        let patch = pe
            .get((d, c.in_channels, pt, ph, pw), "weight")?
            .reshape((d, c.in_channels * pt * ph * pw))?;
        Ok(WanDit {
            cfg: c.clone(),
            patch,
            patch_bias: pe.get(d, "bias")?,
            time1: linear(c.freq_dim, d, ce.pp("time_embedder.linear_1"))?,
            time2: linear(d, d, ce.pp("time_embedder.linear_2"))?,
            time_proj: linear(d, 6 * d, ce.pp("time_proj"))?,
            text1: linear(c.text_dim, d, ce.pp("text_embedder.linear_1"))?,
            text2: linear(d, d, ce.pp("text_embedder.linear_2"))?,
            blocks: (0..c.num_layers)
                .map(|i| Block::new(c, attention, vb.pp(format!("blocks.{i}"))))
                .collect::<Result<_>>()?,
            table: vb.get((1, 2, d), "scale_shift_table")?,
            proj_out: linear(d, c.out_channels * pt * ph * pw, vb.pp("proj_out"))?,
        })
    }

    /// Sinusoidal timestep features (cos first, as diffusers' `flip_sin_to_cos`).
    fn timestep_features(&self, t: &Tensor) -> Result<Tensor> {
        let half = self.cfg.freq_dim / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|i| (-(10000f32.ln()) * i as f32 / half as f32).exp())
            .collect();
        let f = Tensor::from_vec(freqs, (1, half), t.device())?;
        let args = t.to_dtype(DType::F32)?.unsqueeze(1)?.broadcast_mul(&f)?;
        Tensor::cat(&[args.cos()?, args.sin()?], 1)
    }

    /// RoPE tables (n, head_dim / 2) over (frame, row, column) positions: the head's features
    /// split into `hd − 2·(hd/3)` temporal and `hd/3` + `hd/3` spatial ones.
    fn rope(
        &self,
        f: usize,
        h: usize,
        w: usize,
        dev: &candle_core::Device,
    ) -> Result<(Tensor, Tensor)> {
        let hd = self.cfg.attention_head_dim;
        let split = [hd - 2 * (hd / 3), hd / 3, hd / 3];
        let n = f * h * w;
        let mut cos = Vec::with_capacity(n * hd / 2);
        let mut sin = Vec::with_capacity(n * hd / 2);
        for fi in 0..f {
            for hi in 0..h {
                for wi in 0..w {
                    for (axis, &dim) in split.iter().enumerate() {
                        let pos = [fi, hi, wi][axis] as f64;
                        for j in 0..dim / 2 {
                            let theta = 10000f64.powf(-((2 * j) as f64) / dim as f64);
                            cos.push((pos * theta).cos() as f32);
                            sin.push((pos * theta).sin() as f32);
                        }
                    }
                }
            }
        }
        Ok((
            Tensor::from_vec(cos, (n, hd / 2), dev)?,
            Tensor::from_vec(sin, (n, hd / 2), dev)?,
        ))
    }

    /// Every block's dense layer with its module name (`blocks.{i}.attn1.to_q`, ...,
    /// `blocks.{i}.ffn.net.2`): the LoRA targets.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        self.blocks
            .iter_mut()
            .enumerate()
            .flat_map(|(i, b)| b.linears_mut(&format!("blocks.{i}")))
            .collect()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The patch embedding of latents `x` (b, c, f, h, w): each patch's pixels (c, pt, ph, pw)
    /// through one linear → hidden states (b, tokens, dim).
    pub fn embed(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, f, h, w) = x.dims5()?;
        let [pt, ph, pw] = self.cfg.patch_size;
        let (nf, nh, nw) = (f / pt, h / ph, w / pw);
        let patches = x
            .reshape(vec![b, c, nf, pt, nh, ph, nw, pw])?
            .permute(vec![0, 2, 4, 6, 1, 3, 5, 7])?
            .contiguous()?
            .reshape((b, nf * nh * nw, c * pt * ph * pw))?;
        patches
            .broadcast_matmul(&self.patch.t()?)?
            .broadcast_add(&self.patch_bias)
    }

    /// The conditioning of latents `x` at timesteps `t` (b) with the text context `ctx`
    /// (b, m, text_dim): time embedding and its projection, projected text, RoPE tables.
    pub fn condition(&self, x: &Tensor, t: &Tensor, ctx: &Tensor) -> Result<Cond> {
        let shape = x.dims5()?;
        let (b, _, f, h, w) = shape;
        let [pt, ph, pw] = self.cfg.patch_size;
        let dt = x.dtype();
        let temb = self.time2.forward(
            &self
                .time1
                .forward(&self.timestep_features(t)?.to_dtype(dt)?)?
                .silu()?,
        )?;
        let tproj = self.time_proj.forward(&temb.silu()?)?.reshape((b, 6, ()))?;
        let ctx = self.text2.forward(&self.text1.forward(ctx)?.gelu()?)?;
        let rope = self.rope(f / pt, h / ph, w / pw, x.device())?;
        let rope = (rope.0.to_dtype(dt)?, rope.1.to_dtype(dt)?);
        Ok(Cond {
            temb,
            tproj,
            ctx,
            rope,
            shape,
        })
    }

    /// Block `i` on hidden states `hs` (b, tokens, dim).
    pub fn block(&self, i: usize, hs: &Tensor, c: &Cond) -> Result<Tensor> {
        self.blocks[i].forward(hs, &c.tproj, &c.ctx, &c.rope)
    }

    /// The modulated output projection, unpatchified: the prediction (b, c_out, f, h, w).
    pub fn head(&self, hs: &Tensor, c: &Cond) -> Result<Tensor> {
        let (b, _, f, h, w) = c.shape;
        let [pt, ph, pw] = self.cfg.patch_size;
        let (nf, nh, nw) = (f / pt, h / ph, w / pw);
        let mods = self.table.broadcast_add(&c.temb.unsqueeze(1)?)?;
        let (shift, scale) = (mods.narrow(1, 0, 1)?, mods.narrow(1, 1, 1)?);
        let hs = modulate(&layer_norm(hs, self.cfg.eps)?, &shift, &scale)?;
        let out = self.proj_out.forward(&hs)?;
        let co = self.cfg.out_channels;
        out.reshape(vec![b, nf, nh, nw, pt, ph, pw, co])?
            .permute(vec![0, 7, 1, 4, 2, 5, 3, 6])?
            .contiguous()?
            .reshape((b, co, f, h, w))
    }

    /// The prediction for latents `x` (b, c, f, h, w) at timesteps `t` (b) with the text
    /// context `ctx` (b, m, text_dim).
    pub fn forward(&self, x: &Tensor, t: &Tensor, ctx: &Tensor) -> Result<Tensor> {
        let mut hs = self.embed(x)?;
        let c = self.condition(x, t, ctx)?;
        for i in 0..self.blocks.len() {
            hs = self.block(i, &hs, &c)?;
        }
        self.head(&hs, &c)
    }
}
