"""Writes the committed format-5 fixture in this folder: an SQ8 index with vectors="memory" over
24-dimensional cosine data, with trained codes, some removed rows and reused slots, and a text
per row. Version 5 (the code type tagged by name, the payload under checksum64) was written until
version 6 moved the payload to a block checksum; this file was made once with that kbcore
(commit 6919805) and is never regenerated (tests/test_index_block_checksum.py loads it forever).

    python tests/data/make_v5_fixture.py      (with a kbcore that writes format 5)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import kbcore

HERE = Path(__file__).parent
FILE_NAME = "sq8_v5_hnsw_cosine.kbi"
FORMAT_VERSION = 5
SEED = 20261207
N, DIM = 1100, 24  # training happens at 1,000 rows
REMOVED = range(3, N, 19)


def _draw() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    refill = rng.standard_normal((len(REMOVED), DIM)).astype(np.float32)
    return data, refill


def fixture_rows() -> tuple[np.ndarray, np.ndarray]:
    """The live rows and ids the fixture holds (after removal and slot reuse)."""
    data, refill = _draw()
    removed = set(REMOVED)
    keep = np.array([i not in removed for i in range(N)])
    ids = np.concatenate([np.arange(N)[keep], 9000 + np.arange(len(REMOVED))]).astype(np.int64)
    return np.concatenate([data[keep], refill]), ids


def text_of(row_id: int) -> str:
    """The text stored with id `row_id`."""
    return f"row{row_id} group{row_id % 7}"


def build() -> kbcore.Index:
    """The fixture's index (also the index of make_v6_fixture.py)."""
    import kbcore

    data, refill = _draw()
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, ef=20, seed=17, quantization="sq8", rerank=20)
    ids = np.arange(N)
    index.add(data, ids, texts=[text_of(i) for i in ids], threads=1)
    index.remove(list(REMOVED), threads=1)
    again = 9000 + np.arange(len(REMOVED))
    index.add(refill, again, texts=[text_of(i) for i in again], threads=1)
    return index


def main() -> None:
    build().save(HERE / FILE_NAME)


if __name__ == "__main__":
    main()
