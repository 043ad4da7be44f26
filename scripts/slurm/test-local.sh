#!/bin/bash
# Submits scripts/slurm/sweep.sbatch for real on a Slurm cluster (a one-node localhost
# slurmctld + slurmd is enough: scripts/slurm/local-cluster.sh) with --device cpu, or with the
# scenario's own device for an emulated one (`device = "emu:…"`), waits for the dependent finish
# job, and checks the merged CSV against an unsharded sweep of the same scenario with `vramlab
# compare` (allocated bytes exact on CPU; every figure exact on the emulated GPU, whose
# allocator is deterministic) and the bundle with `vramlab bundle --verify`.
#   scripts/slurm/test-local.sh [SCENARIO.toml] [NSHARDS]
# Needs sbatch/squeue on PATH and a built vramlab ($VRAMLAB, default target/debug/vramlab).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh"
args_parse "" 0 2 "[SCENARIO.toml] [NSHARDS]" "$@"
[[ "${ARGS[1]:-3}" =~ ^[1-9][0-9]*$ ]] || die_usage "NSHARDS '${ARGS[1]}' is not a positive number"
command -v sbatch >/dev/null || { echo "test-local.sh: no sbatch on PATH (install slurm-wlm)" >&2; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
scenario="${ARGS[0]:-$root/scenarios/shard-synth.toml}"
n="${ARGS[1]:-3}"
export VRAMLAB="${VRAMLAB:-$root/target/debug/vramlab}" VRAMLAB_DEVICE=cpu
device=(--device cpu)
exact=()
what="allocated"
if grep -qE '^device *= *"emu:' "$scenario"; then
    # The emulated card the scenario names, in the shards and the unsharded run alike; PyTorch's
    # allocator on it is deterministic, so reserved and device bytes must match too.
    VRAMLAB_DEVICE=scenario
    device=()
    exact=(--fail-on-improvement)
    what="every figure"
    for m in peak_allocated end_allocated peak_reserved device_used; do
        exact+=(--tolerance "$m=0,0")
    done
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$root"
line=$(bash scripts/slurm/sweep.sbatch submit "$scenario" "$work/out" "$n" \
    --gres=none --cpus-per-task=1 --mem=3G --output="$work/%x-%A_%a.out")
echo "$line"
array=$(sed -n 's/^submitted array \([0-9]*\).*/\1/p' <<<"$line")
finish=$(sed -n 's/.*finish job \([0-9]*\).*/\1/p' <<<"$line")
# The finish job leaves the queue when it ends, or when a failed shard cancels it (a cluster with
# DependencyParameters=kill_invalid_depend, as local-cluster.sh's; elsewhere it would wait on
# forever, hence the bound: $VRAMLAB_SLURM_WAIT seconds, default 1800).
deadline=$((SECONDS + ${VRAMLAB_SLURM_WAIT:-1800}))
while squeue -h -j "$finish" 2>/dev/null | grep -q .; do
    if ((SECONDS > deadline)); then
        squeue >&2 || true
        scancel "$array" "$finish" 2>/dev/null || true
        echo "test-local.sh: finish job $finish still queued after ${VRAMLAB_SLURM_WAIT:-1800} s" >&2
        exit 1
    fi
    sleep 2
done
name=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$scenario" | head -n 1)
merged="$work/out/results/$name.csv"
[[ -f "$merged" ]] || { cat "$work"/*.out >&2; echo "test-local.sh: no merged CSV (a shard or the finish job failed; the jobs' logs are above)" >&2; exit 1; }
"$VRAMLAB" sweep "$scenario" "${device[@]}" --quiet --out "$work/full.csv"
"$VRAMLAB" compare "$work/full.csv" "$merged" --top 0 "${exact[@]}"
# compare fails on a point missing from the merged CSV, not on one only there: the point ids
# (third column; none before it is quoted) must be the same set.
points() { cut -d, -f3 "$1" | sort -u; }
if ! diff <(points "$work/full.csv") <(points "$merged") >&2; then
    echo "test-local.sh: the merged shards and the unsharded sweep hold different points" >&2
    exit 1
fi
"$VRAMLAB" bundle --verify "$work/out/$name.tar.gz"
echo "test-local.sh: merged shards == unsharded sweep ($what exact); bundle verified"
