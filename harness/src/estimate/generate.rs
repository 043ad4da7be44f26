//! The generation estimate (issue 17 point 5, DESIGN.md §12): the peak of each phase of an
//! image generation (`load`, `text_encode`, `denoise`, `vae_decode`), which phase holds the
//! point's peak, and the largest batch and resolution that fit each GPU of the catalog.
//!
//! A phase's peak is its exact tensors (the weights of every component, the text context, the
//! latents, the decoded images and, for a tiled decode, the row strip; bytes from the config,
//! coefficient 1, never fitted) plus its uncertain activation terms ([`GEN_TERMS`]), each a
//! count of tensors of a named shape, times a coefficient that `vramlab fit` measures per
//! architecture (or an analytic prior without constants):
//! - `text_act`: prompts × text tokens × the widest encoder's hidden size (encoder tensors);
//! - `denoise_act`: denoiser images (× 2 with CFG) × latent pixels × the denoiser's width at
//!   full latent resolution (full-resolution feature maps live at the step's peak);
//! - `denoise_scores`: denoiser images × heads × tokens² of the first attention level, in f32:
//!   candle's UNet attention upcasts q, k, v and materializes the scores and their softmax;
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
use crate::error::InputError;
use crate::estimate::{budget, largest, Backend, Runtime, CATALOG};
use crate::fit::generate::{activation, find, find_transfer, GenConstants, GenGroupKey};
use crate::model::sd::{DownBlock, SdConfig};
use crate::vocab::{Component, Phase, Resolution, VaeDecode};
use candle_core::DType;
use serde::Serialize;

/// The uncertain terms of a generation phase, in admission order for a fit.
pub const GEN_TERMS: [&str; 6] = [
    "text_act",
    "denoise_act",
    "vae_act",
    "denoise_scores",
    "vae_scores",
    "const",
];
pub const N_GEN: usize = GEN_TERMS.len();
pub type GenTerms = [f64; N_GEN];
const TEXT_ACT: usize = 0;
const DENOISE_ACT: usize = 1;
const VAE_ACT: usize = 2;
const DENOISE_SCORES: usize = 3;
const VAE_SCORES: usize = 4;
const CONST: usize = 5;

/// The phases of a generation, in the order they run.
pub const GEN_PHASES: [Phase; 4] = [
    Phase::Load,
    Phase::TextEncode,
    Phase::Denoise,
    Phase::VaeDecode,
];

/// What the estimator reads of a generation architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct GenArch {
    pub architecture: &'static str,
    /// Every component with its parameter count, in load order.
    pub components: Vec<(Component, u64)>,
    /// Output pixels per latent pixel along each side (the VAE's factor).
    pub factor: usize,
    pub latent_channels: usize,
    pub out_channels: usize,
    pub text_len: usize,
    /// The widest text encoder's hidden size (encoders run one after the other).
    pub text_hidden: usize,
    /// Context features per text token the denoiser reads (all encoders concatenated).
    pub context_dim: usize,
    /// The denoiser's channels at full latent resolution.
    pub denoise_width: usize,
    /// Latent pixels per token at the denoiser's first attention level (4 per halving).
    pub attn_pixels_per_token: usize,
    /// Heads at that level.
    pub attn_heads: usize,
    /// The VAE decoder's channels at output resolution.
    pub vae_width: usize,
    /// Whether the VAE has the mid-block attention over every latent pixel.
    pub vae_attention: bool,
    /// The real pipeline decodes in f32 whatever the pipeline's dtype (SDXL `force_upcast`).
    pub vae_upcast: bool,
    pub has_cfg: bool,
}

impl GenArch {
    /// Stable Diffusion 1.x/2.x/XL from its diffusers config.
    pub fn sd(c: &SdConfig) -> GenArch {
        let u = &c.unet;
        let level = u
            .down_block_types
            .iter()
            .position(|b| *b == DownBlock::CrossAttnDownBlock2D)
            .unwrap_or(0);
        let encoders = std::iter::once(&c.text_encoder).chain(c.text_encoder_2.as_ref());
        GenArch {
            architecture: "stable-diffusion",
            components: c
                .components()
                .into_iter()
                .map(|k| (k, c.params(k)))
                .collect(),
            factor: c.vae.scale(),
            latent_channels: u.in_channels,
            out_channels: c.vae.out_channels,
            text_len: c.text_len(),
            text_hidden: encoders.map(|e| e.hidden_size).max().unwrap_or(0),
            context_dim: c.context_dim(),
            denoise_width: u.block_out_channels[0],
            attn_pixels_per_token: 1 << (2 * level),
            // candle (like diffusers) reads `attention_head_dim` as the head count.
            attn_heads: u.attention_head_dim.at(level),
            vae_width: c.vae.block_out_channels[0],
            vae_attention: true,
            vae_upcast: c.default_vae_dtype(DType::F16) == DType::F32,
            has_cfg: c.has_cfg(),
        }
    }

