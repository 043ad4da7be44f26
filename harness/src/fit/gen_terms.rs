//! The terms of a generation phase (docs/src/guides/generation.md): what is exact (weights, text
//! context, latents, decoded images) and what a fit estimates (activation bytes per latent pixel,
//! per output pixel, per token), from the architecture ([`GenArch`]) and the query ([`GenQuery`]).
//! Here, under `fit`, so that the fit and the estimate (`estimate::generate`) share
//! them without an import circle.
use super::Runtime;
use crate::checked::{Checked, Overflow};
use crate::error::InputError;
use crate::model::diffusion::flux::{FluxConfig, PATCH};
use crate::model::diffusion::sd::{DownBlock, SdConfig};
use crate::model::diffusion::wan::WanConfig;
use crate::vocab::{Attention, Backend, Component, GenModel, Phase, Resolution, VaeDecode};
use candle_core::DType;
use serde::Serialize;

/// The uncertain terms of a generation phase, in admission order for a fit.
pub const GEN_TERMS: [&str; 6] = [
    "text_act",
    "denoise_act",
    "vae_act",
    "denoise_scores",
    "vae_scores",
    "const",
];
pub const N_GEN: usize = GEN_TERMS.len();
pub type GenTerms = [f64; N_GEN];
const TEXT_ACT: usize = 0;
const DENOISE_ACT: usize = 1;
const VAE_ACT: usize = 2;
const DENOISE_SCORES: usize = 3;
const VAE_SCORES: usize = 4;
const CONST: usize = 5;

/// The phases of a generation, in the order they run.
pub const GEN_PHASES: [Phase; 4] = [
    Phase::Load,
    Phase::TextEncode,
    Phase::Denoise,
    Phase::VaeDecode,
];

/// What the estimator reads of a generation architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct GenArch {
    pub architecture: &'static str,
    /// Every component with its parameter count, in load order.
    pub components: Vec<(Component, u64)>,
    /// Resolutions are a multiple of this: the VAE's factor (SD), or the VAE's factor times
    /// the denoiser's 2×2 patch (FLUX: 16).
    pub factor: usize,
    /// Output pixels per latent pixel along each side (the VAE's factor).
    pub vae_factor: usize,
    pub latent_channels: usize,
    pub out_channels: usize,
    pub text_len: usize,
    /// The widest text encoder's hidden size (encoders run one after the other).
    pub text_hidden: usize,
    /// Context features per text token the denoiser reads (all encoders concatenated).
    pub context_dim: usize,
    /// Pooled text features per prompt the denoiser reads besides the tokens (FLUX's CLIP
    /// vector; 0 for SD).
    pub pooled_dim: usize,
    /// The denoiser's activation channels per latent pixel at full latent resolution (a
    /// UNet's first level; a DiT's hidden size over the latent pixels of its patch).
    pub denoise_width: usize,
    /// The analytic prior of `denoise_act` (tensors of `denoise_width` per latent pixel alive
    /// at a step's peak) on candle and on torch: a UNet peaks in a convolution, a DiT in its
    /// widest block, which holds tensors of its MLP's width (see each constructor).
    pub denoise_prior: [f64; 2],
    /// Latent pixels per token at the denoiser's first attention level (4 per halving).
    pub attn_pixels_per_token: usize,
    /// Heads at that level.
    pub attn_heads: usize,
    /// Text tokens attending jointly with the image tokens (FLUX's `txt` stream; 0 where the
    /// text is cross-attended). Each counts as `attn_pixels_per_token` latent pixels of
    /// activations.
    pub joint_tokens: usize,
    /// vramlab's denoiser runs `attention = "flash"` (vramlab-kernels' memory-efficient
    /// kernel, no materialized scores): the Wan DiT, vramlab's own code. SD's UNet and FLUX's
    /// transformer are candle-transformers' eager attention.
    pub denoise_flash: bool,
    /// candle materializes the denoiser's scores in f32 (SD's UNet); else in the pipeline's
    /// dtype (FLUX).
    pub denoise_scores_f32: bool,
    /// The VAE decoder's channels at output resolution.
    pub vae_width: usize,
    /// Whether the VAE has the mid-block attention over every latent pixel.
    pub vae_attention: bool,
    /// The real pipeline decodes in f32 whatever the pipeline's dtype (SDXL `force_upcast`).
    pub vae_upcast: bool,
    pub has_cfg: bool,
    /// Whether CFG runs the denoiser (and the text encoders) on one doubled batch (SD); Wan
    /// runs the conditional and unconditional passes one after the other.
    pub cfg_batched: bool,
    /// Output frames per latent frame after the first (1: an image model, 4: Wan's causal VAE).
    pub temporal_factor: usize,
    /// Elements of the VAE decoder's feature cache per latent pixel of one video (0 without
    /// one): the causal convolutions' last frames, kept between temporal chunks.
    pub vae_cache_per_latent_pixel: u64,
}

