"""Tests of ``models.layers.linear``: column -> row parallel MLP at TP 2 equals the unsplit one
(with and without sequence parallelism), and backward orders dgrad GEMM, async collective,
wgrad GEMM the way Megatron overlaps them."""

from __future__ import annotations

import pytest
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
for sp, ov, agg in ((False, False, False), (True, False, False), (True, True, False), (True, True, True)):
    col = ColumnParallelLinear(H, F, tp_group=g, sequence_parallel=sp, bias=True, dtype=torch.float64, init_std=1.0,
                               tp_comm_overlap=ov, tp_comm_aggregate=agg)
    row = RowParallelLinear(F, H, tp_group=g, sequence_parallel=sp, bias=True, dtype=torch.float64,
                            init_std=1.0, skip_bias_add=False, tp_comm_overlap=ov, tp_comm_aggregate=agg)
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
    result[f"{sp}-{ov}" + ("-agg" if agg else "")] = dict(
        y=float((y - y_ref[rows]).abs().max()), x=float((x.grad - ref[0].grad[rows]).abs().max()),
        w1=float((col.weight.grad - ref[1].grad[rank * f:(rank + 1) * f]).abs().max()),
        w2=float((row.weight.grad - ref[3].grad[:, rank * f:(rank + 1) * f]).abs().max()),
        b2=float((bias_grad - ref[4].grad).abs().max()), sp_attr=bool(row.bias.sequence_parallel))
"""


def test_column_row_parallel_match_unsplit(tmp_path):
    """TP 2 (fp64): outputs, input grads and weight grads equal the unsplit MLP, without SP, with
    SP and with SP under --tp-comm-overlap (ring-exchange and pipelined GEMMs, with and without TE's
    aggregate); the row-parallel bias is marked sequence_parallel exactly under SP."""
    res = run_gloo(BODY, world=2, tmp_path=tmp_path)
    assert sorted(res) == ["False-False", "True-False", "True-True", "True-True-agg"]
    for sp, errs in res.items():
        assert errs.pop("sp_attr") == sp.startswith("True")
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


OVERLAP_ORDER = """
from models.layers.linear import ColumnParallelLinear, RowParallelLinear
g = dist.new_group([0, 1, 2, 3])
col = ColumnParallelLinear(64, 128, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                           init_std=0.02, tp_comm_overlap=True)
row = RowParallelLinear(128, 64, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                        init_std=0.02, tp_comm_overlap=True)
x = torch.randn(32, 2, 64, dtype=torch.bfloat16, requires_grad=True)  # s/tp = 32 rows, b = 2
keep = ("c10d.", "aten.mm", "aten.copy_")
log = OpLog()
with log:
    y, _ = row(col(x))
fwd = [[o["name"].split(".")[1], o["shapes"][0]] for o in log.ops if o["name"].startswith(keep)]
log = OpLog()
with log:
    y.backward(torch.ones_like(y))
bwd = [o["name"].split(".")[1] for o in log.ops if o["name"].startswith(keep)]
result = dict(fwd=fwd, bwd=bwd)
"""


def test_tp_comm_overlap_pipelines_gathers_and_scatters_with_gemms():
    """TP 4, SP, --tp-comm-overlap. Column forward: the rank copies its 32 rows into its region,
    region 0 is broadcast, then each region's GEMM (64 = 32 rows x b 2) runs while the next region
    is broadcast. Row forward: per region a GEMM, then its async reduce to the region's owner.
    Row backward: grad_out gathered the same way under the dgrad GEMMs, then one wgrad GEMM."""
    res = run_fake(OVERLAP_ORDER, rank=1, world=4)
    bcast, gemm = ["broadcast_", [32, 2, 64]], ["mm", [64, 64]]
    assert res["fwd"] == ([["copy_", [32, 2, 64]], bcast, bcast, gemm, bcast, gemm, bcast, gemm, gemm]
                          + [["mm", [64, 32]], ["reduce_", [32, 2, 64]]] * 4)
    ring = ["copy_", "broadcast_", "broadcast_", "mm", "broadcast_", "mm", "broadcast_", "mm", "mm"]
    assert res["bwd"] == ring + ["mm",  # row wgrad on the gathered grad_out; then the column backward:
                                 "_allgather_base_", "mm", "_reduce_scatter_base_", "mm"]


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


FP8_ORDER = """
from models.layers.linear import ColumnParallelLinear, RowParallelLinear
ann = PhaseAnnotator(); set_annotator(ann)
g = dist.new_group([0, 1, 2, 3])
col = ColumnParallelLinear(64, 128, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                           init_std=0.02, tp_comm_overlap=True, fp8=True)
row = RowParallelLinear(128, 64, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                        init_std=0.02, tp_comm_overlap=True, fp8=True)
x = torch.randn(32, 2, 64, dtype=torch.bfloat16, requires_grad=True)
keep = ("_to_copy", "clone", "broadcast_", "_allgather_base_", "_reduce_scatter_base_", "reduce_")
def rows(log):
    return [[o["name"].split(".")[1], o["shapes"][0], o["comm_dtype"]] for o in log.ops
            if o["name"].split(".")[1] in keep]
