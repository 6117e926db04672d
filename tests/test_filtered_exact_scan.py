"""The filtered exact scan (issue 28): the strategy that scores every passing row, on float32
rows and on each code type, against a brute-force numpy oracle.

A quantized index scores its code rows and re-ranks the best ``rerank`` of them from the float32
rows; with ``rerank`` one less than the rows passing, all but the worst estimate are re-ranked,
so the answer is the exact top k whatever the codes' ordering, and any row the scan skipped,
scored twice or scored against the wrong code row shows as a difference from the oracle. Dimensions are odd (the
code rows end in padding, 131 dimensions in a code row that is not a whole number of 128-byte
line pairs) and the passing counts are not multiples of the scan's four-row blocks. Data is
seeded.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_distances_are_true, assert_search_matches_oracle, recall_at_k

import kbcore
from kbcore.filters import compile_where

N_ROWS = 1201  # past the 1,000 rows at which the codes are trained
N_QUERIES = 12

WHERES = {
    "10 %": {"bucket": {"$lt": 10}},
    "fewer rows than k": {"bucket": 7},
    "no row": {"bucket": {"$lt": 0}},
}


def _data(dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clustered rows, queries near the clusters, and a uniform int bucket in [0, 100)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, dim)).astype(np.float32)
    data = (centres[rng.integers(0, 12, N_ROWS)] + 0.5 * rng.standard_normal((N_ROWS, dim))).astype(np.float32)
    queries = (centres[rng.integers(0, 12, N_QUERIES)] + 0.5 * rng.standard_normal((N_QUERIES, dim))).astype(np.float32)
    return data, queries, rng.integers(0, 100, N_ROWS)


def _index(data: np.ndarray, bucket: np.ndarray, metric: str, quantization: str | None, **kw) -> kbcore.Index:
    index = kbcore.Index(
        data.shape[1], metric, "hnsw", M=8, ef_construction=32, seed=3, quantization=quantization, **kw
    )
    ids = np.arange(N_ROWS, dtype=np.int64) * 7 + 5
    index.add(data, ids, metadata=[{"bucket": int(b)} for b in bucket], threads=1)
    return index


def _passes(where: dict, bucket: int) -> bool:
    """Whether a row of this bucket passes one of WHERES (written out, not evaluated by kbcore)."""
    cond = where["bucket"]
    if isinstance(cond, int):
        return bucket == cond
    return bucket < cond["$lt"]


@pytest.mark.parametrize("where_name", list(WHERES))
@pytest.mark.parametrize("dim", [37, 131])
@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
@pytest.mark.parametrize("quantization", [None, "sq8", "rabitq"])
def test_filtered_exact_scan_equals_brute_force(quantization, metric, dim, where_name):
    data, queries, bucket = _data(dim, seed=dim)
    # One re-ranked row fewer than pass the 10 % filter: the scan reads the codes (with a depth of
    # every passing row it would score the float32 rows directly) and re-ranks all but the row
    # whose estimate is worst, far from any top 20 on this data.
    rerank = int((bucket < 10).sum()) - 1
    index = _index(data, bucket, metric, quantization, **({} if quantization is None else {"rerank": rerank}))
    if quantization is not None:
        assert index.quantizer_trained, "the scan must read codes, not the float32 rows"
    where = WHERES[where_name]
    mask = np.array([_passes(where, int(b)) for b in bucket])
    ids = np.arange(N_ROWS, dtype=np.int64) * 7 + 5
    k = 20
    got_ids, got_dist = index._native.search(queries, k, 64, 1, compile_where(where), "exact")
    assert_search_matches_oracle(got_ids, got_dist, data[mask], ids[mask], queries, k, metric)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_filtered_exact_scan_of_codes_at_the_default_depth_returns_true_distances(quantization, metric):
    data, queries, bucket = _data(131, seed=11)
    index = _index(data, bucket, metric, quantization)
    where = WHERES["10 %"]
    mask = bucket < 10
    ids = np.arange(N_ROWS, dtype=np.int64) * 7 + 5
    got_ids, got_dist = index._native.search(queries, 10, 64, 1, compile_where(where), "exact")
    assert (got_ids != -1).all(), "a full page: more than k rows pass"
    assert_distances_are_true(got_ids, got_dist, data[mask], ids[mask], queries, metric)
    assert recall_at_k(got_ids, data[mask], ids[mask], queries, 10, metric) >= 0.9