impl GenArch {
    /// Stable Diffusion 1.x/2.x/XL from its diffusers config.
    pub fn sd(c: &SdConfig) -> GenArch {
        let u = &c.unet;
        let level = u
            .down_block_types
            .iter()
            .position(|b| *b == DownBlock::CrossAttnDownBlock2D)
            .unwrap_or(0);
        let encoders = std::iter::once(&c.text_encoder).chain(c.text_encoder_2.as_ref());
        GenArch {
            architecture: "stable-diffusion",
            components: c
                .components()
                .into_iter()
                .map(|k| (k, c.params(k)))
                .collect(),
            factor: c.vae.scale(),
            vae_factor: c.vae.scale(),
            latent_channels: u.in_channels,
            out_channels: c.vae.out_channels,
            text_len: c.text_len(),
            text_hidden: encoders.map(|e| e.hidden_size).max().unwrap_or(0),
            context_dim: c.context_dim(),
            pooled_dim: 0,
            denoise_width: u.block_out_channels[0],
            denoise_prior: [12.0, 3.0],
            attn_pixels_per_token: 1 << (2 * level),
            // candle (like diffusers) reads `attention_head_dim` as the head count.
            attn_heads: u.attention_head_dim.at(level),
            joint_tokens: 0,
            denoise_flash: false,
            denoise_scores_f32: true,
            vae_width: c.vae.block_out_channels[0],
            vae_attention: true,
            vae_upcast: c.default_vae_dtype(DType::F16) == DType::F32,
            has_cfg: c.has_cfg(),
            cfg_batched: true,
            temporal_factor: 1,
            vae_cache_per_latent_pixel: 0,
        }
    }

    /// Wan2.1 text-to-video from its diffusers configs: a DiT over patches of 2×2 latent
    /// pixels (per latent frame), umT5 context of 512 tokens, the causal VAE decoding one
    /// latent frame per chunk in f32 (the real pipeline loads the VAE in f32).
    pub fn wan(c: &WanConfig) -> GenArch {
        let t = &c.transformer;
        let [_, ph, pw] = t.patch_size;
        let ffn = t.ffn_dim as f64 / t.dim() as f64;
        GenArch {
            architecture: "wan",
            components: c
                .components()
                .into_iter()
                .map(|k| (k, c.params_analytic(k)))
                .collect(),
            factor: c.vae.spatial_factor() * ph,
            vae_factor: c.vae.spatial_factor(),
            latent_channels: t.in_channels,
            out_channels: 3,
            text_len: crate::model::diffusion::wan::TEXT_LEN,
            text_hidden: c.text_encoder.d_model,
            context_dim: t.text_dim,
            pooled_dim: 0,
            denoise_width: t.dim() / (ph * pw),
            // The feed-forward at its widest, both runtimes: the block's input, the
            // modulated norm and the residual (3 of the hidden size), the first linear's output
            // and its GELU (2 of `ffn_dim`).
            denoise_prior: [3.0 + 2.0 * ffn; 2],
            attn_pixels_per_token: ph * pw,
            attn_heads: t.num_attention_heads,
            joint_tokens: 0,
            // vramlab's candle DiT materializes its scores in the activations' dtype.
            denoise_flash: true,
            denoise_scores_f32: false,
            vae_width: c.vae.base_dim,
            vae_attention: true,
            vae_upcast: true,
            has_cfg: true,
            cfg_batched: false,
            temporal_factor: c.vae.temporal_factor(),
            vae_cache_per_latent_pixel: c.vae.decoder_cache_per_latent_pixel(),
        }
    }

