# LoRA (PEFT, r=8 on q/v) on a Llama-shaped model with gradient checkpointing, fp16 autocast and
# a GradScaler: three steps. Prints the adapters' parameter count, derived from the shapes.
import json

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

cfg = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
with torch.device("meta"):
    base = LlamaForCausalLM(cfg)
base = base.to_empty(device="cuda")
base.gradient_checkpointing_enable()
base.enable_input_require_grads()
model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
# torch.amp.GradScaler is torch >= 2.3; torch.cuda.amp.GradScaler the older spelling.
scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
          else torch.cuda.amp.GradScaler())
ids = torch.zeros(2, 128, dtype=torch.long, device="cuda")
for step in range(3):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print("EXPECT " + json.dumps({"trainable": trainable}))
