//! `vramlab emulate --gpu GPU -- COMMAND ARGS...`: runs a PyTorch program on an emulated GPU
//! and prints PyTorch's own allocated and reserved peaks and the NVML-equivalent, per marked
//! phase or per optimizer step (docs/src/guides/emulator.md).
use crate::emulate::records::Process;
use crate::emulate::report::{self, Describe, Report, Span};
use crate::emulate::supervise::{signal_name, Ending, Finished};
use crate::emulate::verdict::{self, Verdict};
use crate::emulate::{python_for, stubs_for, which, Launch, ProgramOutput};
use crate::error::{InputError, NoVerdict};
use crate::gpu::{self, Gpu, CONTEXT_BYTES, CONTEXT_SOURCE};
use crate::units::{gb, gib};
use crate::vocab::{Mode, Precision};
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the program ran and fits; 1 it ran out of memory on the \
emulated GPU (PyTorch's own message is printed), or the figures are partial (a process was \
killed, stopped at --timeout, interrupted, or failed: the report says which, with what it saw \
up to then); 2 unusable input (unknown GPU, missing program, a torch environment without CUDA \
build or without stubs); 3 the program put nothing on the emulated GPU, so there is no \
verdict.\n\n\
Every process the program starts runs on the emulated GPU too (spawned, forked and torchrun \
workers) and is reported on its own; the verdict is per device, and names the process that \
held the peak.\n\n\
Emulated figures are PyTorch's allocator over a stub CUDA runtime: kernels do not run, device \
data reads as zeros, cuDNN is off (convolutions take PyTorch's native path). They are labelled \
emulated everywhere and never pass for a measurement on a GPU."
)]
pub struct Args {
    /// The GPU to present: any NVIDIA GPU `vramlab gpus` lists, by any of its names (h100-80gb,
    /// h100, a100-40gb, l4, rtx-4090 or rtx4090, b200, …).
    #[arg(long, value_name = "GPU")]
    pub gpu: Option<String>,
    /// Total device memory (e.g. 24GiB, 40GB, bytes): overrides the GPU's, or describes an
    /// H100-like device of that size when no --gpu is given.
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub gpu_memory: Option<u64>,
    /// How many such GPUs to present (1 to 16): `torchrun --nproc-per-node N` ranks each take
    /// theirs with `torch.cuda.set_device(LOCAL_RANK)`, and vLLM's `tensor_parallel_size=N`
    /// runs a worker on each. The ranks talk through an emulated NCCL that moves nothing and
    /// holds none of real NCCL's own buffers.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=crate::emulate::MAX_DEVICES))]
    pub devices: u64,
    /// Stop the program after this long (e.g. 90s, 10m, 2h; 0 for never), report what was seen
    /// up to then as partial, and exit 1. Kernels do not run, so emulated programs are fast:
    /// one that runs this long is usually waiting on a device value, which reads as zero here.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = crate::emulate::supervise::parse_timeout)]
    pub timeout: crate::emulate::supervise::Timeout,
    /// Build transformers models from their config.json on the emulated device instead of
    /// reading weights (`from_pretrained` reads only the config).
    #[arg(long)]
    pub no_weights: bool,
    /// Print the report as JSON (integer bytes) instead of a table, alone on standard output:
    /// the program's own standard output goes to standard error.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file (the table still goes to standard output).
    #[arg(long, value_name = "FILE.json")]
    pub json_out: Option<PathBuf>,
    /// Also write the rows in vramlab's CSV schema (meter `torch-emulated`) to this file.
    #[arg(long, value_name = "FILE.csv", requires_all = ["model_id", "precision"])]
    pub out: Option<PathBuf>,
    /// The CSV's model_id (with --out).
    #[arg(long)]
    pub model_id: Option<String>,
    /// The CSV's precision (with --out): the program's, which the emulator cannot read.
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// The CSV's mode (with --out; default: train when the program stepped an optimizer).
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// The CSV's batch (with --out).
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// The CSV's sequence length (with --out).
    #[arg(long, default_value_t = 0)]
    pub context: u64,
    /// The Python whose torch the stubs are built for (default: the command when it is a
    /// Python interpreter, else python3 on PATH).
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let gpu = gpu::resolve(a.gpu.as_deref(), a.gpu_memory).map_err(InputError::arg)?;
    check_command(&a.command)?;
    if let Some(p) = &a.json_out {
        check_writable(p)?;
    }
    let python = python_for(&a.command, a.python.as_deref())?;
    let stubs = stubs_for(&python)?;
    let launch = Launch {
        gpu: &gpu,
        devices: a.devices as usize,
        stubs: &stubs,
        no_weights: a.no_weights,
        timeout: a.timeout.0,
        stdout: if a.json {
            ProgramOutput::ToStderr
        } else {
            ProgramOutput::Inherit
        },
        capture_stderr: false,
        offline: false,
    };
    let finished = launch.run(&a.command)?;
    let verdict = verdict::judge(&finished);
    let primary = finished.collected.peak_process().cloned();
    let rep = primary
        .as_ref()
        .and_then(|p| p.python.clone())
        .unwrap_or_default();
    if let Some(out) = &a.out {
        if primary.is_some() {
            write_csv(out, &rep, &gpu, &a)?;
        }
    }
    let doc = json(&finished, &verdict, primary.as_ref(), &rep, &gpu, a.devices);
    if let Some(p) = &a.json_out {
        std::fs::write(p, serde_json::to_string_pretty(&doc)? + "\n")
            .map_err(|e| crate::error::bad_file(p, format!("cannot write: {e}")))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(&finished, &verdict, primary.as_ref(), &rep, &gpu);
    }
    match verdict {
        Verdict::Fits => Ok(()),
        Verdict::DoesNotFit { pid, message } => anyhow::bail!(
            "out of memory on {} (process {pid}): {}",
            gpu.row_name(),
            message
        ),
        Verdict::Unknown(why) => anyhow::bail!("partial report, no verdict: {why}"),
        Verdict::NothingObserved(how) => Err(NoVerdict(format!(
            "no CUDA memory was observed on the emulated GPU (the program {how}): no verdict. \
             Does it put anything on `cuda`?"
        ))
        .into()),
    }
}

