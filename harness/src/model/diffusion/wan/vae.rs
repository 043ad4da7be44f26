//! The Wan2.1 VAE decoder (AutoencoderKLWan's `post_quant_conv` and `decoder`) as candle
//! modules: causal 3D convolutions ([`super::CausalConv3d`]) with a feature cache, decoding one
//! latent frame per chunk into a preallocated output, as Wan's `decode` does (the first chunk
//! yields one frame, each later chunk `temporal_factor` frames).
//!
//! Tensor names are diffusers'. The encoder is not built (text-to-video never runs it); its
//! parameters are counted by [`super::vae_encoder_params`].
use super::config::WanVaeConfig;
use super::conv3d::{
    frames_to_images, images_to_frames, rms_norm_channels, CausalConv3d, FeatCache,
};
use candle_core::{Result, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Module, VarBuilder};

/// Wan's residual block: RMS norm, SiLU, causal 3×3×3 conv, twice, plus a 1×1×1 shortcut where
/// the width changes.
struct ResBlock {
    norm1: Tensor,
    conv1: CausalConv3d,
    norm2: Tensor,
    conv2: CausalConv3d,
    shortcut: Option<CausalConv3d>,
}

impl ResBlock {
    fn new(i: usize, o: usize, vb: VarBuilder) -> Result<Self> {
        Ok(ResBlock {
            norm1: vb.get((i, 1, 1, 1), "norm1.gamma")?.flatten_all()?,
            conv1: CausalConv3d::new(i, o, 3, 3, 1, vb.pp("conv1"))?,
            norm2: vb.get((o, 1, 1, 1), "norm2.gamma")?.flatten_all()?,
            conv2: CausalConv3d::new(o, o, 3, 3, 1, vb.pp("conv2"))?,
            shortcut: if i != o {
                Some(CausalConv3d::new(i, o, 1, 1, 0, vb.pp("conv_shortcut"))?)
            } else {
                None
            },
        })
    }

    fn forward(&self, x: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let h = match &self.shortcut {
            Some(s) => s.forward(x, None)?.0,
            None => x.clone(),
        };
        let y = rms_norm_channels(x, &self.norm1)?.silu()?;
        let y = cache.conv(&self.conv1, &y)?;
        let y = rms_norm_channels(&y, &self.norm2)?.silu()?;
        let y = cache.conv(&self.conv2, &y)?;
        y + h
    }
}

/// The mid block's single-head attention over each frame's pixels.
struct FrameAttention {
    norm: Tensor,
    qkv: Conv2d,
    proj: Conv2d,
}

