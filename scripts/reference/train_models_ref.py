#!/usr/bin/env python3
"""Reference values for harness/tests/train_models.rs, from transformers in float64.

    $(scripts/torch-env.sh) scripts/reference/train_models_ref.py [OUT.json]

OUT defaults to harness/tests/data/train-models-ref.json (committed; the test reads it). Needs
the MiniLM weights of scripts/fetch-test-models.sh in $VRAMLAB_MODELS (default .cache/models).
Both references run HF's own modules (BertModel, GPT2LMHeadModel, eager attention, eval mode)
in float64 on the inputs and weights the test uses; vramlab computes in f32 and the test allows
1e-4 (1e-5 for the MiniLM loss).

- MiniLM (all-MiniLM-L6-v2, real weights): "[CLS] the cat sat on the mat . [SEP]" (uncased
  WordPiece ids, written out below). The mean-pooled last hidden state (vramlab's
  `Bert::encode`), its norm, and vramlab's bert training loss: mean over dimensions of
  (tanh(pooler.dense(mean-pooled)) - 0.5)^2 (harness/src/model/llm/bert.rs).
- GPT-2 (tiny config below, formula weights): element k (row-major) of the ti-th parameter
  tensor, in HF's parameter order without the `transformer.` prefix, is
  f32(0.2 sin(0.37 k + 1.3 ti)), plus 1 for LayerNorm weights; the head is tied to wte. The
  logits at the last position and the mean cross-entropy against explicit targets (no shift,
  as vramlab's `lm_loss`). The tensor order is written to the JSON, and the test builds the
  weights in that order.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "harness/tests/data/train-models-ref.json"
MODELS = Path(os.environ.get("VRAMLAB_MODELS", ROOT / ".cache/models"))

MINILM_IDS = [101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102]
POOLED_TARGET = 0.5  # bert::POOLED_TARGET

GPT2 = {"model_type": "gpt2", "vocab_size": 50, "n_embd": 16, "n_layer": 2, "n_head": 4,
        "n_positions": 16, "n_inner": 64}
GPT2_IDS = [3, 17, 42, 8, 8, 29]
GPT2_TARGETS = [17, 42, 8, 8, 29, 0]


def floats(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def minilm():
    d = MODELS / "all-minilm-l6-v2"
    if not (d / "model.safetensors").exists():
        sys.exit(f"{d}/model.safetensors is missing: run scripts/fetch-test-models.sh first")
    cfg = BertConfig.from_pretrained(d, attn_implementation="eager")
    model, info = BertModel.from_pretrained(d, config=cfg, output_loading_info=True)
    if info["missing_keys"]:
        sys.exit(f"{d}: weights missing from the checkpoint: {info['missing_keys']}")
    model = model.to(torch.float64).eval()
    ids = torch.tensor([MINILM_IDS])
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                  token_type_ids=torch.zeros_like(ids)).last_hidden_state
        e = h.mean(1)[0]
        pooled = torch.tanh(model.pooler.dense(e))
        loss = ((pooled - POOLED_TARGET) ** 2).mean()
    return {"ids": MINILM_IDS, "mean_pooled": floats(e), "norm": float(e.norm()),
            "pooled_target": POOLED_TARGET, "loss": float(loss)}


def gpt2():
    # No bos/eos: GPT2Config's defaults (50256) lie outside this vocabulary.
    cfg = GPT2Config(**{k: v for k, v in GPT2.items() if k != "model_type"},
                     bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).to(torch.float64).eval()
    names = []
    with torch.no_grad():
        for ti, (name, p) in enumerate(model.transformer.named_parameters()):
            k = np.arange(p.numel(), dtype=np.float64)
            base = 1.0 if "ln_" in name and name.endswith(".weight") else 0.0
            vals = (base + 0.2 * np.sin(0.37 * k + 1.3 * ti)).astype(np.float32)
            p.copy_(torch.from_numpy(vals.astype(np.float64)).reshape(p.shape))
            names.append(name)
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        logits = model(input_ids=torch.tensor([GPT2_IDS])).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(GPT2_TARGETS))
    return {"config": GPT2, "tensors": names, "ids": GPT2_IDS, "targets": GPT2_TARGETS,
            "last_logits": floats(logits[-1]), "loss": float(loss)}


def main():
    ref = {
        "generator": "scripts/reference/train_models_ref.py",
        "command": "$(scripts/torch-env.sh) scripts/reference/train_models_ref.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "minilm": minilm(),
        "gpt2": gpt2(),
    }
    OUT.write_text(json.dumps(ref, indent=1) + "\n")
    m, g = ref["minilm"], ref["gpt2"]
    print(f"minilm: mean_pooled[:8] {[round(v, 6) for v in m['mean_pooled'][:8]]} "
          f"norm {m['norm']:.6f} loss {m['loss']:.6f}", file=sys.stderr)
    print(f"gpt2: last_logits[:6] {[round(v, 6) for v in g['last_logits'][:6]]} "
          f"loss {g['loss']:.6f}", file=sys.stderr)
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
