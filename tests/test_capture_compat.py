"""What training libraries need from capture, checked without them (megatron-core's idioms).

tests/scripts/library_idioms.py runs the idioms (and asserts what the script sees); here: what
the trace holds. Covers capture/groupdesc.py, capture/extensions.py and the read-back rules of
capture/recorder.py and capture/fakecuda.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from capture.extensions import batch_per_block
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
