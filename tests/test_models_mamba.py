"""Mamba-2 mixers (models/layers/mamba.py): the chunked SSD against the recurrence, the fused op
against its steps written out, its gradient, the mixer's TP shapes and traffic, and hybrid layers."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from heterosim.errors import ConfigError
from models.config import ModelConfig
from models.layers.mamba import MambaMixer, mamba_split_conv1d_scan, ssd_reference
from test_models_mappings import run_fake

SOLO = SimpleNamespace(tp_size=1, tp_group=None, cp_size=1, sequence_parallel=False, async_tp_allreduce=True,
                       tp_comm_overlap=False, tp_comm_aggregate=(), tp_comm_sm_margin=(), tp_comm_fp8_buf=())
F64 = dict(dtype=torch.float64)


def _recurrence(x, dt, A, B, C, D):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = C_t h_t + D x_t, one step at a time."""
    b, n, H, P = x.shape
    h = torch.zeros(b, H, P, B.shape[-1], **F64)
    ys = []
    for t in range(n):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h + (dt[:, t][..., None, None] * x[:, t][..., None]
                                                             * B[:, t][:, :, None, :])
        ys.append((h * C[:, t][:, :, None, :]).sum(-1) + D[None, :, None] * x[:, t])
    return torch.stack(ys, 1)


@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 32])
def test_chunked_ssd_equals_the_recurrence(chunk):
    """13 steps in chunks of 1, 4, 5 (a partial last chunk), 13 and 32 (one padded chunk): 1e-12."""
    torch.manual_seed(0)
    b, n, H, P, N = 2, 13, 3, 4, 5
    x, B, C = torch.randn(b, n, H, P, **F64), torch.randn(b, n, H, N, **F64), torch.randn(b, n, H, N, **F64)
    dt = F.softplus(torch.randn(b, n, H, **F64))
    A, D = -torch.rand(H, **F64) - 0.5, torch.randn(H, **F64)
    assert torch.allclose(ssd_reference(x, dt, A, B, C, D, chunk), _recurrence(x, dt, A, B, C, D), atol=1e-12, rtol=0)


def _inputs(b=2, n=11, H=4, P=3, N=5, G=2, K=4):
    torch.manual_seed(1)
    d_inner, cv = H * P, H * P + 2 * G * N
    return dict(zxbcdt=torch.randn(b, n, 2 * d_inner + 2 * G * N + H, **F64), conv_weight=torch.randn(cv, K, **F64),
                conv_bias=torch.randn(cv, **F64), dt_bias=torch.randn(H, **F64), A=-torch.rand(H, **F64) - 0.5,
                D=torch.randn(H, **F64)), dict(H=H, P=P, N=N, G=G, K=K)


