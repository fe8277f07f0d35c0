"""Tests of ``models.layers.cross_entropy``: Megatron's vocab-parallel cross-entropy, unfused and
fused, equals the unsplit loss at TP 1 and TP 2 (real gloo ranks), values and gradients; under
capture the fused one is four kernels and two all-reduces where the unfused one is 26 ops and three
(tests/scripts/megatron_cross_entropy.py: bf16 logits, S=64 x B=2 tokens, V=512 over TP 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from capture_script import ROOT, capture_script
from heterosim.trace.store import load_trace
from models.args import parse_args
from models.layers.cross_entropy import fused_vocab_parallel_cross_entropy, vocab_parallel_cross_entropy
from test_models_mappings import run_gloo

S, B, V, TP = 64, 2, 512, 2
T, N = S * B, S * B * V // TP  # tokens; logits elements per rank
FUSED = "inductor.triton_"


def _loss_and_grad(fn, logits, target):
    x = logits.detach().clone().requires_grad_()  # the fused loss overwrites fp32 logits
    loss = fn(x)
    loss.backward(torch.linspace(-1, 1, target.numel(), dtype=loss.dtype).view_as(target))
    return loss.detach(), x.grad


def test_fused_matches_unfused_and_torch_at_tp1():
    """fp32, TP 1: the fused loss and its logits gradient equal the unfused ones and
    ``F.cross_entropy``'s."""
    torch.manual_seed(0)
    s, b, v = 6, 2, 16
    logits, target = torch.randn(s, b, v), torch.randint(0, v, (s, b))
    ref = _loss_and_grad(lambda x: F.cross_entropy(x.view(-1, v), target.view(-1), reduction="none")
                         .view(s, b), logits, target)
    for fn in (fused_vocab_parallel_cross_entropy, vocab_parallel_cross_entropy):
        got = _loss_and_grad(lambda x: fn(x, target, None), logits, target)
        for a, e in zip(got, ref):
            torch.testing.assert_close(a, e)


def test_fused_computes_in_fp32_and_returns_the_logits_dtype():
    """bf16 logits: the loss is the fp32 loss of the same values; the gradient comes back bf16,
    the fp32 gradient rounded once."""
    torch.manual_seed(0)
    logits, target = torch.randn(6, 2, 16).bfloat16(), torch.randint(0, 16, (6, 2))
    loss, grad = _loss_and_grad(lambda x: fused_vocab_parallel_cross_entropy(x, target, None),
                                logits, target)
    want_loss, want_grad = _loss_and_grad(lambda x: vocab_parallel_cross_entropy(x, target, None),
                                          logits.float(), target)
    assert (loss.dtype, grad.dtype) == (torch.float32, torch.bfloat16)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(grad, want_grad.bfloat16(), atol=0, rtol=0)


TP2 = """
from models.layers.cross_entropy import fused_vocab_parallel_cross_entropy, vocab_parallel_cross_entropy
g = dist.new_group(list(range(world)))
torch.manual_seed(0)
V, B, S = 16, 2, 6
full = torch.randn(S, B, V, dtype=torch.float64)
target = torch.randint(0, V, (S, B))
weights = torch.arange(S * B, dtype=torch.float64).view(S, B)
ref = full.clone().requires_grad_()
ce_ref = torch.nn.functional.cross_entropy(ref.view(-1, V), target.view(-1), reduction="none").view(S, B)
(ce_ref * weights).sum().backward()
per = V // world
result = {}
for name, fn, dtype, tol in (("unfused", vocab_parallel_cross_entropy, torch.float64, 1e-12),
                             ("fused", fused_vocab_parallel_cross_entropy, torch.float32, 1e-5)):
    mine = full[..., rank * per:(rank + 1) * per].to(dtype).requires_grad_()
    ce = fn(mine.clone(), target, g)  # the fused loss overwrites fp32 logits
    (ce * weights.to(dtype)).sum().backward()
    result[name] = float((ce - ce_ref).abs().max()) / tol
    result[name + "_grad"] = float((mine.grad - ref.grad[..., rank * per:(rank + 1) * per]).abs().max()) / tol
"""


def test_unfused_and_fused_match_unsplit_at_tp2(tmp_path):
    """TP 2: each rank's loss per token and its logits gradient equal the single-rank computation:
    unfused in fp64 to 1e-12, fused (fp32 inside) to 1e-5."""
    res = run_gloo(TP2, world=2, tmp_path=tmp_path)
    assert set(res) == {"unfused", "unfused_grad", "fused", "fused_grad"}
    for key, err in res.items():
        assert err < 1.0, (key, err)


