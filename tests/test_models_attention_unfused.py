"""Tests of ``models.layers.unfused_attention`` (Megatron-LM 2020-21 core attention) and of the
``--attention-backend`` / ``--attention-dropout`` flags, at one rank with real tensors."""

from __future__ import annotations

import importlib
import math
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from fake_env import TagAnnotator
from heterosim.errors import ConfigError
from heterosim import annotate
from models.args import parse_args
from models.config import ModelConfig
from models.layers.attention import SelfAttention, core_attention
from models.layers import megatron_ops
from models.layers.megatron_ops import scaled_upper_triang_masked_softmax
from models.layers.unfused_attention import CoreAttention

SOLO = SimpleNamespace(tp_size=1, cp_size=1, sequence_parallel=False, tp_group=None, async_tp_allreduce=True,
               tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OpLog(TorchDispatchMode):
    """Names of the data-moving aten ops (views and allocations left out), with the phase tag."""

    SKIP = {"empty", "detach", "sum", "ones_like", "expand"}

    def __init__(self, ann: TagAnnotator | None = None) -> None:
        super().__init__()
        self.ann, self.ops = ann, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if not func.is_view and name not in self.SKIP and name != "_unsafe_view":
            self.ops.append((name, self.ann.tags.get("phase") if self.ann else None))
        return out


def _qkv(ng: int, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return [torch.randn(8, 2, n, 16, dtype=dtype, requires_grad=True) for n in (4, ng, ng)]


@pytest.mark.parametrize("ng", [4, 2])
def test_unfused_equals_flash_forward_and_backward(ng):
    """Same q, k, v (s 8, b 2, 4 heads of 16, fp32, causal, dropout 0), MHA and GQA (2 groups):
    the unfused output and its q/k/v gradients equal the flash path's within 1e-5."""
    q, k, v = _qkv(ng)
    ref = core_attention(q, k, v)
    grad = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    out = CoreAttention(seq_length=8, dropout=0.0)(q, k, v)
    got = torch.autograd.grad(out, (q, k, v), grad)
    assert out.shape == (8, 2, 64)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


SOFTMAX = "scaled_upper_triang_masked_softmax"


def test_causal_softmax_by_hand():
    """Zero scores [1, 3, 3]: query i spreads 1/(i+1) over keys 0..i and writes exact zeros above
    the diagonal; scale multiplies the scores first (row 1 of [0, ln 2] at scale 2 is 1/5, 4/5);
    with sq 2 < sk 3 the mask stays top-left aligned."""
    probs = scaled_upper_triang_masked_softmax(torch.zeros(1, 3, 3, dtype=torch.float64))
    assert probs[0].tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]
    x = torch.tensor([[[0.0, 5.0], [0.0, math.log(2.0)]]], dtype=torch.float64)
    torch.testing.assert_close(scaled_upper_triang_masked_softmax(x, 2.0)[0],
                               torch.tensor([[1.0, 0.0], [0.2, 0.8]], dtype=torch.float64), atol=1e-15, rtol=0)
    wide = scaled_upper_triang_masked_softmax(torch.zeros(1, 2, 3, dtype=torch.float64))
    assert wide[0].tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_causal_softmax_equals_masked_softmax_forward_and_backward(scale):
    """fp32 [4, 8, 8]: output and input gradient equal the previous path, torch._masked_softmax of
    scale * x under the broadcast causal mask (mask_type 2), within 1e-5; masked gradients are 0."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, 8, requires_grad=True)
    grad = torch.randn(4, 8, 8)
    mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
    ref = torch._masked_softmax(x * scale, mask.expand(4, 8, 8), 2, 2)
    (want,) = torch.autograd.grad(ref, x, grad)
    out = scaled_upper_triang_masked_softmax(x, scale)
    (got,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert not got[:, mask].any() and not out[:, mask].any()


def test_causal_softmax_fake_meta_and_bad_input():
    """The ops run on meta tensors and under FakeTensorMode (bf16, shape and dtype kept, backward
    included); a [b, np, sq, sk] input gives one ConfigError naming the layout and the fix."""
    assert scaled_upper_triang_masked_softmax(torch.empty(2, 3, 4, device="meta")).shape == (2, 3, 4)
    with FakeTensorMode():
        x = torch.empty(2, 16, 16, dtype=torch.bfloat16, requires_grad=True)
        y = scaled_upper_triang_masked_softmax(x)
        y.sum().backward()
        assert (y.shape, y.dtype, x.grad.shape, x.grad.dtype) == ((2, 16, 16), torch.bfloat16, (2, 16, 16),
                                                                   torch.bfloat16)
    with pytest.raises(ConfigError) as exc:
        scaled_upper_triang_masked_softmax(torch.zeros(1, 2, 3, 3))
    assert str(exc.value) == ("heterosim::scaled_upper_triang_masked_softmax takes x as [attn_batches, sq, sk] "
                              "floating point, got torch.float32 of shape (1, 2, 3, 3); view [b, np, sq, sk] "
                              "scores as [b*np, sq, sk] first")


def test_registration_is_idempotent():
    """Importing the ops module again (a reload) keeps the one registered op pair, still usable."""
    before = torch.ops.heterosim.scaled_upper_triang_masked_softmax.default
    importlib.reload(megatron_ops)
    assert torch.ops.heterosim.scaled_upper_triang_masked_softmax.default is before
    assert megatron_ops.scaled_upper_triang_masked_softmax(torch.zeros(1, 2, 2))[0, 1].tolist() == [0.5, 0.5]


def test_one_kernel_per_step_forward_and_backward():
    """bf16, dropout 0.1: forward is baddbmm, Megatron's causal softmax, native_dropout, bmm and the
    [s, b, np*d] layout copy; backward is bmm x2 (of bmm), dropout and softmax backward, then
    bmm + alpha mul x2 (of baddbmm). No mask tensor op, no separate scaling, no SDPA."""
    x = torch.randn(8, 2, 4, 48, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = x.split(16, dim=-1)
    attn = CoreAttention(seq_length=8, dropout=0.1)
    with OpLog() as fwd:
        out = attn(q, k, v)
    with OpLog() as bwd:
        out.sum().backward()
    assert [n for n, _ in fwd.ops] == ["baddbmm", SOFTMAX, "native_dropout", "bmm", "clone"]
    assert [n for n, _ in bwd.ops] == ["bmm", "bmm", "native_dropout_backward", f"{SOFTMAX}_backward",
                                       "bmm", "mul", "bmm", "mul", "cat"]
    attn.eval()  # no dropout outside training
    with OpLog() as nodrop:
        attn(q, k, v)
    assert [n for n, _ in nodrop.ops] == ["baddbmm", SOFTMAX, "bmm", "clone"]


def test_dropout_scales_kept_probabilities():
    """With dropout 0.5 every probability is either dropped (0) or doubled: rows of the output
    with v = identity-like one-hot values are 0 or 2x the dropout-free probabilities."""
    torch.manual_seed(3)
    q = torch.randn(4, 1, 1, 4, dtype=torch.float64)
    k = torch.randn(4, 1, 1, 4, dtype=torch.float64)
    v = torch.eye(4, dtype=torch.float64).view(4, 1, 1, 4)  # context row = the probability row
    p = CoreAttention(seq_length=4, dropout=0.0)(q, k, v)
    d = CoreAttention(seq_length=4, dropout=0.5)(q, k, v)
    ratio = torch.where(p > 0, d / p, torch.zeros_like(p))
    assert set(ratio.flatten().round(decimals=9).tolist()) <= {0.0, 2.0}


def test_selective_recompute_reruns_core_attention_with_same_dropout():
    """Selective recompute with dropout 0.1 re-runs exactly the core attention (baddbmm, softmax,
    dropout, bmm, copy) tagged "recompute", and restores the RNG so gradients equal those of the
    run without recompute."""
    mcfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
                       attention_backend="unfused", attention_dropout=0.1)
    grads = []
    ann = TagAnnotator()
    prev = annotate.set_annotator(ann)
    try:
        for selective in (False, True):
            torch.manual_seed(0)
            attn = SelfAttention(mcfg, SOLO, dtype=torch.float64, init_std=0.2, fp8=False,
                                 selective_recompute=selective)
            x = torch.randn(8, 2, 32, dtype=torch.float64, requires_grad=True)
            torch.manual_seed(1)
            out, _ = attn(x)
            with OpLog(ann) as log:
                out.sum().backward()
            grads.append((x.grad, attn.linear_qkv.weight.grad))
    finally:
        annotate.set_annotator(prev)
    assert [n for n, ph in log.ops if ph == "recompute"] == [
        "baddbmm", SOFTMAX, "native_dropout", "bmm", "clone"]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


TINY = ["--preset", "tiny"]


def test_flags_defaults_and_model_info():
    """Defaults: auto, dropout 0, and no attention keys in the trace's model description (auto
    traces stay byte-identical); unfused and fused add both keys."""
    auto = parse_args(TINY, 1)
    assert (auto.model.attention_backend, auto.model.attention_dropout) == ("auto", 0.0)
    assert "attention_backend" not in auto.model_info()
    assert parse_args([*TINY, "--attention-backend", "fused"], 1).model_info()["attention_backend"] == "fused"
    cfg = parse_args([*TINY, "--attention-backend", "unfused", "--attention-dropout", "0.1"], 1)
    info = cfg.model_info()
    assert (info["attention_backend"], info["attention_dropout"]) == ("unfused", 0.1)


def test_config_errors():
    """Dropout with a fused kernel, unfused with CP, dropout out of range and an unknown backend each give
    one ConfigError naming the values and the fix."""
    with pytest.raises(ConfigError) as exc:
        parse_args([*TINY, "--attention-dropout", "0.1"], 1)
    assert str(exc.value) == ("--attention-dropout 0.1 needs --attention-backend unfused: the fused path "
                              "(auto) runs without attention dropout; give --attention-backend unfused or "
                              "--attention-dropout 0")
    with pytest.raises(ConfigError) as exc:
        parse_args([*TINY, "--attention-backend", "unfused", "--context-parallel-size", "2"], 2)
    assert str(exc.value) == ("--attention-backend unfused does not run with --context-parallel-size 2: "
                              "context parallelism needs a fused kernel (auto, flash or fused); give "
                              "--attention-backend auto or --context-parallel-size 1")
    with pytest.raises(ConfigError) as exc:
        parse_args([*TINY, "--attention-backend", "unfused", "--attention-dropout", "1.0"], 1)
    assert str(exc.value) == "--attention-dropout 1.0 must be in [0, 1)"
    with pytest.raises(ConfigError, match="argument --attention-backend: invalid choice: 'local'"):
        parse_args([*TINY, "--attention-backend", "local"], 1)  # argparse's wording
    with pytest.raises(ConfigError) as exc:
        ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=4, attention_backend="local").check_attention(1)
    assert str(exc.value) == "unknown attention backend 'local'; valid: auto, flash, fused, unfused"
    mcfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=4, attention_backend="unfused")
    with pytest.raises(ConfigError, match="context parallelism needs a fused kernel"):
        SelfAttention(mcfg, SimpleNamespace(**{**vars(SOLO), "cp_size": 2}), dtype=torch.float32,
                      init_std=0.02, fp8=False, selective_recompute=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_real_training_with_unfused_attention_loss_falls():
    """Real numbers (gloo, world 1, fp32): two iterations of the tiny preset with the unfused
    backend and attention dropout 0.1 run, and the loss falls from near ln(1024) = 6.93."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "RANK": "0", "WORLD_SIZE": "1"}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "models", "pretrain_gpt.py"), *TINY, "--train-iters",
                        "2", "--attention-backend", "unfused", "--attention-dropout", "0.1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    losses = [float(line.split("lm loss")[1]) for line in p.stdout.splitlines() if "lm loss" in line]
    assert len(losses) == 2
    assert abs(losses[0] - 6.93) < 0.05
    assert losses[1] < losses[0] - 0.03
