//! Generation and fine-tuning sweeps (a diffusion pipeline's points): the loop they share. The
//! parent checks the points, writes each source's synthetic weights once and hashes them;
//! each point then runs in its own worker, which loads its pipeline (or denoiser), measures it
//! with `workload::generate` or `workload::finetune`, and writes its rows: the point's own
//! bytes from a floor taken just before it, under `--capacity` when one is given.
use super::runner::RunContext;
use super::shard::{ft_cost, ft_key, gen_cost, gen_key, select};
use super::supervisor::SweepPoint;
use super::Run;
use crate::error::InputError;
use crate::export::csv::CsvExporter;
use crate::export::manifest::WeightInfo;
use crate::export::Exporter;
use crate::model::diffusion::denoiser::{self, FtModel};
use crate::model::diffusion::GenSource;
use crate::model::diffusion::{self as pipeline, Pipeline};
use crate::record::{Record, Status, SCHEMA_VERSION};
use crate::scenario::ft_points::FtPoint;
use crate::scenario::gen_points::GenPoint;
use crate::vocab::{Component, MeterKind, Mode, Optimizer, Precision};
use crate::workload::finetune;
use crate::workload::generate;
use anyhow::Result;
use std::ops::Range;
use std::path::PathBuf;

/// The points of a pipeline sweep.
pub enum Points {
    Gen(Vec<GenPoint>),
    Ft(Vec<FtPoint>),
}

/// Runs a generation or fine-tuning scenario's points (see [`super::run`]).
pub fn run(mut r: Run<'_>, points: Points) -> Result<()> {
    let points = match points {
        Points::Gen(v) => Points::Gen(super::keep(v, r.shard, |p, s| {
            select(p, gen_key, gen_cost, s)
        })),
        Points::Ft(v) => Points::Ft(super::keep(v, r.shard, |p, s| {
            select(p, ft_key, ft_cost, s)
        })),
    };
    if r.o.dry_run {
        return match &points {
            Points::Gen(v) => super::print_points(&r, "generate", v),
            Points::Ft(v) => super::print_points(&r, "finetune", v),
        };
    }
    r.out = super::output::path(r.o.out.as_deref(), &r.spec.name)?;
    if let Some(range) = &r.o.worker {
        return match &points {
            Points::Gen(v) => worker(&r, range, v, measure_gen),
            Points::Ft(v) => worker(&r, range, v, measure_ft),
        };
    }
    match &points {
        Points::Gen(v) => {
            crate::scenario::gen_points::check(&r.o.scenario, r.text, r.spec, v)?;
            super::parent(&r, v, &singles(v.len()), || gen_weights(v), &|p, ctx, m| {
                Ok(gen_base(p, ctx, m)?.0)
            })
        }
        Points::Ft(v) => {
            crate::scenario::ft_points::check(&r.o.scenario, r.text, v)?;
            super::parent(&r, v, &singles(v.len()), || ft_weights(v), &|p, ctx, m| {
                Ok(ft_base(p, ctx, m)?.0)
            })
        }
    }
}

/// Each point its own group: a pipeline point loads its weights itself, so nothing is shared
/// between points, and a fresh worker each keeps one point's figures free of another's.
fn singles(n: usize) -> Vec<Range<usize>> {
    (0..n).map(|i| i..i + 1).collect()
}

/// The manifest's record of `files` of `source`, hashed (cached by path, size and mtime).
fn weight_info(model_id: &str, source: &str, files: Vec<PathBuf>) -> Result<WeightInfo> {
    let (sha256, bytes, sha256_cached) = crate::export::hash_cache::hash_files_cached(
        &files,
        crate::export::hash_cache::default_path().as_deref(),
    )?;
    Ok(WeightInfo {
        model_id: model_id.to_string(),
        source: source.to_string(),
        files,
        bytes,
        sha256,
        sha256_cached,
    })
}

/// Each generation source's weight files (synthetic ones written first), once per source.
fn gen_weights(points: &[GenPoint]) -> Result<Vec<WeightInfo>> {
    let mut v: Vec<WeightInfo> = Vec::new();
    for p in points {
        if v.iter().any(|w| w.source == p.source) {
            continue;
        }
        let src = GenSource::parse(&p.source).map_err(InputError::arg)?;
        let pipe = src.pipeline(p.precision.dtype(), p.vae_precision.map(|v| v.dtype()))?;
        let dir = src.prepare(pipe.as_ref())?;
        let files = pipeline::all_weights_files(pipe.as_ref(), &dir)?;
        v.push(weight_info(&p.model_id, &p.source, files)?);
    }
    Ok(v)
}

/// Each fine-tuning source's denoiser files (synthetic ones written first), once per source.
fn ft_weights(points: &[FtPoint]) -> Result<Vec<WeightInfo>> {
    let mut v: Vec<WeightInfo> = Vec::new();
    for p in points {
        if v.iter().any(|w| w.source == p.source) {
            continue;
        }
        let src = GenSource::parse(&p.source).map_err(InputError::arg)?;
        let model = denoiser::config_of(&src)?;
        let dir = finetune::prepare(&src, &model, p.precision.dtype())?;
        let files = pipeline::weights_files(&dir, model.component())?;
        v.push(weight_info(&p.model_id, &p.source, files)?);
    }
    Ok(v)
}

