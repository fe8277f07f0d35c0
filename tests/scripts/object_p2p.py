"""A two-stage 'pipeline' of 4 ranks whose stage 1 learns its input shape from stage 0 through
send_object_list / recv_object_list, as torch.distributed.pipelining's shape inference does.

Stage 0 (ranks 0, 1) sends {"shape": [B, K]} to its peer on the pp group; stage 1 (ranks 2, 3)
receives it and multiplies a tensor of that shape by a [K, N] weight (a GEMM of 2·B·K·N FLOPs).
``--backwards``: stage 0 first receives an object from stage 1 (which never comes).
"""

import sys

import torch
import torch.distributed as dist

from heterosim.annotate import get_annotator

B, K, N = 24, 40, 56

dist.init_process_group("nccl")
rank = dist.get_rank()
groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
pp = groups[rank % 2]
get_annotator().label_group(pp, "pp")
stage = rank // 2
if "--backwards" in sys.argv and stage == 0:
    box = [None]
    dist.recv_object_list(box, src=rank + 2, group=pp)
if stage == 0:
    dist.send_object_list([{"shape": [B, K]}], dst=rank + 2, group=pp)
else:
    box = [None]
    dist.recv_object_list(box, src=rank - 2, group=pp)
    x = torch.randn(box[0]["shape"], device="cuda")
    w = torch.randn(K, N, device="cuda")
    y = x @ w
dist.destroy_process_group()
