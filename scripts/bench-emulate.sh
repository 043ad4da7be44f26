#!/usr/bin/env bash
# Benchmark of the emulated GPU (not a test): wall time and host peak RSS of a Llama-3.1-8B- and
# a 70B-shaped LoRA step (three steps each, harness/python/examples/lora_llama.py) on an
# emulated H200. Prints one line per model; the goal is under 60 s and 4 GB for the 8B.
#
#   scripts/bench-emulate.sh      # no arguments
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 0 "" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$ROOT/scripts/torch-env.sh")"
cargo build --quiet --release -p vramlab --manifest-path "$ROOT/Cargo.toml"
BIN="$ROOT/target/release/vramlab"
for size in 8b 70b; do
  log="$(mktemp)"
  /usr/bin/time -f '%e %M' -o "$log" "$BIN" emulate --json --gpu h200 -- \
    "$PY" "$ROOT/harness/python/examples/lora_llama.py" --size "$size" >"$log.json" 2>"$log.err" || true
  read -r wall rss_kb <"$log"
  peak=$("$PY" -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index("{"):]); print(d["run"]["max_memory_allocated"], d["run"]["max_memory_reserved"], d["outcome"])' "$log.json")
  printf 'llama-3.1-%s lora r16 h200: wall %s s, host peak RSS %.2f GB, max_allocated max_reserved outcome: %s\n' \
    "$size" "$wall" "$(echo "$rss_kb * 1024 / 1000000000" | bc -l)" "$peak"
  rm -f "$log" "$log.json" "$log.err"
done
