//! The Stable Diffusion family (SD 1.5, SD 2.1, SDXL): a generation pipeline of components, each
//! with its own diffusers `config.json` — `unet/` (UNet2DConditionModel), `vae/` (AutoencoderKL),
//! `text_encoder/` and, for SDXL, `text_encoder_2/` (CLIP text transformers).
//!
//! The family is the [`Sd`] pipeline, behind the generation [`Pipeline`] trait, one component
//! loaded (and measured) at a time.
//!
//! What runs where:
//! - the UNet and the VAE are candle-transformers 0.11.1's `stable_diffusion::{unet_2d, vae}`,
//!   built from [`UNetConfig`]/[`VaeConfig`] (their configs have public fields). candle's UNet
//!   has no SDXL `add_embedding` (the `text_time` micro-conditioning): its two linears are
//!   stored in the checkpoint, so `unet_shapes` adds them and [`Sd::load`] loads them, but
//!   the forward does not use them (a (b, 1280) vector: no memory to speak of).
//! - the CLIP text encoders are this file's own [`ClipText`]: candle's `clip::Config` has
//!   private fields (only its presets can be built), so it cannot read a `config.json` or a
//!   tiny test config.
//!
//! Tensor shapes come from building each module over a recording
//! [`SimpleBackend`](candle_nn::var_builder::SimpleBackend) (every
//! `vb.get` is a stored tensor); [`params_analytic`] counts the same parameters from the config
//! alone, and the tests check the two agree and match the published counts.
use super::pipeline::{record, write_config, Pipeline, Shapes};
use crate::vocab::{Attention, Component, GenModel, Resolution};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{unet_2d, vae};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// An integer for every block, or one for all (diffusers writes both).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PerBlock {
    One(usize),
    Many(Vec<usize>),
}

impl PerBlock {
    pub fn at(&self, i: usize) -> usize {
        match self {
            PerBlock::One(n) => *n,
            PerBlock::Many(v) => v[i],
        }
    }
}

fn one() -> PerBlock {
    PerBlock::One(1)
}
fn four() -> usize {
    4
}
fn three() -> usize {
    3
}
fn groups() -> usize {
    32
}
fn eps() -> f64 {
    1e-5
}
fn yes() -> bool {
    true
}
fn sd_scale() -> f64 {
    0.18215
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownBlock {
    CrossAttnDownBlock2D,
    DownBlock2D,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpBlock {
    CrossAttnUpBlock2D,
    UpBlock2D,
}

/// SDXL's micro-conditioning on image sizes (`add_embedding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdditionEmbed {
    TextTime,
}

/// diffusers' `unet/config.json` (the keys that shape memory; others are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UNetConfig {
    #[serde(default = "four")]
    pub in_channels: usize,
    #[serde(default = "four")]
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub down_block_types: Vec<DownBlock>,
    pub up_block_types: Vec<UpBlock>,
    pub cross_attention_dim: usize,
    /// diffusers' name; the number of heads in SD 1.x/2.x/XL checkpoints.
    pub attention_head_dim: PerBlock,
    #[serde(default = "one")]
    pub transformer_layers_per_block: PerBlock,
    #[serde(default)]
    pub use_linear_projection: bool,
    #[serde(default = "groups")]
    pub norm_num_groups: usize,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub addition_embed_type: Option<AdditionEmbed>,
    #[serde(default)]
    pub projection_class_embeddings_input_dim: Option<usize>,
    pub sample_size: usize,
}

/// diffusers' `vae/config.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VaeConfig {
    #[serde(default = "three")]
    pub in_channels: usize,
    #[serde(default = "three")]
    pub out_channels: usize,
    #[serde(default = "four")]
    pub latent_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    #[serde(default = "groups")]
    pub norm_num_groups: usize,
    /// diffusers' default is true; only the SDXL pipeline acts on it (decodes in f32).
    #[serde(default = "yes")]
    pub force_upcast: bool,
    #[serde(default = "sd_scale")]
    pub scaling_factor: f64,
    pub sample_size: usize,
}

