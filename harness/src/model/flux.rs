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
//!   scale swapped): [`Flux::load`] reads it through [`DiffusersNames`], which concatenates
//!   the split parts at load time (the load row keeps exactly the weights; its peak holds one
//!   fused tensor's parts twice). Its LayerNorms have no parameters: candle builds each as a `Tensor::ones` of
//!   the hidden size at load time (allocated, not stored).
//! - the VAE is candle's `stable_diffusion::vae::AutoEncoderKL` (diffusers' names) without the
//!   1×1 quant convs, as FLUX's `vae/config.json` says (`use_quant_conv: false`).
//! - the CLIP text encoder is `sd.rs`'s [`ClipText`]; FLUX reads its pooled vector (the final
//!   hidden state at the last token), not the token states.
//! - the T5 encoder is candle's `t5::T5EncoderModel` (transformers' names).
//!
//! The denoising loop holds the latents packed as FluxPipeline does: 2×2 patches of the VAE's
//! 16-channel latents, one 64-channel token each, here (b, H/16, W/16, 64) so that the image's
//! aspect survives (the same bytes as diffusers' (b, H/16·W/16, 64); the transformer reads a
//! reshaped view). One step is one transformer forward with the guidance embedding (FLUX.1-dev
//! is guidance-distilled: no classifier-free guidance, no doubled batch), then an Euler update
//! of the rectified flow. [`Flux::vae_latents`] unpacks, unscales and shifts.
use super::pipeline::{count, read_json, record, write_config, Pipeline, Shapes};
use super::sd::{
    build_vae, clip_ids, clip_l, clip_params, lin, vae_params, ClipConfig, ClipText, VaeConfig,
};
use crate::error::bad_file;
use crate::vocab::{Attention, Component, GenModel, Resolution};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::flux::model::{Config as DitConfig, Flux as Dit};
use candle_transformers::models::flux::WithForward;
use candle_transformers::models::{stable_diffusion::vae, t5};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::path::Path;

/// Latent pixels per side of one image token: FluxPipeline packs 2×2 latent patches.
pub const PATCH: usize = 2;
/// FluxPipeline's default `max_sequence_length`: T5 tokens per prompt.
pub const MAX_SEQUENCE_LENGTH: usize = 512;
/// The timestep and guidance embeddings' sinusoid width (BFL's and candle's, fixed).
const TIME_DIM: u64 = 256;
/// The guidance FluxPipeline embeds by default (`guidance_scale`).
const GUIDANCE: f32 = 3.5;

