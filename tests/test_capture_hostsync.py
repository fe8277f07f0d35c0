"""Host syncs in capture (capture/hostsync.py): .item() runs and returns a placeholder, and the op
after every read back, .cpu() copy or torch.cuda.synchronize() is marked host_sync."""

import pytest
import torch

from capture.hostsync import placeholder
from capture_script import capture_script


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    p, trace = capture_script(tmp_path_factory.mktemp("hs") / "t", "host_syncs.py")
    assert "step 2 loss 0.000" in p.stdout  # loss.item() is 0.0 under capture
    return trace.roles[0].ops()


def test_placeholders_are_the_values_of_a_healthy_step():
    """0 / 0.0 / False; True for a bool made by all (isfinite(x).all())."""
    assert placeholder(torch.float32) == 0.0 and isinstance(placeholder(torch.bfloat16), float)
    assert placeholder(torch.int64) == 0 and isinstance(placeholder(torch.int64), int)
    assert placeholder(torch.bool) is False and placeholder(torch.bool, "aten.any.default") is False
    assert placeholder(torch.bool, "aten.all.default") is True


def test_every_read_back_marks_the_next_op(ops):
    """The kept iteration starts with the previous step's loss.item(); each of the 4 value reads
    (loss, isfinite().all(), isnan().any(), clip_grad_norm_'s nonfinite check), the .cpu() copy and
    torch.cuda.synchronize() put host_sync on the op after them, and on no other op."""
    names = [o.name for o in ops]
    reads = [i for i, n in enumerate(names) if n == "aten._local_scalar_dense.default"]
    cpu = next(i for i, o in enumerate(ops) if o.name == "aten._to_copy.default" and o.bytes_read == 64 * 64 * 4)
    assert len(reads) == 4 and reads[0] == 0
    synced = [o.id for o in ops if o.host_sync]
    assert synced == sorted([r + 1 for r in reads] + [cpu + 1])
    assert cpu == reads[2] + 1  # .cpu() right after the third read: both the read and the copy sync
    assert names[cpu + 1] == "aten.mm.default"  # after torch.cuda.synchronize(): the next forward's mm


def test_a_read_back_is_a_one_element_copy(ops):
    """.item() of an fp32 loss reads 4 bytes to the host and writes nothing on the device."""
    first = ops[0]
    assert (first.kind, first.kernel_class, first.bytes_read, first.bytes_written) == ("compute", "copy", 4, 0)
    assert first.dims == {"numel": 1}