impl VaeConfig {
    /// Output pixels per latent pixel along one side: 2^(blocks − 1).
    pub fn scale(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipAct {
    QuickGelu,
    Gelu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
pub enum ClipArch {
    CLIPTextModel,
    CLIPTextModelWithProjection,
}

/// transformers' `text_encoder/config.json` (CLIPTextConfig).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClipConfig {
    pub architectures: Vec<ClipArch>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub max_position_embeddings: usize,
    pub hidden_act: ClipAct,
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    pub projection_dim: usize,
}

impl ClipConfig {
    pub fn with_projection(&self) -> bool {
        self.architectures
            .contains(&ClipArch::CLIPTextModelWithProjection)
    }
}

/// A whole pipeline's configs.
#[derive(Clone, Debug, PartialEq)]
pub struct SdConfig {
    /// `sd15`, `sd21`, `sdxl` (a preset), or the directory's name.
    pub name: String,
    pub unet: UNetConfig,
    pub vae: VaeConfig,
    pub text_encoder: ClipConfig,
    pub text_encoder_2: Option<ClipConfig>,
}

fn clip(
    arch: ClipArch,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    act: ClipAct,
    proj: usize,
) -> ClipConfig {
    ClipConfig {
        architectures: vec![arch],
        vocab_size: 49408,
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        max_position_embeddings: 77,
        hidden_act: act,
        layer_norm_eps: 1e-5,
        projection_dim: proj,
    }
}

/// OpenAI's CLIP ViT-L/14 text encoder (openai/clip-vit-large-patch14): SD 1.5's, SDXL's first
/// and FLUX.1's `text_encoder/`.
pub fn clip_l() -> ClipConfig {
    clip(
        ClipArch::CLIPTextModel,
        768,
        3072,
        12,
        12,
        ClipAct::QuickGelu,
        768,
    )
}

/// The SD VAE (the same shapes in SD 1.5, 2.1 and SDXL; SDXL's differs in scale and upcast).
fn sd_vae(sample_size: usize, force_upcast: bool, scaling_factor: f64) -> VaeConfig {
    VaeConfig {
        in_channels: 3,
        out_channels: 3,
        latent_channels: 4,
        block_out_channels: vec![128, 256, 512, 512],
        layers_per_block: 2,
        norm_num_groups: 32,
        force_upcast,
        scaling_factor,
        sample_size,
    }
}

impl SdConfig {
    /// The published configs of the real checkpoints (diffusers layout):
    /// runwayml/stable-diffusion-v1-5, stabilityai/stable-diffusion-2-1,
    /// stabilityai/stable-diffusion-xl-base-1.0.
    pub fn preset(m: GenModel) -> SdConfig {
        use DownBlock::*;
        use UpBlock::*;
        let sd_unet = |cross: usize, heads: PerBlock, linear: bool, sample: usize| UNetConfig {
            in_channels: 4,
            out_channels: 4,
            block_out_channels: vec![320, 640, 1280, 1280],
            layers_per_block: 2,
            down_block_types: vec![
                CrossAttnDownBlock2D,
                CrossAttnDownBlock2D,
                CrossAttnDownBlock2D,
                DownBlock2D,
            ],
            up_block_types: vec![
                UpBlock2D,
                CrossAttnUpBlock2D,
                CrossAttnUpBlock2D,
                CrossAttnUpBlock2D,
            ],
            cross_attention_dim: cross,
            attention_head_dim: heads,
            transformer_layers_per_block: PerBlock::One(1),
            use_linear_projection: linear,
            norm_num_groups: 32,
            norm_eps: 1e-5,
            addition_embed_type: None,
            projection_class_embeddings_input_dim: None,
            sample_size: sample,
        };
        let clip_l = clip_l();
        match m {
            GenModel::Sd15 => SdConfig {
                name: m.as_str().into(),
                unet: sd_unet(768, PerBlock::One(8), false, 64),
                vae: sd_vae(512, true, 0.18215),
                text_encoder: clip_l,
                text_encoder_2: None,
            },
            GenModel::Sd21 => SdConfig {
                name: m.as_str().into(),
                unet: sd_unet(1024, PerBlock::Many(vec![5, 10, 20, 20]), true, 96),
                vae: sd_vae(768, true, 0.18215),
                text_encoder: clip(
                    ClipArch::CLIPTextModel,
                    1024,
                    4096,
                    23,
                    16,
                    ClipAct::Gelu,
                    512,
                ),
                text_encoder_2: None,
            },
            GenModel::Wan21T2v13b => panic!("SdConfig::preset: {m} is not Stable Diffusion"),
            GenModel::Sdxl => SdConfig {
                name: m.as_str().into(),
                unet: UNetConfig {
                    in_channels: 4,
                    out_channels: 4,
                    block_out_channels: vec![320, 640, 1280],
                    layers_per_block: 2,
                    down_block_types: vec![DownBlock2D, CrossAttnDownBlock2D, CrossAttnDownBlock2D],
                    up_block_types: vec![CrossAttnUpBlock2D, CrossAttnUpBlock2D, UpBlock2D],
                    cross_attention_dim: 2048,
                    attention_head_dim: PerBlock::Many(vec![5, 10, 20]),
                    transformer_layers_per_block: PerBlock::Many(vec![1, 2, 10]),
                    use_linear_projection: true,
                    norm_num_groups: 32,
                    norm_eps: 1e-5,
                    addition_embed_type: Some(AdditionEmbed::TextTime),
                    projection_class_embeddings_input_dim: Some(2816),
                    sample_size: 128,
                },
                vae: sd_vae(1024, true, 0.13025),
                text_encoder: clip_l,
                text_encoder_2: Some(clip(
                    ClipArch::CLIPTextModelWithProjection,
                    1280,
                    5120,
                    32,
                    20,
                    ClipAct::Gelu,
                    1280,
                )),
            },
            other => panic!("`{other}` is not a Stable Diffusion model"),
        }
    }

    /// Reads a diffusers directory: `unet/`, `vae/`, `text_encoder/` (and `text_encoder_2/`)
    /// `config.json`. Errors name the file and the key.
    pub fn from_dir(dir: &Path) -> Result<SdConfig> {
        use super::pipeline::read_json as read;
        let te2 = dir.join("text_encoder_2/config.json");
        Ok(SdConfig {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "diffusers".into()),
            unet: read(&dir.join("unet/config.json"))?,
            vae: read(&dir.join("vae/config.json"))?,
            text_encoder: read(&dir.join("text_encoder/config.json"))?,
            text_encoder_2: if te2.exists() {
                Some(read(&te2)?)
            } else {
                None
            },
        })
    }

    /// Writes the `config.json` files of a diffusers directory and its `model_index.json`.
    pub fn write_configs(&self, dir: &Path) -> Result<()> {
        for c in self.components() {
            match c {
                Component::Unet => write_config(dir, c, &self.unet)?,
                Component::Vae => write_config(dir, c, &self.vae)?,
                Component::TextEncoder => write_config(dir, c, &self.text_encoder)?,
                Component::TextEncoder2 => write_config(dir, c, &self.text_encoder_2)?,
                other => anyhow::bail!("Stable Diffusion has no `{other}`"),
            }
        }
        let class = if self.text_encoder_2.is_some() {
            "StableDiffusionXLPipeline"
        } else {
            "StableDiffusionPipeline"
        };
        super::pipeline::write_model_index(dir, class)
    }

    /// The pipeline's components, in load order.
    pub fn components(&self) -> Vec<Component> {
        let mut v = vec![Component::TextEncoder];
        if self.text_encoder_2.is_some() {
            v.push(Component::TextEncoder2);
        }
        v.extend([Component::Unet, Component::Vae]);
        v
    }

    /// Whether this pipeline runs classifier-free guidance (every SD pipeline does).
    pub fn has_cfg(&self) -> bool {
        true
    }

    /// The VAE's dtype by default: what the real pipeline does. diffusers' SDXL pipeline
    /// decodes in f32 when the VAE config sets `force_upcast`; SD 1.5/2.1's pipelines decode in
    /// the pipeline's dtype.
    pub fn default_vae_dtype(&self, pipeline: DType) -> DType {
        if self.text_encoder_2.is_some() && self.vae.force_upcast {
            DType::F32
        } else {
            pipeline
        }
    }

    /// Text tokens per prompt.
    pub fn text_len(&self) -> usize {
        self.text_encoder.max_position_embeddings
    }

    /// The context width the UNet's cross-attention reads (both encoders' hidden sizes for
    /// SDXL).
    pub fn context_dim(&self) -> usize {
        self.text_encoder.hidden_size
            + self
                .text_encoder_2
                .as_ref()
                .map(|c| c.hidden_size)
                .unwrap_or(0)
    }

    /// Stored tensors of a component, with their diffusers names and shapes, in load order.
    pub fn shapes(&self, c: Component) -> Vec<(String, Vec<usize>)> {
        match c {
            Component::Unet => unet_shapes(&self.unet),
            Component::Vae => record(|vb| {
                build_vae(&self.vae, true, true, vb)?;
                Ok(())
            }),
            Component::TextEncoder => record(|vb| {
                ClipText::new(&self.text_encoder, vb)?;
                Ok(())
            }),
            Component::TextEncoder2 => match &self.text_encoder_2 {
                Some(cfg) => record(|vb| {
                    ClipText::new(cfg, vb)?;
                    Ok(())
                }),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Parameters of a component, from the stored shapes.
    pub fn params(&self, c: Component) -> u64 {
        super::pipeline::count(&self.shapes(c))
    }
}

/// The UNet's stored tensors: candle's UNet, plus SDXL's `add_embedding` that it lacks.
fn unet_shapes(c: &UNetConfig) -> Vec<(String, Vec<usize>)> {
    let mut v = record(|vb| {
        build_unet(c, vb, None)?;
        Ok(())
    });
    if let (Some(AdditionEmbed::TextTime), Some(input)) = (
        c.addition_embed_type,
        c.projection_class_embeddings_input_dim,
    ) {
        let t = 4 * c.block_out_channels[0];
        v.push(("add_embedding.linear_1.weight".into(), vec![t, input]));
        v.push(("add_embedding.linear_1.bias".into(), vec![t]));
        v.push(("add_embedding.linear_2.weight".into(), vec![t, t]));
        v.push(("add_embedding.linear_2.bias".into(), vec![t]));
    }
    v
}

/// candle's UNet config of a diffusers one. `sliced`: candle's sliced attention size.
fn unet_candle_config(
    c: &UNetConfig,
    sliced: Option<usize>,
) -> unet_2d::UNet2DConditionModelConfig {
    let blocks = c
        .block_out_channels
        .iter()
        .enumerate()
        .map(|(i, &out_channels)| unet_2d::BlockConfig {
            out_channels,
            use_cross_attn: (c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D)
                .then(|| c.transformer_layers_per_block.at(i)),
            attention_head_dim: c.attention_head_dim.at(i),
        })
        .collect();
    unet_2d::UNet2DConditionModelConfig {
        center_input_sample: false,
        flip_sin_to_cos: true,
        freq_shift: 0.,
        blocks,
        layers_per_block: c.layers_per_block,
        downsample_padding: 1,
        mid_block_scale_factor: 1.,
        norm_num_groups: c.norm_num_groups,
        norm_eps: c.norm_eps,
        cross_attention_dim: c.cross_attention_dim,
        sliced_attention_size: sliced,
        use_linear_projection: c.use_linear_projection,
    }
}

/// candle-transformers' UNet over `vb` (generation's; the trainable [`super::sd_unet`] is checked
/// against it). `sliced`: candle's sliced attention size.
pub fn build_unet(
    c: &UNetConfig,
    vb: VarBuilder,
    sliced: Option<usize>,
) -> candle_core::Result<unet_2d::UNet2DConditionModel> {
    unet_2d::UNet2DConditionModel::new(
        vb,
        c.in_channels,
        c.out_channels,
        false,
        unet_candle_config(c, sliced),
    )
}

/// candle's AutoencoderKL (diffusers' tensor names), with or without the 1×1 `quant_conv` and
/// `post_quant_conv` (SD has both; FLUX's VAE neither).
pub fn build_vae(
    c: &VaeConfig,
    quant_conv: bool,
    post_quant_conv: bool,
    vb: VarBuilder,
) -> candle_core::Result<vae::AutoEncoderKL> {
    let cfg = vae::AutoEncoderKLConfig {
        block_out_channels: c.block_out_channels.clone(),
        layers_per_block: c.layers_per_block,
        latent_channels: c.latent_channels,
        norm_num_groups: c.norm_num_groups,
        use_quant_conv: quant_conv,
        use_post_quant_conv: post_quant_conv,
    };
    vae::AutoEncoderKL::new(vb, c.in_channels, c.out_channels, cfg)
}

/// Parameters of a component counted from its config alone, following diffusers' module
/// structure (independent of the module construction [`SdConfig::shapes`] records).
pub fn params_analytic(cfg: &SdConfig, c: Component) -> u64 {
    match c {
        Component::Unet => unet_params(&cfg.unet),
        Component::Vae => vae_params(&cfg.vae, true, true),
        Component::TextEncoder => clip_params(&cfg.text_encoder),
        Component::TextEncoder2 => cfg.text_encoder_2.as_ref().map_or(0, clip_params),
        _ => 0,
    }
}

/// Parameters of a `k`×`k` convolution with bias.
pub fn conv(i: u64, o: u64, k: u64) -> u64 {
    i * o * k * k + o
}
/// Parameters of a linear layer with bias.
pub fn lin(i: u64, o: u64) -> u64 {
    i * o + o
}
/// A ResNet block (GroupNorm, conv3×3, [time projection], GroupNorm, conv3×3, [1×1 shortcut]).
fn resnet(i: u64, o: u64, temb: Option<u64>) -> u64 {
    2 * i
        + conv(i, o, 3)
        + temb.map_or(0, |t| lin(t, o))
        + 2 * o
        + conv(o, o, 3)
        + if i != o { conv(i, o, 1) } else { 0 }
}
/// A Transformer2DModel: GroupNorm, proj_in, `layers` × (self-attention, cross-attention,
/// GEGLU feed-forward, three LayerNorms), proj_out (1×1 conv or linear: the same count).
fn transformer(ch: u64, layers: u64, cross: u64) -> u64 {
    let block = 3 * 2 * ch
        + 3 * ch * ch
        + lin(ch, ch)
        + ch * ch
        + 2 * cross * ch
        + lin(ch, ch)
        + lin(ch, 8 * ch)
        + lin(4 * ch, ch);
    2 * ch + lin(ch, ch) + layers * block + lin(ch, ch)
}

fn unet_params(c: &UNetConfig) -> u64 {
    let ch: Vec<u64> = c.block_out_channels.iter().map(|&x| x as u64).collect();
    let n = ch.len();
    let l = c.layers_per_block as u64;
    let t = 4 * ch[0];
    let x = c.cross_attention_dim as u64;
    let mut p = conv(c.in_channels as u64, ch[0], 3) + lin(ch[0], t) + lin(t, t);
    if let (Some(AdditionEmbed::TextTime), Some(input)) = (
        c.addition_embed_type,
        c.projection_class_embeddings_input_dim,
    ) {
        p += lin(input as u64, t) + lin(t, t);
    }
    for i in 0..n {
        let cross = c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D;
        let tl = c.transformer_layers_per_block.at(i) as u64;
        let mut inp = if i == 0 { ch[0] } else { ch[i - 1] };
        for _ in 0..l {
            p += resnet(inp, ch[i], Some(t));
            if cross {
                p += transformer(ch[i], tl, x);
            }
            inp = ch[i];
        }
        if i + 1 < n {
            p += conv(ch[i], ch[i], 3);
        }
    }
    let last = ch[n - 1];
    let mid_layers = c.transformer_layers_per_block.at(n - 1) as u64;
    p += 2 * resnet(last, last, Some(t)) + transformer(last, mid_layers, x);
    let mut prev = last;
    for (u, kind) in c.up_block_types.iter().enumerate() {
        let r = n - 1 - u;
        let out = ch[r];
        let inp = if r == 0 { ch[0] } else { ch[r - 1] };
        let tl = c.transformer_layers_per_block.at(r) as u64;
        for j in 0..=l {
            let skip = if j == l { inp } else { out };
            let res_in = if j == 0 { prev } else { out };
            p += resnet(res_in + skip, out, Some(t));
            if *kind == UpBlock::CrossAttnUpBlock2D {
                p += transformer(out, tl, x);
            }
        }
        if u + 1 < n {
            p += conv(out, out, 3);
        }
        prev = out;
    }
    p + 2 * ch[0] + conv(ch[0], c.out_channels as u64, 3)
}

/// An AutoencoderKL's parameters from its config (with or without the 1×1 quant convs).
pub fn vae_params(c: &VaeConfig, quant_conv: bool, post_quant_conv: bool) -> u64 {
    let ch: Vec<u64> = c.block_out_channels.iter().map(|&x| x as u64).collect();
    let n = ch.len();
    let l = c.layers_per_block as u64;
    let lat = c.latent_channels as u64;
    let last = ch[n - 1];
    // The mid block: two ResNets around one single-head self-attention (GroupNorm, q, k, v, out).
    let mid = 2 * resnet(last, last, None) + 2 * last + 4 * lin(last, last);
    let mut enc = conv(c.in_channels as u64, ch[0], 3);
    let mut inp = ch[0];
    for (i, &c) in ch.iter().enumerate() {
        for _ in 0..l {
            enc += resnet(inp, c, None);
            inp = c;
        }
        if i + 1 < n {
            enc += conv(c, c, 3);
        }
    }
    enc += mid + 2 * last + conv(last, 2 * lat, 3);
    let quant = if quant_conv {
        conv(2 * lat, 2 * lat, 1)
    } else {
        0
    } + if post_quant_conv {
        conv(lat, lat, 1)
    } else {
        0
    };
    let mut dec = conv(lat, last, 3) + mid;
    let mut prev = last;
    for u in 0..n {
        let out = ch[n - 1 - u];
        for _ in 0..=l {
            dec += resnet(prev, out, None);
            prev = out;
        }
        if u + 1 < n {
            dec += conv(out, out, 3);
        }
    }
    dec += 2 * ch[0] + conv(ch[0], c.out_channels as u64, 3);
    enc + quant + dec
}

/// A CLIP text transformer's parameters from its config.
pub fn clip_params(c: &ClipConfig) -> u64 {
    let h = c.hidden_size as u64;
    let i = c.intermediate_size as u64;
    let layer = 4 * lin(h, h) + 2 * 2 * h + lin(h, i) + lin(i, h);
    let proj = if c.with_projection() {
        h * c.projection_dim as u64
    } else {
        0
    };
    (c.vocab_size + c.max_position_embeddings) as u64 * h
        + c.num_hidden_layers as u64 * layer
        + 2 * h
        + proj
}

/// A CLIP text transformer (transformers' `CLIPTextModel[WithProjection]`), built from candle
/// ops: embeddings, pre-norm causal self-attention layers, final LayerNorm. Returns the last
/// hidden state (b, s, hidden), what the UNet's cross-attention reads.
pub struct ClipText {
    token: candle_nn::Embedding,
    position: candle_nn::Embedding,
    layers: Vec<ClipLayer>,
    final_norm: candle_nn::LayerNorm,
    heads: usize,
    act: ClipAct,
}

struct ClipLayer {
    q: candle_nn::Linear,
    k: candle_nn::Linear,
    v: candle_nn::Linear,
    out: candle_nn::Linear,
    norm1: candle_nn::LayerNorm,
    norm2: candle_nn::LayerNorm,
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl ClipText {
    pub fn new(c: &ClipConfig, vb: VarBuilder) -> candle_core::Result<ClipText> {
        let h = c.hidden_size;
        let m = vb.pp("text_model");
        let e = m.pp("embeddings");
        let token = candle_nn::embedding(c.vocab_size, h, e.pp("token_embedding"))?;
        let position =
            candle_nn::embedding(c.max_position_embeddings, h, e.pp("position_embedding"))?;
        let ln = |vb: VarBuilder| candle_nn::layer_norm(h, c.layer_norm_eps, vb);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = m.pp(format!("encoder.layers.{i}"));
                let a = l.pp("self_attn");
                Ok(ClipLayer {
                    q: candle_nn::linear(h, h, a.pp("q_proj"))?,
                    k: candle_nn::linear(h, h, a.pp("k_proj"))?,
                    v: candle_nn::linear(h, h, a.pp("v_proj"))?,
                    out: candle_nn::linear(h, h, a.pp("out_proj"))?,
                    norm1: ln(l.pp("layer_norm1"))?,
                    norm2: ln(l.pp("layer_norm2"))?,
                    fc1: candle_nn::linear(h, c.intermediate_size, l.pp("mlp.fc1"))?,
                    fc2: candle_nn::linear(c.intermediate_size, h, l.pp("mlp.fc2"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let final_norm = ln(m.pp("final_layer_norm"))?;
        if c.with_projection() {
            // Stored (and loaded, as diffusers does); the pooled projection is not computed.
            vb.get((c.projection_dim, h), "text_projection.weight")?;
        }
        Ok(ClipText {
            token,
            position,
            layers,
            final_norm,
            heads: c.num_attention_heads,
            act: c.hidden_act,
        })
    }

    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let dev = ids.device();
        let pos = Tensor::arange(0u32, s as u32, dev)?;
        let mut x = self
            .token
            .forward(ids)?
            .broadcast_add(&self.position.forward(&pos)?)?;
        let mask: Vec<f32> = (0..s)
            .flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0. }))
            .collect();
        let mask = Tensor::from_vec(mask, (s, s), dev)?.to_dtype(x.dtype())?;
        let hd = x.dim(D::Minus1)? / self.heads;
        for l in &self.layers {
            let r = x.clone();
            let y = l.norm1.forward(&x)?;
            let split = |t: Tensor| {
                t.reshape((b, s, self.heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = (split(l.q.forward(&y)?)? * (hd as f64).powf(-0.5))?;
            let k = split(l.k.forward(&y)?)?;
            let v = split(l.v.forward(&y)?)?;
            let w = q.matmul(&k.t()?)?.broadcast_add(&mask)?;
            let w = candle_nn::ops::softmax_last_dim(&w)?;
            let y = w
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((b, s, self.heads * hd))?;
            x = (l.out.forward(&y)? + r)?;
            let r = x.clone();
            let y = l.fc1.forward(&l.norm2.forward(&x)?)?;
            let y = match self.act {
                ClipAct::QuickGelu => (&y * candle_nn::ops::sigmoid(&(&y * 1.702)?)?)?,
                ClipAct::Gelu => y.gelu()?,
            };
            x = (l.fc2.forward(&y)? + r)?;
        }
        self.final_norm.forward(&x)
    }
}

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

/// candle's sliced attention size for the UNet: `sliced` slices the heads by half a block's
/// head count (candle's automatic setting, `Some(0)`); `eager` attends all heads at once.
pub fn sliced_size(a: Attention) -> Result<Option<usize>> {
    match a {
        Attention::Eager => Ok(None),
        Attention::Sliced => Ok(Some(0)),
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
        let vb = super::pipeline::var_builder(dir, c, self.dtype(c), dev)?;
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

/// Token ids of `n` prompts of a CLIP text encoder's full length (BOS, then ids in range).
pub fn clip_ids(c: &ClipConfig, n: usize, dev: &Device) -> Result<Tensor> {
    let (s, v) = (c.max_position_embeddings, c.vocab_size as u32);
    let ids: Vec<u32> = (0..n * s).map(|i| (i as u32 * 7 + 1) % v).collect();
    Ok(Tensor::from_vec(ids, (n, s), dev)?)
}
