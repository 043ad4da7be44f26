#!/usr/bin/env bash
# Builds the emulated GPU's stub libraries (docs/src/guides/emulator.md) for one PyTorch
# environment and prints the folder that holds them. No GPU and no CUDA toolkit are needed:
# the headers come from the NVIDIA wheels that PyTorch itself depends on (nvidia/cu13/include,
# or the CUDA 12 wheels' nvidia/*/include), so the stubs match the CUDA major of that torch.
#
#   scripts/emulator-build.sh [PYTHON]     # PYTHON defaults to scripts/torch-env.sh's
#   scripts/emulator-build.sh --headers INC[:INC...] OUT
#
# The hand-written entry points are harness/emulator/{emu,runtime,launch,pool,driver,refused}.c (and nvml.c, nccl.c). Every other CUDA runtime and cuBLAS
# function gets a generated stub that returns success, so no call reaches the real libcudart
# (which would look for a driver). For a torch environment these are the functions its torch
# libraries import; the output is cached by a hash of the sources, torch's version and the
# header version, in $VRAMLAB_EMU_CACHE (default ~/.cache/vramlab-emu). With --headers (the
# wheel's build, scripts/build-wheel.sh, which has no torch) they are every function the
# headers under INC... declare, and the libraries are written to OUT, uncached.
# Output: libvramlab_emu.so (preloaded), libcuda.so.1 (the same code under the driver's
# soname, for torch's NVRTC module, which links libcuda, and for Triton's dlopen),
# libnvidia-ml.so.1 (NVML: harness/emulator/nvml.c), libnccl.so.2 (NCCL: harness/emulator/nccl.c,
# preloaded after libvramlab_emu.so), BUILD-INFO, `generated` (the names
# given a stub that succeeds without acting, one a line) and cuda-libs/ (empty libraries under
# the sonames of libcudart, cuBLAS and cuRAND, for a program linked against them, such as
# vramlab's CUDA build: the loader needs a file of each name, and the preloaded library defines
# the functions. `vramlab emulate` puts it on the library path only for ELF programs other than
# Python, whose torch brings its own).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "--headers=" 0 1 "[PYTHON] | --headers INC[:INC...] OUT" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'emulator-build: %s\n' "$*" >&2; }
MODE=torch
if [ -n "${FLAG[headers]-}" ]; then
  [ "${#ARGS[@]}" -eq 1 ] || die_usage "--headers INC needs OUT, the folder to write"
  MODE=headers INCS=${FLAG[headers]} OUT=${ARGS[0]} TORCH_VERSION=none TORCH_CUDA=none
else
  PY="${ARGS[0]:-}"
  if [ -z "$PY" ]; then
    PY="$("$ROOT/scripts/torch-env.sh")"
  fi

  info="$("$PY" - <<'PYEOF'
import importlib.util, os, sys, sysconfig
spec = importlib.util.find_spec("torch")
if spec is None:
    print("ERR no module named 'torch'"); sys.exit(0)
torch_dir = os.path.dirname(spec.origin)
ver = open(os.path.join(torch_dir, "version.py")).read()
import re
tv = re.search(r"__version__\s*=\s*'([^']+)'", ver).group(1)
cv = re.search(r"cuda\s*(?::\s*Optional\[str\])?\s*=\s*'([^']+)'", ver)
purelib = sysconfig.get_paths()["purelib"]
incs = []
nv = os.path.join(purelib, "nvidia")
for root in sorted(os.listdir(nv)) if os.path.isdir(nv) else []:
    inc = os.path.join(nv, root, "include")
    if os.path.isdir(inc):
        incs.append(inc)
print(tv, cv.group(1) if cv else "none", os.path.join(torch_dir, "lib"), ":".join(incs))
PYEOF
  )"
  case "$info" in ERR*) log "${info#ERR }: $PY has no torch"; exit 2;; esac
  read -r TORCH_VERSION TORCH_CUDA TORCH_LIB INCS <<<"$info"
  if [ "$TORCH_CUDA" = none ]; then
    log "torch $TORCH_VERSION in $PY is a CPU-only build: the emulator needs a CUDA build of torch"
    exit 2
  fi
  CACHE="${VRAMLAB_EMU_CACHE:-$HOME/.cache/vramlab-emu}"
fi
if [ "$MODE" = torch ]; then
  mkdir -p "$CACHE"
  tmp="$(mktemp -d "$CACHE/build.XXXXXX")"
else
  tmp="$(mktemp -d)"
