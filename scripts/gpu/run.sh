#!/usr/bin/env bash
# The one-shot device run (ARCHITECTURE.md §13, docs/src/guides/device-run.md). On the device
# machine (x86-64, driver 580, CUDA 13, PyTorch with its CUDA 13 wheels; no Rust, no network), from
# the repository root of the device tool's copy of the working tree, with the bundle of
# scripts/gpu/build.sh carried:
#
#   run(command="bash scripts/gpu/run.sh", carry=[".cache/gpu-bundle"], timeout_s=480)
#
# Rehearsal on the CPU, the same pipeline into the same layout (every session can check it):
#
#   OUT=DIR scripts/gpu/run.sh --rehearse      # local build (VRAMLAB_BIN, else target/release
#                                              # or target/debug), scenarios/rehearse.toml
#
# What comes back is limited (at most 8 files, two folders deep, plain names), so everything
# goes into ONE archive, $OUT/gpu-run.tar.gz, rewritten after every step (a run cut short still
# brings back what it measured), plus $OUT/status.txt, one screen saying what ran. Nothing else
# is written under $OUT: logs, CSVs, manifests and sweep lock files live in a scratch folder.
#
# Steps:
# 1. libraries (device only): every NEEDED library of the binary and the ones loaded at run time
#    (libnvrtc), from PyTorch's nvidia/cu13/lib, the CUDA toolkit, then the whole disk; the
#    driver's libcuda.so.1. `ldd -v` goes into the archive; a library or a symbol version that
#    is not found stops the run with one line in status.txt;
# 2. the CUDA kernels' test (kernels/tests/cuda_ops.rs, built by scripts/gpu/build.sh as the
#    bundle's cuda_ops.gz): every fused op's forward and backward on the device against the
#    CPU, and 10 AdamW steps; its log goes into the archive (rehearsal: VRAMLAB_CUDA_OPS, if
#    set, is run the same way; without a device it says so in one line and exits 0);
# 3. for each scenario (gpu-smoke, then gpu-gen-sd15): `vramlab sweep` on the device, then
#    harness/python/vramlab/probe on the same scenario (skipped, and said so, where torch is not
#    importable, or diffusers for a generation scenario);
#    then the same torch probe on an emulated H200 (`vramlab emulate --gpu h200`, the stubs
#    from the bundle's emu-cu13, or built from the torch environment in a rehearsal): the
#    emulator's calibration against the real run, in $stem-torch-emulated.csv;
#    and vramlab's CUDA build on the same emulated H200 (`--device emu:h200`, the device's own
#    binary; in a rehearsal VRAMLAB_CUDA_BIN, default scripts/cuda-build-check.sh's build, with
#    its link stubs): $stem-candle-emulated.csv, and on a device the per-phase real-vs-emulated
#    table `vramlab compare` prints, $stem-candle-real-vs-emulated.md. So the first device run
#    runs code that has already run, on the emulated card;
# 4. every step has a time limit within VRAMLAB_RUN_BUDGET seconds.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh" || exit 1
args_parse "--rehearse" 0 0 "[--rehearse]" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
REHEARSE=${FLAG[rehearse]:-0}
OUT="${OUT:?set OUT to the folder that comes back}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUNDLE="${VRAMLAB_BUNDLE:-$ROOT/.cache/gpu-bundle}"
SWEEP_TIMEOUT="${VRAMLAB_SWEEP_TIMEOUT:-200}"
TORCH_TIMEOUT="${VRAMLAB_TORCH_TIMEOUT:-110}"
KERNELS_TIMEOUT="${VRAMLAB_KERNELS_TIMEOUT:-90}"
BUDGET="${VRAMLAB_RUN_BUDGET:-330}"
PYTHON="${VRAMLAB_TORCH_PYTHON:-${PYTHON:-python3}}"
if [ "$REHEARSE" = 1 ]; then
  MODE=rehearse
  DEVICE=cpu
  SCENARIOS="${VRAMLAB_SCENARIOS:-scenarios/rehearse.toml}"
  BIN="${VRAMLAB_BIN:-}"
  for b in "$ROOT/target/release/vramlab" "$ROOT/target/debug/vramlab"; do
    [ -z "$BIN" ] && [ -x "$b" ] && BIN="$b"
  done
