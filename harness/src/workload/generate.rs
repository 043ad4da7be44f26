//! Image generation (mode = "generate", DESIGN.md §12): a pipeline's components loaded one at a
//! time (a `load` row each), the text encoders (`text_encode`), the denoising loop (a
//! `denoise` row per step) and the VAE decode (`vae_decode`), then a `total` row naming the
//! phase that holds the point's peak.
//!
//! The decode runs `full` (the batch at once), `sliced` (one image at a time into the
//! preallocated output) or `tiled` (overlapping latent tiles decoded one at a time, each
//! blended into a row strip with a linear ramp over the overlap, each strip blended into the
//! preallocated output).
use crate::error::bad_file;
use crate::meter::{Meter, PhaseMemory};
use crate::model::sd::{Sd, SdConfig};
use crate::record::{Phase, Record, Status, SCHEMA_VERSION};
use crate::scenario::{short_hash, Spec};
use crate::vocab::{
    Attention, Backend, Component, GenModel, Mode, Optimizer, Precision, Resolution, VaeDecode,
};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// The shape of one generation point.
#[derive(Clone, Debug, PartialEq)]
pub struct GenShape {
    pub batch: usize,
    pub resolution: Resolution,
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

/// What a generation point measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub text_encode: (PhaseMemory, f64),
    pub denoise: Vec<(PhaseMemory, f64)>,
    pub vae_decode: (PhaseMemory, f64),
    /// Bytes of the decoded images (b, 3, H, W) in the VAE's dtype.
    pub output_bytes: u64,
}

/// candle's sliced attention size for the UNet: `sliced` slices the heads by half a block's
/// head count (candle's automatic setting, `Some(0)`); `eager` attends all heads at once.
pub fn sliced_size(a: Attention) -> Result<Option<usize>> {
    match a {
        Attention::Eager => Ok(None),
        Attention::Sliced => Ok(Some(0)),
        other => anyhow::bail!(
            "attention `{other}` is not available for generation yet (eager or sliced)"
        ),
    }
}

/// Loads every component of `dir` into `sd`, each as its own measured `load` phase.
pub fn load(
    sd: &mut Sd,
    dir: &Path,
    attention: Attention,
    dev: &Device,
    meter: &mut dyn Meter,
) -> Result<Vec<(Component, PhaseMemory, f64)>> {
    let sliced = sliced_size(attention)?;
    let mut rows = Vec::new();
    for c in sd.config.components() {
        let ((), mem, ms) = super::phase(meter, Phase::Load, || sd.load(dir, c, sliced, dev))?;
        rows.push((c, mem, ms));
    }
    Ok(rows)
}

/// Token ids of `n` prompts of the text encoder's full length (BOS, then ids in range).
fn prompt_ids(sd: &Sd, n: usize, dev: &Device) -> Result<Tensor> {
    let (s, v) = (
        sd.config.text_len(),
        sd.config.text_encoder.vocab_size as u32,
    );
    let ids: Vec<u32> = (0..n * s).map(|i| (i as u32 * 7 + 1) % v).collect();
    Ok(Tensor::from_vec(ids, (n, s), dev)?)
}

/// Runs the measured phases of one point on a loaded pipeline.
pub fn run(sd: &Sd, g: &GenShape, dev: &Device, meter: &mut dyn Meter) -> Result<Measured> {
    let mut out = Measured::default();
    let nb = g.denoise_batch();
    let ids = prompt_ids(sd, nb, dev)?;
    let (context, mem, ms) = super::phase(meter, Phase::TextEncode, || sd.encode_text(&ids))?;
    drop(ids);
    out.text_encode = (mem, ms);

    let scale = sd.config.vae.scale();
    let (h, w) = (g.resolution.height / scale, g.resolution.width / scale);
    let lat_ch = sd.config.unet.in_channels;
    let latents =
        RefCell::new(Tensor::randn(0f32, 1f32, (g.batch, lat_ch, h, w), dev)?.to_dtype(sd.dtype)?);
    for i in 0..g.steps {
        // A DDIM-like update at evenly spaced timesteps: the memory of a step is the UNet's.
        let t = 999.0 * (1.0 - i as f64 / g.steps as f64);
        let ((), mem, ms) = super::phase(meter, Phase::Denoise, || {
            let lat = latents.borrow().clone();
            let input = if g.cfg {
                Tensor::cat(&[&lat, &lat], 0)?
            } else {
                lat.clone()
            };
            let noise = sd.unet(&input, t, &context)?;
            drop(input);
            let noise = if g.cfg {
                let u = noise.narrow(0, 0, g.batch)?;
                let c = noise.narrow(0, g.batch, g.batch)?;
                (&u + ((c - &u)? * 7.5)?)?
            } else {
                noise
            };
            *latents.borrow_mut() = (lat - (noise * 0.1)?)?;
            Ok(())
        })?;
        out.denoise.push((mem, ms));
    }
    drop(context);
    let latents = latents.into_inner();
    let (image, mem, ms) = super::phase(meter, Phase::VaeDecode, || {
        let z = (&latents / sd.config.vae.scaling_factor)?.to_dtype(sd.vae_dtype)?;
        decode(sd, &z, g)
    })?;
    out.output_bytes = (image.elem_count() * image.dtype().size_in_bytes()) as u64;
    out.vae_decode = (mem, ms);
    Ok(out)
}

