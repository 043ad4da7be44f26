//! Wan2.1 text-to-video: a pipeline of three diffusers components, each with its own
//! `config.json` — `transformer/` (WanTransformer3DModel, a DiT over latent_frames × (H/16) ×
//! (W/16) tokens with cross-attention to the text), `vae/` (AutoencoderKLWan, a causal 3D VAE of
//! stride 4 × 8 × 8 that decodes one latent frame at a time through a feature cache) and
//! `text_encoder/` (transformers' UMT5EncoderModel, umT5-XXL).
//!
//! Files: `config.rs` (the configs and the analytic counts), `dit.rs` (the transformer),
//! `vae.rs` (the VAE decoder) with its causal convolution `conv3d.rs`, `umt5.rs` (the text
//! encoder) and `pipeline.rs` (the loaded [`Wan`]).
//!
//! Sources: huggingface/diffusers `models/transformers/transformer_wan.py` and
//! `models/autoencoders/autoencoder_kl_wan.py`, Wan-AI/Wan2.1 `wan/modules/{model,vae,t5}.py`,
//! and the Wan-AI/Wan2.1-T2V-1.3B-Diffusers configs.

mod config;
mod conv3d;
mod dit;
mod pipeline;
mod umt5;
mod vae;

pub use config::{
    transformer_params, umt5_params, vae_decoder_params, vae_encoder_params, vae_params,
    FeedForwardProj, QkNorm, UmT5Config, WanConfig, WanTransformerConfig, WanVaeConfig,
    CACHE_FRAMES, TEXT_LEN,
};
pub use conv3d::{CausalConv3d, FeatCache};
pub use dit::{Cond, WanDit};
pub use pipeline::{Wan, FLOW_SHIFT, GUIDANCE_SCALE};
pub use umt5::UmT5Encoder;
pub use vae::{WanDecoder, WanEncoderWeights};