else
  MODE=device
  DEVICE=cuda:0
  SCENARIOS="${VRAMLAB_SCENARIOS:-scenarios/gpu-smoke.toml scenarios/gpu-gen-sd15.toml}"
  BIN="${VRAMLAB_BIN:-$BUNDLE/vramlab}"
fi
EMU_GPU="${VRAMLAB_EMU_GPU:-h200}"   # the emulated twin of the device
CUDA_OPS="${VRAMLAB_CUDA_OPS:-}"
# vramlab's CUDA build for the emulated twin: the device binary itself; in a rehearsal, the one
# scripts/cuda-build-check.sh builds, which starts on its link stubs (the workers run under the
# emulator's).
CUDA_CACHE="${VRAMLAB_CUDA_CACHE:-$HOME/.cache/vramlab-cuda}"
if [ "$MODE" = device ]; then
  CUDA_BIN="${VRAMLAB_CUDA_BIN:-$BIN}"
  CUDA_LIB_PATH=""   # the libraries step 1 finds
else
  CUDA_BIN="${VRAMLAB_CUDA_BIN:-$CUDA_CACHE/target/debug/vramlab}"
  CUDA_LIB_PATH="$CUDA_CACHE/cuda-home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # That build's Python package (the stubs' build) is this checkout's: the cached build may come
  # from another clone, since removed, whose path it would otherwise look in.
  export VRAMLAB_PYTHON_DIR="${VRAMLAB_PYTHON_DIR:-$ROOT/harness/python}"
fi
[ -z "$CUDA_OPS" ] && [ "$MODE" = device ] && CUDA_OPS="$BUNDLE/cuda_ops"
# The emulator's stubs: the bundle's on a device (built from the CUDA headers, no torch needed);
# in a rehearsal, built from the torch environment.
BUNDLE_STUBS=""
[ "$MODE" = device ] && BUNDLE_STUBS="$BUNDLE/emu-cu13"
T0=$SECONDS
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/vramlab-gpu-run.XXXXXX")"
WORK="$SCRATCH/gpu-run"         # the archive's one top folder
mkdir -p "$WORK"
LOG="$WORK/run.log"
STEPS=()                        # one line per step, for status.txt
VERDICT="running"

say() { printf '[run.sh %3ds] %s\n' "$((SECONDS - T0))" "$*" | tee -a "$LOG" >&2; }

# Rows per status of a sweep or probe CSV (the `status` column, found by name).
row_counts() {
  [ -f "$1" ] || { echo "no csv"; return; }
  awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="status") c=i; next}
           c{n[$c]++} END{s=""; for(k in n) s=s sprintf("%s%d %s", s==""?"":", ", n[k], k); print (s==""?"0 rows":s)}' "$1"
}

# Rewrites $OUT/status.txt and $OUT/gpu-run.tar.gz from the scratch folder.
pack() {
  {
    echo "vramlab gpu/run.sh: $MODE on $DEVICE: $VERDICT"
    echo "host $(hostname), $(nproc) cpus, $((SECONDS - T0)) s of a ${BUDGET} s budget"
    echo "binary: ${BIN:-none}"
    [ -f "$WORK/BUILD_INFO" ] && sed 's/^/  /' "$WORK/BUILD_INFO"
    printf '%s\n' "${STEPS[@]}"
    echo "archive: gpu-run.tar.gz ($(find "$WORK" -type f | wc -l) files under gpu-run/)"
  } >"$OUT/status.txt"
  cp "$OUT/status.txt" "$WORK/status.txt"
  tar -czf "$SCRATCH/gpu-run.tar.gz" -C "$SCRATCH" --exclude='.*.lock' gpu-run \
    && mv -f "$SCRATCH/gpu-run.tar.gz" "$OUT/gpu-run.tar.gz"
}

