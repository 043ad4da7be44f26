//! Orchestrating a sweep, every mode alike: the scenario's points (`scenario::`), the shard of
//! them this run measures ([`shard`]), the output and its resume ([`output`]), the worker
//! processes that measure them ([`supervisor`]) and what a worker runs: a language model's
//! groups ([`runner`], [`llm`]) or generation and fine-tuning points ([`pipeline`]).
//!
//! Every mode shards (`--shard K/N`), honours `--capacity` (a point whose phase would pass it
//! is recorded `oom` and the sweep goes on), records the capacity and the shard in the
//! manifest, and measures in worker processes under the parent's supervision.
pub mod emulated;
pub mod llm;
pub mod output;
pub mod pipeline;
pub mod runner;
pub mod shard;
pub mod summary;
pub mod supervisor;
pub mod torch;

use crate::error::{bad_file, InputError};
use crate::export::csv::CsvExporter;
use crate::export::manifest::WeightInfo;
use crate::record::{Phase, Record, Status};
use crate::scenario::ft_points::FtPoint;
use crate::scenario::gen_points::GenPoint;
use crate::scenario::{short_hash, Point, Spec};
use crate::vocab::{Backend, Mode, Runtime, Stack};
use anyhow::{Context, Result};
use shard::Shard;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use supervisor::SweepPoint;

/// What `vramlab sweep` was asked (its flags; see `cmd::sweep::Args` for each).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub scenario: PathBuf,
    pub out: Option<PathBuf>,
    pub device: Option<String>,
    pub dry_run: bool,
    /// With `dry_run`: the points as JSON ([`print_points`]).
    pub json: bool,
    pub quiet: bool,
    pub capacity: Option<String>,
    pub resume: bool,
    pub fresh: bool,
    pub shard: Option<String>,
    /// Internal: run points START:END of the (sharded) points in this process.
    pub worker: Option<String>,
    pub run_id: Option<String>,
    pub point_warmup: bool,
}

/// A scenario's points, by how they are measured.
pub enum Plan {
    /// Language-model grids (infer, encode, train).
    Llm(Vec<Point>),
    /// `mode = "generate"` tables.
    Gen(Vec<GenPoint>),
    /// `mode = "train"` on diffusion pipelines.
    Ft(Vec<FtPoint>),
}

impl Plan {
    /// The points of `spec` (a scenario mixing the kinds is refused in one line).
    pub fn of(path: &Path, spec: &Spec) -> Result<Plan> {
        let tables = &spec.sweep.0;
        if tables.iter().any(|s| s.mode.contains(&Mode::Generate)) {
            if tables.iter().any(|s| !s.mode.contains(&Mode::Generate)) {
                return Err(bad_file(
                    path,
                    "mode \"generate\" tables cannot share a scenario with other modes yet",
                ));
            }
            return Ok(Plan::Gen(crate::scenario::gen_points::expand(spec)));
        }
        let ft = crate::scenario::ft_points::expand(spec);
        if !ft.is_empty() {
            if !crate::scenario::expand(spec).is_empty() {
                return Err(bad_file(
                    path,
                    "mode \"train\" on a diffusion pipeline cannot share a scenario with language-model tables yet",
                ));
            }
            return Ok(Plan::Ft(ft));
        }
        Ok(Plan::Llm(crate::scenario::expand(spec)))
    }
}

/// A run's settings, once the flags are checked.
pub struct Run<'a> {
    pub o: &'a Options,
    pub spec: &'a Spec,
    pub text: &'a str,
    pub shard: Option<Shard>,
    pub out: PathBuf,
    pub device_spec: String,
    pub capacity: Option<u64>,
    pub scenario_hash: String,
    /// The software stack of a `runtime = "torch"` sweep (the default one for candle).
    pub stack: Stack,
}

