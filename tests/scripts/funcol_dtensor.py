"""Functional collectives, DTensor and batched p2p under capture (tests/test_capture_recorder.py).

World 4: a functional all_reduce whose result is used after an independent matmul (the wait
must land at the first use), a DTensor column-wise matmul on a 1-D mesh of 4 (local shapes must be
recorded, not global ones), a batch_isend_irecv ring exchange (one grouped launch), and a
``torch.mm(out=)`` whose argument checks ask C++ for the tensors' devices (answered, not recorded),
and an ``addmm`` accumulating into its own input (a weight gradient into ``main_grad``).
"""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()

x = torch.randn(8, 16)
w = torch.randn(16, 16)
y = funcol.all_reduce(x, "sum", dist.group.WORLD)
z = w @ w                      # independent work between issue and first use
out = y + 1.0                  # first use of the all-reduce result

mesh = init_device_mesh("cpu", (world,))
a = DTensor.from_local(torch.randn(32, 16), mesh, [Shard(1)])   # global 32 x 64, local 32 x 16
b = DTensor.from_local(torch.randn(32, 32), mesh, [Replicate()])
c = torch.mm(b, a)             # DTensor op: runs as a local 32 x 32 x 16 matmul

send = torch.randn(4, 4)
recv = torch.empty(4, 4)
ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
for req in dist.batch_isend_irecv(ops):
    req.wait()

buf = torch.empty(8, 16)
torch.mm(x, w, out=buf)        # C++ checks the devices of x, w and buf (prim.device)

acc = torch.zeros(8, 16)
torch.addmm(acc, x, w, out=acc)  # accumulates in place: recorded, no fake kernel run
assert acc.shape == (8, 16)