# Ends the run: says why in status.txt, packs, cleans the scratch folder.
finish() {
  VERDICT="$1"
  say "$VERDICT"
  pack
  rm -rf "$SCRATCH"
  exit "$2"
}
trap 'finish "stopped by a signal" 143' TERM INT

# min(step limit, what is left of the budget), at least 1.
limit() {
  local left=$((BUDGET - (SECONDS - T0)))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -lt 1 ] && set -- 1
  printf '%s\n' "$1"
}

# Searches the given folders, then the whole file system (bounded in time).
find_lib() {
  local name="$1" d hit
  shift
  for d in "$@"; do
    [ -n "$d" ] && [ -e "$d/$name" ] && { printf '%s\n' "$d"; return 0; }
  done
  hit="$(timeout 60 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
         -name "$name" -print 2>/dev/null | head -n1)"
  [ -n "$hit" ] && { dirname "$hit"; return 0; }
  return 1
}

say "$MODE run: host $(hostname), $(nproc) cpus, $(uname -r), $(ldd --version 2>&1 | head -n1)"
if [ -n "$BIN" ] && [ ! -x "$BIN" ] && [ -f "$BIN.gz" ]; then
  gunzip -c "$BIN.gz" >"$SCRATCH/vramlab" && chmod +x "$SCRATCH/vramlab" && BIN="$SCRATCH/vramlab"
fi
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  finish "FAIL: no vramlab binary at '${BIN}' (device: scripts/gpu/build.sh and carry .cache/gpu-bundle; rehearsal: cargo build)" 1
fi
# The torch probe asks this binary for each scenario's points (`vramlab sweep --dry-run --json`).
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
export VRAMLAB_BIN="$BIN"
[ -f "$BUNDLE/BUILD_INFO" ] && [ "$MODE" = device ] && cp "$BUNDLE/BUILD_INFO" "$WORK/"

# 1. Libraries.
torch_site="$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)"
"$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' \
  >"$WORK/python-env.txt" 2>&1
if [ "$MODE" = device ]; then
  command -v nvidia-smi >/dev/null && nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1
  needed="$( (readelf -d "$BIN" 2>/dev/null || objdump -p "$BIN" 2>/dev/null) \
             | sed -n 's/.*\(NEEDED\).*\[\{0,1\}\(lib[^] ]*\)\]\{0,1\}.*/\2/p' | sort -u)"
  [ -n "$needed" ] || needed="libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13"
  # Loaded at run time, not NEEDED: candle compiles nothing, but cudarc opens nvrtc, and cuBLAS
  # opens cuBLASLt.
  wanted="$(printf '%s\n' "$needed" libnvrtc.so.13 libcublasLt.so.13 | sort -u \
            | grep -v -E '^(libc|libm|libgcc_s|libpthread|libdl|librt|libstdc\+\+)\.so' | grep -v ld-linux)"
  libdirs=""
  missing=""
  for lib in $wanted; do
    if [ "$lib" = libcuda.so.1 ]; then
      d="$(find_lib "$lib" /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 \
           /usr/local/nvidia/lib /usr/lib/wsl/lib /usr/local/cuda/compat)"
    else
      d="$(find_lib "$lib" "$torch_site/nvidia/cu13/lib" /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 \
           "$torch_site/nvidia/cublas/lib" "$torch_site/nvidia/curand/lib" \
           "$torch_site/nvidia/cuda_runtime/lib" "$torch_site/nvidia/cuda_nvrtc/lib")"
    fi
    if [ -z "$d" ]; then
      missing="$missing $lib"
      say "$lib: not found"
      continue
    fi
    case ":$libdirs:" in *":$d:"*) ;; *) libdirs="${libdirs:+$libdirs:}$d" ;; esac
    say "$lib in $d"
  done
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd -v "$BIN" >"$WORK/ldd.txt" 2>&1
  STEPS+=("libraries: $(printf '%s' "$wanted" | wc -w) wanted, missing:${missing:- none}")
  [ -z "$missing" ] || finish "FAIL: missing libraries:$missing (searched PyTorch's nvidia/*/lib, /usr/local/cuda*, then /)" 1
  if grep -q 'not found' "$WORK/ldd.txt"; then
    finish "FAIL: ldd -v: $(grep -m1 'not found' "$WORK/ldd.txt" | sed 's/^[[:space:]]*//')" 1
  fi
