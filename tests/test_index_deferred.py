"""Deferred graph insertion: rows added with defer_graph=True are searchable at once (scanned
exactly) and linked into the HNSW graph later by build_graph()."""

from __future__ import annotations

import numpy as np
import pytest

import kbcore

N, DIM, K = 3000, 24, 10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((30, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 30, N)] + 0.3 * rng.standard_normal((N, DIM)).astype(np.float32)
    q = centres[rng.integers(0, 30, 60)] + 0.3 * rng.standard_normal((60, DIM)).astype(np.float32)
    return x.astype(np.float32), q.astype(np.float32)


def exact(x, ids, q, k=K):
    d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return ids[np.argsort(d, axis=1, kind="stable")[:, :k]]


def recall(got, want):
    return np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got.tolist(), want.tolist())])


def test_pending_rows_are_found_exactly_before_the_graph_is_built(data):
    x, q = data
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64)
    index.add(x, np.arange(N), defer_graph=True)
    assert index.pending == N and len(index) == N
    ids, _ = index.search(q, K)
    np.testing.assert_array_equal(ids, exact(x, np.arange(N), q))


def test_mixed_graph_and_pending_rows_keep_recall(data):
    x, q = data
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64)
    index.add(x[:2000], np.arange(2000))
    index.add(x[2000:], np.arange(2000, N), defer_graph=True)
    assert index.pending == N - 2000
    ids, _ = index.search(q, K)
    assert recall(ids, exact(x, np.arange(N), q)) >= 0.95
    remaining = index.build_graph(400)
    assert remaining == index.pending == N - 2400
    assert index.build_graph() == 0
    ids, _ = index.search(q, K)
    assert recall(ids, exact(x, np.arange(N), q)) >= 0.95


def test_removed_pending_rows_never_come_back_and_leave_the_queue(data):
    x, q = data
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64)
    index.add(x, np.arange(N), defer_graph=True)
    gone = np.arange(0, N, 2)
    index.remove(gone)
    assert index.pending == N - len(gone)
    index.build_graph()
    ids, _ = index.search(q, K)
    assert not set(ids.ravel().tolist()) & set(gone.tolist())
    live = np.arange(1, N, 2)
    assert recall(ids, exact(x[live], live, q)) >= 0.95


def test_pending_rows_survive_save_and_load(data, tmp_path):
    x, q = data
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64)
    index.add(x[:1000], np.arange(1000))
    index.add(x[1000:], np.arange(1000, N), defer_graph=True)
    path = tmp_path / "deferred.kbi"
    index.save(path)
    loaded = kbcore.Index.load(path)
    assert loaded.pending == N - 1000
    a, da = index.search(q, K)
    b, db = loaded.search(q, K)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(da, db)
    loaded.build_graph()
    assert loaded.pending == 0


def test_filtered_and_grouped_search_include_pending_rows(data):
    x, q = data
    index = kbcore.Index(DIM, "l2", "hnsw", M=8, ef_construction=64)
    meta = [{"half": int(i % 2), "doc": int(i // 3)} for i in range(N)]
    index.add(x, np.arange(N), metadata=meta, defer_graph=True)
    ids, _ = index.search(q, K, where={"half": 1})
    live = np.arange(1, N, 2)
    np.testing.assert_array_equal(ids, exact(x[live], live, q))
    groups = index.search_groups(q[0], 5, group_by="doc")
    assert len(groups) == 5 and len({g.key for g in groups}) == 5


def test_flat_index_ignores_defer_graph(data):
    x, q = data
    index = kbcore.Index(DIM, "l2", "flat")
    index.add(x, np.arange(N), defer_graph=True)
    assert index.pending == 0
    assert index.build_graph() == 0


def test_build_graph_rejects_a_non_positive_batch(data):
    index = kbcore.Index(DIM, "l2", "hnsw")
    with pytest.raises(ValueError):
        index.build_graph(0)
