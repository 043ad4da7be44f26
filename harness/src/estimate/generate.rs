//! The generation estimate (docs/src/guides/generation.md): the peak of each phase of an
//! image generation (`load`, `text_encode`, `denoise`, `vae_decode`), which phase holds the
//! point's peak, and the largest batch and resolution that fit each GPU of the catalog.
//!
//! A phase's peak is its exact tensors (the weights of every component, the text context, the
//! latents, the decoded images and, for a tiled decode, the row strip (candle) or every decoded
//! tile (diffusers' `tiled_decode` blends them at the end); bytes from the config, coefficient
//! 1, never fitted) plus its uncertain activation terms ([`GEN_TERMS`]), each a
//! count of tensors of a named shape, times a coefficient that `vramlab fit` measures per
//! architecture (or an analytic prior without constants):
//! - `text_act`: prompts × text tokens × the widest encoder's hidden size (encoder tensors);
//! - `denoise_act`: denoiser images (× 2 with CFG) × latent pixels × the denoiser's width at
//!   full latent resolution (full-resolution feature maps live at the step's peak);
//! - `denoise_scores`: denoiser images × heads × tokens × keys of the first attention level
//!   (keys: the image tokens, or the text tokens of cross-attention where those are more), in
//!   f32: candle's UNet attention upcasts q, k, v and materializes the scores and their softmax;
//!   diffusers' SDPA never materializes them (0 in the torch profile);
//! - `vae_act`: images decoded at once × decoded pixels × the decoder's width at output
//!   resolution (the whole batch for `full`, one image for `sliced`, one tile of the batch for
//!   `tiled`);
//! - `vae_scores`: the same images × (latent pixels decoded at once)² in f32: the VAE's
//!   single-head mid-block attention, which candle always upcasts and materializes (0 under
//!   diffusers' SDPA);
//! - `const`: a runtime constant.
//!
//! The architecture enters only through [`GenArch`] (components and their parameters, the
//! VAE factor, widths, the first attention level), so every generation family gives the same
//! terms from its own config.
use crate::checked::{Checked, Overflow};
use crate::estimate::{budget, largest, Backend};
use crate::fit::generate::{activation, find, find_transfer, GenConstants, GenGroupKey};
use crate::fit::{Constants, Runtime};
pub use crate::terms::generation::*;
use crate::vocab::{Phase, Resolution};
use serde::Serialize;

/// The constants a generation estimate uses without `--constants`: `vramlab fit` on this
/// repository's own measurements (candle's on `results/cpu/cpu-sd15*.csv`, diffusers' through the
/// torch probe on `results/cpu/torch-cpu-sd15*.csv`), one file per runtime, built into the
/// binary. Each file records its runtime, backend, device and the sha256 of its CSVs; the
/// estimate names it, and the transfer when the query's backend or precision differs. An
/// architecture a file does not cover gets the analytic priors.
const REFERENCE: [(Runtime, &str, &str); 2] = [
    (
        Runtime::Candle,
        "results/cpu/cpu-sd15.constants.toml",
        include_str!("../../../results/cpu/cpu-sd15.constants.toml"),
    ),
    (
        Runtime::Torch,
        "results/cpu/torch-cpu-sd15.constants.toml",
        include_str!("../../../results/cpu/torch-cpu-sd15.constants.toml"),
    ),
];

/// The built-in reference constants of `runtime`: the repository path they were committed at,
/// and the constants.
pub fn reference(runtime: Runtime) -> (&'static str, Constants) {
    let (_, path, text) = REFERENCE
        .iter()
        .find(|r| r.0 == runtime)
        .expect("a reference file per runtime");
    let c = Constants::parse(std::path::Path::new(path), text)
        .expect("the committed reference constants parse");
    (path, c)
}

/// One phase of an estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseEstimate {
    pub name: Phase,
    pub peak_bytes: u64,
    /// Activation bytes over the phase's exact tensors (the fitted part).
    pub activation_bytes: u64,
    /// Where the coefficients came from: `fitted <group>`, `transferred <group>` or `analytic`.
    pub source: String,
}

