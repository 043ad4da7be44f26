"""Ends in the way argv[1] names: nocuda (never touches the GPU), killed (SIGKILL after 1 GiB),
hang (waits for a device value, which reads zero under emulation), error (raises after 1 GiB)."""
import os
import signal
import sys

how = sys.argv[1]
if how == "nocuda":
    print("no GPU here")
    raise SystemExit(0)
import torch  # noqa: E402

x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
if how == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
elif how == "hang":
    flag = torch.zeros(1, device="cuda")
    while flag.item() == 0:
        pass
elif how == "error":
    raise ValueError("the program's own failure")
