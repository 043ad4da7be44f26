"""LoRA fine-tuning of a Llama-3.1-shaped model (8B or 70B) for three steps, built on `meta` and
materialized on the (emulated) device: no host copy of the weights.

    vramlab emulate --gpu h200 -- python harness/python/examples/lora_llama.py --size 8b

bf16 weights, PEFT LoRA r=16 on the attention projections, gradient checkpointing, AdamW.
"""

import argparse

import torch
import vramlab
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {  # Meta-Llama-3.1 config.json values
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8),
}
ap = argparse.ArgumentParser()
ap.add_argument("--size", choices=SHAPES, default="8b")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--seq", type=int, default=2048)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()

cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                  tie_word_embeddings=False, **SHAPES[a.size])
with vramlab.phase("load"):
    with torch.device("meta"):
        base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    base = base.to_empty(device="cuda")
base.gradient_checkpointing_enable()
base.enable_input_require_grads()
model = get_peft_model(base, LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.zeros(a.batch, a.seq, dtype=torch.long, device="cuda")
for step in range(a.steps):
    with vramlab.phase("forward"):
        loss = model(input_ids=ids, labels=ids).loss
    with vramlab.phase("backward"):
        loss.backward()
    with vramlab.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
