"""Tests of ``models.layers.norms``: fused RMSNorm equals F.rms_norm (values and gradients) and
is one ATen kernel each way under FakeTensorMode; LayerNorm; the registry's error."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from heterosim.errors import ConfigError
from models.layers.norms import LayerNorm, RMSNorm, build_norm


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not str(func).startswith("prim."):
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_rms_norm_matches_reference_with_gradients():
    """Real tensors: output, input grad and weight grad equal F.rms_norm's (fp64)."""
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5, dtype=torch.float64, sequence_parallel=True)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(5, 3, 16, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    w_ref = norm.weight.detach().clone().requires_grad_()
    g = torch.randn(5, 3, 16, dtype=torch.float64)
    (norm(x) * g).sum().backward()
    (torch.nn.functional.rms_norm(x_ref, (16,), w_ref, 1e-5) * g).sum().backward()
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x_ref, (16,), w_ref, 1e-5))
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(norm.weight.grad, w_ref.grad)
    assert norm.weight.sequence_parallel is True


def test_norms_are_one_kernel_each_way_under_fake():
    """Fake bf16: RMSNorm is _fused_rms_norm + _fused_rms_norm_backward; LayerNorm is
    native_layer_norm + native_layer_norm_backward."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        for cls, fwd, bwd in ((RMSNorm, "aten._fused_rms_norm.default", "aten._fused_rms_norm_backward.default"),
                              (LayerNorm, "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default")):
            norm = cls(64, eps=1e-5, dtype=torch.bfloat16, sequence_parallel=False)
            x = torch.randn(8, 2, 64, dtype=torch.bfloat16, requires_grad=True)
            log = _Names()
            with log:
                y = norm(x)
                y.backward(torch.ones_like(y))
            kernels = [n for n in log.names if "norm" in n or n.startswith(("aten.pow", "aten.rsqrt", "aten.mean"))]
            assert kernels == [fwd, bwd], cls.__name__


def test_build_norm_rejects_unknown_names():
    """An unknown --normalization lists the valid ones."""
    with pytest.raises(ConfigError) as exc:
        build_norm("BatchNorm", 8, eps=1e-5, dtype=torch.float32, sequence_parallel=False)
    assert str(exc.value) == "unknown normalization 'BatchNorm'; valid: ['LayerNorm', 'RMSNorm']"
