"""What training libraries need from capture, checked without them (megatron-core's idioms).

tests/scripts/library_idioms.py runs the idioms (and asserts what the script sees); here: what
the trace holds. Covers capture/groupdesc.py, capture/extensions.py and the read-back rules of
capture/recorder.py and capture/fakecuda.py. tests/scripts/apex_optimizer.py: the apex stand-ins
(megatron-core's optimizer step as on a GPU host).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from capture.extensions import CudaExtensions, FusedAdam, batch_per_block
from capture.groupdesc import dim_of_desc
from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "library_idioms.py")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("idioms") / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "-o", str(out), SCRIPT],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return load_trace(out)


def test_described_groups_are_labelled_and_twins_kept_apart(trace):
    """TENSOR_MODEL_PARALLEL_GROUP -> tp; the two NCCL groups form one family, their gloo twins another."""
    tp = {g: i for g, i in trace.groups.items() if i.dim == "tp"}
    assert sorted(i.ranks for i in tp.values()) == [(0, 1), (0, 1), (2, 3), (2, 3)]
    families = {}
    for g, i in sorted(tp.items(), key=lambda x: int(x[0])):
        families.setdefault(i.family, []).append(i.ranks)
    assert sorted(families.values()) == [[(0, 1), (2, 3)], [(0, 1), (2, 3)]]
    ar = [o for o in trace.roles[0].ops() if o.collective == "all_reduce"]
    assert [(trace.groups[o.group].dim, o.comm_bytes) for o in ar] == [("tp", 8 * 4)]


def test_host_reads_record_no_kernel_and_object_collectives_no_traffic(trace):
    """RNG-state comparisons run on the host; all_gather_object moves nothing; torch.tensor of two
    device scalars is one stack."""
    ops = trace.roles[0].ops()
    assert not any(o.kind in ("collective", "p2p") and o.collective != "all_reduce" for o in ops)
    assert not any(o.name.startswith("aten.eq") for o in ops)
    assert sum(o.name == "aten.stack.default" for o in ops) == 1


def test_fused_kernel_stand_ins_record_one_kernel_each(trace):
    """The causal softmax is one heterosim op each way; the wgrad accumulation one fp32-out GEMM
    of 2 * 16 * 24 * 40 FLOPs."""
    ops = trace.roles[0].ops()
    names = [o.name for o in ops]
    assert names.count("heterosim.scaled_upper_triang_masked_softmax.default") == 1
    assert names.count("heterosim.scaled_upper_triang_masked_softmax_backward.default") == 1
    (gemm,) = [o for o in ops if o.name == "aten.addmm.dtype_out"]
    assert gemm.flops == 2 * 16 * 24 * 40


def test_apex_optimizer_step_is_a_few_multi_tensor_kernels(tmp_path):
    """One iteration of tests/scripts/apex_optimizer.py (4 fp32 main params in 2 groups, fp16 model
    params): the l2 norm is one _foreach_norm and the norm of the 4 norms (stacked), clipping one
    _foreach_mul_, Adam one _fused_adamw_ per group (and torch's step increment, one _foreach_add_
    per group), the main-to-model copy one _foreach_copy_ (the previous step's, first in the kept
    iteration); no per-tensor op. The 4 randn_like are the script's gradients."""
    out = tmp_path / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "2", "-o", str(out),
                        str(ROOT / "tests" / "scripts" / "apex_optimizer.py")],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    ops = [(o.name, o.phase) for o in load_trace(out).roles[0].ops()]
    assert ops == [("aten._foreach_copy_.default", "fwd")] + [("aten.randn_like.default", "fwd")] * 4 + [
        ("aten._foreach_norm.Scalar", "fwd"), ("aten.stack.default", "fwd"),
        ("aten.linalg_vector_norm.default", "fwd"), ("aten._foreach_mul_.Scalar", "fwd")] + [
        ("aten._foreach_add_.Scalar", "optimizer"), ("aten._fused_adamw_.default", "optimizer")] * 2


def test_apex_fused_adam_is_torch_adam():
    """FusedAdam(adam_w_mode=True) steps as torch's AdamW, (False) as Adam with L2 decay, from a
    state holding only the moments (megatron-core's init_state_fn for apex)."""
    for adam_w_mode, ref_cls in ((True, torch.optim.AdamW), (False, torch.optim.Adam)):
        torch.manual_seed(0)
        w, g = torch.randn(5, 3), torch.randn(5, 3)
        a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
        opt = FusedAdam([a], lr=0.1, weight_decay=0.1, adam_w_mode=adam_w_mode, bias_correction=True,
                        set_grad_none=True, capturable=False, master_weights=False)
        opt.state[a]["exp_avg"], opt.state[a]["exp_avg_sq"] = torch.zeros_like(a), torch.zeros_like(a)
        ref = ref_cls([b], lr=0.1, weight_decay=0.1)
        for _ in range(2):
            a.grad, b.grad = g.clone(), g.clone()
            opt.step()
            ref.step()
        torch.testing.assert_close(a.detach(), b.detach())
        opt.zero_grad()
        assert a.grad is None


def test_apex_stand_ins_only_where_apex_is_absent(tmp_path, monkeypatch):
    """Without apex: apex, its submodules and amp_C import the stand-ins, gone after uninstall.
    With a package named apex on the path (a real one, or the script's own), none of apex is
    stood in for."""
    if importlib.util.find_spec("apex") is not None:
        pytest.skip("apex is installed")
    ext = CudaExtensions()
    ext.install()
    try:
        from apex.optimizers import FusedAdam as Stood
        from apex.multi_tensor_apply import multi_tensor_applier
        import amp_C

        assert Stood is FusedAdam and multi_tensor_applier.chunk_size == 2048 * 32
        assert callable(amp_C.multi_tensor_l2norm) and importlib.util.find_spec("apex.optimizers") is not None
    finally:
        ext.uninstall()
    assert not any(m == "apex" or m.startswith("apex.") or m == "amp_C" for m in sys.modules)
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("OWN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ext.install()
    try:
        import apex

        assert apex.OWN and "apex.optimizers" not in sys.modules
    finally:
        ext.uninstall()
        for m in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
            del sys.modules[m]


@pytest.mark.parametrize("desc,dim", [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("DATA_PARALLEL_GROUP_GLOO", "dp"), ("EMBEDDING_GROUP", "pp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("MODEL_PARALLEL_GROUP", None), ("my group", None), (None, None),
])
def test_dim_of_desc(desc, dim):
    """Descriptions naming one dimension (gloo twins included) label it; mixed or unknown ones do not."""
    assert dim_of_desc(desc) == dim


@pytest.mark.parametrize("sk,expected", [(2048, 4), (128, 8), (16, 16), (100, 8)])
def test_batch_per_block(sk, expected):
    """128 threads per block, a warp per row (next_pow2(sk) lanes up to 32), two rows per warp up to 128:
    sk 2048 -> 4 warps x 1; 128 -> 4 x 2; 16 -> 8 x 2; 100 (pow2 128) -> 4 x 2."""
    assert batch_per_block(64, sk, 2, 4) == expected
