#!/usr/bin/env bash
# vLLM's own engine startup on the emulated GPU over a grid of presets, cards and scheduler
# settings, beside `vramlab estimate --runtime vllm` (docs/src/guides/serving.md): the data the
# serving estimate's fitted term (estimate/serving.rs, OTHER_FIXED and OTHER_PER_SEQ) comes from
# and is checked against. Each point is `LLM(model=<preset's config.json>, load_format='dummy',
# max_model_len=4096, gpu_memory_utilization=0.9, enforce_eager=True, max_num_batched_tokens=N,
# max_num_seqs=S)` under the vllm-0.33 stack; about 30 to 75 s a point on 2 cores.
#
#   scripts/vllm-serving-grid.sh OUT.tsv     # the grid (23 points, about 20 minutes)
#
# Needs the built vramlab (target/debug/vramlab, or $VRAMLAB) and the stack
# (scripts/torch-env.sh --stack vllm-0.33, or $VRAMLAB_VLLM_PYTHON). Writes one TSV row a point:
# preset, gpu, N, S, vLLM's exact available KV bytes and KV tokens, the estimate's, and the
# difference in tokens (%).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 1 1 OUT.tsv "$@"
OUT=${ARGS[0]}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VRAMLAB=${VRAMLAB:-$ROOT/target/debug/vramlab}
[ -x "$VRAMLAB" ] || die_usage "no vramlab at $VRAMLAB (cargo build -p vramlab, or set VRAMLAB)"
PY=${VRAMLAB_VLLM_PYTHON:-$("$ROOT/scripts/torch-env.sh" --stack vllm-0.33)}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
GRID=()
for p in qwen2.5-0.5b llama-3.1-8b qwen2.5-7b llama-3.2-1b; do
  for ns in "2048 256" "8192 256" "2048 1024" "8192 1024" "16384 1024"; do
    GRID+=("$p h100-80gb $ns")
  done
done
for p in qwen2.5-0.5b llama-3.1-8b qwen2.5-7b; do GRID+=("$p a100-40gb 2048 256"); done
printf 'preset\tgpu\tmax_num_batched_tokens\tmax_num_seqs\tvllm_available_kv_bytes\tvllm_kv_tokens\testimate_available_kv_bytes\testimate_kv_tokens\ttokens_error_pct\n' >"$OUT"
for point in "${GRID[@]}"; do
  read -r preset gpu n s <<<"$point"
  mkdir -p "$tmp/$preset"
  cp "$ROOT/harness/presets/$preset/config.json" "$tmp/$preset/"
  prog="from vllm import LLM
LLM(model='$tmp/$preset', load_format='dummy', max_model_len=4096, gpu_memory_utilization=0.9, enforce_eager=True, skip_tokenizer_init=True, max_num_batched_tokens=$n, max_num_seqs=$s)"
  "$VRAMLAB" emulate --gpu "$gpu" --timeout 8m --json-out "$tmp/report.json" -- "$PY" -c "$prog" \
    >"$tmp/log" 2>&1 || { echo "vllm-serving-grid: $point failed: $(tail -n 1 "$tmp/log")" >&2; exit 1; }
  "$VRAMLAB" estimate --model "$preset" --runtime vllm --gpu "$gpu" --enforce-eager \
    --max-model-len 4096 --max-num-batched-tokens "$n" --max-num-seqs "$s" --json >"$tmp/est.json"
  python3 - "$tmp/report.json" "$tmp/est.json" "$preset" "$gpu" "$n" "$s" >>"$OUT" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))["vllm"][0]
e = json.load(open(sys.argv[2]))["serving"]
err = (e["kv_tokens"] / v["kv_tokens"] - 1) * 100
print("\t".join(sys.argv[3:7] + [str(v["available_kv_bytes"]), str(v["kv_tokens"]),
      str(e["available_kv_bytes"]), str(e["kv_tokens"]), f"{err:+.3f}"]))
EOF
  echo "vllm-serving-grid: $point: $(tail -n 1 "$OUT" | cut -f9)%" >&2
done
