//! Generation rows of a peers file: a diffusion pipeline's published peak (SDXL's,
//! say), read once into a [`GenQuery`] of the torch profile (diffusers on CUDA: SDPA unless
//! the row sets the default attention processor, the VAE in f32 where the pipeline upcasts it)
//! and estimated by [`crate::estimate::generate`]: the peak phase's exact tensors, its
//! activations and the device rows, summed over what the row's metric includes. The
//! activation coefficients are `--constants`' generation groups, else the torch runtime's
//! built-in reference constants (diffusers measured on the CPU, transferred to CUDA), else,
//! for an architecture they do not cover, the analytic priors.
//!
//! The row's typed fields give the preset, the precision, the images per prompt (`batch`),
//! the output size (`resolution`; absent, the pipeline's default size: the UNet's
//! `sample_size` × the VAE's factor, what diffusers generates), `guidance_scale` (CFG above 1;
//! absent, the pipeline's default, which guides), the setup calls (VAE slicing or tiling are
//! modelled; offloading, another VAE, compiled kernels and dropped encoders are not expressible,
//! with the reason) and the attention (`eager`: the default attention processor).
use super::{precision, PeerRow, Setup};
use crate::estimate::generate::{self as gen, GenArch, GenQuery};
use crate::estimate::Runtime;
use crate::fit::Constants;
use crate::model::diffusion::flux::FluxConfig;
use crate::model::diffusion::sd::SdConfig;
use crate::vocab::{Attention, Backend, GenModel, Precision, Resolution, VaeDecode};
use candle_core::DType;

/// What a row leaves to the pipeline: the output side diffusers generates by default, the
/// VAE's tile (`sample_size`), whether it guides, and the VAE's dtype at `dtype`.
struct Defaults {
    side: usize,
    tile: usize,
    cfg: bool,
    vae_dtype: DType,
}

fn defaults(m: GenModel, dtype: DType) -> Defaults {
    match m {
        GenModel::Sd15 | GenModel::Sd21 | GenModel::Sdxl => {
            let c = SdConfig::preset(m);
            Defaults {
                side: c.unet.sample_size * c.vae.scale(),
                tile: c.vae.sample_size,
                cfg: c.has_cfg(),
                vae_dtype: c.default_vae_dtype(dtype),
            }
        }
        // FluxPipeline: `default_sample_size` 128 latent pixels × the VAE's 8 (the VAE's
        // `sample_size`, 1024); guidance-distilled (no CFG batch); decodes in its own dtype.
        GenModel::FluxDev | GenModel::FluxSchnell => {
            let c = FluxConfig::preset(m);
            Defaults {
                side: c.vae.base.sample_size,
                tile: c.vae.base.sample_size,
                cfg: false,
                vae_dtype: dtype,
            }
        }
        // WanPipeline: height 480 (width 832: not a square, so a Wan row gives its
        // `resolution`); AutoencoderKLWan tiles of 256; CFG (guidance 5); the VAE loaded in f32.
        GenModel::Wan21T2v13b => Defaults {
            side: 480,
            tile: 256,
            cfg: true,
            vae_dtype: DType::F32,
        },
    }
}

/// The estimate's rows for a generation row on `m`, or why it cannot be expressed.
pub fn estimate_row(r: &PeerRow, m: GenModel, constants: Option<&Constants>) -> super::RowEstimate {
    let fail = |why: String| (m.to_string(), why);
    let (arch, q) = query(r, m).map_err(fail)?;
    // Without generation constants: the torch runtime's built-in reference (diffusers measured
    // on the CPU by the torch probe), transferred to CUDA.
    let reference = gen::reference(Runtime::Torch).1;
    let groups = constants
        .map(|c| c.generation.as_slice())
        .filter(|g| !g.is_empty())
        .unwrap_or(&reference.generation);
    let e = gen::estimate(&arch, &q, Some(groups)).map_err(|o| fail(o.to_string()))?;
    Ok((m.to_string(), e.breakdown))
}

/// The row's query on the torch profile.
fn query(r: &PeerRow, m: GenModel) -> std::result::Result<(GenArch, GenQuery), String> {
    if let Some(why) = r.setup.iter().find_map(|s| s.not_modelled()) {
        return Err(why.to_string());
    }
    let arch = GenArch::preset(m);
    let p = precision(r)?;
    if !matches!(p, Precision::F32 | Precision::F16 | Precision::Bf16) {
        return Err(format!(
            "precision `{p}`: a pipeline runs in f32, f16 or bf16"
        ));
    }
    let d = defaults(m, p.dtype());
    let resolution = r.resolution.unwrap_or(Resolution {
        width: d.side,
        height: d.side,
    });
    // diffusers' AutoencoderKL tiling: tiles of the VAE's `sample_size`, overlapping by a
    // quarter, and only where the image is larger than one tile.
    let tile = d.tile;
    let tiled =
        r.setup.contains(&Setup::VaeTiling) && resolution.width.max(resolution.height) > tile;
    let vae_decode = if tiled {
        VaeDecode::Tiled
    } else if r.setup.contains(&Setup::VaeSlicing) {
        VaeDecode::Sliced
    } else {
        VaeDecode::Full
    };
    let dtype = p.dtype();
    let q = GenQuery {
        batch: r.batch.unwrap_or(1),
        resolution,
        frames: 1,
        // FLUX's guidance scale is an input of its transformer, not a CFG batch.
        cfg: d.cfg && r.guidance_scale.is_none_or(|g| g > 1.0),
        vae_decode,
        tile,
        overlap: tile / 4,
        dtype,
        vae_dtype: d.vae_dtype,
        runtime: Runtime::Torch,
        backend: Backend::Cuda,
        attention: if r.attention == Attention::Eager {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
    };
    gen::check(&arch, &q).map_err(|e| e.to_string())?;
    Ok((arch, q))
}
