//! FLUX.1's configs (diffusers' `transformer/`, `vae/`, `text_encoder_2/` `config.json`s; the
//! CLIP encoder's is SD's [`ClipConfig`]), the presets, the tensor shapes each component stores
//! and the parameters counted from the configs alone.
use crate::error::bad_file;
use crate::model::diffusion::params::linear_params;
use crate::model::diffusion::sd::{
    build_vae, clip_l, clip_params, vae_params, ClipConfig, ClipText, VaeConfig,
};
use crate::model::diffusion::{count, read_json, record, write_config, Shapes};
use crate::vocab::{Component, GenModel};
use anyhow::Result;
use candle_nn::VarBuilder;
use candle_transformers::models::flux::model::{Config as DitConfig, Flux as Dit};
use candle_transformers::models::{stable_diffusion::vae, t5};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Latent pixels per side of one image token: FluxPipeline packs 2×2 latent patches.
pub const PATCH: usize = 2;
/// FluxPipeline's default `max_sequence_length`: T5 tokens per prompt.
pub const MAX_SEQUENCE_LENGTH: usize = 512;
/// The timestep and guidance embeddings' sinusoid width (BFL's and candle's, fixed).
const TIME_DIM: u64 = 256;

fn patch_size_one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn max_distance() -> usize {
    128
}
fn eps6() -> f64 {
    1e-6
}

/// diffusers' `transformer/config.json` (FluxTransformer2DModel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    #[serde(default = "patch_size_one")]
    pub patch_size: usize,
    /// Channels of one packed token: 4 × the VAE's latent channels.
    pub in_channels: usize,
    #[serde(default)]
    pub out_channels: Option<usize>,
    /// Double-stream (MMDiT) blocks.
    pub num_layers: usize,
    /// Single-stream blocks.
    pub num_single_layers: usize,
    pub attention_head_dim: usize,
    pub num_attention_heads: usize,
    /// T5's hidden size.
    pub joint_attention_dim: usize,
    /// CLIP's pooled vector size.
    pub pooled_projection_dim: usize,
    #[serde(default)]
    pub guidance_embeds: bool,
    pub axes_dims_rope: Vec<usize>,
}

impl TransformerConfig {
    pub fn hidden_size(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// candle's (BFL's) config of the same model.
    pub fn dit(&self) -> DitConfig {
        DitConfig {
            in_channels: self.in_channels,
            vec_in_dim: self.pooled_projection_dim,
            context_in_dim: self.joint_attention_dim,
            hidden_size: self.hidden_size(),
            mlp_ratio: 4.0,
            num_heads: self.num_attention_heads,
            depth: self.num_layers,
            depth_single_blocks: self.num_single_layers,
            axes_dim: self.axes_dims_rope.clone(),
            theta: 10_000,
            qkv_bias: true,
            guidance_embed: self.guidance_embeds,
        }
    }

    /// What candle's model cannot build: the key and the problem.
    fn validate(&self, latent_channels: usize) -> std::result::Result<(), String> {
        if self.patch_size != 1 {
            return Err(format!(
                "patch_size {}: candle's FLUX model reads packed 2×2 latent tokens (patch_size 1)",
                self.patch_size
            ));
        }
        if self.out_channels.is_some_and(|o| o != self.in_channels) {
            return Err(format!(
                "out_channels {:?} differs from in_channels {} (candle's final layer predicts in_channels)",
                self.out_channels, self.in_channels
            ));
        }
        if self.in_channels != PATCH * PATCH * latent_channels {
            return Err(format!(
                "in_channels {} is not 4 × the VAE's latent_channels {latent_channels}",
                self.in_channels
            ));
        }
        let rope: usize = self.axes_dims_rope.iter().sum();
        if rope != self.attention_head_dim || self.axes_dims_rope.iter().any(|d| d % 2 == 1) {
            return Err(format!(
                "axes_dims_rope {:?} must be even and sum to attention_head_dim {}",
                self.axes_dims_rope, self.attention_head_dim
            ));
        }
        Ok(())
    }
}

/// diffusers' `vae/config.json` for FLUX: SD's AutoencoderKL keys, plus the latent shift and
/// the quant convs FLUX's VAE does without.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FluxVaeConfig {
    #[serde(flatten)]
    pub base: VaeConfig,
    #[serde(default = "yes")]
    pub use_quant_conv: bool,
    #[serde(default = "yes")]
    pub use_post_quant_conv: bool,
    #[serde(default)]
    pub shift_factor: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum T5Arch {
    T5EncoderModel,
}

/// T5's `feed_forward_proj`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum T5FeedForward {
    #[serde(rename = "relu")]
    Relu,
    #[serde(rename = "gated-gelu")]
    GatedGelu,
    #[serde(rename = "gated-silu")]
    GatedSilu,
}

