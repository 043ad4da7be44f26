//! The emulated GPU (docs/src/guides/emulator.md): a PyTorch program runs against a stub CUDA
//! runtime that presents one catalogued GPU, so PyTorch's own caching allocator reports the
//! allocated and reserved bytes, and its own out-of-memory error, with no device.
//!
//! This module starts the program with the stubs preloaded and vramlab's Python boot on its
//! path, then reads the report the boot writes at exit. The stubs are built per PyTorch
//! environment by `scripts/emulator-build.sh` (from the CUDA headers of the wheels that torch
//! depends on; nothing is committed).
pub mod catalogue;
pub mod query;
pub mod report;

use crate::error::InputError;
use anyhow::{Context, Result};
use catalogue::Gpu;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where vramlab's Python package is: `$VRAMLAB_PYTHON_DIR`, or the checkout's `harness/python`.
pub fn python_dir() -> PathBuf {
    std::env::var_os("VRAMLAB_PYTHON_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("python"))
}

/// The repository's scripts folder (the stub build script lives there).
pub(crate) fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// An executable by name: a path as given, or the first match on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if program.contains('/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|c| c.is_file())
}

/// The Python whose torch the stubs must match: `--python`, the command itself when it is a
/// Python interpreter, else `python3` on PATH.
pub fn python_for(command: &[String], explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return which(&p.to_string_lossy()).ok_or_else(|| {
            InputError::arg(format!("--python {}: no such program", p.display())).into()
        });
    }
    let first = command.first().map(String::as_str).unwrap_or("");
    let base = Path::new(first)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let name = if base.starts_with("python") {
        first
    } else {
        "python3"
    };
    which(name).ok_or_else(|| {
        InputError::arg(format!(
            "no `{name}` on PATH (give --python for the torch environment)"
        ))
        .into()
    })
}

/// The folder of stub libraries for `python`'s torch: `$VRAMLAB_EMU_STUBS`, or what
/// `scripts/emulator-build.sh` builds (cached; seconds when warm).
pub fn stubs_for(python: &Path) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("VRAMLAB_EMU_STUBS") {
        return Ok(PathBuf::from(d));
    }
    let script = scripts_dir().join("emulator-build.sh");
    let out = Command::new(&script)
        .arg(python)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed");
        let msg = format!("the emulator's stubs for {}: {last}", python.display());
        return Err(if out.status.code() == Some(2) {
            InputError::arg(msg).into()
        } else {
            anyhow::anyhow!(msg)
        });
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    anyhow::ensure!(
        dir.join("libvramlab_emu.so").is_file(),
        "{} printed {}, which holds no libvramlab_emu.so",
        script.display(),
        dir.display()
    );
    Ok(dir)
}

/// One emulated run of a command.
pub struct Launch<'a> {
    pub gpu: &'a Gpu,
    pub stubs: &'a Path,
    /// `--no-weights`: `from_pretrained` builds models from their config on the device.
    pub no_weights: bool,
    /// Where the boot writes its report.
    pub report: &'a Path,
}

/// `PATH`-style join of `first` before the current value of `var`.
fn prepend(var: &str, first: &Path) -> std::ffi::OsString {
    let mut parts = vec![first.to_path_buf()];
    if let Some(old) = std::env::var_os(var) {
        parts.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(parts).expect("paths without separators")
}

impl Launch<'_> {
    /// The command with the emulator's environment: the stubs preloaded, libcuda on the
    /// library path, the boot on PYTHONPATH, the GPU described.
    pub fn command(&self, argv: &[String]) -> Command {
        let py = python_dir();
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        let preload = self.stubs.join("libvramlab_emu.so");
        let mut ld_preload = preload.into_os_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD") {
            ld_preload.push(":");
            ld_preload.push(old);
        }
        let pythonpath = {
            let mut v = prepend("PYTHONPATH", &py);
            let boot = py.join("vramlab").join("_boot");
            let mut b = boot.into_os_string();
            b.push(":");
            b.push(&v);
            v = b;
            v
        };
        c.env("LD_PRELOAD", ld_preload)
            .env("LD_LIBRARY_PATH", prepend("LD_LIBRARY_PATH", self.stubs))
            .env("PYTHONPATH", pythonpath)
            .env("VRAMLAB_EMU_REPORT", self.report)
            .env(
                "VRAMLAB_EMU_NO_WEIGHTS",
                if self.no_weights { "1" } else { "0" },
            )
            // One device, visible: a caller's CUDA_VISIBLE_DEVICES="" would hide it.
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("PYTORCH_NVML_BASED_CUDA_CHECK");
        for (k, v) in self.gpu.env() {
            c.env(k, v);
        }
        c
    }
}
