//! The loaded FLUX.1 pipeline, [`Flux`], behind the generation [`Pipeline`] trait.
use super::config::{params_analytic, FluxConfig, PATCH};
use super::names::DiffusersNames;
use crate::model::diffusion::sd::{clip_ids, ClipText};
use crate::model::diffusion::{Pipeline, Shapes};
use crate::vocab::{Attention, Component, Resolution};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::flux::model::Flux as Dit;
use candle_transformers::models::flux::WithForward;
use candle_transformers::models::{stable_diffusion::vae, t5};
use std::cell::RefCell;
use std::path::Path;

/// The guidance FluxPipeline embeds by default (`guidance_scale`).
const GUIDANCE: f32 = 3.5;

/// A loaded FLUX pipeline: each component in its own dtype.
pub struct Flux {
    pub config: FluxConfig,
    clip: Option<ClipText>,
    /// candle's T5 forward takes `&mut self` (its decoder's KV cache; unused here).
    t5: RefCell<Option<t5::T5EncoderModel>>,
    transformer: Option<Dit>,
    vae: Option<vae::AutoEncoderKL>,
    pub dtype: DType,
    pub vae_dtype: DType,
}

impl Flux {
    pub fn new(config: FluxConfig, dtype: DType, vae_dtype: DType) -> Flux {
        Flux {
            config,
            clip: None,
            t5: RefCell::new(None),
            transformer: None,
            vae: None,
            dtype,
            vae_dtype,
        }
    }
}

/// The position ids FluxPipeline gives the image tokens: (0, row, column) per 2×2 patch.
fn image_ids(b: usize, h: usize, w: usize, dtype: DType, dev: &Device) -> Result<Tensor> {
    let ids: Vec<f32> = (0..h * w)
        .flat_map(|i| [0.0, (i / w) as f32, (i % w) as f32])
        .collect();
    Ok(Tensor::from_vec(ids, (1, h * w, 3), dev)?
        .to_dtype(dtype)?
        .repeat((b, 1, 1))?)
}

impl Pipeline for Flux {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn architecture(&self) -> &'static str {
        "flux"
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

    /// Loads one component through candle's mmaped-safetensors VarBuilder, in its dtype.
    /// Attention is candle's eager attention only.
    fn load(&mut self, dir: &Path, c: Component, attention: Attention, dev: &Device) -> Result<()> {
        if attention != Attention::Eager {
            anyhow::bail!("attention `{attention}` is not available for FLUX yet (eager only)");
        }
        let vb = crate::model::diffusion::var_builder(dir, c, self.dtype(c), dev)?;
        let cfg = &self.config;
        match c {
            Component::TextEncoder => self.clip = Some(ClipText::new(&cfg.text_encoder, vb)?),
            Component::TextEncoder2 => {
                let m = t5::T5EncoderModel::load(vb, &cfg.text_encoder_2.candle())?;
                *self.t5.borrow_mut() = Some(m);
            }
            Component::Transformer => {
                let vb = if !vb.contains_tensor("img_in.weight")
                    && vb.contains_tensor("x_embedder.weight")
                {
                    let (dtype, dev) = (vb.dtype(), vb.device().clone());
                    VarBuilder::from_backend(Box::new(DiffusersNames(vb)), dtype, dev)
                } else {
                    vb
                };
                self.transformer = Some(Dit::new(&cfg.transformer.dit(), vb)?);
            }
            Component::Vae => self.vae = Some(cfg.build_vae(vb)?),
            other => anyhow::bail!("FLUX has no `{other}`"),
        }
        Ok(())
    }

    /// CLIP's ids (its full 77 tokens) and T5's (`text_len` tokens, ids in range).
    fn prompt_ids(&self, prompts: usize, dev: &Device) -> Result<Vec<Tensor>> {
        let clip = clip_ids(&self.config.text_encoder, prompts, dev)?;
        let (s, v) = (
            self.config.text_len,
            self.config.text_encoder_2.vocab_size as u32,
        );
        let ids: Vec<u32> = (0..prompts * s).map(|i| (i as u32 * 5 + 3) % v).collect();
        let t5 = Tensor::from_vec(ids, (prompts, s), dev)?;
        Ok(vec![clip, t5])
    }

