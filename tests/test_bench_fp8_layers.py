"""benchmarks/bench_fp8_layers.py: the per-rank GEMM shapes of a TP-sharded layer, counted by hand, and
the code path on the CPU (its times mean nothing there)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_fp8_layers as b  # noqa: E402


def test_llama70b_tp4_linears():
    """Llama 3.1 70B, TP 4, 4096 tokens: QKV 8192 -> (8192 + 2 x 8 x 128) / 4 = 2560; projection
    8192 / 4 -> 8192; FC1 8192 -> 2 x 28672 / 4 = 14336 (SwiGLU); FC2 28672 / 4 = 7168 -> 8192."""
    assert b.linears(*b.MODELS["llama3.1-70b"]) == {
        "qkv": (4096, 8192, 2560), "proj": (4096, 2048, 8192), "fc1": (4096, 8192, 14336), "fc2": (4096, 7168, 8192)}


def test_gpt3_tp4_linears_ungated():
    """GPT-3 175B, TP 4, MHA: QKV 12288 -> 3 x 12288 / 4 = 9216; FC1 12288 -> 49152 / 4 = 12288 (GeLU)."""
    lin = b.linears(*b.MODELS["gpt3-175b"])
    assert lin["qkv"] == (2048, 12288, 9216) and lin["fc1"] == (2048, 12288, 12288)


def test_gemm_passes():
    """Forward (m, n, k); dgrad (m, k, n); wgrad (n, k, m) as (M, N, K)."""
    assert [b.gemm_mnk(4096, 8192, 2560, p) for p in b.PASSES] == [(4096, 2560, 8192), (4096, 8192, 2560), (2560, 8192, 4096)]


def test_unknown_model():
    assert b.main(["--models", "gpt-5"]) == 2


def test_tiny_on_cpu(tmp_path, capsys):
    """The whole code path on the CPU: every GEMM in both dtypes and accumulation modes, the loops."""
    out = tmp_path / "r.json"
    assert b.main(["--device", "cpu", "--tiny", "--repeats", "2", "--pause-s", "0", "--run-s", "0.01",
                   "--soak-s", "0", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["schema_version"] == 1
    (m,) = r["models"]
    assert len(m["gemms"]) == 12 and set(m["sustained"]) == {"bf16", "fp8", "bf16+attn", "fp8+attn"}
    assert all(g["fp8_te_s"] == (g["fp8_fast_s"] if g["pass"] == "fprop" else g["fp8_split_s"]) for g in m["gemms"])
    assert "sustained fp8/bf16" in capsys.readouterr().out
