#!/usr/bin/env bash
# vLLM's own engine startup on the emulated GPU over a grid of presets, cards and scheduler
# settings, eager and with CUDA graphs, beside `vramlab estimate --runtime vllm`
# (docs/src/guides/serving.md): the corpus `vramlab fit --vllm OUT.tsv` fits the serving
# estimate's terms on (estimate/serving.rs, FITTED: the other buffers and the CUDA-graph pool).
# Each point is `LLM(model=<preset's config.json>, load_format='dummy', max_model_len=4096,
# gpu_memory_utilization=0.9, enforce_eager=<eager>, max_num_batched_tokens=N, max_num_seqs=S)`
# under the vllm-0.33 stack; about 30 to 75 s an eager point on 2 cores, and a point with CUDA
# graphs starts twice (below): 90 to 200 s.
#
#   scripts/vllm-serving-grid.sh OUT.tsv     # the grid (39 points, about 50 minutes on 2 cores)
#
# Needs the built vramlab (target/debug/vramlab, or $VRAMLAB) and the stack
# (scripts/torch-env.sh --stack vllm-0.33, or $VRAMLAB_VLLM_PYTHON). Writes one TSV row a point:
# preset, gpu, max_model_len, N, S, whether CUDA graphs were captured, vLLM's exact available KV
# bytes, KV tokens and CUDA-graph estimate, the estimate's, and the difference in tokens (%).
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
    GRID+=("$p h100-80gb $ns eager")
  done
done
for p in qwen2.5-0.5b llama-3.1-8b qwen2.5-7b; do GRID+=("$p a100-40gb 2048 256 eager"); done
# CUDA graphs (vLLM's default): the capture sizes' ceiling (2 × max_num_seqs up to 512: 512, 256
# and 128 tokens), the FULL graphs (up to max_num_seqs), both cards.
for p in qwen2.5-0.5b llama-3.2-1b llama-3.1-8b qwen2.5-7b; do
  for ns in "8192 1024" "2048 256"; do GRID+=("$p h100-80gb $ns graphs"); done
  GRID+=("$p a100-40gb 2048 256 graphs")
done
GRID+=("qwen2.5-0.5b h100-80gb 8192 128 graphs" "qwen2.5-0.5b h100-80gb 512 64 graphs"
  "llama-3.1-8b h100-80gb 8192 256 graphs" "qwen2.5-7b h100-80gb 16384 1024 graphs")
printf 'preset\tgpu\tmax_model_len\tmax_num_batched_tokens\tmax_num_seqs\tcuda_graphs\tvllm_available_kv_bytes\tvllm_kv_tokens\tvllm_cuda_graph_bytes\testimate_available_kv_bytes\testimate_kv_tokens\ttokens_error_pct\n' >"$OUT"
# vLLM's compile cache, private to the run: a point with CUDA graphs starts twice and the second
# (warm) start is kept. A first start compiles the model for the shape, and its profile then
# holds up to 0.75 GiB more (docs/src/guides/serving.md, "CUDA graphs").
export VLLM_CACHE_ROOT="$tmp/vllm-cache"
# The engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the hook below sees vLLM's
# own estimate of its CUDA graphs' memory (`profile_cudagraph_memory`, which it logs only in
# GiB) and prints it exact.
export VLLM_ENABLE_V1_MULTIPROCESSING=0
HOOK="import vllm.v1.worker.gpu.cudagraph_utils as cu, vllm.v1.worker.gpu.model_runner as mr
def _hook(runner, _profile=cu.profile_cudagraph_memory):
    r = _profile(runner)
    print('vramlab-grid: cuda graph estimate', r, flush=True)
    return r
mr._profile_cudagraph_memory = _hook"
for point in "${GRID[@]}"; do
  read -r preset gpu n s mode <<<"$point"
  mkdir -p "$tmp/$preset"
  cp "$ROOT/harness/presets/$preset/config.json" "$tmp/$preset/"
  eager=(--enforce-eager) graphs=false flag=True starts=1
  if [ "$mode" = graphs ]; then eager=() graphs=true flag=False starts=2; fi
  prog="$HOOK
from vllm import LLM
LLM(model='$tmp/$preset', load_format='dummy', max_model_len=4096, gpu_memory_utilization=0.9, enforce_eager=$flag, skip_tokenizer_init=True, max_num_batched_tokens=$n, max_num_seqs=$s)"
  for _ in $(seq "$starts"); do
    "$VRAMLAB" emulate --gpu "$gpu" --timeout 8m --json-out "$tmp/report.json" -- "$PY" -c "$prog" \
      >"$tmp/log" 2>&1 || { echo "vllm-serving-grid: $point failed: $(tail -n 1 "$tmp/log")" >&2; exit 1; }
  done
  graph_bytes=$(sed -n 's/.*vramlab-grid: cuda graph estimate \([0-9]*\).*/\1/p' "$tmp/log" | tail -n 1)
  "$VRAMLAB" estimate --model "$preset" --runtime vllm --gpu "$gpu" "${eager[@]}" \
    --max-model-len 4096 --max-num-batched-tokens "$n" --max-num-seqs "$s" --json >"$tmp/est.json"
  python3 - "$tmp/report.json" "$tmp/est.json" "${graph_bytes:-0}" "$preset" "$gpu" 4096 "$n" "$s" "$graphs" >>"$OUT" <<'EOF'
import json, sys
v = next(p for p in json.load(open(sys.argv[1]))["vllm"] if p.get("kv_tokens"))
e = json.load(open(sys.argv[2]))["serving"]
err = (e["kv_tokens"] / v["kv_tokens"] - 1) * 100
print("\t".join(sys.argv[4:10] + [str(v["available_kv_bytes"]), str(v["kv_tokens"]), sys.argv[3],
      str(e["available_kv_bytes"]), str(e["kv_tokens"]), f"{err:+.3f}"]))
EOF
  echo "vllm-serving-grid: $point: $(tail -n 1 "$OUT" | cut -f12)%" >&2
done
