"""ncclshim.topology: the view's records, its validation and route helpers."""

import dataclasses
import gc
import weakref

import pytest

from heterosim.errors import TopologyError
from ncclshim.topology import GPU, Link, per_view
from ncclshim.view import preset_view


def test_link_model_bw_defaults_to_hardware_bw():
    """A link without nccl_bw is seen by NCCL at its hardware bandwidth."""
    a = Link(id=0, src="a", dst="b", kind="pcie", bw=31.5e9, latency=0.0)
    b = Link(id=0, src="a", dst="b", kind="pcie", bw=31.5e9, latency=0.0, nccl_bw=24e9)
    assert (a.model_bw, b.model_bw) == (31.5e9, 24e9)


def test_view_rejects_misnumbered_records():
    """GPU indices and link ids must equal their positions; bandwidths must be positive."""
    v = preset_view("dgx-a100")
    bad_gpu = dataclasses.replace(v.gpus[1], index=5)
    with pytest.raises(TopologyError, match=r"gpus\[1\] has index 5; indices must equal positions"):
        dataclasses.replace(v, gpus=(v.gpus[0], bad_gpu) + v.gpus[2:])
    bad_link = dataclasses.replace(v.links[0], bw=0.0)
    with pytest.raises(TopologyError, match=r"link 0 \(n0.gpu0->n0.nvs\) has bandwidth 0.0; must be > 0"):
        dataclasses.replace(v, links=(bad_link,) + v.links[1:])
    ghost = GPU(index=0, node=3, local_index=0, gpu_type="A100", sm=80, pcie_switch=0, cpu_socket=0)
    with pytest.raises(TopologyError, match="GPU 0 is on node 3, but there are 1 nodes"):
        dataclasses.replace(v, gpus=(ghost,) + v.gpus[1:])


def test_route_helpers():
    """A route to oneself is empty; a path's bandwidth is its slowest link, its latency the sum."""
    v = preset_view("dgx-a100", nodes=2)
    assert v.route(3, 3) == ()
    path = v.route(0, 8)
    assert v.path_bw(path) == pytest.approx(25e9)  # the HDR NIC
    assert v.path_latency(path) == pytest.approx(sum(v.links[i].latency for i in path))
    assert v.path_bw(()) == float("inf")
    assert v.fabric(9).kind == "nvswitch"


def test_per_view_value_is_built_once_and_freed_with_its_view():
    """per_view keeps what it built in the view itself: the same object for the same view and name,
    a new one for another view, and nothing once the view is gone (validate --jobs 1 replays 70
    clusters in one process)."""
    class Value:
        pass

    view = preset_view("dgx-a100", nodes=2)
    value = per_view("test", view, lambda v: Value())
    assert per_view("test", view, lambda v: 1 / 0) is value
    assert per_view("test", preset_view("dgx-a100", nodes=2), lambda v: Value()) is not value
    gone = weakref.ref(value)
    del value, view
    gc.collect()
    assert gone() is None
