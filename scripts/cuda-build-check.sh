#!/usr/bin/env bash
# CI compile-and-link check of the CUDA backend, without a GPU (ARCHITECTURE.md §13):
#   1. scripts/cuda-toolchain.sh (CUDA 13.0 wheels + link stubs, cached);
#   2. cargo build -p vramlab --features cuda, with CARGO_TARGET_DIR in the cache (outside the
#      clone, so the nvcc step is done once per machine);
#   3. runs that binary with the stubs on LD_LIBRARY_PATH: `sweep scenarios/smoke.toml
#      --device cuda:0` must exit non-zero with one line saying "no CUDA device", and no panic;
#   4. runs it on the emulated GPU (docs/src/guides/emulator.md, "candle on the emulated GPU";
#      the emulator's stubs come from the default torch environment, scripts/torch-env.sh):
#      scenarios/gpu-smoke.toml on emu:h100-80gb and on emu:rtx-4090 (too small for some points:
#      oom rows, exit 0), scenarios/emu-candle-attention.toml, and an unknown emulated GPU (one
#      line, exit 2); scripts/cuda-emulated-check.py checks the rows against figures it derives
#      from the models' configs. About 3 minutes on 2 cores.
# Needs the smoke model (scripts/fetch-test-models.sh), since the sweep resolves it first.
#
#   scripts/cuda-build-check.sh   # no arguments
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 0 "" "$@"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${VRAMLAB_CUDA_CACHE:-$HOME/.cache/vramlab-cuda}"
export VRAMLAB_CUDA_CACHE="$CACHE"
TARGET="${VRAMLAB_CUDA_TARGET:-$CACHE/target}"
PROFILE="${VRAMLAB_CUDA_PROFILE:-dev}"   # dev or release

fail() { printf 'cuda-build-check: FAIL: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS

"$ROOT/scripts/cuda-toolchain.sh" >/dev/null
# shellcheck source=/dev/null
source "$CACHE/env.sh"

cd "$ROOT"
echo "cuda-build-check: cargo build -p vramlab --features cuda (target $TARGET)" >&2
CARGO_TARGET_DIR="$TARGET" nice -n 19 cargo build -p vramlab --features cuda --profile "$PROFILE"
dir=debug
[ "$PROFILE" = dev ] || dir="$PROFILE"
BIN="$TARGET/$dir/vramlab"
[ -x "$BIN" ] || fail "no binary at $BIN"
t_build=$((SECONDS - t0))

# The CUDA binary must not start without the CUDA libraries (it links them), and with the
# stubs every driver call returns CUDA_ERROR_NO_DEVICE.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
set +e
LD_LIBRARY_PATH="$VRAMLAB_CUDA_STUBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" RUST_BACKTRACE=1 \
  "$BIN" sweep scenarios/smoke.toml --device cuda:0 --out "$tmp/cuda.csv" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
set -e
out="$(cat "$tmp/stdout" "$tmp/stderr")"
lines="$(printf '%s\n' "$out" | grep -c .)" || true
printf 'cuda-build-check: exit %s, output:\n%s\n' "$rc" "$out" >&2
[ "$rc" -ne 0 ] || fail "the CUDA build ran a sweep on the stub driver (exit 0)"
[ "$rc" -ne 127 ] || fail "the loader could not start the binary (exit 127): missing stub library?"
[ "$rc" -lt 128 ] || fail "killed by a signal (exit $rc)"
printf '%s' "$out" | grep -qi 'panicked' && fail "it panicked"
printf '%s' "$out" | grep -q 'stack backtrace' && fail "it printed a backtrace"
[ "$lines" -eq 1 ] || fail "expected one line of output, got $lines"
printf '%s' "$out" | grep -q 'no CUDA device' || fail "the line does not say \"no CUDA device\""
t_emu=$SECONDS
# 4. The emulated GPU: the parent loads the link stubs, its workers run under the emulator's.
emu() {
  LD_LIBRARY_PATH="$VRAMLAB_CUDA_STUBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BIN" sweep "$@" --quiet
}
emu scenarios/gpu-smoke.toml --device emu:h100-80gb --out "$tmp/emu-h100.csv" ||
  fail "gpu-smoke on emu:h100-80gb exited $?"
emu scenarios/gpu-smoke.toml --device emu:rtx-4090 --out "$tmp/emu-4090.csv" ||
  fail "gpu-smoke on emu:rtx-4090 (oom rows expected, exit 0) exited $?"
emu scenarios/emu-candle-attention.toml --out "$tmp/emu-attention.csv" ||
  fail "emu-candle-attention exited $?"
set +e
emu scenarios/smoke.toml --device emu:no-such-gpu --out "$tmp/bad.csv" >"$tmp/bad.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && [ "$(grep -c . "$tmp/bad.out")" -eq 1 ] && grep -q "no-such-gpu" "$tmp/bad.out" ||
  fail "an unknown emulated GPU: expected one line and exit 2, got exit $rc: $(cat "$tmp/bad.out")"
python3 "$ROOT/scripts/cuda-emulated-check.py" "$tmp/emu-h100.csv" "$tmp/emu-4090.csv" "$tmp/emu-attention.csv" ||
  fail "the emulated GPU's rows (above)"
echo "cuda-build-check: ok (build ${t_build}s, emulated GPU $((SECONDS - t_emu))s, total $((SECONDS - t0))s)" >&2
