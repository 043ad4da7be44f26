//! The emulated GPU (docs/src/guides/emulator.md): a PyTorch program runs against a stub CUDA
//! runtime that presents one catalogued GPU, so PyTorch's own caching allocator reports the
//! allocated and reserved bytes, and its own out-of-memory error, with no device.
//!
//! This module starts the program with the stubs preloaded and vramlab's Python boot on its
//! path, then reads the report the boot writes at exit. In a source checkout the stubs are built
//! per PyTorch environment by `scripts/emulator-build.sh` (from the CUDA headers of the wheels
//! that torch depends on; nothing is committed); an installed wheel carries them, one set per
//! CUDA major (`vramlab/_stubs/cu12`, `cu13`; `scripts/build-wheel.sh`).
pub mod query;
pub mod records;
pub mod report;
pub mod serving;
pub mod supervise;
pub mod verdict;
pub mod vllm;

use crate::error::InputError;
use crate::gpu::Gpu;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where vramlab's Python package is: `$VRAMLAB_PYTHON_DIR`; for a binary installed from the
/// wheel (a Python beside it, as in a venv's `bin/`, or no checkout at its build path), the
/// folder holding the installed `vramlab` package, as that Python imports it; else the
/// checkout's `harness/python`.
pub fn python_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VRAMLAB_PYTHON_DIR") {
        return PathBuf::from(d);
    }
    let checkout = checkout_python_dir();
    let beside = python_beside_exe();
    if beside.is_some() || !checkout.is_dir() {
        if let Some(d) = beside
            .or_else(|| which("python3"))
            .and_then(|py| installed_package_root(&py))
        {
            return d;
        }
    }
    checkout
}

fn checkout_python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// The Python beside this executable (pip puts a wheel's scripts in the `bin/` of the
/// environment's Python).
fn python_beside_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    ["python3", "python"]
        .iter()
        .map(|n| bin.join(n))
        .find(|p| p.is_file())
}

/// The folder holding the `vramlab` package that `python` imports (its site-packages).
fn installed_package_root(python: &Path) -> Option<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import vramlab, os; print(os.path.dirname(os.path.dirname(vramlab.__file__)))",
        ])
        .env_remove("PYTHONPATH")
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && dir.join("vramlab").is_dir()).then_some(dir)
}

/// The repository's scripts folder (the stub build script lives there).
pub(crate) fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// The torch probe's package directory, `vramlab/probe` of the vramlab Python package
/// ([`python_dir`]: the installed wheel's, or the checkout's `harness/python`), which every
/// caller runs by path (`python DIR ...`), so any stack's interpreter runs it without vramlab
/// installed there. The one place sweep, estimate and emulate find it.
pub fn probe_dir() -> Result<PathBuf> {
    package_dir("probe", "__main__.py")
}

/// The published programs' directory, `vramlab/peers` beside the probe (`validate --emulate`
/// runs `python DIR/peer_*.py ...`).
pub fn peers_dir() -> Result<PathBuf> {
    package_dir("peers", "peer_sdxl.py")
}

/// `vramlab/NAME` of the Python package, checked to hold `file`.
fn package_dir(name: &str, file: &str) -> Result<PathBuf> {
    let dir = python_dir().join("vramlab").join(name);
    if dir.join(file).is_file() {
        return Ok(dir);
    }
    Err(InputError::arg(format!(
        "vramlab's Python package is incomplete ({} is missing; reinstall the wheel, or run from \
         a checkout)",
        dir.join(file).display()
    ))
    .into())
}

/// The last non-blank line a program wrote (its stderr, say): what an error quotes of it.
pub(crate) fn last_line(output: &[u8]) -> Option<String> {
    String::from_utf8_lossy(output)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_string)
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
/// Python interpreter, the interpreter of a Python script's `#!` line, for a native program
/// (vramlab's CUDA build, a candle program) the default torch environment ([`default_python`]),
/// else `python3` on PATH.
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
    if !base.starts_with("python") {
        // A Python entry point (torchrun, accelerate, vllm): the interpreter of its shebang.
        if let Some(py) = which(first).and_then(|p| shebang_python(&p)) {
            return Ok(py);
        }
        if native_program(first) {
            return default_python();
        }
    }
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

/// The torch environment when nothing names one: the Python beside this executable (a
/// pip-installed wheel's own), else the default stack that `scripts/torch-env.sh` installed in
/// the torch cache, else `python3` on PATH.
pub fn default_python() -> Result<PathBuf> {
    if let Some(py) = python_beside_exe() {
        return Ok(py);
    }
    if let Ok(py) = stack_python(crate::vocab::Stack::Default) {
        return Ok(py);
    }
    python_for(&[], None)
}

/// The interpreter a script's `#!` line names, when it is a Python one that exists.
fn shebang_python(script: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(script).ok()?, &mut head).ok()?;
    let text = String::from_utf8_lossy(&head[..n]);
    let line = text.strip_prefix("#!")?.lines().next()?.trim();
    let interp = line.split_whitespace().next()?;
    let base = Path::new(interp).file_name()?.to_str()?;
    (base.starts_with("python") && Path::new(interp).is_file()).then(|| PathBuf::from(interp))
}