@pytest.fixture(scope="module")
def losses(tmp_path_factory):
    _, trace = capture_script(tmp_path_factory.mktemp("ce") / "t", "megatron_cross_entropy.py", world=TP)
    ops = list(trace.roles[0].ops())
    return {name: [o for o in ops if o.module == name and o.kind != "wait"] for name in ("unfused", "fused")}


def test_fused_is_four_kernels_with_hand_counted_bytes(losses):
    """Per rank (N = 32,768 logits, T = 128 tokens): ``calculate_logits_max`` reads the bf16 logits
    (2N) and writes their fp32 copy and the max (4N + 4T); ``calculate_predicted_logits`` reads them,
    the max and the int64 target, writes exp in place (4N), the mask (T), the local target (8T) and
    [predicted; sum_exp] (8T); ``calculate_cross_entropy_loss`` reads exp and that tensor (its
    sum_exp half once more as the [s, b, 1] view the division takes: capture/fusion.py's NB),
    writes the softmax in place and the loss (4N + 4T); ``calculate_gradients`` reads the softmax,
    the loss gradient, mask and target, writes the softmax in place and the bf16 gradient (6N)."""
    kernels = [o for o in losses["fused"] if o.kind == "compute"]
    assert [(o.phase, o.name[len(FUSED):]) for o in kernels] == [
        ("fwd", "red_fused.default"), ("fwd", "red_fused.default"), ("fwd", "poi_fused.default"),
        ("bwd", "poi_fused.default")]
    assert [(o.bytes_read, o.bytes_written) for o in kernels] == [
        (2 * N, 4 * N + 4 * T),
        (4 * N + 4 * T + 8 * T, 4 * N + T + 8 * T + 8 * T),
        (4 * N + 8 * T + 4 * T, 4 * N + 4 * T),
        (4 * N + 4 * T + T + 8 * T, 6 * N)]
    unfused = [o for o in losses["unfused"] if o.kind == "compute"]
    assert len(unfused) == 26 and not [o for o in unfused if o.name.startswith(FUSED)]
    moved = lambda ops: sum(o.bytes_read + o.bytes_written for o in ops)  # noqa: E731
    assert moved(kernels) < 0.45 * moved(unfused)  # 32N + 57T against about 76N


def test_fused_issues_one_all_reduce_fewer(losses):
    """Unfused: max, target logit and sum of exponentials, three [T] fp32 all-reduces; fused: the
    max, then one [2T] all-reduce of both sums."""
    comm = {name: [(o.collective, o.comm_bytes) for o in ops if o.kind == "collective"]
            for name, ops in losses.items()}
    assert comm == {"unfused": [("all_reduce", 4 * T)] * 3,
                    "fused": [("all_reduce", 4 * T), ("all_reduce", 8 * T)]}


def _capture_gpt(out, *flags):
    args = ["--preset", "tiny", "--num-layers", "1", "--bf16", "--micro-batch-size", "1",
            "--global-batch-size", "2", "--tensor-model-parallel-size", "2", *flags]
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "2", "-o", str(out),
                        str(ROOT / "models" / "pretrain_gpt.py"), *args], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return load_trace(out)


def test_pretrain_flag_fuses_the_loss_of_every_micro_batch(tmp_path):
    """pretrain_gpt.py --cross-entropy-loss-fusion (tiny: s 64, TP 2, 2 micro-batches): the loss's
    TP all-reduces per micro-batch go from 3 to 2 ([64] fp32 max, then [128] fp32), and its
    forward and backward are 3 + 1 fused kernels."""
    counts = {}
    for flag in ((), ("--cross-entropy-loss-fusion",)):
        t = _capture_gpt(tmp_path / ("on" if flag else "off"), *flag)
        loss = [o for o in t.roles[0].iter_ops() if o.module == "" and o.phase in ("fwd", "bwd")]
        counts[flag] = (Counter(o.comm_bytes for o in loss if o.kind == "collective"
                                and t.groups[o.group].dim == "tp"),
                        Counter(o.phase for o in loss if o.name.startswith(FUSED)))
    assert counts[()] == (Counter({256: 6}), Counter())
    assert counts[("--cross-entropy-loss-fusion",)] == (Counter({256: 2, 512: 2}), Counter(fwd=6, bwd=2))


def test_flag_default_off():
    """Off by default, as in Megatron-LM; ``--cross-entropy-loss-fusion`` turns it on."""
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--global-batch-size", "2"]
    assert parse_args(base, 1).model.cross_entropy_loss_fusion is False
    assert parse_args(base + ["--cross-entropy-loss-fusion"], 1).model.cross_entropy_loss_fusion is True