/// A `--json-out` file that cannot be written is refused before the program runs.
fn check_writable(p: &std::path::Path) -> Result<()> {
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(crate::error::bad_file(p, "its folder does not exist"));
    }
    Ok(())
}

/// A missing program, or a Python script that does not exist, is one line (exit 2).
fn check_command(cmd: &[String]) -> Result<()> {
    let first = &cmd[0];
    if which(first).is_none() {
        return Err(InputError::arg(format!("{first}: no such program")).into());
    }
    let is_python = std::path::Path::new(first)
        .file_name()
        .and_then(|s| s.to_str())
        .is_some_and(|b| b.starts_with("python"));
    if let Some(script) = cmd.get(1).filter(|s| is_python && s.ends_with(".py")) {
        if !std::path::Path::new(script).is_file() {
            return Err(crate::error::bad_file(script, "no such script"));
        }
    }
    Ok(())
}

fn write_csv(out: &std::path::Path, rep: &Report, gpu: &Gpu, a: &Args) -> Result<()> {
    let describe = Describe {
        model_id: a.model_id.clone().unwrap_or_default(),
        mode: a.mode.unwrap_or(if rep.steps.is_empty() {
            Mode::Infer
        } else {
            Mode::Train
        }),
        precision: a.precision.unwrap_or_default(),
        batch: a.batch,
        context: a.context,
    };
    let run_id = format!(
        "emu-{}-{:08x}",
        crate::sweep::runner::now_rfc3339().replace([':', '-'], ""),
        std::process::id()
    );
    let rows = report::records(rep, gpu, &describe, &run_id)?;
    let mut w = crate::export::csv::CsvExporter::create(out)?;
    for r in &rows {
        crate::export::Exporter::write(&mut w, r)?;
    }
    Ok(())
}

fn span_json(s: &Span) -> serde_json::Value {
    serde_json::json!({
        "name": s.name,
        "step": s.step,
        "max_memory_allocated": s.peak_allocated,
        "max_memory_reserved": s.peak_reserved,
        "nvml_used": s.nvml_used(),
        "end_allocated": s.end_allocated,
        "end_reserved": s.end_reserved,
    })
}

