//! Stable Diffusion's UNet2DConditionModel for training (LoRA, `workload/finetune.rs`),
//! written after candle-transformers 0.11.1's `stable_diffusion::{unet_2d, unet_2d_blocks,
//! resnet, attention}` with diffusers' tensor names, so it loads the same `unet/` directory
//! through candle's VarBuilder as [`super::Sd`] does: conv_in, the sinusoidal time embedding
//! and its two linears, down blocks (ResnetBlock2D, Transformer2DModel when cross-attention,
//! a stride-2 conv downsampler), the mid block (resnet, transformer, resnet), up blocks (the
//! skips concatenated, a nearest ×2 upsampler and a conv), GroupNorm, SiLU and conv_out.
//!
//! Why not candle's module: it has no LoRA injection point, and several of its ops record no
//! backward (candle-nn's fused `layer_norm` and `softmax_last_dim`). Here:
//! - the attention projections `to_q`, `to_k`, `to_v`, `to_out.0` are [`Linear`]s,
//!   the LoRA targets of diffusers' `train_text_to_image_lora.py` (PEFT `target_modules =
//!   ["to_k", "to_q", "to_v", "to_out.0"]`), found by [`SdUnet::attention_linears_mut`];
//! - LayerNorm is [`layer_norm`] (composed in f32), the softmax vramlab-kernels'
//!   (fused, with a backward), GroupNorm candle-nn's (composed from ops), SiLU, GELU,
//!   `upsample_nearest2d` (integer, uniform factor) and `conv2d` candle's (each has a
//!   backward in candle 0.11.1);
//! - every convolution and dense layer is [`Conv2d`] / [`Linear`], whose
//!   frozen weights take no gradient (candle's own backward would hold one per kernel until
//!   `backward` returns).
//!
//! Like candle's, the GEGLU feed-forward uses the tanh GELU (diffusers: erf) and attention
//! runs `eager` (scores in the activations' dtype) or `flash` (vramlab-kernels' tiled one).
//! The UNet is not a stack of equal layers (skips cross it), so per-layer checkpointing is not
//! offered.
use super::config::{DownBlock, UNetConfig, UpBlock};
use crate::model::nn::{attend, layer_norm, Conv2d, Linear};
use crate::vocab::Attention;
use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{group_norm, linear, GroupNorm, VarBuilder};

/// A dense layer with a bias (or without), as [`Linear`].
fn dense(i: usize, o: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    let b = if bias { Some(vb.get(o, "bias")?) } else { None };
    Ok(Linear::new(vb.get((o, i), "weight")?, b))
}

/// ResnetBlock2D: GroupNorm, SiLU, conv3×3, + time projection, GroupNorm, SiLU, conv3×3,
/// + the input (through a 1×1 conv when the channels change).
struct Resnet {
    norm1: GroupNorm,
    conv1: Conv2d,
    temb: candle_nn::Linear,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl Resnet {
    fn new(c: &UNetConfig, i: usize, o: usize, vb: VarBuilder) -> Result<Self> {
        let (g, eps, t) = (c.norm_num_groups, c.norm_eps, 4 * c.block_out_channels[0]);
        Ok(Resnet {
            norm1: group_norm(g, i, eps, vb.pp("norm1"))?,
            conv1: Conv2d::new(i, o, 3, 1, 1, vb.pp("conv1"))?,
            temb: linear(t, o, vb.pp("time_emb_proj"))?,
            norm2: group_norm(g, o, eps, vb.pp("norm2"))?,
            conv2: Conv2d::new(o, o, 3, 1, 1, vb.pp("conv2"))?,
            shortcut: (i != o)
                .then(|| Conv2d::new(i, o, 1, 0, 1, vb.pp("conv_shortcut")))
                .transpose()?,
        })
    }

    fn forward(&self, x: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward(&self.norm1.forward(x)?.silu()?)?;
        let t = self
            .temb
            .forward(&temb.silu()?)?
            .unsqueeze(2)?
            .unsqueeze(3)?;
        let h = h.broadcast_add(&t)?;
        let h = self.conv2.forward(&self.norm2.forward(&h)?.silu()?)?;
        match &self.shortcut {
            Some(s) => s.forward(x)? + h,
            None => x + h,
        }
    }
}

/// Self- or cross-attention (diffusers' Attention): q from the hidden states, k and v from
/// the context (the hidden states themselves for `attn1`).
struct Attn {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
    kind: Attention,
}

impl Attn {
    fn new(dim: usize, ctx: usize, heads: usize, kind: Attention, vb: VarBuilder) -> Result<Self> {
        Ok(Attn {
            q: dense(dim, dim, false, vb.pp("to_q"))?,
            k: dense(ctx, dim, false, vb.pp("to_k"))?,
            v: dense(ctx, dim, false, vb.pp("to_v"))?,
            out: dense(dim, dim, true, vb.pp("to_out.0"))?,
            heads,
            kind,
        })
    }

