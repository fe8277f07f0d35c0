"""Recorder details: functional-collective waits at first use, DTensor local shapes, grouped p2p,
device queries from C++, GEMMs accumulating into their input."""

import pytest
import torch

from capture_script import capture_script


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    _, trace = capture_script(tmp_path_factory.mktemp("fd") / "t", "funcol_dtensor.py", world=4)
    return trace.roles[0].ops()


def test_funcol_wait_lands_at_first_use(ops):
    """all_reduce, then the independent mm, then the wait, then the add that reads the result."""
    names = [o.name for o in ops]
    ar = names.index("_c10d_functional.all_reduce.default")
    mm = names.index("aten.mm.default", ar)
    wait = next(o for o in ops if o.kind == "wait" and o.target == ar)
    add = names.index("aten.add.Tensor", ar)
    assert ar < mm < wait.id < add
    assert ops[ar].comm_bytes == 8 * 16 * 4 and ops[ar].collective == "all_reduce"


def test_dtensor_local_shapes(ops):
    """The matmul on the DTensor's local shard is recorded with local (per-rank) dims."""
    gemms = [o for o in ops if o.kernel_class == "gemm"]
    assert {"m": 32, "k": 32, "n": 16, "batch": 1} in [dict(o.dims) for o in gemms]
    assert all(o.dims["n"] != 64 for o in gemms)


def test_batched_p2p_is_one_grouped_launch(ops):
    """batch_isend_irecv's send and recv are tagged as one coalesced launch, with global peers in groups."""
    p2p = [o for o in ops if o.kind == "p2p"]
    assert [o.collective for o in p2p] == ["send", "recv"]
    assert p2p[1].coalesced == p2p[0].id and p2p[0].coalesced == -1
    assert p2p[0].peer == 1 and p2p[1].peer == 3 and p2p[0].comm_bytes == 64


def test_device_queries_from_cpp_are_answered_not_recorded(ops):
    """``torch.mm(x, w, out=buf)`` runs (its device checks see the fake device) and is recorded as
    one 8 x 16 x 16 GEMM; the device queries themselves leave no op."""
    mm_out = [o for o in ops if o.name == "aten.mm.out"]
    assert len(mm_out) == 1 and dict(mm_out[0].dims) == {"m": 8, "k": 16, "n": 16, "batch": 1}
    assert not any(o.name.startswith("prim.") for o in ops)


def test_an_addmm_accumulating_into_its_input_is_recorded(ops):
    """``torch.addmm(acc, x, w, out=acc)``: one 8 x 16 x 16 GEMM, as any addmm."""
    acc = [o for o in ops if o.name == "aten.addmm.out"]
    assert len(acc) == 1 and acc[0].kernel_class == "gemm"
    assert dict(acc[0].dims) == {"m": 8, "k": 16, "n": 16, "batch": 1}


