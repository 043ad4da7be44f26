//! Image generation (mode = "generate", docs/src/guides/generation.md): a pipeline's components
//! loaded one at a time (a `load` row each), the text encoders (`text_encode`), the denoising loop
//! (a `denoise` row per step) and the VAE decode (`vae_decode`), then a `total` row naming the
//! phase that holds the point's peak.
//!
//! The decode runs `full` (the batch at once), `sliced` (one image at a time into the
//! preallocated output) or `tiled` (overlapping latent tiles decoded one at a time, each
//! blended into a row strip with a linear ramp over the overlap, each strip blended into the
//! preallocated output).
use crate::error::bad_file;
use crate::meter::{Meter, PhaseMemory};
use crate::model::diffusion::{self as pipeline, Pipeline};
pub use crate::model::diffusion::{
    decode_spatial as decode, tile_starts, write_synthetic, GenShape,
};
use crate::record::{Phase, Record, Status, SCHEMA_VERSION};
use crate::scenario::{short_hash, Spec};
use crate::vocab::{
    Attention, Backend, Component, GenModel, Mode, Optimizer, Precision, VaeDecode,
};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

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
            GenSource::Diffusers(dir) => {
                pipeline::pipeline_class(dir).map_or(true, |c| c.has_cfg())
            }
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
            GenSource::Synthetic(m) => pipeline::preset(*m, dtype, vae_dtype),
            GenSource::Diffusers(dir) => pipeline::from_dir(dir, dtype, vae_dtype),
        }
    }

    /// The diffusers directory to load `p` from; synthetic weights are written (once, under
    /// `$VRAMLAB_MODELS/synthetic-gen/`, in `p`'s dtypes) first.
    pub fn prepare(&self, p: &dyn Pipeline) -> Result<PathBuf> {
        match self {
            GenSource::Diffusers(dir) => Ok(dir.clone()),
            GenSource::Synthetic(m) => {
                let root = PathBuf::from(
                    crate::model::source::expand_env("${VRAMLAB_MODELS}")
                        .map_err(crate::error::InputError::arg)?,
                );
                let dir = root.join("synthetic-gen").join(format!(
                    "{}-{}-vae-{}",
                    m.as_str(),
                    p.dtype(p.denoiser()).as_str(),
                    p.dtype(Component::Vae).as_str()
                ));
                write_synthetic(p, &dir)?;
                Ok(dir)
            }
        }
    }
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
    /// The index of the `[sweep]` table the point comes from (for error lines).
    pub table: usize,
}

