# A training loop that writes its own rows with vramlab.recorder().write_csv (the path in argv):
# a tiny linear model, forward, backward and optimizer phases, two steps.
import sys

import torch
import vramlab

model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.zeros(8, 256, device="cuda")
for step in range(2):
    with vramlab.phase("forward"):
        loss = model(x).sum()
    with vramlab.phase("backward"):
        loss.backward()
    with vramlab.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
params = sum(p.numel() for p in model.parameters())
n = vramlab.recorder().write_csv(sys.argv[1], model_id="linear-256", precision="f32", batch=8,
                                 param_count=params)
print("rows", n)
