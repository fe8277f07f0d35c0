"""benchmarks/bench_captured.py: the captured jobs' layouts, counted by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_captured import JOBS, job_inputs  # noqa: E402

from models.args import parse_args  # noqa: E402


def _flag(flags, name, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


@pytest.mark.parametrize("name,world,tp,pp,vpp_layers,micro", [
    ("gpt3-175b-1024", 1024, 8, 8, None, 96),          # DP 16, 1536 / 16 micro-batches
    ("megascale-175b-12288", 12288, 8, 8, "2", 32),    # DP 192: 6144 / 192; 96 / 8 / 2 = VPP 6
    ("mtnlg-530b-11200", 11200, 8, 35, "1", 280),      # DP 40: 11200 / 40; 105 / 35 = VPP 3
    ("gpt-1t-3072", 3072, 8, 64, None, 512),           # DP 6: 3072 / 6
])
def test_layouts(name, world, tp, pp, vpp_layers, micro):
    w, cluster, flags = job_inputs(name)
    assert (w, cluster) == (world, "dgx-a100")
    assert int(_flag(flags, "--tensor-model-parallel-size", 1)) == tp
    assert int(_flag(flags, "--pipeline-model-parallel-size", 1)) == pp
    assert _flag(flags, "--num-layers-per-virtual-pipeline-stage") == vpp_layers
    dp = world // (tp * pp)
    assert dp * tp * pp == world
    assert int(_flag(flags, "--global-batch-size")) // (dp * int(_flag(flags, "--micro-batch-size", 1))) == micro
    parse_args(flags, world)  # the script accepts them at that world size


def test_case_file_jobs_read_as_validate_reads_them():
    w, cluster, flags = job_inputs("hopper-llama405b-fp8-2304")
    assert w == 2304 and isinstance(cluster, dict)  # the cluster built from the row's hardware
    assert _flag(flags, "--context-parallel-size") == "2" and _flag(flags, "--pipeline-model-parallel-size") == "9"
    assert "--fp8-format" in flags
    assert set(JOBS) >= {"hopper-gpt3-175b-fp8-2048", "hopper-llama405b-fp8-2304"}