else
  ldd -v "$BIN" >"$WORK/ldd.txt" 2>&1
  STEPS+=("libraries: not checked (rehearsal on the CPU)")
fi
"$BIN" --version >"$WORK/vramlab-version.txt" 2>&1
pack

# 2. The CUDA kernels against the CPU.
if [ -n "$CUDA_OPS" ] && [ ! -x "$CUDA_OPS" ] && [ -f "$CUDA_OPS.gz" ]; then
  gunzip -c "$CUDA_OPS.gz" >"$SCRATCH/cuda_ops" && chmod +x "$SCRATCH/cuda_ops" && CUDA_OPS="$SCRATCH/cuda_ops"
fi
if [ -n "$CUDA_OPS" ] && [ -x "$CUDA_OPS" ]; then
  t="$(limit "$KERNELS_TIMEOUT")"
  say "kernels: $CUDA_OPS (limit ${t}s)"
  t1=$SECONDS
  timeout -k 10 "$t" "$CUDA_OPS" >"$WORK/cuda-ops.log" 2>&1
  rc=$?
  STEPS+=("kernels cuda_ops: exit $rc, $((SECONDS - t1)) s: $(grep -v '^$' "$WORK/cuda-ops.log" | tail -n1 | cut -c1-160)")
  say "kernels cuda_ops exit $rc"
else
  STEPS+=("kernels cuda_ops: skipped (no binary${CUDA_OPS:+ at $CUDA_OPS}; device: scripts/gpu/build.sh; rehearsal: set VRAMLAB_CUDA_OPS)")
fi
pack

