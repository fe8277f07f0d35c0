"""Programs that differ by rank parity: in each pair group (0,1), (2,3), ... the even rank sends
and the odd rank receives. ``--ranks auto`` sees one role from the groups alone; its check must
find that the odd ranks cannot run the even ranks' program, capture them and split the role."""
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
pair = pairs[rank // 2]
x = torch.empty(1024, device="cuda")
for _ in range(2):
    if rank % 2 == 0:
        y = torch.randn(1024, device="cuda")
        dist.send(y, group=pair, group_dst=1)
    else:
        dist.recv(x, group=pair, group_src=0)
        x = x * 2