fn ending_json(e: Ending) -> serde_json::Value {
    match e {
        Ending::Exited(code) => serde_json::json!({"kind": "exited", "code": code}),
        Ending::Signal(s) => serde_json::json!({"kind": "signal", "signal": signal_name(s)}),
        Ending::TimedOut(t) => serde_json::json!({"kind": "timeout", "seconds": t.as_secs_f64()}),
        Ending::Interrupted(s) => {
            serde_json::json!({"kind": "interrupted", "signal": signal_name(s)})
        }
    }
}

/// Each process's figures: PyTorch's peaks where its report was written, the stubs' bytes
/// always.
fn process_json(p: &Process) -> serde_json::Value {
    let run = p.python.as_ref().and_then(|r| r.run.clone());
    let d = p.driver.as_ref();
    serde_json::json!({
        "pid": p.pid,
        "ppid": p.ppid,
        "command": p.command,
        "status": p.status(),
        "device": p.device(),
        "max_memory_allocated": run.as_ref().map(|s| s.peak_allocated),
        "max_memory_reserved": run.as_ref().map(|s| s.peak_reserved),
        "peak_driver": p.peak_driver(),
        "nvml_used": p.peak_driver() + CONTEXT_BYTES,
        "cudnn": p.python.as_ref().map(|r| r.cudnn),
        "device_to_host_reads": d.map_or(0, |d| d.d2h_reads),
        "emulator_errors": d.map_or(0, |d| d.errors),
        "last_emulator_error": d.map(|d| d.last_error.clone()).filter(|e| !e.is_empty()),
        "stopped_at": p.stopped_at(),
        "message": p.python.as_ref().map(|r| r.message.clone()).unwrap_or_default(),
        "vllm": p.python.as_ref().and_then(|r| r.vllm.as_ref()).map(|v| v.json()),
    })
}

fn json(
    f: &Finished,
    v: &Verdict,
    primary: Option<&Process>,
    rep: &Report,
    gpu: &Gpu,
    devices: u64,
) -> serde_json::Value {
    let run = rep.run.clone().unwrap_or_default();
    let notes = rep.notes.clone();
    serde_json::json!({
        "emulated": true,
        "gpu": {
            "key": gpu.key,
            "name": gpu.row_name(),
            "total_bytes": gpu.total_bytes,
            "usable_bytes": gpu.usable_bytes(),
            "compute_capability": format!("{}.{}", gpu.compute_capability.0, gpu.compute_capability.1),
            "context_bytes": CONTEXT_BYTES,
            "context_source": CONTEXT_SOURCE,
            "source": gpu.source,
            "count": devices,
        },
        "torch": rep.torch,
        "cuda": rep.cuda,
        "status": v.status(),
        "fits": v.fits(),
        "reason": match v {
            Verdict::Unknown(why) | Verdict::NothingObserved(why) => why.clone(),
            _ => String::new(),
        },
        "ending": ending_json(f.ending),
        "outcome": rep.outcome,
        "message": rep.message,
        "peak_process": primary.map(|p| p.pid),
        "run": span_json(&run),
        "phases": rep.phases.iter().map(span_json).collect::<Vec<_>>(),
        "steps": rep.steps.iter().map(span_json).collect::<Vec<_>>(),
        "processes": f.collected.processes.iter().filter(|p| p.observed()).map(process_json).collect::<Vec<_>>(),
        // vLLM's startup lines, by the process that logged them (its engine core, a worker per
        // rank), whether it used the device or not (under tensor parallelism the engine core,
        // which prints the KV tokens, holds nothing there).
        "vllm": f.collected.processes.iter().filter_map(|p| {
            let v = p.python.as_ref()?.vllm.as_ref()?;
            let mut j = v.json();
            j["pid"] = p.pid.into();
            Some(j)
        }).collect::<Vec<_>>(),
        "devices": verdict::devices(f, v, gpu.total_bytes),
        "notes": notes,
    })
}

