//! Image generation (mode = "generate", docs/src/guides/generation.md): a pipeline's components
//! loaded one at a time (a `load` row each), the text encoders (`text_encode`), the denoising loop
//! (a `denoise` row per step) and the VAE decode (`vae_decode`), then a `total` row naming the
//! phase that holds the point's peak.
//!
//! The decode runs `full` (the batch at once), `sliced` (one image at a time into the
//! preallocated output) or `tiled` (overlapping latent tiles decoded one at a time, each
//! blended into a row strip with a linear ramp over the overlap, each strip blended into the
//! preallocated output).
use crate::meter::{Meter, PhaseMemory};
use crate::model::diffusion::Pipeline;
pub use crate::model::diffusion::{
    decode_spatial as decode, tile_starts, write_synthetic, GenShape,
};
use crate::record::{Phase, Record, Status};
use crate::scenario::gen_points::GenPoint;
use crate::vocab::{Attention, Component};
use anyhow::Result;
use candle_core::{Device, Tensor};
use std::cell::RefCell;
use std::path::Path;

/// What a generation point measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub text_encode: (PhaseMemory, f64),
    pub denoise: Vec<(PhaseMemory, f64)>,
    pub vae_decode: (PhaseMemory, f64),
    /// Bytes of the decoded images (b, 3, H, W), or videos (b, 3, frames, H, W), in the VAE's
    /// dtype.
    pub output_bytes: u64,
}

/// Loads every component of `dir` into `p`, each as its own measured `load` phase.
pub fn load(
    p: &mut dyn Pipeline,
    dir: &Path,
    attention: Attention,
    dev: &Device,
    meter: &mut dyn Meter,
) -> Result<Vec<(Component, PhaseMemory, f64)>> {
    let mut rows = Vec::new();
    for c in p.components() {
        let ((), mem, ms) = super::phase(meter, Phase::Load, || p.load(dir, c, attention, dev))?;
        rows.push((c, mem, ms));
    }
    Ok(rows)
}

/// Runs the measured phases of one point on a loaded pipeline.
pub fn run(
    p: &dyn Pipeline,
    g: &GenShape,
    dev: &Device,
    meter: &mut dyn Meter,
) -> Result<Measured> {
    let mut out = Measured::default();
    let ids = p.prompt_ids(g.denoise_batch(), dev)?;
    let (cond, mem, ms) = super::phase(meter, Phase::TextEncode, || p.encode_text(&ids, g.cfg))?;
    drop(ids);
    out.text_encode = (mem, ms);

    let shape = p.latent_shape(g.resolution, g.batch, g.frames);
    let latents =
        RefCell::new(Tensor::randn(0f32, 1f32, shape, dev)?.to_dtype(p.dtype(p.denoiser()))?);
    for i in 0..g.steps {
        let ((), mem, ms) = super::phase(meter, Phase::Denoise, || {
            let lat = latents.borrow().clone();
            *latents.borrow_mut() = p.denoise_step(&lat, i, g.steps, &cond, g.cfg)?;
            Ok(())
        })?;
        out.denoise.push((mem, ms));
    }
    drop(cond);
    let latents = latents.into_inner();
    let (image, mem, ms) = super::phase(meter, Phase::VaeDecode, || {
        let z = p.vae_latents(&latents)?;
        p.decode(&z, g)
    })?;
    out.output_bytes = (image.elem_count() * image.dtype().size_in_bytes()) as u64;
    out.vae_decode = (mem, ms);
    Ok(out)
}

/// Loads the pipeline and runs one point: its rows (loads, text encode, steps, decode, total).
pub fn measure_point(
    pipe: &mut dyn Pipeline,
    dir: &Path,
    p: &GenPoint,
    dev: &Device,
    meter: &mut dyn Meter,
    base: &Record,
) -> Result<Vec<Record>> {
    let loads = load(pipe, dir, p.attention, dev, meter)?;
    let m = run(pipe, &p.shape, dev, meter)?;
    let bytes = |c: Component| pipe.params(c) * pipe.dtype(c).size_in_bytes() as u64;
    let weights: u64 = pipe.components().into_iter().map(bytes).sum();
    let row = |phase: Phase, mem: &PhaseMemory, ms: f64| {
        let mut r = Record {
            phase: Some(phase),
            elapsed_ms: Some(ms),
            status: Some(Status::Ok),
            feature_weight_bytes: Some(weights),
            ..base.clone()
        };
        r.set_memory(mem);
        r
    };
    let mut rows = Vec::new();
    for (c, mem, ms) in &loads {
        let mut r = row(Phase::Load, mem, *ms);
        r.component = Some(*c);
        // The component's own dtype (the point's `precision` and `vae_precision` name two).
        r.message = format!("dtype={}", pipe.dtype(*c).as_str());
        r.feature_weight_bytes = Some(bytes(*c));
        rows.push(r);
    }
    rows.push(row(Phase::TextEncode, &m.text_encode.0, m.text_encode.1));
    for (i, (mem, ms)) in m.denoise.iter().enumerate() {
        let mut r = row(Phase::Denoise, mem, *ms);
        r.step = Some(i as u64 + 1);
        rows.push(r);
    }
    let mut r = row(Phase::VaeDecode, &m.vae_decode.0, m.vae_decode.1);
    r.message = format!("output_bytes={}", m.output_bytes);
    rows.push(r);
    let all: Vec<PhaseMemory> = rows
        .iter()
        .map(|r| PhaseMemory {
            baseline_allocated: r.baseline_allocated.unwrap_or(0),
            peak_allocated: r.peak_allocated.unwrap_or(0),
            end_allocated: r.end_allocated.unwrap_or(0),
            baseline_reserved: r.baseline_reserved.unwrap_or(0),
            peak_reserved: r.peak_reserved.unwrap_or(0),
            device_used: r.device_used.unwrap_or(0),
            non_pool: r.non_pool.unwrap_or(0),
        })
        .collect();
    let peak_phase = rows
        .iter()
        .max_by_key(|r| r.peak_allocated.unwrap_or(0))
        .and_then(|r| r.phase);
    let total_ms = rows.iter().filter_map(|r| r.elapsed_ms).sum();
    let mut t = row(
        Phase::Total,
        &PhaseMemory::span(&all[0], &all[1..]),
        total_ms,
    );
    t.peak_phase = peak_phase;
    rows.push(t);
    Ok(rows)
}