log = OpLog(ann)
with log:
    y, _ = row(col(x))
fwd = rows(log)
log = OpLog(ann)
with log:
    y.backward(torch.ones_like(y))
result = dict(fwd=fwd, bwd=rows(log))
"""


def test_fp8_casts_transposes_and_fp8_all_gathers():
    """TP 4, SP, --tp-comm-overlap, fp8 (Transformer Engine, models/layers/fp8.py). Forward: the
    column layer's ring broadcasts (4 of [32, 2, 64]) move fp8, with no cast (the norm wrote fp8);
    the row layer casts its [128, 2, 32] input, and its pipelined reduces stay bf16. Backward, row:
    cast of the [32, 2, 64] gradient shard, fp8 ring, transposes of the gathered gradient
    ([256, 64] -> [64, 256]) and of the input ([256, 32] -> [32, 256]); column: cast-transpose of
    its [128, 2, 32] gradient, the bulk re-gather of the input in fp8, the input's transpose; the
    reduce-scatter of the input gradient stays bf16."""
    res = run_fake(FP8_ORDER, rank=1, world=4)
    ring = [["broadcast_", [32, 2, 64], "fp8"]] * 4
    assert res["fwd"] == ring + [["_to_copy", [128, 2, 32], None]] + [["reduce_", [32, 2, 64], None]] * 4
    assert res["bwd"] == ([["_to_copy", [32, 2, 64], None]] + ring
                          + [["clone", [64, 256], None], ["clone", [32, 256], None],
                             ["_to_copy", [128, 2, 32], None], ["clone", [32, 256], None],
                             ["_allgather_base_", [128, 2, 64], "fp8"], ["clone", [64, 256], None],
                             ["_reduce_scatter_base_", [32, 2, 64], None]])



def test_fp8_buf_reduces_the_pipelined_chunks_in_fp8():
    """The same row layer with TE's fp8_buf on its pipelined reduce-scatter (the Llama 3.1 405B
    recipe's fp8 runs): its four reduces move fp8; nothing else changes."""
    code = FP8_ORDER.replace("tp_comm_overlap=True, fp8=True)\nx",
                             "tp_comm_overlap=True, fp8=True, tp_comm_fp8_buf=True)\nx")
    assert code != FP8_ORDER
    res = run_fake(code, rank=1, world=4)
    base = run_fake(FP8_ORDER, rank=1, world=4)
    assert res["fwd"] == base["fwd"][:5] + [["reduce_", [32, 2, 64], "fp8"]] * 4
    assert res["bwd"] == base["bwd"]


FP8_CS = (FP8_ORDER.replace("with log:", "with log, te_fp8.recipe('tensorwise'):")
          .replace('keep = ("_to_copy",', 'keep = ("linalg_vector_norm", "reciprocal", "allreduce_", "_to_copy",')
          .replace("from models.layers.linear import", "from models.layers import fp8 as te_fp8\nfrom models.layers.linear import"))


