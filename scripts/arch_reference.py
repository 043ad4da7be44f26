"""Reference logits from transformers for tests/architectures.rs.

Usage: arch_reference.py CONFIG.json...  (run with the python of scripts/torch-env.sh)

For each tiny config `DIR/NAME.json`: builds the HF model (eager attention, f32), sets every
parameter to seeded uniform values in [-0.5, 0.5), saves it with `save_pretrained` into
`DIR/NAME/` (model.safetensors and the config.json transformers writes), and writes
`DIR/NAME/reference.json`: the token ids, the logits of one forward over them, and the
parameter count transformers reports.
"""
import json
import pathlib
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

IDS = [3, 17, 250, 9, 128, 77, 5, 200, 31, 64, 1, 99]

for arg in sys.argv[1:]:
    path = pathlib.Path(arg)
    keys = json.loads(path.read_text())
    model_type = keys.pop("model_type")
    # Token ids inside the tiny vocabulary (Phi-3's default pad id is 32000).
    keys.update(pad_token_id=0, bos_token_id=0, eos_token_id=0)
    cfg = AutoConfig.for_model(model_type, **keys)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
        logits = model(torch.tensor([IDS])).logits[0]
    out = path.with_suffix("")
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (out / "reference.json").write_text(
        json.dumps({"ids": IDS, "logits": logits.tolist(), "params": params})
    )
    print(f"{out}: {params} parameters")