    pub fn params(&self) -> u64 {
        self.components.iter().map(|c| c.1).sum()
    }
}

/// One generation query.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GenQuery {
    pub batch: u64,
    pub resolution: Resolution,
    pub cfg: bool,
    pub vae_decode: VaeDecode,
    /// Tile side and overlap in output pixels (`tiled`).
    pub tile: usize,
    pub overlap: usize,
    #[serde(serialize_with = "dtype_name")]
    pub dtype: DType,
    #[serde(serialize_with = "dtype_name")]
    pub vae_dtype: DType,
    pub runtime: Runtime,
    pub backend: Backend,
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.as_str())
}

impl GenQuery {
    /// Images the denoiser and the text encoders see: doubled by CFG.
    pub fn denoise_batch(&self) -> u64 {
        self.batch * if self.cfg { 2 } else { 1 }
    }
}

/// Checks a query against the architecture: one line naming the flag.
pub fn check(a: &GenArch, q: &GenQuery) -> Result<(), InputError> {
    let r = q.resolution;
    let f = a.factor;
    if r.width == 0 || r.height == 0 || !r.width.is_multiple_of(f) || !r.height.is_multiple_of(f) {
        return Err(InputError::arg(format!(
            "--resolution {r} is not a multiple of {f} (the VAE's factor)"
        )));
    }
    if q.batch == 0 {
        return Err(InputError::arg("--batch must be at least 1"));
    }
    if q.cfg && !a.has_cfg {
        return Err(InputError::arg(
            "--cfg: this model runs without classifier-free guidance",
        ));
    }
    if q.vae_decode == VaeDecode::Tiled {
        if q.tile == 0 || !q.tile.is_multiple_of(f) || !q.overlap.is_multiple_of(f) {
            return Err(InputError::arg(format!(
                "--tile {} and --overlap {} must be multiples of {f}, the tile at least {f}",
                q.tile, q.overlap
            )));
        }
        if q.overlap >= q.tile {
            return Err(InputError::arg(format!(
                "--overlap {} must be smaller than --tile {}",
                q.overlap, q.tile
            )));
        }
        if q.tile > r.width.max(r.height) {
            return Err(InputError::arg(format!(
                "--tile {} is larger than the image {r}",
                q.tile
            )));
        }
    }
    Ok(())
}

/// The exact tensors and the uncertain terms of one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTerms {
    pub exact: Vec<(String, u64)>,
    pub x: GenTerms,
}

fn bytes(d: DType) -> u64 {
    d.size_in_bytes() as u64
}

/// The exact tensors of a query: each component's weights (the VAE in its own dtype), the text
/// context, the latents, the decoded images and a tiled decode's row strip.
pub fn exact_rows(a: &GenArch, q: &GenQuery) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = a
        .components
        .iter()
        .map(|(c, p)| {
            let d = if *c == Component::Vae {
                q.vae_dtype
            } else {
                q.dtype
            };
            (c.to_string(), p * bytes(d))
        })
        .collect();
    let r = q.resolution;
    let lp = (r.pixels() / (a.factor * a.factor)) as u64;
    v.push((
        "text context".into(),
        q.denoise_batch() * (a.text_len * a.context_dim) as u64 * bytes(q.dtype),
    ));
    v.push((
        "latents".into(),
        q.batch * a.latent_channels as u64 * lp * bytes(q.dtype),
    ));
    v.push((
        "decoded images".into(),
        q.batch * (a.out_channels * r.pixels()) as u64 * bytes(q.vae_dtype),
    ));
    if q.vae_decode == VaeDecode::Tiled {
        let th = q.tile.min(r.height);
        v.push((
            "tile strip".into(),
            q.batch * (a.out_channels * th * r.width) as u64 * bytes(q.vae_dtype),
        ));
    }
    v
}

