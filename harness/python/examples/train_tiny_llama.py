"""A PyTorch training loop that marks its phases for vramlab: run it on any emulated GPU.

    vramlab emulate --gpu rtx-4090 -- python harness/python/examples/train_tiny_llama.py

A Llama-shaped model (SmolLM2-135M's shapes by default) trains for three steps with AdamW in
bf16 autocast. `--layers`, `--batch` and `--seq` change its size.
"""

import argparse

import torch
import vramlab
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=30)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--steps", type=int, default=3)
a = ap.parse_args()

cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                  num_hidden_layers=a.layers, num_attention_heads=9, num_key_value_heads=3,
                  max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)
with vramlab.phase("load"):
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device="cuda")
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.zeros(a.batch, a.seq, dtype=torch.long, device="cuda")
for step in range(a.steps):
    with vramlab.phase("forward"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
    with vramlab.phase("backward"):
        loss.backward()
    with vramlab.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
