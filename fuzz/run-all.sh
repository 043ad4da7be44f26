#!/usr/bin/env bash
# Runs every fuzz target one after the other for SECS seconds each (default 600), at the
# lowest CPU priority, on stable Rust (no sanitizer). Logs go to fuzz/logs/<target>.log,
# crashes to fuzz/artifacts/<target>/. Run from the repository root: fuzz/run-all.sh [SECS] [TARGET...]
set -uo pipefail
secs=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(scenario config csv gguf safetensors)
[ -d fuzz/corpus/scenario ] || fuzz/seed.sh
mkdir -p fuzz/logs
cd fuzz
for t in "${targets[@]}"; do
  echo "== $t: ${secs}s ($(date -u +%H:%M:%S))"
  nice -n 19 cargo fuzz run -s none "$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len=65536 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 > "logs/$t.log" 2>&1
  echo "   exit $?: $(grep -E '^stat::number_of_executed_units|^stat::new_units_added' "logs/$t.log" | tr '\n' ' ')"
  grep -E 'SUMMARY|panicked at|^artifact_prefix|Test unit written' "logs/$t.log" | head -5
done
