//! Wan2.1 text-to-video as a generation [`Pipeline`] (diffusers' `WanPipeline`): components
//! `text_encoder/` (umT5-XXL, [`UmT5Encoder`]), `transformer/` ([`WanDit`]) and `vae/`
//! (AutoencoderKLWan: the [`WanDecoder`] that runs, and the encoder's tensors
//! ([`WanEncoderWeights`]), loaded as diffusers loads them but never run). The configs and
//! analytic counts are `config.rs`.
//!
//! What runs, after huggingface/diffusers `pipelines/wan/pipeline_wan.py`:
//! - dtypes: diffusers' Wan docs load the VAE in f32 and the pipeline (transformer and
//!   umT5) in bf16 (`torch_dtype=torch.bfloat16`). Here the transformer and the text encoder
//!   are in the point's `precision`, the VAE in `vae_precision` (default f32).
//! - text: the prompt is padded to `max_sequence_length` = 512 tokens and encoded; with
//!   classifier-free guidance the negative prompt is encoded by a second, separate call
//!   (`encode_prompt`), so the text encoder's activations are those of `batch` prompts.
//! - CFG (on by default: `guidance_scale` 5.0): each step runs the transformer twice, once on
//!   the prompt embeddings and once on the negative ones, each at `batch` videos (not one call
//!   on a doubled batch); the conditional prediction is alive during the unconditional call,
//!   then `uncond + 5·(cond − uncond)`.
//! - scheduler: diffusers runs UniPC (flow matching, `flow_shift` 3.0). Here a step is the
//!   Euler update of the flow, `x += (σ_next − σ)·v`, on the same shifted sigmas
//!   (σ = s·u / (1 + (s − 1)·u)); UniPC's extra state (two earlier model outputs and the last
//!   sample, three latent-sized tensors) is not held. The latents are kept in the
//!   transformer's dtype (diffusers keeps them in f32: latent-sized, a few hundred KB at most
//!   for the sizes swept here).
//! - decode: `latents · std + mean` (the VAE config's `latents_mean`/`latents_std`), in the
//!   VAE's dtype, then AutoencoderKLWan's chunked temporal decode: one latent frame per chunk
//!   through the causal convolutions' feature cache, into a preallocated output (diffusers
//!   concatenates the chunks instead). `sliced` decodes one video at a time; `tiled` decodes
//!   overlapping spatial tiles of every frame, each through its own chunked decode and feature
//!   cache (as AutoencoderKLWan's `tiled_decode`), blended with a linear ramp.
use super::config::{WanConfig, WanTransformerConfig, TEXT_LEN};
use super::dit::WanDit;
use super::umt5::UmT5Encoder;
use super::vae::{WanDecoder, WanEncoderWeights};
use crate::model::diffusion::{
    record, var_builder, write_config, write_model_index, BadPoint, Pipeline, PointInput, Shapes,
};
use crate::vocab::{Attention, Component, Resolution};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::path::Path;

/// WanPipeline's default `guidance_scale`.
pub const GUIDANCE_SCALE: f64 = 5.0;
/// The scheduler's `flow_shift` of Wan2.1-T2V-1.3B-Diffusers (3.0 for 480p).
pub const FLOW_SHIFT: f64 = 3.0;

/// The one place the DiT receives the point's attention: eager (scores materialized) or flash
/// (vramlab-kernels' tiled attention).
fn build_dit(c: &WanTransformerConfig, attention: Attention, vb: VarBuilder) -> Result<WanDit> {
    match attention_problem(attention) {
        None => Ok(WanDit::new(c, vb, attention)?),
        Some(_) => Err(attention_refused(attention).into()),
    }
}

/// Why the Wan DiT refuses attention `a` (one line), or None for eager and flash.
fn attention_problem(a: Attention) -> Option<String> {
    match a {
        Attention::Eager | Attention::Flash => None,
        Attention::Sliced => Some(
            "attention `sliced`: Wan's DiT has no sliced attention (that is the UNet's); use `eager` or `flash`"
                .into(),
        ),
        other => Some(format!(
            "attention `{other}`: Wan's DiT runs `eager` or `flash`"
        )),
    }
}

fn attention_refused(a: Attention) -> crate::error::InputError {
    crate::error::InputError::arg(attention_problem(a).unwrap_or_default())
}

/// A Wan2.1 T2V pipeline: each component in its own dtype.
pub struct Wan {
    pub config: WanConfig,
    /// The transformer's and the text encoder's dtype.
    pub dtype: DType,
    pub vae_dtype: DType,
    text: Option<UmT5Encoder>,
    dit: Option<WanDit>,
    decoder: Option<WanDecoder>,
    /// Resident like diffusers' (the checkpoint's encoder), never run.
    encoder: Option<WanEncoderWeights>,
}

