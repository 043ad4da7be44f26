//! Generation rows of a peers file: a diffusion pipeline's published peak (SDXL's,
//! say), read once into a [`GenQuery`] of the torch profile (diffusers on CUDA: SDPA unless
//! the row sets the default attention processor, the VAE in f32 where the pipeline upcasts it)
//! and estimated by [`crate::estimate::generate`]: the peak phase's exact tensors, its
//! activations and the device rows, summed over what the row's metric includes. The
//! activation coefficients are `--constants`' generation groups, else the torch runtime's
//! built-in reference constants (diffusers measured on the CPU, transferred to CUDA), else,
//! for an architecture they do not cover, the analytic priors.
//!
//! The row's words give the model (an HF id or a preset name), the precision, the images per
//! prompt (`batch`), the output size (`resolution`, or `width` and `height`, or a `WxH` in the
//! notes; absent, the pipeline's default size: the UNet's `sample_size` × the VAE's factor, what
//! diffusers generates), `guidance_scale` (CFG above 1; absent, the pipeline's default, which
//! guides), VAE slicing or tiling, and eager attention. What the estimator does not model
//! (offloading, another VAE, compiled kernels, dropped encoders, adapters) is not expressible,
//! with the reason.
use super::{number_after, precision, Expressed, PeerRow};
use crate::estimate::generate::{self as gen, GenArch, GenQuery};
use crate::estimate::Runtime;
use crate::fit::Constants;
use crate::model::diffusion::flux::FluxConfig;
use crate::model::diffusion::sd::SdConfig;
use crate::vocab::{Attention, Backend, GenModel, Precision, Resolution, VaeDecode};
use candle_core::DType;

/// Words in a model name → the preset whose published configs it has.
const MODELS: &[(&str, GenModel)] = &[
    ("stable-diffusion-xl", GenModel::Sdxl),
    ("sdxl", GenModel::Sdxl),
    ("stable-diffusion-2", GenModel::Sd21),
    ("stable-diffusion-v1-5", GenModel::Sd15),
    // v1-4's UNet, VAE and CLIP have v1-5's shapes.
    ("stable-diffusion-v1-4", GenModel::Sd15),
    ("sd15", GenModel::Sd15),
    ("sd21", GenModel::Sd21),
    ("flux.1-dev", GenModel::FluxDev),
    ("flux-dev", GenModel::FluxDev),
    ("flux.1-schnell", GenModel::FluxSchnell),
    ("flux-schnell", GenModel::FluxSchnell),
];

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
        // WanPipeline: height 480 (width 832: not a square, and no peer row names Wan, so
        // `model` never returns it); AutoencoderKLWan tiles of 256; CFG (guidance 5); the VAE
        // loaded in f32.
        GenModel::Wan21T2v13b => Defaults {
            side: 480,
            tile: 256,
            cfg: true,
            vae_dtype: DType::F32,
        },
    }
}

/// The generation preset a row's model names, if any.
pub fn model(words: &str) -> Option<GenModel> {
    let lower = words.to_ascii_lowercase();
    MODELS
        .iter()
        .find(|(k, _)| lower.contains(k))
        .map(|(_, m)| *m)
}

/// Words of a row's setup the estimator does not model, and why.
const NOT_MODELLED: &[(&str, &str)] = &[
    (
        "offload",
        "CPU offloading (weights moved to the host between uses) is not modelled",
    ),
    (
        "tiny autoencoder",
        "the Tiny AutoEncoder (TAESD) is not a VAE the estimator knows",
    ),
    (
        "taesd",
        "the Tiny AutoEncoder (TAESD) is not a VAE the estimator knows",
    ),
    (
        "torch.compile",
        "torch.compile's fused kernels change the activations; not modelled",
    ),
    (
        "precomput",
        "precomputed text embeddings (encoders not loaded) are not modelled",
    ),
    ("refiner", "the SDXL refiner is not modelled"),
    ("lora", "LoRA adapters are not modelled"),
    ("controlnet", "ControlNet is not modelled"),
    (
        "quantiz",
        "quantized weights are not a generation precision",
    ),
    (
        "bitsandbytes",
        "quantized weights are not a generation precision",
    ),
];

/// The first `WIDTHxHEIGHT` word of `text`.
fn resolution_in(text: &str) -> Option<Resolution> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '×'))
        .find_map(|w| w.replace('×', "x").parse().ok())
}

/// The number before `word` ("4 images" → 4).
fn count_before(text: &str, word: &str) -> Option<u64> {
    let i = text.find(word)?;
    text[..i].split_whitespace().last()?.parse().ok()
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
fn query(r: &PeerRow, m: GenModel) -> Expressed<(GenArch, GenQuery)> {
    let text = format!("{} {} {}", r.model, r.metric, r.notes);
    let lower = text.to_ascii_lowercase();
    if let Some((_, why)) = NOT_MODELLED.iter().find(|(k, _)| lower.contains(k)) {
        return Err((*why).to_string());
    }
    let arch = GenArch::preset(m);
    let p = precision(&r.precision)?;
    if !matches!(p, Precision::F32 | Precision::F16 | Precision::Bf16) {
        return Err(format!(
            "precision `{}`: a pipeline runs in f32, f16 or bf16",
            r.precision
        ));
    }
    let d = defaults(m, p.dtype());
    let resolution = match (&r.resolution, r.width, r.height) {
        (Some(s), _, _) => s.parse()?,
        (None, Some(width), Some(height)) => Resolution { width, height },
        _ => resolution_in(&r.notes).unwrap_or(Resolution {
            width: d.side,
            height: d.side,
        }),
    };
    let batch = r
        .batch
        .or_else(|| number_after(&lower, "num_images_per_prompt="))
        .or_else(|| count_before(&lower, " images"))
        .unwrap_or(1);
    // diffusers' AutoencoderKL tiling: tiles of the VAE's `sample_size`, overlapping by a
    // quarter, and only where the image is larger than one tile.
    let tile = d.tile;
    let tiled = (lower.contains("vae tiling") || lower.contains("enable_vae_tiling"))
        && resolution.width.max(resolution.height) > tile;
    let vae_decode = if tiled {
        VaeDecode::Tiled
    } else if lower.contains("vae slicing") || lower.contains("enable_vae_slicing") {
        VaeDecode::Sliced
    } else {
        VaeDecode::Full
    };
    let eager = ["set_default_attn_processor", "default attention", "eager"]
        .iter()
        .any(|k| lower.contains(k));
    let dtype = p.dtype();
    let q = GenQuery {
        batch,
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
        attention: if eager {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
    };
    gen::check(&arch, &q).map_err(|e| e.to_string())?;
    Ok((arch, q))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_of_a_row() {
        assert_eq!(
            model("stabilityai/stable-diffusion-xl-base-1.0"),
            Some(GenModel::Sdxl)
        );
        assert_eq!(
            model("black-forest-labs/FLUX.1-dev"),
            Some(GenModel::FluxDev)
        );
        assert_eq!(model("meta-llama/Llama-3.1-8B"), None);
        assert_eq!(
            resolution_in("4 images at 1024x768, 30 steps"),
            Some(Resolution {
                width: 1024,
                height: 768
            })
        );
        assert_eq!(count_before("we generate 4 images", " images"), Some(4));
    }
}
