#!/usr/bin/env bash
# The one-shot device run (DESIGN.md §10.5, §11; issue 5). Runs on the device machine: x86-64,
# driver 580, CUDA 13.0, PyTorch with the CUDA 13 libraries in its site-packages; no Rust, no
# network. From the repository root (the device tool's copy of the working tree), with the
# bundle of scripts/gpu/build.sh carried:
#
#   run(command="bash scripts/gpu/run.sh", carry=[".cache/gpu-bundle"], timeout_s=420)
#
# 1. finds the driver's libcuda.so.1 and the CUDA 13 cudart/cublas/cublasLt/curand (PyTorch's
#    nvidia/cu13/lib first), and sets LD_LIBRARY_PATH;
# 2. for each scenario (gpu-smoke.toml, and gpu-smoke-train.toml where it exists) runs
#    `vramlab sweep SCENARIO --device cuda:0`, then the PyTorch reference, scripts/torch_probe.py,
#    on the same scenario;
# 4. writes CSVs, manifests, logs and the environment to $OUT.
# Each step has a time limit, so that the whole run ends in under 6 minutes.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:?set OUT to the folder that comes back}"
mkdir -p "$OUT"
BUNDLE="${VRAMLAB_BUNDLE:-$ROOT/.cache/gpu-bundle}"
BIN="${VRAMLAB_BIN:-$BUNDLE/vramlab}"
# The scenarios, in order; those missing are skipped. gpu-smoke-train.toml (training on the
# small models) is run when it exists.
SCENARIOS="${VRAMLAB_SCENARIOS:-scenarios/gpu-smoke.toml scenarios/gpu-smoke-train.toml}"
SWEEP_TIMEOUT="${VRAMLAB_SWEEP_TIMEOUT:-200}"
TORCH_TIMEOUT="${VRAMLAB_TORCH_TIMEOUT:-110}"
BUDGET="${VRAMLAB_RUN_BUDGET:-330}"   # seconds for the whole script; every step is cut to fit
PYTHON="${PYTHON:-python3}"
export VRAMLAB_CACHE="${VRAMLAB_CACHE:-$ROOT/.cache/synthetic}"
T0=$SECONDS

exec > >(tee -a "$OUT/run.log") 2>&1
say() { printf '[run.sh %3ds] %s\n' "$((SECONDS - T0))" "$*"; }

# Searches the usual places first, then the whole file system (bounded in time).
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

say "host $(hostname), $(nproc) cpus, $(uname -r), $(ldd --version 2>&1 | head -n1)"
if [ ! -x "$BIN" ] && [ -f "$BIN.gz" ]; then
  unpacked="${TMPDIR:-/tmp}/vramlab-gpu/vramlab"
  mkdir -p "$(dirname "$unpacked")"
  gunzip -c "$BIN.gz" >"$unpacked" && chmod +x "$unpacked" && BIN="$unpacked"
fi
[ -x "$BIN" ] || { say "no vramlab binary at $BIN (build it with scripts/gpu/build.sh and carry .cache/gpu-bundle)"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
[ -f "$BUNDLE/BUILD_INFO" ] && cp "$BUNDLE/BUILD_INFO" "$OUT/"

# PyTorch's CUDA 13 libraries.
torch_site="$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)"
"$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' \
  >"$OUT/python-env.txt" 2>&1
cu13=""
if [ -n "$torch_site" ] && [ -d "$torch_site/nvidia/cu13/lib" ]; then
  cu13="$torch_site/nvidia/cu13/lib"
fi
for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13; do
  d="$(find_lib "$lib" "$cu13" /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 \
       "$torch_site/nvidia/cublas/lib" "$torch_site/nvidia/curand/lib" "$torch_site/nvidia/cuda_runtime/lib")" \
    || { say "$lib not found"; continue; }
  case ":${libdirs:-}:" in *":$d:"*) ;; *) libdirs="${libdirs:+$libdirs:}$d" ;; esac
  say "$lib in $d"
done
drv="$(find_lib libcuda.so.1 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 \
       /usr/local/nvidia/lib /usr/lib/wsl/lib /usr/local/cuda/compat)" || drv=""
if [ -n "$drv" ]; then say "libcuda.so.1 in $drv"; else say "libcuda.so.1 not found"; fi
export LD_LIBRARY_PATH="${libdirs:-}${drv:+:$drv}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$BIN" >"$OUT/ldd.txt" 2>&1
if grep -q 'not found' "$OUT/ldd.txt"; then
  say "missing libraries:"; grep 'not found' "$OUT/ldd.txt"
fi
"$BIN" --version >"$OUT/vramlab-version.txt" 2>&1

# min(step limit, what is left of the budget), at least 1.
limit() {
  local left=$((BUDGET - (SECONDS - T0)))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -lt 1 ] && set -- 1
  printf '%s\n' "$1"
}

sweep_rc=0
torch_rc=0
for scenario in $SCENARIOS; do
  [ -f "$scenario" ] || { say "no $scenario, skipped"; continue; }
  stem="$(basename "$scenario" .toml)"
  t="$(limit "$SWEEP_TIMEOUT")"
  say "vramlab sweep $scenario (limit ${t}s)"
  timeout -k 10 "$t" "$BIN" sweep "$scenario" --device cuda:0 --out "$OUT/$stem-candle.csv"
  rc=$?
  say "vramlab $stem exit $rc"
  [ "$rc" -eq 0 ] || sweep_rc=$rc
  t="$(limit "$TORCH_TIMEOUT")"
  say "torch_probe.py $scenario (limit ${t}s)"
  timeout -k 10 "$t" "$PYTHON" scripts/torch_probe.py "$scenario" --device cuda:0 \
    --out "$OUT/$stem-torch.csv"
  rc=$?
  say "torch_probe $stem exit $rc"
  [ "$rc" -eq 0 ] || torch_rc=$rc
done

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version \
  --format=csv >>"$OUT/nvidia-smi.txt" 2>&1
printf 'sweep_rc=%s\ntorch_rc=%s\nseconds=%s\n' "$sweep_rc" "$torch_rc" "$((SECONDS - T0))" >"$OUT/status.txt"
say "done: sweep $sweep_rc, torch $torch_rc, $((SECONDS - T0))s; files in $OUT:"
ls -la "$OUT"
[ "$sweep_rc" -eq 0 ] && [ "$torch_rc" -eq 0 ]
