//! Diffusion models: the generation [`Pipeline`] trait (ARCHITECTURE.md §7) and its
//! implementations, one folder per family, each split the same way (`config.rs`, component
//! files, `pipeline.rs`): [`sd`] (Stable Diffusion 1.5/2.1/XL), [`flux`] (FLUX.1) and [`wan`]
//! (Wan2.1 text-to-video); `params.rs` holds the parameter counts of their shared layers.
//!
//! A pipeline is an image or video model as diffusers ships it, a set of components
//! (`text_encoder/`, `text_encoder_2/`, `unet/` or `transformer/`, `vae/`), each with its own
//! `config.json`, weights file and dtype, loaded (and measured) one at a time, then run as text
//! encode → denoising steps → VAE decode.
//!
//! A pipeline does not fit the [`Architecture`](super::Architecture) trait of language models
//! (one config, one tensor list, a decoder or an encoder). The generation workload
//! (`workload/generate.rs`) sees only `dyn Pipeline`, built here from a preset ([`preset`]) or
//! a diffusers directory ([`from_dir`]).
pub mod denoiser;
pub mod flux;
pub mod params;
pub mod sd;
pub mod source;
pub mod wan;

pub use source::GenSource;

use crate::error::bad_file;
use crate::vocab::{Attention, Component, GenModel, Resolution, VaeDecode};
use anyhow::{Context, Result};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Stored tensors: diffusers names and shapes, in load order.
pub type Shapes = Vec<(String, Vec<usize>)>;

/// The shape of one generation point.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenShape {
    pub batch: usize,
    pub resolution: Resolution,
    /// Output frames per video (1 for an image model).
    pub frames: usize,
    pub cfg: bool,
    pub steps: usize,
    pub vae_decode: VaeDecode,
    /// Tile side and overlap in output pixels (`tiled`).
    pub tile: usize,
    pub overlap: usize,
}

impl GenShape {
    /// Images the denoiser and the text encoders see: doubled by CFG.
    pub fn denoise_batch(&self) -> usize {
        self.batch * if self.cfg { 2 } else { 1 }
    }
}

/// An image or video generation model: its components and how each phase runs.
pub trait Pipeline {
    /// The preset's name (`sd15`, `flux-dev`, ...) or the diffusers directory's.
    fn name(&self) -> &str;
    /// The family, as the CSV's `architecture` column writes it.
    fn architecture(&self) -> &'static str;
    /// The components, in load order.
    fn components(&self) -> Vec<Component>;
    /// The denoising component (`unet` or `transformer`): the latents are in its dtype.
    fn denoiser(&self) -> Component;
    /// A component's stored tensors, from building its modules over a shape recorder.
    fn shapes(&self, c: Component) -> Shapes;
    /// A component's parameters counted from its config alone (independent of [`Self::shapes`]).
    fn params_analytic(&self, c: Component) -> u64;
    /// The dtype a component is loaded and run in.
    fn dtype(&self, c: Component) -> DType;
    /// Writes every component's `config.json` (and `model_index.json`) into a diffusers
    /// directory.
    fn write_configs(&self, dir: &Path) -> Result<()>;
    /// Loads one component from a diffusers directory, in its dtype. Refuses an attention kind
    /// the model does not implement (a one-line error).
    fn load(&mut self, dir: &Path, c: Component, attention: Attention, dev: &Device) -> Result<()>;

    /// Token ids of `prompts` prompts, one tensor per text encoder (each encoder's tokenizer
    /// and length).
    fn prompt_ids(&self, prompts: usize, dev: &Device) -> Result<Vec<Tensor>>;
    /// Text tokens per prompt the denoiser attends to (the CSV's `context`).
    fn text_len(&self) -> usize;
    /// Runs the text encoders on [`Self::prompt_ids`]: the conditioning the denoiser reads.
    /// With `cfg` the ids hold the prompts, then as many negative prompts.
    fn encode_text(&self, ids: &[Tensor], cfg: bool) -> Result<Vec<Tensor>>;

