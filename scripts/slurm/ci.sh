#!/bin/bash
# The Slurm path as CI runs it (scripts/test.sh): a one-node localhost cluster
# (scripts/slurm/local-cluster.sh, installed from Debian's packages on first use), the job array
# of scripts/slurm/sweep.sbatch over the emulated scenario scenarios/shard-emu.toml in 2 shards,
# and the merged shards checked against an unsharded sweep, every figure to the byte
# (scripts/slurm/test-local.sh). The cluster is stopped however the test ends.
#   scripts/slurm/ci.sh
# Needs root, a built vramlab ($VRAMLAB, default target/debug/vramlab) and the torch environment
# (scripts/torch-env.sh; VRAMLAB_TORCH_PYTHON, exported to the jobs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh"
args_parse "" 0 0 "" "$@"
here="$(cd "$(dirname "$0")" && pwd)"
trap '"$here/local-cluster.sh" stop' EXIT
# Through a variable: `eval "$(… start)"` would run on when start fails (eval of nothing is 0).
env_line=$("$here/local-cluster.sh" start)
eval "$env_line"
"$here/test-local.sh" "$here/../../scenarios/shard-emu.toml" 2
