//! The terms of a generation phase (docs/src/guides/generation.md): what is exact (weights, text
//! context, latents, decoded images) and what a fit estimates (activation bytes per latent pixel,
//! per output pixel, per token), from the architecture ([`GenArch`], `arch.rs`) and the query
//! ([`GenQuery`]). Shared by the fit (`fit::generate`) and the estimate (`estimate::generate`).
mod arch;

pub use arch::GenArch;

use crate::checked::{Checked, Overflow};
use crate::error::InputError;
use crate::vocab::{Attention, Backend, Component, Phase, Resolution, Runtime, VaeDecode};
use candle_core::DType;
use serde::Serialize;

/// One uncertain term of a generation phase: a column of [`GenTerms`] (`t as usize`,
/// [`GenTerm::index`]), named in constants files by [`GenTerm::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GenTerm {
    /// The text encoders' activations: pass batch × text tokens × hidden × bytes.
    TextAct,
    /// The denoiser's activations: pass batch × latent pixels × width × bytes.
    DenoiseAct,
    /// The VAE decoder's activations: images decoded at once × output pixels × width × bytes.
    VaeAct,
    /// The denoiser's attention scores: images × heads × queries × keys × bytes.
    DenoiseScores,
    /// The VAE's mid-block attention scores.
    VaeScores,
    /// A runtime constant: 1 on every row.
    Const,
}

impl GenTerm {
    /// Every term, in admission order for a fit (`GenTerm::ALL[i] as usize == i`).
    pub const ALL: [GenTerm; 6] = [
        GenTerm::TextAct,
        GenTerm::DenoiseAct,
        GenTerm::VaeAct,
        GenTerm::DenoiseScores,
        GenTerm::VaeScores,
        GenTerm::Const,
    ];

    /// The term's name in constants files and reports (part of the constants format).
    pub const fn name(self) -> &'static str {
        match self {
            GenTerm::TextAct => "text_act",
            GenTerm::DenoiseAct => "denoise_act",
            GenTerm::VaeAct => "vae_act",
            GenTerm::DenoiseScores => "denoise_scores",
            GenTerm::VaeScores => "vae_scores",
            GenTerm::Const => "const",
        }
    }

    /// The term's column in [`GenTerms`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The term named `name` ([`GenTerm::name`]), if any.
    pub fn from_name(name: &str) -> Option<GenTerm> {
        GenTerm::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The uncertain terms of a generation phase, in admission order for a fit: [`GenTerm::name`]
/// of [`GenTerm::ALL`].
pub const GEN_TERMS: [&str; N_GEN] = {
    let mut names = [""; N_GEN];
    let mut i = 0;
    while i < N_GEN {
        names[i] = GenTerm::ALL[i].name();
        i += 1;
    }
    names
};
pub const N_GEN: usize = GenTerm::ALL.len();
pub type GenTerms = [f64; N_GEN];

/// The phases of a generation, in the order they run.
pub const GEN_PHASES: [Phase; 4] = [
    Phase::Load,
    Phase::TextEncode,
    Phase::Denoise,
    Phase::VaeDecode,
];

/// One generation query.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GenQuery {
    pub batch: u64,
    pub resolution: Resolution,
    /// Output frames per video (1 for an image model).
    pub frames: u64,
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
    /// The denoiser's attention on torch: SDPA (and flash) never materializes the scores;
    /// eager (diffusers' `AttnProcessor`) holds the scores and their softmax in the pipeline's
    /// dtype. candle's UNet attention materializes them in f32 whatever this says.
    pub attention: Attention,
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.as_str())
}

impl GenQuery {
    /// Images the denoiser and the text encoders see: doubled by CFG.
    pub fn denoise_batch(&self) -> Checked {
        Checked::from(self.batch) * if self.cfg { 2u64 } else { 1 }
    }
}

