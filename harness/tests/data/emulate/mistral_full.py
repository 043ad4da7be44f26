# A full fine-tune of a Mistral-shaped model (every parameter trains, the embedding included,
# whose backward sorts token ids on the device): three AdamW steps under bf16 autocast.
import torch
from transformers import MistralConfig, MistralForCausalLM

cfg = MistralConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    sliding_window=64)
with torch.device("meta"):
    model = MistralForCausalLM(cfg)
model = model.to_empty(device="cuda")
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.zeros(2, 128, dtype=torch.long, device="cuda")
for step in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("loss", loss.item())
