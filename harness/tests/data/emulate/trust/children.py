"""Starts workers that each allocate on the emulated GPU: argv[1] is spawn or dataloader."""
import sys

import torch
import torch.multiprocessing as mp

GIB = 1 << 30


def work(i, n):
    torch.empty(n, dtype=torch.uint8, device="cuda")


if __name__ == "__main__":
    how = sys.argv[1]
    if how == "spawn":
        # The parent holds 1 GiB; the child 2 GiB: the child holds the peak.
        x = torch.empty(GIB, dtype=torch.uint8, device="cuda")
        mp.spawn(work, args=(2 * GIB,), nprocs=1)
    elif how == "dataloader":
        # Forked DataLoader workers (CPU only, as on a GPU) beside 1 GiB in the parent.
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.empty(GIB, dtype=torch.uint8, device="cuda")
        for (b,) in DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2):
            b.cuda()
    else:
        raise SystemExit(f"unknown {how}")