/// A generation estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenEstimate {
    /// Every exact tensor (weights per component, context, latents, images, strip).
    pub exact: Vec<(String, u64)>,
    /// Device rows added to every phase (CUDA context, cuBLAS workspace, allocator rounding).
    pub device: Vec<(String, u64)>,
    pub phases: Vec<PhaseEstimate>,
    pub peak_phase: Phase,
    pub total_bytes: u64,
    /// The peak phase's composition: its exact rows, its activations, the device rows.
    pub breakdown: Vec<(String, u64)>,
}

/// The coefficients of one phase: fitted for the query's group, else a group of the same
/// architecture and phase at another precision (the terms are already in bytes of the query's
/// dtypes), else the priors.
fn coefficients(
    a: &GenArch,
    q: &GenQuery,
    phase: Phase,
    constants: Option<&GenConstants>,
) -> (Vec<GenTerms>, String) {
    let key = GenGroupKey::of_query(a, q, phase);
    if let Some(c) = constants {
        if let Some(g) = find(c, &key) {
            return (g.coefficients(), format!("fitted {}", key.label()));
        }
        if let Some(g) = find_transfer(c, &key) {
            return (
                g.coefficients(),
                format!("transferred {} to {}", g.key.label(), key.label()),
            );
        }
    }
    (vec![priors(a, q.runtime)], "analytic".into())
}

/// Device rows of a backend: on CUDA, the context, cuBLAS workspace and allocator rounding of
/// the LLM estimate; none on the CPU.
pub fn device_rows(backend: Backend) -> Vec<(String, u64)> {
    match backend {
        Backend::Cuda => vec![
            ("CUDA context".into(), super::CUDA_CONTEXT),
            ("cuBLAS workspace".into(), super::CUBLAS_WORKSPACE),
            ("allocator rounding".into(), super::ALLOCATOR_ROUNDING),
        ],
        _ => Vec::new(),
    }
}

/// The estimate of `q`: each phase's peak, the peak phase and its composition. An overflow
/// names the first row, activation or peak past 2^64 B (a regressed activation that is not
/// finite, too).
pub fn estimate(
    a: &GenArch,
    q: &GenQuery,
    constants: Option<&GenConstants>,
) -> Result<GenEstimate, Overflow> {
    let device = device_rows(q.backend);
    let dev: Checked = device.iter().map(|d| d.1).sum();
    let mut phases = Vec::new();
    let mut compositions = Vec::new();
    for phase in GEN_PHASES {
        let t = phase_terms(a, q, phase)?;
        let (coef, source) = coefficients(a, q, phase, constants);
        let name = format!("{phase} activations");
        let act = Checked::from_f64(activation(&coef, &t.x)).bytes(&name)?;
        let exact: Checked = t.exact.iter().map(|e| e.1).sum();
        let peak = (exact + act + dev).bytes(&format!("{phase} peak"))?;
        let mut rows = t.exact;
        rows.push((name, act));
        rows.extend(device.iter().cloned());
        compositions.push(rows);
        phases.push(PhaseEstimate {
            name: phase,
            peak_bytes: peak,
            activation_bytes: act,
            source,
        });
    }
    // The last phase among equals: a decode as large as a denoise step still runs after it.
    let (i, top) = phases
        .iter()
        .enumerate()
        .max_by_key(|(i, p)| (p.peak_bytes, *i))
        .expect("four phases");
    Ok(GenEstimate {
        exact: exact_rows(a, q)?,
        device,
        peak_phase: top.name,
        total_bytes: top.peak_bytes,
        breakdown: compositions.swap_remove(i),
        phases,
    })
}

/// What one GPU class holds at the query's settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenGpuFit {
    pub gb: u64,
    pub examples: &'static str,
    pub budget_bytes: u64,
    pub fits: bool,
    /// Largest batch at the query's resolution (0: not even one image).
    pub largest_batch: u64,
    /// Largest square resolution (a multiple of the factor) at the query's batch.
    pub largest_square: Option<Resolution>,
    /// A video model: the most frames (of the VAE's `tk + 1`) at the query's resolution and
    /// batch (None: not even one frame, or an image model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub largest_frames: Option<u64>,
}

