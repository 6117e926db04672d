"""The descent's beam at level 1 (GraphSearch::descend): a search of candidate list ef keeps
the ef // divisor best at level 1 instead of one current node, so that on clustered data the
level-0 walk starts in the query's cluster (docs/graph-quality.md, "The descent")."""

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
def _restore_divisor() -> Iterator[None]:
    before = _core._upper_beam_divisor()
    yield
    _core._set_upper_beam_divisor(before)


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


def test_default_divisor_is_eight_and_settable() -> None:
    assert _core._upper_beam_divisor() == 8
    _core._set_upper_beam_divisor(4)
    assert _core._upper_beam_divisor() == 4
    with pytest.raises(TypeError):
        _core._set_upper_beam_divisor(-1)  # type: ignore[arg-type]


@pytest.mark.parametrize("quantization", ["none", "sq8"])
def test_beam_raises_recall_on_clustered_rows(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray], quantization: str
) -> None:
    indexes, queries, truth = clustered
    index = indexes[quantization]
    recall = {}
    for divisor in (0, 4):
        _core._set_upper_beam_divisor(divisor)
        recall[divisor] = _recall(index.search(queries, 10, ef=32)[0], truth)
    # Greedy: about 0.93; a beam of 8 at level 1: about 0.95 (1,000 queries).
    assert recall[4] >= recall[0] + 0.01, recall
    # The beam reads more upper-level lists than the greedy walk, query by query never fewer
    # on average, and the walk's counts stay reproducible.
    stats = index.search_stats(queries, 10, ef=32)
    np.testing.assert_array_equal(stats["upper_hops"], index.search_stats(queries, 10, ef=32)["upper_hops"])
    _core._set_upper_beam_divisor(0)
    greedy = index.search_stats(queries, 10, ef=32)
    assert stats["upper_hops"].sum() > greedy["upper_hops"].sum()


@pytest.mark.parametrize("quantization", ["none", "sq8"])
def test_small_ef_descends_greedily(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray], quantization: str
) -> None:
    # A beam below two nodes is the greedy walk: for ef < 2 * divisor the answers and the
    # walk's counts are those of divisor 0 exactly.
    indexes, queries, _ = clustered
    index = indexes[quantization]
    _core._set_upper_beam_divisor(8)
    ids8, d8 = index.search(queries, 10, ef=15)
    stats8 = index.search_stats(queries, 10, ef=15)
    _core._set_upper_beam_divisor(0)
    ids0, d0 = index.search(queries, 10, ef=15)
    stats0 = index.search_stats(queries, 10, ef=15)
    np.testing.assert_array_equal(ids8, ids0)
    np.testing.assert_array_equal(d8, d0)
    for key in ("hops", "upper_hops", "scored"):
        np.testing.assert_array_equal(stats8[key], stats0[key])


def test_a_deep_search_stays_exact_with_and_without_the_beam(
    clustered: tuple[dict[str, kbcore.Index], np.ndarray, np.ndarray],
) -> None:
    # The beam changes where level 0 starts, not what a search may return: a search with a
    # high ef still finds the exact top 10 (beam on and off alike).
    indexes, queries, truth = clustered
    index = indexes["none"]
    for divisor in (0, 8):
        _core._set_upper_beam_divisor(divisor)
        assert _recall(index.search(queries[:200], 10, ef=400)[0], truth[:200]) >= 0.999
