"""CUDA graphs on the fake device (capture/graphs.py): a captured graph replayed each iteration,
and a module graphed by torch.cuda.make_graphed_callables.

Per iteration: copy into the static input, replay g (3 ops: mm, relu, sum captured), then the
graphed MLP forward and backward, and an optimizer step.
"""
import torch

torch.manual_seed(0)
w = torch.randn(32, 32, device="cuda")
static_x = torch.randn(32, 32, device="cuda")
g = torch.cuda.CUDAGraph()
# torch.cuda.CUDAGraph stays a class: libraries annotate with it (transformers: "CUDAGraph | None").
assert isinstance(g, torch.cuda.CUDAGraph) and (torch.cuda.CUDAGraph | None) is not None
with torch.cuda.graph(g):
    static_y = (static_x @ w).relu().sum()

mlp = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 32)).cuda()
graphed = torch.cuda.make_graphed_callables(mlp, (torch.randn(8, 32, device="cuda", requires_grad=True),))
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
for step in range(3):
    static_x.copy_(torch.randn(32, 32, device="cuda"))
    g.replay()
    out = graphed(torch.randn(8, 32, device="cuda", requires_grad=True))
    out.sum().backward()
    opt.step()
    opt.zero_grad()
