"""Hugging Face LlamaForCausalLM (examples/hf_llama_ddp.py) built from a config under DDP, captured unchanged.

Needs the ``hf`` extra (transformers); skipped without it. Parameters of a Llama with untied
embeddings: 2 V h (embedding, head) + h (final norm) + per layer 2 h^2 (q, o) + 2 h kv d (k, v,
d = h / heads) + 3 h f (gate, up, down) + 2 h (norms); bf16, so DDP all-reduces 2 bytes each.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from heterosim.trace.store import load_trace

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
V, H, L, F, HEADS, KV, S = 4096, 256, 2, 704, 4, 2, 128


def test_llama_ddp_allreduce_is_parameter_bytes(tmp_path):
    out = tmp_path / "t"
    p = subprocess.run([sys.executable, "-m", "capture", "--world-size", "8", "--iterations", "2", "-o", str(out),
                        str(ROOT / "examples" / "hf_llama_ddp.py"), "--layers", str(L), "--hidden", str(H),
                        "--heads", str(HEADS), "--kv-heads", str(KV), "--ffn", str(F), "--vocab", str(V),
                        "--seq", str(S), "--batch", "2"], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    params = 2 * V * H + H + L * (2 * H * H + 2 * H * KV * (H // HEADS) + 3 * H * F + 2 * H)
    ops = load_trace(out).roles[0].ops()
    assert sum(o.comm_bytes for o in ops if o.collective == "all_reduce") == 2 * params
