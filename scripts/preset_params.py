"""Parameter counts of published configs as transformers builds them, for tests/architectures.rs.

Usage: preset_params.py CONFIG.json...  (run with the python of scripts/torch-env.sh)

Each config is built with `AutoModelForCausalLM.from_config` (a multimodal one, with a
`vision_config`, with `AutoModelForImageTextToText`: the vision tower included) on the meta
device (no memory, real shapes) and the numels of its parameters are summed, tied ones once,
as `sum(p.numel() for p in model.parameters())` counts them. Prints one JSON object
{path: count} on stdout.

Llama 4's published configs write `attn_temperature_tuning` as 4, which transformers 5's
strict config rejects (it wants a boolean): it is read as true, as vramlab reads it.
"""
import json
import pathlib
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

counts = {}
for arg in sys.argv[1:]:
    keys = json.loads(pathlib.Path(arg).read_text())
    model_type = keys.pop("model_type")
    text = keys.get("text_config", keys)
    if isinstance(text.get("attn_temperature_tuning"), int):
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    cfg = AutoConfig.for_model(model_type, **keys)
    auto = AutoModelForImageTextToText if "vision_config" in keys else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(cfg)
    counts[arg] = sum(p.numel() for p in model.parameters())
print(json.dumps(counts))
