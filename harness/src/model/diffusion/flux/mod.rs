//! FLUX.1 (black-forest-labs/FLUX.1-dev, FLUX.1-schnell): a DiT image model as diffusers ships
//! it (`FluxPipeline`), components with their own `config.json`: `text_encoder/` (CLIP ViT-L/14
//! text: its pooled vector), `text_encoder_2/` (T5 v1.1 XXL encoder: 512 tokens per prompt),
//! `transformer/` (FluxTransformer2DModel) and `vae/` (AutoencoderKL, 16 latent channels).
//!
//! What runs where:
//! - the transformer is candle-transformers 0.11.1's `flux::model::Flux`. It reads the tensor
//!   names of BFL's reference checkpoint (`flux1-dev.safetensors`: `img_in`, `double_blocks.N`
//!   with fused `qkv`, `single_blocks.N.linear1`, ...); synthetic directories are written with
//!   them. A real diffusers `transformer/` stores the same parameters under diffusers' names
//!   (`x_embedder`, `transformer_blocks.N.attn.to_q`, q/k/v split, `norm_out` with shift and
//!   scale swapped): [`Flux::load`](super::Pipeline::load) reads it through [`DiffusersNames`],
//!   which concatenates the split parts at load time (the load row keeps exactly the weights;
//!   its peak holds one fused tensor's parts twice). Its LayerNorms have no parameters: candle
//!   builds each as a `Tensor::ones` of the hidden size at load time (allocated, not stored).
//! - the VAE is candle's `stable_diffusion::vae::AutoEncoderKL` (diffusers' names) without the
//!   1×1 quant convs, as FLUX's `vae/config.json` says (`use_quant_conv: false`).
//! - the CLIP text encoder is SD's [`ClipText`](super::sd::ClipText); FLUX reads its pooled
//!   vector (the final hidden state at the last token), not the token states.
//! - the T5 encoder is candle's `t5::T5EncoderModel` (transformers' names).
//!
//! The denoising loop holds the latents packed as FluxPipeline does: 2×2 patches of the VAE's
//! 16-channel latents, one 64-channel token each, here (b, H/16, W/16, 64) so that the image's
//! aspect survives (the same bytes as diffusers' (b, H/16·W/16, 64); the transformer reads a
//! reshaped view). One step is one transformer forward with the guidance embedding (FLUX.1-dev
//! is guidance-distilled: no classifier-free guidance, no doubled batch), then an Euler update
//! of the rectified flow. [`Flux::vae_latents`](super::Pipeline::vae_latents) unpacks, unscales
//! and shifts.
//!
//! Files: `config.rs` (the configs, presets and analytic counts), `names.rs` (diffusers'
//! tensor names read as BFL's) and `pipeline.rs` (the loaded [`Flux`]).

mod config;
mod names;
mod pipeline;

pub use config::{
    params_analytic, FluxConfig, FluxVaeConfig, T5Arch, T5Config, T5FeedForward, TransformerConfig,
    MAX_SEQUENCE_LENGTH, PATCH,
};
pub use names::{diffusers_names, DiffusersNames};
pub use pipeline::Flux;
