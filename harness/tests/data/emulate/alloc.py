# Allocates the given number of bytes on the device inside a `forward` phase (emulate.rs: a
# program that fits, and one that runs out of memory).
import sys

import torch
import vramlab

with vramlab.phase("forward"):
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
print("allocated", x.numel())
