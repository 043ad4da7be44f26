//! The Stable Diffusion family (SD 1.5, SD 2.1, SDXL): a generation pipeline of components, each
//! with its own diffusers `config.json` — `unet/` (UNet2DConditionModel), `vae/` (AutoencoderKL),
//! `text_encoder/` and, for SDXL, `text_encoder_2/` (CLIP text transformers).
//!
//! The family is the [`Sd`] pipeline, behind the generation [`Pipeline`](super::Pipeline)
//! trait, one component loaded (and measured) at a time.
//!
//! What runs where:
//! - the UNet and the VAE are candle-transformers 0.11.1's `stable_diffusion::{unet_2d, vae}`,
//!   built from [`UNetConfig`]/[`VaeConfig`] (their configs have public fields). candle's UNet
//!   has no SDXL `add_embedding` (the `text_time` micro-conditioning): its two linears are
//!   stored in the checkpoint, so `unet_shapes` adds them and
//!   [`Sd::load`](super::Pipeline::load) loads them, but the forward does not use them (a
//!   (b, 1280) vector: no memory to speak of).
//! - the CLIP text encoders are this module's own [`ClipText`] (`clip.rs`): candle's
//!   `clip::Config` has private fields (only its presets can be built), so it cannot read a
//!   `config.json` or a tiny test config.
//!
//! Tensor shapes come from building each module over a recording
//! [`SimpleBackend`](candle_nn::var_builder::SimpleBackend) (every
//! `vb.get` is a stored tensor); [`params_analytic`] counts the same parameters from the config
//! alone, and the tests check the two agree and match the published counts.
//!
//! Files: `config.rs` (the diffusers configs and presets), `clip.rs` (the text encoders),
//! `components.rs` (candle's UNet and VAE, the analytic counts), `pipeline.rs` (the loaded
//! [`Sd`]) and `train_unet.rs` (the UNet written for LoRA training, [`SdUnet`]).

mod clip;
mod components;
mod config;
mod pipeline;
mod train_unet;

pub use clip::{clip_ids, clip_l, clip_params, ClipAct, ClipArch, ClipConfig, ClipText};
pub use components::{build_unet, build_vae, params_analytic, vae_params};
pub use config::{AdditionEmbed, DownBlock, PerBlock, SdConfig, UNetConfig, UpBlock, VaeConfig};
pub use pipeline::{sliced_size, Sd};
pub use train_unet::SdUnet;
