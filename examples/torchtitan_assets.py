"""Write the two local assets torchtitan's ``llama3_debugmodel`` config reads, without a download.

torchtitan's debug configs read a tokenizer from ``--hf_assets_path`` (default
``./tests/assets/tokenizer``) and the ``c4_test`` dataset from ``--dataloader.dataset_path``
(default ``tests/assets/c4_test``). Both live in torchtitan's git repository, not in its wheel.
This writes stand-ins a capture can use offline:

- ``DIR/tokenizer``: a word-level tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) of
  exactly 2048 tokens, the debug model's vocabulary: ``<|begin_of_text|>``, ``<|end_of_text|>``,
  ``[UNK]`` and the words ``w0`` ... ``w2044``;
- ``DIR/c4_test/train.json``: 64 documents of 600 such words (JSON lines with a ``text`` field,
  the c4 layout), so every data-parallel rank of a 512-rank job gets a shard.

Token values do not matter to a capture (tensors hold no data); shapes do, and torchtitan packs
documents into ``seq_len`` samples whatever the text.

    python examples/torchtitan_assets.py /tmp/titan_assets
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2048
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "[UNK]"]
DOCUMENTS = 64
WORDS_PER_DOCUMENT = 600


def write_assets(root: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *words])}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "unk_token": SPECIAL[2]}))
    rng = random.Random(0)
    (root / "c4_test").mkdir(parents=True, exist_ok=True)
    with open(root / "c4_test" / "train.json", "w") as f:
        for _ in range(DOCUMENTS):
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=WORDS_PER_DOCUMENT))}) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_assets(Path(sys.argv[1]))