impl Wan {
    pub fn new(config: WanConfig, dtype: DType, vae_dtype: DType) -> Wan {
        Wan {
            config,
            dtype,
            vae_dtype,
            text: None,
            dit: None,
            decoder: None,
            encoder: None,
        }
    }

    /// The VAE's tensors in load order: the decoder's (with `post_quant_conv`), then the
    /// encoder's (with `quant_conv`).
    fn build_vae(&self, vb: VarBuilder) -> candle_core::Result<(WanDecoder, WanEncoderWeights)> {
        let v = &self.config.vae;
        Ok((
            WanDecoder::new(v, vb.clone())?,
            WanEncoderWeights::new(v, vb)?,
        ))
    }

    /// The shifted flow sigma at step `i` of `steps` (1 at the start, 0 at the end).
    fn sigma(i: usize, steps: usize) -> f64 {
        let u = 1.0 - i as f64 / steps as f64;
        FLOW_SHIFT * u / (1.0 + (FLOW_SHIFT - 1.0) * u)
    }

    /// A per-channel (1, z, 1, 1, 1) tensor of `v` (or of `default` when the config has none).
    fn channel_vector(&self, v: &[f64], default: f64, dev: &Device) -> Result<Tensor> {
        let z = self.config.vae.z_dim;
        let vals: Vec<f32> = if v.is_empty() {
            vec![default as f32; z]
        } else {
            anyhow::ensure!(
                v.len() == z,
                "vae config: {} latents statistics for z_dim {z}",
                v.len()
            );
            v.iter().map(|x| *x as f32).collect()
        };
        Ok(Tensor::from_vec(vals, (1, z, 1, 1, 1), dev)?.to_dtype(self.vae_dtype)?)
    }
}

impl WanConfig {
    /// Stored tensors of a component, with their names and shapes, in load order (from
    /// building its modules over the shape recorder).
    pub fn shapes(&self, c: Component) -> Shapes {
        match c {
            Component::TextEncoder => {
                record(|vb| UmT5Encoder::new(&self.text_encoder, vb).map(drop))
            }
            Component::Transformer => {
                record(|vb| WanDit::new(&self.transformer, vb, Attention::Eager).map(drop))
            }
            Component::Vae => record(|vb| {
                WanDecoder::new(&self.vae, vb.clone())?;
                WanEncoderWeights::new(&self.vae, vb).map(drop)
            }),
            _ => Vec::new(),
        }
    }

    /// Writes the three `config.json` files and `model_index.json` (`WanPipeline`).
    pub fn write_configs(&self, dir: &Path) -> Result<()> {
        write_config(dir, Component::TextEncoder, &self.text_encoder)?;
        write_config(dir, Component::Transformer, &self.transformer)?;
        write_config(dir, Component::Vae, &self.vae)?;
        write_model_index(dir, "WanPipeline")
    }
}

