//! An estimate's query run for real on an emulated GPU (`vramlab estimate --emulate GPU`): the
//! torch probe runs that one configuration (three training steps, or a prefill and decode) with
//! the model built from its config on the device, and PyTorch's own allocator answers.
use super::report::{Outcome, Report};
use super::supervise::{Ending, Finished};
use super::{Launch, ProgramOutput};
use crate::gpu::Gpu;
use crate::record::Status;
use crate::vocab::{
    Attention, Checkpointing, KvKind, LoraTargets, Mode, Optimizer, OptimizerImpl, Precision,
    Trainable,
};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// `--emulate-timeout`'s default: how long a query or a peer's program may run on the emulated
/// GPU before it is stopped. The largest take about a minute (kernels do not run), so ten is a
/// hang.
pub const DEFAULT_TIMEOUT: &str = "10m";

/// The configuration to run.
pub struct Query<'a> {
    /// The model's `config.json` (the normalized config written back in HF's form).
    pub config: &'a serde_json::Value,
    pub mode: Mode,
    pub precision: Precision,
    pub batch: u64,
    pub context: u64,
    pub optimizer: Optimizer,
    pub optimizer_impl: OptimizerImpl,
    pub checkpointing: bool,
    pub trainable: Trainable,
    /// The modules LoRA adapts (peft's `target_modules` and `target_parameters`).
    pub lora_targets: LoraTargets,
    /// peft's `lora_dropout` (0: none, peft's default).
    pub lora_dropout: f64,
    pub attention: Attention,
    pub kv_cache: KvKind,
    /// Training ranks of FSDP full shard: the probe runs rank 0 of them in one process
    /// (`--gpus`, torch's fake process group); 1 for one GPU.
    pub gpus: u64,
    /// FSDP's CPU offload of the ranks' shards (`--offload`).
    pub offload: bool,
    /// Stop the probe after this long (`--emulate-timeout`).
    pub timeout: Option<Duration>,
}

/// PyTorch's answer for the query on the emulated GPU, in integer bytes.
#[derive(Clone, Debug, Serialize)]
pub struct Emulated {
    /// `"<name> (emulated)"`.
    pub gpu: String,
    /// The device's total memory (the run's capacity is this less the CUDA context).
    pub gpu_total_bytes: u64,
    pub max_memory_allocated: u64,
    pub max_memory_reserved: u64,
    /// Reserved plus any other cudaMalloc, plus the CUDA context and modules.
    pub nvml_used: u64,
    /// The run finished at the GPU's real capacity (PyTorch freed its cache and retried before
    /// it gave up, so reserved beyond the capacity is not by itself out of memory).
    pub fits: bool,
    pub status: Status,
    pub message: String,
    pub torch: Option<String>,
}

/// The scenario the probe runs: one point.
fn scenario(q: &Query, config: &Path) -> Result<String> {
    /// The probe's scenario for one point, as the scenario format spells it (serialized, so
    /// a path or value is always quoted and escaped as TOML wants).
    #[derive(Serialize)]
    struct Scenario {
        name: &'static str,
        device: &'static str,
        model: Model,
        sweep: Sweep,
    }
    #[derive(Serialize)]
    struct Model {
        source: String,
    }
    #[derive(Serialize)]
    struct Sweep {
        mode: [Mode; 1],
        precision: [Precision; 1],
        batch: [u64; 1],
        context: [u64; 1],
        #[serde(skip_serializing_if = "Option::is_none")]
        optimizer: Option<[Optimizer; 1]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        checkpointing: Option<[Checkpointing; 1]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        trainable: Option<[Trainable; 1]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        train_steps: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kv_cache: Option<[KvKind; 1]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        decode_steps: Option<u64>,
    }
    let train = q.mode == Mode::Train;
    let infer = q.mode == Mode::Infer;
    let s = Scenario {
        name: "estimate-emulated",
        device: "cuda:0",
        model: Model {
            source: format!("synthetic:{}", config.display()),
        },
        sweep: Sweep {
            mode: [q.mode],
            precision: [q.precision],
            batch: [q.batch],
            context: [q.context],
            // The probe's own implementation comes from --torch-optim.
            optimizer: train.then_some([if q.optimizer.is_sgd() {
                Optimizer::Sgd
            } else {
                Optimizer::Adamw
            }]),
            checkpointing: train.then_some([if q.checkpointing {
                Checkpointing::Layer
            } else {
                Checkpointing::None
            }]),
            trainable: train.then_some([q.trainable]),
            train_steps: train.then_some(3),
            kv_cache: infer.then_some([q.kv_cache]),
            decode_steps: infer.then(|| 16.min(q.context.saturating_sub(1)).max(1)),
        },
    };
    Ok(toml::to_string(&s)?)
}