    /// The VAE's dtype when the query does not set one: f32 where the real pipeline upcasts.
    pub fn default_vae_dtype(&self, pipeline: DType) -> DType {
        if self.vae_upcast {
            DType::F32
        } else {
            pipeline
        }
    }

    /// Latent frames of `frames` output frames (`(F − 1)/4 + 1` for Wan; 1 for an image).
    pub fn latent_frames(&self, frames: u64) -> u64 {
        (frames.max(1) - 1) / self.temporal_factor as u64 + 1
    }

    /// The batch one denoiser (and text encoder) pass sees: doubled by CFG where it is batched.
    pub fn pass_batch(&self, q: &GenQuery) -> Checked {
        if self.cfg_batched {
            q.denoise_batch()
        } else {
            q.batch.into()
        }
    }

    /// FLUX.1 from its diffusers configs: a DiT over (H/16)·(W/16) image tokens (2×2 patches of
    /// the VAE's latents, `in_channels` = 4 × the VAE's latent channels) joined with the T5
    /// tokens in every block's attention. diffusers' FluxPipeline decodes in the pipeline's
    /// dtype whatever `force_upcast` says.
    pub fn flux(c: &FluxConfig) -> GenArch {
        let t = &c.transformer;
        let hidden = t.hidden_size();
        let mlp = t.dit().mlp_ratio;
        GenArch {
            architecture: "flux",
            components: c
                .components()
                .into_iter()
                .map(|k| (k, c.params(k)))
                .collect(),
            factor: c.spatial_factor(),
            vae_factor: c.vae.base.scale(),
            latent_channels: c.vae.base.latent_channels,
            out_channels: c.vae.base.out_channels,
            text_len: c.text_len,
            text_hidden: c.text_encoder.hidden_size.max(c.text_encoder_2.d_model),
            context_dim: t.joint_attention_dim,
            pooled_dim: t.pooled_projection_dim,
            denoise_width: hidden / (PATCH * PATCH),
            // A single-stream block at its concatenation. candle: the input, the modulated
            // norm, q, k and v copied out of the fused projection and normed, rope'd q and k,
            // the attention output (11 of the hidden size) and the fused projection's MLP
            // part, its GELU and the concatenation's (3 of the MLP width). diffusers: the input,
            // the norm, the attention output, the concatenation's attention part and rotary
            // temporaries (5) with the MLP's GELU and the concatenation's MLP part (2 widths).
            denoise_prior: [11.0 + 3.0 * mlp, 5.0 + 2.0 * mlp],
            attn_pixels_per_token: PATCH * PATCH,
            attn_heads: t.num_attention_heads,
            joint_tokens: c.text_len,
            denoise_flash: false,
            denoise_scores_f32: false,
            vae_width: c.vae.base.block_out_channels[0],
            vae_attention: true,
            vae_upcast: false,
            has_cfg: false,
            cfg_batched: true,
            temporal_factor: 1,
            vae_cache_per_latent_pixel: 0,
        }
    }

    /// The architecture of a known model's published configs.
    pub fn preset(m: GenModel) -> GenArch {
        match m {
            GenModel::Sd15 | GenModel::Sd21 | GenModel::Sdxl => GenArch::sd(&SdConfig::preset(m)),
            GenModel::FluxDev | GenModel::FluxSchnell => GenArch::flux(&FluxConfig::preset(m)),
            GenModel::Wan21T2v13b => GenArch::wan(&WanConfig::t2v_1_3b()),
        }
    }

    pub fn params(&self) -> u64 {
        self.components.iter().map(|c| c.1).sum()
    }
}