impl Pipeline for Wan {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn architecture(&self) -> &'static str {
        "wan"
    }

    fn components(&self) -> Vec<Component> {
        self.config.components()
    }

    fn denoiser(&self) -> Component {
        Component::Transformer
    }

    fn shapes(&self, c: Component) -> Shapes {
        self.config.shapes(c)
    }

    fn params_analytic(&self, c: Component) -> u64 {
        self.config.params_analytic(c)
    }

    fn dtype(&self, c: Component) -> DType {
        if c == Component::Vae {
            self.vae_dtype
        } else {
            self.dtype
        }
    }

    fn write_configs(&self, dir: &Path) -> Result<()> {
        self.config.write_configs(dir)
    }

    /// Loads one component through candle's mmaped-safetensors VarBuilder, in its dtype. The
    /// attention reaches the DiT (only) through `build_dit`.
    fn load(&mut self, dir: &Path, c: Component, attention: Attention, dev: &Device) -> Result<()> {
        if let Some(p) = attention_problem(attention) {
            return Err(crate::error::InputError::arg(p).into());
        }
        let vb = var_builder(dir, c, self.dtype(c), dev)?;
        match c {
            Component::TextEncoder => {
                self.text = Some(UmT5Encoder::new(&self.config.text_encoder, vb)?)
            }
            Component::Transformer => {
                self.dit = Some(build_dit(&self.config.transformer, attention, vb)?)
            }
            Component::Vae => {
                let (d, e) = self.build_vae(vb)?;
                (self.decoder, self.encoder) = (Some(d), Some(e));
            }
            other => anyhow::bail!("Wan has no `{other}`"),
        }
        Ok(())
    }

    /// umT5 ids: every prompt padded to 512 tokens (ids in the vocabulary's range).
    fn prompt_ids(&self, prompts: usize, dev: &Device) -> Result<Vec<Tensor>> {
        let v = self.config.text_encoder.vocab_size as u32;
        let ids: Vec<u32> = (0..prompts * TEXT_LEN)
            .map(|i| (i as u32 * 7 + 3) % v)
            .collect();
        Ok(vec![Tensor::from_vec(ids, (prompts, TEXT_LEN), dev)?])
    }

    fn text_len(&self) -> usize {
        TEXT_LEN
    }

    /// The prompt embeddings (b, 512, d_model) and, with CFG, the negative prompt's, each from
    /// its own encoder call (as `encode_prompt`), cast to the transformer's dtype.
    fn encode_text(&self, ids: &[Tensor], cfg: bool) -> Result<Vec<Tensor>> {
        let te = self.text.as_ref().context("text_encoder not loaded")?;
        let ids = &ids[0];
        let n = ids.dim(0)?;
        let parts = if cfg {
            anyhow::ensure!(n % 2 == 0, "cfg: {n} prompts are not prompts + negatives");
            vec![ids.narrow(0, 0, n / 2)?, ids.narrow(0, n / 2, n / 2)?]
        } else {
            vec![ids.clone()]
        };
        parts
            .iter()
            .map(|p| Ok(te.forward(&p.contiguous()?)?.to_dtype(self.dtype)?))
            .collect()
    }

    fn spatial_factor(&self) -> usize {
        self.config.vae.spatial_factor() * self.config.transformer.patch_size[1]
    }

    fn vae_scale(&self) -> usize {
        self.config.vae.spatial_factor()
    }

    fn image_channels(&self) -> usize {
        3
    }

    fn has_cfg(&self) -> bool {
        true
    }

    fn temporal_factor(&self) -> Option<usize> {
        Some(self.config.vae.temporal_factor())
    }

    fn check_attention(&self, a: Attention) -> std::result::Result<(), BadPoint> {
        match attention_problem(a) {
            None => Ok(()),
            Some(problem) => Err(BadPoint {
                input: PointInput::Attention,
                problem,
            }),
        }
    }

    /// (b, z_dim, (frames − 1)/4 + 1, H/8, W/8).
    fn latent_shape(&self, r: Resolution, batch: usize, frames: usize) -> Vec<usize> {
        let (s, t) = (self.vae_scale(), self.config.vae.temporal_factor());
        vec![
            batch,
            self.config.transformer.in_channels,
            (frames - 1) / t + 1,
            r.height / s,
            r.width / s,
        ]
    }

    /// The transformer on the prompt (and, with CFG, a second call on the negative prompt),
    /// guidance 5.0, then the Euler step of the flow to the next sigma.
    fn denoise_step(
        &self,
        lat: &Tensor,
        step: usize,
        steps: usize,
        cond: &[Tensor],
        cfg: bool,
    ) -> Result<Tensor> {
        let dit = self.dit.as_ref().context("transformer not loaded")?;
        let b = lat.dim(0)?;
        let (sigma, next) = (Self::sigma(step, steps), Self::sigma(step + 1, steps));
        let t = Tensor::full((sigma * 1000.0) as f32, b, lat.device())?;
        let pred = dit.forward(lat, &t, &cond[0])?;
        let pred = if cfg {
            let uncond = dit.forward(lat, &t, &cond[1])?;
            let diff = ((pred - &uncond)? * GUIDANCE_SCALE)?;
            (uncond + diff)?
        } else {
            pred
        };
        Ok((lat + (pred * (next - sigma))?)?)
    }

    /// `latents · latents_std + latents_mean` in the VAE's dtype (diffusers divides by
    /// 1/std).
    fn vae_latents(&self, latents: &Tensor) -> Result<Tensor> {
        let v = &self.config.vae;
        let dev = latents.device();
        let std = self.channel_vector(&v.latents_std, 1.0, dev)?;
        let mean = self.channel_vector(&v.latents_mean, 0.0, dev)?;
        let z = latents.to_dtype(self.vae_dtype)?;
        Ok(z.broadcast_mul(&std)?.broadcast_add(&mean)?)
    }

    /// The whole batch through the chunked temporal decode.
    fn vae_decode(&self, z: &Tensor) -> Result<Tensor> {
        let d = self.decoder.as_ref().context("vae not loaded")?;
        Ok(d.decode(z)?)
    }

    /// (b, 3, (t − 1)·4 + 1, h·8, w·8): the causal VAE's first latent frame makes one frame,
    /// each later one four.
    fn decoded_shape(&self, z: &[usize]) -> Vec<usize> {
        let (s, tf) = (self.vae_scale(), self.config.vae.temporal_factor());
        vec![z[0], 3, (z[2] - 1) * tf + 1, z[3] * s, z[4] * s]
    }
}