    /// Resolutions must be a multiple of this (8 for SD, 16 for FLUX and Wan).
    fn spatial_factor(&self) -> usize;
    /// Output pixels per latent pixel along one side (the VAE's stride).
    fn vae_scale(&self) -> usize;
    /// Channels of a decoded image.
    fn image_channels(&self) -> usize;
    /// Whether the model runs classifier-free guidance (a negative prompt batch).
    fn has_cfg(&self) -> bool;
    /// A video model: output frames per latent frame after the first (its frames are
    /// `k·t + 1`). None: an image model (1 frame).
    fn temporal_factor(&self) -> Option<usize> {
        None
    }
    /// Whether the denoiser runs attention `a`: on error, the problem (one line).
    fn check_attention(&self, _a: Attention) -> std::result::Result<(), BadPoint> {
        Ok(())
    }
    /// The latents the denoising loop holds for `batch` images (video: `frames`).
    fn latent_shape(&self, resolution: Resolution, batch: usize, frames: usize) -> Vec<usize>;
    /// One denoising step `step` of `steps` on `latents` (the loop's shape), conditioned on
    /// [`Self::encode_text`]'s output (with the unconditional half when `cfg`): the next
    /// latents.
    fn denoise_step(
        &self,
        latents: &Tensor,
        step: usize,
        steps: usize,
        cond: &[Tensor],
        cfg: bool,
    ) -> Result<Tensor>;
    /// The loop's final latents → what the VAE decodes (b, c, h, w), in the VAE's dtype:
    /// unpacked, unscaled (and shifted) as the real pipeline does.
    fn vae_latents(&self, latents: &Tensor) -> Result<Tensor>;
    /// Decodes VAE latents in one call.
    fn vae_decode(&self, z: &Tensor) -> Result<Tensor>;
    /// The shape [`Self::vae_decode`] returns for VAE latents of shape `z` (b, c, h, w):
    /// (b, [`Self::image_channels`], h·s, w·s). A video VAE adds its frames.
    fn decoded_shape(&self, z: &[usize]) -> Vec<usize> {
        let s = self.vae_scale();
        vec![z[0], self.image_channels(), z[2] * s, z[3] * s]
    }
    /// Decodes VAE latents as `g.vae_decode` says (full, sliced, tiled), over
    /// [`Self::vae_decode`] ([`decode_spatial`]).
    fn decode(&self, z: &Tensor, g: &GenShape) -> Result<Tensor> {
        decode_spatial(self, z, g)
    }

    /// Parameters of a component, from its stored shapes.
    fn params(&self, c: Component) -> u64 {
        count(&self.shapes(c))
    }

    /// Whether point `g` can run on this model: on error, which input and the problem.
    fn check(&self, g: &GenShape) -> std::result::Result<(), BadPoint> {
        check_point(self, g)
    }
}

/// The checks every model makes of a point: the resolution's factor, the frames (1 for an
/// image model, `k·t + 1` for a video model), CFG.
pub fn check_point<P: Pipeline + ?Sized>(p: &P, g: &GenShape) -> std::result::Result<(), BadPoint> {
    let f = p.spatial_factor();
    let r = g.resolution;
    if !r.width.is_multiple_of(f) || !r.height.is_multiple_of(f) {
        return Err(BadPoint {
            input: PointInput::Resolution,
            problem: format!(
                "resolution `{r}` is not a multiple of {f} ({}'s factor)",
                p.name()
            ),
        });
    }
    match p.temporal_factor() {
            None if g.frames != 1 => {
                return Err(BadPoint {
                    input: PointInput::Frames,
                    problem: format!(
                        "frames = {}: {} is an image model (1 frame; `frames` is for video models)",
                        g.frames,
                        p.name()
                    ),
                })
            }
            Some(t) if g.frames == 0 || !(g.frames - 1).is_multiple_of(t) => {
                return Err(BadPoint {
                    input: PointInput::Frames,
                    problem: format!(
                        "frames = {}: {} decodes {t}k+1 frames (1, {}, {}, ...; the VAE's temporal factor {t})",
                        g.frames,
                        p.name(),
                        t + 1,
                        2 * t + 1
                    ),
                })
            }
            _ => {}
        }
    if g.cfg && !p.has_cfg() {
        return Err(BadPoint {
            input: PointInput::Cfg,
            problem: format!(
                "cfg = true: {} runs without classifier-free guidance (guidance-distilled)",
                p.name()
            ),
        });
    }
    Ok(())
}

/// The input of a point a model refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointInput {
    Resolution,
    Cfg,
    Frames,
    VaeDecode,
    Attention,
}

