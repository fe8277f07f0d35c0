"""Tests of ``models.layers.embedding``: the vocab-parallel embedding at TP 2 (real gloo ranks)
equals the unsplit lookup, values and gradients."""

from __future__ import annotations

import pytest

from test_models_mappings import run_gloo

BODY = """
from models.layers.embedding import VocabParallelEmbedding
g = dist.new_group(list(range(world)))
torch.manual_seed(0)
V, H, B, S = 16, 8, 2, 6
table = torch.randn(V, H, dtype=torch.float64)
ids = torch.randint(0, V, (B, S))
# reference, unsplit
t_ref = table.clone().requires_grad_()
emb_ref = torch.nn.functional.embedding(ids, t_ref).transpose(0, 1)
(emb_ref * torch.arange(S * B * H, dtype=torch.float64).view(S, B, H)).sum().backward()
# vocab-parallel on this rank's rows
per = V // world
emb = VocabParallelEmbedding(V, H, tp_group=g, dtype=torch.float64, init_std=0.02, reduce_scatter=False)
with torch.no_grad():
    emb.weight.copy_(table[rank * per:(rank + 1) * per])
out = emb(ids)
(out * torch.arange(S * B * H, dtype=torch.float64).view(S, B, H)).sum().backward()
if rank == 0:
    result = dict(emb=float((out - emb_ref).abs().max()),
                  emb_grad=float((emb.weight.grad - t_ref.grad[:per]).abs().max()))
"""


def test_vocab_parallel_embedding_matches_unsplit(tmp_path):
    """TP 2: the summed embedding lookup and its gradient equal the single-rank computation (fp64,
    to 1e-12)."""
    res = run_gloo(BODY, world=2, tmp_path=tmp_path)
    for key, err in res.items():
        assert err < 1e-12, (key, err)


def test_vocab_size_must_split_over_tp():
    """A vocabulary that does not divide by TP names both numbers and the padding flag."""
    from types import SimpleNamespace
    from unittest import mock

    import torch

    from heterosim.errors import ConfigError
    from models.layers import embedding

    with mock.patch.object(embedding, "group_size", lambda g: 4), pytest.raises(ConfigError) as exc:
        embedding.VocabParallelEmbedding(10, 4, tp_group=SimpleNamespace(), dtype=torch.float32,
                                         init_std=0.02, reduce_scatter=False)
    assert str(exc.value) == ("vocab size 10 not divisible by tensor-parallel size 4; pad it "
                              "(--make-vocab-size-divisible-by)")