/// Longest video searched, in temporal chunks.
pub const MAX_CHUNKS: u64 = 1 << 14;

/// Largest batch searched.
pub const MAX_GEN_BATCH: u64 = 1 << 16;
/// Largest square side searched, in output pixels.
pub const MAX_SIDE: u64 = 1 << 15;

/// The catalog: each class's largest batch and square resolution (a candidate whose estimate
/// overflows does not fit).
pub fn gpu_fits(
    a: &GenArch,
    q: &GenQuery,
    constants: Option<&GenConstants>,
    headroom: f64,
) -> Vec<GenGpuFit> {
    // None: past 2^64 B.
    let total = |q: &GenQuery| estimate(a, q, constants).ok().map(|e| e.total_bytes);
    let fits = |q: &GenQuery, b: u64| total(q).is_some_and(|t| t <= b);
    let f = a.factor as u64;
    let t = a.temporal_factor as u64;
    let video = t > 1;
    crate::gpu::classes()
        .iter()
        .map(|c| {
            let b = budget(c.bytes, headroom);
            let largest_batch = largest(MAX_GEN_BATCH, |n| fits(&GenQuery { batch: n, ..*q }, b));
            // A tiled decode's tile shrinks with images smaller than it (what the decode does).
            let at = |k: u64| {
                let side = (k * f) as usize;
                GenQuery {
                    resolution: Resolution {
                        width: side,
                        height: side,
                    },
                    ..*q
                }
            };
            let k = largest(MAX_SIDE / f, |k| fits(&at(k), b));
            GenGpuFit {
                gb: c.gb,
                examples: c.examples.as_str(),
                budget_bytes: b,
                fits: fits(q, b),
                largest_batch,
                largest_square: (k > 0).then(|| at(k).resolution),
                largest_frames: video
                    .then(|| {
                        // n chunks after the first: n·t + 1 frames.
                        let frames = |n: u64| n * t + 1;
                        let n = largest(MAX_CHUNKS, |n| {
                            fits(
                                &GenQuery {
                                    frames: frames(n - 1),
                                    ..*q
                                },
                                b,
                            )
                        });
                        (n > 0).then(|| frames(n - 1))
                    })
                    .flatten(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_constants_parse_and_name_their_runtime() {
        for (runtime, _, _) in REFERENCE {
            let (path, c) = reference(runtime);
            assert_eq!(c.runtime, runtime, "{path}");
            assert!(!c.generation.is_empty(), "{path}");
        }
    }

    /// A bf16 query on CUDA takes candle's f16 groups (same width: the norms upcast 16-bit
    /// inputs alike), an f32 query the f32 ones; both say they are transferred.
    #[test]
    fn a_16_bit_query_transfers_from_16_bit_groups() {
        use crate::vocab::{Attention, GenModel, VaeDecode};
        use candle_core::DType;
        let (_, c) = reference(Runtime::Candle);
        let a = GenArch::preset(GenModel::Sd15);
        for (dtype, from) in [(DType::BF16, "/cpu/f16/"), (DType::F32, "/cpu/f32/")] {
            let q = GenQuery {
                batch: 1,
                resolution: Resolution {
                    width: 512,
                    height: 512,
                },
                frames: 1,
                cfg: true,
                vae_decode: VaeDecode::Full,
                tile: 256,
                overlap: 32,
                dtype,
                vae_dtype: dtype,
                runtime: Runtime::Candle,
                backend: Backend::Cuda,
                attention: Attention::Eager,
            };
            let e = estimate(&a, &q, Some(&c.generation)).unwrap();
            for p in e.phases {
                assert!(
                    p.source.starts_with("transferred") && p.source.contains(from),
                    "{dtype:?} {}: {}",
                    p.name,
                    p.source
                );
            }
        }
    }
}