impl PointInput {
    /// The scenario's `[sweep]` key.
    pub fn key(self) -> &'static str {
        match self {
            PointInput::Resolution => "resolution",
            PointInput::Cfg => "cfg",
            PointInput::Frames => "frames",
            PointInput::VaeDecode => "vae_decode",
            PointInput::Attention => "attention",
        }
    }

    /// `vramlab estimate`'s flag.
    pub fn flag(self) -> &'static str {
        match self {
            PointInput::Resolution => "--resolution",
            PointInput::Cfg => "--cfg",
            PointInput::Frames => "--frames",
            PointInput::VaeDecode => "--vae-decode",
            PointInput::Attention => "--attention",
        }
    }
}

/// A point a model cannot run: which input, and the problem (one line).
#[derive(Clone, Debug, PartialEq)]
pub struct BadPoint {
    pub input: PointInput,
    pub problem: String,
}

/// The published configs of a known model, unloaded, components in `dtype` and the VAE in
/// `vae_dtype` (None: what the real pipeline uses). A model that only `vramlab estimate` knows
/// (no candle modules yet) is a one-line error.
pub fn preset(m: GenModel, dtype: DType, vae_dtype: Option<DType>) -> Result<Box<dyn Pipeline>> {
    use flux::{Flux, FluxConfig};
    use sd::{Sd, SdConfig};
    match m {
        GenModel::Sd15 | GenModel::Sd21 | GenModel::Sdxl => {
            let cfg = SdConfig::preset(m);
            let vae = vae_dtype.unwrap_or_else(|| cfg.default_vae_dtype(dtype));
            Ok(Box::new(Sd::new(cfg, dtype, vae)))
        }
        // FluxPipeline decodes in the pipeline's dtype (no `force_upcast`).
        GenModel::FluxDev | GenModel::FluxSchnell => Ok(Box::new(Flux::new(
            FluxConfig::preset(m),
            dtype,
            vae_dtype.unwrap_or(dtype),
        ))),
        // diffusers' Wan docs load the VAE in f32, the rest in the pipeline's dtype.
        GenModel::Wan21T2v13b => Ok(Box::new(wan::Wan::new(
            wan::WanConfig::t2v_1_3b(),
            dtype,
            vae_dtype.unwrap_or(DType::F32),
        ))),
    }
}

/// diffusers' pipeline classes vramlab reads (`model_index.json`'s `_class_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
// The variants are diffusers' class names as `model_index.json` spells them.
#[allow(clippy::enum_variant_names)]
pub enum PipelineClass {
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    FluxPipeline,
    WanPipeline,
}

impl PipelineClass {
    /// Whether the pipeline runs classifier-free guidance (FLUX.1 is guidance-distilled).
    pub fn has_cfg(self) -> bool {
        self != PipelineClass::FluxPipeline
    }
}

#[derive(Deserialize)]
struct ModelIndex {
    #[serde(rename = "_class_name")]
    class: PipelineClass,
}

/// The pipeline class of a diffusers directory: `model_index.json`'s, or without one, SD for a
/// `unet/` and FLUX for a `transformer/`.
pub fn pipeline_class(dir: &Path) -> Result<PipelineClass> {
    let index = dir.join("model_index.json");
    if index.exists() {
        Ok(read_json::<ModelIndex>(&index)?.class)
    } else if dir.join("unet/config.json").exists() {
        Ok(PipelineClass::StableDiffusionPipeline)
    } else if dir.join("transformer/config.json").exists() {
        Ok(PipelineClass::FluxPipeline)
    } else {
        Err(bad_file(
            dir,
            "not a diffusers directory (no model_index.json, and neither unet/config.json nor transformer/config.json)",
        ))
    }
}

/// The pipeline of a diffusers directory, unloaded, of its [`pipeline_class`].
pub fn from_dir(dir: &Path, dtype: DType, vae_dtype: Option<DType>) -> Result<Box<dyn Pipeline>> {
    use flux::{Flux, FluxConfig};
    use sd::{Sd, SdConfig};
    match pipeline_class(dir)? {
        PipelineClass::StableDiffusionPipeline | PipelineClass::StableDiffusionXLPipeline => {
            let cfg = SdConfig::from_dir(dir)?;
            let vae = vae_dtype.unwrap_or_else(|| cfg.default_vae_dtype(dtype));
            Ok(Box::new(Sd::new(cfg, dtype, vae)))
        }
        PipelineClass::FluxPipeline => {
            let cfg = FluxConfig::from_dir(dir)?;
            Ok(Box::new(Flux::new(cfg, dtype, vae_dtype.unwrap_or(dtype))))
        }
        PipelineClass::WanPipeline => Ok(Box::new(wan::Wan::new(
            wan::WanConfig::from_dir(dir)?,
            dtype,
            vae_dtype.unwrap_or(DType::F32),
        ))),
    }
}