def test_fp8_current_scaling_takes_each_amax_before_its_cast():
    """The same layers under --fp8-recipe tensorwise (Float8CurrentScaling). Forward: the norm wrote
    the column layer's input in bf16 with its amax, so its shard is cast here after the amax is
    all-reduced over TP (4 bytes) and turned into a scale; the row layer's input gets an amax pass
    first. Backward: the row layer's gradient shard too gets an amax pass and a TP all-reduce
    before its fp8 ring; the column layer's full gradient an amax pass, no all-reduce."""
    res = run_fake(FP8_CS, rank=1, world=4)
    ring = [["broadcast_", [32, 2, 64], "fp8"]] * 4
    amax_ar = [["allreduce_", [1], None], ["reciprocal", [1], None]]
    assert res["fwd"] == (amax_ar + [["_to_copy", [32, 2, 64], None]] + ring
                          + [["linalg_vector_norm", [128, 2, 32], None], ["reciprocal", [1], None],
                             ["_to_copy", [128, 2, 32], None]] + [["reduce_", [32, 2, 64], None]] * 4)
    assert res["bwd"] == ([["linalg_vector_norm", [32, 2, 64], None]] + amax_ar + [["_to_copy", [32, 2, 64], None]]
                          + ring + [["clone", [64, 256], None], ["clone", [32, 256], None],
                                    ["linalg_vector_norm", [128, 2, 32], None], ["reciprocal", [1], None],
                                    ["_to_copy", [128, 2, 32], None], ["clone", [32, 256], None],
                                    ["_allgather_base_", [128, 2, 64], "fp8"], ["clone", [64, 256], None],
                                    ["_reduce_scatter_base_", [32, 2, 64], None]])


NVFP4 = (FP8_ORDER.replace("with log:", "with log, te_fp8.recipe('nvfp4'):")
         .replace('keep = ("_to_copy",', 'keep = ("linalg_vector_norm", "reciprocal", "allreduce_", "nvfp4_quantize", '
                  '"_to_copy",')
         .replace("from models.layers.linear import", "from models.layers import fp8 as te_fp8\nfrom models.layers.linear import"))


def test_nvfp4_quantizes_both_copies_after_an_amax_pass():
    """The same layers under --fp4-format e2m1 (TE's NVFP4BlockScaling). Every cast is an amax pass
    (no fused-norm amax, no scale kernel) then one quantize writing both copies, so no transpose
    runs; a sequence-parallel shard's amax is all-reduced over TP first. The ring exchanges move
    both packed copies (nvfp4x2), the column layer's backward re-gather only the column-wise one
    (nvfp4); reduces and the reduce-scatter stay bf16."""
    res = run_fake(NVFP4, rank=1, world=4)
    ring = [["broadcast_", [32, 2, 64], "nvfp4x2"]] * 4
    shard = [["linalg_vector_norm", [32, 2, 64], None], ["allreduce_", [1], None], ["nvfp4_quantize", [32, 2, 64], None]]
    full = [["linalg_vector_norm", [128, 2, 32], None], ["nvfp4_quantize", [128, 2, 32], None]]
    assert res["fwd"] == shard + ring + full + [["reduce_", [32, 2, 64], None]] * 4
    assert res["bwd"] == shard + ring + full + [["_allgather_base_", [128, 2, 64], "nvfp4"],
                                                 ["_reduce_scatter_base_", [32, 2, 64], None]]


MXFP8 = NVFP4.replace("recipe('nvfp4')", "recipe('mxfp8')").replace('"nvfp4_quantize"', '"mxfp8_quantize"')


@pytest.mark.parametrize("name", ["mxfp8", "blockwise"])
def test_block_scaled_fp8_quantizes_both_copies_without_an_amax(name):
    """The same layers under --fp8-recipe mxfp8 (or blockwise): each block's scale comes from the
    block, so every cast is one quantize writing both copies, with no amax pass, no TP amax
    all-reduce and no transpose; the ring exchanges move both copies with their scales (mxfp8x2),
    the column layer's backward re-gather the column-wise one (mxfp8)."""
    res = run_fake(MXFP8.replace("recipe('mxfp8')", f"recipe('{name}')"), rank=1, world=4)
    ring = [["broadcast_", [32, 2, 64], "mxfp8x2"]] * 4
    assert res["fwd"] == [["mxfp8_quantize", [32, 2, 64], None]] + ring + [["mxfp8_quantize", [128, 2, 32], None]] \
        + [["reduce_", [32, 2, 64], None]] * 4
    assert res["bwd"] == [["mxfp8_quantize", [32, 2, 64], None]] + ring + [
        ["mxfp8_quantize", [128, 2, 32], None], ["_allgather_base_", [128, 2, 64], "mxfp8"],
        ["_reduce_scatter_base_", [32, 2, 64], None]]


