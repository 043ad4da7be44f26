//! The Stable Diffusion family's configs: diffusers' `unet/` and `vae/` `config.json`s, the
//! whole pipeline's [`SdConfig`] with its presets, and the tensor shapes each component stores.
use super::clip::{clip, clip_l, eps, ClipAct, ClipArch, ClipConfig};
use crate::model::diffusion::write_config;
use crate::vocab::{Component, GenModel};
use anyhow::Result;
use candle_core::DType;
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

fn one_per_block() -> PerBlock {
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
    #[serde(default = "one_per_block")]
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
        use crate::model::diffusion::read_json as read;
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
        crate::model::diffusion::write_model_index(dir, class)
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
}