/// Reads a JSON config file into `T`; errors name the file (and the key).
pub fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T> {
    let text = std::fs::read_to_string(p).map_err(|e| bad_file(p, format!("cannot read: {e}")))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad_file(p, format!("not JSON: {e}")))?;
    crate::model::arch::parse_json(p, &v)
}

/// Writes `v` as `dir/<component>/config.json`.
pub fn write_config(dir: &Path, c: Component, v: &impl serde::Serialize) -> Result<()> {
    let d = dir.join(c.as_str());
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    std::fs::write(d.join("config.json"), serde_json::to_string_pretty(v)?)?;
    Ok(())
}

/// The base name of a component's safetensors file in a diffusers directory.
fn weights_base(c: Component) -> &'static str {
    match c {
        Component::TextEncoder | Component::TextEncoder2 => "model",
        _ => "diffusion_pytorch_model",
    }
}

/// The single safetensors file a component is written to (synthetic weights).
pub fn weights_file(dir: &Path, c: Component) -> PathBuf {
    dir.join(c.as_str())
        .join(format!("{}.safetensors", weights_base(c)))
}

/// A component's safetensors files: the shards its index names, or the single file.
pub fn weights_files(dir: &Path, c: Component) -> Result<Vec<PathBuf>> {
    crate::model::weights::safetensors_files_named(&dir.join(c.as_str()), weights_base(c))
}

/// Every component's files (the manifest's weight hash).
pub fn all_weights_files(p: &dyn Pipeline, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for c in p.components() {
        v.extend(weights_files(dir, c)?);
    }
    Ok(v)
}

/// candle's mmaped-safetensors VarBuilder over a component's files, in `dtype` (each tensor is
/// copied out of the map, cast on the way).
pub fn var_builder(
    dir: &Path,
    c: Component,
    dtype: DType,
    dev: &Device,
) -> Result<VarBuilder<'static>> {
    let files = weights_files(dir, c)?;
    // SAFETY: the files are not modified while mapped (the synthetic cache is written to a
    // temporary name and renamed; a real checkpoint is read-only input).
    unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, dev) }
        .with_context(|| format!("reading {}", files[0].display()))
}

/// Writes a diffusers directory of `p` with synthetic weights, each component in its dtype
/// (components already written are kept: each file appears under its name only when
/// complete).
pub fn write_synthetic(p: &dyn Pipeline, dir: &Path) -> Result<()> {
    p.write_configs(dir)?;
    for c in p.components() {
        let file = weights_file(dir, c);
        if !file.exists() {
            crate::model::synth::write_tensors(
                p.shapes(c),
                p.dtype(c),
                crate::model::synth::SEED,
                &file,
            )?;
        }
    }
    Ok(())
}