def test_fp8_recipe_names_are_checked():
    from models.layers import fp8 as te_fp8
    with pytest.raises(ValueError, match="unknown fp8 recipe 'mxfp4'; valid recipes: delayed, tensorwise, mxfp8, "
                                         "blockwise, nvfp4"):
        with te_fp8.recipe("mxfp4"):
            pass
    assert not te_fp8.current_scaling()


PIPE8 = """
from models.layers.linear import RowParallelLinear
g = dist.new_group(list(range(8)))
row = RowParallelLinear(128, 64, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                        init_std=0.02, tp_comm_overlap=True)
x = torch.randn(128, 2, 16, dtype=torch.bfloat16)  # s = 128 (16 rows per TP rank), b = 2, f/tp = 16
log = OpLog()
with log:
    y, _ = row(x)
result = [[o["name"].split(".")[1], o["shapes"][0]] for o in log.ops if o["name"].startswith(("c10d.", "aten.mm"))]
"""


def test_pipelined_reduce_scatter_cuts_the_gemm_into_te_num_splits():
    """TP 8: TE's 4 pipeline splits of 2 regions each: a GEMM on 64 rows (2 regions x 16 rows x b 2),
    then the reduces of its two regions to their owners; 4 GEMMs, 8 reduces in all."""
    from models.layers.tp_overlap import pipeline_chunks
    assert pipeline_chunks(8) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert pipeline_chunks(4) == [range(i, i + 1) for i in range(4)]
    assert pipeline_chunks(2) == [range(0, 1), range(1, 2)] and pipeline_chunks(6) == [range(i, i + 1) for i in range(6)]
    res = run_fake(PIPE8, rank=3, world=8)
    assert res == [["mm", [64, 16]], ["reduce_", [16, 2, 64]], ["reduce_", [16, 2, 64]]] * 4


AGG = """
from models.layers.linear import ColumnParallelLinear, RowParallelLinear
g = dist.new_group([0, 1, 2, 3])
col = ColumnParallelLinear(64, 128, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                           init_std=0.02, tp_comm_overlap=True, tp_comm_aggregate=True)
row = RowParallelLinear(128, 64, tp_group=g, sequence_parallel=True, bias=False, dtype=torch.bfloat16,
                        init_std=0.02, tp_comm_overlap=True, tp_comm_aggregate=True)
x = torch.randn(32, 2, 64, dtype=torch.bfloat16, requires_grad=True)
keep = ("c10d.", "aten.mm", "aten.copy_")
log = OpLog()
with log:
    h = col(x)
fwd = [[o["name"].split(".")[1], o["shapes"][0]] for o in log.ops if o["name"].startswith(keep)]
y, _ = row(h)
log = OpLog()
with log:
    y.backward(torch.ones_like(y))
bwd = [[o["name"].split(".")[1], o["shapes"][0]] for o in log.ops if o["name"].startswith(keep)][:7]
result = dict(fwd=fwd, bwd=bwd)
"""


def test_aggregate_ring_exchange_takes_two_regions_per_gemm():
    """TP 4, TE's aggregate: the column forward copies its 32 rows, broadcasts regions 0 and 1, then
    regions 2 and 3 travel under the GEMM on 0-1 (128 rows = 2 regions x 32 x b 2), and a second
    GEMM on 2-3; the row backward gathers grad_out the same way under its data-gradient GEMMs."""
    res = run_fake(AGG, rank=1, world=4)
    bcast, gemm = ["broadcast_", [32, 2, 64]], ["mm", [128, 64]]
    assert res["fwd"] == [["copy_", [32, 2, 64]], bcast, bcast, bcast, bcast, gemm, gemm]
    assert res["bwd"] == [["copy_", [32, 2, 64]], bcast, bcast, bcast, bcast, gemm, gemm]
