#!/usr/bin/env bash
# Builds the device bundle (ARCHITECTURE.md §13, docs/src/guides/device-run.md): a stripped release
# `vramlab` with `--features cuda`, built here without a GPU, plus what scripts/gpu/run.sh needs
# beside it.
#
#   scripts/gpu/build.sh        # -> .cache/gpu-bundle/ (git-ignored, inside the clone)
#
# The binary ships gzipped (vramlab.gz, ~14 MiB instead of ~57): run.sh unpacks it. Beside it,
# cuda_ops.gz: the CUDA kernels' test (kernels/tests/cuda_ops.rs, dev profile, whose
# dependencies are opt-level 3), which run.sh runs first.
# The bundle lives inside the clone so that the device tool can carry it (`carry` takes paths
# relative to the repository root, 64 MiB in all); VRAMLAB_BUNDLE overrides the place. The build
# itself uses the CUDA cache's target dir (scripts/cuda-toolchain.sh), never ./target.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh"
args_parse "" 0 0 "" "$@"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${VRAMLAB_CUDA_CACHE:-$HOME/.cache/vramlab-cuda}"
export VRAMLAB_CUDA_CACHE="$CACHE"
TARGET="${VRAMLAB_CUDA_TARGET:-$CACHE/target}"
BUNDLE="${VRAMLAB_BUNDLE:-$ROOT/.cache/gpu-bundle}"
LIMIT=$((64 * 1024 * 1024))

"$ROOT/scripts/cuda-toolchain.sh" >/dev/null
# shellcheck source=/dev/null
source "$CACHE/env.sh"

cd "$ROOT"
CARGO_TARGET_DIR="$TARGET" nice -n 19 cargo build --release -p vramlab --features cuda
# The test binary's path is in cargo's JSON messages (its name carries a hash).
ops="$(CARGO_TARGET_DIR="$TARGET" nice -n 19 cargo build -p vramlab-kernels --features cuda \
        --test cuda_ops --message-format=json-render-diagnostics \
      | sed -n 's/.*"executable":"\([^"]*\/cuda_ops-[^"]*\)".*/\1/p' | tail -n1)"
[ -x "$ops" ] || { echo "gpu/build.sh: no cuda_ops test binary (got '$ops')" >&2; exit 1; }

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"
strip -o "$BUNDLE/vramlab" "$TARGET/release/vramlab"
strip -o "$BUNDLE/cuda_ops" "$ops"
gzip -9 "$BUNDLE/cuda_ops"
# The emulated GPU's stubs for CUDA 13 torch builds (the device's PyTorch is one), from the torch
# environment's CUDA headers: the device run measures the same torch scenarios emulated, beside
# the real ones (docs/src/guides/emulator.md).
TORCH_PY="$("$ROOT/scripts/torch-env.sh")"
EMU_INC="$("$TORCH_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13/include"
"$ROOT/scripts/emulator-build.sh" --headers "$EMU_INC" "$BUNDLE/emu-cu13" >/dev/null
# What the run needs from the tree, so the bundle also works on its own (run.sh prefers the
# working tree's copies when it runs from a clone).
mkdir -p "$BUNDLE/scenarios" "$BUNDLE/scripts/gpu" "$BUNDLE/scripts/lib"
cp scenarios/gpu-smoke.toml "$BUNDLE/scenarios/"
# The torch probe's package (vramlab/probe).
rm -rf "$BUNDLE/harness/python/vramlab/probe"
mkdir -p "$BUNDLE/harness/python/vramlab/probe"
tar -C harness/python/vramlab/probe --exclude=__pycache__ -cf - . | tar -C "$BUNDLE/harness/python/vramlab/probe" -xf -
cp scripts/gpu/run.sh "$BUNDLE/scripts/gpu/"
cp scripts/lib/args.sh "$BUNDLE/scripts/lib/"  # run.sh sources it
grep -o 'synthetic:[^"]*' scenarios/gpu-smoke.toml | cut -d: -f2- | while read -r cfg; do
  [ -f "$cfg" ] || { echo "gpu/build.sh: $cfg (from gpu-smoke.toml) is missing" >&2; exit 1; }
  mkdir -p "$BUNDLE/$(dirname "$cfg")"
  cp "$cfg" "$BUNDLE/$cfg"
done
{
  echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git_rev=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  echo "nvcc=$(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
  echo "cuda_compute_cap=$CUDA_COMPUTE_CAP"
  echo "glibc_needed=$(objdump -T "$BUNDLE/vramlab" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
  echo "needed=$(objdump -p "$BUNDLE/vramlab" | awk '/NEEDED/{printf "%s ", $2}')"
} >"$BUNDLE/BUILD_INFO"

bin=$(stat -c %s "$BUNDLE/vramlab")
gzip -9 "$BUNDLE/vramlab"
gz=$(stat -c %s "$BUNDLE/vramlab.gz")
size=$(du -sb "$BUNDLE" | cut -f1)
printf 'gpu/build.sh: bundle %s: %d bytes (%.1f MiB; binary %.1f MiB, %.1f MiB gzipped)\n' \
  "$BUNDLE" "$size" "$(echo "$size / 1048576" | bc -l)" "$(echo "$bin / 1048576" | bc -l)" \
  "$(echo "$gz / 1048576" | bc -l)"
cat "$BUNDLE/BUILD_INFO"
if [ "$size" -ge "$LIMIT" ]; then
  echo "gpu/build.sh: FAIL: the bundle is over 64 MiB" >&2
  exit 1
fi