/// Decodes latents `z` (b, c, h, w) as `g.vae_decode` says; returns (b, 3, H, W).
pub fn decode(sd: &Sd, z: &Tensor, g: &GenShape) -> Result<Tensor> {
    let (b, _, h, w) = z.dims4()?;
    let s = sd.config.vae.scale();
    let ch = sd.config.vae.out_channels;
    match g.vae_decode {
        VaeDecode::Full => sd.vae_decode(z),
        VaeDecode::Sliced => {
            let out = Tensor::zeros((b, ch, h * s, w * s), z.dtype(), z.device())?;
            for i in 0..b {
                let img = sd.vae_decode(&z.narrow(0, i, 1)?)?;
                out.slice_set(&img, 0, i)?;
            }
            Ok(out)
        }
        VaeDecode::Tiled => {
            let (tile, overlap) = (g.tile / s, g.overlap / s);
            let out = Tensor::zeros((b, ch, h * s, w * s), z.dtype(), z.device())?;
            let ys = tile_starts(h, tile, tile - overlap);
            let xs = tile_starts(w, tile, tile - overlap);
            let (th, tw) = (tile.min(h), tile.min(w));
            for (iy, &y) in ys.iter().enumerate() {
                let strip = Tensor::zeros((b, ch, th * s, w * s), z.dtype(), z.device())?;
                for (ix, &x) in xs.iter().enumerate() {
                    let part = z.narrow(2, y, th)?.narrow(3, x, tw)?.contiguous()?;
                    let mut img = sd.vae_decode(&part)?;
                    drop(part);
                    if ix > 0 {
                        let ov = (xs[ix - 1] + tw - x) * s;
                        let old = strip.narrow(3, x * s, ov)?;
                        let new = img.narrow(3, 0, ov)?;
                        let blended = blend(&old, &new, 3)?;
                        img = Tensor::cat(&[&blended, &img.narrow(3, ov, tw * s - ov)?], 3)?;
                    }
                    strip.slice_set(&img, 3, x * s)?;
                }
                if iy > 0 {
                    let ov = (ys[iy - 1] + th - y) * s;
                    let old = out.narrow(2, y * s, ov)?;
                    let new = strip.narrow(2, 0, ov)?;
                    let blended = blend(&old, &new, 2)?.contiguous()?;
                    strip.slice_set(&blended, 2, 0)?;
                }
                out.slice_set(&strip, 2, y * s)?;
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

    pub fn kind(&self) -> &'static str {
        match self {
            GenSource::Synthetic(_) => "synthetic",
            GenSource::Diffusers(_) => "safetensors",
        }
    }

    /// The config and the diffusers directory to load; synthetic weights are written (once,
    /// in `dtype`, under `$VRAMLAB_MODELS/synthetic-gen/`) first.
    pub fn prepare(&self, dtype: DType, vae_dtype: DType) -> Result<(SdConfig, PathBuf)> {
        match self {
            GenSource::Diffusers(dir) => Ok((SdConfig::from_dir(dir)?, dir.clone())),
            GenSource::Synthetic(m) => {
                let cfg = SdConfig::preset(*m);
                let root = PathBuf::from(
                    crate::model::source::expand_env("${VRAMLAB_MODELS}")
                        .map_err(crate::error::InputError::arg)?,
                );
                let dir = root.join("synthetic-gen").join(format!(
                    "{}-{}-vae-{}",
                    m.as_str(),
                    dtype.as_str(),
                    vae_dtype.as_str()
                ));
                write_synthetic(&cfg, &dir, dtype, vae_dtype)?;
                Ok((cfg, dir))
            }
        }
    }
}

/// Writes `cfg`'s diffusers directory with synthetic weights (components already written are
/// kept: each file appears under its name only when complete).
pub fn write_synthetic(cfg: &SdConfig, dir: &Path, dtype: DType, vae_dtype: DType) -> Result<()> {
    cfg.write_configs(dir)?;
    for c in cfg.components() {
        let file = SdConfig::weights_file(dir, c);
        if !file.exists() {
            let dt = if c == Component::Vae {
                vae_dtype
            } else {
                dtype
            };
            crate::model::synth::write_tensors(
                cfg.shapes(c),
                dt,
                crate::model::synth::SEED,
                &file,
            )?;
        }
    }
    Ok(())
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// One expanded generation point.
#[derive(Clone, Debug, PartialEq)]
pub struct GenPoint {
    pub id: String,
    pub source: String,
    pub model_id: String,
    pub precision: Precision,
    /// None: the model's default.
    pub vae_precision: Option<Precision>,
    pub attention: Attention,
    pub shape: GenShape,
    pub repeat: usize,
}

/// The generation points of a scenario, in table order (model, precision, attention,
/// resolution, batch, cfg, decode, VAE precision).
pub fn expand(spec: &Spec) -> Vec<GenPoint> {
    let mut v = Vec::new();
    for s in spec
        .sweep
        .0
        .iter()
        .filter(|s| s.mode.contains(&Mode::Generate))
    {
        let sources = s.source.as_ref().unwrap_or(&spec.model.source).to_vec();
        let vae_p: Vec<Option<Precision>> = if s.vae_precision.is_empty() {
            vec![None]
        } else {
            s.vae_precision.iter().copied().map(Some).collect()
        };
        for src in &sources {
            let model_id = src.rsplit([':', '/']).next().unwrap_or(src).to_string();
            for &precision in &s.precision {
                for &attention in &s.attention {
                    for &resolution in &s.resolution {
                        for &batch in &s.batch {
                            for &cfg in &s.cfg {
                                for &vae_decode in &s.vae_decode {
                                    for &vp in &vae_p {
                                        for repeat in 0..s.repeats {
                                            let mut id = format!(
                                                "{model_id}/generate/{precision}/{resolution}/b{batch}/{}/{vae_decode}",
                                                if cfg { "cfg" } else { "nocfg" }
                                            );
                                            if vae_decode == VaeDecode::Tiled {
                                                id += &format!("-t{}o{}", s.tile, s.overlap);
                                            }
                                            if let Some(p) = vp {
                                                id += &format!("/vae-{p}");
                                            }
                                            if attention != Attention::Eager {
                                                id += &format!("/{attention}");
                                            }
                                            if s.repeats > 1 {
                                                id += &format!("/r{repeat}");
                                            }
                                            v.push(GenPoint {
                                                id,
                                                source: src.clone(),
                                                model_id: model_id.clone(),
                                                precision,
                                                vae_precision: vp,
                                                attention,
                                                shape: GenShape {
                                                    batch: batch as usize,
                                                    resolution,
                                                    cfg,
                                                    steps: s.denoise_steps,
                                                    vae_decode,
                                                    tile: s.tile,
                                                    overlap: s.overlap,
                                                },
                                                repeat,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

/// Checks every point's model before measuring: one line naming the key and exit 2.
fn check(path: &Path, points: &[GenPoint]) -> Result<()> {
    for p in points {
        let src = GenSource::parse(&p.source)
            .map_err(|e| bad_file(path, format!("[model] source: {e}")))?;
        let cfg = match &src {
            GenSource::Synthetic(m) => SdConfig::preset(*m),
            GenSource::Diffusers(d) => SdConfig::from_dir(d)?,
        };
        if p.shape.cfg && !cfg.has_cfg() {
            return Err(bad_file(
                path,
                format!(
                    "[sweep] cfg = true: {} runs without classifier-free guidance",
                    p.model_id
                ),
            ));
        }
    }
    Ok(())
}

/// `vramlab sweep` of a scenario whose tables are all `mode = "generate"`: measures each point
/// in this process (components loaded per point), writes each row as it is measured, and the
/// manifest beside the CSV. A point that fails is recorded `error` and the sweep goes on.
pub fn sweep(scenario: &Path, spec: &Spec, text: &str, out: &Path, dry_run: bool) -> Result<()> {
    use crate::export::csv::CsvExporter;
    use crate::export::manifest::{Host, Manifest, Versions};
    use crate::export::Exporter;
    let points = expand(spec);
    if dry_run {
        for p in &points {
            println!("{}", p.id);
        }
        return Ok(());
    }
    check(scenario, &points)?;
    if spec.device != "cpu" {
        crate::device::probe(&spec.device)?;
    }
    let (dev, mut meter) = crate::device::open(&spec.device)?;
    let scenario_hash = short_hash(text.as_bytes());
    let started_at = now();
    let run_id = format!(
        "{}-{:08x}",
        started_at.replace([':', '-'], ""),
        std::process::id()
    );
    let device_name = crate::device::name(&dev);
    let backend = if dev.is_cpu() {
        Backend::Cpu
    } else {
        Backend::Cuda
    };
    let mut exporter = CsvExporter::create(out)?;
    let mut manifest = Manifest {
        schema_version: SCHEMA_VERSION,
        run_id: run_id.clone(),
        started_at,
        finished_at: None,
        csv: out.to_path_buf(),
        scenario_path: scenario.to_path_buf(),
        scenario_hash: scenario_hash.clone(),
        scenario_text: text.to_string(),
        backend,
        device: spec.device.clone(),
        device_name: device_name.clone(),
        gpu: None,
        pool: serde_json::json!(null),
        runtime: format!("candle-{}", env!("VRAMLAB_CANDLE")),
        versions: Versions::current(),
        host: Host::current(),
        weights: Vec::new(),
        points: points.len(),
        shard: None,
        shards: Vec::new(),
        capacity_bytes: None,
        status_counts: Default::default(),
        workers_started: 0,
    };
    manifest.write()?;
    eprintln!(
        "sweep {}: {} generation points -> {}",
        spec.name,
        points.len(),
        out.display()
    );
    for (i, p) in points.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, points.len(), p.id);
        let src = GenSource::parse(&p.source).map_err(crate::error::InputError::arg)?;
        let dtype = p.precision.dtype();
        let preset = match &src {
            GenSource::Synthetic(m) => SdConfig::preset(*m),
            GenSource::Diffusers(d) => SdConfig::from_dir(d)?,
        };
        let vae_dtype = p
            .vae_precision
            .map(|p| p.dtype())
            .unwrap_or_else(|| preset.default_vae_dtype(dtype));
        let (cfg, dir) = src.prepare(dtype, vae_dtype)?;
        if !manifest.weights.iter().any(|w| w.source == p.source) {
            let files: Vec<PathBuf> = cfg
                .components()
                .into_iter()
                .map(|c| SdConfig::weights_file(&dir, c))
                .collect();
            let (sha256, bytes) = crate::export::manifest::hash_files(&files)?;
            manifest.weights.push(crate::export::manifest::WeightInfo {
                model_id: p.model_id.clone(),
                source: p.source.clone(),
                files,
                bytes,
                sha256,
                sha256_cached: false,
            });
            manifest.write()?;
        }
        let base = Record {
            schema_version: SCHEMA_VERSION,
            run_id: run_id.clone(),
            point_id: p.id.clone(),
            started_at: now(),
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("VRAMLAB_GIT_REV").into(),
            backend,
            device_name: device_name.clone(),
            candle_version: env!("VRAMLAB_CANDLE").into(),
            model_id: p.model_id.clone(),
            architecture: "stable-diffusion".into(),
            param_count: cfg.components().iter().map(|&c| cfg.params(c)).sum(),
            weight_source: src.kind().into(),
            mode: Mode::Generate,
            precision: p.precision,
            batch: p.shape.batch as u64,
            context: cfg.text_len() as u64,
            optimizer: Optimizer::None,
            attention: p.attention,
            resolution: Some(p.shape.resolution),
            cfg: Some(p.shape.cfg),
            vae_decode: Some(p.shape.vae_decode),
            vae_precision: Some(Precision::of_dense(vae_dtype)),
            scenario_hash: scenario_hash.clone(),
            meter: meter.kind(),
            ..Default::default()
        };
        meter.trim()?;
        let rows = measure_point(&cfg, &dir, p, dtype, vae_dtype, &dev, meter.as_mut(), &base);
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let phase = crate::supervisor::running_phase();
                vec![Record {
                    phase: Some(phase),
                    status: Some(Status::Error),
                    message: crate::error::one_line(&e),
                    ..base.clone()
                }]
            }
        };
        for r in &rows {
            exporter.write(r)?;
        }
        let st = rows.last().and_then(|r| r.status).unwrap_or(Status::Error);
        *manifest
            .status_counts
            .entry(st.as_str().to_string())
            .or_default() += 1;
        manifest.write()?;
    }
    manifest.finished_at = Some(now());
    manifest.write()?;
    Ok(())
}

/// Loads the pipeline and runs one point: its rows (loads, text encode, steps, decode, total).
#[allow(clippy::too_many_arguments)]
fn measure_point(
    cfg: &SdConfig,
    dir: &Path,
    p: &GenPoint,
    dtype: DType,
    vae_dtype: DType,
    dev: &Device,
    meter: &mut dyn Meter,
    base: &Record,
) -> Result<Vec<Record>> {
    let mut sd = Sd::new(cfg.clone(), dtype, vae_dtype);
    let loads = load(&mut sd, dir, p.attention, dev, meter)?;
    let m = run(&sd, &p.shape, dev, meter)?;
    let el_size = |c: Component| {
        if c == Component::Vae {
            vae_dtype.size_in_bytes()
        } else {
            dtype.size_in_bytes()
        }
    };
    let weights: u64 = cfg
        .components()
        .iter()
        .map(|&c| cfg.params(c) * el_size(c) as u64)
        .sum();
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
        r.feature_weight_bytes = Some(cfg.params(*c) * el_size(*c) as u64);
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
