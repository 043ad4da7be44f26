#!/usr/bin/env bash
# Sweep overhead benchmark (a benchmark, not a test): runs `vramlab sweep SCENARIO` with the
# release build and prints the wall time, the time the measured phases took (from the CSV's
# `elapsed_ms`) and their ratio. 1.00 would be a sweep that costs nothing beyond its phases.
#
# Usage: scripts/bench-overhead.sh SCENARIO.toml [OUTDIR]
#   OUTDIR (default: a temporary folder) receives bench.csv and bench.manifest.json.
#   VRAMLAB_BIN=PATH times that binary instead of building target/release/vramlab (to compare
#   two builds on the same scenario, back to back).
#   Extra sweep flags go in VRAMLAB_BENCH_ARGS (e.g. "--device cuda:0").
#
# Phase time = per point, its `total` row (inference and encode: the envelope of prefill and
# decode steps, or of the forward) or the sum of its `step_total` rows (training: one per
# step, each the envelope of forward, backward and optimizer), plus each weight load once.
# The parts (`prefill`, `decode`, `forward`, `backward`, `optimizer`) are inside those
# envelopes and are not added again. A group's one load is repeated on every point's `load`
# row with the same `elapsed_ms`, so loads are counted once per distinct (model, precision,
# mode, elapsed_ms). Everything else (worker start-up, weight hashing, warm-ups, writing rows,
# the summary) is overhead. A generation point's `total` row (text encode, denoising steps,
# decode) also holds its component loads, so they are not added again.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 1 2 "SCENARIO.toml [OUTDIR]" "$@"
cd "$(dirname "$0")/.."
scenario=${ARGS[0]}
[ -f "$scenario" ] || die_usage "no scenario file '$scenario'"
outdir=${ARGS[1]:-$(mktemp -d)}
mkdir -p "$outdir"
export VRAMLAB_MODELS=${VRAMLAB_MODELS:-$PWD/.cache/models}
bin=${VRAMLAB_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release -p vramlab --quiet
  bin=target/release/vramlab
fi
csv="$outdir/bench.csv"
echo "scenario: $scenario; binary: $bin; output: $csv"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
t0=$(date +%s.%N)
# shellcheck disable=SC2086 # VRAMLAB_BENCH_ARGS is a list of flags
"$bin" sweep "$scenario" --out "$csv" --fresh --quiet ${VRAMLAB_BENCH_ARGS:-}
t1=$(date +%s.%N)
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$csv" "$t0" "$t1" <<'EOF'
import csv, json, sys
path, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
wall = t1 - t0
envelope, loads, parts = 0.0, set(), {}
for r in csv.DictReader(open(path)):
    if r["status"] != "ok" or not r["elapsed_ms"]:
        continue
    ms = float(r["elapsed_ms"])
    parts[r["phase"]] = parts.get(r["phase"], 0.0) + ms
    if r["phase"] in ("total", "step_total"):
        envelope += ms
    # A generation point loads its components inside its `total` row.
    elif r["phase"] == "load" and r["mode"] != "generate":
        loads.add((r["model_id"], r["precision"], r["mode"], r["elapsed_ms"]))
load = sum(float(k[3]) for k in loads)
phases = (envelope + load) / 1e3
m = json.load(open(path[: -len(".csv")] + ".manifest.json"))
print(f"rows by phase (s, summed): " + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in sorted(parts.items())))
print(f"workers started: {m['workers_started']}; weights sha256 from cache: "
      + ", ".join(str(w.get("sha256_cached", False)).lower() for w in m["weights"]))
print(f"wall time:   {wall:9.1f} s")
print(f"phase time:  {phases:9.1f} s  (total/step_total rows {envelope / 1e3:.1f} s + {len(loads)} loads {load / 1e3:.1f} s)")
print(f"overhead:    {wall - phases:9.1f} s")
print(f"ratio:       {wall / phases:9.3f}  (wall / phase time)")
EOF
