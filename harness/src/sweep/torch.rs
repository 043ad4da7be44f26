//! `runtime = "torch"`: a scenario's points measured by the torch probe (vramlab/probe,
//! PyTorch + transformers) instead of candle, through the same sweep: shards, resume, merge,
//! `--capacity` and the Slurm script work alike (docs/src/guides/emulator.md, "Sweeps").
//!
//! The parent is [`super::parent`], unchanged but for its workers: each is the probe on the
//! points of one group (`--worker-point ID`, repeated), appending rows to the output under the
//! parent's run id and speaking the supervisor's protocol on stdout. On `device = "emu:GPU"`
//! the probe runs itself under `vramlab emulate` (this binary, `$VRAMLAB_BIN`), so PyTorch's own
//! caching allocator measures an emulated GPU; on `cuda:N`, a real one. A scenario's `stack`
//! list runs the whole sweep once per stack, one CSV each.
use super::Run;
use crate::error::InputError;
use crate::vocab::{MeterKind, Runtime, Stack};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub use crate::device::emulated_gpu;

/// The device a runtime can measure on, checked before anything runs (one line, exit 2).
pub fn check_device(runtime: Runtime, device: &str) -> Result<()> {
    match (runtime, emulated_gpu(device)) {
        // vramlab's CUDA build under the stubs: the catalogue name and the build checked here.
        (Runtime::Candle, Some(_)) => crate::device::probe(device),
        (Runtime::Candle, None) => Ok(()),
        (Runtime::Torch | Runtime::Vllm, Some(gpu)) => crate::gpu::resolve(Some(gpu), None)
            .map(|_| ())
            .map_err(|e| InputError::arg(format!("device `{device}`: {e}")).into()),
        (Runtime::Torch | Runtime::Vllm, None)
            if matches!(
                crate::device::parse(device),
                Ok(crate::device::DeviceSpec::Cuda(_))
            ) =>
        {
            Ok(())
        }
        (Runtime::Torch | Runtime::Vllm, None) => Err(InputError::arg(format!(
            "device `{device}`: runtime = \"torch\" measures on emu:GPU or cuda:N (PyTorch on CPU \
             needs the preload meter: scripts/torch-cpu.sh SCENARIO --out FILE.csv)"
        ))
        .into()),
    }
}

/// Where a stack's rows go: the output itself for the default stack, `FILE-STACK.csv` beside
/// it for another (as the torch probe's own `stack` axis names them).
pub fn stack_out(out: &Path, stack: Stack) -> PathBuf {
    match stack {
        Stack::Default => out.to_path_buf(),
        other => {
            let stem = out.file_stem().unwrap_or_default().to_string_lossy();
            out.with_file_name(format!("{stem}-{other}.csv"))
        }
    }
}

/// The torch probe as a sweep's worker: its Python (the stack's environment) and arguments.
pub struct Probe {
    python: PathBuf,
    /// The probe after the interpreter: its package directory ([`crate::emulate::probe_dir`]).
    script: Vec<String>,
    stack: Stack,
}

impl Probe {
    /// The probe for `r`'s stack, once it has said it can run the scenario (`--check`).
    pub fn open(r: &Run<'_>) -> Result<Probe> {
        let python = match (r.stack, std::env::var_os("VRAMLAB_TORCH_PYTHON")) {
            (Stack::Default, Some(p)) => PathBuf::from(p),
            (stack, _) => crate::emulate::stack_python(stack)?,
        };
        let script = vec![crate::emulate::probe_dir()?.to_string_lossy().into_owned()];
        let probe = Probe {
            python,
            script,
            stack: r.stack,
        };
        if r.capacity.is_some() && emulated_gpu(&r.device_spec).is_none() {
            return Err(InputError::arg(
                "--capacity with runtime = \"torch\": only on an emulated GPU (emu:GPU), whose \
                 total memory it sets",
            )
            .into());
        }
        let out = probe
            .base()
            .arg(&r.o.scenario)
            .arg("--check")
            .output()
            .with_context(|| format!("starting the torch probe ({})", probe.python.display()))?;
        if !out.status.success() {
            let last = crate::emulate::last_line(&out.stderr).unwrap_or_default();
            let line = last.strip_prefix("error: ").unwrap_or(&last);
            return Err(
                InputError::arg(format!("the torch probe ({}): {line}", probe.stack)).into(),
            );
        }
        Ok(probe)
    }

    fn base(&self) -> Command {
        let mut c = Command::new(&self.python);
        c.args(&self.script)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VRAMLAB_PROBE_STACK", self.stack.as_str());
        // The emulated GPU's `vramlab emulate` is this very binary.
        if let Ok(exe) = std::env::current_exe() {
            c.env("VRAMLAB_BIN", exe);
        }
        c
    }

    /// A worker measuring `ids` (one group's points) into `r.out` under `run_id`.
    pub fn command<'a>(
        &self,
        r: &Run<'_>,
        run_id: &str,
        ids: impl Iterator<Item = &'a str>,
    ) -> Command {
        let mut c = self.base();
        c.arg(&r.o.scenario).arg("--out").arg(&r.out).args([
            "--device",
            &r.device_spec,
            "--run-id",
            run_id,
        ]);
        if let Some(cap) = &r.o.capacity {
            c.args(["--gpu-memory", cap]);
        }
        for id in ids {
            c.args(["--worker-point", id]);
        }
        c
    }

    /// The stack the probe runs under.
    pub fn stack(&self) -> Stack {
        self.stack
    }
}

/// The meter of a torch sweep's rows on `device`.
pub fn meter(device: &str) -> MeterKind {
    if emulated_gpu(device).is_some() {
        MeterKind::TorchEmulated
    } else {
        MeterKind::TorchCuda
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_checked_against_the_runtime() {
        assert!(check_device(Runtime::Candle, "cpu").is_ok());
        // vramlab's CUDA build runs on an emulated GPU; a CPU build says it cannot.
        assert_eq!(
            check_device(Runtime::Candle, "emu:h100-80gb").is_ok(),
            cfg!(feature = "cuda")
        );
        assert!(check_device(Runtime::Candle, "emu:no-such-gpu").is_err());
        assert!(check_device(Runtime::Torch, "emu:h100-80gb").is_ok());
        assert!(check_device(Runtime::Torch, "emu:no-such-gpu").is_err());
        assert!(check_device(Runtime::Torch, "cuda:1").is_ok());
        assert!(check_device(Runtime::Torch, "cuda:x").is_err());
        assert!(check_device(Runtime::Torch, "cpu").is_err());
    }

    #[test]
    fn another_stack_writes_beside_the_output() {
        let out = Path::new("results/x.csv");
        assert_eq!(stack_out(out, Stack::Default), out);
        assert_eq!(
            stack_out(out, Stack::Torch22),
            Path::new("results/x-torch-2.2.csv")
        );
    }
}