# 3. Sweeps and the PyTorch reference.
torch_ok=0
"$PYTHON" -c 'import torch, transformers' 2>/dev/null && torch_ok=1
diffusers_ok=0
"$PYTHON" -c 'import diffusers' 2>/dev/null && diffusers_ok=1
sweep_rc=0
torch_rc=0
for scenario in $SCENARIOS; do
  [ -f "$scenario" ] || { STEPS+=("$scenario: not present, skipped"); continue; }
  stem="$(basename "$scenario" .toml)"
  t="$(limit "$SWEEP_TIMEOUT")"
  say "vramlab sweep $scenario --device $DEVICE (limit ${t}s)"
  t1=$SECONDS
  timeout -k 10 "$t" "$BIN" sweep "$scenario" --device "$DEVICE" --out "$WORK/$stem-candle.csv" >>"$LOG" 2>&1
  rc=$?
  STEPS+=("sweep $stem: exit $rc, $((SECONDS - t1)) s, rows: $(row_counts "$WORK/$stem-candle.csv")")
  say "vramlab $stem exit $rc"
  [ "$rc" -eq 0 ] || sweep_rc=$rc
  pack
  if [ -x "$CUDA_BIN" ]; then
    t="$(limit "$SWEEP_TIMEOUT")"
    say "vramlab (CUDA build) sweep $scenario --device emu:$EMU_GPU (limit ${t}s)"
    t1=$SECONDS
    timeout -k 10 "$t" env LD_LIBRARY_PATH="${CUDA_LIB_PATH:-${LD_LIBRARY_PATH:-}}" \
      ${BUNDLE_STUBS:+VRAMLAB_EMU_STUBS="$BUNDLE_STUBS"} "$CUDA_BIN" sweep "$scenario" \
      --device "emu:$EMU_GPU" --out "$WORK/$stem-candle-emulated.csv" >>"$LOG" 2>&1
    rc=$?
    STEPS+=("candle emulated $stem: exit $rc, $((SECONDS - t1)) s, rows: $(row_counts "$WORK/$stem-candle-emulated.csv")")
    say "vramlab emulated $stem exit $rc"
    [ "$rc" -eq 0 ] || sweep_rc=$rc
    if [ "$MODE" = device ] && [ -f "$WORK/$stem-candle.csv" ] && [ -f "$WORK/$stem-candle-emulated.csv" ]; then
      # Real against emulated, per phase: the emulator's calibration for candle (exit 1 is a
      # difference past the margins, which is what this table reports).
      "$BIN" compare "$WORK/$stem-candle.csv" "$WORK/$stem-candle-emulated.csv" \
        --allow-device-change --markdown >"$WORK/$stem-candle-real-vs-emulated.md" 2>>"$LOG"
    fi
  else
    STEPS+=("candle emulated $stem: skipped (no CUDA build at $CUDA_BIN; rehearsal: scripts/cuda-build-check.sh or VRAMLAB_CUDA_BIN)")
  fi
  pack
  if [ "$torch_ok" = 1 ] && [ "$diffusers_ok" = 0 ] && grep -q '"generate"' "$scenario"; then
    STEPS+=("torch $stem: skipped (generation needs diffusers, not importable in $PYTHON)")
  elif [ "$torch_ok" = 1 ]; then
    t="$(limit "$TORCH_TIMEOUT")"
    say "torch_probe $scenario --device $DEVICE (limit ${t}s)"
    t1=$SECONDS
    if [ "$MODE" = rehearse ]; then
      # On the CPU, torch is measured under the preload meter (docs/src/guides/torch-probe.md).
      timeout -k 10 "$t" env VRAMLAB_TORCH_PYTHON="$PYTHON" scripts/torch-cpu.sh "$scenario" \
        --out "$WORK/$stem-torch.csv" >>"$LOG" 2>&1
    else
      timeout -k 10 "$t" "$PYTHON" harness/python/vramlab/probe "$scenario" --device "$DEVICE" \
        --out "$WORK/$stem-torch.csv" >>"$LOG" 2>&1
    fi
    rc=$?
    STEPS+=("torch $stem: exit $rc, $((SECONDS - t1)) s, rows: $(row_counts "$WORK/$stem-torch.csv")")
    say "torch_probe $stem exit $rc"
    [ "$rc" -eq 0 ] || torch_rc=$rc
    t="$(limit "$TORCH_TIMEOUT")"
    say "torch_probe $scenario on an emulated $EMU_GPU (limit ${t}s)"
    t1=$SECONDS
    emu_env=(VRAMLAB_PYTHON_DIR="$ROOT/harness/python")
    [ -n "$BUNDLE_STUBS" ] && emu_env+=(VRAMLAB_EMU_STUBS="$BUNDLE_STUBS")
    timeout -k 10 "$t" env "${emu_env[@]}" "$BIN" emulate --gpu "$EMU_GPU" -- "$PYTHON" \
      harness/python/vramlab/probe "$scenario" --device cuda:0 --out "$WORK/$stem-torch-emulated.csv" \
      >>"$LOG" 2>&1
    rc=$?
    STEPS+=("torch emulated $stem: exit $rc, $((SECONDS - t1)) s, rows: $(row_counts "$WORK/$stem-torch-emulated.csv")")
    say "torch_probe emulated $stem exit $rc"
    [ "$rc" -eq 0 ] || torch_rc=$rc
  else
    STEPS+=("torch $stem: skipped (no torch + transformers in $PYTHON)")
  fi
  pack
done

[ "$MODE" = device ] && command -v nvidia-smi >/dev/null && nvidia-smi \
  --query-gpu=name,memory.used,memory.total,driver_version --format=csv >>"$WORK/nvidia-smi.txt" 2>&1
if [ "$sweep_rc" -eq 0 ] && [ "$torch_rc" -eq 0 ]; then
  finish "ok" 0
fi
finish "done with failures: sweep exit $sweep_rc, torch exit $torch_rc" 1
