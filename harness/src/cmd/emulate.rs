//! `vramlab emulate --gpu GPU -- COMMAND ARGS...`: runs a PyTorch program on an emulated GPU
//! and prints PyTorch's own allocated and reserved peaks and the NVML-equivalent, per marked
//! phase or per optimizer step (docs/src/guides/emulator.md).
use crate::emulate::catalogue::{self, Gpu, CONTEXT_BYTES, CONTEXT_SOURCE};
use crate::emulate::report::{self, Describe, Outcome, Report, Span};
use crate::emulate::{python_for, stubs_for, which, Launch};
use crate::error::InputError;
use crate::units::{gb, gib};
use crate::vocab::{Mode, Precision};
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the program ran and fits; 1 it ran out of memory on the \
emulated GPU (PyTorch's own message is printed); 2 unusable input (unknown GPU, missing program, \
a torch environment without CUDA build or without stubs), or the program failed otherwise.\n\n\
Emulated figures are PyTorch's allocator over a stub CUDA runtime: kernels do not run, device \
data reads as zeros, cuDNN is off (convolutions take PyTorch's native path). They are labelled \
emulated everywhere and never pass for a measurement on a GPU."
)]
pub struct Args {
    /// The GPU to present, from the catalogue: h200, h100-80gb, h100-pcie, a100-80gb,
    /// a100-40gb, l40s, l4, rtx-4090, rtx-3090, v100-16gb, v100-32gb.
    #[arg(long, value_name = "GPU")]
    pub gpu: Option<String>,
    /// Total device memory (e.g. 24GiB, 40GB, bytes): overrides the GPU's, or describes an
    /// H100-like device of that size when no --gpu is given.
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub gpu_memory: Option<u64>,
    /// Build transformers models from their config.json on the emulated device instead of
    /// reading weights (`from_pretrained` reads only the config).
    #[arg(long)]
    pub no_weights: bool,
    /// Print the peaks as JSON (integer bytes) instead of a table.
    #[arg(long)]
    pub json: bool,
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
    let gpu = catalogue::resolve(a.gpu.as_deref(), a.gpu_memory).map_err(InputError::arg)?;
    check_command(&a.command)?;
    let python = python_for(&a.command, a.python.as_deref())?;
    let stubs = stubs_for(&python)?;
    let report_path =
        std::env::temp_dir().join(format!("vramlab-emulate-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report_path);
    let launch = Launch {
        gpu: &gpu,
        stubs: &stubs,
        no_weights: a.no_weights,
        report: &report_path,
    };
    let status = launch
        .command(&a.command)
        .status()
        .with_context(|| format!("starting {}", a.command[0]))?;
    if !report_path.exists() {
        return Err(InputError::arg(format!(
            "`{}` wrote no emulator report (exit {}): is it a Python program that imports torch?",
            a.command.join(" "),
            status.code().map_or("by signal".into(), |c| c.to_string())
        ))
        .into());
    }
    let rep = Report::read(&report_path);
    let _ = std::fs::remove_file(&report_path);
    let rep = rep?;
    if let Some(out) = &a.out {
        write_csv(out, &rep, &gpu, &a)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json(&rep, &gpu))?);
    } else {
        print_table(&rep, &gpu);
    }
    match rep.outcome {
        Outcome::Oom => anyhow::bail!(
            "out of memory on {}: {}",
            gpu.row_name(),
            rep.message.lines().next().unwrap_or("")
        ),
        Outcome::Error => Err(InputError::arg(format!(
            "the program failed under emulation: {}",
            rep.message.lines().next().unwrap_or("")
        ))
        .into()),
        Outcome::Ok if !status.success() => Err(InputError::arg(format!(
            "the program exited with {} under emulation",
            status.code().map_or("a signal".into(), |c| c.to_string())
        ))
        .into()),
        Outcome::Ok => Ok(()),
    }
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

fn json(rep: &Report, gpu: &Gpu) -> serde_json::Value {
    let run = rep.run.clone().unwrap_or_default();
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
        },
        "torch": rep.torch,
        "cuda": rep.cuda,
        "outcome": rep.outcome,
        "message": rep.message,
        "fits": rep.outcome == Outcome::Ok,
        "run": span_json(&run),
        "phases": rep.phases.iter().map(span_json).collect::<Vec<_>>(),
        "steps": rep.steps.iter().map(span_json).collect::<Vec<_>>(),
        "notes": rep.notes,
    })
}

fn print_table(rep: &Report, gpu: &Gpu) {
    println!(
        "{} — {} total, {} usable after the CUDA context ({}); torch {} (CUDA {})",
        gpu.row_name(),
        crate::units::gb_gib(gpu.total_bytes),
        crate::units::gb_gib(gpu.usable_bytes()),
        crate::units::human(CONTEXT_BYTES),
        rep.torch.as_deref().unwrap_or("?"),
        rep.cuda.as_deref().unwrap_or("?"),
    );
    println!(
        "{:<14} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "phase", "step", "alloc GB", "alloc GiB", "reserv GB", "reserv GiB", "nvml GB", "nvml GiB"
    );
    let line = |s: &Span| {
        println!(
            "{:<14} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            s.name,
            s.step.map_or(String::new(), |n| n.to_string()),
            gb(s.peak_allocated),
            gib(s.peak_allocated),
            gb(s.peak_reserved),
            gib(s.peak_reserved),
            gb(s.nvml_used()),
            gib(s.nvml_used()),
        )
    };
    rep.rows().iter().for_each(line);
    if let Some(run) = &rep.run {
        line(run);
    }
    for n in &rep.notes {
        println!("note: {n}");
    }
    let verdict = match rep.outcome {
        Outcome::Ok => "yes",
        Outcome::Oom => "no (out of memory)",
        Outcome::Error => "unknown (the program failed)",
    };
    println!("fits on {}: {verdict}", gpu.row_name());
}
