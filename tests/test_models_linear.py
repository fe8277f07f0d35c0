"""Tests of ``models.layers.linear``: column -> row parallel MLP at TP 2 equals the unsplit one
(with and without sequence parallelism), and backward orders dgrad GEMM, async collective,
wgrad GEMM the way Megatron overlaps them."""

from __future__ import annotations

from test_models_mappings import run_fake, run_gloo

BODY = """
from models.layers.linear import ColumnParallelLinear, RowParallelLinear
g = dist.new_group(list(range(world)))
torch.manual_seed(0)
S, B, H, F = 4, 2, 6, 8
x_full = torch.randn(S, B, H, dtype=torch.float64)
w1, b1, w2, b2 = (torch.randn(F, H, dtype=torch.float64), torch.randn(F, dtype=torch.float64),
                  torch.randn(H, F, dtype=torch.float64), torch.randn(H, dtype=torch.float64))
weight = torch.randn(S, B, H, dtype=torch.float64)
ref = [t.clone().requires_grad_() for t in (x_full, w1, b1, w2, b2)]
y_ref = torch.nn.functional.gelu(ref[0] @ ref[1].T + ref[2]) @ ref[3].T + ref[4]
(y_ref * weight).sum().backward()
f, s = F // world, S // world
result = {}
for sp in (False, True):
    col = ColumnParallelLinear(H, F, tp_group=g, sequence_parallel=sp, bias=True, dtype=torch.float64, init_std=1.0)
    row = RowParallelLinear(F, H, tp_group=g, sequence_parallel=sp, bias=True, dtype=torch.float64,
                            init_std=1.0, skip_bias_add=False)
    with torch.no_grad():
        col.weight.copy_(w1[rank * f:(rank + 1) * f]); col.bias.copy_(b1[rank * f:(rank + 1) * f])
        row.weight.copy_(w2[:, rank * f:(rank + 1) * f]); row.bias.copy_(b2)
    rows = slice(rank * s, (rank + 1) * s) if sp else slice(None)
    x = x_full[rows].clone().requires_grad_()
    y, _ = row(torch.nn.functional.gelu(col(x)))
    (y * weight[rows]).sum().backward()
    bias_grad = row.bias.grad.clone()
    if sp:  # the gradient sync sums sequence-parallel params over TP
        dist.all_reduce(bias_grad, group=g)
    result[str(sp)] = dict(
        y=float((y - y_ref[rows]).abs().max()), x=float((x.grad - ref[0].grad[rows]).abs().max()),
        w1=float((col.weight.grad - ref[1].grad[rank * f:(rank + 1) * f]).abs().max()),
        w2=float((row.weight.grad - ref[3].grad[:, rank * f:(rank + 1) * f]).abs().max()),
        b2=float((bias_grad - ref[4].grad).abs().max()), sp_attr=bool(row.bias.sequence_parallel))
"""


def test_column_row_parallel_match_unsplit(tmp_path):
    """TP 2 (fp64): outputs, input grads and weight grads equal the unsplit MLP, with and
    without SP; the row-parallel bias is marked sequence_parallel exactly under SP."""
    res = run_gloo(BODY, world=2, tmp_path=tmp_path)
    for sp, errs in res.items():
        assert errs.pop("sp_attr") == (sp == "True")
        for key, err in errs.items():
            assert err < 1e-10, (sp, key, err)


ORDER = """
from models.layers.linear import ColumnParallelLinear
g = dist.new_group([0, 1, 2, 3])
out = {}
for sp in (False, True):
    lin = ColumnParallelLinear(64, 128, tp_group=g, sequence_parallel=sp, bias=False, dtype=torch.bfloat16,
                               init_std=0.02)
    x = torch.randn(8 if sp else 32, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    log = OpLog()
    with log:
        y.backward(torch.ones_like(y))
    out[str(sp)] = [[o["name"].split(".")[1], o["shapes"][:2]] for o in log.ops
                    if o["name"].startswith(("c10d.", "aten.mm"))]
result = out
"""


def test_backward_overlaps_collective_with_wgrad():
    """Backward issues dgrad GEMM, then the async all-reduce (SP: re-gather first, reduce-scatter
    after dgrad), then the wgrad GEMM that overlaps it."""
    res = run_fake(ORDER, rank=1, world=4)
    assert res["False"] == [["mm", [[64, 32], [32, 64]]], ["allreduce_", [[32, 2, 64]]],
                            ["mm", [[32, 64], [64, 64]]]]
    assert [n for n, _ in res["True"]] == ["_allgather_base_", "mm", "_reduce_scatter_base_", "mm"]


SYNC_ORDER = """
from models.layers.linear import ColumnParallelLinear
g = dist.new_group([0, 1, 2, 3])
lin = ColumnParallelLinear(64, 128, tp_group=g, sequence_parallel=False, bias=True, dtype=torch.bfloat16,
                           init_std=0.02, async_allreduce=False)
x = torch.randn(32, 2, 64, dtype=torch.bfloat16, requires_grad=True)
y = lin(x)
log = OpLog()
with log:
    y.backward(torch.ones_like(y))
result = [o["name"].split(".")[1] for o in log.ops if o["name"].startswith(("c10d.", "aten.mm", "aten.sum"))]
"""


def test_sync_allreduce_runs_after_both_gemms():
    """``async_allreduce=False`` (Megatron-LM before late 2021): dgrad GEMM, wgrad GEMM, bias-grad sum,
    then the input-gradient all-reduce, which nothing overlaps."""
    assert run_fake(SYNC_ORDER, rank=1, world=4) == ["mm", "mm", "sum", "allreduce_"]


def test_init_replicated_ignores_and_keeps_the_global_generator():
    """A TP-replicated parameter (position embeddings, MoE router) gets the same values on every TP
    rank although each rank's global generator is seeded differently, and the global stream is
    left where it was."""
    import torch

    from models.layers.linear import init_replicated

    draws = []
    for tp_rank in range(2):
        torch.manual_seed(1234 + 2718 + tp_rank)  # pretrain_gpt's per-TP-rank seed for split weights
        before = torch.random.get_rng_state()
        w = torch.empty(4, 3)
        init_replicated(0.02, seed=1234)(w)
        assert torch.equal(torch.random.get_rng_state(), before)
        draws.append(w)
    assert torch.equal(draws[0], draws[1]) and float(draws[0].std()) > 0
