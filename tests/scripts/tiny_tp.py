"""A tiny hand-written tensor-parallel MLP used by the capture tests (not Megatron; checks the machinery).

Each rank: two TP groups of size 2 over a world of 4 (ranks {0,1} and {2,3}); forward
y = relu(x @ W1) @ W2 followed by an all-reduce over the TP group; backward; an async all-reduce
of W1's grad over the data-parallel group, overlapped with nothing, then waited.
"""
import os
import sys

import torch
import torch.distributed as dist

from heterosim.annotate import get_annotator

if "--fail" in sys.argv:
    raise RuntimeError("tiny_tp was asked to fail")

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
ann = get_annotator()
tp_groups = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
dp_groups = [dist.new_group(list(range(t, world, 2))) for t in range(2)]
tp = tp_groups[rank // 2]
dp = dp_groups[rank % 2]
ann.label_group(tp, "tp")
ann.label_group(dp, "dp")
ann.declare(layout={"tp": 2, "dp": world // 2, "pp": 1}, model={"hidden_size": 64})

b, h = 4, 64
w1 = torch.nn.Parameter(torch.randn(h, 2 * h // 2, dtype=torch.bfloat16))
w2 = torch.nn.Parameter(torch.randn(2 * h // 2, h, dtype=torch.bfloat16))
micro_batches = int(os.environ.get("TINY_MB", "3"))
for it in range(2):
    ann.iteration(it)
    for mb in range(micro_batches):
        with ann.scope(phase="fwd", mb=mb):
            def fwd(x):
                y = torch.relu(x @ w1) @ w2
                dist.all_reduce(y, group=tp)
                return y
            x = torch.randn(b, h, dtype=torch.bfloat16)
            y = ann.block(("fwd", mb == micro_batches - 1), fwd, x)
        with ann.scope(phase="bwd", mb=mb):
            def bwd(y):
                y.sum().backward()
                return None
            ann.block(("bwd", mb == micro_batches - 1), bwd, y)
    with ann.scope(phase="grad_sync"):
        work = dist.all_reduce(w1.grad, group=dp, async_op=True)
        work.wait()