/// The fields of a point's rows that depend on neither the model nor the mode.
fn ctx_base(ctx: &RunContext, meter: MeterKind, point_id: &str, model_id: &str) -> Record {
    Record {
        schema_version: SCHEMA_VERSION,
        run_id: ctx.run_id.clone(),
        point_id: point_id.to_string(),
        started_at: super::runner::now_rfc3339(),
        vramlab_version: env!("CARGO_PKG_VERSION").into(),
        git_rev: env!("VRAMLAB_GIT_REV").into(),
        backend: ctx.backend,
        device_name: ctx.device_name.clone(),
        driver_version: ctx.driver_version.clone(),
        cuda_version: ctx.cuda_version.clone(),
        candle_version: env!("VRAMLAB_CANDLE").into(),
        model_id: model_id.to_string(),
        pool_release: ctx.pool_release,
        scenario_hash: ctx.scenario_hash.clone(),
        meter,
        ..Default::default()
    }
}

/// A generation point's row fields, with its (unloaded) pipeline and its source.
fn gen_base(
    p: &GenPoint,
    ctx: &RunContext,
    meter: MeterKind,
) -> Result<(Record, Box<dyn Pipeline>, GenSource)> {
    let src = GenSource::parse(&p.source).map_err(InputError::arg)?;
    let pipe = src.pipeline(p.precision.dtype(), p.vae_precision.map(|v| v.dtype()))?;
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
        ..ctx_base(ctx, meter, &p.id, &p.model_id)
    };
    Ok((base, pipe, src))
}

/// A fine-tuning point's row fields, with its denoiser's config and its source.
fn ft_base(
    p: &FtPoint,
    ctx: &RunContext,
    meter: MeterKind,
) -> Result<(Record, FtModel, GenSource)> {
    let src = GenSource::parse(&p.source).map_err(InputError::arg)?;
    let model = denoiser::config_of(&src)?;
    let base = Record {
        architecture: model.architecture().into(),
        param_count: model.params(),
        weight_source: src.kind().into(),
        mode: Mode::Train,
        precision: p.precision,
        batch: p.batch as u64,
        context: model.text_len() as u64,
        optimizer: p.optimizer,
        checkpointing: Some(p.checkpointing),
        grad_accum: Some(p.grad_accum as u64),
        trainable: Some(p.trainable),
        attention: p.attention,
        resolution: Some(p.resolution),
        frames: p.frames.map(|f| f as u64),
        ..ctx_base(ctx, meter, &p.id, &p.model_id)
    };
    Ok((base, model, src))
}

/// How a worker measures one point: loads what it needs, calls `floor` (which takes the
/// allocation floor and sets the capacity) just before the measured phases, and returns the
/// point's base record and its rows (an error when the measuring failed).
type Measure<P> = fn(
    &P,
    &RunContext,
    &candle_core::Device,
    &mut dyn crate::meter::Meter,
    &dyn Fn(),
) -> Result<(Record, Result<Vec<Record>>)>;

/// Loads and measures one generation point.
fn measure_gen(
    p: &GenPoint,
    ctx: &RunContext,
    dev: &candle_core::Device,
    meter: &mut dyn crate::meter::Meter,
    floor: &dyn Fn(),
) -> Result<(Record, Result<Vec<Record>>)> {
    let (base, mut pipe, src) = gen_base(p, ctx, meter.kind())?;
    let dir = src.prepare(pipe.as_ref())?;
    meter.trim()?;
    floor();
    let rows = generate::measure_point(pipe.as_mut(), &dir, p, dev, meter, &base);
    Ok((base, rows))
}

/// Loads and measures one fine-tuning point.
fn measure_ft(
    p: &FtPoint,
    ctx: &RunContext,
    dev: &candle_core::Device,
    meter: &mut dyn crate::meter::Meter,
    floor: &dyn Fn(),
) -> Result<(Record, Result<Vec<Record>>)> {
    let (base, model, src) = ft_base(p, ctx, meter.kind())?;
    let dir = finetune::prepare(&src, &model, p.precision.dtype())?;
    meter.trim()?;
    floor();
    let rows = finetune::measure_point(&model, &dir, p, dev, meter, &base);
    Ok((base, rows))
}

/// The worker side: measures `points[START..END]` in this process, each from a floor taken
/// just before it and under the capacity (an allocation past it aborts the worker; the parent
/// records the point `oom`), appending each point's rows once it is measured. A point that
/// fails otherwise is one `error` row (`oom` for a device's out of memory) naming the phase.
fn worker<P: SweepPoint>(
    r: &Run<'_>,
    range: &str,
    points: &[P],
    measure: Measure<P>,
) -> Result<()> {
    let range = super::worker_range(range, points.len())?;
    let (dev, mut meter, ctx) = super::start_worker(r)?;
    let mut exporter = CsvExporter::append(&r.out)?;
    let capacity = r.capacity;
    let floor = || {
        crate::meter::alloc::set_floor();
        if let Some(c) = capacity {
            crate::meter::alloc::set_capacity(c);
        }
    };
    for p in &points[range] {
        let (base, rows) = measure(p, &ctx, &dev, meter.as_mut(), &floor)?;
        // The capacity bounds the measuring only, not the writing of its rows.
        crate::meter::alloc::set_capacity(u64::MAX);
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let oom = crate::device::is_oom(&e);
                let msg = crate::error::one_line(&e);
                eprintln!("{} at {}: {msg}", if oom { "oom" } else { "error" }, p.id());
                vec![Record {
                    phase: Some(crate::progress::running_phase()),
                    status: Some(if oom { Status::Oom } else { Status::Error }),
                    message: msg,
                    ..base
                }]
            }
        };
        for row in &rows {
            exporter.write(row)?;
        }
        crate::progress::point_done(p.id());
    }
    Ok(())
}
