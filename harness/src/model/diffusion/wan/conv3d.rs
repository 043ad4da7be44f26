//! A causal 3D convolution (Wan's `CausalConv3d`) from candle's conv2d over frame slices:
//! candle 0.11 has no conv3d.
//!
//! Output frame `t` is `bias + Σ_k conv2d(frame(t + k − (kt − 1)), W[:, :, k])`, over a
//! sequence whose `kt − 1` frames in front are the feature cache of the previous chunk (the
//! last frames of its input) or, at the start, zeros: a zero frame is skipped, not computed.
//! The feature cache (`CACHE_FRAMES` = 2 for a temporal kernel of 3) is returned with the
//! output, for the next chunk.
//!
//! What this changes in memory compared with cuDNN's conv3d (what torch runs on a GPU):
//! - torch first pads the input (`F.pad`, after `torch.cat` with the cache): a copy of the
//!   whole chunk with 2 more frames. Here the cache and the chunk are read in place; a frame
//!   slice is copied to a contiguous (b, c, h, w) tensor as it is used (one input frame at a
//!   time).
//! - cuDNN runs one implicit-GEMM kernel over the whole chunk with a workspace sized by the
//!   algorithm. Here every output frame is `kt` conv2d calls, each with candle's own
//!   temporaries (on the CPU an im2col buffer of `kh·kw × c_in × h × w` for one frame), plus a
//!   one-frame accumulator: the transient memory scales with one frame, not with the chunk.
//! - the output is preallocated for the chunk and written frame by frame (no stack of frames).
//! - the cache is the same in both: 2 frames of every causal convolution's input, kept from
//!   one chunk to the next.
//!
//! The weights are held as `kt` contiguous 2D kernels (o, i, kh, kw), the same bytes as the
//! stored 5D tensor.
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

/// A causal conv3d with a temporal kernel `kt`, spatial kernel `k × k`, spatial padding `pad`
/// and stride 1 (all of the Wan VAE decoder's).
#[derive(Clone, Debug)]
pub struct CausalConv3d {
    /// One 2D kernel per temporal tap, oldest frame first.
    taps: Vec<Tensor>,
    bias: Tensor,
    pad: usize,
}

impl CausalConv3d {
    /// Loads `weight` (o, i, kt, k, k) and `bias` (o) under `vb`.
    pub fn new(
        i: usize,
        o: usize,
        kt: usize,
        k: usize,
        pad: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        let w = vb.get((o, i, kt, k, k), "weight")?;
        let bias = vb.get(o, "bias")?;
        let taps = (0..kt)
            .map(|t| w.narrow(2, t, 1)?.squeeze(2)?.contiguous())
            .collect::<Result<Vec<_>>>()?;
        Ok(CausalConv3d { taps, bias, pad })
    }

    /// The temporal kernel.
    pub fn kt(&self) -> usize {
        self.taps.len()
    }

    /// Frames of input kept between chunks.
    pub fn cache_frames(&self) -> usize {
        self.kt() - 1
    }

