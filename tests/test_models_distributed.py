"""Data-parallel gradient sync (buckets, overlap, distributed optimizer) and the mixed-precision
Adam optimizer (fp32 masters, global-norm clipping).

Fake-world tests run one rank of a small job in torch's fake process group under
FakeTensorMode and list the c10d ops; numeric tests run real fp32 tensors with no process group.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fake_env import TagAnnotator, fake_world
from models.distributed import DataParallel, ModelGradSync, default_bucket_size
from models.optimizer import MixedPrecisionAdam
from models.schedules import forward_backward

H = 64  # Linear(64, 64): 4160 params; two of them 8320 = 65 x 128 (no distributed-optimizer padding)


class Tags(TagAnnotator):
    """Phase / micro-batch scope only."""


class CommLog(TorchDispatchMode):
    """Lists c10d ops as (op, group size, bytes counted as nccl-tests' size, phase, mb)."""

    def __init__(self, ann: Tags) -> None:
        super().__init__()
        self.ann, self.ops, self.wire = ann, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            pg = next(dist.ProcessGroup.unbox(a) for a in args if isinstance(a, torch.ScriptObject))
            name = func._overloadpacket.__name__
            # all_reduce: the buffer; all_gather: the gathered output (args[0]);
            # reduce_scatter: the unscattered input (args[1]).
            t = args[1] if name == "_reduce_scatter_base_" else args[0]
            t = t[0] if isinstance(t, list) else t
            self.ops.append((name, pg.size(), t.numel() * t.element_size(),
                             self.ann.tags.get("phase"), self.ann.tags.get("mb")))
            self.wire.append(self.ann.tags.get("comm_dtype"))  # the fp8 wire scope, if any
        return func(*args, **(kwargs or {}))


def two_linears(dtype=torch.bfloat16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(H, H, dtype=dtype), nn.ReLU(), nn.Linear(H, H, dtype=dtype))


@contextlib.contextmanager
def fake_rank(rank: int, world: int):
    ann = Tags()
    log = CommLog(ann)
    with fake_world(rank, world, ann, log):
        yield log


def iteration(model, gs, m, opt=None):
    gs.zero_grad()

    def step(chunk, mb, x):
        return model(torch.randn(4, H, dtype=next(model.parameters()).dtype)).float().square().mean()

    forward_backward(step, num_microbatches=m, grad_sync=gs)
    if opt is not None:
        opt.step()


def test_default_bucket_size():
    """Megatron's bucket size is max(40M, 1M x dp) elements."""
    assert default_bucket_size(8) == 40_000_000
    assert default_bucket_size(64) == 64_000_000


def test_buckets_in_reverse_parameter_order():
    """Buckets fill from the last parameter backwards and close once they reach bucket_size;
    without overlap there is one bucket per buffer."""
    model = two_linears(torch.float32)
    names = {id(p): n for n, p in model.named_parameters()}
    dp = DataParallel(model, dp_group=None, overlap_grad_reduce=True, bucket_size=4100)
    got = [[names[id(p)] for p in b.params] for b in dp.buckets]
    assert got == [["2.bias", "2.weight"], ["0.bias", "0.weight"]]
    assert [b.numel for b in dp.buckets] == [4160, 4160]
    one = DataParallel(two_linears(torch.float32), dp_group=None, overlap_grad_reduce=False, bucket_size=4100)
    assert len(one.buckets) == 1 and one.buckets[0].numel == 8320


def test_grads_accumulate_in_buffer_over_microbatches():
    """main_grad is a view of the bucket buffer and sums all micro-batches; param.grad is dropped
    by the hook (Megatron's), never the buffer itself (real fp32 numbers)."""
    model = two_linears(torch.float32)
    ref = two_linears(torch.float32)
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    xs = [torch.randn(4, H) for _ in range(3)]
    it = iter(xs)
    gs.zero_grad()
    forward_backward(lambda c, mb, x: model(next(it)).square().mean(), num_microbatches=3, grad_sync=gs)
    for x in xs:
        (ref(x).square().mean() / 3).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad is None and p.main_grad._base is gs.chunks[0].buffers[0]
        torch.testing.assert_close(p.main_grad, q.grad)


def test_bf16_main_grads_accumulate_in_the_weight_gradient_gemm():
    """bf16 main gradients (--grad-reduce-in-bf16): a ColumnParallelLinear's weight-gradient GEMM
    accumulates into main_grad itself (addmm into the buffer, as APEX's wgrad_gemm_accum_fp16 and
    TE's fuse_wgrad_accumulation do), so its backward runs no separate add; the sum over three
    micro-batches matches autograd's (real numbers, bf16 tolerance)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from models.layers.linear import ColumnParallelLinear

    def build():
        torch.manual_seed(0)
        return ColumnParallelLinear(H, H, tp_group=None, sequence_parallel=False, bias=False,
                                    dtype=torch.bfloat16, init_std=0.02)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    model, ref = build(), build()
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    xs = [torch.randn(4, H, dtype=torch.bfloat16) for _ in range(3)]
    gs.zero_grad()
    ops = Ops()
    for x in xs:
        y = model(x).float().square().mean() / 3
        with ops:
            y.backward()
    for x in xs:
        (ref(x).float().square().mean() / 3).backward()
    assert model.weight.grad is None and model.weight.main_grad.dtype == torch.bfloat16
    torch.testing.assert_close(model.weight.main_grad, ref.weight.grad, rtol=2e-2, atol=1e-3)
    assert ops.names.count("addmm.out") == 3
    assert not [n for n in ops.names if n.startswith("add_") or n == "add.Tensor"]


def test_fp32_main_grads_sum_bf16_microbatches():
    """grad_dtype=fp32 (Megatron with --bf16): main_grad, an fp32 view of the buffer, sums every
    micro-batch's gradient and param.grad is dropped; through the hook's add for an nn.Linear and
    through the fused weight-gradient GEMM for a ColumnParallelLinear (real numbers)."""
    from models.layers.linear import ColumnParallelLinear

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(H, H, dtype=torch.bfloat16), ColumnParallelLinear(
            H, H, tp_group=None, sequence_parallel=False, bias=False, dtype=torch.bfloat16, init_std=0.02))

    model, ref = build(), build()
    gs = ModelGradSync([DataParallel(model, dp_group=None, grad_dtype=torch.float32)])
    xs = [torch.randn(4, H, dtype=torch.bfloat16) for _ in range(3)]
    it = iter(xs)
    gs.zero_grad()
    forward_backward(lambda c, mb, x: model(next(it)).float().square().mean(), num_microbatches=3,
                     grad_sync=gs)
    want = [torch.zeros(p.shape) for p in ref.parameters()]
    for x in xs:  # each micro-batch's bf16 gradient, summed in fp32
        ref.zero_grad(set_to_none=True)
        (ref(x).float().square().mean() / 3).backward()
        for w, p in zip(want, ref.parameters()):
            w += p.grad.float()
    for p, w in zip(model.parameters(), want):
        assert p.grad is None and p.main_grad._base is gs.chunks[0].buffers[0]
        assert p.main_grad.dtype == torch.float32
        torch.testing.assert_close(p.main_grad, w)


def test_dp_allreduce_bytes_equal_params_times_two():
    """Without the distributed optimizer the DP sync all-reduces params x 2 bytes (bf16 grads),
    once, after the backward pass, in phase grad_sync."""
    with fake_rank(1, 4) as log:
        model = two_linears()
        gs = ModelGradSync([DataParallel(model, dp_group=dist.group.WORLD)])
        iteration(model, gs, m=4)
    ars = [o for o in log.ops if o[0] == "allreduce_"]
    assert ars == [("allreduce_", 4, 8320 * 2, "grad_sync", None)]


def test_distributed_optimizer_reduce_scatter_and_all_gather_same_bytes():
    """With the distributed optimizer the grads are reduce-scattered and the updated params
    all-gathered, both params x 2 bytes; the norm is summed over every rank (4 bytes)."""
    with fake_rank(1, 4) as log:
        model = two_linears()
        dp = DataParallel(model, dp_group=dist.group.WORLD, use_distributed_optimizer=True)
        gs = ModelGradSync([dp])
        opt = MixedPrecisionAdam(gs, use_distributed_optimizer=True, grad_stats_group=dist.group.WORLD)
        assert sum(m.numel() for m in opt.master_params) == 8320 // 4
        iteration(model, gs, m=2, opt=opt)
    got = [(o[0], o[2], o[3]) for o in log.ops]
    assert got == [("_reduce_scatter_base_", 16640, "grad_sync"), ("allreduce_", 4, "optimizer"),
                   ("_allgather_base_", 16640, "optimizer")]


def test_distributed_optimizer_pads_buckets_to_lcm_dp_128():
    """Buckets are padded to a multiple of lcm(dp, 128) elements so every shard is equal."""
    with fake_rank(0, 3):
        model = nn.Linear(10, 10, dtype=torch.bfloat16)  # 110 params
        dp = DataParallel(model, dp_group=dist.group.WORLD, use_distributed_optimizer=True)
        assert dp.buckets[0].numel == 384  # lcm(3, 128) = 384


def test_overlapped_reduction_issued_during_last_backward():
    """With overlap_grad_reduce each bucket's all-reduce is issued from grad hooks during the
    last micro-batch's backward (tagged grad_sync, that micro-batch) and none earlier."""
    with fake_rank(2, 4) as log:
        model = two_linears()
        gs = ModelGradSync([DataParallel(model, dp_group=dist.group.WORLD, overlap_grad_reduce=True,
                                         bucket_size=4100)])
        iteration(model, gs, m=3)
    assert [(o[0], o[2], o[3], o[4]) for o in log.ops] == [
        ("allreduce_", 8320, "grad_sync", 2), ("allreduce_", 8320, "grad_sync", 2)]


def test_overlap_param_gather_gathers_in_every_first_forward():
    """With overlap_param_gather the optimizer issues no all-gather; every iteration's first
    forward (the first iteration's too, as Megatron's reset bucket groups do) gathers each bucket
    (phase fwd, micro-batch 0) before using its parameters, and none after the forward."""
    with fake_rank(0, 2) as log:
        model = two_linears()
        dp = DataParallel(model, dp_group=dist.group.WORLD, use_distributed_optimizer=True,
                          overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=4100)
        gs = ModelGradSync([dp])
        opt = MixedPrecisionAdam(gs, use_distributed_optimizer=True, clip_grad=0.0)
        iteration(model, gs, m=2, opt=opt)
        assert not gs.param_sync_pending(0)
        first = len(log.ops)
        iteration(model, gs, m=2, opt=opt)
        assert not gs.param_sync_pending(0)
    for ops in (log.ops[:first], log.ops[first:]):
        gathers = [o for o in ops if o[0] == "_allgather_base_"]
        # Two buckets of 4160 params, each padded to a multiple of lcm(2, 128): 4224 x 2 bytes.
        assert [(o[2], o[3], o[4]) for o in gathers] == [(8448, "fwd", 0), (8448, "fwd", 0)]
        assert [o[0] for o in ops].index("_allgather_base_") < [o[0] for o in ops].index("_reduce_scatter_base_")


def test_dispatch_param_sync_issues_pending_buckets_once_in_forward_order():
    """dispatch_param_sync (Megatron's param_sync_func) issues every pending bucket at once, the
    bucket the forward needs first (the last bucket) first; the forward's hooks then only wait,
    and a second dispatch or a chunk with nothing pending issues nothing."""
    with fake_rank(0, 2) as log:
        model = two_linears()
        dp = DataParallel(model, dp_group=dist.group.WORLD, use_distributed_optimizer=True,
                          overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=4100)
        gs = ModelGradSync([dp])
        gs.dispatch_param_sync(0)
        assert [o[0] for o in log.ops] == []  # nothing pending before the iteration's reset
        gs.zero_grad()
        gs.dispatch_param_sync(0)
        gs.dispatch_param_sync(0)
        assert [b.index for b in dp.buckets if b.param_issued] == [0, 1]
        assert [o[0] for o in log.ops] == ["_allgather_base_", "_allgather_base_"]
        model(torch.randn(4, H, dtype=torch.bfloat16))
        gs.param_sync_done(0)
        assert [o[0] for o in log.ops] == ["_allgather_base_", "_allgather_base_"]
        assert not gs.param_sync_pending(0)


def test_fp8_param_gather_gathers_fp8_weights_at_one_byte():
    """fp8_param_gather: the first Linear's weight is marked an fp8 weight; it gets a buffer of its
    own (Megatron-core's uint8 parameter buffer) whose all-gather runs in an fp8 wire scope: 4096
    weights (8192 B in bf16, recorded at 4096 B). The rest (64 + 4160 params, padded to 4224 =
    33 x lcm(2, 128)) gathers in bf16: 8448 B."""
    with fake_rank(0, 2) as log:
        model = two_linears()
        model[0].weight.fp8_weight = True
        dp = DataParallel(model, dp_group=dist.group.WORLD, use_distributed_optimizer=True,
                          fp8_param_gather=True)
        assert [b.fp8 for b in dp.buckets] == [True, False]  # buffers in order of first parameter
        gs = ModelGradSync([dp])
        opt = MixedPrecisionAdam(gs, use_distributed_optimizer=True, clip_grad=0.0)
        iteration(model, gs, m=1, opt=opt)
    gathers = [(o[2], w) for o, w in zip(log.ops, log.wire) if o[0] == "_allgather_base_"]
    assert sorted(gathers, key=str) == sorted([(8448, None), (8192, "fp8")], key=str)


def test_finalize_reduces_sp_norms_over_tp_and_tied_embeddings():
    """finalize all-reduces sequence-parallel norm grads over TP (one flat buffer) and the tied
    embedding grad over the embedding group, after the DP sync."""
    with fake_rank(0, 4) as log:
        model = nn.Sequential(nn.Embedding(32, H, dtype=torch.bfloat16),
                              nn.LayerNorm(H, dtype=torch.bfloat16))
        for p in model[1].parameters():
            p.sequence_parallel = True
        tp = dist.new_group([0, 1])
        emb = dist.new_group([0, 3])
        dpg = dist.new_group([0, 2])
        gs = ModelGradSync([DataParallel(model, dp_group=dpg)], tp_group=tp, sequence_parallel=True,
                           embedding_group=emb, embedding_params=[model[0].weight])
        gs.zero_grad()
        forward_backward(lambda c, mb, x: model(torch.randint(0, 32, (4,))).float().sum(),
                         num_microbatches=1, grad_sync=gs)
    assert [(o[0], o[1], o[2]) for o in log.ops] == [
        ("allreduce_", 2, (32 * H + 2 * H) * 2), ("allreduce_", 2, 2 * H * 2), ("allreduce_", 2, 32 * H * 2)]


def test_grad_norm_all_reduced_over_model_parallel_group():
    """The squared grad norm (one fp32 scalar) is all-reduced over the stats group in phase optimizer."""
    with fake_rank(0, 4) as log:
        mp = dist.new_group([0, 1])
        model = two_linears()
        gs = ModelGradSync([DataParallel(model, dp_group=None)])
        opt = MixedPrecisionAdam(gs, grad_stats_group=mp)
        iteration(model, gs, m=1, opt=opt)
    assert [(o[0], o[1], o[2], o[3]) for o in log.ops] == [("allreduce_", 2, 4, "optimizer")]


def test_adam_matches_torch_reference_with_clipping():
    """fp32 masters + clipping + AdamW give the same update as torch's clip_grad_norm_ + AdamW;
    biases get no weight decay."""
    model, ref = two_linears(torch.float32), two_linears(torch.float32)
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    opt = MixedPrecisionAdam(gs, lr=1e-2, weight_decay=0.1, clip_grad=0.05)
    decay = [p for p in ref.parameters() if p.dim() > 1]
    no_decay = [p for p in ref.parameters() if p.dim() == 1]
    ref_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=1e-2)
    for _ in range(3):
        x = torch.randn(8, H)
        gs.zero_grad()
        forward_backward(lambda c, mb, _: model(x).square().mean(), num_microbatches=1, grad_sync=gs)
        norm = opt.step()
        ref_opt.zero_grad()
        ref(x).square().mean().backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
        torch.testing.assert_close(norm, ref_norm)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_adam_state_exists_before_the_first_step():
    """AdamW's moments are allocated when the optimizer is built (zeroed, fp32 step counter), and
    the first step reuses them: no iteration, the first included, creates optimizer state."""
    model = two_linears(torch.bfloat16)
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    opt = MixedPrecisionAdam(gs, lr=1e-3)
    state = {id(p): dict(opt.adam.state[p]) for p in opt.master_params}
    assert len(state) == 4
    for p in opt.master_params:
        st = opt.adam.state[p]
        assert st["step"].dtype == torch.float32 and float(st["step"]) == 0.0
        assert st["exp_avg"].shape == p.shape and not st["exp_avg"].any() and not st["exp_avg_sq"].any()
    iteration(model, gs, m=1, opt=opt)
    for p in opt.master_params:
        st = opt.adam.state[p]
        assert float(st["step"]) == 1.0
        assert st["exp_avg"] is state[id(p)]["exp_avg"] and st["exp_avg_sq"] is state[id(p)]["exp_avg_sq"]