/// Checks a query against the architecture: one line naming the flag.
pub fn check(a: &GenArch, q: &GenQuery) -> Result<(), InputError> {
    let r = q.resolution;
    let f = a.factor;
    if r.width == 0 || r.height == 0 || !r.width.is_multiple_of(f) || !r.height.is_multiple_of(f) {
        let why = if f == a.vae_factor {
            "the VAE's factor"
        } else {
            "the VAE's factor × the denoiser's 2×2 patch"
        };
        return Err(InputError::arg(format!(
            "--resolution {r} is not a multiple of {f} ({why})"
        )));
    }
    let t = a.temporal_factor as u64;
    if q.frames == 0 || !(q.frames - 1).is_multiple_of(t) || (t == 1 && q.frames != 1) {
        return Err(InputError::arg(if t == 1 {
            format!("--frames {}: an image model makes 1 frame", q.frames)
        } else {
            format!(
                "--frames {}: {} decodes {t}k+1 frames (1, {}, {}, ...; the VAE's temporal factor {t})",
                q.frames,
                a.architecture,
                t + 1,
                2 * t + 1
            )
        }));
    }
    if q.batch == 0 {
        return Err(InputError::arg("--batch must be at least 1"));
    }
    if q.cfg && !a.has_cfg {
        return Err(InputError::arg(
            "--cfg: this model runs without classifier-free guidance",
        ));
    }
    let f = a.vae_factor;
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

/// Pixels of a `w` × `h` image (or tile).
fn pixels(w: usize, h: usize) -> Checked {
    Checked::from(w) * h
}

/// A count as a real term: one past 2^64 is infinite (its bytes overflow downstream).
fn real(c: Checked) -> f64 {
    c.get().map_or(f64::INFINITY, |v| v as f64)
}

/// The exact tensors of a query: each component's weights (the VAE in its own dtype), the text
/// context, the latents, the decoded images and a tiled decode's row strip. An overflow names
/// the first row past 2^64 B.
pub fn exact_rows(a: &GenArch, q: &GenQuery) -> Result<Vec<(String, u64)>, Overflow> {
    let mut v: Vec<(String, Checked)> = a
        .components
        .iter()
        .map(|(c, p)| {
            let d = if *c == Component::Vae {
                q.vae_dtype
            } else {
                q.dtype
            };
            (c.to_string(), Checked::from(*p) * bytes(d))
        })
        .collect();
    let r = q.resolution;
    let lp = pixels(r.width, r.height) / (a.vae_factor * a.vae_factor) as u64;
    let lf = a.latent_frames(q.frames);
    let per_token = Checked::from(a.text_len) * a.context_dim + a.pooled_dim;
    v.push((
        "text context".into(),
        q.denoise_batch() * per_token * bytes(q.dtype),
    ));
    v.push((
        "latents".into(),
        Checked::from(q.batch) * a.latent_channels * lf * lp * bytes(q.dtype),
    ));
    v.push((
        "decoded images".into(),
        Checked::from(q.batch)
            * q.frames
            * a.out_channels
            * pixels(r.width, r.height)
            * bytes(q.vae_dtype),
    ));
    if a.vae_cache_per_latent_pixel > 0 {
        // The causal convolutions' cache of what one decode call holds: the batch, one video
        // (`sliced`), or one tile of the batch (`tiled`).
        let (videos, latent) = match q.vae_decode {
            VaeDecode::Full => (q.batch, lp),
            VaeDecode::Sliced => (1, lp),
            VaeDecode::Tiled => {
                let t = |side: usize| q.tile.min(side) / a.vae_factor;
                (q.batch, pixels(t(r.height), t(r.width)))
            }
        };
        v.push((
            "feature cache".into(),
            Checked::from(videos) * a.vae_cache_per_latent_pixel * latent * bytes(q.vae_dtype),
        ));
    }
    if q.vae_decode == VaeDecode::Tiled {
        let per_pixel = Checked::from(q.batch) * q.frames * a.out_channels * bytes(q.vae_dtype);
        v.push(match q.runtime {
            // vramlab blends each tile into a row strip as wide as the image.
            Runtime::Candle => (
                "tile strip".into(),
                per_pixel * pixels(q.tile.min(r.height), r.width),
            ),
            // diffusers' `tiled_decode` (AutoencoderKL's and AutoencoderKLWan's) keeps every
            // decoded tile until it blends them: tiles start every tile − overlap latent
            // pixels and the last ones are cut at the edge, so they cover more than the image.
            Runtime::Torch | Runtime::Vllm => {
                let f = a.vae_factor;
                let (tile, stride) = (q.tile / f, (q.tile - q.overlap) / f);
                let side = |len: usize| -> Checked {
                    (0..len / f)
                        .step_by(stride.max(1))
                        .map(|i| tile.min(len / f - i) * f)
                        .sum()
                };
                (
                    "decoded tiles".into(),
                    per_pixel * side(r.height) * side(r.width),
                )
            }
        });
    }
    v.into_iter()
        .map(|(name, b)| {
            let b = b.bytes(&name)?;
            Ok((name, b))
        })
        .collect()
}

/// The exact rows live in `phase` and its uncertain terms (a term whose count exceeds 2^64 is
/// infinite); an overflow when an exact row does.
pub fn phase_terms(a: &GenArch, q: &GenQuery, phase: Phase) -> Result<PhaseTerms, Overflow> {
    let all = exact_rows(a, q)?;
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
    x[GenTerm::Const.index()] = 1.0;
    let r = q.resolution;
    let f = a.vae_factor;
    let nb = real(a.pass_batch(q));
    let lf = a.latent_frames(q.frames) as f64;
    // images × heads × queries × keys score elements, in the bytes the runtime holds them in.
    let scores = |images: f64, queries: f64, keys: f64, heads: f64, attention, f32: bool, flash| {
        let b = match (q.runtime, attention) {
            // candle materializes the scores: in f32 where it upcasts q, k, v (SD's UNet and
            // VAE), else in the pipeline's dtype (FLUX's transformer).
            // vramlab-kernels' flash attention (the Wan DiT's) never materializes them.
            (Runtime::Candle, Attention::Flash) if flash => 0.0,
            (Runtime::Candle, _) if f32 => 4.0,
            (Runtime::Candle, _) => bytes(q.dtype) as f64,
            (Runtime::Torch | Runtime::Vllm, Attention::Eager) => bytes(q.dtype) as f64,
            // SDPA never materializes them.
            (Runtime::Torch | Runtime::Vllm, _) => 0.0,
        };
        images * heads * queries * keys * b
    };
    let exact = match phase {
        Phase::Load => live(&[]),
        Phase::TextEncode => {
            x[GenTerm::TextAct.index()] =
                nb * (a.text_len * a.text_hidden) as f64 * bytes(q.dtype) as f64;
            live(&["text context"])
        }
        Phase::Denoise => {
            let lp = lf * real(pixels(r.width, r.height) / (f * f) as u64);
            let ppt = a.attn_pixels_per_token as f64;
            let px = lp + a.joint_tokens as f64 * ppt;
            x[GenTerm::DenoiseAct.index()] =
                nb * px * a.denoise_width as f64 * bytes(q.dtype) as f64;
            let tokens = px / ppt;
            // A block's self- and cross-attention run one after the other: the larger scores
            // set the peak. Cross-attention's keys are the text tokens (77 for SD, 512 for
            // Wan), which outnumber the image tokens of a small latent; FLUX attends jointly.
            let keys = if a.joint_tokens == 0 {
                tokens.max(a.text_len as f64)
            } else {
                tokens
            };
            let (heads, f32) = (a.attn_heads as f64, a.denoise_scores_f32);
            x[GenTerm::DenoiseScores.index()] =
                scores(nb, tokens, keys, heads, q.attention, f32, a.denoise_flash);
            live(&["text context", "latents"])
        }
        _ => {
            let (images, h, w) = match q.vae_decode {
                VaeDecode::Full => (q.batch as f64, r.height, r.width),
                VaeDecode::Sliced => (1.0, r.height, r.width),
                VaeDecode::Tiled => (q.batch as f64, q.tile.min(r.height), q.tile.min(r.width)),
            };
            let px = real(pixels(w, h));
            // A video decodes in temporal chunks: the largest yields `temporal_factor` frames.
            let chunk = if q.frames > 1 { a.temporal_factor } else { 1 } as f64;
            x[GenTerm::VaeAct.index()] =
                chunk * images * px * a.vae_width as f64 * bytes(q.vae_dtype) as f64;
            if a.vae_attention {
                // diffusers' VAE keeps SDPA when the denoiser's attention is set to eager.
                let latent = px / (f * f) as f64;
                x[GenTerm::VaeScores.index()] =
                    scores(images, latent, latent, 1.0, Attention::Sdpa, true, false);
            }
            live(&[
                "latents",
                "decoded images",
                "tile strip",
                "decoded tiles",
                "feature cache",
            ])
        }
    };
    Ok(PhaseTerms { exact, x })
}

/// The analytic prior of each term's coefficient (tensors of the term's shape live at the
/// phase's peak), used without constants and for a term a fit could not identify:
/// - `text_act` 8: the MLP's 4×-wide intermediate, its activation, q/k/v and the residual;
/// - `denoise_act`: the architecture's [`GenArch::denoise_prior`]. A UNet: a 3×3 convolution
///   at full resolution holds its input, its output and the residual (torch 3); candle lowers
///   it to a matmul over an im2col buffer of 9 × the input (12 in all). A DiT: its widest block,
///   with tensors of its MLP's width;
/// - `vae_act`: candle 12, as `denoise_act`; torch 6: diffusers' `ResnetBlock2D.forward` at
///   the first block of the output resolution holds its input, `norm1`'s output and the SiLU's
///   output at once, three tensors of the width entering that level, which is twice the
///   decoder's output width in every AutoencoderKL (block_out_channels 128, 256, …);
/// - `denoise_scores` 2 and `vae_scores` 2: the scores and their softmax, both alive at once
///   (the term is already 0 where the runtime never materializes them);
/// - `const` 0: no runtime constant without a measurement.
pub fn prior(a: &GenArch, term: GenTerm, runtime: Runtime) -> f64 {
    match (term, runtime) {
        (GenTerm::TextAct, _) => 8.0,
        (GenTerm::DenoiseAct, Runtime::Candle) => a.denoise_prior[0],
        (GenTerm::DenoiseAct, Runtime::Torch | Runtime::Vllm) => a.denoise_prior[1],
        (GenTerm::VaeAct, Runtime::Candle) => 12.0,
        (GenTerm::VaeAct, Runtime::Torch | Runtime::Vllm) => 6.0,
        (GenTerm::DenoiseScores | GenTerm::VaeScores, _) => 2.0,
        (GenTerm::Const, _) => 0.0,
    }
}

/// The priors of every term ([`prior`]) for an architecture and runtime.
pub fn priors(a: &GenArch, runtime: Runtime) -> GenTerms {
    GenTerm::ALL.map(|t| prior(a, t, runtime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::GenModel;

    fn query(w: usize, h: usize, frames: u64, runtime: Runtime, attention: Attention) -> GenQuery {
        GenQuery {
            batch: 1,
            resolution: Resolution {
                width: w,
                height: h,
            },
            frames,
            cfg: true,
            vae_decode: VaeDecode::Full,
            tile: 0,
            overlap: 0,
            dtype: DType::BF16,
            vae_dtype: DType::F32,
            runtime,
            backend: Backend::Cpu,
            attention,
        }
    }

    #[test]
    fn names_and_columns_are_the_constants_format() {
        // Constants files on disk key coefficients by these names, in this column order.
        assert_eq!(
            GEN_TERMS,
            [
                "text_act",
                "denoise_act",
                "vae_act",
                "denoise_scores",
                "vae_scores",
                "const"
            ]
        );
        for (i, t) in GenTerm::ALL.into_iter().enumerate() {
            assert_eq!((t as usize, t.index()), (i, i));
            assert_eq!(GenTerm::from_name(t.name()), Some(t));
        }
    }

    /// The denoiser's scores: Wan's DiT at 128×128 × 5 frames has (5−1)/4 + 1 = 2 latent frames
    /// of 16×16 latents in 2×2 patches, 2·8·8 = 128 image tokens, fewer than the 512 text
    /// tokens its cross-attention reads: the cross-attention scores (128 × 512 per head) set
    /// the peak. At 832×480 × 81 frames, 21·30·52 image tokens outnumber the text:
    /// tokens². One pass (Wan's CFG runs the two passes one after the other), 12 heads, bf16.
    #[test]
    fn denoise_scores_take_the_larger_of_self_and_cross_attention() {
        let a = GenArch::preset(GenModel::Wan21T2v13b);
        let x = |w, h, f| {
            phase_terms(
                &a,
                &query(w, h, f, Runtime::Torch, Attention::Eager),
                Phase::Denoise,
            )
            .unwrap()
            .x[GenTerm::DenoiseScores.index()]
        };
        assert_eq!(x(128, 128, 5), (12 * 128 * 512 * 2) as f64);
        let t: u64 = 21 * 30 * 52;
        assert_eq!(x(832, 480, 81), (12 * t * t * 2) as f64);
        // vramlab's candle DiT under flash attention materializes none.
        let flash = query(128, 128, 5, Runtime::Candle, Attention::Flash);
        assert_eq!(
            phase_terms(&a, &flash, Phase::Denoise).unwrap().x[GenTerm::DenoiseScores.index()],
            0.0
        );
    }

    /// A tiled decode of 832×480 × 81 frames in 256-pixel tiles with 64 of overlap. vramlab
    /// holds one row strip: 256 rows of the full width, every frame. diffusers holds every
    /// decoded tile: in latents (÷ 8) tiles of 32 start every 24, so the 60 latent rows give
    /// tiles of 32, 32 and 12 (608 pixels) and the 104 columns 32, 32, 32, 32 and 8 (1,088).
    #[test]
    fn a_tiled_decode_holds_a_strip_on_candle_and_every_tile_under_diffusers() {
        let a = GenArch::preset(GenModel::Wan21T2v13b);
        let row = |runtime: Runtime, name: &str| {
            let q = GenQuery {
                vae_decode: VaeDecode::Tiled,
                tile: 256,
                overlap: 64,
                ..query(832, 480, 81, runtime, Attention::Sdpa)
            };
            let rows = exact_rows(&a, &q).unwrap();
            rows.iter().find(|r| r.0 == name).unwrap().1
        };
        assert_eq!(row(Runtime::Candle, "tile strip"), 81 * 3 * 256 * 832 * 4);
        assert_eq!(
            row(Runtime::Torch, "decoded tiles"),
            81 * 3 * 608 * 1088 * 4
        );
    }
}