impl T5FeedForward {
    fn gated(self) -> bool {
        self != T5FeedForward::Relu
    }
}

/// transformers' `text_encoder_2/config.json` (T5Config of a T5EncoderModel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct T5Config {
    pub architectures: Vec<T5Arch>,
    pub vocab_size: usize,
    pub d_model: usize,
    pub d_kv: usize,
    pub d_ff: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub relative_attention_num_buckets: usize,
    #[serde(default = "max_distance")]
    pub relative_attention_max_distance: usize,
    #[serde(default = "eps6")]
    pub layer_norm_epsilon: f64,
    pub feed_forward_proj: T5FeedForward,
    /// The encoder has no LM head either way; kept as the file says.
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
}

impl T5Config {
    /// candle's config of the same encoder.
    pub fn candle(&self) -> t5::Config {
        use candle_nn::Activation;
        let activation = match self.feed_forward_proj {
            T5FeedForward::Relu => Activation::Relu,
            T5FeedForward::GatedGelu => Activation::NewGelu,
            T5FeedForward::GatedSilu => Activation::Silu,
        };
        t5::Config {
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            d_kv: self.d_kv,
            d_ff: self.d_ff,
            num_layers: self.num_layers,
            num_decoder_layers: None,
            num_heads: self.num_heads,
            relative_attention_num_buckets: self.relative_attention_num_buckets,
            relative_attention_max_distance: self.relative_attention_max_distance,
            dropout_rate: 0.0,
            layer_norm_epsilon: self.layer_norm_epsilon,
            initializer_factor: 1.0,
            feed_forward_proj: t5::ActivationWithOptionalGating {
                gated: self.feed_forward_proj.gated(),
                activation,
            },
            tie_word_embeddings: self.tie_word_embeddings,
            is_decoder: false,
            is_encoder_decoder: true,
            use_cache: false,
            pad_token_id: 0,
            eos_token_id: 1,
            decoder_start_token_id: Some(0),
        }
    }
}

/// A whole FLUX pipeline's configs.
#[derive(Clone, Debug, PartialEq)]
pub struct FluxConfig {
    /// `flux-dev`, `flux-schnell` (a preset), or the directory's name.
    pub name: String,
    pub transformer: TransformerConfig,
    pub vae: FluxVaeConfig,
    pub text_encoder: ClipConfig,
    pub text_encoder_2: T5Config,
    /// T5 tokens per prompt: FluxPipeline's `max_sequence_length` (512), capped by
    /// `tokenizer_2/tokenizer_config.json`'s `model_max_length` where the directory has one.
    pub text_len: usize,
}

/// transformers' `tokenizer_config.json` (the key that shapes memory).
#[derive(Serialize, Deserialize)]
struct TokenizerConfig {
    model_max_length: usize,
}

/// The T5 tokenizer's directory in a diffusers FLUX directory.
const TOKENIZER_2: &str = "tokenizer_2/tokenizer_config.json";

