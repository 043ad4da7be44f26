//! `vramlab sweep`: expand a scenario into points, measure each, write CSV + manifest.
use crate::error::{bad_file, InputError};
use crate::export::csv::CsvExporter;
use crate::export::hash_cache::{default_path as hash_cache_path, hash_files_cached};
use crate::export::manifest::{Host, Manifest, Versions, WeightInfo};
use crate::model::{weights, Source};
use crate::record::{Phase, Record, Status};
use crate::runner::{base_record, now_rfc3339, progress_bar, Prepared, RunContext, Runner};
use crate::scenario::shard::{cost as shard_cost, select, Shard};
use crate::scenario::{expand, short_hash, Point, Spec};
use crate::vocab::Backend;
use crate::workload::generate::{OpenOutput, SweepIn};
use anyhow::Context;
use anyhow::Result;
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 every point finished (rows `ok`, `oom` or `skipped`), or \
--dry-run listed them; 1 some points failed (rows `error`, or points missing after a worker \
died) or the sweep failed otherwise; 2 bad input: an unusable scenario, weights file or flag \
value (one line naming it)."
)]
pub struct Args {
    /// Scenario file (TOML; see scenarios/ and docs/src/reference/scenario.md for the keys).
    pub scenario: PathBuf,
    /// Output CSV; the manifest goes beside it as NAME.manifest.json.
    /// Default: `results/<scenario name>.csv`.
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
    /// A memory budget for the CPU device, emulating a smaller GPU: e.g. 2GiB, 512MiB, 1.5GB.
    /// A point whose phase would pass it is recorded `status=oom` and the sweep goes on.
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,
    /// Resume into an existing --out (the default when it exists and its manifest's scenario
    /// hash matches): finished points are kept, partly measured points are re-run.
    #[arg(long, conflicts_with = "fresh")]
    pub resume: bool,
    /// Overwrite an existing --out instead of resuming.
    #[arg(long)]
    pub fresh: bool,
    /// Run shard K of N (1-based): a deterministic 1/N of the points, balanced by the
    /// estimator's cost, with points that share loaded weights kept together. Run every K
    /// (one per GPU or node) with its own --out, then `vramlab merge` the outputs.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Internal: run points START:END of the grid in this process (a worker).
    #[arg(long, hide = true, value_name = "START:END")]
    pub worker: Option<String>,
    /// Internal: the run id a worker writes.
    #[arg(long, hide = true)]
    pub run_id: Option<String>,
    /// Internal: warm up each point at its own shapes (the group's warm-up ran out of memory).
    #[arg(long, hide = true)]
    pub point_warmup: bool,
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

/// An exclusive advisory lock (`flock`) on `.NAME.csv.lock` beside the output, held for the
/// life of the sweep: a second sweep into the same CSV would interleave its rows with this
/// one's (and `--fresh` would delete them under it). The kernel drops the lock when the
/// process ends, however it ends; the empty file stays (git-ignored).
fn lock_output(out: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| bad_file(dir, format!("cannot create: {e}")))?;
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let path = dir.join(format!(".{name}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| bad_file(&path, format!("cannot open the output's lock file: {e}")))?;
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(bad_file(
            out,
            "another vramlab sweep is writing this output; wait for it to finish or choose another --out",
        ));
    }
    Ok(f)
}

/// Opens `out` for a run: `--fresh` removes it, `--resume` needs it, and an existing output of
/// the same scenario (and shard) is resumed: the rows of points it did not finish are dropped
/// and the ids of those it did (`finished`) come back. A new output is created empty.
pub fn resume_or_create(
    out: &Path,
    args: &Args,
    shard: Option<String>,
    scenario_hash: &str,
    points: usize,
    finished: impl Fn(&[Record]) -> HashSet<String>,
) -> Result<HashSet<String>> {
    if out.exists() && args.fresh {
        std::fs::remove_file(out)?;
    }
    if args.resume && !out.exists() {
        return Err(bad_file(
            out,
            "--resume: there is no earlier output to resume",
        ));
    }
    if !out.exists() {
        CsvExporter::create(out)?;
        return Ok(HashSet::new());
    }
    let mpath = Manifest::path_for(out);
    let old: serde_json::Value = std::fs::read_to_string(&mpath)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            bad_file(
                &mpath,
                "missing or unreadable: cannot resume; use --fresh to overwrite",
            )
        })?;
    let old_hash = old["scenario_hash"].as_str().unwrap_or("");
    let old_shard = old["shard"].as_str().map(str::to_string);
    if old_shard != shard {
        return Err(bad_file(
            out,
            format!(
                "was written by shard {}, this run is shard {}; use --fresh to overwrite it or another --out",
                old_shard.as_deref().unwrap_or("none"),
                shard.as_deref().unwrap_or("none")
            ),
        ));
    }
    if old_hash != scenario_hash {
        return Err(bad_file(
            out,
            format!("was written by scenario hash {old_hash}, this scenario's is {scenario_hash}; use --fresh to overwrite it or another --out"),
        ));
    }
    let rows = crate::export::csv::read(out)?;
    let done = finished(&rows);
    let redo = crate::supervisor::drop_unfinished(out, &rows, &done)?;
    eprintln!(
        "resuming {}: {} of {points} points done{}",
        out.display(),
        done.len(),
        if redo.is_empty() {
            String::new()
        } else {
            format!(", re-running {} partial", redo.len())
        }
    );
    Ok(done)
}

