#!/usr/bin/env bash
# Benchmark of vramlab's CUDA build on the emulated GPU (not a test; docs/src/guides/emulator.md,
# "candle on the emulated GPU"): the wall time of one sweep by the CPU build on the CPU and by the
# CUDA build on an emulated H100-80GB, and their ratio. The CUDA build is scripts/cuda-build-check.sh's
# (VRAMLAB_CUDA_BIN overrides it); the CPU build is a release build.
#
#   scripts/bench-emulated-cuda.sh [SCENARIO]     # default scenarios/smoke.toml
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 1 "[SCENARIO]" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCENARIO="${ARGS[0]:-scenarios/smoke.toml}"
CACHE="${VRAMLAB_CUDA_CACHE:-$HOME/.cache/vramlab-cuda}"
CUDA_BIN="${VRAMLAB_CUDA_BIN:-$CACHE/target/debug/vramlab}"
[ -x "$CUDA_BIN" ] || { echo "bench-emulated-cuda: no CUDA build at $CUDA_BIN (scripts/cuda-build-check.sh builds it)" >&2; exit 2; }
cargo build --quiet --release -p vramlab --manifest-path "$ROOT/Cargo.toml"
export VRAMLAB_MODELS="${VRAMLAB_MODELS:-$ROOT/.cache/models}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$ROOT"
t0=$(date +%s.%N)
"$ROOT/target/release/vramlab" sweep "$SCENARIO" --device cpu --out "$tmp/cpu.csv" --quiet
t1=$(date +%s.%N)
LD_LIBRARY_PATH="$CACHE/cuda-home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$CUDA_BIN" sweep "$SCENARIO" --device emu:h100-80gb --out "$tmp/emu.csv" --quiet
t2=$(date +%s.%N)
cpu=$(echo "$t1 - $t0" | bc -l)
emu=$(echo "$t2 - $t1" | bc -l)
printf '%s: CPU build on cpu %.1f s, CUDA build (%s) on emu:h100-80gb %.1f s, ratio CPU/emulated %.1f\n' \
  "$SCENARIO" "$cpu" "$(basename "$(dirname "$CUDA_BIN")")" "$emu" "$(echo "$cpu / $emu" | bc -l)"
