//! A language-model sweep (infer, encode, train on a language model): its models resolved and
//! checked, its shard by the estimator's cost, and its workers, each loading a group's weights
//! once ([`super::runner`]).
use super::runner::{base_record, Prepared, Runner};
use super::shard::{cost as shard_cost, llm_key, select};
use super::Run;
use crate::error::bad_file;
use crate::export::csv::CsvExporter;
use crate::export::hash_cache::{default_path as hash_cache_path, hash_files_cached};
use crate::export::manifest::WeightInfo;
use crate::model::{weights, Source};
use crate::scenario::grid::same_group;
use crate::scenario::Point;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// Resolves every model source of the points and checks each point against its config.
pub fn prepare(path: &Path, points: &[Point]) -> Result<BTreeMap<String, Prepared>> {
    let mut models = BTreeMap::new();
    for p in points {
        if !models.contains_key(&p.source) {
            let source = Source::parse(&p.source).map_err(|e| bad_file(path, e))?;
            if !source.path().exists() {
                return Err(bad_file(
                    path,
                    format!("model path `{}` does not exist", source.path().display()),
                ));
            }
            let config = source.config()?;
            // Names, shapes and file extents from the headers: a bad weights file is one
            // line and exit 2 here, before any worker starts.
            crate::model::weights::preflight(&source, &config)?;
            models.insert(p.source.clone(), Prepared { source, config });
        }
        let arch = models[&p.source].config.architecture;
        let wanted = match p.mode {
            crate::vocab::Mode::Infer => Some((crate::model::Role::Decoder, "encode")),
            crate::vocab::Mode::Encode => Some((crate::model::Role::Encoder, "infer")),
            crate::vocab::Mode::Train | crate::vocab::Mode::Generate => None,
        };
        if let Some((role, other)) = wanted.filter(|(role, _)| arch.role() != *role) {
            return Err(bad_file(
                path,
                format!(
                    "{} is a {} model ({}): mode = \"{}\" needs a {}; use mode = [\"{other}\"] or [\"train\"]",
                    p.model_id,
                    arch.name(),
                    if role == crate::model::Role::Decoder { "an encoder" } else { "a decoder" },
                    p.mode.as_str(),
                    if role == crate::model::Role::Decoder { "decoder" } else { "encoder" },
                ),
            ));
        }
        // A re-quantization whose blocks do not divide a tensor's rows: one line naming it.
        if let (Some(q), Source::Gguf(file)) = (p.precision.quantized(), &models[&p.source].source)
        {
            crate::model::gguf::plan(file, &models[&p.source].config, q)?;
        }
        let max = models[&p.source].config.max_position_embeddings;
        if p.context > max {
            return Err(bad_file(
                path,
                format!(
                    "context {} exceeds max_position_embeddings {max} of {}",
                    p.context, p.model_id
                ),
            ));
        }
    }
    Ok(models)
}

/// Runs the language-model points of a scenario (see [`super::run`]).
pub fn run(mut r: Run<'_>, mut points: Vec<Point>) -> Result<()> {
    let mut prepared = None;
    if let Some(shard) = r.shard {
        // The split needs every model's config for the estimator's cost.
        let models = prepare(&r.o.scenario, &points)?;
        let keep = select(
            &points,
            llm_key,
            |p| shard_cost(&models[&p.source].config, p),
            shard,
        );
        points = keep.into_iter().map(|i| points[i].clone()).collect();
        prepared = Some(models);
    }
    if r.o.dry_run {
        return super::print_points(&r, "llm", &points);
    }
    let models = match prepared {
        Some(m) => m,
        None => prepare(&r.o.scenario, &points)?,
    };
    r.out = super::output::path(r.o.out.as_deref(), &r.spec.name)?;
    if let Some(range) = &r.o.worker {
        return worker(&r, range, &points, &models);
    }
    let groups = super::supervisor::groups(&points, same_group);
    super::parent(
        &r,
        &points,
        &groups,
        || {
            let mut info = Vec::new();
            let hash_cache = hash_cache_path();
            for (s, prep) in &models {
                let files = weights::weight_files(&prep.source, None)?;
                let (sha256, bytes, sha256_cached) =
                    hash_files_cached(&files, hash_cache.as_deref())?;
                info.push(WeightInfo {
                    model_id: prep.source.model_id(),
                    source: s.clone(),
                    files,
                    bytes,
                    sha256,
                    sha256_cached,
                });
            }
            Ok(info)
        },
        &|p, ctx, meter| Ok(base_record(ctx, meter, p, &models[&p.source])),
    )
}

/// The worker side: measure `points[START..END]` in this process, appending to the output.
fn worker(
    r: &Run<'_>,
    range: &str,
    points: &[Point],
    models: &BTreeMap<String, Prepared>,
) -> Result<()> {
    let range = super::worker_range(range, points.len())?;
    if let Some(c) = r.capacity {
        crate::meter::alloc::set_capacity(c);
    }
    let (device, meter, ctx) = super::start_worker(r)?;
    let mut exporter = CsvExporter::append(&r.out)?;
    let mut runner = Runner {
        device,
        meter,
        exporter: &mut exporter,
        ctx,
        progress: false,
        point_warmup: r.o.point_warmup,
    };
    let group_of = |p: &Point| -> Vec<Point> {
        points
            .iter()
            .filter(|q| same_group(q, p))
            .cloned()
            .collect()
    };
    // The runner takes the allocation floor itself, once its points' records exist.
    runner.run(&points[range], models, &group_of)?;
    Ok(())
}