fi
trap 'rm -rf "$tmp"' EXIT
# The wheels ship the runtime's headers without crt/host_defines.h (it comes with nvcc); host C
# needs only its qualifier macros, empty here.
mkdir -p "$tmp/shim/crt"
{
  echo '#pragma once'
  for m in __host__ __device__ __global__ __shared__ __constant__ __managed__ __cudart_builtin__ \
           __device_builtin__ __device_builtin_texture_type__ __device_builtin_surface_type__ \
           CUDARTAPI CUDARTAPI_CDECL __specialization_static __import__ __export__ __cdecl \
           __inline_hint__; do
    echo "#define $m"
  done
  echo '#define __builtin_align__(a) __attribute__((aligned(a)))'
  echo '#define __align__(a) __attribute__((aligned(a)))'
  echo '#define __location__(a) __attribute__((a))'
  echo '#define __annotate__(a) __attribute__((a))'
  echo '#define __forceinline__ inline __attribute__((always_inline))'
  echo '#define __noinline__ __attribute__((noinline))'
  echo '#define __no_return__ __attribute__((noreturn))'
  echo '#define __thread__ __thread'
} >"$tmp/shim/crt/host_defines.h"
# cuda_fp16.h includes CCCL's <nv/target> (nvidia-cuda-cccl), whose macros only its C++ part
# uses: an empty one, searched after every real include dir, stands in where CCCL is absent.
mkdir -p "$tmp/shim-last/nv"
echo '#pragma once' >"$tmp/shim-last/nv/target"
CFLAGS=(-O2 -fPIC -Wall -Wno-unused-parameter -Wno-format-truncation -fvisibility=hidden -I "$tmp/shim"
        -idirafter "$tmp/shim-last")
# A torch built against CUDA 10 (the torch-1.10 stack) is answered in CUDA 10's struct layouts;
# its headers are CUDA 11's (the oldest NVIDIA publishes as wheels), see emu.c.
case "${TORCH_CUDA:-}" in 10.*) CFLAGS+=(-DVRAMLAB_CUDART_10);; esac
IFS=: read -r -a inc_dirs <<<"$INCS"
for d in "${inc_dirs[@]}"; do CFLAGS+=(-I "$d"); done
if ! printf '#include <cuda_runtime_api.h>\n#include <cublasLt.h>\n' | cc "${CFLAGS[@]}" -E -x c - >/dev/null 2>&1; then
  log "no CUDA headers (cuda_runtime_api.h, cublasLt.h) under $INCS$([ "$MODE" = torch ] && echo " for torch $TORCH_VERSION+cu$TORCH_CUDA")"
  exit 2
fi
if [ "$MODE" = headers ]; then
  TORCH_CUDA="$(printf '#include <cuda_runtime_api.h>\nCUDART_VERSION\n' | cc "${CFLAGS[@]}" -E -P -x c - | tail -n 1)"
fi
if [ "$MODE" = torch ]; then
  key="$(cat "$ROOT"/harness/emulator/*.[ch] "$ROOT/scripts/emulator-build.sh" | sha256sum | cut -c1-12)"
  OUT="$CACHE/torch-$TORCH_VERSION-cu$TORCH_CUDA-$key"
  if [ -f "$OUT/libvramlab_emu.so" ] && [ -f "$OUT/libcuda.so.1" ] && [ -f "$OUT/libnvidia-ml.so.1" ] && [ -f "$OUT/libnccl.so.2" ]; then
    echo "$OUT"
    exit 0
  fi
fi
# The hand-written files, by area: emu.c (devices, failures, records, memory), runtime.c
# (properties, allocation, copies), launch.c (streams, events, launches, the driver, cuBLAS),
# pool.c (the stream-ordered pool, cuRAND), driver.c (the driver beyond torch: vLLM, Triton).
HAND=(emu runtime launch pool driver)
objs=()
for f in "${HAND[@]}"; do
  cc "${CFLAGS[@]}" -c "$ROOT/harness/emulator/$f.c" -o "$tmp/$f.o"
  objs+=("$tmp/$f.o")
