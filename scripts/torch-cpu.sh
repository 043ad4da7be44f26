#!/usr/bin/env bash
# The torch probe on CPU, in one line (docs/src/guides/torch-probe.md):
#   scripts/torch-cpu.sh SCENARIO.toml --out FILE.csv [--torch-optim foreach|for-loop|fused]
#                        [--attention eager|sdpa]
# Builds the preload meter (harness/preload, seconds), takes the python of scripts/torch-env.sh
# (or $VRAMLAB_TORCH_PYTHON), and runs scripts/torch_probe --device cpu under
# LD_PRELOAD=libvramlab_preload.so, so that `allocated` counts every heap byte of the process.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 1 ] && exit 0
  exit 2
fi
PY=${VRAMLAB_TORCH_PYTHON:-$("$root/scripts/torch-env.sh")}
cargo build --quiet --release -p vramlab-preload --manifest-path "$root/Cargo.toml"
SO=${CARGO_TARGET_DIR:-$root/target}/release/libvramlab_preload.so
[ -f "$SO" ] || { echo "scripts/torch-cpu.sh: $SO was not built" >&2; exit 1; }
# ld.so splits LD_PRELOAD on spaces and colons: from a checkout under such a path, preload a copy.
case "$SO" in
  *[[:space:]:]*)
    copy="$(mktemp -d "${TMPDIR:-/tmp}/vramlab-preload.XXXXXX")/libvramlab_preload.so"
    cp "$SO" "$copy"
    SO=$copy ;;
esac
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LD_PRELOAD=$SO exec "$PY" "$root/scripts/torch_probe" --device cpu "$@"
