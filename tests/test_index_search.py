"""Index.search against the exact numpy oracle (docs/index.md: search, padding, dtypes, ef)."""

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

# --------------------------------------------------------------------------------------------
# flat: exact


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("k", [1, 10, 37])
def test_flat_search_equals_numpy_oracle(clustered, metric, k):
    data, queries = clustered(1, 3000, 32, n_queries=60)
    index = build(data, metric=metric, kind="flat")
    ids, dist = index.search(queries, k=k)
    assert ids.shape == (60, k) and dist.shape == (60, k)
    assert_search_matches_oracle(ids, dist, data, np.arange(len(data)), queries, k, metric)


@pytest.mark.parametrize("metric", METRICS)
def test_flat_search_with_arbitrary_ids_returns_those_ids(clustered, metric):
    data, queries = clustered(2, 2000, 16, n_queries=40)
    user_ids = np.random.default_rng(3).choice(10**12, size=len(data), replace=False).astype(np.int64)
    index = build(data, user_ids, metric=metric, kind="flat")
    ids, dist = index.search(queries, k=10)
    assert_search_matches_oracle(ids, dist, data, user_ids, queries, 10, metric)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_one_dimensional_query_returns_one_dimensional_arrays_equal_to_batch_row(clustered, kind, metric):
    data, queries = clustered(4, 2000, 24, n_queries=15)
    index = build(data, metric=metric, kind=kind)
    batch_ids, batch_dist = index.search(queries, k=7)
    for r, q in enumerate(queries):
        ids, dist = index.search(q, k=7)
        assert ids.shape == (7,) and dist.shape == (7,)
        assert ids.dtype == np.int64 and dist.dtype == np.float32
        np.testing.assert_array_equal(ids, batch_ids[r])
        np.testing.assert_allclose(dist, batch_dist[r], rtol=0, atol=1e-6)
    if kind == "flat":
        ids, dist = index.search(queries[0], k=7)
        assert_search_matches_oracle(ids, dist, data, np.arange(len(data)), queries[:1], 7, metric)


@pytest.mark.parametrize("kind", KINDS)
def test_search_returns_int64_ids_and_float32_distances(clustered, kind):
    data, queries = clustered(5, 500, 16, n_queries=5)
    index = build(data, metric="l2", kind=kind)
    ids, dist = index.search(queries, k=3)
    assert isinstance(ids, np.ndarray) and isinstance(dist, np.ndarray)
    assert ids.dtype == np.int64
    assert dist.dtype == np.float32


def test_flat_search_with_k_equal_to_size_returns_every_id_sorted(clustered):
    data, queries = clustered(6, 300, 16, n_queries=5)
    index = build(data, metric="cosine", kind="flat")
    ids, dist = index.search(queries, k=300)
    for row in ids:
        assert sorted(row.tolist()) == list(range(300))
    assert_search_matches_oracle(ids, dist, data, np.arange(300), queries, 300, "cosine")


# --------------------------------------------------------------------------------------------
# hnsw: recall at default ef on structured data (one 10,000 x 64 index per metric)


@pytest.fixture(scope="module", params=METRICS)
def hnsw10k(request):
    metric = request.param
    data, queries = make_clustered(7, 10_000, 64, n_queries=200)
    index = build(data, metric=metric, kind="hnsw")
    return metric, index, data, queries


def test_hnsw_recall_at_10_is_at_least_095_at_default_ef(hnsw10k):
    metric, index, data, queries = hnsw10k
    assert index.ef == 64
    ids, _ = index.search(queries, k=10)
    r = recall_at_k(ids, data, np.arange(len(data)), queries, 10, metric)
    assert r >= 0.95, f"{metric}: recall@10 {r:.4f} < 0.95"


def test_hnsw_distances_are_sorted_and_equal_true_distance_of_returned_ids(hnsw10k):
    metric, index, data, queries = hnsw10k
    ids, dist = index.search(queries, k=10)
    assert (ids >= 0).all(), "10 hits exist for every query in a 10,000-vector index"
    assert_rows_sorted(dist)
    assert_distances_are_true(ids, dist, data, np.arange(len(data)), queries, metric)