def test_fused_op_is_conv_silu_scan_and_gate():
    """The op = depthwise causal conv (width 4) + SiLU on [x, B, C], softplus(dt + dt_bias), the
    recurrence with each group's B / C shared by its heads, + D x, times silu(z): to 1e-12."""
    a, s = _inputs()
    H, P, N, G, K = s["H"], s["P"], s["N"], s["G"], s["K"]
    y = mamba_split_conv1d_scan(**a, chunk_size=4, headdim=P, ngroups=G)
    z, xbc, dt = torch.split(a["zxbcdt"], [H * P, H * P + 2 * G * N, H], dim=-1)
    n = xbc.shape[1]
    conv = torch.stack([sum(a["conv_weight"][:, K - 1 - j] * (xbc[:, t - j] if t >= j else 0) for j in range(K))
                        + a["conv_bias"] for t in range(n)], 1)
    x, B, C = torch.split(F.silu(conv), [H * P, G * N, G * N], dim=-1)
    per_head = lambda t: t.reshape(2, n, G, N).repeat_interleave(H // G, dim=2)  # noqa: E731
    ref = _recurrence(x.reshape(2, n, H, P), F.softplus(dt + a["dt_bias"]), a["A"], per_head(B), per_head(C), a["D"])
    assert y.shape == (2, n, H * P)
    assert torch.allclose(y, ref.reshape(2, n, H * P) * F.silu(z), atol=1e-12, rtol=0)


def test_gradient_of_the_op_matches_finite_differences():
    a, s = _inputs(n=6)
    ins = tuple(t.requires_grad_() for t in a.values())
    assert torch.autograd.gradcheck(
        lambda *t: mamba_split_conv1d_scan(*t, chunk_size=4, headdim=s["P"], ngroups=s["G"]), ins)


def test_op_refuses_sizes_that_do_not_fit():
    a, s = _inputs()
    a["zxbcdt"] = a["zxbcdt"][..., :-1]
    with pytest.raises(ConfigError, match=r"mamba_split_conv1d_scan: zxbcdt \(2, 11, 47\) must be \[b, l, 2 d_inner"):
        mamba_split_conv1d_scan(**a, chunk_size=4, headdim=s["P"], ngroups=s["G"])


def _cfg(**kw):
    base = dict(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, mamba_state_dim=8,
                mamba_head_dim=8, mamba_num_groups=2, hybrid_layer_pattern="M*-E", num_experts=2,
                normalization="RMSNorm", add_bias_linear=False)
    return ModelConfig(**{**base, **kw})


def test_mixer_parameters_and_output():
    """h 32: d_inner 64 = 8 heads of 8 (2 h / P); in_proj 2*64 + 2*2*8 + 8 = 168 outputs; conv over
    64 + 32 = 96 channels; per-head dt_bias, A_log, D; a grouped norm over 64."""
    torch.manual_seed(0)
    m = MambaMixer(_cfg(), SOLO, dtype=torch.float64, fp8=False, seed=3)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    assert shapes == {"in_proj.weight": (168, 32), "conv_weight": (96, 4), "conv_bias": (96,), "dt_bias": (8,),
                      "A_log": (8,), "D": (8,), "norm_weight": (64,), "out_proj.weight": (32, 64)}
    x = torch.randn(16, 2, 32, **F64)
    out, bias = m(x)
    assert bias is None and out.shape == (16, 2, 32) and torch.isfinite(out).all()


def test_mixer_refuses_heads_tp_does_not_divide_and_context_parallelism():
    tp3 = SimpleNamespace(**{**vars(SOLO), "tp_size": 3})
    with pytest.raises(ConfigError, match=r"Mamba heads 8 and groups 2 must be divisible by tensor-parallel size 3"):
        MambaMixer(_cfg(), tp3, dtype=torch.float32, fp8=False)
    cp = SimpleNamespace(**{**vars(SOLO), "cp_size": 2})
    with pytest.raises(ConfigError, match=r"Mamba layers do not run with context parallelism"):
        MambaMixer(_cfg(), cp, dtype=torch.float32, fp8=False)


def test_hybrid_layer_kinds_and_pattern_errors():
    c = _cfg()
    assert [c.layer_kind(i) for i in range(4)] == ["mamba", "attention", "mlp", "moe"]
    assert [c.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert ModelConfig(num_layers=2, hidden_size=8, num_attention_heads=2).layer_kind(1) == "transformer"
    with pytest.raises(ConfigError, match=r"unknown symbol 'X'; valid: M \(mamba\), \* \(attention\), - \(mlp\), E \(moe\)"):
        _cfg(hybrid_layer_pattern="M*-X").check_hybrid()
    with pytest.raises(ConfigError, match=r"--hybrid-override-pattern has 3 symbols but --num-layers is 4"):
        _cfg(hybrid_layer_pattern="M*-").check_hybrid()
    with pytest.raises(ConfigError, match=r"has MoE layers \(E\) but --num-experts is not set"):
        _cfg(num_experts=None).check_hybrid()


TP2 = """
from models import parallel_state
from models.config import ModelConfig, ParallelConfig
from models.layers.mamba import MambaMixer
ann = PhaseAnnotator(); set_annotator(ann)
ps = parallel_state.initialize(ParallelConfig(world_size=2, tp=2, sequence_parallel=True), 1)
mcfg = ModelConfig(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=16, mamba_state_dim=16,
                   mamba_head_dim=16, mamba_num_groups=2, hybrid_layer_pattern="M", add_bias_linear=False)
m = MambaMixer(mcfg, ps, dtype=torch.bfloat16, fp8=False)
x = torch.randn(8, 2, 64, dtype=torch.bfloat16, requires_grad=True)
log = OpLog(ann)
with log:
    out, _ = m(x)
    out.sum().backward()
result = dict(comm=[c[:2] for c in comm_ops(log.ops)],
              mm=[o["shapes"][:2] for o in log.ops if o["name"] == "aten.mm.default"],
              scan=[(o["name"], o["shapes"][:2]) for o in log.ops if "mamba" in o["name"]],
              tp=sorted(n for n, p in m.named_parameters() if getattr(p, "tensor_model_parallel", False)))
"""


def test_tp2_sequence_parallel_shapes_and_traffic():
    """TP 2 with SP, 16 tokens x batch 2 (8 per rank), h 64: 8 SSM heads of 16 (4 per rank), 2
    groups of state 16 (1 per rank). in_proj gathers [16, 2, 64] and writes the rank's
    64 + 64 + 2*16 + 4 = 164 columns; the op runs on [2, 16, 164] with a 64 + 32 = 96-channel conv and
    writes [2, 16, 64]; out_proj reduce-scatters [16, 2, 64]. Backward: out_proj's output gradient
    is gathered, in_proj's input gathered again for its weight gradient and its input gradient
    reduce-scattered; the four backward GEMMs are out_proj's and in_proj's dgrad and wgrad."""
    r = run_fake(TP2, rank=1, world=2)
    ag, rs = ["_allgather_base_", 16 * 2 * 64 * 2], ["_reduce_scatter_base_", 16 * 2 * 64 * 2]
    assert r["comm"] == [ag, rs, ag, ag, rs]
    assert r["mm"] == [[[32, 64], [64, 164]], [[32, 64], [64, 64]], [[32, 64], [64, 64]], [[64, 32], [32, 64]],
                       [[32, 164], [164, 64]], [[164, 32], [32, 64]]]
    assert r["scan"] == [["heterosim.mamba_split_conv1d_scan.default", [[2, 16, 164], [96, 4]]],
                         ["heterosim.mamba_split_conv1d_scan_backward.default", [[2, 16, 64], [2, 16, 164]]]]
    assert r["tp"] == ["A_log", "D", "conv_bias", "conv_weight", "dt_bias", "in_proj.weight", "norm_weight",
                       "out_proj.weight"]