fn print_table(f: &Finished, v: &Verdict, primary: Option<&Process>, rep: &Report, gpu: &Gpu) {
    let runtime = match &rep.torch {
        Some(t) => format!("torch {t} (CUDA {})", rep.cuda.as_deref().unwrap_or("?")),
        // vramlab's CUDA build, a candle program: the stubs' own records only.
        None => "no PyTorch report (the figures are the stubs' own)".to_string(),
    };
    println!(
        "{} — {} total, {} usable after the CUDA context ({}); {runtime}",
        gpu.row_name(),
        crate::units::gb_gib(gpu.total_bytes),
        crate::units::gb_gib(gpu.usable_bytes()),
        crate::units::human(CONTEXT_BYTES),
    );
    let head = |first: &str, second: &str| {
        println!(
            "{:<14} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            first,
            second,
            "alloc GB",
            "alloc GiB",
            "reserv GB",
            "reserv GiB",
            "nvml GB",
            "nvml GiB"
        )
    };
    let line =
        |first: &str, second: String, alloc: Option<u64>, reserved: Option<u64>, nvml: u64| {
            let opt = |b: Option<u64>, f: fn(u64) -> String| b.map_or("-".to_string(), f);
            println!(
                "{:<14} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
                first,
                second,
                opt(alloc, gb),
                opt(alloc, gib),
                opt(reserved, gb),
                opt(reserved, gib),
                gb(nvml),
                gib(nvml),
            )
        };
    let span = |s: &Span| {
        let step = s.step.map_or(String::new(), |n| n.to_string());
        line(
            &s.name,
            step,
            Some(s.peak_allocated),
            Some(s.peak_reserved),
            s.nvml_used(),
        )
    };
    if rep.run.is_some() {
        head("phase", "step");
        rep.rows().iter().for_each(span);
        if let Some(run) = &rep.run {
            span(run);
        }
    }
    let observed: Vec<&Process> = f.collected.observed().collect();
    if observed.len() > 1 || primary.is_some_and(|p| p.python.is_none()) {
        println!("processes (peak on one device; \"-\": no report of PyTorch's own):");
        head("pid", "dev");
        for p in &observed {
            let run = p.python.as_ref().and_then(|r| r.run.clone());
            line(
                &p.pid.to_string(),
                p.device().map_or("?".into(), |d| d.to_string()),
                run.as_ref().map(|s| s.peak_allocated),
                run.as_ref().map(|s| s.peak_reserved),
                p.peak_driver() + CONTEXT_BYTES,
            );
            println!(
                "               {} [{}]",
                verdict::short(&p.command),
                p.status()
            );
        }
    }
    for p in &f.collected.processes {
        if let Some(v) = p.python.as_ref().and_then(|r| r.vllm.as_ref()) {
            println!(
                "vLLM's startup, process {} ({}):",
                p.pid,
                verdict::short(&p.command)
            );
            for l in v.table() {
                println!("  {l}");
            }
        }
    }
    if let Some(p) = primary.filter(|p| observed.len() > 1 || p.pid != f.root_pid) {
        println!(
            "the peak: process {} ({})",
            p.pid,
            verdict::short(&p.command)
        );
    }
    for n in &rep.notes {
        println!("note: {n}");
    }
    let devices = verdict::devices(f, v, gpu.total_bytes);
    match v {
        Verdict::NothingObserved(how) => {
            println!("no CUDA memory was observed (the program {how}): no verdict")
        }
        Verdict::Unknown(why) => println!("partial report, no verdict: {why}"),
        _ => {}
    }
    for d in &devices {
        let name = if devices.len() > 1 || d.index > 0 {
            format!("{} #{}", gpu.row_name(), d.index)
        } else {
            gpu.row_name()
        };
        match d.fits {
            Some(true) => println!("fits on {name}: yes"),
            Some(false) => println!("fits on {name}: no (out of memory)"),
            None if matches!(v, Verdict::Unknown(_)) => println!(
                "device {}: {} used at most so far (partial)",
                d.index,
                crate::units::gb_gib(d.peak_nvml_used)
            ),
            None => {}
        }
    }
}