def test_hnsw_finds_each_indexed_vector_as_its_own_nearest_neighbour(hnsw10k):
    metric, index, data, _ = hnsw10k
    if metric == "ip":
        pytest.skip("under ip a vector is not necessarily its own nearest neighbour (1 - dot)")
    probe = np.random.default_rng(8).choice(len(data), 300, replace=False)
    ids, dist = index.search(data[probe], k=1)
    found = np.mean(ids[:, 0] == probe)
    assert found >= 0.99, f"only {found:.3f} of indexed vectors found themselves"
    np.testing.assert_allclose(dist[ids[:, 0] == probe, 0], 0.0, atol=1e-4)


def test_hnsw_search_with_ef_none_equals_search_with_index_ef(hnsw10k):
    metric, index, data, queries = hnsw10k
    old = index.ef
    try:
        index.ef = 20
        a_ids, a_dist = index.search(queries, k=10)
        b_ids, b_dist = index.search(queries, k=10, ef=20)
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_dist, b_dist)
    finally:
        index.ef = old
    assert index.ef == old


def test_hnsw_higher_ef_gives_recall_at_least_as_good_as_default(hnsw10k):
    metric, index, data, queries = hnsw10k
    live = np.arange(len(data))
    low, _ = index.search(queries, k=10, ef=10)
    high, _ = index.search(queries, k=10, ef=400)
    r_low = recall_at_k(low, data, live, queries, 10, metric)
    r_high = recall_at_k(high, data, live, queries, 10, metric)
    assert r_high >= 0.99, f"{metric}: recall@10 at ef=400 is {r_high:.4f}"
    assert r_high >= r_low


@pytest.mark.parametrize("metric", METRICS)
def test_hnsw_search_with_ef_smaller_than_k_still_returns_k_hits(clustered, metric):
    data, queries = clustered(9, 3000, 16, n_queries=30)
    index = build(data, metric=metric, kind="hnsw")
    ids, dist = index.search(queries, k=100, ef=5)
    assert ids.shape == (30, 100)
    assert (ids >= 0).all(), "ef must be raised to k: no padding expected in a 3,000-vector index"
    assert_rows_sorted(dist)
    assert_distances_are_true(ids, dist, data, np.arange(len(data)), queries, metric)
    r = recall_at_k(ids, data, np.arange(len(data)), queries, 100, metric)
    assert r >= 0.85, f"recall@100 with ef raised to 100 is {r:.4f}"


def test_hnsw_results_stay_identical_across_visited_set_epoch_wraparound():
    # one single-threaded batch of 70,000 searches reuses one visited set past 2**16 epochs
    data, queries = make_clustered(19, 500, 8, n_queries=100)
    index = build(data, metric="l2", kind="hnsw")
    first_ids, first_dist = index.search(queries, k=5, ef=16, threads=1)
    ids, dist = index.search(np.tile(queries, (700, 1)), k=5, ef=16, threads=1)
    np.testing.assert_array_equal(ids.reshape(700, 100, 5), np.broadcast_to(first_ids, (700, 100, 5)))
    np.testing.assert_array_equal(dist.reshape(700, 100, 5), np.broadcast_to(first_dist, (700, 100, 5)))


# --------------------------------------------------------------------------------------------
# padding


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_k_larger_than_index_size_pads_with_minus_one_and_inf_after_real_hits(clustered, kind, metric):
    data, queries = clustered(10, 7, 16, n_queries=4)
    index = build(data, metric=metric, kind=kind)
    ids, dist = index.search(queries, k=12)
    assert ids.shape == (4, 12)
    assert (ids[:, 7:] == -1).all() and np.isposinf(dist[:, 7:]).all()
    assert (ids[:, :7] >= 0).all() and np.isfinite(dist[:, :7]).all()
    assert_search_matches_oracle(ids, dist, data, np.arange(7), queries, 12, metric)

    one_ids, one_dist = index.search(queries[0], k=12)
    assert one_ids.shape == (12,)
    assert (one_ids[7:] == -1).all() and np.isposinf(one_dist[7:]).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_search_on_empty_index_returns_only_padding(rng, kind, metric):
    index = kbcore.Index(dim=16, metric=metric, kind=kind)
    assert len(index) == 0
    queries = rng.standard_normal((3, 16)).astype(np.float32)
    ids, dist = index.search(queries, k=5)
    assert ids.shape == (3, 5) and dist.shape == (3, 5)
    assert ids.dtype == np.int64 and dist.dtype == np.float32
    assert (ids == -1).all() and np.isposinf(dist).all()
    ids, dist = index.search(queries[0], k=5)
    assert ids.shape == (5,) and (ids == -1).all() and np.isposinf(dist).all()


