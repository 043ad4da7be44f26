# FSDP full shard on N emulated GPUs in one process: torch's fake process group gives this
# process rank 0 of N, FSDP2 (fully_shard, per decoder layer and at the root) shards every
# parameter on dim 0, and the collectives move no data (the emulator runs no kernels anyway).
# `python fsdp_tiny.py N [offload]`: with `offload`, CPUOffloadPolicy keeps the sharded
# parameters, gradients and AdamW state on the host. Prints the per-rank figures derived from
# the parameter shapes: each shard is ceil(dim0 / N) rows (FSDP2 pads the last rank).
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers import LlamaConfig, LlamaForCausalLM

import vramlab

N = int(sys.argv[1])
OFFLOAD = len(sys.argv) > 2 and sys.argv[2] == "offload"
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=False)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
full = {n: p.shape for n, p in model.named_parameters()}
with vramlab.phase("load"):
    policy = CPUOffloadPolicy() if OFFLOAD else OffloadPolicy()
    for layer in model.model.layers:
        fully_shard(layer, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    model.to_empty(device="cpu" if OFFLOAD else "cuda")
    torch.cuda.synchronize()


def shard_bytes(shape, elem=4):
    rows = -(-shape[0] // N)
    n = rows
    for d in shape[1:]:
        n *= d
    return n * elem


local = [p.to_local() for p in model.parameters()]
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.zeros(2, 64, dtype=torch.long, device="cuda")
for _step in range(2):
    with vramlab.phase("forward"):
        loss = model(input_ids=ids, labels=ids).loss
    with vramlab.phase("backward"):
        loss.backward()
        del loss
        torch.cuda.synchronize()
        grads = sum(p.grad.to_local().numel() * 4 for p in model.parameters())
    with vramlab.phase("optimizer"):
        opt.step()
        states = sum(v.to_local().untyped_storage().nbytes()
                     for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    opt.zero_grad(set_to_none=True)
params = sum(p.numel() for p in model.parameters())
print("EXPECT " + json.dumps({
    "n": N,
    "full_param_bytes": sum(4 * torch.Size(s).numel() for s in full.values()),
    "shard_bytes": sum(shard_bytes(s) for s in full.values()),
    "local_param_bytes": sum(t.untyped_storage().nbytes() for t in local),
    "grad_bytes": grads,
    "state_bytes": states,
    "tensors": len(full) + len(list(model.buffers())),
}))