/// `vramlab sweep`: expands the scenario, keeps this run's shard, and (the parent) measures
/// every point in workers, or (`--worker`) measures some in this process.
pub fn run(o: &Options) -> Result<()> {
    let (spec, text) = Spec::load(&o.scenario)?;
    // `--dry-run` still lists the points: every stack runs the same ones.
    if !spec.stack.is_empty() && spec.runtime == Runtime::Candle && !o.dry_run {
        return Err(crate::error::bad_file(
            &o.scenario,
            "`stack` is an axis of PyTorch's software stacks: set runtime = \"torch\" (the \
             torch probe measures each stack; vramlab's own workloads run candle)",
        ));
    }
    let device_spec = o.device.clone().unwrap_or_else(|| spec.device.clone());
    if !o.dry_run {
        torch::check_device(spec.runtime, &device_spec)
            .map_err(|e| crate::error::bad_file(&o.scenario, e))?;
    }
    let stacks = match (spec.runtime, spec.stack.is_empty()) {
        (Runtime::Torch, false) => spec.stack.clone(),
        _ => vec![Stack::Default],
    };
    if let Some(why) = stacks.iter().find_map(|s| s.without_probe()) {
        return Err(crate::error::bad_file(&o.scenario, why));
    }
    if stacks.len() == 1 || o.dry_run || o.worker.is_some() {
        return run_stack(o, &spec, &text, device_spec, stacks[0]);
    }
    // Several stacks: the whole sweep under each, one CSV each; a stack that fails does not
    // stop the others, and the first failure is the sweep's.
    let out = output::path(o.out.as_deref(), &spec.name)?;
    let mut first_err = None;
    for stack in stacks {
        let o = Options {
            out: Some(torch::stack_out(&out, stack)),
            ..o.clone()
        };
        eprintln!(
            "stack {stack} -> {}",
            o.out.as_deref().unwrap_or(&out).display()
        );
        if let Err(e) = run_stack(&o, &spec, &text, device_spec.clone(), stack) {
            eprintln!("stack {stack}: {e:#}");
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The sweep under one software stack (candle's sweeps have the default one only).
fn run_stack(
    o: &Options,
    spec: &Spec,
    text: &str,
    device_spec: String,
    stack: Stack,
) -> Result<()> {
    let shard = match &o.shard {
        Some(s) => Some(s.parse::<Shard>().map_err(InputError::arg)?),
        None => None,
    };
    let plan = Plan::of(&o.scenario, spec)?;
    let capacity = match &o.capacity {
        Some(c) => Some(
            crate::units::parse_size(c).map_err(|e| InputError::arg(format!("--capacity: {e}")))?,
        ),
        None => None,
    };
    let r = Run {
        o,
        spec,
        text,
        shard,
        out: PathBuf::new(),
        device_spec,
        capacity,
        scenario_hash: short_hash(text.as_bytes()),
        stack,
    };
    match plan {
        Plan::Llm(points) => llm::run(r, points),
        Plan::Gen(points) => pipeline::run(r, pipeline::Points::Gen(points)),
        Plan::Ft(points) => pipeline::run(r, pipeline::Points::Ft(points)),
    }
}

/// The points of `shard` (all without one), in order.
pub fn keep<P: Clone>(
    points: Vec<P>,
    shard: Option<Shard>,
    select: impl Fn(&[P], Shard) -> Vec<usize>,
) -> Vec<P> {
    match shard {
        Some(s) => select(&points, s)
            .into_iter()
            .map(|i| points[i].clone())
            .collect(),
        None => points,
    }
}

/// `--dry-run`: the point ids, one per line, or (`--json`) the points themselves as
/// `{"scenario": ..., "plan": PLAN, "points": [...]}`: the scenario's TOML as vramlab parsed it,
/// PLAN naming the points' kind (`llm`, `generate`, `finetune`). The torch probe reads this
/// and parses no TOML of its own.
pub fn print_points<P: SweepPoint + serde::Serialize>(
    r: &Run<'_>,
    plan: &str,
    points: &[P],
) -> Result<()> {
    if r.o.json {
        let scenario: toml::Value = toml::from_str(r.text)?;
        let doc = serde_json::json!({ "scenario": scenario, "plan": plan, "points": points });
        println!("{}", serde_json::to_string(&doc)?);
    } else {
        for p in points {
            println!("{}", p.id());
        }
    }
    Ok(())
}

/// A worker's `--worker START:END`, checked against `n` points.
pub fn worker_range(range: &str, n: usize) -> Result<Range<usize>> {
    range
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .filter(|&(a, b)| a < b && b <= n)
        .map(|(a, b)| a..b)
        .ok_or_else(|| InputError::arg(format!("--worker {range}: bad range")).into())
}

/// A worker's side before it measures: marks the process a worker, opens the device with its
/// meter and reports the device's facts to the parent; returns the context of its rows.
pub fn start_worker(
    r: &Run<'_>,
) -> Result<(
    candle_core::Device,
    Box<dyn crate::meter::Meter>,
    runner::RunContext,
)> {
    crate::progress::become_worker();
    let pool_release = r.spec.pool_release;
    let (device, meter) = crate::device::open_with(&r.device_spec, pool_release)?;
    let facts = crate::device::gpu_facts(&device);
    if let Some(f) = &facts {
        // The parent puts these in the manifest.
        crate::progress::report_device(&serde_json::json!({
            "gpu": f,
            "pool": crate::meter::pool::pool_json(meter.kind(), pool_release),
        }));
    }
    let ctx = runner::RunContext {
        run_id: r.o.run_id.clone().unwrap_or_default(),
        scenario_hash: r.scenario_hash.clone(),
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
    Ok((device, meter, ctx))
}

/// The parent's side, every mode alike: once the points are checked, opens (or resumes) the
/// output under its lock, writes the manifest (`weights()` gives its weight files), runs every
/// unfinished point in workers (one per group of `groups`), records a dead worker's point
/// (`failed_base` gives its row's fields), finishes the manifest and prints the summary. Exit
/// 1 when a point failed.
pub fn parent<P: SweepPoint>(
    r: &Run<'_>,
    points: &[P],
    groups: &[Range<usize>],
    weights: impl FnOnce() -> Result<Vec<WeightInfo>>,
    failed_base: &dyn Fn(&P, &runner::RunContext, crate::vocab::MeterKind) -> Result<Record>,
) -> Result<()> {
    let o = r.o;
    let out = &r.out;
    // One clean line for a missing device or an unusable torch environment, before any worker
    // starts.
    let probe = match r.spec.runtime {
        Runtime::Candle => {
            crate::device::probe(&r.device_spec)?;
            None
        }
        Runtime::Torch | Runtime::Vllm => Some(torch::Probe::open(r)?),
    };
    // vramlab's CUDA build on an emulated GPU: its workers run under the stubs.
    let emulator = match (&probe, crate::device::emulated_gpu(&r.device_spec)) {
        (None, Some(gpu)) => Some(emulated::EmulatedWorkers::new(gpu, r.capacity)?),
        _ => None,
    };
    let _lock = output::lock(out)?;
    let shard = r.shard.map(|s| s.to_string());
    let mut done = output::resume_or_create(
        out,
        output::Open {
            fresh: o.fresh,
            resume: o.resume,
        },
        shard.clone(),
        &r.scenario_hash,
        points,
    )?;
    // What the earlier run's workers reported, for a resume whose points were all done.
    let earlier: Option<serde_json::Value> = (!done.is_empty())
        .then(|| std::fs::read_to_string(crate::export::manifest::Manifest::path_for(out)).ok())
        .flatten()
        .and_then(|t| serde_json::from_str(&t).ok());
    // An emulated GPU's models are built from their configs: no weights are read.
    let weights = match &probe {
        Some(_) if torch::emulated_gpu(&r.device_spec).is_some() => Vec::new(),
        _ => weights()?,
    };
    let started_at = runner::now_rfc3339();
    // Fixed width: workers receive it, and its length must not vary between runs.
    let run_id = format!(
        "{}-{:08x}",
        started_at.replace([':', '-'], ""),
        std::process::id()
    );
    let cpu = r.device_spec == "cpu";
    let ctx = runner::RunContext {
        run_id: run_id.clone(),
        scenario_hash: r.scenario_hash.clone(),
        backend: if cpu { Backend::Cpu } else { Backend::Cuda },
        device_name: match (&emulator, cpu) {
            (Some(e), _) => e.device_name(),
            (None, true) => crate::device::name(&candle_core::Device::Cpu),
            (None, false) => r.device_spec.clone(),
        },
        ..Default::default()
    };
    let mut manifest = output::manifest(output::ManifestIn {
        run_id: &run_id,
        started_at,
        out,
        scenario: &o.scenario,
        scenario_hash: &r.scenario_hash,
        text: r.text,
        backend: ctx.backend,
        device: &r.device_spec,
        device_name: ctx.device_name.clone(),
        weights,
        points: points.len(),
        shard: shard.clone(),
        capacity: r.capacity,
    });
    if let Some(p) = &probe {
        manifest.runtime = "torch".into();
        manifest.stack = Some(p.stack());
    }
    manifest.write()?;
    eprintln!(
        "sweep {}{}: {} points -> {}",
        r.spec.name,
        shard
            .as_ref()
            .map(|s| format!(" shard {s}"))
            .unwrap_or_default(),
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
        if let Some(p) = &probe {
            return p.command(r, &run_id, points[start..end].iter().map(|p| p.id()));
        }
        let mut args: Vec<String> = vec!["sweep".into(), o.scenario.display().to_string()];
        args.extend(["--out".into(), out.display().to_string()]);
        args.extend(["--device", &r.device_spec, "--quiet", "--run-id", &run_id].map(String::from));
        args.extend(["--worker".into(), format!("{start:06}:{end:06}")]);
        // On an emulated GPU the capacity is the GPU's memory, not the host's.
        if let (Some(cap), None) = (&o.capacity, &emulator) {
            args.extend(["--capacity".into(), cap.clone()]);
        }
        if let Some(s) = &shard {
            args.extend(["--shard".into(), s.clone()]);
        }
        let mut c = match &emulator {
            Some(e) => e.command(&exe, &args),
            None => {
                let mut c = Command::new(&exe);
                c.args(&args);
                c
            }
        };
        // One-line errors from workers: the parent reports them.
        c.env("RUST_BACKTRACE", "0");
        c
    };
    let bar = runner::progress_bar(points.len());
    bar.inc(done.len() as u64);
    let mut exporter = CsvExporter::append(out)?;
    let meter = match (&probe, cpu) {
        (Some(_), _) => torch::meter(&r.device_spec),
        (None, true) => crate::vocab::MeterKind::CpuAlloc,
        (None, false) if emulator.is_some() => crate::vocab::MeterKind::CudaPoolEmulated,
        (None, false) => crate::vocab::MeterKind::CudaPool,
    };
    let failed_row = |p: &P, phase: Phase, status: Status, peak: Option<u64>, msg: String| {
        let mut r = failed_base(p, &ctx, meter)?;
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
            p.id(),
            r.message
        ));
        Ok(r)
    };
    let mut device_facts: Option<serde_json::Value> = None;
    manifest.workers_started = supervisor::supervise(
        points,
        groups,
        &mut done,
        &base_cmd,
        &mut exporter,
        &failed_row,
        &mut |_| bar.inc(1),
        &mut |facts| device_facts = Some(facts),
    )?;
    if let Some(f) = device_facts.or(earlier) {
        let gpu = &f["gpu"];
        // The torch probe names its device itself ("… (emulated)") and its runtime's versions.
        manifest.device_name = f["device_name"]
            .as_str()
            .or(gpu["name"].as_str())
            .unwrap_or_default()
            .to_string();
        if let Some(rt) = f["runtime"].as_str() {
            manifest.runtime = rt.to_string();
        }
        if !f["probe"].is_null() {
            manifest.probe = Some(f["probe"].clone());
        }
        manifest.versions.cuda_driver = gpu["driver_version"].as_str().unwrap_or_default().into();
        manifest.versions.cuda_runtime = gpu["runtime_version"].as_str().unwrap_or_default().into();
        manifest.pool = f["pool"].clone();
        manifest.gpu = Some(gpu.clone());
    }
    bar.finish_and_clear();

    let counts = output::status_counts(out, points)?;
    manifest.finished_at = Some(runner::now_rfc3339());
    manifest.status_counts = counts.clone();
    manifest.write()?;
    if !o.quiet {
        summary::print(out)?;
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