@pytest.mark.parametrize("kind", KINDS)
def test_search_after_removing_every_id_returns_only_padding(clustered, kind):
    data, queries = clustered(11, 200, 16, n_queries=5)
    index = build(data, metric="l2", kind=kind)
    index.remove(np.arange(200))
    assert len(index) == 0
    ids, dist = index.search(queries, k=4)
    assert (ids == -1).all() and np.isposinf(dist).all()


@pytest.mark.parametrize("kind", KINDS)
def test_search_with_k_above_live_count_after_removes_pads_and_skips_removed(clustered, kind):
    data, queries = clustered(12, 50, 16, n_queries=6)
    index = build(data, metric="l2", kind=kind)
    index.remove(np.arange(0, 50, 2))  # 25 live
    ids, dist = index.search(queries, k=40)
    live = np.arange(1, 50, 2)
    assert_search_matches_oracle(ids, dist, data[live], live, queries, 40, "l2")


# --------------------------------------------------------------------------------------------
# accessors and parameters


@pytest.mark.parametrize("kind", KINDS)
def test_index_reports_its_construction_parameters_and_defaults(kind):
    index = kbcore.Index(dim=24, metric="ip", kind=kind)
    assert (index.dim, index.metric, index.kind) == (24, "ip", kind)
    assert (index.M, index.ef_construction, index.ef) == (16, 200, 64)
    custom = kbcore.Index(dim=8, metric="l2", kind=kind, M=8, ef_construction=50, ef=33, seed=1)
    assert (custom.dim, custom.metric, custom.kind) == (8, "l2", kind)
    assert (custom.M, custom.ef_construction, custom.ef) == (8, 50, 33)
    custom.ef = 99
    assert custom.ef == 99


