//! `device = "emu:GPU"` with the default runtime: vramlab's own CUDA build measures a
//! catalogued GPU it does not have (docs/src/guides/emulator.md, "candle on the emulated GPU").
//! The parent is [`super::parent`], unchanged but for its workers: each is this binary's
//! `sweep --worker`, started under the stub CUDA runtime that presents the GPU, where it opens
//! the emulated `cuda:0` and reads the stubs' memory pool through the same `meter/cuda.rs` a
//! device uses (`meter = cuda-pool-emulated`). `--capacity` sets the emulated GPU's memory, so a
//! point past it is an `oom` row from cudarc's own out-of-memory error.
use crate::emulate::{stubs_for, Launch, ProgramOutput};
use crate::error::InputError;
use crate::gpu::Gpu;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The emulated GPU a sweep's workers run on.
pub struct EmulatedWorkers {
    gpu: Gpu,
    stubs: PathBuf,
    /// The stubs' report folder (`VRAMLAB_EMU_DIR`), removed with the sweep.
    dir: tempfile::TempDir,
}

impl EmulatedWorkers {
    /// The catalogued `gpu`, its memory set to `capacity` where given, and the stubs:
    /// `$VRAMLAB_EMU_STUBS` (a device bundle's, built from the CUDA headers), else the default
    /// torch environment's (`scripts/emulator-build.sh` builds them from its CUDA headers). An
    /// unknown GPU or no stubs is one line, exit 2.
    pub fn new(gpu: &str, capacity: Option<u64>) -> Result<Self> {
        let gpu = crate::gpu::resolve(Some(gpu), capacity)
            .map_err(|e| InputError::arg(format!("device `emu:{gpu}`: {e}")))?;
        let stubs = match std::env::var_os("VRAMLAB_EMU_STUBS") {
            Some(d) => PathBuf::from(d),
            None => stubs_for(&crate::emulate::default_python()?)?,
        };
        let dir = tempfile::Builder::new()
            .prefix("vramlab-emu-sweep-")
            .tempdir()
            .context("creating the emulator's report folder")?;
        Ok(EmulatedWorkers { gpu, stubs, dir })
    }

    /// The `device_name` of the rows the parent itself writes (a worker that died): the name
    /// the worker's own rows carry.
    pub fn device_name(&self) -> String {
        format!("{} (emulated)", self.gpu.name)
    }

    /// `exe args…` under the stubs, as one worker.
    pub fn command(&self, exe: &Path, args: &[String]) -> Command {
        let mut argv = vec![exe.to_string_lossy().into_owned()];
        argv.extend(args.iter().cloned());
        Launch {
            gpu: &self.gpu,
            devices: 1,
            stubs: &self.stubs,
            no_weights: false,
            timeout: None,
            stdout: ProgramOutput::Inherit,
            capture_stderr: false,
            offline: true,
        }
        .command(&argv, self.dir.path())
    }
}
