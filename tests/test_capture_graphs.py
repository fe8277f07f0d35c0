"""CUDA graphs in capture (capture/graphs.py): a graph's ops are recorded at each replay, the
first as the graph launch and the rest as launched with it; make_graphed_callables works."""

import pytest

from capture_script import capture_script


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    _, trace = capture_script(tmp_path_factory.mktemp("cg") / "t", "cuda_graphs.py")
    return trace.roles[0].ops()


def test_a_replay_is_one_launch_of_the_captured_ops(ops):
    """g.replay() appends mm, relu, sum (captured once, not recorded at capture) as one launch."""
    names = [o.name for o in ops]
    i = names.index("aten.mm.default")
    assert [(o.name, o.launch) for o in ops[i:i + 3]] == [
        ("aten.mm.default", "graph"), ("aten.relu.default", "in_graph"), ("aten.sum.default", "in_graph")]
    assert ops[i - 1].name == "aten.copy_.default" and ops[i - 1].launch == "eager"


def test_make_graphed_callables_replays_forward_and_backward_graphs(ops):
    """The graphed MLP: a forward graph (addmm, gelu, addmm) and a backward graph (6 ops), each one
    launch; the loss and the optimizer stay eager."""
    launches = [(o.phase, o.launch) for o in ops if o.launch != "eager"]
    fwd = [lc for ph, lc in launches if ph == "fwd"]
    bwd = [lc for ph, lc in launches if ph == "bwd"]
    assert fwd == ["graph", "in_graph", "in_graph"] * 2  # g's replay and the MLP's forward
    assert bwd == ["graph"] + ["in_graph"] * 6
    assert ops[-1].name == "aten._foreach_add_.List" and ops[-1].launch == "eager"
