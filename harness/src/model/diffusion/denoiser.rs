//! The denoisers that LoRA fine-tuning trains (`workload/finetune.rs`): which one a source
//! has ([`config_of`]: Wan2.1's DiT or SD 1.x/2.x's UNet; any other is refused with
//! [`NO_LORA_REASON`]), its stored tensors and config, and the loaded network.
use super::sd::{SdConfig, SdUnet};
use super::wan::{self, WanConfig, WanDit, WanTransformerConfig};
use super::{
    count, pipeline_class, read_json, record, write_config, GenSource, PipelineClass, Shapes,
};
use crate::error::bad_file;
use crate::model::nn::Linear;
use crate::vocab::{Attention, Component, GenModel, Resolution};
use anyhow::Result;
use std::path::Path;

/// Why a denoiser other than Wan's and SD 1.x/2.x's cannot be fine-tuned (the scenario's error
/// line).
pub const NO_LORA_REASON: &str = "its denoiser has no trainable module here (FLUX's transformer is candle-transformers' own, without a LoRA injection point; SDXL's UNet lacks its add_embedding); mode = \"train\" runs Wan2.1 (`synthetic:wan2.1-t2v-1.3b` or a WanPipeline diffusers directory) and SD 1.5/2.1 (`synthetic:sd15`, `synthetic:sd21` or a StableDiffusionPipeline diffusers directory)";

/// The trainable denoiser of a fine-tuning source and its config.
#[derive(Clone, Debug)]
pub enum FtModel {
    /// Wan2.1's transformer.
    Wan(WanTransformerConfig),
    /// Stable Diffusion 1.x/2.x's UNet (the pipeline's configs: the UNet's and the text
    /// encoder's length).
    Sd(Box<SdConfig>),
}

impl FtModel {
    /// The component the denoiser is stored as.
    pub fn component(&self) -> Component {
        match self {
            FtModel::Wan(_) => Component::Transformer,
            FtModel::Sd(_) => Component::Unet,
        }
    }

    pub fn architecture(&self) -> &'static str {
        match self {
            FtModel::Wan(_) => "wan",
            FtModel::Sd(_) => "stable-diffusion",
        }
    }

    /// Tokens of the cached text embeddings.
    pub fn text_len(&self) -> usize {
        match self {
            FtModel::Wan(_) => wan::TEXT_LEN,
            FtModel::Sd(c) => c.text_len(),
        }
    }

    /// The denoiser's stored tensors (diffusers names and shapes).
    pub fn shapes(&self) -> Shapes {
        match self {
            FtModel::Wan(c) => shapes(c),
            FtModel::Sd(c) => record(|vb| SdUnet::new(&c.unet, vb, Attention::Eager).map(|_| ())),
        }
    }

    pub fn params(&self) -> u64 {
        match self {
            FtModel::Wan(c) => wan::transformer_params(c),
            FtModel::Sd(_) => count(&self.shapes()),
        }
    }

    pub fn write_config(&self, dir: &Path) -> Result<()> {
        match self {
            FtModel::Wan(c) => write_config(dir, self.component(), c),
            FtModel::Sd(c) => write_config(dir, self.component(), &c.unet),
        }
    }

    /// The denoiser over `vb`'s tensors.
    pub fn load(&self, vb: candle_nn::VarBuilder, attention: Attention) -> Result<Net> {
        Ok(match self {
            FtModel::Wan(c) => Net::Wan(WanDit::new(c, vb, attention)?),
            FtModel::Sd(c) => Net::Sd(SdUnet::new(&c.unet, vb, attention)?),
        })
    }

    /// The cached latents' shape and the text embeddings' of a point of batch `b`, resolution
    /// `r` and (Wan) `frames`.
    pub fn input_shapes(
        &self,
        b: usize,
        r: Resolution,
        frames: Option<usize>,
    ) -> (Vec<usize>, (usize, usize, usize)) {
        match self {
            FtModel::Wan(c) => (
                vec![
                    b,
                    c.in_channels,
                    (frames.unwrap_or(1) - 1) / 4 + 1,
                    r.height / 8,
                    r.width / 8,
                ],
                (b, wan::TEXT_LEN, c.text_dim),
            ),
            FtModel::Sd(c) => {
                let s = c.vae.scale();
                (
                    vec![b, c.unet.in_channels, r.height / s, r.width / s],
                    (b, c.text_len(), c.unet.cross_attention_dim),
                )
            }
        }
    }
}

/// A loaded denoiser.
pub enum Net {
    Wan(WanDit),
    Sd(SdUnet),
}

impl Net {
    /// The LoRA targets with their module names.
    pub fn lora_targets_mut(&mut self) -> Vec<(String, &mut Linear)> {
        match self {
            Net::Wan(d) => d.linears_mut(),
            Net::Sd(u) => u.attention_linears_mut(),
        }
    }
}

/// A denoiser being trained, borrowed.
#[derive(Clone, Copy)]
pub enum Denoiser<'a> {
    Wan(&'a WanDit),
    Sd(&'a SdUnet),
}

impl<'a> From<&'a WanDit> for Denoiser<'a> {
    fn from(d: &'a WanDit) -> Self {
        Denoiser::Wan(d)
    }
}

impl<'a> From<&'a SdUnet> for Denoiser<'a> {
    fn from(u: &'a SdUnet) -> Self {
        Denoiser::Sd(u)
    }
}

impl<'a> From<&'a Net> for Denoiser<'a> {
    fn from(n: &'a Net) -> Self {
        match n {
            Net::Wan(d) => Denoiser::Wan(d),
            Net::Sd(u) => Denoiser::Sd(u),
        }
    }
}

/// The denoiser of a fine-tuning source: Wan2.1 (the published 1.3B for `synthetic:`, a
/// WanPipeline directory's `transformer/config.json`) or SD 1.5/2.1 (the preset for
/// `synthetic:`, a StableDiffusionPipeline directory's configs); any other pipeline is refused
/// ([`NO_LORA_REASON`]).
pub fn config_of(src: &GenSource) -> Result<FtModel> {
    match src {
        GenSource::Synthetic(GenModel::Wan21T2v13b) => {
            Ok(FtModel::Wan(WanConfig::t2v_1_3b().transformer))
        }
        GenSource::Synthetic(m @ (GenModel::Sd15 | GenModel::Sd21)) => {
            Ok(FtModel::Sd(Box::new(SdConfig::preset(*m))))
        }
        GenSource::Synthetic(m) => Err(crate::error::InputError::arg(format!(
            "mode = \"train\" on `{m}`: {NO_LORA_REASON}"
        ))
        .into()),
        GenSource::Diffusers(dir) => match pipeline_class(dir)? {
            PipelineClass::WanPipeline => Ok(FtModel::Wan(read_json(
                &dir.join("transformer/config.json"),
            )?)),
            PipelineClass::StableDiffusionPipeline => {
                Ok(FtModel::Sd(Box::new(SdConfig::from_dir(dir)?)))
            }
            class => Err(bad_file(
                dir.join("model_index.json"),
                format!("`_class_name` `{class:?}`: mode = \"train\": {NO_LORA_REASON}"),
            )),
        },
    }
}

/// The Wan transformer's stored tensors (diffusers names and shapes).
pub fn shapes(c: &WanTransformerConfig) -> Shapes {
    record(|vb| WanDit::new(c, vb, Attention::Eager).map(|_| ()))
}