def test_a_gemm_into_out_returns_it_only_when_nothing_changes():
    """``addmm(c, a, b, out=c)`` and ``mm(a, b, out=y)`` with ``c`` / ``y`` of the product's shape
    and dtype are ``c`` / ``y`` themselves (no fake kernel); an addmm into another tensor, a shape
    or dtype that does not match, is left to FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from capture.recorder import _gemm_into_out

    aten = torch.ops.aten
    with FakeTensorMode():
        c, a, b = torch.empty(8, 16), torch.empty(8, 4), torch.empty(4, 16)
        c16, a16, b16 = (t.to(torch.bfloat16) for t in (c, a, b))
        other = torch.empty(8, 16)
        wide = torch.empty(8, 5)
        rows = torch.empty(2, 8, 16)
    assert _gemm_into_out(aten.addmm.out, (c, a, b), {"out": c}) is c
    assert _gemm_into_out(aten.addmm.out, (c, a, b), {"out": other}) is None
    assert _gemm_into_out(aten.addmm.out, (c, wide, b), {"out": c}) is None
    assert _gemm_into_out(aten.addmm.out, (c, a16, b16), {"out": c}) is None
    assert _gemm_into_out(aten.addmm.dtype_out, (c, a16, b16, torch.float32), {"out": c}) is c
    assert _gemm_into_out(aten.addmm.dtype_out, (c16, a16, b16, torch.float32), {"out": c16}) is None
    assert _gemm_into_out(aten.mm.out, (a, b), {"out": rows[1]}) is not None
    assert _gemm_into_out(aten.mm.out, (a, b), {"out": rows}) is None
    assert _gemm_into_out(aten.mm.out, (a16, b16), {"out": c}) is None


def test_a_c10d_op_gives_back_its_buffers_without_the_fake_kernel():
    """broadcast_ / _allgather_base_ return (their first argument, a work): the first argument,
    with no work (the recorder makes its own); send / reduce_ return a work alone: None."""
    from capture.comm import FAKE_KERNEL, c10d_result

    c10d = torch.ops.c10d
    bufs = [torch.empty(4)]
    out = c10d_result(c10d.broadcast_.default, (bufs, "pg", 0, 0))
    assert out[0] is bufs and out[1] is None
    dst = torch.empty(8)
    assert c10d_result(c10d._allgather_base_.default, (dst, torch.empty(4), "pg"))[0] is dst
    assert c10d_result(c10d.send.default, (bufs, "pg", 1, 0)) is None
    assert c10d_result(c10d.reduce_.default, (bufs, "pg", "op", 0, 0)) is None
    assert c10d_result(torch.ops._c10d_functional.all_reduce.default, (dst, "sum", "0")) is FAKE_KERNEL


def test_wire_width_records_fp8_userbuffer_bytes():
    """``scope(comm_dtype="fp8")``: a bf16 all-gather of 8 MiB is recorded as 4 MiB of fp8, an fp32
    one of 8 MiB as 2 MiB; integer payloads and collectives outside the scope keep their size."""
    from capture.comm import CommInfo
    from capture.commrec import wire_width

    def info(dtype: str) -> CommInfo:
        return CommInfo("collective", "all_gather", 8 << 20, dtype, -1, ())

    assert (wire_width(info("bf16"), "fp8").nbytes, wire_width(info("bf16"), "fp8").dtype) == (4 << 20, "fp8")
    assert wire_width(info("fp32"), "fp8").nbytes == 2 << 20
    assert wire_width(info("int64"), "fp8").nbytes == 8 << 20
    assert wire_width(info("bf16"), None).nbytes == 8 << 20


def test_wire_width_records_nvfp4_packed_bytes():
    """An 8 MiB bf16 all-gather (4 Mi elements) in an ``nvfp4x2`` scope moves both NVFP4 copies,
    (0.5 + 1/16) x 2 bytes per element = 4.5 MiB of uint8; in ``nvfp4`` one copy, 2.25 MiB; a
    tensor of partial 16-blocks keeps its bf16 size (TE gathers it in high precision)."""
    from capture.comm import CommInfo
    from capture.commrec import wire_width

    def info(nbytes: int) -> CommInfo:
        return CommInfo("collective", "all_gather", nbytes, "bf16", -1, ())

    both = wire_width(info(8 << 20), "nvfp4x2")
    assert (both.nbytes, both.dtype) == (9 << 19, "uint8")
    assert wire_width(info(8 << 20), "nvfp4").nbytes == 9 << 18
    assert wire_width(info(2 * 24), "nvfp4").nbytes == 2 * 24


def test_overlapped_exchanges_are_recorded_once_and_every_request_is_waited(tmp_path):
    """An interleaved pipeline with --overlap-p2p-communication: each exchange block hands its open
    requests back and is recorded once per kind, then replayed; the replayed requests are waited on
    their own ops (one wait per p2p op of the expanded program, none on another kind of op)."""
    import os
    import subprocess
    import sys

    from capture_script import ROOT
    from heterosim.trace.store import load_trace

    args = ["--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "128", "--max-position-embeddings", "32", "--pipeline-model-parallel-size", "4",
            "--num-layers-per-virtual-pipeline-stage", "1", "--overlap-p2p-communication",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16"]
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "4", "-o", str(tmp_path / "t"),
                        str(ROOT / "models" / "pretrain_gpt.py"), *args], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    role = next(r for r in load_trace(tmp_path / "t").roles if 1 in r.ranks)
    p2p_blocks = {b for b, blk in role.blocks.items() if "p2p" in blk.columns["kind"]}
    uses = [s.block for s in role.program if s.block in p2p_blocks]
    assert len(uses) >= 2 * len(p2p_blocks)  # replayed far more often than recorded
    ops = role.ops()
    waited = [ops[o.target].kind for o in ops if o.kind == "wait"]
    assert set(waited) <= {"p2p", "collective"}
    targets = [o.target for o in ops if o.kind == "wait"]
    p2p_ids = [o.id for o in ops if o.kind == "p2p"]
    assert sorted(t for t in targets if ops[t].kind == "p2p") == p2p_ids
