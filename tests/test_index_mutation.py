"""Upsert, remove and slot reuse (docs/index.md: add replaces an existing id; remove is all-or-nothing)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    KINDS,
    METRICS,
    assert_distances_are_true,
    assert_rows_sorted,
    assert_search_matches_oracle,
    build,
    make_clustered,
    recall_at_k,
)

import kbcore
from kbcore import errors


def expected_stored(vectors: np.ndarray, metric: str) -> np.ndarray:
    """What get_vectors must return for `vectors` (cosine stores unit-normalised vectors)."""
    v = np.asarray(vectors, dtype=np.float32)
    if metric == "cosine":
        return v / np.linalg.norm(v, axis=1, keepdims=True)
    return v


def check_against_live(index, live: dict, queries, k, metric, kind, min_recall=0.9):
    """Search agrees with the oracle over exactly the live set {id: vector}."""
    ids = np.fromiter(live.keys(), dtype=np.int64, count=len(live))
    data = np.stack([live[i] for i in ids.tolist()]) if len(live) else np.zeros((0, index.dim))
    got_ids, got_dist = index.search(queries, k=k)
    if kind == "flat":
        assert_search_matches_oracle(got_ids, got_dist, data, ids, queries, k, metric)
    else:
        assert_rows_sorted(got_dist)
        assert_distances_are_true(got_ids, got_dist, data, ids, queries, metric)
        r = recall_at_k(got_ids, data, ids, queries, k, metric)
        assert r >= min_recall, f"recall@{k} over the live set is {r:.4f}"
    return got_ids


# --------------------------------------------------------------------------------------------
# upsert


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_re_adding_an_id_replaces_its_vector_and_keeps_len(clustered, kind, metric):
    data, queries = clustered(21, 2000, 16, n_queries=50)
    index = build(data, metric=metric, kind=kind)
    moved = np.array([3, 50, 777, 1999], dtype=np.int64)
    far = make_clustered(99, 4, 16)[0] * 3.0 + 1.0  # new positions, away from the old ones
    index.add(far, moved)

    assert len(index) == 2000
    np.testing.assert_allclose(index.get_vectors(moved), expected_stored(far, metric), atol=1e-6)
    live = {i: data[i] for i in range(2000)}
    for i, v in zip(moved.tolist(), far):
        live[i] = v
    # queries at the old positions, the new positions, and ordinary queries
    probe = np.concatenate([data[moved], far, queries])
    check_against_live(index, live, probe, 10, metric, kind)
    if metric != "ip":  # under ip a vector need not be its own nearest neighbour
        ids, dist = index.search(far, k=1)
        np.testing.assert_array_equal(ids[:, 0], moved)
        np.testing.assert_allclose(dist[:, 0], 0.0, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_mixing_new_and_existing_ids_adds_new_and_replaces_existing(clustered, kind):
    data, queries = clustered(22, 1000, 16, n_queries=30)
    index = build(data, metric="l2", kind=kind)
    extra = make_clustered(23, 10, 16)[0]
    batch_ids = np.array([1, 2, 3, 4, 5, 5000, 5001, 5002, 5003, 5004], dtype=np.int64)
    index.add(extra, batch_ids)
    assert len(index) == 1005
    assert all(i in index for i in batch_ids.tolist())
    np.testing.assert_array_equal(index.get_vectors(batch_ids), extra)
    live = {i: data[i] for i in range(1000)}
    live.update({i: v for i, v in zip(batch_ids.tolist(), extra)})
    check_against_live(index, live, np.concatenate([extra, queries]), 10, "l2", kind)


@pytest.mark.parametrize("metric", METRICS)
def test_hnsw_stays_accurate_after_moving_many_vectors_repeatedly(metric):
    src_rng = np.random.default_rng(24)
    data, queries = make_clustered(24, 3000, 32, n_queries=100)
    index = build(data, metric=metric, kind="hnsw")
    live = {i: data[i] for i in range(3000)}
    for round_ in range(3):
        moved = src_rng.choice(3000, 1000, replace=False)
        new = make_clustered(25 + round_, 1000, 32)[0]
        index.add(new, moved)
        live.update({int(i): v for i, v in zip(moved, new)})
        assert len(index) == 3000
    check_against_live(index, live, queries, 10, metric, "hnsw", min_recall=0.9)


# --------------------------------------------------------------------------------------------
# remove


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_removed_ids_are_never_returned_again(clustered, kind, metric):
    data, queries = clustered(31, 3000, 16, n_queries=100)
    index = build(data, metric=metric, kind=kind)
    removed = np.random.default_rng(32).choice(3000, 1000, replace=False)
    index.remove(removed)

    assert len(index) == 2000
    removed_set = set(removed.tolist())
    assert not any(int(i) in index for i in removed[:100])
    assert set(index.ids().tolist()) == set(range(3000)) - removed_set
    # the removed vectors themselves are the hardest queries: each was its own nearest neighbour
    probe = np.concatenate([data[removed[:300]], queries])
    live = {i: data[i] for i in range(3000) if i not in removed_set}
    got = check_against_live(index, live, probe, 20, metric, kind)
    leaked = removed_set & set(got.ravel().tolist())
    assert not leaked, f"removed ids returned: {sorted(leaked)[:10]}"
    for q in probe[:50]:  # 1-D path too
        ids, _ = index.search(q, k=20)
        assert not removed_set & set(ids.tolist())


@pytest.mark.parametrize("kind", KINDS)
def test_remove_of_unknown_id_raises_key_error_and_removes_nothing(clustered, kind):
    data, queries = clustered(33, 500, 16, n_queries=10)
    index = build(data, metric="l2", kind=kind)
    with pytest.raises(KeyError, match="12345") as info:
        index.remove([12345])
    assert isinstance(info.value, errors.NotFoundError)
    assert isinstance(info.value, errors.KbcoreError)

    with pytest.raises(KeyError) as info:
        index.remove(np.array([1, 2, 12345, 3], dtype=np.int64))
    assert isinstance(info.value, errors.NotFoundError)
    assert len(index) == 500
    assert 1 in index and 2 in index and 3 in index
    np.testing.assert_array_equal(index.get_vectors([1, 2, 3]), data[[1, 2, 3]])
    ids, _ = index.search(data[[1, 2, 3]], k=1)
    np.testing.assert_array_equal(ids[:, 0], [1, 2, 3])
    check_against_live(index, {i: data[i] for i in range(500)}, queries, 10, "l2", kind)


@pytest.mark.parametrize("kind", KINDS)
def test_removing_an_id_twice_raises_key_error_the_second_time(clustered, kind):
    data, _ = clustered(34, 100, 8)
    index = build(data, metric="l2", kind=kind)
    index.remove([42])
    with pytest.raises(KeyError) as info:
        index.remove([42])
    assert isinstance(info.value, errors.NotFoundError)
    assert len(index) == 99


@pytest.mark.parametrize("kind", KINDS)
def test_get_vectors_of_removed_id_raises_key_error(clustered, kind):
    data, _ = clustered(35, 100, 8)
    index = build(data, metric="l2", kind=kind)
    index.remove([7])
    with pytest.raises(KeyError, match="7") as info:
        index.get_vectors([6, 7])
    assert isinstance(info.value, errors.NotFoundError)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_removed_id_can_be_added_again_with_a_new_vector(clustered, kind, metric):
    data, queries = clustered(36, 1000, 16, n_queries=30)
    index = build(data, metric=metric, kind=kind)
    index.remove([5, 6])
    assert 5 not in index and len(index) == 998
    new = make_clustered(37, 1, 16)[0]
    index.add(new, [5])
    assert 5 in index and 6 not in index and len(index) == 999
    np.testing.assert_allclose(index.get_vectors([5]), expected_stored(new, metric), atol=1e-6)
    live = {i: data[i] for i in range(1000) if i not in (5, 6)}
    live[5] = new[0]
    check_against_live(index, live, np.concatenate([new, data[[5, 6]], queries]), 10, metric, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_adding_an_empty_batch_is_a_noop(clustered, kind):
    data, queries = clustered(38, 100, 8, n_queries=5)
    index = build(data, metric="l2", kind=kind)
    index.add(np.zeros((0, 8), dtype=np.float32), np.zeros((0,), dtype=np.int64))
    assert len(index) == 100
    empty = kbcore.Index(dim=8, metric="l2", kind=kind)
    empty.add(np.zeros((0, 8), dtype=np.float32), np.zeros((0,), dtype=np.int64))
    assert len(empty) == 0
    ids, _ = empty.search(queries, k=3)
    assert (ids == -1).all()


# --------------------------------------------------------------------------------------------
# delete + reuse


@pytest.mark.parametrize("metric", METRICS)
def test_hnsw_recall_after_deleting_30_percent_and_adding_new_matches_fresh_index(metric):
    rng = np.random.default_rng(41)
    src_data, queries = make_clustered(41, 6500, 32, n_queries=300)
    data, new = src_data[:5000], src_data[5000:]
    index = build(data, metric=metric, kind="hnsw")
    removed = rng.choice(5000, 1500, replace=False)
    index.remove(removed)
    new_ids = np.arange(5000, 6500, dtype=np.int64)
    index.add(new, new_ids)
    assert len(index) == 5000

    keep = np.setdiff1d(np.arange(5000), removed)
    live_ids = np.concatenate([keep, new_ids])
    live_data = np.concatenate([data[keep], new])
    fresh = build(live_data, live_ids, metric=metric, kind="hnsw")

    got, dist = index.search(queries, k=10)
    assert not set(removed.tolist()) & set(got.ravel().tolist()), "removed ids returned"
    assert_distances_are_true(got, dist, live_data, live_ids, queries, metric)
    r_reused = recall_at_k(got, live_data, live_ids, queries, 10, metric)
    r_fresh = recall_at_k(fresh.search(queries, k=10)[0], live_data, live_ids, queries, 10, metric)
    assert r_reused >= 0.9 and r_fresh >= 0.9, (r_reused, r_fresh)
    assert r_reused >= r_fresh - 0.02, f"reused {r_reused:.4f} vs fresh {r_fresh:.4f}"


# --------------------------------------------------------------------------------------------
# reachability: with k >= len(index), "padding after the real hits" means every live id is
# returned. ef is raised to k, so the search is exhaustive over what the graph can reach; a
# live id missing from the result is a vector the graph has lost. (l2 and cosine only: under
# ip the pruning heuristic is not a metric and even a fresh hnswlib graph may strand nodes.)


def assert_every_live_id_returned(index, queries):
    n = len(index)
    live = set(index.ids().tolist())
    ids, dist = index.search(queries, k=n)
    for r, row in enumerate(ids):
        got = set(row[row >= 0].tolist())
        missing = live - got
        assert not missing, f"query {r}: {len(missing)} of {n} live ids unreachable (e.g. {sorted(missing)[:8]})"
    assert_rows_sorted(dist)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.99])
def test_hnsw_keeps_every_live_vector_reachable_after_removals(metric, fraction):
    data, queries = make_clustered(42, 4000, 32, n_queries=5)
    index = kbcore.Index(dim=32, metric=metric, kind="hnsw")
    index.add(data, np.arange(4000), threads=1)  # single-threaded: isolates removal from build
    removed = np.random.default_rng(43).choice(4000, int(4000 * fraction), replace=False)
    index.remove(removed, threads=1)
    assert len(index) == 4000 - len(removed)
    assert_every_live_id_returned(index, queries)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_hnsw_keeps_every_live_vector_reachable_after_upserts(metric):
    data, queries = make_clustered(44, 3000, 32, n_queries=5)
    index = kbcore.Index(dim=32, metric=metric, kind="hnsw")
    index.add(data, np.arange(3000), threads=1)
    rng = np.random.default_rng(45)
    for round_ in range(3):
        moved = rng.choice(3000, 1000, replace=False)
        index.add(make_clustered(46 + round_, 1000, 32)[0], moved, threads=1)
    assert len(index) == 3000
    assert_every_live_id_returned(index, queries)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_hnsw_fresh_single_threaded_build_reaches_every_vector(metric):
    data, queries = make_clustered(47, 2000, 32, n_queries=5)
    index = kbcore.Index(dim=32, metric=metric, kind="hnsw")
    index.add(data, np.arange(2000), threads=1)
    assert_every_live_id_returned(index, queries)
