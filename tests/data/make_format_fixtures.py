"""Writes the committed format fixtures in this folder. Run once per released file format
version (with that version of kbcore installed) and commit the output; never regenerate the
files of an already released version: tests/test_index_persistence.py loads them forever.

    python tests/data/make_format_fixtures.py
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

import kbcore

HERE = Path(__file__).parent
SEED = 20240601
N, DIM = 30, 8
REMOVED = [4, 17]


def fixture_vectors() -> np.ndarray:
    return np.random.default_rng(SEED).standard_normal((N, DIM)).astype(np.float32)


def main() -> None:
    data = fixture_vectors()
    for kind, metric in (("flat", "cosine"), ("hnsw", "l2")):
        index = kbcore.Index(dim=DIM, metric=metric, kind=kind, M=4, ef_construction=32, ef=20, seed=7)
        index.add(data, np.arange(100, 100 + N), threads=1)
        index.remove([100 + i for i in REMOVED], threads=1)
        probe = HERE / "probe.tmp"
        index.save(probe)
        (version,) = struct.unpack_from("<I", probe.read_bytes(), 8)
        probe.rename(HERE / f"index_v{version}_{kind}_{metric}.kbi")


if __name__ == "__main__":
    main()
