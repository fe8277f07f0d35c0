"""The fake CUDA device (capture/fakecuda.py) and stream/event waits (capture/streams.py).

tests/scripts/cuda_streams.py asserts what a GPU script sees (device count, properties of the
target GPU, cuda tensors, memory queries); a failed assertion fails the capture. Here: where the
compute stream's waits land.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from heterosim.trace.store import load_trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "scripts" / "cuda_streams.py")
NOISE = {"aten.normal_.default", "aten.uniform_.default", "aten.randn.default", "aten._to_copy.default"}


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    out = tmp_path_factory.mktemp("cs") / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "-o", str(out), SCRIPT],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert "no iteration boundary found" in p.stderr
    return [o for o in load_trace(out).roles[0].ops() if o.name not in NOISE]


def _shape(ops):
    by_id = {o.id: i for i, o in enumerate(ops)}
    return [(o.name, by_id[o.target]) if o.kind == "wait" else o.name for o in ops]


def test_side_stream_collective_waits_at_the_event(ops):
    """all_reduce on a side stream overlaps the mm; the default stream waits where it waits on the event."""
    ar = "c10d.allreduce_.default"
    assert _shape(ops)[:4] == [ar, "aten.mm.default", ("wait", 0), "aten.add.Tensor"]
    assert ops[0].comm_bytes == 256 * 256 * 2 and ops[1].dtype == "bf16"


def test_synchronize_waits_for_outstanding_work(ops):
    """An async all_reduce never waited: torch.cuda.synchronize() makes the compute stream wait for it."""
    assert _shape(ops)[4:6] == ["c10d.allreduce_.default", ("wait", 4)]
    assert ops[4].comm_bytes == 128 * 4


def test_read_of_an_unwaited_buffer_waits_first(ops):
    """Reading k while its async all_reduce is in flight waits for it (as DDP's C++ futures do)."""
    assert _shape(ops)[6:9] == ["c10d.allreduce_.default", ("wait", 6), "aten.mul.Tensor"]


def test_only_the_bytes_in_flight_wait(ops):
    """Accumulating into another slice of the buffer does not wait; reading the slice in flight does."""
    tail = _shape(ops)[9:]
    ar = tail.index("c10d.allreduce_.default")
    assert tail[ar:] == ["c10d.allreduce_.default", "aten.add_.Tensor", ("wait", 9 + ar), "aten.sum.default"]
    assert ops[9 + ar].comm_bytes == 64 * 4


def test_unknown_gpu_is_one_clear_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "--gpu", "H1000", "-o",
                        str(tmp_path / "t"), SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "H1000" in p.stderr
    assert not (tmp_path / "t").exists()


def test_reading_a_value_says_why_and_how_to_skip_it(tmp_path):
    script = tmp_path / "item.py"
    script.write_text("import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
                      "print(torch.randint(0, 9, (4,), device='cuda').sum().item())\n")
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "2", "-o", str(tmp_path / "t"), str(script)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and "raised DataDependentOutputException as rank 0" in p.stderr
    assert p.stderr.rstrip().endswith("`if not heterosim.annotate.get_annotator().active: print(loss.item())`.")