/// One generation query.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GenQuery {
    pub batch: u64,
    pub resolution: Resolution,
    /// Output frames per video (1 for an image model).
    pub frames: u64,
    pub cfg: bool,
    pub vae_decode: VaeDecode,
    /// Tile side and overlap in output pixels (`tiled`).
    pub tile: usize,
    pub overlap: usize,
    #[serde(serialize_with = "dtype_name")]
    pub dtype: DType,
    #[serde(serialize_with = "dtype_name")]
    pub vae_dtype: DType,
    pub runtime: Runtime,
    pub backend: Backend,
    /// The denoiser's attention on torch: SDPA (and flash) never materializes the scores;
    /// eager (diffusers' `AttnProcessor`) holds the scores and their softmax in the pipeline's
    /// dtype. candle's UNet attention materializes them in f32 whatever this says.
    pub attention: Attention,
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.as_str())
}

impl GenQuery {
    /// Images the denoiser and the text encoders see: doubled by CFG.
    pub fn denoise_batch(&self) -> Checked {
        Checked::from(self.batch) * if self.cfg { 2u64 } else { 1 }
    }
}

/// Checks a query against the architecture: one line naming the flag.
pub fn check(a: &GenArch, q: &GenQuery) -> Result<(), InputError> {
    let r = q.resolution;
    let f = a.factor;
    if r.width == 0 || r.height == 0 || !r.width.is_multiple_of(f) || !r.height.is_multiple_of(f) {
        let why = if f == a.vae_factor {
            "the VAE's factor"
        } else {
            "the VAE's factor × the denoiser's 2×2 patch"
        };
        return Err(InputError::arg(format!(
            "--resolution {r} is not a multiple of {f} ({why})"
        )));
    }
    let t = a.temporal_factor as u64;
    if q.frames == 0 || !(q.frames - 1).is_multiple_of(t) || (t == 1 && q.frames != 1) {
        return Err(InputError::arg(if t == 1 {
            format!("--frames {}: an image model makes 1 frame", q.frames)
        } else {
            format!(
                "--frames {}: {} decodes {t}k+1 frames (1, {}, {}, ...; the VAE's temporal factor {t})",
                q.frames,
                a.architecture,
                t + 1,
                2 * t + 1
            )
        }));
    }
    if q.batch == 0 {
        return Err(InputError::arg("--batch must be at least 1"));
    }
    if q.cfg && !a.has_cfg {
        return Err(InputError::arg(
            "--cfg: this model runs without classifier-free guidance",
        ));
    }
    let f = a.vae_factor;
    if q.vae_decode == VaeDecode::Tiled {
        if q.tile == 0 || !q.tile.is_multiple_of(f) || !q.overlap.is_multiple_of(f) {
            return Err(InputError::arg(format!(
                "--tile {} and --overlap {} must be multiples of {f}, the tile at least {f}",
                q.tile, q.overlap
            )));
        }
        if q.overlap >= q.tile {
            return Err(InputError::arg(format!(
                "--overlap {} must be smaller than --tile {}",
                q.overlap, q.tile
            )));
        }
        if q.tile > r.width.max(r.height) {
            return Err(InputError::arg(format!(
                "--tile {} is larger than the image {r}",
                q.tile
            )));
        }
    }
    Ok(())
}

/// The exact tensors and the uncertain terms of one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTerms {
    pub exact: Vec<(String, u64)>,
    pub x: GenTerms,
}

fn bytes(d: DType) -> u64 {
    d.size_in_bytes() as u64
}

/// Pixels of a `w` × `h` image (or tile).
fn pixels(w: usize, h: usize) -> Checked {
    Checked::from(w) * h
}

/// A count as a real term: one past 2^64 is infinite (its bytes overflow downstream).
fn real(c: Checked) -> f64 {
    c.get().map_or(f64::INFINITY, |v| v as f64)
}

