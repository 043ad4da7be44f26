//! Every `VRAMLAB_*` environment variable the project reads, in one table: who reads it, its
//! default and what it does. `vramlab env` prints it (and which are set now);
//! docs/src/reference/environment.md embeds `vramlab env --markdown`. The test
//! `harness/tests/environment.rs` fails when the code, the scripts or the docs name a variable
//! this table does not list, or the table lists one that nothing reads.

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reader {
    /// The `vramlab` binary at run time (harness/src).
    Vramlab,
    /// Compiled into the binary by harness/build.rs (`env!`); set by the build, not by users.
    Build,
    /// The emulated GPU's stub libraries (harness/emulator), set by `vramlab emulate`.
    Stubs,
    /// vramlab's Python package or the torch probe (harness/python, its vramlab/probe).
    Python,
    /// The repository's scripts (scripts/).
    Scripts,
    /// The test suite (harness/tests, scripts/test.sh).
    Tests,
}

impl Reader {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reader::Vramlab => "vramlab",
            Reader::Build => "build",
            Reader::Stubs => "stubs",
            Reader::Python => "python",
            Reader::Scripts => "scripts",
            Reader::Tests => "tests",
        }
    }

    /// Where files of this reader live (what the table's test searches).
    pub fn paths(&self) -> &'static [&'static str] {
        match self {
            Reader::Vramlab => &["harness/src/"],
            Reader::Build => &["harness/build.rs"],
            Reader::Stubs => &["harness/emulator/"],
            Reader::Python => &["harness/python/"],
            Reader::Scripts => &["scripts/"],
            Reader::Tests => &["harness/tests/", "scripts/test.sh"],
        }
    }
}

/// One environment variable.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct EnvVar {
    pub name: &'static str,
    pub read_by: &'static [Reader],
    /// The value when unset ("" where there is none).
    pub default: &'static str,
    pub meaning: &'static str,
}

use Reader::*;

