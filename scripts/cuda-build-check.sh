#!/usr/bin/env bash
# CI compile-and-link check of the CUDA backend, without a GPU (ARCHITECTURE.md §13):
#   1. scripts/cuda-toolchain.sh (CUDA 13.0 wheels + link stubs, cached);
#   2. cargo build -p vramlab --features cuda, with CARGO_TARGET_DIR in the cache (outside the
#      clone, so the nvcc step is done once per machine);
#   3. runs that binary with the stubs on LD_LIBRARY_PATH: `sweep scenarios/smoke.toml
#      --device cuda:0` must exit non-zero with one line saying "no CUDA device", and no panic.
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
echo "cuda-build-check: ok (build ${t_build}s, total $((SECONDS - t0))s)" >&2