def test_cosine_index_stores_unit_normalised_vectors(clustered):
    data, _ = clustered(13, 100, 16)
    data = data * np.linspace(0.5, 5.0, 100, dtype=np.float32)[:, None]
    index = build(data, metric="cosine", kind="flat")
    got = index.get_vectors([5, 7, 99])
    assert got.dtype == np.float32 and got.shape == (3, 16)
    expected = data[[5, 7, 99]] / np.linalg.norm(data[[5, 7, 99]], axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_get_vectors_returns_stored_vectors_in_requested_order(clustered, kind, metric):
    data, _ = clustered(14, 100, 16)
    index = build(data, metric=metric, kind=kind)
    got = index.get_vectors([7, 5, 99, 0])
    assert got.dtype == np.float32 and got.shape == (4, 16)
    np.testing.assert_array_equal(got, data[[7, 5, 99, 0]])
    np.testing.assert_array_equal(index.get_vectors(np.array([3], dtype=np.int64)), data[[3]])


@pytest.mark.parametrize("kind", KINDS)
def test_ids_len_and_contains_reflect_live_ids(clustered, kind):
    data, _ = clustered(15, 100, 8)
    user_ids = np.arange(1000, 1100, dtype=np.int64)
    index = build(data, user_ids, metric="l2", kind=kind)
    assert len(index) == 100
    got = index.ids()
    assert got.dtype == np.int64
    assert sorted(got.tolist()) == user_ids.tolist()
    assert 1000 in index and 1099 in index
    assert 0 not in index and 1100 not in index


# --------------------------------------------------------------------------------------------
# input conversion and layout


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_float_dtypes_are_converted_and_give_same_results_as_float32(clustered, kind, dtype):
    data, queries = clustered(16, 1000, 16, n_queries=20)
    data = data.astype(dtype).astype(np.float32)  # values exactly representable in `dtype`
    queries = queries.astype(dtype).astype(np.float32)
    index = build(data.astype(dtype), metric="l2", kind=kind)
    np.testing.assert_array_equal(index.get_vectors(np.arange(1000)), data)
    r_ids, r_dist = index.search(queries, k=10)
    c_ids, c_dist = index.search(queries.astype(dtype), k=10)
    np.testing.assert_array_equal(c_ids, r_ids)
    np.testing.assert_array_equal(c_dist, r_dist)
    assert c_ids.dtype == np.int64 and c_dist.dtype == np.float32
    if kind == "flat":
        assert_search_matches_oracle(c_ids, c_dist, data, np.arange(1000), queries, 10, "l2")


@pytest.mark.parametrize("metric", METRICS)
def test_non_contiguous_inputs_give_same_results_as_contiguous_copies(clustered, metric):
    wide, wide_q = clustered(17, 2000, 64, n_queries=40)
    data = wide[::2, ::2]  # row and column step: not C-contiguous
    queries = wide_q[::2, 1::2]
    all_ids = np.arange(2 * len(data), dtype=np.int64)
    ids_view = all_ids[::2]
    assert not data.flags.c_contiguous and not queries.flags.c_contiguous
    assert not ids_view.flags.c_contiguous

    ref = build(np.ascontiguousarray(data), ids_view.copy(), metric=metric, kind="flat")
    strided = build(data, ids_view, metric=metric, kind="flat")
    fortran = build(np.asfortranarray(data), ids_view, metric=metric, kind="flat")

    r_ids, r_dist = ref.search(np.ascontiguousarray(queries), k=10)
    for index in (ref, strided, fortran):
        for q in (queries, np.asfortranarray(queries)):
            ids, dist = index.search(q, k=10)
            np.testing.assert_array_equal(ids, r_ids)
            np.testing.assert_array_equal(dist, r_dist)
        one_ids, _ = index.search(wide_q[0, 1::2], k=10)  # strided 1-D query
        np.testing.assert_array_equal(one_ids, r_ids[0])
    assert_search_matches_oracle(r_ids, r_dist, np.ascontiguousarray(data), ids_view, queries, 10, metric)


def test_integer_ids_of_other_dtypes_and_lists_are_accepted(clustered):
    data, queries = clustered(18, 30, 8, n_queries=3)
    index = kbcore.Index(dim=8, metric="l2", kind="flat")
    index.add(data[:10], np.arange(10, dtype=np.int32))
    index.add(data[10:20], list(range(10, 20)))
    index.add(data[20:], np.arange(20, 30, dtype=np.uint16))
    assert len(index) == 30
    assert sorted(index.ids().tolist()) == list(range(30))
    ids, dist = index.search(queries, k=5)
    assert_search_matches_oracle(ids, dist, data, np.arange(30), queries, 5, "l2")


@pytest.mark.parametrize("quantization", [None, "sq8", "rabitq"])
def test_single_query_path_equals_the_batch_row(clustered, quantization):
    # One 1-D float32 query takes the binding's single-query path (search_one); it must give
    # the batch answer's row exactly: with and without a filter, padded when k exceeds what
    # passes, and the query array left as it was.
    data, queries = clustered(600, 16, 24, n_queries=12)
    index = kbcore.Index(24, metric="cosine", kind="hnsw", M=8, ef_construction=64, seed=3, quantization=quantization)
    index.add(data, np.arange(len(data), dtype=np.int64) * 5, metadata=[{"g": i % 7} for i in range(len(data))])
    where = {"g": {"$in": [1, 2]}}
    for kwargs in ({}, {"where": where}, {"where": {"g": 3}, "k": 200}):
        k = kwargs.pop("k", 10)
        b_ids, b_dist = index.search(queries, k=k, ef=40, **kwargs)
        for i, q in enumerate(queries):
            before = q.copy()
            ids, dist = index.search(q, k=k, ef=40, **kwargs)
            assert ids.shape == (k,) and dist.shape == (k,) and ids.dtype == np.int64 and dist.dtype == np.float32
            np.testing.assert_array_equal(ids, b_ids[i])
            np.testing.assert_array_equal(dist.view(np.uint32), b_dist[i].view(np.uint32))
            np.testing.assert_array_equal(q, before)
        if "where" in kwargs and k == 200:
            passing = sum(1 for i in range(len(data)) if i % 7 == 3)
            assert (b_ids[:, passing:] == -1).all() and (b_ids[:, :passing] >= 0).all()
    with pytest.raises(ValueError, match="dimension"):
        index.search(np.zeros(23, dtype=np.float32), k=3)
    with pytest.raises(ValueError):
        index.search(queries[0], k=0)


@pytest.mark.parametrize("quantization", [None, "sq8"])
def test_plain_native_entry_answers_only_the_plain_case_and_equals_the_checked_path(clustered, quantization):
    # Index.search's one-query entry (_core.fast_search, a plain CPython function): a
    # float32 [dim] query with int k / ef / threads in range gets the batch row exactly; any
    # other argument, and a query the search refuses, gets None, and Index.search then answers
    # through its checked path as it did before (converting, or raising the mapped error).
    from kbcore import _core
    from kbcore.errors import InvalidArgumentError, InvalidTypeError

    data, queries = clustered(11, 500, 16, n_queries=6)
    index = kbcore.Index(16, metric="cosine", kind="hnsw", M=8, ef_construction=64, seed=5, quantization=quantization)
    index.add(data, np.arange(len(data), dtype=np.int64) + 100)
    fast = _core.fast_search(index._native)
    b_ids, b_dist = index.search(queries, k=7, ef=30)
    for i, q in enumerate(queries):
        got = fast(q, 7, 30, 0)
        assert got is not None
        ids, dist = got
        assert ids.shape == (7,) and ids.dtype == np.int64 and dist.shape == (7,) and dist.dtype == np.float32
        np.testing.assert_array_equal(ids, b_ids[i])
        np.testing.assert_array_equal(dist.view(np.uint32), b_dist[i].view(np.uint32))
    default_ef = fast(queries[0], 7, None, 1)
    assert default_ef is not None
    np.testing.assert_array_equal(default_ef[0], index.search(queries[0], k=7)[0])

    q = queries[0]
    strided = np.repeat(q, 2)[::2]
    unaligned = np.frombuffer(b"\0" + q.tobytes(), dtype=np.float32, offset=1, count=16)
    assert not unaligned.flags.aligned and strided.strides == (8,)

    class Sub(np.ndarray):
        pass

    declined = {
        "float64": (q.astype(np.float64), 7, 30, 0),
        "big-endian": (q.astype(">f4"), 7, 30, 0),
        "strided": (strided, 7, 30, 0),
        "unaligned": (unaligned, 7, 30, 0),
        "subclass": (q.view(Sub), 7, 30, 0),
        "list": (q.tolist(), 7, 30, 0),
        "2-D": (q[None, :], 7, 30, 0),
        "numpy int k": (q, np.int64(7), 30, 0),
        "numpy int ef": (q, 7, np.int64(30), 0),
    }
    for name, args in declined.items():
        assert fast(*args) is None, name
        ids, dist = index.search(args[0], k=int(args[1]), ef=int(args[2]))  # converted
        np.testing.assert_array_equal(np.asarray(ids).reshape(-1, 7)[0], b_ids[0], err_msg=name)
    refused = {
        "wrong dimension": ((np.zeros(15, dtype=np.float32), 7, 30, 0), InvalidArgumentError),
        "k 0": ((q, 0, 30, 0), InvalidArgumentError),
        "k bool": ((q, True, 30, 0), InvalidTypeError),
        "k above MAX_EF": ((q, _core.MAX_EF + 1, 30, 0), InvalidArgumentError),
        "huge k": ((q, 1 << 80, 30, 0), InvalidArgumentError),
        "ef 0": ((q, 7, 0, 0), InvalidArgumentError),
        "ef float": ((q, 7, 30.0, 0), InvalidTypeError),
        "threads -1": ((q, 7, 30, -1), InvalidArgumentError),
        "threads bool": ((q, 7, 30, True), InvalidArgumentError),
        "NaN": ((np.full(16, np.nan, dtype=np.float32), 7, 30, 0), InvalidArgumentError),
        "zero under cosine": ((np.zeros(16, dtype=np.float32), 7, 30, 0), InvalidArgumentError),
    }
    for name, (args, error) in refused.items():
        assert fast(*args) is None, name
        with pytest.raises(error):
            index.search(args[0], k=args[1], ef=args[2], threads=args[3])
    with pytest.raises(TypeError):
        fast(q, 7, 30)
    # threads beyond any machine: declined here, and the checked path caps it as the native
    # pool does (one query or a batch), instead of failing to convert it
    assert fast(q, 7, 30, 1 << 80) is None
    np.testing.assert_array_equal(index.search(q, k=7, ef=30, threads=1 << 80)[0], b_ids[0])
    np.testing.assert_array_equal(index.search(queries, k=7, ef=30, threads=1 << 80)[0], b_ids)


def test_plain_native_entry_keeps_its_index_alive(clustered):
    from kbcore import _core

    data, queries = clustered(12, 200, 8, n_queries=2)
    index = kbcore.Index(8, kind="hnsw", M=8, ef_construction=32)
    index.add(data, np.arange(len(data), dtype=np.int64))
    expected = index.search(queries[0], k=3)[0]
    fast = _core.fast_search(index._native)
    del index
    import gc

    gc.collect()
    got = fast(queries[0], 3, None, 0)
    assert got is not None
    np.testing.assert_array_equal(got[0], expected)