    fn forward(&self, x: &Tensor, ctx: Option<&Tensor>) -> Result<Tensor> {
        let ctx = ctx.unwrap_or(x);
        let heads = |t: Tensor| crate::model::nn::split_heads(&t, self.heads);
        let q = heads(self.q.forward(x)?)?;
        let k = heads(self.k.forward(ctx)?)?;
        let v = heads(self.v.forward(ctx)?)?;
        self.out.forward(&attend(q, k, &v, self.kind)?)
    }
}

/// BasicTransformerBlock: self-attention, cross-attention to the text, GEGLU feed-forward,
/// each after a LayerNorm and added to the residual.
struct Block {
    norms: [(Tensor, Tensor); 3],
    attn1: Attn,
    attn2: Attn,
    ff_in: Linear,
    ff_out: Linear,
}

impl Block {
    fn new(dim: usize, ctx: usize, heads: usize, kind: Attention, vb: VarBuilder) -> Result<Self> {
        let norm = |n: &str| -> Result<(Tensor, Tensor)> {
            Ok((
                vb.get(dim, &format!("{n}.weight"))?,
                vb.get(dim, &format!("{n}.bias"))?,
            ))
        };
        Ok(Block {
            norms: [norm("norm1")?, norm("norm2")?, norm("norm3")?],
            attn1: Attn::new(dim, dim, heads, kind, vb.pp("attn1"))?,
            attn2: Attn::new(dim, ctx, heads, kind, vb.pp("attn2"))?,
            ff_in: dense(dim, 8 * dim, true, vb.pp("ff.net.0.proj"))?,
            ff_out: dense(4 * dim, dim, true, vb.pp("ff.net.2"))?,
        })
    }

    fn forward(&self, x: &Tensor, ctx: &Tensor) -> Result<Tensor> {
        let norm = |i: usize, x: &Tensor| layer_norm(x, &self.norms[i].0, &self.norms[i].1, 1e-5);
        let x = (self.attn1.forward(&norm(0, x)?, None)? + x)?;
        let x = (self.attn2.forward(&norm(1, &x)?, Some(ctx))? + &x)?;
        let h = self.ff_in.forward(&norm(2, &x)?)?.chunk(2, D::Minus1)?;
        let h = (&h[0] * h[1].gelu()?)?;
        self.ff_out.forward(&h)? + x
    }
}

/// proj_in / proj_out: a 1×1 conv, or a linear (`use_linear_projection`).
enum Proj {
    Conv(Conv2d),
    Linear(Linear),
}

/// Transformer2DModel: GroupNorm (eps 1e-6), proj_in, the blocks over the h·w tokens,
/// proj_out, + the input.
struct Transformer {
    norm: GroupNorm,
    proj_in: Proj,
    blocks: Vec<Block>,
    proj_out: Proj,
}

impl Transformer {
    fn new(
        c: &UNetConfig,
        ch: usize,
        heads: usize,
        depth: usize,
        kind: Attention,
        vb: VarBuilder,
    ) -> Result<Self> {
        let proj = |n: &str| -> Result<Proj> {
            Ok(if c.use_linear_projection {
                Proj::Linear(dense(ch, ch, true, vb.pp(n))?)
            } else {
                Proj::Conv(Conv2d::new(ch, ch, 1, 0, 1, vb.pp(n))?)
            })
        };
        let tb = vb.pp("transformer_blocks");
        Ok(Transformer {
            norm: group_norm(c.norm_num_groups, ch, 1e-6, vb.pp("norm"))?,
            proj_in: proj("proj_in")?,
            blocks: (0..depth)
                .map(|i| Block::new(ch, c.cross_attention_dim, heads, kind, tb.pp(i)))
                .collect::<Result<_>>()?,
            proj_out: proj("proj_out")?,
        })
    }

