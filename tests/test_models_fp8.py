"""models.layers.fp8.DelayedScaling without a process group: which modules count as fp8 GEMMs,
the amax histories' shapes, and the op sequence of one update (hand-counted)."""

import pytest
import torch
import torch.nn as nn

from models.layers import fp8 as te_fp8


class _Linear(nn.Module):
    def __init__(self, fp8: bool) -> None:
        super().__init__()
        self.fp8, self.weight = fp8, nn.Parameter(torch.zeros(4, 8))


class _Experts(nn.Module):  # an MoE layer: [local experts, in, out] weights
    def __init__(self) -> None:
        super().__init__()
        self.fp8 = True
        self.fc1, self.fc2 = nn.Parameter(torch.zeros(3, 8, 16)), nn.Parameter(torch.zeros(3, 16, 8))


class _Wrapper(nn.Module):  # fp8 set but no GEMM of its own (an MLP holding two linears)
    def __init__(self) -> None:
        super().__init__()
        self.fp8 = True
        self.fc1, self.fc2 = _Linear(True), _Linear(True)


def test_for_stage_counts_fp8_gemms_over_every_chunk():
    """Chunk 0: 2 fp8 linears inside a wrapper + 1 bf16 linear; chunk 1: 3 local experts x 2 weights
    + 1 fp8 linear: 2 + 6 + 1 = 9 GEMMs; histories [1024, 27] forward and [1024, 18] backward."""
    chunks = [nn.ModuleList([_Wrapper(), _Linear(False)]), nn.ModuleList([_Experts(), _Linear(True)])]
    s = te_fp8.DelayedScaling.for_stage(chunks, None)
    assert s.num_gemms == 9
    assert tuple(s.history[True].shape) == (te_fp8.AMAX_HISTORY_LEN, 27)
    assert tuple(s.history[False].shape) == (te_fp8.AMAX_HISTORY_LEN, 18)


def test_update_without_a_group_and_under_current_scaling():
    """No group: the concatenation and the history update run, no all-reduce; current scaling: nothing.
    The block input passes through unchanged, its gradient too (the backward update rides on it)."""
    s = te_fp8.DelayedScaling(2, None)
    seen = []

    class Log(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Log():
        s.forward_exit()
    assert [n for n in seen if n in ("clone", "amax", "all_reduce")] == ["clone", "amax"]
    seen.clear()
    with te_fp8.recipe("tensorwise"), Log():
        s.forward_exit()
    assert seen == []
    x = torch.ones(3, requires_grad=True)
    y = s.on_backward_end(x)
    assert torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))
    t = torch.ones(3)  # no gradient will reach it: returned as is, no autograd node
    assert s.on_backward_end(t) is t


def test_wire_widths_per_recipe_and_usage():
    """The comm dtype a collective inside ``wire`` is recorded at: plain fp8 for delayed / tensorwise
    (any usage); both packed copies, the column-wise one, or no narrowing (a GEMM output for a
    reduction, the optimizer's weight gather) for the block-scaled recipes."""
    from contextlib import contextmanager

    from heterosim.annotate import Annotator, set_annotator

    seen = []

    class Recording(Annotator):
        @contextmanager
        def scope(self, **tags):
            seen.append(tags.get("comm_dtype"))
            yield

    def tag(name, usage):
        seen.clear()
        with te_fp8.recipe(name), te_fp8.wire(True, usage):
            return seen[0] if seen else None

    old = set_annotator(Recording())
    try:
        assert [tag("delayed", u) for u in ("both", "param")] == ["fp8", "fp8"]
        assert [tag("mxfp8", u) for u in ("both", "columnwise", "output", "param")] == ["mxfp8x2", "mxfp8", None, None]
        assert [tag("nvfp4", u) for u in ("both", "columnwise")] == ["nvfp4x2", "nvfp4"]
        seen.clear()
        with te_fp8.wire(False):
            assert seen == []  # no scope opened without fp8
        with pytest.raises(ValueError, match="unknown wire usage 'column'; valid: both, columnwise, output, param"):
            te_fp8.wire(True, "column")
    finally:
        set_annotator(old)
