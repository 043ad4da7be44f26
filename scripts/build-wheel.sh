#!/usr/bin/env bash
# Builds vramlab's wheel (docs/src/guides/install.md) and prints its path:
#
#   scripts/build-wheel.sh [--out DIR]     # the wheel goes into DIR (default target/wheels)
#   scripts/build-wheel.sh [DIR]           # the same
#
# The wheel holds the `vramlab` binary (CPU features, no `cuda` feature), the Python package
# `vramlab` (harness/python/vramlab) and the emulator's stub libraries for CUDA 12 and 13
# (vramlab/_stubs/cu12, cu13). The stubs are compiled here by scripts/emulator-build.sh from the
# headers of pinned NVIDIA wheels (downloaded once with pip, only their include folders kept);
# nothing is committed and nothing is fetched when the wheel is installed or run.
# Needs: cargo, a C compiler, python3 >= 3.9 with pip and venv. Cached in $VRAMLAB_WHEEL_CACHE
# (default ~/.cache/vramlab-wheel): the build venv holding maturin and the headers (about 10 MB;
# the cuBLAS wheels they come from are 400 to 600 MB each, downloaded once, not kept).
# Progress goes to stderr; stdout is the wheel's path alone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "--out=" 0 1 "[--out DIR | DIR]" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${FLAG[out]-}" ] && [ "${#ARGS[@]}" -gt 0 ]; then
  die_usage "unexpected argument '${ARGS[0]}' beside --out ${FLAG[out]}"
fi
OUT_DIR="${FLAG[out]:-${ARGS[0]:-$ROOT/target/wheels}}"
# Checked before the build (minutes): a folder that cannot be made or written to is refused.
if ! mkdir -p -- "$OUT_DIR" 2>/dev/null || [ ! -w "$OUT_DIR" ]; then
  die_usage "cannot write the wheel into '$OUT_DIR' (not a folder that can be made or written to)"
fi
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# The cargo profile of the binary: release for a wheel to ship; the wheel test builds with
# VRAMLAB_WHEEL_PROFILE=dev, which reuses the test build's compiled dependencies.
PROFILE="${VRAMLAB_WHEEL_PROFILE:-release}"
CACHE="${VRAMLAB_WHEEL_CACHE:-$HOME/.cache/vramlab-wheel}"
MATURIN=maturin==1.16.0
# The CUDA runtime and cuBLAS headers of each major that PyTorch wheels use.
CU13=(nvidia-cuda-runtime==13.2.86 nvidia-cublas==13.4.1.3)
CU12=(nvidia-cuda-runtime-cu12==12.9.79 nvidia-cublas-cu12==12.9.1.4)
log() { printf 'build-wheel: %s\n' "$*" >&2; }
t0=$(date +%s)
mkdir -p "$CACHE"

# maturin, pinned, in a venv of its own.
VENV="$CACHE/build-venv"
if [ "$(cat "$VENV/.vramlab-stamp" 2>/dev/null)" != "$MATURIN" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$MATURIN" >&2
  echo "$MATURIN" >"$VENV/.vramlab-stamp"
fi

# headers DIR PKG...: the include folders of the pinned wheels, unpacked once into DIR; prints
# them as INC[:INC...].
headers() {
  local dir="$1"
  shift
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir" "$dir.dl"
    mkdir -p "$dir.dl"
    log "downloading $* (headers only are kept)"
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-cache-dir --only-binary=:all: -d "$dir.dl" "$@" >&2
    for w in "$dir.dl"/*.whl; do unzip -q -o "$w" 'nvidia/*/include/*' -d "$dir"; done
    rm -rf "$dir.dl"
    touch "$dir/.complete"
  fi
  find "$dir/nvidia" -mindepth 2 -maxdepth 2 -type d -name include | sort | paste -sd:
}

STUBS="$ROOT/harness/python/vramlab/_stubs"
for major in 12 13; do
  pins="CU$major[@]"
  pins=("${!pins}")
  inc="$(headers "$CACHE/headers/cu$major-$(echo "${pins[*]}" | sha256sum | cut -c1-12)" "${pins[@]}")"
  rm -rf "$STUBS/cu$major"
  "$ROOT/scripts/emulator-build.sh" --headers "$inc" "$STUBS/cu$major" >/dev/null
  # Name the pins, not this machine's paths.
  sed -i "1s|.*|headers ${pins[*]}|" "$STUBS/cu$major/BUILD-INFO"
done

# The torch probe (vramlab/probe) and the published programs (vramlab/peers) are the package's
# own folders: maturin packs them as they are. Copies an earlier build left are removed.
rm -rf "$ROOT/harness/python/vramlab/_torch_probe" "$ROOT/harness/python/vramlab/_torch_probe.py"

log "maturin build --profile $PROFILE (the vramlab binary, without the cuda feature)"
mlog="$CACHE/maturin.log"
(cd "$ROOT" && "$VENV/bin/maturin" build --profile "$PROFILE" -o "$OUT_DIR") 2>&1 | tee "$mlog" >&2
wheel="$(sed -n 's/.*Built wheel to //p' "$mlog" | tail -n 1)"
if [ ! -f "$wheel" ]; then
  log "maturin reported no wheel (its output: $mlog)"
  exit 1
fi
log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) in $(($(date +%s) - t0)) s"
echo "$wheel"
