//! What the generation terms read of an architecture ([`GenArch`]): components and their
//! parameters, the VAE factor, widths, the first attention level, from each pipeline's own
//! config (`GenArch::sd`, `GenArch::wan`, `GenArch::flux`) or a known model's preset.
use super::GenQuery;
use crate::checked::Checked;
use crate::model::diffusion::flux::{FluxConfig, PATCH};
use crate::model::diffusion::sd::{DownBlock, SdConfig};
use crate::model::diffusion::wan::WanConfig;
use crate::vocab::{Component, GenModel};
use candle_core::DType;

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