/// The exact tensors of a query: each component's weights (the VAE in its own dtype), the text
/// context, the latents, the decoded images and a tiled decode's row strip. An overflow names
/// the first row past 2^64 B.
pub fn exact_rows(a: &GenArch, q: &GenQuery) -> Result<Vec<(String, u64)>, Overflow> {
    let mut v: Vec<(String, Checked)> = a
        .components
        .iter()
        .map(|(c, p)| {
            let d = if *c == Component::Vae {
                q.vae_dtype
            } else {
                q.dtype
            };
            (c.to_string(), Checked::from(*p) * bytes(d))
        })
        .collect();
    let r = q.resolution;
    let lp = pixels(r.width, r.height) / (a.vae_factor * a.vae_factor) as u64;
    let lf = a.latent_frames(q.frames);
    let per_token = Checked::from(a.text_len) * a.context_dim + a.pooled_dim;
    v.push((
        "text context".into(),
        q.denoise_batch() * per_token * bytes(q.dtype),
    ));
    v.push((
        "latents".into(),
        Checked::from(q.batch) * a.latent_channels * lf * lp * bytes(q.dtype),
    ));
    v.push((
        "decoded images".into(),
        Checked::from(q.batch)
            * q.frames
            * a.out_channels
            * pixels(r.width, r.height)
            * bytes(q.vae_dtype),
    ));
    if a.vae_cache_per_latent_pixel > 0 {
        // The causal convolutions' cache of what one decode call holds: the batch, one video
        // (`sliced`), or one tile of the batch (`tiled`).
        let (videos, latent) = match q.vae_decode {
            VaeDecode::Full => (q.batch, lp),
            VaeDecode::Sliced => (1, lp),
            VaeDecode::Tiled => {
                let t = |side: usize| q.tile.min(side) / a.vae_factor;
                (q.batch, pixels(t(r.height), t(r.width)))
            }
        };
        v.push((
            "feature cache".into(),
            Checked::from(videos) * a.vae_cache_per_latent_pixel * latent * bytes(q.vae_dtype),
        ));
    }
    if q.vae_decode == VaeDecode::Tiled {
        let per_pixel = Checked::from(q.batch) * q.frames * a.out_channels * bytes(q.vae_dtype);
        v.push(match q.runtime {
            // vramlab blends each tile into a row strip as wide as the image.
            Runtime::Candle => (
                "tile strip".into(),
                per_pixel * pixels(q.tile.min(r.height), r.width),
            ),
            // diffusers' `tiled_decode` (AutoencoderKL's and AutoencoderKLWan's) keeps every
            // decoded tile until it blends them: tiles start every tile − overlap latent
            // pixels and the last ones are cut at the edge, so they cover more than the image.
            Runtime::Torch => {
                let f = a.vae_factor;
                let (tile, stride) = (q.tile / f, (q.tile - q.overlap) / f);
                let side = |len: usize| -> Checked {
                    (0..len / f)
                        .step_by(stride.max(1))
                        .map(|i| tile.min(len / f - i) * f)
                        .sum()
                };
                (
                    "decoded tiles".into(),
                    per_pixel * side(r.height) * side(r.width),
                )
            }
        });
    }
    v.into_iter()
        .map(|(name, b)| {
            let b = b.bytes(&name)?;
            Ok((name, b))
        })
        .collect()
}

