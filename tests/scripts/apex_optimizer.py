"""megatron-core's optimizer step as it runs on a GPU host with apex (NGC containers), without apex.

Captured by tests/test_capture_compat.py at world size 2: capture/extensions.py stands in for
``apex.optimizers.FusedAdam``, ``apex.multi_tensor_apply.multi_tensor_applier`` and ``amp_C``.
Two iterations of megatron-core's ``MixedPrecisionOptimizer.step`` (fp16 params, so the main/model
copies are multi-tensor too): the gradient norm for clipping, clipping, Adam, main params copied
to the model params; a failed assertion fails the capture.
"""

import amp_C
import torch
import torch.distributed as dist
from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers import FusedAdam

dist.init_process_group("nccl")
SIZES = (64, 32, 16, 8)
model = [torch.randn(n, device="cuda", dtype=torch.float16) for n in SIZES]
main = [torch.nn.Parameter(m.float()) for m in model]
opt = FusedAdam([{"params": main[:2], "weight_decay": 0.1}, {"params": main[2:], "weight_decay": 0.0}],
                lr=1e-3, betas=(0.9, 0.95), eps=1e-8, adam_w_mode=True, bias_correction=True,
                set_grad_none=True, capturable=False, master_weights=False)
# megatron-core's init_state_fn: the moments only (apex keeps the step count per group).
for group in opt.param_groups:
    for p in group["params"]:
        opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
        opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)
overflow = torch.zeros(1, dtype=torch.int, device="cuda")
for _ in range(2):
    for p in main:
        p.grad = torch.randn_like(p)
    grads = [p.grad for p in main]
    norm, per_tensor = multi_tensor_applier(amp_C.multi_tensor_l2norm, overflow, [grads], False)
    assert norm.shape == (1,) and norm.dtype == torch.float32 and norm.device.type == "cuda"
    multi_tensor_applier(amp_C.multi_tensor_scale, overflow, [grads, grads], 0.5)
    opt.step()
    multi_tensor_applier(amp_C.multi_tensor_scale, overflow, [[p.data for p in main], model], 1.0)
    opt.zero_grad()
    assert all(p.grad is None for p in main)
