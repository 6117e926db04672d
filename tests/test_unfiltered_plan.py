"""The plan of an unfiltered search on a graph index: the exact scan of every row when it
costs less than the walk's expected work (cpp/search_plan_unfiltered.h), else the walk; a
fixed figure of the walk's work, so that an answer never depends on earlier searches."""

from __future__ import annotations

import numpy as np
import pytest

import kbcore

K = 10
#: A fresh index's distance evaluations per unit of ef before any walk is measured
#: (cpp/search_plan.h, EvalStats).
FRESH_EVALS_PER_EF = 12.0


def _data(n: int, dim: int, seed: int = 0) -> np.ndarray:
    # Gaussian vectors in 128+ dimensions are nearly orthogonal: a graph walk there scores a
    # large share of the rows and still misses some of the exact neighbours.
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _index(data: np.ndarray, **kw) -> kbcore.Index:
    kw.setdefault("M", 8)
    kw.setdefault("ef_construction", 40)
    kw.setdefault("metric", "l2")
    index = kbcore.Index(dim=data.shape[1], **kw)
    index.add(data, np.arange(len(data), dtype=np.int64), threads=1)
    return index


def _brute_force(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    q, x = queries.astype(np.float64), data.astype(np.float64)
    d = (q**2).sum(1)[:, None] - 2 * q @ x.T + (x**2).sum(1)[None, :]
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def _recall(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(got.tolist(), expected.tolist(), strict=True)]))


@pytest.mark.parametrize(
    "n, ef, plan",
    [
        # A fresh index: the walk is expected to make 12 * ef evaluations, each worth 1.5 rows
        # of scan, so the scan is chosen up to 18 * ef rows.
        (200, 16, "exact"),
        (280, 16, "exact"),
        (300, 16, "graph"),
        (1100, 64, "exact"),
        (1200, 64, "graph"),
        (5000, 64, "graph"),
    ],
)
def test_unfiltered_plan_scans_when_rows_are_fewer_than_the_walks_cost(n, ef, plan):
    index = _index(_data(n, 8))
    assert index._native.evals_per_ef == FRESH_EVALS_PER_EF
    assert index._native.unfiltered_strategy(ef) == plan


def test_unfiltered_plan_of_a_flat_index_is_the_scan():
    index = _index(_data(5000, 8), kind="flat")
    assert index._native.unfiltered_strategy(16) == "exact"


def test_unfiltered_plan_does_not_depend_on_what_was_searched_before(tmp_path):
    # Near-orthogonal rows and M 32: the walk scores more than the plan assumes (about 22
    # evaluations per unit of ef, measured into evals_per_ef), yet the plan stays the one of a
    # fresh index, so the same query gets the same answer before and after a save and load.
    n, ef = 1000, 32
    data = _data(n, 256, seed=3)
    queries = _data(40, 256, seed=4)
    index = _index(data, M=32)
    assert index._native.unfiltered_strategy(ef) == "graph"
    before, _ = index.search(queries, K, ef=ef, threads=1)
    assert index._native.evals_per_ef > FRESH_EVALS_PER_EF  # measured, and harder than assumed
    assert index._native.unfiltered_strategy(ef) == "graph"
    again, _ = index.search(queries, K, ef=ef, threads=1)
    np.testing.assert_array_equal(again, before)
    index.save(tmp_path / "i.kbi")
    loaded = kbcore.Index.load(tmp_path / "i.kbi")
    assert loaded._native.unfiltered_strategy(ef) == "graph"
    reloaded, _ = loaded.search(queries, K, ef=ef, threads=1)
    np.testing.assert_array_equal(reloaded, before)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_unfiltered_search_equals_brute_force_where_the_scan_is_chosen(metric):
    n, ef = 1000, 64
    data = _data(n, 256, seed=1)
    queries = _data(50, 256, seed=2)
    index = _index(data, metric=metric)
    assert index._native.unfiltered_strategy(ef) == "exact"
    ids, _ = index.search(queries, K, ef=ef, threads=1)
    one = np.stack([index.search(q, K, ef=ef)[0] for q in queries])
    if metric == "cosine":
        unit = data / np.linalg.norm(data, axis=1, keepdims=True)
        qs = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        expected = np.argsort(-(qs.astype(np.float64) @ unit.T.astype(np.float64)), axis=1, kind="stable")[:, :K]
    else:
        expected = _brute_force(data, queries, K)
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(one, expected)
    # Scanning did not touch the walk's measured average.
    assert index._native.evals_per_ef == FRESH_EVALS_PER_EF


def test_forced_plans_of_an_unfiltered_search():
    n, ef = 1000, 48
    data = _data(n, 256, seed=5)
    queries = _data(50, 256, seed=6)
    index = _index(data)
    native = index._native
    expected = _brute_force(data, queries, K)
    exact_ids, exact_dist = native.search(queries, K, ef, 1, None, "exact")
    np.testing.assert_array_equal(exact_ids, expected)
    np.testing.assert_array_equal(np.diff(exact_dist, axis=1) >= 0, True)
    assert native.evals_per_ef == FRESH_EVALS_PER_EF
    # The walk, forced, is measured; on these rows at this ef it misses some exact neighbours.
    walk_ids, _ = native.search(queries, K, ef, 1, None, "graph")
    assert native.evals_per_ef != FRESH_EVALS_PER_EF
    assert 0.5 < _recall(walk_ids, expected) < 1.0


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_quantized_unfiltered_scan_equals_the_forced_exact_filtered_scan(quantization):
    # The scan of a quantized graph reads the codes and re-ranks, as the filtered exact strategy
    # does with every row passing.
    n, ef = 1200, 80
    data = _data(n, 64, seed=7)
    queries = _data(30, 64, seed=8)
    index = kbcore.Index(dim=64, metric="l2", M=8, ef_construction=40, quantization=quantization)
    index.add(data, np.arange(n, dtype=np.int64), metadata=[{"a": 1}] * n, threads=1)
    native = index._native
    assert native.unfiltered_strategy(ef) == "exact"
    from kbcore.filters import compile_where

    got = native.search(queries, K, ef, 1, None, "auto")
    scan = native.search(queries, K, ef, 1, compile_where({"a": 1}), "exact")
    np.testing.assert_array_equal(got[0], scan[0])
    np.testing.assert_array_equal(got[1], scan[1])
    assert _recall(got[0], _brute_force(data, queries, K)) >= 0.95