    fn forward(&self, x: &Tensor, ctx: &Tensor) -> Result<Tensor> {
        let (b, ch, h, w) = x.dims4()?;
        let tokens = |t: Tensor| t.permute((0, 2, 3, 1))?.reshape((b, h * w, ch));
        let image = |t: Tensor| t.reshape((b, h, w, ch))?.permute((0, 3, 1, 2));
        let n = self.norm.forward(x)?;
        let mut hs = match &self.proj_in {
            Proj::Conv(p) => tokens(p.forward(&n)?)?,
            Proj::Linear(p) => p.forward(&tokens(n)?)?,
        };
        for blk in &self.blocks {
            hs = blk.forward(&hs, ctx)?;
        }
        let out = match &self.proj_out {
            Proj::Conv(p) => p.forward(&image(hs)?)?,
            Proj::Linear(p) => image(p.forward(&hs)?)?,
        };
        out + x
    }
}

/// One resolution level of the UNet (down or up): resnets, each followed by a transformer
/// when the level has cross-attention, then a sampler (stride-2 conv down, nearest ×2 and a
/// conv up).
struct Level {
    resnets: Vec<Resnet>,
    attns: Vec<Transformer>,
    sampler: Option<Conv2d>,
}

impl Level {
    /// The level's layer `j`: resnet, then its transformer if any.
    fn layer(&self, j: usize, x: &Tensor, temb: &Tensor, ctx: &Tensor) -> Result<Tensor> {
        let x = self.resnets[j].forward(x, temb)?;
        match self.attns.get(j) {
            Some(t) => t.forward(&x, ctx),
            None => Ok(x),
        }
    }

    /// The transformers' attention projections under the level's `prefix`.
    fn attention_linears_mut(&mut self, prefix: &str) -> Vec<(String, &mut Linear)> {
        let mut v = Vec::new();
        for (i, t) in self.attns.iter_mut().enumerate() {
            for (j, b) in t.blocks.iter_mut().enumerate() {
                for (n, a) in [("attn1", &mut b.attn1), ("attn2", &mut b.attn2)] {
                    let p = format!("{prefix}.attentions.{i}.transformer_blocks.{j}.{n}");
                    v.push((format!("{p}.to_q"), &mut a.q));
                    v.push((format!("{p}.to_k"), &mut a.k));
                    v.push((format!("{p}.to_v"), &mut a.v));
                    v.push((format!("{p}.to_out.0"), &mut a.out));
                }
            }
        }
        v
    }
}

/// UNet2DConditionModel (SD 1.x/2.x layout; no SDXL `add_embedding`).
pub struct SdUnet {
    cfg: UNetConfig,
    conv_in: Conv2d,
    time1: candle_nn::Linear,
    time2: candle_nn::Linear,
    down: Vec<Level>,
    mid: Level,
    up: Vec<Level>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl SdUnet {
    /// The UNet over `vb`'s tensors (diffusers' names), attention run as `kind` (`eager` or
    /// `flash`; anything else is an error).
    pub fn new(c: &UNetConfig, vb: VarBuilder, kind: Attention) -> Result<Self> {
        if !matches!(kind, Attention::Eager | Attention::Flash) {
            candle_core::bail!("attention `{kind}`: the trainable UNet runs `eager` or `flash`");
        }
        let ch = &c.block_out_channels;
        let n = ch.len();
        let t = 4 * ch[0];
        let layers = c.layers_per_block;
        let heads = |i: usize| c.attention_head_dim.at(i);
        let depth = |i: usize| c.transformer_layers_per_block.at(i);
        let transformers = |cross: bool, count: usize, i: usize, vb: &VarBuilder| {
            (0..if cross { count } else { 0 })
                .map(|j| Transformer::new(c, ch[i], heads(i), depth(i), kind, vb.pp(j)))
                .collect::<Result<Vec<_>>>()
        };
        let mut down = Vec::with_capacity(n);
        for i in 0..n {
            let vb = vb.pp(format!("down_blocks.{i}"));
            let cross = c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D;
            let inp = if i == 0 { ch[0] } else { ch[i - 1] };
            down.push(Level {
                resnets: (0..layers)
                    .map(|j| {
                        Resnet::new(
                            c,
                            if j == 0 { inp } else { ch[i] },
                            ch[i],
                            vb.pp(format!("resnets.{j}")),
                        )
                    })
                    .collect::<Result<_>>()?,
                attns: transformers(cross, layers, i, &vb.pp("attentions"))?,
                sampler: (i + 1 < n)
                    .then(|| Conv2d::new(ch[i], ch[i], 3, 1, 2, vb.pp("downsamplers.0.conv")))
                    .transpose()?,
            });
        }
        let last = ch[n - 1];
        let vm = vb.pp("mid_block");
        let mid = Level {
            resnets: (0..2)
                .map(|j| Resnet::new(c, last, last, vm.pp(format!("resnets.{j}"))))
                .collect::<Result<_>>()?,
            attns: vec![Transformer::new(
                c,
                last,
                heads(n - 1),
                depth(n - 1),
                kind,
                vm.pp("attentions.0"),
            )?],
            sampler: None,
        };
        let mut up = Vec::with_capacity(n);
        let mut prev = last;
        for (u, kind_u) in c.up_block_types.iter().enumerate() {
            let vb = vb.pp(format!("up_blocks.{u}"));
            let r = n - 1 - u;
            let skip_last = if r == 0 { ch[0] } else { ch[r - 1] };
            let resnets = (0..=layers)
                .map(|j| {
                    let skip = if j == layers { skip_last } else { ch[r] };
                    let inp = if j == 0 { prev } else { ch[r] };
                    Resnet::new(c, inp + skip, ch[r], vb.pp(format!("resnets.{j}")))
                })
                .collect::<Result<_>>()?;
            let cross = *kind_u == UpBlock::CrossAttnUpBlock2D;
            up.push(Level {
                resnets,
                attns: transformers(cross, layers + 1, r, &vb.pp("attentions"))?,
                sampler: (u + 1 < n)
                    .then(|| Conv2d::new(ch[r], ch[r], 3, 1, 1, vb.pp("upsamplers.0.conv")))
                    .transpose()?,
            });
            prev = ch[r];
        }
        Ok(SdUnet {
            cfg: c.clone(),
            conv_in: Conv2d::new(c.in_channels, ch[0], 3, 1, 1, vb.pp("conv_in"))?,
            time1: linear(ch[0], t, vb.pp("time_embedding.linear_1"))?,
            time2: linear(t, t, vb.pp("time_embedding.linear_2"))?,
            down,
            mid,
            up,
            norm_out: group_norm(c.norm_num_groups, ch[0], c.norm_eps, vb.pp("conv_norm_out"))?,
            conv_out: Conv2d::new(ch[0], c.out_channels, 3, 1, 1, vb.pp("conv_out"))?,
        })
    }

    /// Every attention projection with its module name
    /// (`down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q`, ...,
    /// `mid_block.attentions.0...`, `up_blocks.{u}...`): the LoRA targets.
    pub fn attention_linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut v = Vec::new();
        for (i, l) in self.down.iter_mut().enumerate() {
            v.extend(l.attention_linears_mut(&format!("down_blocks.{i}")));
        }
        v.extend(self.mid.attention_linears_mut("mid_block"));
        for (i, l) in self.up.iter_mut().enumerate() {
            v.extend(l.attention_linears_mut(&format!("up_blocks.{i}")));
        }
        v
    }

