//! `vramlab sweep`: expand a scenario into points, measure each, write CSV + manifest.
use crate::error::{bad_file, InputError};
use crate::export::csv::CsvExporter;
use crate::export::manifest::{hash_files, Host, Manifest, Versions, WeightInfo};
use crate::model::{weights, Source};
use crate::runner::{now_rfc3339, Prepared, RunContext, Runner};
use crate::scenario::{expand, short_hash, Point, Spec};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario file (TOML; see scenarios/ and the README for the keys).
    pub scenario: PathBuf,
    /// Output CSV; the manifest goes beside it as NAME.manifest.json.
    /// Default: results/<scenario name>.csv.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Device to measure on: `cpu` or `cuda:N`. Overrides the scenario's `device`.
    #[arg(long)]
    pub device: Option<String>,
    /// Print the expanded point ids, one per line, and exit without measuring.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not print the per-point summary table at the end.
    #[arg(long)]
    pub quiet: bool,
}

/// Resolves every model source of the points and checks each point against its config.
fn prepare(path: &Path, points: &[Point]) -> Result<BTreeMap<String, Prepared>> {
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
            models.insert(p.source.clone(), Prepared { source, config });
        }
        let arch = models[&p.source].config.architecture;
        if p.mode == crate::scenario::Mode::Infer && arch != crate::model::Architecture::Llama {
            return Err(bad_file(
                path,
                format!(
                    "{} is a {} model: inference sweeps support the llama family; use mode = [\"train\"]",
                    p.model_id,
                    arch.as_str()
                ),
            ));
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

pub fn run(args: Args) -> Result<()> {
    let (spec, text) = Spec::load(&args.scenario)?;
    let points = expand(&spec);
    if args.dry_run {
        for p in &points {
            println!("{}", p.id);
        }
        return Ok(());
    }
    let models = prepare(&args.scenario, &points)?;
    let device_spec = args.device.clone().unwrap_or_else(|| spec.device.clone());
    let (device, meter) = crate::device::open(&device_spec)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("{}.csv", spec.name)));
    if out.extension().and_then(|e| e.to_str()) != Some("csv") {
        return Err(InputError::arg(format!("--out {}: must end in .csv", out.display())).into());
    }

    let mut weights_info = Vec::new();
    for (s, prep) in &models {
        let files = weights::weight_files(&prep.source, None)?;
        let (sha256, bytes) = hash_files(&files)?;
        weights_info.push(WeightInfo {
            model_id: prep.source.model_id(),
            source: s.clone(),
            files,
            bytes,
            sha256,
        });
    }
    let started_at = now_rfc3339();
    let run_id = format!(
        "{}-{:x}",
        started_at.replace([':', '-'], ""),
        std::process::id()
    );
    let ctx = RunContext {
        run_id: run_id.clone(),
        scenario_hash: short_hash(text.as_bytes()),
        backend: if device.is_cpu() { "cpu" } else { "cuda" }.into(),
        device_name: crate::device::name(&device),
        ..Default::default()
    };
    let mut manifest = Manifest {
        schema_version: crate::record::SCHEMA_VERSION,
        run_id,
        started_at,
        finished_at: None,
        csv: out.clone(),
        scenario_path: args.scenario.clone(),
        scenario_hash: ctx.scenario_hash.clone(),
        scenario_text: text,
        backend: ctx.backend.clone(),
        device: device_spec,
        device_name: ctx.device_name.clone(),
        pool: serde_json::json!(null),
        runtime: format!("candle-{}", env!("VRAMLAB_CANDLE")),
        versions: Versions::current(),
        host: Host::current(),
        weights: weights_info,
        points: points.len(),
        status_counts: BTreeMap::new(),
    };
    let mut exporter = CsvExporter::create(&out)?;
    manifest.write()?;
    eprintln!(
        "sweep {}: {} points -> {}",
        spec.name,
        points.len(),
        out.display()
    );
    let mut runner = Runner {
        device,
        meter,
        exporter: &mut exporter,
        ctx,
    };
    let counts = runner.run(&points, &models)?;
    manifest.finished_at = Some(now_rfc3339());
    manifest.status_counts = counts.clone();
    manifest.write()?;
    if !args.quiet {
        crate::cmd::summary::print(&out)?;
    }
    let line: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    eprintln!("{} -> {}", line.join(", "), out.display());
    if counts.get("error").copied().unwrap_or(0) > 0 {
        anyhow::bail!(
            "some points failed; see the `message` column of {}",
            out.display()
        );
    }
    Ok(())
}
