"""The seeded clustered set of the far-rows filter trials (issue 28), shared by
``filter_near_probe_trial.py`` and ``filter_seeds_trial.py``.

Unit vectors around ``clusters`` random centres (``noise`` around each), 200 queries drawn from
20 of the clusters, an HNSW index (M 16, ef_construction 100) holding each row's cluster and a
uniform ``r``, and for each of ``fractions`` of rows (by default 20, 35 and 50 %) two filters:
"anti" passes the clusters farthest from every query cluster, "uncorr" the rows with ``r``
below the fraction. ``0.15 64 30000 300``
is the set of tests/test_filtered_far_rows.py; ``0.05 384 100000 1000`` a synthetic 100k x 384.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

import kbcore


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def build(
    noise: float, dim: int, n: int, clusters: int, fractions: tuple[float, ...] = (0.2, 0.35, 0.5)
) -> tuple[kbcore.Index, np.ndarray, list[tuple[str, dict[str, Any], np.ndarray, np.ndarray]]]:
    """``(index, queries, cases)``; each case is ``(name, where, mask of passing rows, exact
    top-10 ids per query among them)``. The index has answered every query once unfiltered, which
    calibrates its cost model as normal use does."""
    query_clusters, nq = 20, 200
    rng = np.random.default_rng(7)
    centres = unit(rng.standard_normal((clusters, dim)))
    labels = rng.integers(0, clusters, n)
    data = unit(centres[labels] + noise * rng.standard_normal((n, dim)))
    qc = rng.choice(clusters, query_clusters, replace=False)
    queries = unit(centres[rng.choice(qc, nq)] + noise * rng.standard_normal((nq, dim)))
    close = (centres @ centres[qc].T).max(axis=1)
    close[qc] = np.inf
    order = np.argsort(close, kind="stable")
    sizes = np.bincount(labels, minlength=clusters)
    uniform = rng.random(n)
    index = kbcore.Index(dim, "cosine", "hnsw", M=16, ef_construction=100)
    meta = pa.table({"cluster": labels.astype(np.int64), "r": uniform})
    index.add(data, np.arange(n, dtype=np.int64), metadata=meta, threads=2)
    for q in queries:
        index.search(q, 10, threads=1)
    cases = []
    for frac in fractions:
        far = sorted(int(c) for c in order[: int(np.searchsorted(np.cumsum(sizes[order]), frac * n)) + 1])
        for name, where, mask in (
            (f"anti {frac:.0%}", {"cluster": {"$in": far}}, np.isin(labels, far)),
            (f"uncorr {frac:.0%}", {"r": {"$lt": frac}}, uniform < frac),
        ):
            ids = np.flatnonzero(mask)
            truth = ids[np.argsort(-(queries @ data[mask].T), axis=1)[:, :10]]
            cases.append((name, where, mask, truth))
    return index, queries, cases
