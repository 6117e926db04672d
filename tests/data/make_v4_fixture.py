"""Writes the committed format-4 fixture in this folder: a 2-bit RaBitQ index with
vectors="disk" over 20-dimensional inner-product data, with trained codes, some removed rows and
reused slots. Version 4 (rows on disk, either code type) was written until version 5 tagged the
code type by name; this file was made once with that kbcore (commit ad90891) and is never
regenerated (tests/test_code_types.py loads it forever).

    python tests/data/make_v4_fixture.py      (with a kbcore that writes format 4)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FILE_NAME = "rabitq_v4_disk_hnsw_ip.kbi"
FORMAT_VERSION = 4
SEED = 20261206
N, DIM, BITS = 1050, 20, 2  # training happens at 1,000 rows
REMOVED = range(5, N, 17)


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


def main() -> None:
    import kbcore

    data, refill = _draw()
    index = kbcore.Index(
        DIM, "ip", M=8, ef_construction=64, ef=20, seed=13, quantization="rabitq", bits=BITS, vectors="disk", rerank=30
    )
    index.add(data, np.arange(N), threads=1)
    index.remove(list(REMOVED), threads=1)
    index.add(refill, 9000 + np.arange(len(REMOVED)), threads=1)
    index.save(HERE / FILE_NAME)


if __name__ == "__main__":
    main()
