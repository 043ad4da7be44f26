#!/usr/bin/env python3
"""Checks the rows of vramlab's CUDA build on the emulated GPU (scripts/cuda-build-check.sh, a
step of scripts/test.sh; docs/src/guides/emulator.md, "candle on the emulated GPU") against
figures derived here from each model's config.json, independently of vramlab's own code:

  gpu-smoke CSV (emulated H100):
    - every point ok, meter cuda-pool-emulated, device_name "... (emulated)";
    - load: param_count and the allocated bytes equal the weight tensors' bytes exactly
      (bf16: 2 B a parameter), and equal the row's analytic feature_weight_bytes (the figure the
      CPU build writes for the same point); the reserve lies between the allocated bytes rounded
      up to the pool's 2 MiB granule and the sum of the tensors each in their own granules;
    - growing KV cache: each decode step's allocated bytes grow by exactly
      Δtokens × 2 (K and V) × layers × kv_heads × head_dim × 2 B × batch;
    - preallocated KV cache: prefill's end − load's end is the whole cache (context tokens) plus
      the sampled token ids (4 B a sequence), and decode allocates nothing that stays.
  OOM CSV (the same scenario on a card too small): oom rows, the others ok.
  attention CSV: flash's forward (prefill, or a training step's forward) peak is lower than eager's.

  scripts/cuda-emulated-check.py SMOKE.csv OOM.csv ATTENTION.csv
"""
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRANULE = 2 << 20
ALIGN = 512
failures = []


def fail(msg):
    failures.append(msg)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(r, k):
    return int(r[k]) if r[k] != "" else None


def tensors(preset):
    """The parameter tensors' element counts of a llama or qwen2 config, as HF names them."""
    c = json.loads((ROOT / "harness/presets" / preset / "config.json").read_text())
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // heads
    bias = c["model_type"] == "qwen2" or bool(c.get("attention_bias"))
    t = [c["vocab_size"] * h, h]  # embed_tokens, final norm
    if not c.get("tie_word_embeddings", False):
        t.append(c["vocab_size"] * h)  # lm_head
    for _ in range(layers):
        t += [h * heads * hd, h * kv * hd, h * kv * hd, heads * hd * h]  # q k v o
        if bias:
            t += [heads * hd, kv * hd, kv * hd]
        t += [h * inter, h * inter, inter * h, h, h]  # gate up down, two norms
    kv_token = 2 * layers * kv * hd  # K and V elements a token holds over all layers
    return t, kv_token


def round_up(n, to):
    return (n + to - 1) // to * to


def preset_of(model_id):
    return model_id.removeprefix("synthetic-")


