"""Idioms of training libraries (megatron-core's) that a capture must run, without the library.

Captured by tests/test_capture_compat.py at world size 4; a failed assertion fails the capture.
"""

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()

# An RNG tracker (megatron.core.tensor_parallel.random): the CUDA generator's state through
# torch.cuda.random and default_generators; the states are real host tensors, compared for real.
state = torch.cuda.random.get_rng_state()
torch.cuda.default_generators[torch.cuda.current_device()].set_state(state)
assert torch.all(torch.cuda.get_rng_state() == state).item()

# Gradient clipping: a norm read back as a float (the placeholder 0.0 under capture, capture/hostsync.py),
# per-tensor norms stacked through torch.tensor, and a type check on the gradient.
g = torch.randn(64, device="cuda")
assert g.norm().item() == 0.0 and float(g.sum()) == 0.0
norms = torch.tensor([g.norm(), g.sum()])
assert norms.shape == (2,) and norms.dtype == torch.float32
assert g.type() == "torch.cuda.FloatTensor"
g.record_stream(torch.cuda.current_stream())

# Optimizer setup agreeing on parameter groups across ranks.
keys = [None] * dist.get_world_size()
dist.all_gather_object(keys, [("decay", rank % 1)])
assert keys == [[("decay", 0)]] * dist.get_world_size()

# Groups described as megatron-core describes them, through one helper (its create_group), each
# NCCL group created beside its gloo twin.
def create_group(ranks, backend=None, group_desc=None):
    return dist.new_group(ranks, backend=backend, group_desc=group_desc)


for ranks in ([0, 1], [2, 3]):
    nccl = create_group(ranks, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
    create_group(ranks, backend="gloo", group_desc="TENSOR_MODEL_PARALLEL_GROUP_GLOO")
    if rank in ranks:
        tp = nccl
dist.all_reduce(torch.ones(8, device="cuda"), group=tp)

# Megatron's fused-kernel extensions (capture/extensions.py stands in for them).
import fused_weight_gradient_mlp_cuda  # noqa: E402
import scaled_upper_triang_masked_softmax_cuda  # noqa: E402

scores = torch.randn(8, 32, 32, device="cuda", dtype=torch.bfloat16)
probs = scaled_upper_triang_masked_softmax_cuda.forward(scores, 0.125)
scaled_upper_triang_masked_softmax_cuda.backward(probs, probs, 0.125)
main_grad = torch.zeros(16, 24, device="cuda")
x = torch.randn(40, 24, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(40, 16, device="cuda", dtype=torch.bfloat16)
fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(x, dy, main_grad)
dist.destroy_process_group()
