"""Writes the committed format-3 (RaBitQ) fixture in this folder: a 3-bit RaBitQ index over
24-dimensional L2 data (not a multiple of the code stride), with trained codes, some removed
rows and reused slots. Run once with the kbcore whose RaBitQ files are format 3 and commit the
output; never regenerate it (tests/test_quantized.py loads it forever, so a change of the file
format that stops reading it fails there).

    python tests/data/make_rabitq_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FILE_NAME = "rabitq_v3_hnsw_l2.kbi"
FORMAT_VERSION = 3
SEED = 20261205
N, DIM, BITS = 1100, 24, 3  # training happens at 1,000 rows
REMOVED = range(3, N, 13)


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
    ids = np.concatenate([np.arange(N)[keep], 7000 + np.arange(len(REMOVED))]).astype(np.int64)
    return np.concatenate([data[keep], refill]), ids


def main() -> None:
    import kbcore

    data, refill = _draw()
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=64, ef=20, seed=11, quantization="rabitq", bits=BITS)
    index.add(data, np.arange(N), threads=1)
    index.remove(list(REMOVED), threads=1)
    index.add(refill, 7000 + np.arange(len(REMOVED)), threads=1)
    index.save(HERE / FILE_NAME)


if __name__ == "__main__":
    main()
