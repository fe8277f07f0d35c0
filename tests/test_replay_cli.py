"""``python -m replay`` (replay.__main__): simulate and clusters, outputs and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from heterosim.cluster import load_cluster
from heterosim.trace.store import write_trace
from heterosim.errors import ConfigError, UnknownGPUError
from replay.__main__ import main
from replay.simulate import simulate
from test_replay_engine import coll, comp, make_trace, wait


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """An 8-rank TP-8 trace written with capture's writer."""
    groups = {"tp": (list(range(8)), "tp", "tp")}
    rows = [comp(1e12), coll("all_reduce", "tp", 64 << 20), wait(1), comp(1e12)]
    path = tmp_path_factory.mktemp("trace") / "tiny"
    write_trace(make_trace(8, groups, [(list(range(8)), {"b": rows}, [("b", 0)])],
                           layout={"tp": 8, "global_batch_size": 4, "seq_length": 2048}), path)
    return path


def test_simulate_json_has_the_contract_keys(trace_dir, capsys):
    """--json prints one object with iteration_time_s, tflops_per_gpu, mfu and breakdown."""
    assert main(["simulate", str(trace_dir), "--cluster", "dgx-h100", "--json", "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"iteration_time_s", "tflops_per_gpu", "mfu", "breakdown"} <= set(d)
    assert d["tokens_per_s"] == pytest.approx(4 * 2048 / d["iteration_time_s"])
    assert d["cluster"] == "dgx-h100" and d["gpu_counts"] == {"H100-SXM5-80GB": 8}


def test_simulate_writes_timeline_and_plot(trace_dir, tmp_path, capsys):
    """--timeline and --plot write their files; the summary names the cluster and iteration time."""
    tl, png = tmp_path / "t.json", tmp_path / "p.png"
    assert main(["simulate", str(trace_dir), "--cluster", "dgx-a100", "--timeline", str(tl), "--plot", str(png),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dgx-a100: 8 ranks, iteration ")
    assert json.loads(tl.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_clusters_lists_the_presets(capsys):
    """`clusters` prints one line per preset; --json gives names and GPUs."""
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in ("dgx-a100", "dgx-h100", "hgx-h20", "l40s-pcie", "mixed-a100-h100"):
        assert any(line.startswith(name) for line in out.splitlines())
    assert main(["clusters", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "dgx-a100" in [p["name"] for p in d["presets"]]


def test_errors_are_one_line_and_exit_2(trace_dir, capsys):
    """Unknown preset and unavailable backend: 'error: ...' on stderr, exit status 2."""
    assert main(["simulate", str(trace_dir), "--cluster", "nope", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cluster 'nope'") and err.count("\n") == 1
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert main(["simulate", str(trace_dir), "--cluster", "dgx-a100", "--backend", "cupy"]) == 2
        assert "CuPy is not installed / no GPU: use --backend numpy" in capsys.readouterr().err


def test_world_size_mismatch_names_both_sizes(trace_dir):
    """A cluster built for 16 GPUs and an 8-rank trace: one error with both numbers and the fix."""
    with pytest.raises(ConfigError) as e:
        simulate(trace_dir, load_cluster("dgx-a100", num_gpus=16))
    assert str(e.value).startswith("the trace has world size 8 but the cluster places 16 ranks (16 GPUs)")
    assert "load_cluster(..., num_gpus=8)" in str(e.value)


def test_gpu_missing_from_the_catalogue(trace_dir):
    """A cluster whose GPU type the catalogue lacks fails before simulating, naming it."""
    import yaml
    from heterosim.cluster import preset_path

    spec = yaml.safe_load(preset_path("dgx-a100").read_text())
    for g in spec["node_groups"]:
        g["gpu"] = "Z100-FANTASY"
    with pytest.raises(UnknownGPUError, match="Z100-FANTASY"):
        simulate(trace_dir, spec)


def test_module_entry_point_runs(trace_dir):
    """`python -m replay simulate ... --json` works as a subprocess."""
    p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(trace_dir), "--cluster", "dgx-a100",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["world_size"] == 8


def test_json_output_is_byte_identical_across_runs(trace_dir, capsys):
    """Same trace, same cluster: the same bytes (no wall-clock fields in the result)."""
    outs = []
    for _ in range(2):
        assert main(["simulate", str(trace_dir), "--cluster", "dgx-a100", "--json", "--no-progress"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]


def test_overlap_slowdown_flag(trace_dir, capsys):
    """--overlap-slowdown F reaches simulate (recorded in options); the trace waits right after its
    all-reduce, so nothing overlaps and the iteration is unchanged; 1.5 is a one-line error."""
    times = {}
    for f in ("0", "0.2"):
        assert main(["simulate", str(trace_dir), "--cluster", "dgx-a100", "--json", "--no-progress",
                     "--overlap-slowdown", f]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["options"]["overlap_slowdown"] == float(f)
        times[f] = d["iteration_time_s"]
    assert times["0.2"] == pytest.approx(times["0"], rel=1e-12)
    assert main(["simulate", str(trace_dir), "--cluster", "dgx-a100", "--no-progress", "--overlap-slowdown", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: overlap_slowdown must be a fraction in [0, 1)") and err.count("\n") == 1


def test_nccl_env_flag(trace_dir, capsys):
    """--nccl-env reaches the planner: the 64 MiB TP-8 all-reduce of one DGX H100 takes NVLS by
    default and the ring with NCCL_NVLS_ENABLE=0 (slower, docs/nccl.md §5); a word that is not
    NCCL_NAME=VALUE is a one-line error."""
    times = {}
    for env in ([], ["--nccl-env", "NCCL_NVLS_ENABLE=0"]):
        assert main(["simulate", str(trace_dir), "--cluster", "dgx-h100", "--json", "--no-progress", *env]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["options"]["nccl_env"] == ({"NCCL_NVLS_ENABLE": "0"} if env else {})
        times[bool(env)] = d["iteration_time_s"]
    assert times[True] > times[False]
    assert main(["simulate", str(trace_dir), "--cluster", "dgx-h100", "--no-progress", "--nccl-env", "NVLS=0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --nccl-env 'NVLS=0': give NCCL_NAME=VALUE, e.g. NCCL_ALGO=Ring\n"


ACME = {"name": "ACME-X1", "vendor": "acme", "arch": "acme1", "compute_capability": 0,
        "peak_TFLOPs": {"fp32": 10.0, "tf32": 20.0, "bf16": 50.0, "fp16": 50.0, "fp8": 100.0},
        "hbm_bw_GBps": 800, "memory_GiB": 32, "sm_count": 64, "l2_MiB": 16, "nvlink_bw_GBps": 0,
        "pcie_bw_GBps": 32, "tdp_W": 300, "sources": "a test accelerator: figures chosen by hand"}


def _mixed_ethernet(second_gpu: str, gpus: list | None = None) -> dict:
    """Two 8-GPU PCIe nodes over 25 Gb/s Ethernet (one NIC per node): V100 and ``second_gpu``."""
    box = {"gpus_per_node": 8, "pcie": {"gen": 3}, "nics": {"count": 1, "bw_Gbps": 25}}
    spec = {"schema_version": 1, "name": "v100-plus", "node_types": {"box": box},
            "node_groups": [{"name": "old", "gpu": "V100", "node_type": "box", "nodes": 1},
                            {"name": "new", "gpu": second_gpu, "node_type": "box", "nodes": 1}],
            "fabric": {"kind": "leaf_spine", "nodes_per_leaf": 2}}
    if gpus:
        spec["gpus"] = gpus
    return spec


@pytest.mark.parametrize("second, gpus", [("T4", None), ("ACME-X1", [ACME])])
def test_pipeline_across_gpu_types_on_ethernet(second, gpus):
    """A 16-stage 1F1B pipeline, stages 0-7 on V100, 8-15 on T4 or on an accelerator defined only
    in the cluster file: each stage computes at its own GPU's price (hand check: m x (fwd + bwd));
    host=False: the host's dispatch (tests/test_replay_host.py) would add its first-op stall."""
    from test_replay_reference import one_f_one_b

    m = 4
    spec = _mixed_ethernet(second, gpus)
    r = simulate(one_f_one_b(16, m), spec, overlap_slowdown=0.0, host=False)
    assert r.gpu_counts == {"V100-SXM2-32GB": 8, second: 8}
    cluster = load_cluster(spec, num_gpus=16)
    from kernel_db import Pricer
    from heterosim.trace.ir import Op

    from replay.simulate import job_catalogue

    pricer = Pricer(None, job_catalogue(cluster))  # the T4s (power-capped) at the slowest of their 8
    for rank, gpu in ((0, "V100-SXM2-32GB"), (15, second)):
        f, b = (pricer.price(Op(id=0, kind="compute", name="aten.mm.default", kernel_class="gemm", phase=ph,
                                flops=fl, flops_full=fl, dtype="bf16"), gpu).seconds for ph, fl in (("fwd", 1e12), ("bwd", 2e12)))
        c = next(c for c in r.classes if rank in c.ranks)
        assert c.gpu_type == cluster.catalogue.get(gpu).name
        assert c.breakdown.compute_s == pytest.approx(m * (f + b), rel=1e-9)


def test_a_cluster_file_cannot_redefine_a_registered_gpu():
    with pytest.raises(ConfigError, match=r"GPU name 'T4' is already in the GPU registry \(T4\); give the "
                                          r"accelerator a name of its own"):
        load_cluster(_mixed_ethernet("T4", [dict(ACME, name="T4")]), num_gpus=16)


def test_output_into_a_closed_pipe_is_quiet(trace_dir):
    """``replay simulate T --json | head -0``: the reader is gone before we write; no traceback, exit 0."""
    import os

    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "replay", "simulate", str(trace_dir), "--cluster", "dgx-a100",
                        "--json", "--no-progress"], stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    assert (p.returncode, p.stderr) == (0, "")