/// The spatial decode of `z` (b, c, h, w), or of a video's (b, c, t, h, w), into
/// [`Pipeline::decoded_shape`]: `full` (the batch at once), `sliced` (one image or video at a
/// time into the preallocated output) or `tiled` (overlapping latent tiles over the last two
/// dims, each decoded whole, every frame of a video, one at a time and blended into a row strip
/// with a linear ramp over the overlap, each strip blended into the preallocated output).
pub fn decode_spatial<P: Pipeline + ?Sized>(p: &P, z: &Tensor, g: &GenShape) -> Result<Tensor> {
    let dims = z.dims();
    let (hd, wd) = (z.rank() - 2, z.rank() - 1);
    let (b, h, w) = (dims[0], dims[hd], dims[wd]);
    let s = p.vae_scale();
    let shape = p.decoded_shape(dims);
    match g.vae_decode {
        VaeDecode::Full => p.vae_decode(z),
        VaeDecode::Sliced => {
            let out = Tensor::zeros(shape, z.dtype(), z.device())?;
            for i in 0..b {
                let img = p.vae_decode(&z.narrow(0, i, 1)?)?;
                out.slice_set(&img, 0, i)?;
            }
            Ok(out)
        }
        VaeDecode::Tiled => {
            let (tile, overlap) = (g.tile / s, g.overlap / s);
            let out = Tensor::zeros(shape.as_slice(), z.dtype(), z.device())?;
            let ys = tile_starts(h, tile, tile - overlap);
            let xs = tile_starts(w, tile, tile - overlap);
            let (th, tw) = (tile.min(h), tile.min(w));
            let mut strip_shape = shape;
            strip_shape[hd] = th * s;
            for (iy, &y) in ys.iter().enumerate() {
                let strip = Tensor::zeros(strip_shape.as_slice(), z.dtype(), z.device())?;
                for (ix, &x) in xs.iter().enumerate() {
                    let part = z.narrow(hd, y, th)?.narrow(wd, x, tw)?.contiguous()?;
                    let mut img = p.vae_decode(&part)?;
                    drop(part);
                    if ix > 0 {
                        let ov = (xs[ix - 1] + tw - x) * s;
                        let old = strip.narrow(wd, x * s, ov)?;
                        let new = img.narrow(wd, 0, ov)?;
                        let blended = blend(&old, &new, wd)?;
                        img = Tensor::cat(&[&blended, &img.narrow(wd, ov, tw * s - ov)?], wd)?;
                    }
                    strip.slice_set(&img, wd, x * s)?;
                }
                if iy > 0 {
                    let ov = (ys[iy - 1] + th - y) * s;
                    let old = out.narrow(hd, y * s, ov)?;
                    let new = strip.narrow(hd, 0, ov)?;
                    let blended = blend(&old, &new, hd)?.contiguous()?;
                    strip.slice_set(&blended, hd, 0)?;
                }
                out.slice_set(&strip, hd, y * s)?;
            }
            Ok(out)
        }
    }
}

/// Starts of tiles of `tile` along `len` every `stride`, the last one flush with the end.
pub fn tile_starts(len: usize, tile: usize, stride: usize) -> Vec<usize> {
    if len <= tile {
        return vec![0];
    }
    let mut v = Vec::new();
    let mut x = 0;
    while x + tile < len {
        v.push(x);
        x += stride;
    }
    v.push(len - tile);
    v
}

/// `old·(1−r) + new·r` with r ramping from 0 to 1 along `dim` (the overlap of two tiles).
fn blend(old: &Tensor, new: &Tensor, dim: usize) -> Result<Tensor> {
    let n = old.dim(dim)?;
    let ramp: Vec<f32> = (0..n).map(|i| (i as f32 + 0.5) / n as f32).collect();
    let mut shape = vec![1usize; old.rank()];
    shape[dim] = n;
    let r = Tensor::from_vec(ramp, shape, old.device())?.to_dtype(old.dtype())?;
    let keep = (1.0 - &r)?;
    Ok((old.broadcast_mul(&keep)? + new.broadcast_mul(&r)?)?)
}

/// Writes `model_index.json` with diffusers' pipeline class name (what [`from_dir`] reads).
pub fn write_model_index(dir: &Path, class: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let v = serde_json::json!({ "_class_name": class });
    std::fs::write(
        dir.join("model_index.json"),
        serde_json::to_string_pretty(&v)?,
    )?;
    Ok(())
}

/// Parameters of a shape list.
pub fn count(shapes: &Shapes) -> u64 {
    shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum()
}

/// A [`SimpleBackend`] that records every requested tensor and hands out a broadcast zero
/// scalar of its shape (no memory): building a candle module over it lists its parameters.
/// A name requested twice is one stored tensor: candle's VAE attention (`get_qkv_linear`)
/// reads each projection's weight once to probe its layout, then again to build the linear.
struct Recorder(Arc<Mutex<Shapes>>);

impl SimpleBackend for Recorder {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut seen = self.0.lock().expect("recorder lock");
        if !seen.iter().any(|(n, _)| n == name) {
            seen.push((name.to_string(), s.dims().to_vec()));
        }
        Tensor::zeros((), dtype, dev)?.broadcast_as(s)
    }
    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("shape recorder: `{name}` requested without a shape")
    }
    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

/// The tensors `build` requests of a [`VarBuilder`], in order: a module's stored shapes.
pub fn record(build: impl FnOnce(VarBuilder) -> candle_core::Result<()>) -> Shapes {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let vb = VarBuilder::from_backend(Box::new(Recorder(seen.clone())), DType::F32, Device::Cpu);
    build(vb).expect("building a module over the shape recorder");
    let v = seen.lock().expect("recorder lock").clone();
    v
}