impl FluxConfig {
    /// The published configs (diffusers layout) of black-forest-labs/FLUX.1-dev and
    /// FLUX.1-schnell: the same shapes but for -dev's guidance embedding.
    pub fn preset(m: GenModel) -> FluxConfig {
        let guidance = match m {
            GenModel::FluxDev => true,
            GenModel::FluxSchnell => false,
            other => panic!("`{other}` is not a FLUX model"),
        };
        FluxConfig {
            name: m.as_str().into(),
            transformer: TransformerConfig {
                patch_size: 1,
                in_channels: 64,
                out_channels: None,
                num_layers: 19,
                num_single_layers: 38,
                attention_head_dim: 128,
                num_attention_heads: 24,
                joint_attention_dim: 4096,
                pooled_projection_dim: 768,
                guidance_embeds: guidance,
                axes_dims_rope: vec![16, 56, 56],
            },
            vae: FluxVaeConfig {
                base: VaeConfig {
                    in_channels: 3,
                    out_channels: 3,
                    latent_channels: 16,
                    block_out_channels: vec![128, 256, 512, 512],
                    layers_per_block: 2,
                    norm_num_groups: 32,
                    force_upcast: true,
                    scaling_factor: 0.3611,
                    sample_size: 1024,
                },
                use_quant_conv: false,
                use_post_quant_conv: false,
                shift_factor: 0.1159,
            },
            text_encoder: clip_l(),
            // google/t5-v1_1-xxl's encoder.
            text_encoder_2: T5Config {
                architectures: vec![T5Arch::T5EncoderModel],
                vocab_size: 32128,
                d_model: 4096,
                d_kv: 64,
                d_ff: 10240,
                num_layers: 24,
                num_heads: 64,
                relative_attention_num_buckets: 32,
                relative_attention_max_distance: 128,
                layer_norm_epsilon: 1e-6,
                feed_forward_proj: T5FeedForward::GatedGelu,
                tie_word_embeddings: false,
            },
            text_len: MAX_SEQUENCE_LENGTH,
        }
    }

    /// Reads a diffusers directory's four `config.json`. Errors name the file and the key.
    pub fn from_dir(dir: &Path) -> Result<FluxConfig> {
        let transformer = dir.join("transformer/config.json");
        let cfg = FluxConfig {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "diffusers".into()),
            transformer: read_json(&transformer)?,
            vae: read_json(&dir.join("vae/config.json"))?,
            text_encoder: read_json(&dir.join("text_encoder/config.json"))?,
            text_encoder_2: read_json(&dir.join("text_encoder_2/config.json"))?,
            text_len: MAX_SEQUENCE_LENGTH,
        };
        let tok = dir.join(TOKENIZER_2);
        let cfg = if tok.exists() {
            let t: TokenizerConfig = read_json(&tok)?;
            FluxConfig {
                text_len: t.model_max_length.min(MAX_SEQUENCE_LENGTH),
                ..cfg
            }
        } else {
            cfg
        };
        cfg.transformer
            .validate(cfg.vae.base.latent_channels)
            .map_err(|e| bad_file(&transformer, e))?;
        Ok(cfg)
    }

    /// Writes the `config.json` files of a diffusers directory and its `model_index.json`.
    pub fn write_configs(&self, dir: &Path) -> Result<()> {
        write_config(dir, Component::TextEncoder, &self.text_encoder)?;
        write_config(dir, Component::TextEncoder2, &self.text_encoder_2)?;
        write_config(dir, Component::Transformer, &self.transformer)?;
        write_config(dir, Component::Vae, &self.vae)?;
        let tok = dir.join(TOKENIZER_2);
        let t = TokenizerConfig {
            model_max_length: self.text_len,
        };
        std::fs::create_dir_all(tok.parent().expect("a parent"))?;
        std::fs::write(&tok, serde_json::to_string_pretty(&t)?)?;
        crate::model::diffusion::write_model_index(dir, "FluxPipeline")
    }

    /// The pipeline's components, in load order.
    pub fn components(&self) -> Vec<Component> {
        vec![
            Component::TextEncoder,
            Component::TextEncoder2,
            Component::Transformer,
            Component::Vae,
        ]
    }

    /// Resolutions are a multiple of this: the VAE's factor × the 2×2 packing.
    pub fn spatial_factor(&self) -> usize {
        self.vae.base.scale() * PATCH
    }

    /// Stored tensors of a component, with their names and shapes, in load order.
    pub fn shapes(&self, c: Component) -> Shapes {
        match c {
            Component::TextEncoder => record(|vb| ClipText::new(&self.text_encoder, vb).map(drop)),
            Component::TextEncoder2 => {
                record(|vb| t5::T5EncoderModel::load(vb, &self.text_encoder_2.candle()).map(drop))
            }
            Component::Transformer => record(|vb| Dit::new(&self.transformer.dit(), vb).map(drop)),
            Component::Vae => record(|vb| self.build_vae(vb).map(drop)),
            _ => Vec::new(),
        }
    }

    pub fn params(&self, c: Component) -> u64 {
        count(&self.shapes(c))
    }

    pub(super) fn build_vae(&self, vb: VarBuilder) -> candle_core::Result<vae::AutoEncoderKL> {
        let v = &self.vae;
        build_vae(&v.base, v.use_quant_conv, v.use_post_quant_conv, vb)
    }

    /// LayerNorms candle's transformer allocates at load (ones of the hidden size, not stored):
    /// four per double block, one per single block, the final one.
    pub fn transformer_norms(&self) -> usize {
        4 * self.transformer.num_layers + self.transformer.num_single_layers + 1
    }
}

