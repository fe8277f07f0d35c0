"""benchmarks/bench_replay.py: the synthesized Megatron-shaped traces (interleaved schedule)."""

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_replay import CASES, Shape, interleaved_steps, synth_trace  # noqa: E402


def _shape(pp, vpp, m):
    """A tiny GPT: 1 layer per chunk, TP2 DP2, m micro-batches per pipeline."""
    return Shape("tiny", pp * vpp, 256, 4, 4, 1024, 512, 128, 2, pp, 2, 2 * m, "dgx-a100", vpp=vpp)


def _p2p_counts(trace):
    """(sends, recvs) per (src stage, dst stage) over the whole program of each stage."""
    sends, recvs = Counter(), Counter()
    for role in trace.roles:
        for seg in role.program:
            cols = role.blocks[seg.block].columns
            for kind, coll, peer in zip(cols["kind"], cols["collective"], cols["peer"]):
                if kind == "p2p":
                    if coll == "send":
                        sends[(role.id, peer)] += 1
                    else:
                        recvs[(peer, role.id)] += 1
    return sends, recvs


def test_interleaved_p2p_per_stage_boundary():
    """pp 2 x vpp 2 x 4 micro-batches, as Megatron's schedule (tests/test_models_schedules.py):
    12 sends each way; pp 4 x vpp 2 x 8: 8 x 2 = 16 on each neighbouring boundary each way, and
    the wrap-around (stage 3's chunk 0 feeds stage 0's chunk 1; gradients back) 8 x 1 = 8 each way.
    Every send has its recv."""
    sends, recvs = _p2p_counts(synth_trace(_shape(2, 2, 4)))
    assert sends == recvs == Counter({(0, 1): 12, (1, 0): 12})
    sends, recvs = _p2p_counts(synth_trace(_shape(4, 2, 8)))
    assert sends == recvs == Counter({(0, 1): 16, (1, 2): 16, (2, 3): 16, (1, 0): 16, (2, 1): 16, (3, 2): 16,
                                      (3, 0): 8, (0, 3): 8})


def test_interleaved_compute_follows_megatron_order():
    """Each stage's forward/backward blocks run in models.schedules.interleaved_order, with the
    embedding only in chunk 0 of stage 0 and the output layer only in the last chunk of the last stage."""
    pytest.importorskip("torch")
    from models.schedules import interleaved_order

    pp, vpp, m = 4, 3, 8
    trace = synth_trace(_shape(pp, vpp, m))
    for role in trace.roles:
        comp = [(s.block[0].upper(), s.chunk, s.mb) for s in role.program if s.block.split(".")[0] in ("fwd", "bwd")]
        assert comp == interleaved_order(pp, role.id, m, vpp)
        kinds = {s.block for s in role.program if s.block.startswith("fwd")}
        assert kinds == {0: {"fwd.first", "fwd.mid"}, 3: {"fwd.mid", "fwd.last"}}.get(role.id, {"fwd.mid"})


def test_interleaved_exchanges_are_batched_and_waited():
    """Stage 1 of pp 4 x vpp 2 x 8, first steady step: Megatron sends the forward output next and
    the input gradient back, receives from both sides: 4 p2p ops in one coalesced launch, then 4 waits."""
    steps = interleaved_steps(4, 1, 8, 2)
    # warm-up: (4 - 1 - 1) x 2 + (2 - 1) x 4 = 8 forwards, then the first forward/backward pair
    assert sum(1 for s in steps[:steps.index(("B", 1, 0))] if s[0] == "F") == 9
    role = synth_trace(_shape(4, 2, 8)).roles[1]
    cols = role.blocks["x.sp.rp.sn.rn"].columns
    assert cols["kind"] == ["p2p"] * 4 + ["wait"] * 4
    assert cols["collective"][:4] == ["send", "recv", "send", "recv"] and cols["peer"][:4] == [0, 0, 2, 2]
    assert cols["coalesced"][:4] == [0, 1, 2, 3] and cols["target"][4:] == [4, 4, 4, 4]


@pytest.mark.parametrize("m", [8, 4])
def test_interleaved_trace_replays(m):
    """The tiny pp 4 x vpp 2 trace replays to the end (no p2p left unpaired), with 8 micro-batches
    and with 4 (= pp: every step is warm-up), and the fast engine agrees with the reference engine."""
    from replay.simulate import simulate

    trace = synth_trace(_shape(4, 2, m))
    fast = simulate(trace, "dgx-a100")
    ref = simulate(trace, "dgx-a100", engine="reference")
    assert fast.iteration_time_s > 0
    assert fast.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=1e-12)


def test_cluster_cases_interleave():
    """MegaScale's 12,288-GPU job runs VPP6 (2 layers per chunk), NVIDIA's 2,048-GPU H100 recipe
    VPP12 (1 layer per chunk); their 1F1B variants keep vpp 1."""
    assert (CASES["megascale-175b-12288"].vpp, CASES["hopper-175b-2048"].vpp) == (6, 12)
    assert CASES["megascale-175b-12288-1f1b"].vpp == CASES["hopper-175b-2048-1f1b"].vpp == 1
    with pytest.raises(ValueError, match="multiple of pp"):
        Shape("bad", 8, 256, 4, 4, 1024, 512, 128, 2, 4, 2, 12, "dgx-a100", vpp=2)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_peak_rss_is_the_replays_own_not_its_parents():
    """A child started by a parent holding 300 MB reports its own peak (well under 300 MB), where
    getrusage's ru_maxrss would carry the parent's over exec."""
    import subprocess

    held = bytearray(300_000_000)
    held[::4096] = b"\x01" * len(held[::4096])  # touch every page
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'benchmarks')!r}); "
            "from bench_replay import peak_rss_gb; print(peak_rss_gb())")
    child_gb = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert 0 < child_gb < 0.2 and len(held) == 300_000_000