/// The exact rows live in `phase` and its uncertain terms.
pub fn phase_terms(a: &GenArch, q: &GenQuery, phase: Phase) -> PhaseTerms {
    let all = exact_rows(a, q);
    // The weights (the first rows) are live in every phase.
    let n_weights = a.components.len();
    let live = |names: &[&str]| -> Vec<(String, u64)> {
        all.iter()
            .enumerate()
            .filter(|(i, (n, _))| *i < n_weights || names.contains(&n.as_str()))
            .map(|(_, r)| r.clone())
            .collect()
    };
    let mut x = [0.0; N_GEN];
    x[CONST] = 1.0;
    let r = q.resolution;
    let f = a.factor;
    let nb = q.denoise_batch() as f64;
    let scores = |images: f64, tokens: f64, heads: f64| match q.runtime {
        // candle upcasts q, k, v and materializes f32 scores; SDPA never does.
        Runtime::Candle => images * heads * tokens * tokens * 4.0,
        Runtime::Torch => 0.0,
    };
    let exact = match phase {
        Phase::Load => live(&[]),
        Phase::TextEncode => {
            x[TEXT_ACT] = nb * (a.text_len * a.text_hidden) as f64 * bytes(q.dtype) as f64;
            live(&["text context"])
        }
        Phase::Denoise => {
            let lp = (r.pixels() / (f * f)) as f64;
            x[DENOISE_ACT] = nb * lp * a.denoise_width as f64 * bytes(q.dtype) as f64;
            let tokens = lp / a.attn_pixels_per_token as f64;
            x[DENOISE_SCORES] = scores(nb, tokens, a.attn_heads as f64);
            live(&["text context", "latents"])
        }
        _ => {
            let (images, h, w) = match q.vae_decode {
                VaeDecode::Full => (q.batch as f64, r.height, r.width),
                VaeDecode::Sliced => (1.0, r.height, r.width),
                VaeDecode::Tiled => (q.batch as f64, q.tile.min(r.height), q.tile.min(r.width)),
            };
            let px = (h * w) as f64;
            x[VAE_ACT] = images * px * a.vae_width as f64 * bytes(q.vae_dtype) as f64;
            if a.vae_attention {
                x[VAE_SCORES] = scores(images, px / (f * f) as f64, 1.0);
            }
            live(&["latents", "decoded images", "tile strip"])
        }
    };
    PhaseTerms { exact, x }
}

/// The analytic prior of each term's coefficient (tensors of the term's shape live at the
/// phase's peak), used without constants and for a term a fit could not identify:
/// - `text_act` 8: the MLP's 4×-wide intermediate, its activation, q/k/v and the residual;
/// - `denoise_act` and `vae_act`: a 3×3 convolution at full resolution holds its input, its
///   output and the residual (3); candle lowers it to a matmul over an im2col buffer of
///   9 × the input (12 in all);
/// - `denoise_scores` 2 and `vae_scores` 2: the scores and their softmax, both alive at once
///   (the term is already 0 where the runtime never materializes them);
/// - `const` 0: no runtime constant without a measurement.
pub fn prior(term: usize, runtime: Runtime) -> f64 {
    match (term, runtime) {
        (TEXT_ACT, _) => 8.0,
        (DENOISE_ACT | VAE_ACT, Runtime::Candle) => 12.0,
        (DENOISE_ACT | VAE_ACT, Runtime::Torch) => 3.0,
        (DENOISE_SCORES | VAE_SCORES, _) => 2.0,
        _ => 0.0,
    }
}

pub fn priors(runtime: Runtime) -> GenTerms {
    std::array::from_fn(|j| prior(j, runtime))
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
    (vec![priors(q.runtime)], "analytic".into())
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

/// The estimate of `q`: each phase's peak, the peak phase and its composition.
pub fn estimate(a: &GenArch, q: &GenQuery, constants: Option<&GenConstants>) -> GenEstimate {
    let device = device_rows(q.backend);
    let dev: u64 = device.iter().map(|d| d.1).sum();
    let mut phases = Vec::new();
    let mut compositions = Vec::new();
    for phase in GEN_PHASES {
        let t = phase_terms(a, q, phase);
        let (coef, source) = coefficients(a, q, phase, constants);
        let act = activation(&coef, &t.x).max(0.0).round() as u64;
        let exact: u64 = t.exact.iter().map(|e| e.1).sum();
        let mut rows = t.exact.clone();
        rows.push((format!("{phase} activations"), act));
        rows.extend(device.iter().cloned());
        compositions.push(rows);
        phases.push(PhaseEstimate {
            name: phase,
            peak_bytes: exact + act + dev,
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
    GenEstimate {
        exact: exact_rows(a, q),
        device,
        peak_phase: top.name,
        total_bytes: top.peak_bytes,
        breakdown: compositions.swap_remove(i),
        phases,
    }
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
}

/// Largest batch searched.
pub const MAX_GEN_BATCH: u64 = 1 << 16;
/// Largest square side searched, in output pixels.
pub const MAX_SIDE: u64 = 1 << 15;

/// The catalog: each class's largest batch and square resolution.
pub fn gpu_fits(
    a: &GenArch,
    q: &GenQuery,
    constants: Option<&GenConstants>,
    headroom: f64,
) -> Vec<GenGpuFit> {
    let total = |q: &GenQuery| estimate(a, q, constants).total_bytes;
    let f = a.factor as u64;
    CATALOG
        .iter()
        .map(|c| {
            let b = budget(c.gb * 1_000_000_000, headroom);
            let largest_batch =
                largest(MAX_GEN_BATCH, |n| total(&GenQuery { batch: n, ..*q }) <= b);
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
            let k = largest(MAX_SIDE / f, |k| total(&at(k)) <= b);
            GenGpuFit {
                gb: c.gb,
                examples: c.examples,
                budget_bytes: b,
                fits: total(q) <= b,
                largest_batch,
                largest_square: (k > 0).then(|| at(k).resolution),
            }
        })
        .collect()
}
