# Three allocations whose segments the caching allocator's rules decide (emulate.rs derives
# them): 1,000 B (small pool), 5 MiB (a 20 MiB segment), 30 MiB (a segment of its own).
import sys

import torch
import vramlab

sizes = [int(a) for a in sys.argv[1:]]
with vramlab.phase("load"):
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
