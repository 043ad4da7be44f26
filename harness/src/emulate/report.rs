//! The report the Python boot writes at the end of an emulated run (`vramlab/_emulate.py`), and
//! the rows vramlab makes of it.
use crate::error::bad_file;
use crate::gpu::{Gpu, CONTEXT_BYTES};
use crate::record::{Phase, Record, Status, SCHEMA_VERSION};
use crate::vocab::{Backend, MeterKind};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One measured interval: PyTorch's allocator statistics and the emulated driver's bytes.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct Span {
    pub name: String,
    pub step: Option<u64>,
    pub baseline_allocated: u64,
    pub peak_allocated: u64,
    pub end_allocated: u64,
    pub baseline_reserved: u64,
    pub peak_reserved: u64,
    pub end_reserved: u64,
    /// Bytes held through cudaMalloc at most: reserved plus anything allocated outside the
    /// caching allocator.
    pub peak_driver: Option<u64>,
    pub elapsed_ms: f64,
}

impl Span {
    /// NVML's "used" on the emulated device: what cudaMalloc held at most, plus the context
    /// and modules.
    pub fn nvml_used(&self) -> u64 {
        self.peak_driver.unwrap_or(self.peak_reserved) + CONTEXT_BYTES
    }
}

/// How the program ended.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    #[default]
    Ok,
    /// PyTorch raised its out-of-memory error (after freeing its cache and retrying).
    Oom,
    /// Another uncaught exception.
    Error,
    /// Stopped by SIGTERM (by vramlab at --timeout, or by a launcher), through its exit handlers.
    Terminated,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct Report {
    pub pid: Option<u32>,
    pub ppid: Option<u32>,
    /// The Python program's `sys.argv`.
    pub argv: Vec<String>,
    /// The CUDA device the process used (`torch.cuda.current_device()` at exit).
    pub device: Option<usize>,
    /// Whether cuDNN was still on at exit (the import hook turns it off under emulation).
    pub cudnn: bool,
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub cuda_initialized: bool,
    pub device_name: Option<String>,
    /// Phases the program marked with `vramlab.phase`, in the order they closed.
    pub phases: Vec<Span>,
    /// One span per optimizer step (`step_total`).
    pub steps: Vec<Span>,
    /// The whole run, from torch's import to exit.
    pub run: Option<Span>,
    pub notes: Vec<String>,
    /// vLLM's own startup lines, for a process that logged them (its engine core).
    pub vllm: Option<super::vllm::Startup>,
    pub outcome: Outcome,
    pub message: String,
}

impl Report {
    pub fn read(path: &Path) -> Result<Report> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("no emulator report: {e}")))?;
        serde_json::from_str(&text).map_err(|e| bad_file(path, format!("bad emulator report: {e}")))
    }

    /// The rows to show: the marked phases, else the optimizer steps.
    pub fn rows(&self) -> &[Span] {
        if self.phases.is_empty() {
            &self.steps
        } else {
            &self.phases
        }
    }
}

/// What describes the run in the CSV (the emulator cannot read these off the program).
#[derive(Clone, Debug, Default)]
pub struct Describe {
    pub model_id: String,
    pub mode: crate::vocab::Mode,
    pub precision: crate::vocab::Precision,
    pub batch: u64,
    pub context: u64,
}

/// Rows in vramlab's CSV schema: backend `cuda`, meter `torch-emulated`, the device name
/// marked "(emulated)"; `device_used` is the NVML-equivalent and `non_pool` the context.
pub fn records(rep: &Report, gpu: &Gpu, d: &Describe, run_id: &str) -> Result<Vec<Record>> {
    let base = Record {
        schema_version: SCHEMA_VERSION,
        run_id: run_id.into(),
        point_id: format!("{}/{}/b{}/s{}", d.model_id, d.precision, d.batch, d.context),
        started_at: crate::record::now_rfc3339(),
        vramlab_version: env!("CARGO_PKG_VERSION").into(),
        git_rev: env!("VRAMLAB_GIT_REV").into(),
        backend: Backend::Cuda,
        device_name: gpu.row_name(),
        cuda_version: rep.cuda.clone().unwrap_or_default(),
        model_id: d.model_id.clone(),
        weight_source: "synthetic".into(),
        mode: d.mode,
        precision: d.precision,
        batch: d.batch,
        context: d.context,
        meter: MeterKind::TorchEmulated,
        ..Default::default()
    };
    let row = |s: &Span, phase: Phase, status: Status, message: &str| {
        let mut r = base.clone();
        r.phase = Some(phase);
        r.step = s.step;
        r.baseline_allocated = Some(s.baseline_allocated);
        r.peak_allocated = Some(s.peak_allocated);
        r.end_allocated = Some(s.end_allocated);
        r.baseline_reserved = Some(s.baseline_reserved);
        r.peak_reserved = Some(s.peak_reserved);
        r.device_used = Some(s.nvml_used());
        r.non_pool = Some(CONTEXT_BYTES);
        r.elapsed_ms = Some(s.elapsed_ms);
        r.status = Some(status);
        r.message = message.into();
        r
    };
    let mut out = Vec::new();
    for s in rep.rows() {
        let phase: Phase = s.name.parse().map_err(|_| {
            crate::error::InputError::arg(format!(
                "phase `{}` is not one of vramlab's phases ({})",
                s.name,
                <Phase as strum::IntoEnumIterator>::iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        out.push(row(s, phase, Status::Ok, ""));
    }
    let status = match rep.outcome {
        Outcome::Ok => Status::Ok,
        Outcome::Oom => Status::Oom,
        Outcome::Error | Outcome::Terminated => Status::Error,
    };
    let total = rep.run.clone().unwrap_or_default();
    let message = rep.message.lines().next().unwrap_or("");
    out.push(row(&total, Phase::Total, status, message));
    Ok(out)
}
