"""A GPU-style script for the fake CUDA device: device queries, .cuda()/.to(), streams and events.

Asserts what the script sees (a capture fails if any assertion does); the test reads where the
recorder placed the compute stream's waits:
  1. all_reduce(g) issued on a side stream, its event waited by the default stream after x @ w:
     all_reduce, mm, wait, add;
  2. all_reduce(h, async_op=True) never waited, then torch.cuda.synchronize(): a wait there;
  3. all_reduce(k, async_op=True), then a read of k without work.wait(): a wait before the read;
  4. an async all_reduce of one slice of a buffer: a write to another slice does not wait, a read
     of the slice does.
"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
local = int(os.environ["LOCAL_RANK"])
assert torch.cuda.is_available() and torch.cuda.device_count() == int(os.environ["LOCAL_WORLD_SIZE"])
torch.cuda.set_device(local)
assert torch.cuda.current_device() == local
props = torch.cuda.get_device_properties(local)
assert props.name == "NVIDIA H100 80GB HBM3" and props.total_memory == 80 * 2**30, props
assert (props.major, props.minor) == (9, 0) and torch.cuda.get_device_capability() == (9, 0)
torch.cuda.manual_seed(0)
torch.cuda.nvtx.range_push("setup")

lin = torch.nn.Linear(256, 256).cuda().to(torch.bfloat16)
assert lin.weight.is_cuda and lin.weight.dtype == torch.bfloat16 and lin.weight.device == torch.device("cuda", local)
x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 256, dtype=torch.bfloat16).to("cuda")
g = torch.randn(256, 256, device=f"cuda:{local}", dtype=torch.bfloat16)
before = torch.cuda.memory_allocated()
extra = torch.empty(1024, 1024, device="cuda")  # 4 MiB, a multiple of the allocator's 512-byte blocks
assert torch.cuda.memory_allocated() - before == 4 * 2**20
assert torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated()
del extra
torch.cuda.nvtx.range_pop()

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    dist.all_reduce(g)  # synchronous, but on the side stream: the default stream does not wait yet
    done = torch.cuda.Event()
    done.record()
y = x @ w
torch.cuda.current_stream().wait_event(done)
z = g + y

h = torch.randn(128, device="cuda")
dist.all_reduce(h, async_op=True)
torch.cuda.synchronize()

k = torch.randn(64, device="cuda")
dist.all_reduce(k, async_op=True)
k2 = k * 2

# 4. Two buckets of one buffer: an async all_reduce of the first; accumulating into the second
#    does not wait for it, reading the first does.
buf = torch.zeros(128, device="cuda")
dist.all_reduce(buf[:64], async_op=True)
buf[64:].add_(1.0)
total = buf[:64].sum()
