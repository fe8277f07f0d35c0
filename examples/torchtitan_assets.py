"""Write the two local assets torchtitan's ``llama3_debugmodel`` config reads, without a download.

torchtitan's debug configs read a tokenizer from ``--hf_assets_path`` (default
``./tests/assets/tokenizer``) and the ``c4_test`` dataset from ``--dataloader.dataset_path``
(default ``tests/assets/c4_test``). Both live in torchtitan's git repository, not in its wheel.
This writes stand-ins a capture can use offline (``heterosim.validation.titan.write_assets``, what
``replay validate`` writes for a case whose source names torchtitan):

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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heterosim.validation.titan import write_assets  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_assets(Path(sys.argv[1]))