/// The exact rows live in `phase` and its uncertain terms (a term whose count exceeds 2^64 is
/// infinite); an overflow when an exact row does.
pub fn phase_terms(a: &GenArch, q: &GenQuery, phase: Phase) -> Result<PhaseTerms, Overflow> {
    let all = exact_rows(a, q)?;
    // The weights (the first rows) are live in every phase.
    let n_weights = a.components.len();
    let live = |names: &[&str]| -> Vec<(String, u64)> {
        all.iter()
            .enumerate()
            .filter(|(i, (n, _))| *i < n_weights || names.contains(&n.as_str()))
            .map(|(_, r)| r.clone())
            .collect()
    };
    let mut x = [0.0; N_GEN];
    x[CONST] = 1.0;
    let r = q.resolution;
    let f = a.vae_factor;
    let nb = real(a.pass_batch(q));
    let lf = a.latent_frames(q.frames) as f64;
    // images × heads × queries × keys score elements, in the bytes the runtime holds them in.
    let scores = |images: f64, queries: f64, keys: f64, heads: f64, attention, f32: bool, flash| {
        let b = match (q.runtime, attention) {
            // candle materializes the scores: in f32 where it upcasts q, k, v (SD's UNet and
            // VAE), else in the pipeline's dtype (FLUX's transformer).
            // vramlab-kernels' flash attention (the Wan DiT's) never materializes them.
            (Runtime::Candle, Attention::Flash) if flash => 0.0,
            (Runtime::Candle, _) if f32 => 4.0,
            (Runtime::Candle, _) => bytes(q.dtype) as f64,
            (Runtime::Torch, Attention::Eager) => bytes(q.dtype) as f64,
            // SDPA never materializes them.
            (Runtime::Torch, _) => 0.0,
        };
        images * heads * queries * keys * b
    };
    let exact = match phase {
        Phase::Load => live(&[]),
        Phase::TextEncode => {
            x[TEXT_ACT] = nb * (a.text_len * a.text_hidden) as f64 * bytes(q.dtype) as f64;
            live(&["text context"])
        }
        Phase::Denoise => {
            let lp = lf * real(pixels(r.width, r.height) / (f * f) as u64);
            let ppt = a.attn_pixels_per_token as f64;
            let px = lp + a.joint_tokens as f64 * ppt;
            x[DENOISE_ACT] = nb * px * a.denoise_width as f64 * bytes(q.dtype) as f64;
            let tokens = px / ppt;
            // A block's self- and cross-attention run one after the other: the larger scores
            // set the peak. Cross-attention's keys are the text tokens (77 for SD, 512 for
            // Wan), which outnumber the image tokens of a small latent; FLUX attends jointly.
            let keys = if a.joint_tokens == 0 {
                tokens.max(a.text_len as f64)
            } else {
                tokens
            };
            let (heads, f32) = (a.attn_heads as f64, a.denoise_scores_f32);
            x[DENOISE_SCORES] = scores(nb, tokens, keys, heads, q.attention, f32, a.denoise_flash);
            live(&["text context", "latents"])
        }
        _ => {
            let (images, h, w) = match q.vae_decode {
                VaeDecode::Full => (q.batch as f64, r.height, r.width),
                VaeDecode::Sliced => (1.0, r.height, r.width),
                VaeDecode::Tiled => (q.batch as f64, q.tile.min(r.height), q.tile.min(r.width)),
            };
            let px = real(pixels(w, h));
            // A video decodes in temporal chunks: the largest yields `temporal_factor` frames.
            let chunk = if q.frames > 1 { a.temporal_factor } else { 1 } as f64;
            x[VAE_ACT] = chunk * images * px * a.vae_width as f64 * bytes(q.vae_dtype) as f64;
            if a.vae_attention {
                // diffusers' VAE keeps SDPA when the denoiser's attention is set to eager.
                let latent = px / (f * f) as f64;
                x[VAE_SCORES] = scores(images, latent, latent, 1.0, Attention::Sdpa, true, false);
            }
            live(&[
                "latents",
                "decoded images",
                "tile strip",
                "decoded tiles",
                "feature cache",
            ])
        }
    };
    Ok(PhaseTerms { exact, x })
}

/// The analytic prior of each term's coefficient (tensors of the term's shape live at the
/// phase's peak), used without constants and for a term a fit could not identify:
/// - `text_act` 8: the MLP's 4×-wide intermediate, its activation, q/k/v and the residual;
/// - `denoise_act`: the architecture's [`GenArch::denoise_prior`]. A UNet: a 3×3 convolution
///   at full resolution holds its input, its output and the residual (torch 3); candle lowers
///   it to a matmul over an im2col buffer of 9 × the input (12 in all). A DiT: its widest block,
///   with tensors of its MLP's width;
/// - `vae_act`: candle 12, as `denoise_act`; torch 6: diffusers' `ResnetBlock2D.forward` at
///   the first block of the output resolution holds its input, `norm1`'s output and the SiLU's
///   output at once, three tensors of the width entering that level, which is twice the
///   decoder's output width in every AutoencoderKL (block_out_channels 128, 256, …);
/// - `denoise_scores` 2 and `vae_scores` 2: the scores and their softmax, both alive at once
///   (the term is already 0 where the runtime never materializes them);
/// - `const` 0: no runtime constant without a measurement.
pub fn prior(a: &GenArch, term: usize, runtime: Runtime) -> f64 {
    match (term, runtime) {
        (TEXT_ACT, _) => 8.0,
        (DENOISE_ACT, Runtime::Candle) => a.denoise_prior[0],
        (DENOISE_ACT, Runtime::Torch) => a.denoise_prior[1],
        (VAE_ACT, Runtime::Candle) => 12.0,
        (VAE_ACT, Runtime::Torch) => 6.0,
        (DENOISE_SCORES | VAE_SCORES, _) => 2.0,
        _ => 0.0,
    }
}