/// The python of an installed software stack: `$VRAMLAB_TORCH_CACHE` (default
/// `~/.cache/vramlab-torch`) holds one venv per stack, as `scripts/torch-env.sh --stack NAME`
/// installs it. A stack that is not installed is bad input (one line, exit 2).
pub fn stack_python(stack: crate::vocab::Stack) -> Result<PathBuf> {
    let cache = match std::env::var_os("VRAMLAB_TORCH_CACHE") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/vramlab-torch")
        }
    };
    let python = stack.venv(&cache).join("bin/python");
    if python.is_file() {
        return Ok(python);
    }
    Err(InputError::arg(format!(
        "--stack {stack}: not installed ({} is missing; `scripts/torch-env.sh --stack {stack}` installs it, or give --python)",
        python.display()
    ))
    .into())
}

/// The folder of stub libraries for `python`'s torch: `$VRAMLAB_EMU_STUBS`; for an installed
/// package, its `_stubs/cu<major>` for the CUDA major of that torch; else what
/// `scripts/emulator-build.sh` builds (cached; seconds when warm). A Python without torch, a
/// CPU-only torch or a CUDA major without stubs is bad input (one line, exit 2).
pub fn stubs_for(python: &Path) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("VRAMLAB_EMU_STUBS") {
        return Ok(PathBuf::from(d));
    }
    let package = python_dir();
    if package != checkout_python_dir() || !scripts_dir().join("emulator-build.sh").is_file() {
        let (version, cuda) = torch_cuda(python)?;
        let major = cuda.split('.').next().unwrap_or("");
        let dir = package.join("vramlab/_stubs").join(format!("cu{major}"));
        if dir.join("libvramlab_emu.so").is_file() {
            return Ok(dir);
        }
        let have: Vec<String> = std::fs::read_dir(package.join("vramlab/_stubs"))
            .map(|rd| {
                let mut v: Vec<String> = rd
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default();
        return Err(InputError::arg(format!(
            "torch {version} in {} is built for CUDA {cuda}: this vramlab has no emulator stubs \
             for CUDA {major} (it has: {})",
            python.display(),
            if have.is_empty() {
                "none".into()
            } else {
                have.join(", ")
            }
        ))
        .into());
    }
    let script = scripts_dir().join("emulator-build.sh");
    let out = Command::new(&script)
        .arg(python)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        let last = last_line(&out.stderr).unwrap_or_else(|| "failed".into());
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

/// `python`'s torch version and CUDA version, read from `torch/version.py` without importing
/// torch (seconds saved). No torch, or a CPU-only one, is bad input.
fn torch_cuda(python: &Path) -> Result<(String, String)> {
    const PROBE: &str = "import importlib.util, os\n\
s = importlib.util.find_spec('torch')\n\
if s is None:\n    print('missing')\n\
else:\n    ns = {}\n    exec(open(os.path.join(os.path.dirname(s.origin), 'version.py')).read(), ns)\n    \
print(ns.get('__version__'), ns.get('cuda') or 'none')\n";
    let out = Command::new(python)
        .args(["-c", PROBE])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["missing"] => Err(InputError::arg(format!(
            "{}: no module named 'torch' (the emulator runs PyTorch programs: install torch there, \
             or give --python)",
            python.display()
        ))
        .into()),
        [version, "none"] => Err(InputError::arg(format!(
            "torch {version} in {} is a CPU-only build: the emulator needs a CUDA build of torch",
            python.display()
        ))
        .into()),
        [version, cuda] => Ok((version.to_string(), cuda.to_string())),
        _ => Err(InputError::arg(format!(
            "{} could not tell its torch's CUDA version: {}",
            python.display(),
            last_line(&out.stderr).unwrap_or_else(|| "no output".into())
        ))
        .into()),
    }
}

/// One emulated run of a command.
pub struct Launch<'a> {
    pub gpu: &'a Gpu,
    /// How many such GPUs the stubs present (`--devices`; ranks pick theirs with
    /// `torch.cuda.set_device`).
    pub devices: usize,
    pub stubs: &'a Path,
    /// `--no-weights`: `from_pretrained` builds models from their config on the device.
    pub no_weights: bool,
    /// Stop the program after this long (`None`: never).
    pub timeout: Option<std::time::Duration>,
    /// Where the program's standard output goes.
    pub stdout: ProgramOutput,
    /// Keep the program's standard error (for an error to quote) instead of passing it on.
    pub capture_stderr: bool,
    /// No downloads from the Hugging Face hub (the probe's and the peers' programs build their
    /// models from config files).
    pub offline: bool,
}

/// Where an emulated program's standard output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramOutput {
    /// vramlab's own standard output (the table follows the program's lines).
    Inherit,
    /// vramlab's standard error: `--json` keeps its document alone on standard output.
    ToStderr,
    Discard,
}

