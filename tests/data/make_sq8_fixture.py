"""Writes the committed format-2 (quantized) fixture in this folder: an SQ8 index with
trained codes, some removed rows and reused slots. Run once with the kbcore that introduced
format 2 and commit the output; never regenerate it (tests/test_quantized.py loads it forever).

    python tests/data/make_sq8_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FILE_NAME = "sq8_v2_hnsw_cosine.kbi"
SEED = 20240602
N, DIM = 1100, 8
REMOVED = range(0, 1100, 11)


def fixture_rows() -> tuple[np.ndarray, np.ndarray]:
    """The live rows and ids the fixture holds (after removal and slot reuse)."""
    rng = np.random.default_rng(SEED)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    refill = rng.standard_normal((len(REMOVED), DIM)).astype(np.float32)
    keep = np.array([i not in set(REMOVED) for i in range(N)])
    ids = np.concatenate([np.arange(N)[keep], 5000 + np.arange(len(REMOVED))]).astype(np.int64)
    return np.concatenate([data[keep], refill]), ids


def main() -> None:
    import kbcore

    rng = np.random.default_rng(SEED)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    refill = rng.standard_normal((len(REMOVED), DIM)).astype(np.float32)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, ef=20, seed=7, quantization="sq8")
    index.add(data, np.arange(N), threads=1)
    index.remove(list(REMOVED), threads=1)
    index.add(refill, 5000 + np.arange(len(REMOVED)), threads=1)
    index.save(HERE / FILE_NAME)


if __name__ == "__main__":
    main()
