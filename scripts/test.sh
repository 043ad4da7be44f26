#!/usr/bin/env bash
# The test command (the README's second command; .ci/run calls it). Fetches the real test weights,
# checks formatting and lints, runs every test, then the CUDA compile-and-link check (CUDA 13.0
# toolchain from PyPI wheels and generated link stubs, cached in $VRAMLAB_CUDA_CACHE, default
# ~/.cache/vramlab-cuda; 15 to 30 minutes from cold on 2 cores, most of it nvcc compiling
# candle's kernels; seconds when warm).
# VRAMLAB_SKIP_CUDA_CHECK=1 skips that last step on a workstation.
#
#   scripts/test.sh               # no arguments
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 0 "" "$@"
cd "$(dirname "$0")/.."
# One build per run: incremental state only costs disk here (3.6 GB of it once, when CI's
# disk filled while linking). The free disk is printed first and last, so a CI log says how close
# a run came.
export CARGO_INCREMENTAL=0
disk_free() { df -h . | awk -v when="$1" 'NR==2 {print "test.sh: disk free at " when ": " $4 " of " $2}' >&2; }
disk_free start
trap 'disk_free end' EXIT
# Each step's wall time goes to stderr, so a CI log says where its 90 minutes went.
step() {
  local t0=$SECONDS
  "$@"
  echo "test.sh: $(( SECONDS - t0 )) s: $*" >&2
}
step scripts/fetch-test-models.sh
export VRAMLAB_MODELS=${VRAMLAB_MODELS:-$PWD/.cache/models}
step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" step cargo doc --no-deps --workspace
# The Python lint: ruff over the vramlab package (the torch probe is its vramlab/probe), pinned
# in a cached venv by scripts/lint-env.sh (seconds from cold, instant when warm).
PYTOOLS=$(scripts/lint-env.sh)
step "$PYTOOLS/ruff" check harness/python/vramlab harness/python/tests
# The package's types (mypy, configured in pyproject.toml: checked at the wheel's floor, 3.9).
step "$PYTOOLS/mypy" harness/python/vramlab
step cargo test --workspace
# The torch probe's unit tests and the Python package's (no torch): the probe's grid and
# features, and `vramlab.estimate()`, against the vramlab binary that `cargo test --workspace`
# just built.
VRAMLAB_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/vramlab" step "$PYTOOLS/pytest" -q
# PyTorch on CPU (docs/src/guides/torch-probe.md) and on the emulated GPU
# (docs/src/guides/emulator.md; stubs built by scripts/emulator-build.sh in seconds): the cached
# torch venv from PyPI (about 3 minutes and
# 5.6 GB from cold, instant when warm), then the torch tests that need it (a few minutes). The
# wheel test builds the wheel with scripts/build-wheel.sh (a release build of vramlab: minutes
# from cold, and a one-time download of the pinned NVIDIA header wheels) and installs it into
# a fresh venv (docs/src/guides/install.md).
VRAMLAB_TORCH_PYTHON=$(scripts/torch-env.sh)
# The older stack (torch 2.2, CUDA 12 build), for the emulator's CUDA 12 stubs: about 3 minutes
# and 5 GB from cold, instant when warm.
VRAMLAB_TORCH22_PYTHON=$(scripts/torch-env.sh --stack torch-2.2)
# The oldest stack (torch 1.10, CUDA 10.2 build, on Debian 11's CPython 3.9), the published
# bert-large rows' own, for the emulator's CUDA 10 layouts: about 1 minute and 2.8 GB from cold.
VRAMLAB_TORCH110_PYTHON=$(scripts/torch-env.sh --stack torch-1.10)
# vLLM 0.33 (torch 2.14, CUDA 13 build), for vLLM's own engine startup on the emulated GPU:
# about 3 minutes and 9.5 GB from cold, instant when warm.
VRAMLAB_VLLM_PYTHON=$(scripts/torch-env.sh --stack vllm-0.33)
export VRAMLAB_TORCH_PYTHON VRAMLAB_TORCH22_PYTHON VRAMLAB_TORCH110_PYTHON VRAMLAB_VLLM_PYTHON
# The emulator's C tests (harness/emulator/tests/emu_test.c): properties, cudaMalloc and the
# stream-ordered pool's rules, against the stubs of the default stack (seconds).
step scripts/emulator-c-test.sh "$VRAMLAB_TORCH_PYTHON"
step cargo test -p vramlab --test torch_cpu --test gpu_rehearsal --test architectures --test emulate --test emulate_trust --test cublas_workspace --test moe --test stacks --test validate --test vllm --test wheel -- --ignored --test-threads=1
# The Slurm job array on a one-node localhost cluster over an emulated scenario (issue 40).
VRAMLAB="${CARGO_TARGET_DIR:-$PWD/target}/debug/vramlab" step scripts/slurm/ci.sh
if [ "${VRAMLAB_SKIP_CUDA_CHECK:-0}" != 1 ]; then
  step scripts/cuda-build-check.sh
fi
