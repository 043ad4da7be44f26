//! Where a generation model comes from ([`GenSource`]): a preset's published configs with
//! synthetic weights, or a diffusers directory. Shared by the generation and fine-tuning point
//! expansion (`scenario/gen_points.rs`, `scenario/ft_points.rs`), the sweep and the workloads.
use super::{from_dir, pipeline_class, preset, write_synthetic, Pipeline};
use crate::vocab::{Component, GenModel};
use anyhow::Result;
use candle_core::DType;
use std::path::PathBuf;

/// Where a generation model comes from: `synthetic:sd15|sd21|sdxl` (the published configs,
/// random weights written once as a diffusers directory) or `diffusers:DIR`.
#[derive(Clone, Debug, PartialEq)]
pub enum GenSource {
    Synthetic(GenModel),
    Diffusers(PathBuf),
}

impl GenSource {
    pub fn parse(s: &str) -> std::result::Result<GenSource, String> {
        let known = || {
            use strum::IntoEnumIterator;
            GenModel::iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match s.split_once(':') {
            Some(("synthetic", m)) => m.parse().map(GenSource::Synthetic).map_err(|_| {
                format!(
                    "unknown generation model `{m}` in `{s}` (known: {})",
                    known()
                )
            }),
            Some(("diffusers", d)) => Ok(GenSource::Diffusers(PathBuf::from(
                crate::model::source::expand_env(d)?,
            ))),
            _ => Err(format!(
                "generation source `{s}` must be `synthetic:MODEL` ({}) or `diffusers:DIR`",
                known()
            )),
        }
    }

    /// Whether the model's pipeline runs classifier-free guidance when a scenario does not
    /// say: all but the guidance-distilled FLUX. A directory that cannot be read says yes (its
    /// load fails with the reason).
    pub fn default_cfg(&self) -> bool {
        match self {
            GenSource::Synthetic(m) => !matches!(m, GenModel::FluxDev | GenModel::FluxSchnell),
            GenSource::Diffusers(dir) => pipeline_class(dir).map_or(true, |c| c.has_cfg()),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            GenSource::Synthetic(_) => "synthetic",
            GenSource::Diffusers(_) => "safetensors",
        }
    }

    /// The pipeline (unloaded), components in `dtype`, the VAE in `vae_dtype` (None: the
    /// real pipeline's choice).
    pub fn pipeline(&self, dtype: DType, vae_dtype: Option<DType>) -> Result<Box<dyn Pipeline>> {
        match self {
            GenSource::Synthetic(m) => preset(*m, dtype, vae_dtype),
            GenSource::Diffusers(dir) => from_dir(dir, dtype, vae_dtype),
        }
    }

    /// The diffusers directory to load `p` from; synthetic weights are written (once, under
    /// `$VRAMLAB_MODELS/synthetic-gen/`, in `p`'s dtypes) first.
    pub fn prepare(&self, p: &dyn Pipeline) -> Result<PathBuf> {
        match self {
            GenSource::Diffusers(dir) => Ok(dir.clone()),
            GenSource::Synthetic(_) => {
                let dir = self.synthetic_dir(p)?;
                write_synthetic(p, &dir)?;
                Ok(dir)
            }
        }
    }

    /// Where a `synthetic:MODEL` source's directory is, for `p`'s dtypes:
    /// `$VRAMLAB_MODELS/synthetic-gen/MODEL-DTYPE-vae-DTYPE` (a diffusers source: its own).
    pub fn synthetic_dir(&self, p: &dyn Pipeline) -> Result<PathBuf> {
        match self {
            GenSource::Diffusers(dir) => Ok(dir.clone()),
            GenSource::Synthetic(m) => {
                let root = PathBuf::from(
                    crate::model::source::expand_env("${VRAMLAB_MODELS}")
                        .map_err(crate::error::InputError::arg)?,
                );
                Ok(root.join("synthetic-gen").join(format!(
                    "{}-{}-vae-{}",
                    m.as_str(),
                    p.dtype(p.denoiser()).as_str(),
                    p.dtype(Component::Vae).as_str()
                )))
            }
        }
    }
}