pub fn priors(a: &GenArch, runtime: Runtime) -> GenTerms {
    std::array::from_fn(|j| prior(a, j, runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(w: usize, h: usize, frames: u64, runtime: Runtime, attention: Attention) -> GenQuery {
        GenQuery {
            batch: 1,
            resolution: Resolution {
                width: w,
                height: h,
            },
            frames,
            cfg: true,
            vae_decode: VaeDecode::Full,
            tile: 0,
            overlap: 0,
            dtype: DType::BF16,
            vae_dtype: DType::F32,
            runtime,
            backend: Backend::Cpu,
            attention,
        }
    }

    /// The denoiser's scores: Wan's DiT at 128×128 × 5 frames has (5−1)/4 + 1 = 2 latent frames
    /// of 16×16 latents in 2×2 patches, 2·8·8 = 128 image tokens, fewer than the 512 text
    /// tokens its cross-attention reads: the cross-attention scores (128 × 512 per head) set
    /// the peak. At 832×480 × 81 frames, 21·30·52 image tokens outnumber the text:
    /// tokens². One pass (Wan's CFG runs the two passes one after the other), 12 heads, bf16.
    #[test]
    fn denoise_scores_take_the_larger_of_self_and_cross_attention() {
        let a = GenArch::preset(GenModel::Wan21T2v13b);
        let x = |w, h, f| {
            phase_terms(
                &a,
                &query(w, h, f, Runtime::Torch, Attention::Eager),
                Phase::Denoise,
            )
            .unwrap()
            .x[DENOISE_SCORES]
        };
        assert_eq!(x(128, 128, 5), (12 * 128 * 512 * 2) as f64);
        let t: u64 = 21 * 30 * 52;
        assert_eq!(x(832, 480, 81), (12 * t * t * 2) as f64);
        // vramlab's candle DiT under flash attention materializes none.
        let flash = query(128, 128, 5, Runtime::Candle, Attention::Flash);
        assert_eq!(
            phase_terms(&a, &flash, Phase::Denoise).unwrap().x[DENOISE_SCORES],
            0.0
        );
    }

    /// A tiled decode of 832×480 × 81 frames in 256-pixel tiles with 64 of overlap. vramlab
    /// holds one row strip: 256 rows of the full width, every frame. diffusers holds every
    /// decoded tile: in latents (÷ 8) tiles of 32 start every 24, so the 60 latent rows give
    /// tiles of 32, 32 and 12 (608 pixels) and the 104 columns 32, 32, 32, 32 and 8 (1,088).
    #[test]
    fn a_tiled_decode_holds_a_strip_on_candle_and_every_tile_under_diffusers() {
        let a = GenArch::preset(GenModel::Wan21T2v13b);
        let row = |runtime: Runtime, name: &str| {
            let q = GenQuery {
                vae_decode: VaeDecode::Tiled,
                tile: 256,
                overlap: 64,
                ..query(832, 480, 81, runtime, Attention::Sdpa)
            };
            let rows = exact_rows(&a, &q).unwrap();
            rows.iter().find(|r| r.0 == name).unwrap().1
        };
        assert_eq!(row(Runtime::Candle, "tile strip"), 81 * 3 * 256 * 832 * 4);
        assert_eq!(
            row(Runtime::Torch, "decoded tiles"),
            81 * 3 * 608 * 1088 * 4
        );
    }
}