/// The table, sorted by name.
pub const VARS: &[EnvVar] = &[
    EnvVar {
        name: "VRAMLAB_BENCH_ARGS",
        read_by: &[Scripts],
        default: "",
        meaning: "extra `vramlab sweep` flags for scripts/bench-overhead.sh (e.g. `--device cuda:0`)",
    },
    EnvVar {
        name: "VRAMLAB_BIN",
        read_by: &[Python, Scripts],
        default: "`vramlab` on PATH, else this checkout's newest build",
        meaning: "the vramlab binary the torch probe asks for a scenario's points (`sweep --dry-run --json`) and runs `vramlab emulate` with on `--device emu:GPU` (a sweep and `vramlab emulate` set it to themselves), the one `vramlab.estimate()` runs (unset: the `vramlab` beside its Python, else on PATH), and the one scripts/gpu/run.sh measures with",
    },
    EnvVar {
        name: "VRAMLAB_BLESS",
        read_by: &[Tests],
        default: "",
        meaning: "`1`: the docs and help tests rewrite the generated pages instead of failing on a stale one",
    },
    EnvVar {
        name: "VRAMLAB_BUNDLE",
        read_by: &[Scripts],
        default: ".cache/gpu-bundle",
        meaning: "the device bundle scripts/gpu/build.sh writes and scripts/gpu/run.sh reads",
    },
    EnvVar {
        name: "VRAMLAB_CANDLE",
        read_by: &[Build],
        default: "",
        meaning: "candle's version from Cargo.lock, for the manifest's `versions`",
    },
    EnvVar {
        name: "VRAMLAB_CUDARC",
        read_by: &[Build],
        default: "",
        meaning: "cudarc's version from Cargo.lock, for the manifest's `versions`",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_BIN",
        read_by: &[Scripts],
        default: "the CUDA build of scripts/cuda-build-check.sh",
        meaning: "vramlab's CUDA build for the emulated GPU in scripts/gpu/run.sh (rehearsal) and scripts/bench-emulated-cuda.sh",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_CACHE",
        read_by: &[Scripts],
        default: "~/.cache/vramlab-cuda",
        meaning: "the CUDA toolchain from PyPI wheels, its link stubs and the CUDA build's target folder (scripts/cuda-toolchain.sh, cuda-build-check.sh)",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_OPS",
        read_by: &[Scripts],
        default: "the bundle's cuda_ops",
        meaning: "the CUDA kernels' test binary scripts/gpu/run.sh runs",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_PROFILE",
        read_by: &[Scripts],
        default: "dev",
        meaning: "the cargo profile of scripts/cuda-build-check.sh's CUDA build (dev or release)",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_STUBS",
        read_by: &[Scripts],
        default: "set by the toolchain's env.sh",
        meaning: "the folder of the CUDA link stubs, put on LD_LIBRARY_PATH to start the CUDA build without CUDA libraries",
    },
    EnvVar {
        name: "VRAMLAB_CUDA_TARGET",
        read_by: &[Scripts],
        default: "$VRAMLAB_CUDA_CACHE/target",
        meaning: "the cargo target folder of the CUDA build",
    },
    EnvVar {
        name: "VRAMLAB_DEBIAN_MIRROR",
        read_by: &[Scripts],
        default: "the host's Debian mirror, else deb.debian.org",
        meaning: "where scripts/python39.sh fetches Debian 11's CPython 3.9 packages",
    },
    EnvVar {
        name: "VRAMLAB_DEVICE",
        read_by: &[Scripts],
        default: "cuda:0",
        meaning: "the device of each shard in scripts/slurm/sweep.sbatch; `scenario` keeps the scenario's own (an emulated GPU)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_ARCHS",
        read_by: &[Stubs],
        default: "the device's own",
        meaning: "torch's compiled architectures, set by the emulated process's Python boot: which kernel version the stubs report as loaded",
    },
    EnvVar {
        name: "VRAMLAB_EMU_CACHE",
        read_by: &[Scripts],
        default: "~/.cache/vramlab-emu",
        meaning: "where scripts/emulator-build.sh caches the stub libraries, one folder per torch build and source hash",
    },
    EnvVar {
        name: "VRAMLAB_EMU_CC_MAJOR",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's compute capability, major (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_CC_MINOR",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's compute capability, minor (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_CONTEXT",
        read_by: &[Stubs],
        default: "",
        meaning: "bytes the emulated CUDA context and modules hold outside any allocator (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_CUDA_DRIVER",
        read_by: &[Stubs],
        default: "13000",
        meaning: "the CUDA driver version the NVML stub reports (`nvmlSystemGetCudaDriverVersion`: 1000 × major + 10 × minor)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_DEVICES",
        read_by: &[Stubs],
        default: "1",
        meaning: "how many emulated GPUs the stubs present (`vramlab emulate --devices`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_DIR",
        read_by: &[Stubs, Python],
        default: "",
        meaning: "the run folder where the stubs and the Python boot leave their records (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_GPU",
        read_by: &[Scripts],
        default: "h200",
        meaning: "the emulated twin of the device in scripts/gpu/run.sh",
    },
    EnvVar {
        name: "VRAMLAB_EMU_L2",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's L2 cache, bytes (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_NAME",
        read_by: &[Stubs],
        default: "",
        meaning: "the name the emulated GPU reports (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_NO_WEIGHTS",
        read_by: &[Python],
        default: "0",
        meaning: "`1` (`vramlab emulate --no-weights`): `from_pretrained` builds models from their config on the device",
    },
    EnvVar {
        name: "VRAMLAB_EMU_SMEM_OPTIN",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's `sharedMemPerBlockOptin`, bytes (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_SMEM_PER_SM",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's shared memory per multiprocessor, bytes (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_SMS",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's multiprocessor count (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_STUBS",
        read_by: &[Vramlab],
        default: "built by scripts/emulator-build.sh",
        meaning: "a folder of emulator stubs to use as they are (a device bundle's, an installed wheel's)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_THREADS_PER_SM",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's threads per multiprocessor (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_EMU_TOTAL",
        read_by: &[Stubs],
        default: "",
        meaning: "the emulated GPU's `totalGlobalMem`, bytes; unset, the stubs present no GPU (set by `vramlab emulate`)",
    },
    EnvVar {
        name: "VRAMLAB_GIT_REV",
        read_by: &[Build],
        default: "",
        meaning: "the git revision the binary was built from, for manifests, reports and bundles",
    },
    EnvVar {
        name: "VRAMLAB_HASH_CACHE",
        read_by: &[Vramlab],
        default: "$XDG_CACHE_HOME/vramlab/weight-hashes.json",
        meaning: "the weight-hash cache file; `off` or empty hashes every weight file again",
    },
    EnvVar {
        name: "VRAMLAB_HUB_CACHE",
        read_by: &[Vramlab],
        default: "$XDG_CACHE_HOME/vramlab/hub",
        meaning: "where `estimate --model ORG/NAME` keeps the Hub's config.json and safetensors index, as ORG/NAME/REVISION/FILE (else ~/.cache/vramlab/hub)",
    },
    EnvVar {
        name: "VRAMLAB_KERNELS_TIMEOUT",
        read_by: &[Scripts],
        default: "90",
        meaning: "seconds for the CUDA kernels' test in scripts/gpu/run.sh",
    },
    EnvVar {
        name: "VRAMLAB_LINT_CACHE",
        read_by: &[Scripts],
        default: "~/.cache/vramlab-lint",
        meaning: "the pinned ruff and pytest venv of scripts/lint-env.sh",
    },
    EnvVar {
        name: "VRAMLAB_MODELS",
        read_by: &[Vramlab, Python, Scripts],
        default: ".cache/models",
        meaning: "the folder `${VRAMLAB_MODELS}` names in scenario sources; scripts/fetch-test-models.sh fills it",
    },
    EnvVar {
        name: "VRAMLAB_NCCL_LOG",
        read_by: &[Stubs],
        default: "",
        meaning: "`1`: the emulated NCCL (harness/emulator/nccl.c) traces each call on standard error: communicators made, collectives, `ncclMemAlloc`",
    },
    EnvVar {
        name: "VRAMLAB_PROBE_STACK",
        read_by: &[Python],
        default: "",
        meaning: "the software stack a torch probe run belongs to, for its manifest (set by `vramlab sweep`)",
    },
    EnvVar {
        name: "VRAMLAB_PYTHON_DIR",
        read_by: &[Vramlab],
        default: "the installed package, else the checkout's harness/python",
        meaning: "where vramlab's Python package is (the emulated process's boot and `vramlab.phase`)",
    },
    EnvVar {
        name: "VRAMLAB_RUN_BUDGET",
        read_by: &[Scripts],
        default: "330",
        meaning: "seconds the whole of scripts/gpu/run.sh may take",
    },
    EnvVar {
        name: "VRAMLAB_RUSTC",
        read_by: &[Build],
        default: "",
        meaning: "rustc's version, for the manifest's `versions`",
    },
    EnvVar {
        name: "VRAMLAB_SCENARIOS",
        read_by: &[Scripts],
        default: "gpu-smoke and gpu-gen-sd15 (device), rehearse (rehearsal)",
        meaning: "the scenarios scripts/gpu/run.sh measures",
    },
    EnvVar {
        name: "VRAMLAB_SKIP_CUDA_CHECK",
        read_by: &[Scripts],
        default: "0",
        meaning: "`1`: scripts/test.sh skips the CUDA compile-and-link check and the emulated CUDA run",
    },
    EnvVar {
        name: "VRAMLAB_SLURM_DIR",
        read_by: &[Scripts],
        default: "/tmp/vramlab-slurm",
        meaning: "the one-node localhost cluster's configuration and state (scripts/slurm/local-cluster.sh)",
    },
    EnvVar {
        name: "VRAMLAB_SLURM_PORT",
        read_by: &[Scripts],
        default: "6817",
        meaning: "slurmctld's port on the localhost cluster; slurmd takes the next one",
    },
    EnvVar {
        name: "VRAMLAB_SLURM_WAIT",
        read_by: &[Scripts],
        default: "1800",
        meaning: "seconds scripts/slurm/test-local.sh waits for the job array",
    },
    EnvVar {
        name: "VRAMLAB_SWEEP_TIMEOUT",
        read_by: &[Scripts],
        default: "200",
        meaning: "seconds for each sweep in scripts/gpu/run.sh",
    },
    EnvVar {
        name: "VRAMLAB_TORCH110_PYTHON",
        read_by: &[Tests],
        default: "",
        meaning: "the torch-1.10 stack's python for the tests (scripts/test.sh sets it)",
    },
    EnvVar {
        name: "VRAMLAB_TORCH22_PYTHON",
        read_by: &[Tests],
        default: "",
        meaning: "the torch-2.2 stack's python for the tests (scripts/test.sh sets it)",
    },
    EnvVar {
        name: "VRAMLAB_TORCH_CACHE",
        read_by: &[Vramlab, Scripts],
        default: "~/.cache/vramlab-torch",
        meaning: "where scripts/torch-env.sh installs the software stacks, one venv each, and where vramlab finds them",
    },
    EnvVar {
        name: "VRAMLAB_TORCH_PYTHON",
        read_by: &[Vramlab, Scripts, Tests],
        default: "the default stack in the torch cache",
        meaning: "the python of the default stack: the torch probe's for sweeps, and the environment scripts/gpu/run.sh and the tests use",
    },
    EnvVar {
        name: "VRAMLAB_TORCH_TIMEOUT",
        read_by: &[Scripts],
        default: "110",
        meaning: "seconds for each torch probe run in scripts/gpu/run.sh",
    },
    EnvVar {
        name: "VRAMLAB_VLLM_PYTHON",
        read_by: &[Vramlab, Scripts, Tests],
        default: "",
        meaning: "the vLLM stack's python for `estimate --runtime vllm --emulate`, scripts/vllm-serving-grid.sh and tests/vllm.rs (scripts/test.sh sets it); unset, the venv `scripts/torch-env.sh --stack vllm-0.33` installs",
    },
    EnvVar {
        name: "VRAMLAB_WHEEL_CACHE",
        read_by: &[Scripts],
        default: "~/.cache/vramlab-wheel",
        meaning: "scripts/build-wheel.sh's cache: the NVIDIA header wheels and its build",
    },
    EnvVar {
        name: "VRAMLAB_WHEEL_PROFILE",
        read_by: &[Scripts],
        default: "release",
        meaning: "the cargo profile of the wheel's binary (`dev` reuses the test build's dependencies)",
    },
];

/// The Markdown table of `vramlab env --markdown`.
pub fn markdown() -> String {
    let mut s = String::from(
        "| variable | read by | default | what it does |\n| --- | --- | --- | --- |\n",
    );
    for v in VARS {
        let readers: Vec<&str> = v.read_by.iter().map(Reader::as_str).collect();
        s += &format!(
            "| `{}` | {} | {} | {} |\n",
            v.name,
            readers.join(", "),
            if v.default.is_empty() { "-" } else { v.default },
            v.meaning
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_each_name_once() {
        for w in VARS.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
        assert!(VARS
            .iter()
            .all(|v| v.name.starts_with("VRAMLAB_") && !v.read_by.is_empty()));
    }
}