/// A sweep measured in this process (generation, or a denoiser's fine-tuning): its output
/// (`--out`, else `results/<name>.csv`) and the output's lock; the resume, where a point is
/// finished once a `done` row or a failure of it is written; then the summary. `sweep` runs the
/// points into the output and calls `open` once the scenario is checked, so that a bad
/// scenario loses nothing (`--fresh` included).
fn in_process(
    args: &Args,
    spec: &Spec,
    text: &str,
    done: impl Fn(&Record) -> bool,
    sweep: impl FnOnce(&SweepIn, &OpenOutput) -> Result<()>,
) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("{}.csv", spec.name)));
    let scenario_hash = short_hash(text.as_bytes());
    let _lock = (!args.dry_run).then(|| lock_output(&out)).transpose()?;
    let open = |ids: &HashSet<String>| {
        resume_or_create(&out, args, None, &scenario_hash, ids.len(), |rows| {
            rows.iter()
                .filter(|r| ids.contains(&r.point_id))
                .filter(|r| done(r) || matches!(r.status, Some(Status::Oom | Status::Error)))
                .map(|r| r.point_id.clone())
                .collect()
        })
    };
    let s = SweepIn {
        scenario: &args.scenario,
        spec,
        text,
        out: &out,
        dry_run: args.dry_run,
    };
    sweep(&s, &open)?;
    if !args.quiet && !args.dry_run {
        crate::cmd::summary::print(&out)?;
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let (spec, text) = Spec::load(&args.scenario)?;
    if spec
        .sweep
        .0
        .iter()
        .any(|s| s.mode.contains(&crate::vocab::Mode::Generate))
    {
        if spec
            .sweep
            .0
            .iter()
            .any(|s| !s.mode.contains(&crate::vocab::Mode::Generate))
        {
            return Err(bad_file(
                &args.scenario,
                "mode \"generate\" tables cannot share a scenario with other modes yet",
            ));
        }
        return in_process(
            &args,
            &spec,
            &text,
            |r| r.phase == Some(Phase::Total),
            crate::workload::generate::sweep,
        );
    }
    if !crate::workload::finetune::expand(&spec).is_empty() {
        if !expand(&spec).is_empty() {
            return Err(bad_file(
                &args.scenario,
                "mode \"train\" on a diffusion pipeline cannot share a scenario with language-model tables yet",
            ));
        }
        // A point is finished when its last step's step_total row (or a failure) is written.
        let steps: std::collections::HashMap<String, u64> =
            crate::workload::finetune::expand(&spec)
                .into_iter()
                .map(|p| (p.id, p.steps as u64))
                .collect();
        return in_process(
            &args,
            &spec,
            &text,
            |r| {
                r.phase == Some(Phase::StepTotal)
                    && steps.get(&r.point_id).is_some_and(|&n| r.step == Some(n))
            },
            crate::workload::finetune::sweep,
        );
    }
    let mut points = expand(&spec);
    let shard = match &args.shard {
        Some(s) => Some(s.parse::<Shard>().map_err(InputError::arg)?),
        None => None,
    };
    let mut prepared = None;
    if let Some(shard) = shard {
        // The split needs every model's config for the estimator's cost.
        let models = prepare(&args.scenario, &points)?;
        let keep = select(&points, |p| shard_cost(&models[&p.source].config, p), shard);
        points = keep.into_iter().map(|i| points[i].clone()).collect();
        prepared = Some(models);
    }
    if args.dry_run {
        for p in &points {
            println!("{}", p.id);
        }
        return Ok(());
    }
    let models = match prepared {
        Some(m) => m,
        None => prepare(&args.scenario, &points)?,
    };
    let device_spec = args.device.clone().unwrap_or_else(|| spec.device.clone());
    let capacity = match &args.capacity {
        Some(c) => Some(
            crate::units::parse_size(c).map_err(|e| InputError::arg(format!("--capacity: {e}")))?,
        ),
        None => None,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("{}.csv", spec.name)));
    if out.extension().and_then(|e| e.to_str()) != Some("csv") {
        return Err(InputError::arg(format!("--out {}: must end in .csv", out.display())).into());
    }
    let scenario_hash = short_hash(text.as_bytes());
    if let Some(range) = &args.worker {
        let w = Worker {
            range,
            points: &points,
            models: &models,
            device_spec: &device_spec,
            capacity,
            out: &out,
            scenario_hash,
            pool_release: spec.pool_release,
        };
        return worker(&args, w);
    }
    // One clean line for a missing device, before any worker starts.
    crate::device::probe(&device_spec)?;
    let _lock = lock_output(&out)?;

    let mut done = resume_or_create(
        &out,
        &args,
        shard.map(|s| s.to_string()),
        &scenario_hash,
        points.len(),
        |rows| crate::supervisor::finished(rows, &points),
    )?;

    let mut weights_info = Vec::new();
    let hash_cache = hash_cache_path();
    for (s, prep) in &models {
        let files = weights::weight_files(&prep.source, None)?;
        let (sha256, bytes, sha256_cached) = hash_files_cached(&files, hash_cache.as_deref())?;
        weights_info.push(WeightInfo {
            model_id: prep.source.model_id(),
            source: s.clone(),
            files,
            bytes,
            sha256,
            sha256_cached,
        });
    }
    let started_at = now_rfc3339();
    // Fixed width: workers receive it, and its length must not vary between runs.
    let run_id = format!(
        "{}-{:08x}",
        started_at.replace([':', '-'], ""),
        std::process::id()
    );
    let cpu = device_spec == "cpu";
    let ctx = RunContext {
        run_id: run_id.clone(),
        scenario_hash: scenario_hash.clone(),
        backend: if cpu { Backend::Cpu } else { Backend::Cuda },
        device_name: if cpu {
            crate::device::name(&candle_core::Device::Cpu)
        } else {
            device_spec.clone()
        },
        ..Default::default()
    };
    let mut manifest = Manifest {
        schema_version: crate::record::SCHEMA_VERSION,
        run_id: run_id.clone(),
        started_at,
        finished_at: None,
        csv: out.clone(),
        scenario_path: args.scenario.clone(),
        scenario_hash: scenario_hash.clone(),
        scenario_text: text,
        backend: ctx.backend,
        device: device_spec.clone(),
        device_name: ctx.device_name.clone(),
        gpu: None,
        pool: serde_json::json!(null),
        runtime: format!("candle-{}", env!("VRAMLAB_CANDLE")),
        versions: Versions::current(),
        host: Host::current(),
        weights: weights_info,
        points: points.len(),
        shard: shard.map(|s| s.to_string()),
        shards: Vec::new(),
        capacity_bytes: capacity,
        status_counts: BTreeMap::new(),
        workers_started: 0,
    };
    manifest.write()?;
    eprintln!(
        "sweep {}{}: {} points -> {}",
        spec.name,
        shard.map(|s| format!(" shard {s}")).unwrap_or_default(),
        points.len(),
        out.display()
    );

    // Workers run this very executable: on Linux through /proc/self/exe, which stays valid
    // even when the file is rebuilt or replaced during a long sweep.
    let exe = match Path::new("/proc/self/exe") {
        p if p.exists() => p.to_path_buf(),
        _ => std::env::current_exe().context("locating the vramlab binary")?,
    };
    let base_cmd = |start: usize, end: usize| {
        let mut c = Command::new(&exe);
        // One-line errors from workers: the parent reports them.
        c.env("RUST_BACKTRACE", "0")
            .arg("sweep")
            .arg(&args.scenario)
            .arg("--out")
            .arg(&out)
            .args(["--device", &device_spec, "--quiet", "--run-id", &run_id])
            .args(["--worker", &format!("{start:06}:{end:06}")]);
        if let Some(cap) = &args.capacity {
            c.args(["--capacity", cap]);
        }
        if let Some(s) = shard {
            c.args(["--shard", &s.to_string()]);
        }
        c
    };
    let bar = progress_bar(points.len());
    bar.inc(done.len() as u64);
    let mut exporter = CsvExporter::append(&out)?;
    let failed_row = |p: &Point, phase: Phase, status: Status, peak: Option<u64>, msg: String| {
        let mut r = base_record(
            &ctx,
            if cpu {
                crate::vocab::MeterKind::CpuAlloc
            } else {
                crate::vocab::MeterKind::CudaPool
            },
            p,
            &models[&p.source],
        );
        r.phase = Some(phase);
        r.status = Some(status);
        r.peak_allocated = peak;
        r.message = msg;
        bar.println(format!(
            "{} at {}: {}",
            if status == Status::Oom {
                "oom"
            } else {
                "error"
            },
            p.id,
            r.message
        ));
        r
    };
    let mut device_facts: Option<serde_json::Value> = None;
    manifest.workers_started = crate::supervisor::supervise(
        &points,
        &mut done,
        &base_cmd,
        &mut exporter,
        &failed_row,
        &mut |_| bar.inc(1),
        &mut |facts| device_facts = Some(facts),
    )?;
    if let Some(f) = device_facts {
        let gpu = &f["gpu"];
        manifest.device_name = gpu["name"].as_str().unwrap_or_default().to_string();
        manifest.versions.cuda_driver = gpu["driver_version"].as_str().unwrap_or_default().into();
        manifest.versions.cuda_runtime = gpu["runtime_version"].as_str().unwrap_or_default().into();
        manifest.pool = f["pool"].clone();
        manifest.gpu = Some(gpu.clone());
    }
    bar.finish_and_clear();

    let rows = crate::export::csv::read(&out)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for p in &points {
        let status = rows
            .iter()
            .rev()
            .find(|r| r.point_id == p.id && crate::supervisor::is_final(r, p))
            .and_then(|r| r.status)
            .map(|s| format!("{s:?}").to_lowercase())
            .unwrap_or_else(|| "missing".into());
        *counts.entry(status).or_insert(0) += 1;
    }
    manifest.finished_at = Some(now_rfc3339());
    manifest.status_counts = counts.clone();
    manifest.write()?;
    if !args.quiet {
        crate::cmd::summary::print(&out)?;
    }
    let line: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    eprintln!("{} -> {}", line.join(", "), out.display());
    if counts.keys().any(|k| k == "error" || k == "missing") {
        anyhow::bail!(
            "some points failed; see the `message` column of {}",
            out.display()
        );
    }
    Ok(())
}

