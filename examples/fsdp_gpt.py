"""A plain PyTorch FSDP2 training script: the GPT of ddp_gpt.py, each block and the root under
``fully_shard`` over a 1-D DeviceMesh, built on the meta device and materialized on the GPU.

    torchrun --nproc-per-node 8 examples/fsdp_gpt.py
    python -m capture --world-size 64 -o /tmp/fsdp_trace examples/fsdp_gpt.py
    python -m replay simulate /tmp/fsdp_trace --cluster dgx-h100

FSDP2 all-gathers each block's parameters on its own stream before the block runs (prefetching the
next while one computes) and reduce-scatters its gradients on another stream during backward.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddp_gpt import GPT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU per iteration")
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    with torch.device("meta"):
        model = GPT(a.vocab, a.seq, a.hidden, a.heads, a.layers)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for _ in range(a.iters):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
        loss = F.cross_entropy(model(idx[:, :-1]).view(-1, a.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