    /// The time embedding of timesteps `t` (b) (sinusoidal, cos first, shift 0, then
    /// linear, SiLU, linear), in `dtype`.
    pub fn time_embedding(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let half = self.cfg.block_out_channels[0] / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|i| (-(10000f32.ln()) * i as f32 / half as f32).exp())
            .collect();
        let f = Tensor::from_vec(freqs, (1, half), t.device())?;
        let args = t.to_dtype(DType::F32)?.unsqueeze(1)?.broadcast_mul(&f)?;
        let emb = Tensor::cat(&[args.cos()?, args.sin()?], 1)?.to_dtype(dtype)?;
        self.time2.forward(&self.time1.forward(&emb)?.silu()?)
    }

    /// The predicted noise for latents `x` (b, c, h, w) at timesteps `t` (b) under the text
    /// context `ctx` (b, m, cross_attention_dim). h and w are multiples of 2^(levels − 1).
    pub fn forward(&self, x: &Tensor, t: &Tensor, ctx: &Tensor) -> Result<Tensor> {
        let temb = self.time_embedding(t, x.dtype())?;
        let mut x = self.conv_in.forward(x)?;
        let mut skips = vec![x.clone()];
        for l in &self.down {
            for j in 0..l.resnets.len() {
                x = l.layer(j, &x, &temb, ctx)?;
                skips.push(x.clone());
            }
            if let Some(s) = &l.sampler {
                x = s.forward(&x)?;
                skips.push(x.clone());
            }
        }
        // The mid block: resnet, transformer, resnet.
        x = self.mid.layer(0, &x, &temb, ctx)?;
        x = self.mid.layer(1, &x, &temb, ctx)?;
        for l in &self.up {
            for j in 0..l.resnets.len() {
                let skip = skips
                    .pop()
                    .ok_or_else(|| candle_core::Error::Msg("skip".into()))?;
                x = l.layer(j, &Tensor::cat(&[&x, &skip], 1)?, &temb, ctx)?;
            }
            if let Some(s) = &l.sampler {
                let (_, _, h, w) = x.dims4()?;
                x = s.forward(&x.upsample_nearest2d(2 * h, 2 * w)?)?;
            }
        }
        self.conv_out.forward(&self.norm_out.forward(&x)?.silu()?)
    }
}
