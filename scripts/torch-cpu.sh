#!/usr/bin/env bash
# The torch probe on CPU, in one line (docs/src/guides/torch-probe.md):
#   scripts/torch-cpu.sh SCENARIO.toml --out FILE.csv [--torch-optim foreach|for-loop|fused]
#                        [--attention eager|sdpa]
# Builds the preload meter (harness/preload, seconds), takes the python of scripts/torch-env.sh
# (or $VRAMLAB_TORCH_PYTHON), and runs harness/python/vramlab/probe --device cpu under
# LD_PRELOAD=libvramlab_preload.so, so that `allocated` counts every heap byte of the process.
# The probe's other flags (python3 harness/python/vramlab/probe --help) are passed on too; any other
# argument is refused before anything is built.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
# The probe's flags (harness/python/vramlab/probe/cli.py's parser(); a trailing = for a value).
PROBE_FLAGS=(--out= --device= --torch-optim= --attention= --lora= --lora-targets= --lora-dropout= --no-onednn --dry-run --check
             --gpus= --offload --gpu-memory= --worker-point= --run-id=)
args_parse "${PROBE_FLAGS[*]}" 1 1 "SCENARIO.toml --out FILE.csv [PROBE FLAGS]" "$@"
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${VRAMLAB_TORCH_PYTHON:-$("$root/scripts/torch-env.sh")}
cargo build --quiet --release -p vramlab-preload --manifest-path "$root/Cargo.toml"
# The probe runs vramlab's own points of the scenario (`vramlab sweep --dry-run --json`): this
# checkout's build unless VRAMLAB_BIN names one.
if [ -z "${VRAMLAB_BIN:-}" ]; then
  cargo build --quiet -p vramlab --manifest-path "$root/Cargo.toml"
  export VRAMLAB_BIN=${CARGO_TARGET_DIR:-$root/target}/debug/vramlab
fi
SO=${CARGO_TARGET_DIR:-$root/target}/release/libvramlab_preload.so
[ -f "$SO" ] || { echo "scripts/torch-cpu.sh: $SO was not built" >&2; exit 1; }
# ld.so splits LD_PRELOAD on spaces and colons: from a checkout under such a path, preload a copy.
case "$SO" in
  *[[:space:]:]*)
    copy="$(mktemp -d "${TMPDIR:-/tmp}/vramlab-preload.XXXXXX")/libvramlab_preload.so"
    cp "$SO" "$copy"
    SO=$copy ;;
esac
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LD_PRELOAD=$SO exec "$PY" "$root/harness/python/vramlab/probe" --device cpu "$@"