    /// Convolves `x` (b, c, t, h, w) after `cache` (b, c, n, h, w), n ≤ kt − 1 (None: zeros):
    /// the output (b, o, t, h', w') and the next cache (the last kt − 1 frames of cache ++ x;
    /// None for a temporal kernel of 1).
    pub fn forward(&self, x: &Tensor, cache: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        let (b, _, t, _, _) = x.dims5()?;
        let keep = self.cache_frames();
        let n_cache = cache.map_or(Ok(0), |c| c.dim(2))?;
        // The padded sequence: `keep − n_cache` zeros, the cache, then x.
        let zeros = keep - n_cache.min(keep);
        let frame = |j: usize| -> Result<Option<Tensor>> {
            if j < zeros {
                return Ok(None);
            }
            let j = j - zeros;
            let src = match cache {
                Some(c) if j < n_cache => c.narrow(2, j, 1)?,
                _ => x.narrow(2, j - n_cache, 1)?,
            };
            Ok(Some(src.squeeze(2)?.contiguous()?))
        };
        let mut out: Option<Tensor> = None;
        for ti in 0..t {
            let mut acc: Option<Tensor> = None;
            for (k, w) in self.taps.iter().enumerate() {
                let Some(f) = frame(ti + k)? else { continue };
                let y = f.conv2d(w, self.pad, 1, 1, 1)?;
                drop(f);
                acc = Some(match acc {
                    None => y,
                    Some(a) => (a + y)?,
                });
            }
            let acc = acc
                .expect("the current frame is never padding")
                .broadcast_add(&self.bias.reshape((1, (), 1, 1))?)?;
            let out = match &out {
                Some(o) => o,
                None => {
                    let (_, o, h, w) = acc.dims4()?;
                    out = Some(Tensor::zeros((b, o, t, h, w), acc.dtype(), acc.device())?);
                    out.as_ref().expect("just set")
                }
            };
            out.slice_set(&acc.unsqueeze(2)?, 2, ti)?;
        }
        let out = out.expect("a chunk has at least one frame");
        let next = if keep == 0 {
            None
        } else if t >= keep {
            Some(x.narrow(2, t - keep, keep)?.contiguous()?)
        } else {
            // Fewer new frames than the cache holds: the cache's last frames, then x.
            let n = (keep - t).min(n_cache);
            match cache {
                Some(c) if n > 0 => Some(Tensor::cat(&[&c.narrow(2, n_cache - n, n)?, x], 2)?),
                _ => Some(x.contiguous()?),
            }
        };
        Ok((out, next))
    }
}

/// Feature caches of every causal convolution of a model, in call order (diffusers'
/// `feat_cache` and `feat_idx`): reset the index at the start of each chunk.
#[derive(Debug, Default)]
pub struct FeatCache {
    slots: Vec<Option<Tensor>>,
    next: usize,
}

impl FeatCache {
    /// Starts a chunk: the convolutions are called again from the first.
    pub fn start_chunk(&mut self) {
        self.next = 0;
    }

    /// Runs `conv` on `x` with its cache slot, and stores the new cache.
    pub fn conv(&mut self, conv: &CausalConv3d, x: &Tensor) -> Result<Tensor> {
        if self.slots.len() <= self.next {
            self.slots.resize(self.next + 1, None);
        }
        let (y, next) = conv.forward(x, self.slots[self.next].as_ref())?;
        self.slots[self.next] = next;
        self.next += 1;
        Ok(y)
    }

    /// Runs `conv` from the second chunk on; the first chunk only claims its slot (Wan's
    /// upsample3d `"Rep"`: the first latent frame is not doubled). From then on the cache is
    /// as in [`Self::conv`], zeros in front of the first frame.
    pub fn conv_after_first(&mut self, conv: &CausalConv3d, x: &Tensor) -> Result<Option<Tensor>> {
        if self.slots.len() <= self.next {
            self.slots.resize(self.next + 1, None);
            self.next += 1;
            return Ok(None);
        }
        self.conv(conv, x).map(Some)
    }

    /// Bytes held by the caches.
    pub fn bytes(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}

/// Channel-first RMS normalization of Wan's VAE (`F.normalize` over dim 1 × √C × γ): `x`
/// (b, c, ...) and `gamma` (c).
pub fn rms_norm_channels(x: &Tensor, gamma: &Tensor) -> Result<Tensor> {
    let c = x.dim(1)?;
    let norm = x
        .sqr()?
        .sum_keepdim(1)?
        .sqrt()?
        .clamp(1e-12, f64::INFINITY)?;
    let mut shape = vec![1usize; x.rank()];
    shape[1] = c;
    let g = (gamma.reshape(shape)? * (c as f64).sqrt())?;
    x.broadcast_div(&norm)?.broadcast_mul(&g)
}

/// Frames (b, c, t, h, w) → images (b·t, c, h, w).
pub fn frames_to_images(x: &Tensor) -> Result<Tensor> {
    let (b, c, t, h, w) = x.dims5()?;
    x.permute((0, 2, 1, 3, 4))?
        .contiguous()?
        .reshape((b * t, c, h, w))
}

/// Images (b·t, c, h, w) → frames (b, c, t, h, w).
pub fn images_to_frames(x: &Tensor, b: usize) -> Result<Tensor> {
    let (bt, c, h, w) = x.dims4()?;
    x.reshape((b, bt / b, c, h, w))?
        .permute((0, 2, 1, 3, 4))?
        .contiguous()
}
