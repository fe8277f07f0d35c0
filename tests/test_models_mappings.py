"""Tests of ``models.layers.mappings`` plus the fake-world harness the other model tests share.

The harness runs a snippet in a fresh Python process (a process can init the process group only
once) as rank ``rank`` of a fake world, under FakeTensorMode, with :class:`OpLog` listing every
aten / c10d op it sees together with the annotator's current phase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# harness (imported by the child process and by the other tests)

PRELUDE = """
import sys, json
sys.path.insert(0, {tests!r})
from test_models_mappings import *
torch.set_num_threads(1)  # tiny tensors: threads only contend on a loaded 2-core machine
"""


def run_fake(body: str, *, rank: int, world: int, timeout: int = 120) -> dict:
    """Run ``body`` as ``rank`` of a fake world; ``body`` sets ``result`` (JSON-able)."""
    code = PRELUDE.format(tests=str(ROOT / "tests")) + textwrap.dedent(f"""
        init_fake({rank}, {world})
        result = None
        with fake_mode():
        """) + textwrap.indent(textwrap.dedent(body), "    ") + "\nprint('RESULT' + json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode:
        raise AssertionError(f"child failed:\n{proc.stderr[-6000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


GLOO = """
import os, sys, json
sys.path.insert(0, {tests!r})
import torch, torch.distributed as dist
torch.set_num_threads(1)

def main(rank, world, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = None
{body}
    if rank == 0:
        open(out_path, "w").write(json.dumps(result))

if __name__ == "__main__":
    torch.multiprocessing.start_processes(main, args=({world}, {port}, {out!r}), nprocs={world},
                                          start_method="fork")
"""


def run_gloo(body: str, *, world: int, tmp_path: Path, timeout: int = 120):
    """Run ``body`` (sees ``rank``, ``world``; sets ``result``) on ``world`` real gloo ranks
    (forked processes); returns rank 0's ``result``."""
    out = tmp_path / "result.json"
    port = 20000 + (os.getpid() * 7 + len(str(tmp_path))) % 20000
    code = GLOO.format(tests=str(ROOT / "tests"), body=textwrap.indent(textwrap.dedent(body), "    "),
                       world=world, port=port, out=str(out))
    script = tmp_path / "gloo_job.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"gloo job failed:\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def init_fake(rank: int, world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


@contextmanager
def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


try:  # the harness classes need torch; the tests below import it anyway
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from heterosim.annotate import Annotator, set_annotator

    class PhaseAnnotator(Annotator):
        """Keeps the innermost phase / gemm dtype so :class:`OpLog` can tag ops with it."""

        def __init__(self) -> None:
            self.phase = "fwd"
            self.gemm_dtype = None
            self.comm_dtype = None
            self.labels: dict[tuple[int, ...], str] = {}

        def label_group(self, group, dim):
            self.labels[tuple(dist.get_process_group_ranks(group))] = dim

        @contextmanager
        def scope(self, *, phase=None, mb=None, chunk=None, gemm_dtype=None, comm_dtype=None, sm_margin=None,
                  region=None):
            old = (self.phase, self.gemm_dtype, self.comm_dtype)
            self.phase = phase or self.phase
            self.gemm_dtype = gemm_dtype or self.gemm_dtype
            self.comm_dtype = comm_dtype or self.comm_dtype
            try:
                yield
            finally:
                self.phase, self.gemm_dtype, self.comm_dtype = old

    def _nbytes(x) -> int:
        return sum(t.numel() * t.element_size() for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))

    class OpLog(TorchDispatchMode):
        """Lists ops as dicts: name, shapes, dtype, phase, gemm_dtype, comm_dtype; c10d ops add ranks, bytes."""

        def __init__(self, annotator: PhaseAnnotator | None = None) -> None:
            super().__init__()
            self.ann = annotator
            self.ops: list[dict] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func)
            if name.startswith("prim."):
                return out
            rec = {"name": name,
                   "shapes": [list(t.shape) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)],
                   "phase": self.ann.phase if self.ann else None,
                   "gemm_dtype": self.ann.gemm_dtype if self.ann else None,
                   "comm_dtype": self.ann.comm_dtype if self.ann else None}
            if func.namespace == "c10d":
                for i, a in enumerate(func._schema.arguments):
                    v = args[i] if i < len(args) else kwargs.get(a.name)
                    if "ProcessGroup" in str(a.type) and v is not None:
                        rec["ranks"] = dist.get_process_group_ranks(dist.ProcessGroup.unbox(v))
                short = func._overloadpacket.__name__
                if short in ("_allgather_base_", "_reduce_scatter_base_", "alltoall_base_"):
                    rec["bytes"] = _nbytes(args[0]) if short == "_allgather_base_" else _nbytes(args[1])
                else:
                    rec["bytes"] = _nbytes(args[0])
            self.ops.append(rec)
            return out

    def comm_ops(ops: list[dict]) -> list[tuple[str, int, str]]:
        """(short name, bytes, phase) of the c10d ops in ``ops``."""
        return [(o["name"].split(".")[1], o["bytes"], o["phase"]) for o in ops if o["name"].startswith("c10d.")]

    def gemm_flops(ops: list[dict]) -> int:
        """2*m*n*k summed over mm / addmm / bmm ops."""
        total = 0
        for o in ops:
            n = o["name"]
            if n.startswith("aten.mm."):
                (m, k), (_, nn_) = o["shapes"][:2]
                total += 2 * m * k * nn_
            elif n.startswith("aten.addmm."):
                (m, k), (_, nn_) = o["shapes"][1:3]
                total += 2 * m * k * nn_
            elif n.startswith("aten.bmm."):
                (b, m, k), (_, _, nn_) = o["shapes"][:2]
                total += 2 * b * m * k * nn_
        return total

    __all__ = ["run_fake", "run_gloo", "init_fake", "fake_mode", "PhaseAnnotator", "OpLog", "comm_ops",
               "gemm_flops", "set_annotator", "torch", "dist"]