def test_fp32_gradients_of_a_step_are_dropped_at_the_next_iterations_start():
    """A step leaves each master an fp32 gradient (the bf16 main_grad cast up); zero_grad drops
    them all, as Megatron's optimizer.zero_grad(set_to_none) does before the next forward."""
    model = two_linears(torch.bfloat16)
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    opt = MixedPrecisionAdam(gs, lr=1e-3)
    iteration(model, gs, m=1, opt=opt)
    grads = [master.grad for _, _, master, _ in opt.slices]
    assert len(grads) == 4 and all(g is not None and g.dtype == torch.float32 for g in grads)
    assert Counter(g.numel() for g in grads) == Counter({4096: 2, 64: 2})
    opt.zero_grad()
    assert all(master.grad is None for _, _, master, _ in opt.slices)


def test_bf16_params_follow_fp32_masters():
    """bf16 model parameters are the rounded fp32 masters after a step."""
    model = two_linears(torch.bfloat16)
    gs = ModelGradSync([DataParallel(model, dp_group=None)])
    opt = MixedPrecisionAdam(gs, lr=1e-3)
    iteration(model, gs, m=2, opt=opt)
    for model_slice, _, master, _ in opt.slices:
        assert model_slice.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert torch.equal(model_slice, master.to(torch.bfloat16))
    assert Counter(m.numel() for m in opt.master_params) == Counter({4096: 2, 64: 2})


def test_flat_distributed_masters_match_per_parameter_masters():
    """The distributed optimizer's flat shard masters (norm and weight-decay masks per element)
    update parameters exactly like per-parameter masters (fp32, strong decay and clipping)."""
    results = []
    for distributed in (False, True):
        model = two_linears(torch.float32)
        gs = ModelGradSync([DataParallel(model, dp_group=None, use_distributed_optimizer=distributed)])
        opt = MixedPrecisionAdam(gs, lr=1e-2, weight_decay=0.5, clip_grad=0.05,
                                 use_distributed_optimizer=distributed)
        torch.manual_seed(1)
        norms = []
        for _ in range(3):
            x = torch.randn(8, H)
            gs.zero_grad()
            forward_backward(lambda c, mb, _: model(x).square().mean(), num_microbatches=1, grad_sync=gs)
            norms.append(opt.step())
        assert len(opt.flat if distributed else opt.slices) == (1 if distributed else 4)
        results.append(([p.detach().clone() for p in model.parameters()], norms))
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(torch.stack(results[0][1]), torch.stack(results[1][1]))