def check_smoke(path):
    rs = rows(path)
    if not rs:
        fail(f"{path}: no rows")
    by_point = defaultdict(list)
    for r in rs:
        by_point[r["point_id"]].append(r)
        if r["status"] != "ok":
            fail(f"{r['point_id']} {r['phase']}: status {r['status']}: {r['message']}")
        if r["meter"] != "cuda-pool-emulated":
            fail(f"{r['point_id']}: meter {r['meter']}, expected cuda-pool-emulated")
        if not r["device_name"].endswith("(emulated)"):
            fail(f"{r['point_id']}: device_name {r['device_name']!r} does not say (emulated)")
    checked = defaultdict(int)
    for pid, prs in by_point.items():
        ph = {(r["phase"], r["step"]): r for r in prs}
        load = ph.get(("load", ""))
        r0 = prs[0]
        # Inference points: a training point's load also holds its trainable copies.
        if r0["precision"] != "bf16" or r0["mode"] != "infer" or load is None:
            continue
        t, kv_token = tensors(preset_of(r0["model_id"]))
        weights = 2 * sum(t)
        if num(load, "param_count") != sum(t):
            fail(f"{pid}: param_count {load['param_count']}, derived {sum(t)}")
        held = num(load, "end_allocated") - num(load, "baseline_allocated")
        if held != weights:
            fail(f"{pid}: load holds {held} B, the weights are {weights} B")
        if num(load, "feature_weight_bytes") != weights:
            fail(f"{pid}: feature_weight_bytes {load['feature_weight_bytes']}, derived {weights}")
        lo = round_up(weights, GRANULE)
        hi = sum(round_up(round_up(2 * n, ALIGN), GRANULE) for n in t)
        # The pool may start the load holding empty segments (baseline_reserved, kept under
        # pool_release = "keep"), which the weights reuse.
        resv, base = num(load, "peak_reserved"), num(load, "baseline_reserved")
        if not (lo <= resv and resv - base <= hi):
            fail(f"{pid}: load reserve {resv} B (baseline {base} B) outside [{lo}, baseline + {hi}] (2 MiB granules)")
        checked["load"] += 1
        batch = int(r0["batch"])
        per_token = kv_token * 2 * batch
        decodes = sorted(
            (r for r in prs if r["phase"] == "decode"), key=lambda r: int(r["step"])
        )
        prefill = next(r for r in prs if r["phase"] == "prefill")
        if r0["kv_cache"] == "growing":
            prev = prefill
            for d in decodes:
                dt = num(d, "kv_tokens") - num(prev, "kv_tokens")
                grew = num(d, "end_allocated") - num(prev, "end_allocated")
                if grew != dt * per_token:
                    fail(f"{pid} decode {d['step']}: grew {grew} B for {dt} tokens, expected {dt * per_token}")
                prev = d
            checked["growing"] += 1
        else:
            cache = int(r0["context"]) * per_token
            got = num(prefill, "end_allocated") - num(load, "end_allocated")
            if got != cache + 4 * batch:
                fail(f"{pid}: prefill keeps {got} B, the preallocated cache is {cache} B + {4 * batch} B of token ids")
            for d in decodes:
                if num(d, "end_allocated") != num(prefill, "end_allocated"):
                    fail(f"{pid} decode {d['step']}: end_allocated moved with a preallocated cache")
            checked["preallocated"] += 1
    for k in ["load", "growing", "preallocated"]:
        if checked[k] == 0:
            fail(f"{path}: no {k} point checked")
    return dict(checked)


def check_oom(path):
    rs = rows(path)
    st = defaultdict(int)
    for r in rs:
        st[r["status"]] += 1
        if r["status"] not in ("ok", "oom"):
            fail(f"{path}: {r['point_id']}: status {r['status']}: {r['message']}")
        if r["status"] == "oom" and "CUDA_ERROR_OUT_OF_MEMORY" not in r["message"]:
            fail(f"{path}: {r['point_id']}: an oom row without cudarc's error: {r['message']}")
    if not st["oom"] or not st["ok"]:
        fail(f"{path}: expected oom rows beside ok ones, got {dict(st)}")
    return dict(st)


def check_attention(path):
    peaks = {}
    for r in rows(path):
        if r["status"] != "ok":
            fail(f"{path}: {r['point_id']}: status {r['status']}")
        if r["phase"] in ("prefill", "forward") and r["step"] in ("0", "1"):
            key = (r["mode"], r["kernels"], r["phase"])
            peaks.setdefault(key, {})[r["attention"]] = num(r, "peak_allocated")
    n = 0
    for key, p in peaks.items():
        if "eager" in p and "flash" in p:
            n += 1
            if not p["flash"] < p["eager"]:
                fail(f"{path}: {key}: flash peak {p['flash']} B not below eager's {p['eager']} B")
    if n == 0:
        fail(f"{path}: no eager/flash pair")
    return {"pairs": n}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    out = {
        "smoke": check_smoke(sys.argv[1]),
        "oom": check_oom(sys.argv[2]),
        "attention": check_attention(sys.argv[3]),
    }
    for f in failures:
        print(f"cuda-emulated-check: FAIL: {f}", file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"cuda-emulated-check: ok {json.dumps(out)}", file=sys.stderr)
