"""models.chunks: which model chunks run the same ops (compared by structure)."""

import torch
from torch import nn

from models.chunks import chunk_classes, module_structure


class Layer(nn.Module):
    def __init__(self, number: int, width: int = 4, gated: bool = False) -> None:
        super().__init__()
        self.layer_number, self.gated = number, gated  # layer_number names it, gated changes its ops
        self.fc = nn.Linear(width, width, bias=False)


class Chunk(nn.Module):
    def __init__(self, first: int, n: int, embed: bool = False, **kw) -> None:
        super().__init__()
        self.pre_process = embed
        self.embed = nn.Embedding(8, 4) if embed else None
        self.layers = nn.ModuleList(Layer(first + i, **kw) for i in range(n))


def test_chunks_built_alike_share_a_class_whatever_their_layer_numbers():
    chunks = [Chunk(0, 2, embed=True), Chunk(2, 2), Chunk(4, 2), Chunk(6, 2)]
    assert chunk_classes(chunks) == [0, 1, 1, 1]
    assert module_structure(chunks[1]) == module_structure(chunks[3])


def test_shapes_settings_layer_counts_and_dtypes_tell_chunks_apart():
    base = Chunk(0, 2)
    wider, gated, longer = Chunk(2, 2, width=8), Chunk(2, 2, gated=True), Chunk(2, 3)
    half = Chunk(2, 2).to(torch.bfloat16)
    frozen = Chunk(2, 2)
    frozen.layers[0].fc.weight.requires_grad_(False)
    assert chunk_classes([base, wider, gated, longer, half, frozen, Chunk(9, 2)]) == [0, 1, 2, 3, 4, 5, 0]