/// What a worker needs besides its arguments.
struct Worker<'a> {
    range: &'a str,
    points: &'a [Point],
    models: &'a BTreeMap<String, Prepared>,
    device_spec: &'a str,
    capacity: Option<u64>,
    out: &'a Path,
    scenario_hash: String,
    pool_release: crate::vocab::PoolRelease,
}

/// The worker side: measure `points[START..END]` in this process, appending to `out`.
fn worker(args: &Args, w: Worker<'_>) -> Result<()> {
    let Worker {
        range,
        points,
        models,
        device_spec,
        capacity,
        out,
        scenario_hash,
        pool_release,
    } = w;
    let (start, end) = range
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .filter(|&(a, b)| a < b && b <= points.len())
        .ok_or_else(|| InputError::arg(format!("--worker {range}: bad range")))?;
    crate::supervisor::become_worker();
    if let Some(c) = capacity {
        crate::meter::alloc::set_capacity(c);
    }
    let (device, meter) = crate::device::open_with(device_spec, pool_release)?;
    let facts = crate::device::gpu_facts(&device);
    if let Some(f) = &facts {
        // The parent puts these in the manifest.
        crate::supervisor::report_device(&serde_json::json!({
            "gpu": f,
            "pool": crate::meter::pool::pool_json(meter.kind(), pool_release),
        }));
    }
    let ctx = RunContext {
        run_id: args.run_id.clone().unwrap_or_default(),
        scenario_hash,
        backend: if device.is_cpu() {
            Backend::Cpu
        } else {
            Backend::Cuda
        },
        device_name: crate::device::name(&device),
        driver_version: facts
            .as_ref()
            .map(|f| f.driver_version.clone())
            .unwrap_or_default(),
        cuda_version: facts
            .as_ref()
            .map(|f| f.runtime_version.clone())
            .unwrap_or_default(),
        pool_release: crate::meter::pool::release_column(meter.kind(), pool_release),
    };
    let mut exporter = CsvExporter::append(out)?;
    let mut runner = Runner {
        device,
        meter,
        exporter: &mut exporter,
        ctx,
        progress: false,
        point_warmup: args.point_warmup,
    };
    let group_of = |p: &Point| -> Vec<Point> {
        points
            .iter()
            .filter(|q| crate::scenario::grid::same_group(q, p))
            .cloned()
            .collect()
    };
    // The runner takes the allocation floor itself, once its points' records exist.
    runner.run(&points[start..end], models, &group_of)?;
    Ok(())
}