/// Parameters of a component counted from its config alone, following diffusers' module
/// structure (independent of the module construction [`FluxConfig::shapes`] records).
pub fn params_analytic(cfg: &FluxConfig, c: Component) -> u64 {
    match c {
        Component::TextEncoder => clip_params(&cfg.text_encoder),
        Component::TextEncoder2 => t5_params(&cfg.text_encoder_2),
        Component::Transformer => transformer_params(&cfg.transformer),
        Component::Vae => vae_params(
            &cfg.vae.base,
            cfg.vae.use_quant_conv,
            cfg.vae.use_post_quant_conv,
        ),
        _ => 0,
    }
}

/// FluxTransformer2DModel: `x_embedder`, `context_embedder`, the time (and guidance) and
/// pooled-text embedders (two linears each), the double blocks (image and text streams: an
/// AdaLayerNormZero linear to 6 × hidden, q/k/v/out projections with RMS norms on q and k,
/// a 4× GELU feed-forward), the single blocks (an AdaLayerNormZeroSingle linear to 3 × hidden,
/// q/k/v and the MLP's input as one input projection, one output projection from 5 × hidden,
/// RMS norms on q and k), `norm_out` (a linear to 2 × hidden) and `proj_out`.
fn transformer_params(t: &TransformerConfig) -> u64 {
    let h = t.hidden_size() as u64;
    let hd = t.attention_head_dim as u64;
    let mlp = 4 * h;
    let embed = |i: u64| linear_params(i, h) + linear_params(h, h);
    let stream = linear_params(h, 6 * h)
        + 4 * linear_params(h, h)
        + 2 * hd
        + linear_params(h, mlp)
        + linear_params(mlp, h);
    let single = linear_params(h, 3 * h)
        + linear_params(h, 3 * h + mlp)
        + linear_params(h + mlp, h)
        + 2 * hd;
    linear_params(t.in_channels as u64, h)
        + linear_params(t.joint_attention_dim as u64, h)
        + embed(TIME_DIM)
        + if t.guidance_embeds {
            embed(TIME_DIM)
        } else {
            0
        }
        + embed(t.pooled_projection_dim as u64)
        + t.num_layers as u64 * 2 * stream
        + t.num_single_layers as u64 * single
        + linear_params(h, 2 * h)
        + linear_params(h, t.in_channels as u64)
}

/// T5EncoderModel: the shared embedding, per layer q/k/v/o (no biases), the feed-forward
/// (wi_0 and wi_1 when gated, wo) and two RMS norms; the first layer's relative attention
/// bias; the final norm.
fn t5_params(c: &T5Config) -> u64 {
    let d = c.d_model as u64;
    let inner = (c.num_heads * c.d_kv) as u64;
    let ff = if c.feed_forward_proj.gated() { 3 } else { 2 } * d * c.d_ff as u64;
    let layer = 4 * d * inner + ff + 2 * d;
    c.vocab_size as u64 * d
        + c.num_layers as u64 * layer
        + (c.relative_attention_num_buckets * c.num_heads) as u64
        + d
}
