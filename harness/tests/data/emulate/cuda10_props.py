"""Under torch 1.10 (PyPI's CUDA 10.2 build) on the emulated GPU: the device properties torch
reads through CUDA 10's cudaDeviceProp layout, a matmul through the cuBLAS linked into
libtorch_cuda, and the allocator's figures for two 4 MiB float32 tensors."""
import json

import torch

p = torch.cuda.get_device_properties(0)
x = torch.empty(1024, 1024, device="cuda")
y = x @ x
torch.cuda.synchronize()
print("EXPECT " + json.dumps({
    "name": p.name,
    "total": p.total_memory,
    "cc": f"{p.major}.{p.minor}",
    "sms": p.multi_processor_count,
    "allocated": torch.cuda.memory_allocated(),
    "shape": list(y.shape),
}))