except ImportError:  # pragma: no cover
    pass


# ---------------------------------------------------------------------------------------------
# tests of models.layers.mappings


def test_tp_mappings_issue_megatron_collectives():
    """copy/reduce/scatter/gather/reduce-scatter issue the collectives of Megatron's table."""
    res = run_fake("""
        from models.layers import mappings as M
        g = dist.new_group([0, 1, 2, 3])
        x = torch.randn(8, 2, 16, dtype=torch.bfloat16, requires_grad=True)
        log = OpLog()
        out = {}
        for fn in ("copy_to_tp", "reduce_from_tp", "scatter_to_sp", "gather_from_sp", "reduce_scatter_to_sp"):
            log.ops.clear()
            with log:
                y = getattr(M, fn)(x, g)
                fwd = comm_ops(log.ops)
                log.ops.clear()
                y.sum().backward()
                bwd = comm_ops(log.ops)
            out[fn] = [fwd, bwd, list(y.shape)]
        result = out
    """, rank=1, world=4)
    nb = 8 * 2 * 16 * 2
    assert res["copy_to_tp"] == [[], [["allreduce_", nb, None]], [8, 2, 16]]
    assert res["reduce_from_tp"] == [[["allreduce_", nb, None]], [], [8, 2, 16]]
    assert res["scatter_to_sp"] == [[], [["_allgather_base_", nb, None]], [2, 2, 16]]
    assert res["gather_from_sp"] == [[["_allgather_base_", 4 * nb, None]], [["_reduce_scatter_base_", 4 * nb, None]], [32, 2, 16]]
    assert res["reduce_scatter_to_sp"] == [[["_reduce_scatter_base_", nb, None]], [["_allgather_base_", nb, None]], [2, 2, 16]]


def test_mappings_identity_for_single_rank_group():
    """A group of one rank issues no collective (Megatron skips them at tp == 1)."""
    import torch

    from models.layers import mappings as M

    x = torch.randn(4, 3)
    for fn in ("copy_to_tp", "reduce_from_tp", "scatter_to_sp", "gather_from_sp", "reduce_scatter_to_sp"):
        assert getattr(M, fn)(x, None) is x