/// The generation points of a scenario, in table order (model, precision, attention,
/// resolution, frames, batch, cfg, decode, VAE precision). Ids name the frames (`/f9`) when
/// the table sets `frames`.
pub fn expand(spec: &Spec) -> Vec<GenPoint> {
    let mut v = Vec::new();
    for (table, s) in spec
        .sweep
        .0
        .iter()
        .enumerate()
        .filter(|(_, s)| s.mode.contains(&Mode::Generate))
    {
        let sources = s.source.as_ref().unwrap_or(&spec.model.source).to_vec();
        let vae_p: Vec<Option<Precision>> = if s.vae_precision.is_empty() {
            vec![None]
        } else {
            s.vae_precision.iter().copied().map(Some).collect()
        };
        for src in &sources {
            let default_cfg = GenSource::parse(src).map_or(true, |g| g.default_cfg());
            let model_id = src.rsplit([':', '/']).next().unwrap_or(src).to_string();
            for &precision in &s.precision {
                for &attention in &s.attention {
                    for &resolution in &s.resolution {
                        for &frames in s.frames.as_deref().unwrap_or(&[1]) {
                            for &batch in &s.batch {
                                for &cfg in s.cfg.as_deref().unwrap_or(&[default_cfg]) {
                                    for &vae_decode in &s.vae_decode {
                                        for &vp in &vae_p {
                                            for repeat in 0..s.repeats {
                                                let f = match s.frames {
                                                    Some(_) => format!("/f{frames}"),
                                                    None => String::new(),
                                                };
                                                let mut id = format!(
                                                "{model_id}/generate/{precision}/{resolution}{f}/b{batch}/{}/{vae_decode}",
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
                                                        frames,
                                                        cfg,
                                                        steps: s.denoise_steps,
                                                        vae_decode,
                                                        tile: s.tile,
                                                        overlap: s.overlap,
                                                    },
                                                    repeat,
                                                    table,
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
    }
    v
}

/// Checks every point against its model before measuring (the resolution's factor, frames,
/// CFG, the decode, the attention; a video model needs `frames`): one line naming the file,
/// the line and the key, exit 2.
fn check(path: &Path, text: &str, spec: &Spec, points: &[GenPoint]) -> Result<()> {
    use crate::model::diffusion::{BadPoint, PointInput};
    for p in points {
        let src = GenSource::parse(&p.source)
            .map_err(|e| bad_file(path, format!("[model] source: {e}")))?;
        let pipe = src.pipeline(p.precision.dtype(), p.vae_precision.map(|v| v.dtype()))?;
        let frames_set = spec.sweep.0[p.table].frames.is_some();
        let missing_frames = match pipe.temporal_factor() {
            Some(t) if !frames_set => Err(BadPoint {
                input: PointInput::Frames,
                problem: format!(
                    "`frames` is missing: {} is a video model (frames {t}k+1, e.g. [{}, {}])",
                    pipe.name(),
                    t + 1,
                    2 * t + 1
                ),
            }),
            _ => Ok(()),
        };
        let checked = missing_frames
            .and_then(|()| pipe.check(&p.shape))
            .and_then(|()| pipe.check_attention(p.attention));
        if let Err(e) = checked {
            let msg = format!("[sweep] {}", e.problem);
            return Err(
                match crate::scenario::spec::key_line(text, p.table, e.input.key()) {
                    Some(line) => bad_file(path, format!("line {line}: {msg}")),
                    None => bad_file(path, msg),
                },
            );
        }
    }
    Ok(())
}

/// `vramlab sweep` of a scenario whose tables are all `mode = "generate"`: measures each point
/// in this process (components loaded per point), writes each row as it is measured, and the
/// manifest beside the CSV. A point that fails is recorded `error` and the sweep goes on.
/// Runs a generation scenario's points into `out`. `open` opens the output once the scenario
/// is checked (creating it, or resuming it): it returns the ids of the points already finished
/// there, which are skipped.
pub fn sweep(s: &SweepIn, open: &OpenOutput) -> Result<()> {
    let points = expand(s.spec);
    let ids: Vec<String> = points.iter().map(|p| p.id.clone()).collect();
    run_points(
        s,
        &ids,
        || check(s.scenario, s.text, s.spec, &points),
        open,
        |i, run| {
            let p = &points[i];
            let src = GenSource::parse(&p.source).map_err(crate::error::InputError::arg)?;
            // A fresh (unloaded) pipeline per point: its weights go when the point ends.
            let mut pipe = src.pipeline(p.precision.dtype(), p.vae_precision.map(|v| v.dtype()))?;
            let dir = src.prepare(pipe.as_ref())?;
            run.weights(&p.model_id, &p.source, || {
                pipeline::all_weights_files(pipe.as_ref(), &dir)
            })?;
            let base = Record {
                architecture: pipe.architecture().into(),
                param_count: pipe.components().iter().map(|&c| pipe.params(c)).sum(),
                weight_source: src.kind().into(),
                mode: Mode::Generate,
                precision: p.precision,
                batch: p.shape.batch as u64,
                context: pipe.text_len() as u64,
                optimizer: Optimizer::None,
                attention: p.attention,
                resolution: Some(p.shape.resolution),
                frames: Some(p.shape.frames as u64),
                cfg: Some(p.shape.cfg),
                vae_decode: Some(p.shape.vae_decode),
                vae_precision: Some(Precision::of_dense(pipe.dtype(Component::Vae))),
                ..run.base(&p.id, &p.model_id)
            };
            run.meter.trim()?;
            let rows = measure_point(pipe.as_mut(), &dir, p, &run.dev, run.meter.as_mut(), &base);
            run.write_point(&base, rows)
        },
    )
}

/// What a sweep run in this process (generation, or a denoiser's fine-tuning) reads and
/// writes: the scenario file, its spec and text, the output CSV, and whether it only prints
/// the point ids.
pub struct SweepIn<'a> {
    pub scenario: &'a Path,
    pub spec: &'a Spec,
    pub text: &'a str,
    pub out: &'a Path,
    pub dry_run: bool,
}

/// Opens a sweep's output for the given point ids (creating it, or resuming it) and returns
/// the ids of the points already finished there.
pub type OpenOutput<'a> = dyn Fn(&HashSet<String>) -> Result<HashSet<String>> + 'a;

/// The loop of a sweep run in this process over the points `ids`: a dry run prints them; else
/// `check` checks the scenario, `open` opens the output and returns the finished ids (skipped),
/// and `measure` runs each other point `i` into the run, with its progress on stderr.
pub fn run_points(
    s: &SweepIn,
    ids: &[String],
    check: impl FnOnce() -> Result<()>,
    open: &OpenOutput,
    mut measure: impl FnMut(usize, &mut GenRun) -> Result<()>,
) -> Result<()> {
    if s.dry_run {
        for id in ids {
            println!("{id}");
        }
        return Ok(());
    }
    check()?;
    let done = open(&ids.iter().cloned().collect())?;
    let mut run = GenRun::start(s.scenario, s.spec, s.text, s.out, ids.len())?;
    for (i, id) in ids.iter().enumerate() {
        if done.contains(id) {
            continue;
        }
        eprintln!("[{}/{}] {id}", i + 1, ids.len());
        measure(i, &mut run)?;
    }
    run.finish()
}

/// The output of a sweep run in this process (generation, or a denoiser's fine-tuning): the
/// device and meter, the CSV and its manifest, and the fields every row shares.
pub struct GenRun {
    pub dev: Device,
    pub meter: Box<dyn Meter>,
    exporter: crate::export::csv::CsvExporter,
    manifest: crate::export::manifest::Manifest,
    scenario_hash: String,
    backend: Backend,
    device_name: String,
}

impl GenRun {
    /// Opens the device, appends to the CSV `out` and writes the manifest of a run of
    /// `points` points.
    pub fn start(
        scenario: &Path,
        spec: &Spec,
        text: &str,
        out: &Path,
        points: usize,
    ) -> Result<GenRun> {
        use crate::export::manifest::{Host, Manifest, Versions};
        if spec.device != "cpu" {
            crate::device::probe(&spec.device)?;
        }
        let (dev, meter) = crate::device::open(&spec.device)?;
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
        let exporter = crate::export::csv::CsvExporter::append(out)?;
        let manifest = Manifest {
            schema_version: SCHEMA_VERSION,
            run_id,
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
            points,
            shard: None,
            shards: Vec::new(),
            capacity_bytes: None,
            status_counts: Default::default(),
            workers_started: 0,
        };
        manifest.write()?;
        eprintln!("sweep {}: {points} points -> {}", spec.name, out.display());
        Ok(GenRun {
            dev,
            meter,
            exporter,
            manifest,
            scenario_hash,
            backend,
            device_name,
        })
    }

    /// Records the weight files of `source` (once per source) with their hash.
    pub fn weights(
        &mut self,
        model_id: &str,
        source: &str,
        files: impl FnOnce() -> Result<Vec<PathBuf>>,
    ) -> Result<()> {
        if self.manifest.weights.iter().any(|w| w.source == source) {
            return Ok(());
        }
        let files = files()?;
        // Cached by (path, size, mtime), as the LLM sweep does: SD's weights are GBs.
        let (sha256, bytes, sha256_cached) = crate::export::hash_cache::hash_files_cached(
            &files,
            crate::export::hash_cache::default_path().as_deref(),
        )?;
        self.manifest
            .weights
            .push(crate::export::manifest::WeightInfo {
                model_id: model_id.to_string(),
                source: source.to_string(),
                files,
                bytes,
                sha256,
                sha256_cached,
            });
        self.manifest.write()
    }

    /// The fields of a point's rows that do not depend on the model or the mode.
    pub fn base(&self, point_id: &str, model_id: &str) -> Record {
        Record {
            schema_version: SCHEMA_VERSION,
            run_id: self.manifest.run_id.clone(),
            point_id: point_id.to_string(),
            started_at: now(),
            vramlab_version: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("VRAMLAB_GIT_REV").into(),
            backend: self.backend,
            device_name: self.device_name.clone(),
            candle_version: env!("VRAMLAB_CANDLE").into(),
            model_id: model_id.to_string(),
            scenario_hash: self.scenario_hash.clone(),
            meter: self.meter.kind(),
            ..Default::default()
        }
    }

    /// Writes a point's rows (a point that failed: one `error` row naming the running phase)
    /// and counts its status in the manifest.
    pub fn write_point(&mut self, base: &Record, rows: Result<Vec<Record>>) -> Result<()> {
        use crate::export::Exporter;
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
            self.exporter.write(r)?;
        }
        let st = rows.last().and_then(|r| r.status).unwrap_or(Status::Error);
        *self
            .manifest
            .status_counts
            .entry(st.as_str().to_string())
            .or_default() += 1;
        self.manifest.write()
    }

    pub fn finish(mut self) -> Result<()> {
        self.manifest.finished_at = Some(now());
        self.manifest.write()
    }
}

/// Loads the pipeline and runs one point: its rows (loads, text encode, steps, decode, total).
fn measure_point(
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