    fn text_len(&self) -> usize {
        self.config.text_len
    }

    /// T5's token states (b, text_len, d_model) and CLIP's pooled vector (b, hidden): the last
    /// token's final hidden state (CLIP runs first, as in FluxPipeline).
    fn encode_text(&self, ids: &[Tensor], _cfg: bool) -> Result<Vec<Tensor>> {
        let clip = self.clip.as_ref().context("text_encoder not loaded")?;
        let states = clip.forward(&ids[0])?;
        let s = states.dim(1)?;
        let pooled = states.narrow(1, s - 1, 1)?.squeeze(1)?.contiguous()?;
        drop(states);
        let mut t5 = self.t5.borrow_mut();
        let t5 = t5.as_mut().context("text_encoder_2 not loaded")?;
        let tokens = t5.forward(&ids[1])?;
        Ok(vec![tokens, pooled])
    }

    fn spatial_factor(&self) -> usize {
        self.config.spatial_factor()
    }

    fn vae_scale(&self) -> usize {
        self.config.vae.base.scale()
    }

    fn image_channels(&self) -> usize {
        self.config.vae.base.out_channels
    }

    fn has_cfg(&self) -> bool {
        false
    }

    /// Packed latents (b, H/16, W/16, 4 × latent channels).
    fn latent_shape(&self, r: Resolution, batch: usize, _frames: usize) -> Vec<usize> {
        let f = self.spatial_factor();
        vec![
            batch,
            r.height / f,
            r.width / f,
            self.config.transformer.in_channels,
        ]
    }

    /// One transformer forward at t = 1 − step/steps (guidance 3.5 embedded where the model
    /// has the embedding), then the Euler step of the rectified flow to the next t.
    fn denoise_step(
        &self,
        lat: &Tensor,
        step: usize,
        steps: usize,
        cond: &[Tensor],
        cfg: bool,
    ) -> Result<Tensor> {
        anyhow::ensure!(!cfg, "FLUX runs without classifier-free guidance");
        let dit = self
            .transformer
            .as_ref()
            .context("transformer not loaded")?;
        let (b, h, w, c) = lat.dims4()?;
        let (dev, dtype) = (lat.device(), lat.dtype());
        let img = lat.reshape((b, h * w, c))?;
        let (txt, pooled) = (&cond[0], &cond[1]);
        let img_ids = image_ids(b, h, w, dtype, dev)?;
        let txt_ids = Tensor::zeros((b, txt.dim(1)?, 3), dtype, dev)?;
        let t = 1.0 - step as f64 / steps as f64;
        let t_next = 1.0 - (step + 1) as f64 / steps as f64;
        let t_vec = Tensor::full(t as f32, b, dev)?.to_dtype(dtype)?;
        let guidance = match self.config.transformer.guidance_embeds {
            true => Some(Tensor::full(GUIDANCE, b, dev)?.to_dtype(dtype)?),
            false => None,
        };
        let pred = dit.forward(
            &img,
            &img_ids,
            txt,
            &txt_ids,
            &t_vec,
            pooled,
            guidance.as_ref(),
        )?;
        drop((img_ids, txt_ids, t_vec, guidance));
        let next = (img + (pred * (t_next - t))?)?;
        Ok(next.reshape((b, h, w, c))?)
    }

    /// Unpacks (b, H/16, W/16, 4·c) → (b, c, H/8, W/8), then `z / scaling_factor +
    /// shift_factor`, in the VAE's dtype.
    fn vae_latents(&self, latents: &Tensor) -> Result<Tensor> {
        let (b, h, w, c) = latents.dims4()?;
        let lat = c / (PATCH * PATCH);
        let z = latents
            .reshape((b, h, w, lat, PATCH, PATCH))?
            .permute((0, 3, 1, 4, 2, 5))?
            .reshape((b, lat, h * PATCH, w * PATCH))?;
        let v = &self.config.vae;
        let z = ((z / v.base.scaling_factor)? + v.shift_factor)?;
        Ok(z.to_dtype(self.vae_dtype)?)
    }

    fn vae_decode(&self, z: &Tensor) -> Result<Tensor> {
        let v = self.vae.as_ref().context("vae not loaded")?;
        Ok(v.decode(z)?)
    }
}
