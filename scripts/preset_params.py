"""Parameter counts of published configs as transformers builds them, for tests/architectures.rs.

Usage: preset_params.py CONFIG.json...  (run with the python of scripts/torch-env.sh)

Each config is built with `AutoModelForCausalLM.from_config` on the meta device (no memory,
real shapes) and the numels of its parameters are summed, tied ones once, as
`sum(p.numel() for p in model.parameters())` counts them. Prints one JSON object
{path: count} on stdout.
"""
import json
import pathlib
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

counts = {}
for arg in sys.argv[1:]:
    keys = json.loads(pathlib.Path(arg).read_text())
    model_type = keys.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **keys)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    counts[arg] = sum(p.numel() for p in model.parameters())
print(json.dumps(counts))