/// `PATH`-style join of `first` before the current value of `var`.
fn prepend(var: &str, first: &Path) -> std::ffi::OsString {
    let mut parts = vec![first.to_path_buf()];
    if let Some(old) = std::env::var_os(var) {
        parts.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(parts).expect("paths without separators")
}

/// The stub folder as the dynamic loader can take it: ld.so splits LD_PRELOAD at spaces and
/// colons, so a folder whose path has either is copied (once per path) under the temporary
/// folder.
fn loadable(stubs: &Path) -> PathBuf {
    let text = stubs.to_string_lossy();
    if !text.contains([' ', ':']) {
        return stubs.to_path_buf();
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let copy = std::env::temp_dir().join(format!("vramlab-emu-stubs-{:016x}", h.finish()));
    let _ = std::fs::create_dir_all(&copy);
    for lib in [
        "libvramlab_emu.so",
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        NCCL,
    ] {
        let _ = std::fs::copy(stubs.join(lib), copy.join(lib));
    }
    let libs = copy.join(CUDA_LIBS);
    let _ = std::fs::create_dir_all(&libs);
    for lib in std::fs::read_dir(stubs.join(CUDA_LIBS))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::copy(lib.path(), libs.join(lib.file_name()));
    }
    copy
}

/// The most emulated GPUs one run presents (`vramlab emulate --devices`): as many as a
/// process record holds.
pub const MAX_DEVICES: u64 = records::MAX_DEVICES as u64;

/// The emulated NCCL in the stub folder (harness/emulator/nccl.c): preloaded after the
/// runtime, so that torch's ProcessGroupNCCL binds it, and named to vLLM
/// (`VLLM_NCCL_SO_PATH`), whose PyNcclCommunicator opens it itself.
const NCCL: &str = "libnccl.so.2";

/// The stub folder's subfolder of empty libraries under the sonames of libcudart, cuBLAS and
/// cuRAND (scripts/emulator-build.sh): what a program linked against them needs to load.
const CUDA_LIBS: &str = "cuda-libs";

/// Whether `program` is an ELF executable other than a Python interpreter: a program linked
/// against the CUDA libraries itself (vramlab's CUDA build, a candle program), which gets
/// [`CUDA_LIBS`] on its library path. A Python program's torch brings its own libraries, which
/// those empty ones must not shadow.
fn native_program(program: &str) -> bool {
    use std::io::Read;
    let python = Path::new(program)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("python"));
    let mut magic = [0u8; 4];
    let elf = which(program)
        .and_then(|p| std::fs::File::open(p).ok())
        .is_some_and(|mut f| f.read_exact(&mut magic).is_ok() && &magic == b"\x7fELF");
    elf && !python
}

impl Launch<'_> {
    /// The command with the emulator's environment: the stubs preloaded, libcuda on the
    /// library path, the boot on PYTHONPATH, the GPU described.
    pub fn command(&self, argv: &[String], dir: &Path) -> Command {
        let py = python_dir();
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        let stubs = loadable(self.stubs);
        let preload = stubs.join("libvramlab_emu.so");
        let mut ld_preload = preload.into_os_string();
        // The emulated NCCL after the runtime it allocates through (a stub folder of a release
        // before it has none: those runs keep the program's own NCCL).
        let nccl = stubs.join(NCCL);
        if nccl.is_file() {
            ld_preload.push(":");
            ld_preload.push(&nccl);
            c.env("VLLM_NCCL_SO_PATH", &nccl);
        }
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
        let mut lib_path = prepend("LD_LIBRARY_PATH", &stubs);
        if native_program(&argv[0]) {
            // After the caller's own folders: real CUDA libraries there load instead (the
            // preloaded stubs still answer every call they define).
            lib_path.push(":");
            lib_path.push(stubs.join(CUDA_LIBS));
        }
        c.env("LD_PRELOAD", ld_preload)
            .env("LD_LIBRARY_PATH", lib_path)
            .env("PYTHONPATH", pythonpath)
            .env("VRAMLAB_EMU_DIR", dir)
            .env("VRAMLAB_EMU_DEVICES", self.devices.to_string())
            .env(
                "VRAMLAB_EMU_NO_WEIGHTS",
                if self.no_weights { "1" } else { "0" },
            )
            // Triton finds libcuda through `ldconfig -p` unless told where: the stubs' copy.
            .env("TRITON_LIBCUDA_PATH", &stubs)
            // One device, visible: a caller's CUDA_VISIBLE_DEVICES="" would hide it.
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("PYTORCH_NVML_BASED_CUDA_CHECK");
        if std::env::var_os("VLLM_USE_FLASHINFER_SAMPLER").is_none() {
            // vLLM's FlashInfer sampler JIT-compiles with nvcc at its first use; its own PyTorch
            // sampler allocates through the caching allocator.
            c.env("VLLM_USE_FLASHINFER_SAMPLER", "0");
        }
        for (k, v) in self.gpu.env() {
            c.env(k, v);
        }
        // The torch probe asks this binary for a scenario's points (`sweep --dry-run --json`).
        if let Ok(exe) = std::env::current_exe() {
            c.env("VRAMLAB_BIN", exe);
        }
        if self.offline {
            c.env("HF_HUB_OFFLINE", "1")
                .env("TRANSFORMERS_OFFLINE", "1");
        }
        c
    }
}
