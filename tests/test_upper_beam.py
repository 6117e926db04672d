"""The descent's beam at level 1 (GraphSearch::descend): a search of candidate list ef in a
graph of at least 50,000 slots keeps the ef // 8 best at level 1 instead of one current node
(ef // 4 from 500,000 slots), so that on clustered data the level-0 walk starts in the query's
cluster (docs/graph-quality.md, "A beam at level 1 of the descent")."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import kbcore
from kbcore import _core

DIM = 256
CLUSTERS = 1000
ROWS = 40_000


@pytest.fixture(autouse=True)
def _restore_beam() -> Iterator[None]:
    before = _core._upper_beam()
    yield
    _core._set_upper_beam(*before)


def _recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / truth.shape[1] for a, b in zip(ids, truth)]))


@pytest.fixture(scope="module")
def clustered() -> tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray]:
    """1,000 clusters of 40 rows in 256 dimensions, noise as large as the centres: rows of
    another cluster are all about equally far from a query, so the greedy descent through
    the sparse upper levels has no gradient to follow and often stops in the wrong cluster."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((CLUSTERS, DIM)).astype(np.float32)
    rows = centres[rng.integers(0, CLUSTERS, ROWS)] + rng.standard_normal((ROWS, DIM)).astype(np.float32)
    queries = centres[rng.integers(0, CLUSTERS, 1000)] + rng.standard_normal((1000, DIM)).astype(np.float32)
    truth = np.argsort(-(queries @ rows.T / np.linalg.norm(rows, axis=1)), axis=1)[:, :10]
    indexes = {}
    for quantization in ("none", "sq8"):
        kw = {} if quantization == "none" else {"quantization": quantization}
        index = kbcore.Index(DIM, "cosine", "hnsw", M=8, ef_construction=64, seed=1, **kw)  # type: ignore[arg-type]
        index.add(rows, np.arange(ROWS, dtype=np.int64), threads=1)  # one thread: a reproducible graph
        indexes[quantization] = index
    return indexes, queries, truth


def test_defaults_and_setter() -> None:
    assert _core._upper_beam() == (8, 50_000, 4, 500_000)
    _core._set_upper_beam(4, 0)
    assert _core._upper_beam() == (4, 0, 0, 0)  # no wider tier unless asked for
    _core._set_upper_beam(8, 10, 2, 20)
    assert _core._upper_beam() == (8, 10, 2, 20)
    with pytest.raises(TypeError):
        _core._set_upper_beam(-1, 0)


@pytest.mark.parametrize("quantization", ["none", "sq8"])
def test_beam_raises_recall_on_clustered_rows(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray], quantization: str
) -> None:
    indexes, queries, truth = clustered
    index = indexes[quantization]
    recall = {}
    for divisor in (0, 4):
        _core._set_upper_beam(divisor, 0)
        recall[divisor] = _recall(index.search(queries, 10, ef=32)[0], truth)
    # Greedy: about 0.93; a beam of 8 at level 1: about 0.95 (1,000 queries).
    assert recall[4] >= recall[0] + 0.01, recall
    # The beam reads more upper-level lists than the greedy walk, query by query never fewer
    # on average, and the walk's counts stay reproducible.
    stats = index.search_stats(queries, 10, ef=32)
    np.testing.assert_array_equal(stats["upper_hops"], index.search_stats(queries, 10, ef=32)["upper_hops"])
    _core._set_upper_beam(0, 0)
    greedy = index.search_stats(queries, 10, ef=32)
    assert stats["upper_hops"].sum() > greedy["upper_hops"].sum()


def _upper_hops(index: kbcore.Index, queries: np.ndarray, ef: int, setting: tuple[int, ...]) -> int:
    """Upper-level link lists read by the whole query set under one beam setting."""
    _core._set_upper_beam(*setting)
    return int(index.search_stats(queries, 10, ef=ef)["upper_hops"].sum())


def _same_walk(index: kbcore.Index, queries: np.ndarray, ef: int, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """The answers and the walk's counts under beam settings a and b are identical."""
    runs = []
    for setting in (a, b):
        _core._set_upper_beam(*setting)
        runs.append((index.search(queries, 10, ef=ef), index.search_stats(queries, 10, ef=ef)))
    (ids_a, d_a), stats_a = runs[0]
    (ids_b, d_b), stats_b = runs[1]
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_array_equal(d_a, d_b)
    for key in ("hops", "upper_hops", "scored"):
        np.testing.assert_array_equal(stats_a[key], stats_b[key])


@pytest.mark.parametrize("quantization", ["none", "sq8"])
def test_small_ef_and_small_graphs_descend_greedily(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray], quantization: str
) -> None:
    indexes, queries, _ = clustered
    index = indexes[quantization]
    # A beam below two nodes is the greedy walk: ef < 2 * divisor answers as divisor 0.
    _same_walk(index, queries, 15, (8, 0), (0, 0))
    # A graph below min_slots descends greedily at any ef: the default's 50,000 here (40,000 rows).
    _same_walk(index, queries, 64, (8, 50_000), (0, 0))
    _same_walk(index, queries, 64, (8, ROWS + 1), (0, 0))
    # ... and at exactly min_slots slots the beam is on: the walk reads more upper-level lists.
    assert _upper_hops(index, queries, 64, (8, ROWS)) > _upper_hops(index, queries, 64, (0, 0))


def test_a_deep_search_stays_exact_with_and_without_the_beam(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray],
) -> None:
    # The beam changes where level 0 starts, not what a search may return: a search with a
    # high ef still finds the exact top 10 (beam on and off alike).
    indexes, queries, truth = clustered
    index = indexes["none"]
    for divisor in (0, 8):
        _core._set_upper_beam(divisor, 0)
        assert _recall(index.search(queries[:200], 10, ef=400)[0], truth[:200]) >= 0.999


@pytest.mark.parametrize("quantization", ["none", "sq8"])
def test_the_wide_tier_starts_at_its_size(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray], quantization: str
) -> None:
    indexes, queries, _ = clustered
    index = indexes[quantization]
    # From wide_min_slots slots on, the beam is ef // wide_divisor; below, ef // divisor.
    _same_walk(index, queries, 64, (8, 0, 4, ROWS), (4, 0))
    _same_walk(index, queries, 64, (8, 0, 4, ROWS + 1), (8, 0))
    # Wide divisor 0: no wider tier at any size.
    _same_walk(index, queries, 64, (8, 0, 0, 0), (8, 0))
    # The divisors differ in what they do (else the lines above would prove nothing).
    assert _upper_hops(index, queries, 64, (4, 0)) > _upper_hops(index, queries, 64, (8, 0))
    # The tiers sit under the floor: below min_slots the walk is greedy whatever the wide tier says.
    _same_walk(index, queries, 64, (8, ROWS + 1, 4, 0), (0, 0))