impl FrameAttention {
    fn new(d: usize, vb: VarBuilder) -> Result<Self> {
        let c = Conv2dConfig::default();
        Ok(FrameAttention {
            norm: vb.get((d, 1, 1), "norm.gamma")?.flatten_all()?,
            qkv: candle_nn::conv2d(d, 3 * d, 1, c, vb.pp("to_qkv"))?,
            proj: candle_nn::conv2d(d, d, 1, c, vb.pp("proj"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = x.dim(0)?;
        let img = frames_to_images(x)?;
        let (bt, c, h, w) = img.dims4()?;
        let qkv = self
            .qkv
            .forward(&rms_norm_channels(&img, &self.norm)?)?
            .reshape((bt, 3 * c, h * w))?
            .transpose(1, 2)?;
        let q = qkv.narrow(2, 0, c)?.contiguous()?;
        let k = qkv.narrow(2, c, c)?.contiguous()?;
        let v = qkv.narrow(2, 2 * c, c)?.contiguous()?;
        drop(qkv);
        let scores = (q.matmul(&k.t()?)? / (c as f64).sqrt())?;
        let p = candle_nn::ops::softmax_last_dim(&scores)?;
        drop(scores);
        let y = p.matmul(&v)?.transpose(1, 2)?.reshape((bt, c, h, w))?;
        let y = self.proj.forward(&y)?;
        images_to_frames(&y, b)? + x
    }
}

/// An up block's resampler: nearest ×2 and a 3×3 conv to half the channels, after (upsample3d)
/// a causal (3, 1, 1) conv that doubles the frames.
struct Upsample {
    time_conv: Option<CausalConv3d>,
    conv: Conv2d,
}

impl Upsample {
    fn new(d: usize, temporal: bool, vb: VarBuilder) -> Result<Self> {
        let c = Conv2dConfig {
            padding: 1,
            ..Default::default()
        };
        Ok(Upsample {
            time_conv: if temporal {
                Some(CausalConv3d::new(d, 2 * d, 3, 1, 0, vb.pp("time_conv"))?)
            } else {
                None
            },
            conv: candle_nn::conv2d(d, d / 2, 3, c, vb.pp("resample.1"))?,
        })
    }

    fn forward(&self, x: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        let x = match &self.time_conv {
            // The first chunk passes through (Wan's "Rep"): one frame stays one frame.
            Some(tc) => match cache.conv_after_first(tc, x)? {
                None => x.clone(),
                Some(y) => {
                    let (b, c2, t, h, w) = y.dims5()?;
                    let c = c2 / 2;
                    y.reshape((b, 2, c, t, h, w))?
                        .permute((0, 2, 3, 1, 4, 5))?
                        .contiguous()?
                        .reshape((b, c, 2 * t, h, w))?
                }
            },
            None => x.clone(),
        };
        let b = x.dim(0)?;
        let img = frames_to_images(&x)?;
        drop(x);
        let (_, _, h, w) = img.dims4()?;
        let up = img.upsample_nearest2d(2 * h, 2 * w)?;
        drop(img);
        images_to_frames(&self.conv.forward(&up)?, b)
    }
}

struct UpBlock {
    resnets: Vec<ResBlock>,
    upsample: Option<Upsample>,
}

/// AutoencoderKLWan's `post_quant_conv` and `decoder`.
pub struct WanDecoder {
    post_quant: CausalConv3d,
    conv_in: CausalConv3d,
    mid: (ResBlock, FrameAttention, ResBlock),
    up: Vec<UpBlock>,
    norm_out: Tensor,
    conv_out: CausalConv3d,
    temporal_factor: usize,
    spatial_factor: usize,
}

impl WanDecoder {
    /// Builds the decoder of `c` under the VAE's root `vb`.
    pub fn new(c: &WanVaeConfig, vb: VarBuilder) -> Result<Self> {
        let d = c.decoder_dims();
        let n = c.dim_mult.len();
        let up_t = c.temporal_upsample();
        let z = c.z_dim;
        let post_quant = CausalConv3d::new(z, z, 1, 1, 0, vb.pp("post_quant_conv"))?;
        let vb = vb.pp("decoder");
        let conv_in = CausalConv3d::new(z, d[0], 3, 3, 1, vb.pp("conv_in"))?;
        let m = vb.pp("mid_block");
        let mid = (
            ResBlock::new(d[0], d[0], m.pp("resnets.0"))?,
            FrameAttention::new(d[0], m.pp("attentions.0"))?,
            ResBlock::new(d[0], d[0], m.pp("resnets.1"))?,
        );
        let mut up = Vec::with_capacity(n);
        for i in 0..n {
            let vbi = vb.pp(format!("up_blocks.{i}"));
            let mut cin = c.up_in(i);
            let mut resnets = Vec::new();
            for j in 0..=c.num_res_blocks {
                resnets.push(ResBlock::new(
                    cin,
                    d[i + 1],
                    vbi.pp(format!("resnets.{j}")),
                )?);
                cin = d[i + 1];
            }
            let upsample = if i + 1 < n {
                Some(Upsample::new(cin, up_t[i], vbi.pp("upsamplers.0"))?)
            } else {
                None
            };
            up.push(UpBlock { resnets, upsample });
        }
        Ok(WanDecoder {
            post_quant,
            conv_in,
            mid,
            up,
            norm_out: vb.get((d[n], 1, 1, 1), "norm_out.gamma")?.flatten_all()?,
            conv_out: CausalConv3d::new(d[n], 3, 3, 3, 1, vb.pp("conv_out"))?,
            temporal_factor: c.temporal_factor(),
            spatial_factor: c.spatial_factor(),
        })
    }

    /// Decodes one chunk of latent frames (b, z, t, h, w) through the caches.
    pub fn decode_chunk(&self, z: &Tensor, cache: &mut FeatCache) -> Result<Tensor> {
        cache.start_chunk();
        let x = self.post_quant.forward(z, None)?.0;
        let mut x = cache.conv(&self.conv_in, &x)?;
        x = self.mid.0.forward(&x, cache)?;
        x = self.mid.1.forward(&x)?;
        x = self.mid.2.forward(&x, cache)?;
        for b in &self.up {
            for r in &b.resnets {
                x = r.forward(&x, cache)?;
            }
            if let Some(u) = &b.upsample {
                x = u.forward(&x, cache)?;
            }
        }
        let x = rms_norm_channels(&x, &self.norm_out)?.silu()?;
        cache.conv(&self.conv_out, &x)?.clamp(-1f32, 1f32)
    }

    /// Output frames of `latent_frames` latent frames: `(T − 1)·4 + 1`.
    pub fn frames(&self, latent_frames: usize) -> usize {
        (latent_frames - 1) * self.temporal_factor + 1
    }

    /// Decodes `z` (b, z, T, h, w) in chunks of `chunks` latent frames (summing to T, the first
    /// of 1, as the causal VAE requires) into a preallocated (b, 3, F, H, W) output.
    pub fn decode_chunks(&self, z: &Tensor, chunks: &[usize]) -> Result<Tensor> {
        let (b, _, t, h, w) = z.dims5()?;
        if chunks.first() != Some(&1) || chunks.iter().sum::<usize>() != t {
            candle_core::bail!("chunks {chunks:?}: the first is 1 latent frame, they sum to {t}");
        }
        let s = self.spatial_factor;
        let out = Tensor::zeros((b, 3, self.frames(t), h * s, w * s), z.dtype(), z.device())?;
        let mut cache = FeatCache::default();
        let (mut at, mut frame) = (0, 0);
        for &n in chunks {
            let part = z.narrow(2, at, n)?.contiguous()?;
            let y = self.decode_chunk(&part, &mut cache)?;
            drop(part);
            let f = y.dim(2)?;
            out.slice_set(&y, 2, frame)?;
            at += n;
            frame += f;
        }
        Ok(out)
    }

    /// Wan's decode: one latent frame per chunk.
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        self.decode_chunks(z, &vec![1; z.dim(2)?])
    }
}

/// AutoencoderKLWan's `encoder` and `quant_conv`, as stored: loaded with the VAE (the
/// checkpoint holds them, and diffusers' `from_pretrained` keeps them resident) but never run
/// by text-to-video. Held as plain tensors under diffusers' names; their count is
/// [`super::vae_encoder_params`].
pub struct WanEncoderWeights(pub Vec<Tensor>);

/// Reads a conv's `weight` (o, i, kernel...) and `bias` (o) into `v`.
fn get_conv(v: &mut Vec<Tensor>, vb: &VarBuilder, o: usize, i: usize, k: &[usize]) -> Result<()> {
    let mut s = vec![o, i];
    s.extend_from_slice(k);
    v.push(vb.get(s, "weight")?);
    v.push(vb.get(o, "bias")?);
    Ok(())
}

/// Reads a residual block's tensors (the ones [`ResBlock::new`] reads) into `v`.
fn get_res(v: &mut Vec<Tensor>, vb: &VarBuilder, i: usize, o: usize) -> Result<()> {
    v.push(vb.get((i, 1, 1, 1), "norm1.gamma")?);
    get_conv(v, &vb.pp("conv1"), o, i, &[3, 3, 3])?;
    v.push(vb.get((o, 1, 1, 1), "norm2.gamma")?);
    get_conv(v, &vb.pp("conv2"), o, o, &[3, 3, 3])?;
    if i != o {
        get_conv(v, &vb.pp("conv_shortcut"), o, i, &[1, 1, 1])?;
    }
    Ok(())
}

impl WanEncoderWeights {
    /// Reads the encoder of `c` under the VAE's root `vb`.
    pub fn new(c: &WanVaeConfig, vb: VarBuilder) -> Result<Self> {
        let mut v = Vec::new();
        let e = vb.pp("encoder");
        let dims: Vec<usize> = std::iter::once(1)
            .chain(c.dim_mult.iter().copied())
            .map(|m| c.base_dim * m)
            .collect();
        let n = c.dim_mult.len();
        get_conv(&mut v, &e.pp("conv_in"), dims[0], 3, &[3, 3, 3])?;
        // diffusers' `down_blocks` is one flat list: each level's residual blocks, then its
        // resampler (a stride-2 3×3 conv, and for downsample3d a (3, 1, 1) time conv).
        let mut k = 0;
        for i in 0..n {
            let mut cin = dims[i];
            for _ in 0..c.num_res_blocks {
                get_res(&mut v, &e.pp(format!("down_blocks.{k}")), cin, dims[i + 1])?;
                cin = dims[i + 1];
                k += 1;
            }
            if i + 1 < n {
                let r = e.pp(format!("down_blocks.{k}"));
                get_conv(&mut v, &r.pp("resample.1"), cin, cin, &[3, 3])?;
                if c.temperal_downsample[i] {
                    get_conv(&mut v, &r.pp("time_conv"), cin, cin, &[3, 1, 1])?;
                }
                k += 1;
            }
        }
        let d = dims[n];
        let m = e.pp("mid_block");
        get_res(&mut v, &m.pp("resnets.0"), d, d)?;
        let a = m.pp("attentions.0");
        v.push(a.get((d, 1, 1), "norm.gamma")?);
        get_conv(&mut v, &a.pp("to_qkv"), 3 * d, d, &[1, 1])?;
        get_conv(&mut v, &a.pp("proj"), d, d, &[1, 1])?;
        get_res(&mut v, &m.pp("resnets.1"), d, d)?;
        v.push(e.get((d, 1, 1, 1), "norm_out.gamma")?);
        let z2 = 2 * c.z_dim;
        get_conv(&mut v, &e.pp("conv_out"), z2, d, &[3, 3, 3])?;
        get_conv(&mut v, &vb.pp("quant_conv"), z2, z2, &[1, 1, 1])?;
        Ok(WanEncoderWeights(v))
    }
}