done
cc -O2 -fPIC -Wall -fvisibility=hidden -c "$ROOT/harness/emulator/refused.c" -o "$tmp/refused.o"
objs+=("$tmp/refused.o")
# The names the hand-written files define; every other CUDA runtime or cuBLAS name torch imports gets a stub.
nm --defined-only -g "${objs[@]}" | awk '{print $3}' | sort -u >"$tmp/defined"
if [ "$MODE" = torch ]; then
  # Imported, and also cuBLAS's own names where torch links cuBLAS statically and exports them
  # (the CUDA 10 wheels): preloaded, ours come first there too.
  { for lib in "$TORCH_LIB"/*.so; do nm -D --undefined-only "$lib" 2>/dev/null; done |
      awk '{print $2}'
    for lib in "$TORCH_LIB"/*.so; do nm -D --defined-only "$lib" 2>/dev/null; done |
      awk '$2 == "T" {print $3}'
  } | sed 's/@.*//' | grep -E '^(cuda|__cuda|cublas)' | sort -u >"$tmp/imported"
else
  # Every function the headers declare, under its linked name (the preprocessor applies the
  # headers' renames: cublasSgemm is cublasSgemm_v2, CUDA 12's cudaGetDeviceProperties is
  # cudaGetDeviceProperties_v2). Typedefs (function-pointer types) are left out.
  printf '#include <cuda_runtime_api.h>\n#include <cublas_v2.h>\n#include <cublasLt.h>\n#include <cublasXt.h>\n' |
    cc "${CFLAGS[@]}" -E -P -x c - | tr '\n' ' ' | tr ';{}' '\n\n\n' | grep -v '^[[:space:]]*typedef' |
    grep -oE '(^|[^A-Za-z0-9_])(__cuda|cuda|cublas)[A-Za-z0-9_]*[[:space:]]*\(' |
    sed -E 's/^[^A-Za-z_]*//; s/[[:space:]]*\($//' >"$tmp/declared"
  # What nvcc's host code calls to register and launch kernels (crt/host_runtime.h, which ships
  # with nvcc, not with the wheels).
  printf '%s\n' __cudaRegisterFatBinary __cudaRegisterFatBinaryEnd __cudaUnregisterFatBinary \
    __cudaRegisterFunction __cudaRegisterVar __cudaRegisterManagedVar __cudaInitModule \
    __cudaRegisterTexture __cudaRegisterSurface __cudaPushCallConfiguration \
    __cudaPopCallConfiguration __cudaGetKernel __cudaLaunchKernel >>"$tmp/declared"
  sort -u "$tmp/declared" >"$tmp/imported"
fi
comm -23 "$tmp/imported" "$tmp/defined" >"$tmp/generated"
{
  echo '/* Generated by scripts/emulator-build.sh: each returns success (0) without acting. */'
  while read -r name; do
    echo "__attribute__((visibility(\"default\"))) int $name(void) { return 0; }"
  done <"$tmp/generated"
} >"$tmp/generated.c"
cc -O2 -fPIC -c "$tmp/generated.c" -o "$tmp/generated.o"
cc -shared -o "$tmp/libvramlab_emu.so" "${objs[@]}" "$tmp/generated.o" -ldl -lpthread
cc -shared -Wl,-soname,libcuda.so.1 -o "$tmp/libcuda.so.1" "${objs[@]}" "$tmp/generated.o" -ldl -lpthread
# NVML (harness/emulator/nvml.c), on its own: vLLM and pynvml detect the GPU through it.
cc -O2 -fPIC -Wall -Wno-unused-parameter -fvisibility=hidden -shared -Wl,-soname,libnvidia-ml.so.1 \
  -o "$tmp/libnvidia-ml.so.1" "$ROOT/harness/emulator/nvml.c" -lpthread
# NCCL (harness/emulator/nccl.c), on its own: tensor-parallel ranks, one emulated device each.
cc -O2 -fPIC -Wall -fvisibility=hidden -shared -Wl,-soname,libnccl.so.2 \
  -o "$tmp/libnccl.so.2" "$ROOT/harness/emulator/nccl.c" -ldl
mkdir -p "$tmp/cuda-libs"
for so in libcudart.so.{11,12,13} libcublas.so.{11,12,13} libcublasLt.so.{11,12,13} libcurand.so.10; do
  # The version node NVIDIA's libraries define under their soname, so that the loader finds the
  # version a binary linked against them asks for (no "no version information" warning).
  printf '%s { local: *; };\n' "$so" >"$tmp/$so.map"
  cc -shared -Wl,-soname,"$so" -Wl,--version-script,"$tmp/$so.map" -o "$tmp/cuda-libs/$so" -x c /dev/null
done
printf '%s %s\ncuda %s\nhand-written %s\ngenerated %s\n' \
  "$([ "$MODE" = torch ] && echo torch || echo headers)" "$([ "$MODE" = torch ] && echo "$TORCH_VERSION" || echo "$INCS")" "$TORCH_CUDA" \
  "$(wc -l <"$tmp/defined")" "$(wc -l <"$tmp/generated")" >"$tmp/BUILD-INFO"
if [ "$MODE" = torch ]; then
  # Published whole with one rename (the build folder is in the cache, on the same file
  # system): concurrent builds of the same key never see half a folder; the first one wins.
  mkdir -p "$tmp/pub"
  cp -r "$tmp/libvramlab_emu.so" "$tmp/libcuda.so.1" "$tmp/libnvidia-ml.so.1" "$tmp/libnccl.so.2" "$tmp/BUILD-INFO" "$tmp/generated" "$tmp/cuda-libs" "$tmp/pub/"
  mv -T "$tmp/pub" "$OUT" 2>/dev/null || [ -f "$OUT/libcuda.so.1" ]
else
  mkdir -p "$OUT"
  cp -r "$tmp/libvramlab_emu.so" "$tmp/libcuda.so.1" "$tmp/libnvidia-ml.so.1" "$tmp/libnccl.so.2" "$tmp/BUILD-INFO" "$tmp/generated" "$tmp/cuda-libs" "$OUT/"
fi
if [ "$MODE" = torch ]; then
  log "built for torch $TORCH_VERSION (CUDA $TORCH_CUDA): $(tr '\n' ' ' <"$OUT/BUILD-INFO")"
else
  log "built from the headers under $INCS: $(tr '\n' ' ' <"$OUT/BUILD-INFO")"
fi
echo "$OUT"
