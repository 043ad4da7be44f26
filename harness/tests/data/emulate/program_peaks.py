# The program's own peak statistics under emulation: around its second AdamW step (foreach),
# torch.cuda.max_memory_allocated must show the step's transient, the `_foreach_sqrt` of
# exp_avg_sq (one tensor per parameter), although vramlab's step hook resets the allocator's
# high-water marks at every optimizer step. Four parameters of 4 MiB each: 20 MiB segments hold
# five such blocks exactly, so no block is rounded up.
import json

import torch

params = [torch.nn.Parameter(torch.zeros(1 << 20, device="cuda")) for _ in range(4)]
opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
for step in range(2):
    for p in params:
        p.grad = torch.zeros_like(p)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    opt.step()
    transient = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
param_bytes = sum(p.numel() * p.element_size() for p in params)
print("EXPECT " + json.dumps({"transient": transient, "param_bytes": param_bytes}))
