# A tiny BERT masked-LM training step, three times, with AdamW (torch's default implementation
# on CUDA: foreach). Prints the bytes the exact terms must take, derived from the parameter
# shapes alone (each tensor rounded up to the caching allocator's 512 B; the model's state is
# its parameters and buffers): emulate.rs compares
# them with the allocator's figures.
import json

import torch
import vramlab
from transformers import BertConfig, BertForMaskedLM

torch.manual_seed(0)
cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=64)
with vramlab.phase("load"):
    model = BertForMaskedLM(cfg).to("cuda")
params = [p for p in model.parameters() if p.requires_grad]
def rounded(ts):
    return sum((t.numel() * t.element_size() + 511) // 512 * 512 for t in ts)


state = rounded(list(model.parameters()) + list(model.buffers()))
opt = torch.optim.AdamW(params, lr=1e-4)
ids = torch.zeros(2, 32, dtype=torch.long, device="cuda")
inputs = rounded([ids])
for step in range(3):
    with vramlab.phase("forward"):
        loss = model(input_ids=ids, labels=ids).loss
    with vramlab.phase("backward"):
        loss.backward()
        del loss
    with vramlab.phase("optimizer"):
        opt.step()
    opt.zero_grad(set_to_none=True)
print("EXPECT " + json.dumps({"state": state, "params": rounded(params), "inputs": inputs}))
