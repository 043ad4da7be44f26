"""A torchrun rank: LOCAL_RANK r holds (r + 1) GiB on its own device."""
import os

import torch

r = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(r)
x = torch.empty((r + 1) << 30, dtype=torch.uint8, device="cuda")
