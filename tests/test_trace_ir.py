"""Trace schema (heterosim.trace.ir): blocks, FLOP conventions, group families."""

from heterosim.trace.ir import Block, GroupInfo, Role, Segment, Trace, flop_totals


def _trace() -> Trace:
    blk = Block.from_rows([
        dict(kind="compute", name="aten.mm.default", kernel_class="gemm", flops=8.0, flops_full=8.0,
             dims={"m": 1, "n": 2, "k": 2, "batch": 1}),
        dict(kind="collective", name="c10d.allreduce_.default", kernel_class="comm", collective="all_reduce",
             group="1", comm_bytes=16, stream="comm:1", deps=[1]),
        dict(kind="wait", name="wait", kernel_class="comm", target=1, deps=[1]),
    ])
    attn = Block.from_rows([dict(kind="compute", name="sdpa", kernel_class="attention", phase="recompute",
                                 flops=3.0, flops_full=5.0)])
    return Trace(world_size=2, groups={"0": GroupInfo((0, 1), "world", "world"), "1": GroupInfo((0, 1), "tp", "f0")},
                 roles=[Role(0, 0, (0, 1), {"b0": blk, "b1": attn},
                             [Segment("b0", 0), Segment("b0", 1), Segment("b1", 1)])])


def test_flop_totals_follow_megatron_conventions():
    """model excludes recompute, hardware includes it (full attention); executed sums every op."""
    f = flop_totals(_trace())
    # two mm of 8 on two ranks = 32; recompute attention 5 full / 3 executed
    assert f == {"model": 32.0, "hardware": 42.0, "executed": 38.0}


def test_group_translation_by_family():
    """A captured rank's TP group maps to the family member holding another rank."""
    t = Trace(world_size=4, groups={"1": GroupInfo((0, 1), "tp", "f0"), "2": GroupInfo((2, 3), "tp", "f0")},
              roles=[])
    assert t.group_for("1", 3) == "2"
    assert t.peer_global("1", 1, 2) == 3
