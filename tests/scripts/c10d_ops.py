"""c10d ops and group forms a training stack uses, in one script: broadcast, gather and scatter
(rooted: recorded as NCCL's grouped sends and receives), all_to_all_single, all_gather_into_tensor,
reduce_scatter_tensor, list all_gather / all_to_all, new_subgroups, a 2-D DeviceMesh ("dp", "tp"),
batch_isend_irecv round a ring, barrier. Each tensor of x is 64 fp32 = 256 bytes."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
x = torch.randn(64, device="cuda")
dist.broadcast(x, src=0)
outs = [torch.empty(64, device="cuda") for _ in range(w)] if r == 0 else None
dist.gather(x, outs, dst=0)
ins = [torch.randn(64, device="cuda") for _ in range(w)] if r == 0 else None
dist.scatter(x, ins, src=0)
y = torch.empty(64 * w, device="cuda")
dist.all_to_all_single(y, torch.randn(64 * w, device="cuda"))
dist.all_gather_into_tensor(y, x)
dist.reduce_scatter_tensor(x, y)
lst = [torch.empty(64, device="cuda") for _ in range(w)]
dist.all_gather(lst, x)
dist.all_to_all(lst, [torch.randn(64, device="cuda") for _ in range(w)])
sub, subs = dist.new_subgroups(group_size=2)
dist.all_reduce(x, group=sub)
mesh = init_device_mesh("cuda", (2, w // 2), mesh_dim_names=("dp", "tp"))
dist.all_reduce(x, group=mesh["tp"].get_group())
dist.all_reduce(x, group=mesh["dp"].get_group())
ops = [dist.P2POp(dist.isend, x, (r + 1) % w), dist.P2POp(dist.irecv, y[:64], (r - 1) % w)]
for wk in dist.batch_isend_irecv(ops): wk.wait()
dist.barrier()
