"""Hugging Face LlamaForCausalLM built from a config, captured unchanged: under DDP
(examples/hf_llama_ddp.py) and under FSDP2 (examples/hf_llama_fsdp.py).

Needs the ``hf`` extra (transformers); skipped without it. Parameters of a Llama with untied
embeddings: 2 V h (embedding, head) + h (final norm) + per layer 2 h^2 (q, o) + 2 h kv d (k, v,
d = h / heads) + 3 h f (gate, up, down) + 2 h (norms).
"""

import os
import subprocess
import sys
from math import ceil
from pathlib import Path

import pytest

from heterosim.trace.ir import flop_totals
from heterosim.trace.store import load_trace

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
HEADS, KV, L, S, B, WORLD = 4, 2, 2, 128, 2, 8


def capture(out, script, h, f, v, *extra):
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", str(WORLD), *extra, "-o", str(out),
                        str(ROOT / "examples" / script), "--layers", str(L), "--hidden", str(h), "--heads", str(HEADS),
                        "--kv-heads", str(KV), "--ffn", str(f), "--vocab", str(v), "--seq", str(S), "--batch", str(B)],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return load_trace(out)


def llama_model_flops(h: int, f: int, v: int) -> int:
    """Model FLOPs of one iteration of the Llama, all ranks, derived by hand.

    A GEMM of m x k by k x n is 2 m k n FLOPs. Per layer forward, with h_kv = KV d the k and v
    width (grouped-query attention, d = h / heads): the projections q (h -> h), k and v
    (h -> h_kv each), o (h -> h): 2 s (h (h + 2 h_kv) + h h); SwiGLU gate, up (h -> f) and down
    (f -> h): 2 s 3 h f; attention QK^T and PV 2 s^2 h each (every query head does its own dot
    products; GQA shares only k and v): 4 s^2 h. The head: 2 s h V (HF computes logits at every
    position; the shifted loss ignores the last one after the GEMM). Backward is twice forward:
    B (3 l (2 s (h (h + 2 h_kv) + h h + 3 h f) + 4 s^2 h) + 3 (2 s h V)) per rank. Against what
    the Megatron convention assumes: SDPA runs causal and is counted full, as the formula does;
    nothing is recomputed; RMSNorm, RoPE, SiLU x up and the embedding lookup are not GEMMs, in
    neither. No adjustment term.
    """
    hkv = KV * (h // HEADS)
    layer = 2 * S * (h * (h + 2 * hkv) + h * h + 3 * h * f) + 4 * S * S * h
    return B * (3 * L * layer + 3 * 2 * S * h * v) * WORLD


def test_llama_ddp_allreduce_is_parameter_bytes_and_flops_the_formula(tmp_path):
    """bf16 parameters, so DDP all-reduces 2 bytes each; model FLOPs within 2% of
    :func:`llama_model_flops` (4.077e9 per rank, 3.2615e10 over 8 ranks here)."""
    h, f, v = 256, 704, 4096
    t = capture(tmp_path / "t", "hf_llama_ddp.py", h, f, v, "--iterations", "2")
    params = 2 * v * h + h + L * (2 * h * h + 2 * h * KV * (h // HEADS) + 3 * h * f + 2 * h)
    ops = t.roles[0].ops()
    assert sum(o.comm_bytes for o in ops if o.collective == "all_reduce") == 2 * params
    assert flop_totals(t)["model"] == pytest.approx(llama_model_flops(h, f, v), rel=0.02)


def padded(dim0: int, rest: int = 1) -> int:
    """Elements of a parameter as FSDP2 gathers it: dim 0 split in WORLD chunks of ceil(dim0 /
    WORLD) rows (torch.chunk), the last ones padded up to that, so ceil(dim0 / WORLD) WORLD rest."""
    return ceil(dim0 / WORLD) * WORLD * rest


def test_llama_fsdp2_volumes_are_the_padded_shards_and_flops_the_formula(tmp_path):
    """fully_shard per decoder layer and the root, fp32 parameters, bf16 all-gathers, fp32
    reduce-scatters (MixedPrecisionPolicy). Sizes chosen so that dim-0 padding shows: at 8 ranks
    the vocabulary 4093 pads to 4096 rows (embedding and head), the SwiGLU width 700 to 704 rows
    (gate and up; down is [h, f], dim 0 h = 256 unpadded).

    Root (embedding, head, final norm): 2 x 4096 x 256 + 256 = 2,097,408 elements; a layer: q, o
    2 x 256^2, k, v 2 x 128 x 256, gate, up 2 x 704 x 256, down 256 x 700, two norms 2 x 256:
    736,768 (734,208 unpadded). The root is gathered once (it stays unsharded after forward),
    each layer twice (forward, backward): all-gather 2 (root + 2 l layer) = 10,088,960 bytes per
    rank; every gradient is reduce-scattered once in fp32: 4 (root + l layer) = 14,283,776.
    Model FLOPs: :func:`llama_model_flops`, within 2%: FSDP2 changes what moves, not the GEMMs.
    """
    h, f, v = 256, 700, 4093
    t = capture(tmp_path / "t", "hf_llama_fsdp.py", h, f, v, "--iterations", "2")
    hkv = KV * (h // HEADS)
    root = 2 * padded(v, h) + padded(h)
    layer = 2 * padded(h, h) + 2 * padded(hkv, h) + 2 * padded(f, h) + padded(h, f) + 2 * padded(h)
    assert (root, layer) == (2_097_408, 736_768)
    ops = t.roles[0].ops()
    ag = [o for o in ops if o.collective == "all_gather"]
    rs = [o for o in ops if o.collective == "reduce_scatter"]
    assert sum(o.comm_bytes for o in ag) == 2 * (root + 2 * L * layer)
    assert sum(o.comm_bytes for o in rs) == 4 * (root + L * layer)
    assert {t.groups[o.group].dim for o in ag + rs} == {"dp"}  # mesh dim "dp_shard"
    assert flop_totals(t)["model"] == pytest.approx(llama_model_flops(h, f, v), rel=0.02)
