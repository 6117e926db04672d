"""Index.search_stats: the debug counts of the graph walk (hops, distances scored)."""

from __future__ import annotations

import numpy as np
import pytest

import kbcore
from kbcore.errors import InvalidArgumentError

DIM = 16


def _index(quantization: str | None) -> tuple[kbcore.Index, np.ndarray]:
    rng = np.random.default_rng(5)
    data = rng.standard_normal((2000, DIM)).astype(np.float32)
    kw = {} if quantization is None else {"quantization": quantization}
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64, seed=1, **kw)  # type: ignore[arg-type]
    index.add(data, np.arange(len(data), dtype=np.int64), threads=1)
    queries = rng.standard_normal((20, DIM)).astype(np.float32)
    return index, queries


@pytest.mark.parametrize("quantization", [None, "sq8", "rabitq"])
def test_search_stats_counts_are_positive_grow_with_ef_and_repeat(quantization: str | None) -> None:
    index, queries = _index(quantization)
    small = index.search_stats(queries, 10, ef=10)
    large = index.search_stats(queries, 10, ef=200)
    again = index.search_stats(queries, 10, ef=200)
    for key in ("hops", "scored"):
        assert small[key].shape == (len(queries),)
        assert small[key].dtype == np.uint64
        assert (small[key] > 0).all()
        # A longer candidate list expands more nodes and scores more of them, query by query
        # on average and in total (a single query may converge early either way).
        assert large[key].sum() > 2 * small[key].sum()
        np.testing.assert_array_equal(large[key], again[key])
    # Every hop scores at most a full level-0 list (2M), and the scored nodes are distinct.
    assert (large["scored"] <= 1 + (large["hops"] + large["upper_hops"]) * 16).all()
    np.testing.assert_array_equal(large["upper_hops"], again["upper_hops"])


def test_search_stats_of_one_query_equal_its_row_of_a_batch() -> None:
    index, queries = _index("sq8")
    one = index.search_stats(queries[0], 5, ef=32)
    batch = index.search_stats(queries, 5, ef=32)
    assert one["hops"].shape == (1,)
    assert one["hops"][0] == batch["hops"][0]
    assert one["scored"][0] == batch["scored"][0]


def test_search_stats_rejects_a_flat_index_and_bad_queries() -> None:
    flat = kbcore.Index(DIM, "l2", "flat")
    flat.add(np.ones((3, DIM), dtype=np.float32), np.arange(3, dtype=np.int64))
    with pytest.raises(InvalidArgumentError, match="hnsw"):
        flat.search_stats(np.ones(DIM, dtype=np.float32), 2)
    index, _ = _index(None)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        index.search_stats(np.full(DIM, np.nan, dtype=np.float32), 2)
    with pytest.raises(InvalidArgumentError):
        index.search_stats(np.ones(DIM, dtype=np.float32), 0)