fn one() -> usize {
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
    #[serde(default = "one")]
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
        super::pipeline::write_model_index(dir, "FluxPipeline")
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

    fn build_vae(&self, vb: VarBuilder) -> candle_core::Result<vae::AutoEncoderKL> {
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
    let embed = |i: u64| lin(i, h) + lin(h, h);
    let stream = lin(h, 6 * h) + 4 * lin(h, h) + 2 * hd + lin(h, mlp) + lin(mlp, h);
    let single = lin(h, 3 * h) + lin(h, 3 * h + mlp) + lin(h + mlp, h) + 2 * hd;
    lin(t.in_channels as u64, h)
        + lin(t.joint_attention_dim as u64, h)
        + embed(TIME_DIM)
        + if t.guidance_embeds {
            embed(TIME_DIM)
        } else {
            0
        }
        + embed(t.pooled_projection_dim as u64)
        + t.num_layers as u64 * 2 * stream
        + t.num_single_layers as u64 * single
        + lin(h, 2 * h)
        + lin(h, t.in_channels as u64)
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

/// The diffusers tensors (FluxTransformer2DModel's names) that hold BFL's tensor `bfl`, in the
/// order they concatenate along the first axis, and whether the result's two halves swap
/// (`norm_out` is (scale, shift) where BFL's `final_layer.adaLN_modulation.1` is (shift,
/// scale)). None: not a FLUX transformer tensor. The inverse of diffusers'
/// `scripts/convert_flux_to_diffusers.py`, with the guidance embedder its single-file loader
/// adds (`guidance_in` → `time_text_embed.guidance_embedder`).
pub fn diffusers_names(bfl: &str) -> Option<(Vec<String>, bool)> {
    let (stem, leaf) = bfl.rsplit_once('.')?;
    let leaf = if leaf == "scale" { "weight" } else { leaf };
    let names = |v: &[&str], prefix: &str| {
        Some((
            v.iter().map(|n| format!("{prefix}{n}.{leaf}")).collect(),
            false,
        ))
    };
    let path: Vec<&str> = stem.split('.').collect();
    match path.as_slice() {
        ["img_in"] => names(&["x_embedder"], ""),
        ["txt_in"] => names(&["context_embedder"], ""),
        [e @ ("time_in" | "guidance_in" | "vector_in"), l @ ("in_layer" | "out_layer")] => {
            let e = match *e {
                "time_in" => "timestep_embedder",
                "guidance_in" => "guidance_embedder",
                _ => "text_embedder",
            };
            let l = if *l == "in_layer" {
                "linear_1"
            } else {
                "linear_2"
            };
            names(&[l], &format!("time_text_embed.{e}."))
        }
        ["double_blocks", i, rest @ ..] => {
            let b = format!("transformer_blocks.{i}.");
            let n = match rest {
                ["img_attn", "qkv"] => return names(&["attn.to_q", "attn.to_k", "attn.to_v"], &b),
                ["txt_attn", "qkv"] => {
                    let qkv = ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"];
                    return names(&qkv, &b);
                }
                ["img_mod", "lin"] => "norm1.linear",
                ["txt_mod", "lin"] => "norm1_context.linear",
                ["img_attn", "norm", "query_norm"] => "attn.norm_q",
                ["img_attn", "norm", "key_norm"] => "attn.norm_k",
                ["txt_attn", "norm", "query_norm"] => "attn.norm_added_q",
                ["txt_attn", "norm", "key_norm"] => "attn.norm_added_k",
                ["img_attn", "proj"] => "attn.to_out.0",
                ["txt_attn", "proj"] => "attn.to_add_out",
                ["img_mlp", "0"] => "ff.net.0.proj",
                ["img_mlp", "2"] => "ff.net.2",
                ["txt_mlp", "0"] => "ff_context.net.0.proj",
                ["txt_mlp", "2"] => "ff_context.net.2",
                _ => return None,
            };
            names(&[n], &b)
        }
        ["single_blocks", i, rest @ ..] => {
            let b = format!("single_transformer_blocks.{i}.");
            let n = match rest {
                ["linear1"] => {
                    return names(&["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"], &b)
                }
                ["linear2"] => "proj_out",
                ["norm", "query_norm"] => "attn.norm_q",
                ["norm", "key_norm"] => "attn.norm_k",
                ["modulation", "lin"] => "norm.linear",
                _ => return None,
            };
            names(&[n], &b)
        }
        ["final_layer", "linear"] => names(&["proj_out"], ""),
        ["final_layer", "adaLN_modulation", "1"] => {
            Some((vec![format!("norm_out.linear.{leaf}")], true))
        }
        _ => None,
    }
}

/// A [`SimpleBackend`](candle_nn::var_builder::SimpleBackend) that serves BFL's tensor names
/// from a diffusers-layout FLUX transformer (the `VarBuilder` over its files): each requested
/// tensor is read under its diffusers names ([`diffusers_names`]) and concatenated.
pub struct DiffusersNames(pub VarBuilder<'static>);

impl candle_nn::var_builder::SimpleBackend for DiffusersNames {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        _: &Device,
    ) -> candle_core::Result<Tensor> {
        let Some((parts, swap)) = diffusers_names(name) else {
            candle_core::bail!("`{name}` is not a FLUX transformer tensor")
        };
        let ts = parts
            .iter()
            .map(|p| self.0.get_unchecked_dtype(p, dtype))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let t = match ts.len() {
            1 => ts.into_iter().next().expect("one part"),
            _ => Tensor::cat(&ts, 0)?,
        };
        let t = if swap {
            let n = t.dim(0)? / 2;
            Tensor::cat(&[t.narrow(0, n, n)?, t.narrow(0, 0, n)?], 0)?
        } else {
            t
        };
        if t.dims() != s.dims() {
            candle_core::bail!(
                "`{}` has shape {:?}, expected {:?} for `{name}`",
                parts.join(" + "),
                t.dims(),
                s.dims()
            )
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("`{name}` requested without a shape")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        diffusers_names(name).is_some_and(|(p, _)| p.iter().all(|n| self.0.contains_tensor(n)))
    }
}

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
        let vb = super::pipeline::var_builder(dir, c, self.dtype(c), dev)?;
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