/// Runs the query under `python`'s torch on `gpu`, with the stubs in `stubs`.
pub fn run(q: &Query, gpu: &Gpu, python: &Path, stubs: &Path) -> Result<Emulated> {
    let dir = std::env::temp_dir().join(format!("vramlab-estimate-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = run_in(q, gpu, python, stubs, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(q: &Query, gpu: &Gpu, python: &Path, stubs: &Path, dir: &Path) -> Result<Emulated> {
    let config = dir.join("config.json");
    std::fs::write(&config, serde_json::to_string_pretty(q.config)?)?;
    let scen = dir.join("scenario.toml");
    std::fs::write(&scen, scenario(q, &config)?)?;
    let csv = dir.join("rows.csv");
    let attention = match q.attention {
        Attention::Eager => "eager",
        _ => "sdpa",
    };
    let mut argv: Vec<String> = vec![
        python.to_string_lossy().into_owned(),
        super::probe_dir()?.to_string_lossy().into_owned(),
        scen.to_string_lossy().into_owned(),
        "--device".into(),
        "cuda:0".into(),
        "--out".into(),
        csv.to_string_lossy().into_owned(),
        "--torch-optim".into(),
        q.optimizer_impl.as_str().into(),
        "--attention".into(),
        attention.into(),
        "--gpus".into(),
        q.gpus.to_string(),
        // A LoRA query's adapters as labs add them: peft's get_peft_model with its defaults.
        "--lora".into(),
        "peft".into(),
    ];
    if q.offload {
        argv.push("--offload".into());
    }
    if !q.lora_targets.is_default() {
        argv.extend(["--lora-targets".into(), q.lora_targets.to_string()]);
    }
    if q.lora_dropout > 0.0 {
        argv.extend(["--lora-dropout".into(), q.lora_dropout.to_string()]);
    }
    let (finished, last) = launch(&argv, gpu, stubs, "the torch probe", q.timeout)?;
    let rep = primary(&finished);
    anyhow::ensure!(
        csv.exists() && rep.is_some(),
        "the torch probe on the emulated GPU failed ({}): {last}",
        super::verdict::ending_text(finished.ending)
    );
    let rep = rep.expect("checked");
    let rows = crate::export::csv::read(&csv)?;
    // An out-of-memory error the probe did not catch (in its warm-up, say) ends the run: the
    // report has it. A row the probe recorded `oom` or `error` is the other way to fail.
    let uncaught = uncaught(&rep, "the torch probe")?;
    anyhow::ensure!(
        uncaught.is_some() || !rows.is_empty(),
        "the torch probe wrote no rows on the emulated GPU ({}): {last}",
        super::verdict::ending_text(finished.ending)
    );
    let failed = uncaught.or_else(|| {
        rows.iter()
            .find(|r| matches!(r.status, Some(Status::Oom) | Some(Status::Error)))
            .map(|r| (r.status.unwrap_or(Status::Error), r.message.clone()))
    });
    let mut e = answer(gpu, rep, failed);
    if e.fits {
        if let Some(p) = point_peaks(&rows) {
            (e.max_memory_allocated, e.max_memory_reserved, e.nvml_used) = p;
        }
    }
    Ok(e)
}

/// The query's own figures: the highest peaks of its point's rows (allocated, reserved, and
/// reserved plus what the device held outside the pool: NVML's used), the figures the
/// calibration corpus records. The process's peak is not the query's: the probe's unmeasured
/// warm-up before the point (a prefill into a `DynamicCache` rather than the query's cache, or
/// a rehearsed step) can hold more, and the point starts from an emptied pool.
fn point_peaks(rows: &[crate::record::Record]) -> Option<(u64, u64, u64)> {
    let ok: Vec<_> = rows
        .iter()
        .filter(|r| r.status == Some(Status::Ok))
        .collect();
    let allocated = ok.iter().filter_map(|r| r.peak_allocated).max()?;
    let reserved = ok.iter().filter_map(|r| r.peak_reserved).max()?;
    let used = ok
        .iter()
        .filter_map(|r| Some(r.peak_reserved? + r.non_pool?))
        .max()?;
    Some((allocated, reserved, used))
}

/// Runs `argv` on the emulated `gpu` with the stubs in `stubs`, offline, stopped after
/// `timeout`: how it ended, with what its processes recorded, and the last line of its stderr
/// (`what` names it in errors). A run stopped at the timeout is an error naming where it was.
fn launch(
    argv: &[String],
    gpu: &Gpu,
    stubs: &Path,
    what: &str,
    timeout: Option<Duration>,
) -> Result<(Finished, String)> {
    let launch = Launch {
        gpu,
        devices: 1,
        stubs,
        no_weights: false,
        timeout,
        stdout: ProgramOutput::Discard,
        capture_stderr: true,
        offline: true,
    };
    let finished = launch
        .run(argv)
        .with_context(|| format!("running {what} on the emulated GPU"))?;
    let last = super::last_line(&finished.stderr).unwrap_or_default();
    if let Ending::TimedOut(_) = finished.ending {
        let hint = super::verdict::hang_hint(&finished).unwrap_or_default();
        anyhow::bail!(
            "{what} on the emulated GPU {}; {hint}",
            super::verdict::ending_text(finished.ending)
        );
    }
    Ok((finished, last))
}

/// The report of the process that held the peak (the program's own, for one process).
fn primary(f: &Finished) -> Option<Report> {
    f.collected
        .peak_process()
        .or(f.collected.processes.first())
        .and_then(|p| p.python.clone())
}

/// How the boot's report says the program ended: out of memory (PyTorch's message), or an
/// error naming `what` and the exception's first line; `None` when it finished.
fn uncaught(rep: &Report, what: &str) -> Result<Option<(Status, String)>> {
    match rep.outcome {
        Outcome::Ok => Ok(None),
        Outcome::Oom => Ok(Some((Status::Oom, rep.message.clone()))),
        Outcome::Error | Outcome::Terminated => anyhow::bail!(
            "{what} failed on the emulated GPU: {}",
            rep.message.lines().next().unwrap_or("")
        ),
    }
}

/// The figures of a finished run, and how it ended.
fn answer(gpu: &Gpu, rep: Report, failed: Option<(Status, String)>) -> Emulated {
    let run = rep.run.clone().unwrap_or_default();
    Emulated {
        gpu: gpu.row_name(),
        gpu_total_bytes: gpu.total_bytes,
        max_memory_allocated: run.peak_allocated,
        max_memory_reserved: run.peak_reserved,
        nvml_used: run.nvml_used(),
        fits: failed.is_none(),
        status: failed.as_ref().map_or(Status::Ok, |f| f.0),
        message: failed
            .map(|f| f.1.lines().next().unwrap_or("").to_string())
            .unwrap_or_default(),
        torch: rep.torch,
    }
}

/// Runs a whole program (`argv`, its interpreter first) on the emulated `gpu`: the peaks of
/// the run as PyTorch's allocator saw them. Out of memory is an answer (`fits` false); any
/// other failure is an error naming the program's last line.
pub fn run_program(
    argv: &[String],
    gpu: &Gpu,
    stubs: &Path,
    timeout: Option<Duration>,
) -> Result<Emulated> {
    let (finished, last) = launch(argv, gpu, stubs, &argv[1], timeout)?;
    let rep = primary(&finished).ok_or_else(|| {
        anyhow::anyhow!(
            "{} failed on the emulated GPU ({}): {last}",
            argv[1],
            super::verdict::ending_text(finished.ending)
        )
    })?;
    let failed = uncaught(&rep, &argv[1])?;
    Ok(answer(gpu, rep, failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{grid, spec::Spec};

    fn query(config: &serde_json::Value, mode: Mode) -> Query<'_> {
        Query {
            config,
            mode,
            precision: Precision::Bf16,
            batch: 4,
            context: 512,
            optimizer: Optimizer::Sgd,
            optimizer_impl: OptimizerImpl::Foreach,
            checkpointing: true,
            trainable: Trainable::Full,
            lora_targets: LoraTargets::DEFAULT,
            lora_dropout: 0.0,
            attention: Attention::Sdpa,
            kv_cache: KvKind::Growing,
            gpus: 1,
            offload: false,
            timeout: None,
        }
    }

    #[test]
    fn the_probes_scenario_reads_back_as_the_query_whatever_the_path() {
        let config = serde_json::json!({});
        // A path TOML must escape: a quote, a backslash and a space.
        let path = Path::new("/tmp/a \"quoted\" dir\\x/config.json");
        for mode in [Mode::Train, Mode::Infer] {
            let q = query(&config, mode);
            let text = scenario(&q, path).unwrap();
            let spec = Spec::parse(Path::new("scenario.toml"), &text)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let p0 = &grid::expand(&spec)[0];
            assert_eq!(p0.source, format!("synthetic:{}", path.display()));
            let points = grid::expand(&spec);
            assert_eq!(points.len(), 1, "{text}");
            let p = &points[0];
            assert_eq!((p.mode, p.precision), (mode, Precision::Bf16));
            assert_eq!((p.batch, p.context), (4, 512));
            if mode == Mode::Train {
                assert_eq!(p.train.optimizer, Optimizer::Sgd);
                assert_eq!(p.train.checkpointing, Checkpointing::Layer);
                assert_eq!(p.train.trainable, Trainable::Full);
                assert_eq!(p.train.steps, 3);
            } else {
                assert_eq!(p.kv_cache, KvKind::Growing);
                assert_eq!(p.decode_steps, 16);
            }
        }
    }
}
