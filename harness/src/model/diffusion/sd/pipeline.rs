//! The loaded SD pipeline, [`Sd`], behind the generation [`Pipeline`] trait: one component
//! loaded (and measured) at a time, then text encode, UNet steps, VAE decode.
use super::clip::{clip_ids, ClipText};
use super::components::{build_unet, build_vae, params_analytic, unet_shapes};
use super::config::SdConfig;
use crate::model::diffusion::{Pipeline, Shapes};
use crate::vocab::{Attention, Component, Resolution};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_transformers::models::stable_diffusion::{unet_2d, vae};
use std::path::Path;

/// A loaded pipeline: each component in its own dtype.
pub struct Sd {
    pub config: SdConfig,
    text: Vec<ClipText>,
    unet: Option<unet_2d::UNet2DConditionModel>,
    vae: Option<vae::AutoEncoderKL>,
    /// SDXL's `add_embedding` tensors (loaded, unused by candle's forward).
    add_embedding: Vec<Tensor>,
    pub dtype: DType,
    pub vae_dtype: DType,
}

impl Sd {
    pub fn new(config: SdConfig, dtype: DType, vae_dtype: DType) -> Sd {
        Sd {
            config,
            text: Vec::new(),
            unet: None,
            vae: None,
            add_embedding: Vec::new(),
            dtype,
            vae_dtype,
        }
    }

    pub fn unet(&self, latents: &Tensor, t: f64, context: &Tensor) -> Result<Tensor> {
        let u = self.unet.as_ref().context("unet not loaded")?;
        Ok(u.forward(latents, t, context)?)
    }
}

/// candle's sliced attention size for the UNet: `eager` attends all heads at once. `sliced`
/// is refused: candle 0.11's `CrossAttention::sliced_attention` stacks its rank-3 slices into a
/// rank-4 tensor that `reshape_batch_dim_to_heads` then rejects ("unexpected rank, expected: 3,
/// got: 4"), on every device; the CUDA build on the emulated GPU found it (no run had used it).
pub fn sliced_size(a: Attention) -> Result<Option<usize>> {
    match a {
        Attention::Eager => Ok(None),
        Attention::Sliced => anyhow::bail!(
            "attention `sliced` on Stable Diffusion: candle 0.11's sliced attention fails on every \
             device (its slices are stacked to rank 4); use eager"
        ),
        other => anyhow::bail!(
            "attention `{other}` is not available for generation yet (eager or sliced)"
        ),
    }
}

impl Pipeline for Sd {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn architecture(&self) -> &'static str {
        "stable-diffusion"
    }

    fn components(&self) -> Vec<Component> {
        self.config.components()
    }

    fn denoiser(&self) -> Component {
        Component::Unet
    }

    fn shapes(&self, c: Component) -> Shapes {
        self.config.shapes(c)
    }

    fn params_analytic(&self, c: Component) -> u64 {
        params_analytic(&self.config, c)
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

    /// Loads one component through candle's mmaped-safetensors VarBuilder (each tensor is
    /// copied out of the map, in the component's dtype). `sliced` attention is candle's
    /// sliced attention in the UNet.
    fn load(&mut self, dir: &Path, c: Component, attention: Attention, dev: &Device) -> Result<()> {
        let sliced = sliced_size(attention)?;
        let vb = crate::model::diffusion::var_builder(dir, c, self.dtype(c), dev)?;
        let cfg = &self.config;
        match c {
            Component::TextEncoder => self.text.push(ClipText::new(&cfg.text_encoder, vb)?),
            Component::TextEncoder2 => {
                let te2 = cfg.text_encoder_2.as_ref().context("no text_encoder_2")?;
                self.text.push(ClipText::new(te2, vb)?)
            }
            Component::Unet => {
                // Held for the life of the model, as a checkpoint's extra tensors would be.
                let extra = unet_shapes(&cfg.unet)
                    .into_iter()
                    .filter(|(n, _)| n.starts_with("add_embedding."))
                    .map(|(n, s)| vb.get(s, &n))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                self.unet = Some(build_unet(&cfg.unet, vb, sliced)?);
                self.add_embedding = extra;
            }
            Component::Vae => self.vae = Some(build_vae(&cfg.vae, true, true, vb)?),
            other => anyhow::bail!("Stable Diffusion has no `{other}`"),
        }
        Ok(())
    }

    /// Prompts of the CLIP tokenizer's full length (BOS, then ids in range); SDXL's two
    /// encoders read the same ids.
    fn prompt_ids(&self, prompts: usize, dev: &Device) -> Result<Vec<Tensor>> {
        let ids = clip_ids(&self.config.text_encoder, prompts, dev)?;
        Ok(vec![ids])
    }

    fn text_len(&self) -> usize {
        self.config.text_len()
    }

    /// Every text encoder's last hidden state, concatenated on the feature axis (SDXL): the
    /// UNet's context (b, s, context_dim).
    fn encode_text(&self, ids: &[Tensor], _cfg: bool) -> Result<Vec<Tensor>> {
        let outs = self
            .text
            .iter()
            .map(|t| t.forward(&ids[0]))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(vec![if outs.len() == 1 {
            outs.into_iter().next().expect("one")
        } else {
            Tensor::cat(&outs, D::Minus1)?
        }])
    }

    fn spatial_factor(&self) -> usize {
        self.config.vae.scale()
    }

    fn vae_scale(&self) -> usize {
        self.config.vae.scale()
    }

    fn image_channels(&self) -> usize {
        self.config.vae.out_channels
    }

    fn has_cfg(&self) -> bool {
        self.config.has_cfg()
    }

    fn latent_shape(&self, r: Resolution, batch: usize, _frames: usize) -> Vec<usize> {
        let s = self.vae_scale();
        vec![
            batch,
            self.config.unet.in_channels,
            r.height / s,
            r.width / s,
        ]
    }

    /// A DDIM-like update at evenly spaced timesteps (the memory of a step is the UNet's);
    /// CFG runs the unconditional and conditional halves as one doubled batch, guidance 7.5.
    fn denoise_step(
        &self,
        lat: &Tensor,
        step: usize,
        steps: usize,
        cond: &[Tensor],
        cfg: bool,
    ) -> Result<Tensor> {
        let t = 999.0 * (1.0 - step as f64 / steps as f64);
        let b = lat.dim(0)?;
        let input = if cfg {
            Tensor::cat(&[lat, lat], 0)?
        } else {
            lat.clone()
        };
        let noise = self.unet(&input, t, &cond[0])?;
        drop(input);
        let noise = if cfg {
            let u = noise.narrow(0, 0, b)?;
            let c = noise.narrow(0, b, b)?;
            (&u + ((c - &u)? * 7.5)?)?
        } else {
            noise
        };
        Ok((lat - (noise * 0.1)?)?)
    }

    fn vae_latents(&self, latents: &Tensor) -> Result<Tensor> {
        Ok((latents / self.config.vae.scaling_factor)?.to_dtype(self.vae_dtype)?)
    }

    fn vae_decode(&self, z: &Tensor) -> Result<Tensor> {
        let v = self.vae.as_ref().context("vae not loaded")?;
        Ok(v.decode(z)?)
    }
}
