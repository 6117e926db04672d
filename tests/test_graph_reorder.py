"""Index.reorder: slots renumbered for locality, with ids, metadata and answers unchanged."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore.errors import InvalidArgumentError

DIM = 24
N = 2500


def _data(seed: int, n: int = N, dim: int = DIM) -> np.ndarray:
    """Clustered rows (40 centres): a graph whose breadth-first order differs from row order."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim)).astype(np.float32)
    return (centres[rng.integers(0, 40, n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)


def _queries(seed: int, nq: int = 60) -> np.ndarray:
    return _data(seed + 1000, nq)


def _assert_same_answers(before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray]) -> None:
    """Distances identical; ids identical wherever the distance does not tie another result
    of the row or the last one (equal distances may come back in either order)."""
    ids0, d0 = before
    ids1, d1 = after
    np.testing.assert_array_equal(d1, d0)
    for row in range(ids0.shape[0]):
        _, counts = np.unique(d0[row], return_counts=True)
        unique = {float(v) for v, c in zip(np.unique(d0[row]), counts) if c == 1}
        for j in range(ids0.shape[1]):
            if float(d0[row, j]) in unique and d0[row, j] != d0[row, -1]:
                assert ids1[row, j] == ids0[row, j], (row, j)


CODES = [
    pytest.param({}, id="float32"),
    pytest.param({"quantization": "sq8"}, id="sq8"),
    pytest.param({"quantization": "rabitq", "bits": 1}, id="rabitq1"),
    pytest.param({"quantization": "rabitq", "bits": 4}, id="rabitq4"),
]


@pytest.mark.parametrize("codes", CODES)
@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
@pytest.mark.parametrize("method", ["bfs", "rcm", "gorder"])
def test_reorder_keeps_every_answer_for_each_code_type_and_metric(codes: dict, metric: str, method: str) -> None:
    x = _data(1)
    ids = np.arange(N, dtype=np.int64) * 7 + 3
    index = kbcore.Index(DIM, metric, M=8, ef_construction=64, seed=5, **codes)  # type: ignore[arg-type]
    index.add(x, ids, threads=2)
    q = _queries(1)
    before = {ef: index.search(q, 10, ef=ef, threads=1) for ef in (10, 32, 100)}
    rows = index.get_vectors(ids)
    index.reorder(method=method, threads=2)
    assert len(index) == N
    np.testing.assert_array_equal(np.sort(index.ids()), ids)
    np.testing.assert_array_equal(index.get_vectors(ids), rows)
    for ef, res in before.items():
        _assert_same_answers(res, index.search(q, 10, ef=ef, threads=1))


def test_reorder_moves_rows_so_graph_neighbours_get_nearby_slots() -> None:
    # ids() lists live ids in slot order: after a breadth-first reorder the entry point's
    # walk order, no longer the order rows were added in.
    x = _data(2)
    ids = np.arange(N, dtype=np.int64)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    index.add(x, ids, threads=2)
    np.testing.assert_array_equal(index.ids(), ids)
    index.reorder()
    assert not np.array_equal(index.ids(), ids)
    np.testing.assert_array_equal(np.sort(index.ids()), ids)


def test_reorder_keeps_metadata_filters_groups_and_text_on_their_ids(tmp_path: Path) -> None:
    x = _data(3)
    ids = np.arange(N, dtype=np.int64) + 100
    rng = np.random.default_rng(3)
    doc = rng.integers(0, 300, N)
    meta = [
        {"document_id": int(d), "tag": ["a", "b", "c"][i % 3], "score": float(i) / 10, "labels": ["x", f"y{i % 5}"]}
        if i % 11
        else None
        for i, d in enumerate(doc)
    ]
    words = ["graph", "slot", "cache", "order", "walk", "node", "query", "row"]
    texts = [" ".join(words[(i * k) % 8] for k in range(1, 1 + i % 6)) if i % 7 else None for i in range(N)]
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, quantization="sq8")
    index.add(x, ids, metadata=meta, texts=texts, threads=2)
    q = _queries(3)
    wheres = [{"tag": "b"}, {"document_id": {"$lt": 30}}, {"labels": {"$in": ["y3"]}}]
    meta_before = index.get_metadata(ids)
    searches = [index.search(q, 10, where=w, ef=48, threads=1) for w in wheres]
    counts = [index.count(w) for w in wheres]
    groups = index.search_groups(q[:10], 5, group_by="document_id", ef=48, threads=1)
    text = [index.search_text(t, 10) for t in ("graph", "cache order", "walk node row")]
    index.reorder(method="rcm")
    assert index.get_metadata(ids) == meta_before
    assert [index.count(w) for w in wheres] == counts
    by_id = dict(zip(ids.tolist(), meta))
    passes = [
        lambda m: m["tag"] == "b",
        lambda m: m["document_id"] < 30,
        lambda m: "y3" in m["labels"],
    ]
    for w, res, ok in zip(wheres, searches, passes):
        after = index.search(q, 10, where=w, ef=48, threads=1)
        _assert_same_answers(res, after)
        assert all(by_id[i] is not None and ok(by_id[i]) for i in after[0][after[0] >= 0].tolist())
    regrouped = index.search_groups(q[:10], 5, group_by="document_id", ef=48, threads=1)
    assert [[g.key for g in row] for row in regrouped] == [[g.key for g in row] for row in groups]
    for t, (tid, tsc) in zip(("graph", "cache order", "walk node row"), text):
        rid, rsc = index.search_text(t, 10)
        np.testing.assert_array_equal(rsc, tsc)
        assert set(rid[rsc > tsc[-1]].tolist()) == set(tid[tsc > tsc[-1]].tolist())
    # The reordered file loads with the same metadata and answers.
    path = tmp_path / "r.kbi"
    index.save(path)
    loaded = kbcore.Index.load(path)
    assert loaded.get_metadata(ids) == meta_before
    np.testing.assert_array_equal(loaded.ids(), index.ids())
    for w in wheres:
        _assert_same_answers(index.search(q, 10, where=w, ef=48, threads=1), loaded.search(q, 10, where=w, ef=48))


@pytest.mark.parametrize("codes", CODES)
def test_reordered_index_saves_loads_and_answers_the_same(tmp_path: Path, codes: dict) -> None:
    x = _data(4)
    ids = np.arange(N, dtype=np.int64)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, **codes)  # type: ignore[arg-type]
    index.add(x, ids, threads=2)
    q = _queries(4)
    before = index.search(q, 10, ef=40, threads=1)
    index.reorder()
    path = tmp_path / "r.kbi"
    index.save(path)
    loaded = kbcore.Index.load(path)
    np.testing.assert_array_equal(loaded.ids(), index.ids())
    _assert_same_answers(before, loaded.search(q, 10, ef=40, threads=1))
    st0, st1 = index.search_stats(q, 10, ef=40), loaded.search_stats(q, 10, ef=40)
    np.testing.assert_array_equal(st1["hops"], st0["hops"])
    np.testing.assert_array_equal(st1["scored"], st0["scored"])


def test_deletes_and_adds_after_a_reorder_find_exactly_the_live_rows() -> None:
    x = _data(5)
    ids = np.arange(N, dtype=np.int64)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5, quantization="sq8")
    index.add(x[:2000], ids[:2000], threads=2)
    index.reorder()
    gone = ids[:2000:3]
    index.remove(gone, threads=2)
    index.add(x[2000:], ids[2000:], threads=2)
    live = np.setdiff1d(ids, gone)
    assert len(index) == len(live)
    assert not any(int(i) in index for i in gone[:50])
    q = _queries(5)
    got, _ = index.search(q, 10, ef=200, threads=1)
    d = ((q[:, None, :] - x[live][None, :, :]) ** 2).sum(-1)
    truth = live[np.argsort(d, axis=1)[:, :10]]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth)])
    assert recall >= 0.98
    assert not set(got.ravel().tolist()) & set(gone.tolist())


def test_reorder_keeps_rows_waiting_for_the_graph_searchable() -> None:
    x = _data(6)
    ids = np.arange(N, dtype=np.int64)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5)
    index.add(x[:2000], ids[:2000], threads=2)
    index.add(x[2000:], ids[2000:], defer_graph=True, threads=2)
    q = _queries(6)
    before = index.search(q, 10, ef=48, threads=1)
    index.reorder()
    assert index.pending == N - 2000
    _assert_same_answers(before, index.search(q, 10, ef=48, threads=1))
    assert index.build_graph() == 0
    probe = index.search(x[2000:2050], 1, ef=48, threads=1)[0][:, 0]
    assert np.mean(probe == ids[2000:2050]) >= 0.98


def test_reorder_refuses_a_flat_index_and_an_unknown_method() -> None:
    flat = kbcore.Index(DIM, "l2", "flat")
    flat.add(_data(7, 50), np.arange(50, dtype=np.int64))
    with pytest.raises(InvalidArgumentError, match="flat"):
        flat.reorder()
    index = kbcore.Index(DIM, "l2")
    index.add(_data(7, 50), np.arange(50, dtype=np.int64))
    with pytest.raises(InvalidArgumentError, match="unknown reorder method"):
        index.reorder(method="metis")


def test_reorder_of_an_empty_index_is_a_no_op() -> None:
    index = kbcore.Index(DIM, "l2")
    index.reorder()
    assert len(index) == 0


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
@pytest.mark.parametrize("vectors", ["memory", "disk"])
def test_reorder_of_a_loaded_index_read_in_place(tmp_path: Path, vectors: str, quantization: str) -> None:
    # A loaded quantized file is read in place (rows, codes, level-0 lists mapped); reorder
    # copies what it writes, and rows on disk stay on disk.
    x = _data(8)
    ids = np.arange(N, dtype=np.int64)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, quantization=quantization)  # type: ignore[arg-type]
    index.add(x, ids, threads=2)
    path = tmp_path / "a.kbi"
    index.save(path)
    loaded = kbcore.Index.load(path, vectors=vectors)  # type: ignore[arg-type]
    q = _queries(8)
    before = loaded.search(q, 10, ef=40, threads=1)
    rows = loaded.get_vectors(ids)
    loaded.reorder()
    assert loaded.vectors == vectors
    np.testing.assert_array_equal(loaded.get_vectors(ids), rows)
    _assert_same_answers(before, loaded.search(q, 10, ef=40, threads=1))
    # The file it was loaded from is untouched.
    _assert_same_answers(before, kbcore.Index.load(path).search(q, 10, ef=40, threads=1))


# -- the automatic reorder of Index.add ----------------------------------------------------


@pytest.fixture
def reorders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lowers add's reorder threshold to 1,000 rows and records the size at each reorder."""
    from kbcore.index import _index

    monkeypatch.setattr(_index, "REORDER_MIN_ROWS", 1000)
    seen: list[int] = []
    real = kbcore.Index.reorder

    def spy(self: kbcore.Index, **kw: object) -> None:
        seen.append(len(self))
        real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(kbcore.Index, "reorder", spy)
    return seen


def test_add_reorders_each_time_the_index_doubles_from_the_threshold(reorders: list[int]) -> None:
    x = _data(11, 5000)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    index.add(x[:600], np.arange(600, dtype=np.int64), threads=2)
    assert reorders == []  # below the threshold
    np.testing.assert_array_equal(index.ids(), np.arange(600))
    index.add(x[600:1500], np.arange(600, 1500, dtype=np.int64), threads=2)
    assert reorders == [1500]  # 1,500 >= 1,000 and >= 2 x 0
    assert not np.array_equal(index.ids(), np.arange(1500))
    index.add(x[1500:2900], np.arange(1500, 2900, dtype=np.int64), threads=2)
    assert reorders == [1500]  # 2,900 < 2 x 1,500: the new rows stay where they were added
    np.testing.assert_array_equal(index.ids()[-1400:], np.arange(1500, 2900))
    index.add(x[2900:3000], np.arange(2900, 3000, dtype=np.int64), threads=2)
    assert reorders == [1500, 3000]


def test_add_with_the_automatic_reorder_answers_as_without_it(reorders: list[int]) -> None:
    x = _data(12, 3000)
    ids = np.arange(3000, dtype=np.int64) * 3 + 1
    q = _queries(12)
    auto = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, quantization="sq8")
    auto.add(x, ids, threads=1)  # one build thread: both graphs identical
    plain = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, quantization="sq8")
    plain.add(x, ids, reorder=False, threads=1)
    assert reorders == [3000]
    assert not np.array_equal(auto.ids(), plain.ids())
    for ef in (10, 40):
        (ids0, d0), (ids1, d1) = plain.search(q, 10, ef=ef, threads=1), auto.search(q, 10, ef=ef, threads=1)
        # Ties of the integer code distances break by slot, so a rare query may walk another
        # way (docs/graph-quality.md): near-identical distances, almost every id the same.
        np.testing.assert_allclose(d1, d0, rtol=1e-5)
        same = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids0, ids1)])
        assert same >= 0.99, same


def test_add_does_not_reorder_deferred_disk_or_reloaded_indexes(reorders: list[int], tmp_path: Path) -> None:
    x = _data(13, 2400)
    ids = np.arange(2400, dtype=np.int64)
    deferred = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    deferred.add(x, ids, defer_graph=True)
    deferred.build_graph()
    disk = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5, quantization="sq8", vectors="disk")
    disk.add(x, ids, threads=2)
    assert reorders == []
    np.testing.assert_array_equal(disk.ids(), ids)
    saved = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    saved.add(x[:1200], ids[:1200], reorder=False, threads=2)
    saved.save(tmp_path / "s.kbi")
    loaded = kbcore.Index.load(tmp_path / "s.kbi")
    loaded.add(x[1200:2000], ids[1200:2000], threads=2)  # 2,000 < 2 x 1,200 loaded
    assert reorders == []
    loaded.add(x[2000:], ids[2000:], threads=2)  # 2,400 = 2 x 1,200
    assert reorders == [2400]


def test_add_reorder_true_and_false_override_the_rule(reorders: list[int]) -> None:
    x = _data(14, 1200)
    small = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    small.add(x[:100], np.arange(100, dtype=np.int64), reorder=True)
    assert reorders == [100]
    big = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5)
    big.add(x, np.arange(1200, dtype=np.int64), reorder=False, threads=2)
    assert reorders == [100]
    np.testing.assert_array_equal(big.ids(), np.arange(1200))


def test_add_rejects_a_bad_reorder_before_adding_anything() -> None:
    flat = kbcore.Index(DIM, "l2", "flat")
    with pytest.raises(InvalidArgumentError, match="flat"):
        flat.add(_data(15, 10), np.arange(10, dtype=np.int64), reorder=True)
    assert len(flat) == 0
    index = kbcore.Index(DIM, "l2")
    with pytest.raises(TypeError, match="reorder must be"):
        index.add(_data(15, 10), np.arange(10, dtype=np.int64), reorder="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="method must be a str"):
        index.reorder(method=3)  # type: ignore[arg-type]
    assert len(index) == 0


# -- reorder beside searches and writers ---------------------------------------------------


def test_searches_beside_repeated_reorders_always_answer_the_same() -> None:
    x = _data(16)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=64, seed=5, quantization="sq8")
    index.add(x, np.arange(N, dtype=np.int64), reorder=False, threads=1)
    q = _queries(16, 20)
    expected = [index.search(v, 10, ef=48) for v in q]
    done = threading.Event()
    failures: list[str] = []
    searched = [0]

    def searcher() -> None:
        while not done.is_set():
            for i, v in enumerate(q):
                ids, dist = index.search(v, 10, ef=48)
                try:
                    _assert_same_answers((expected[i][0][None], expected[i][1][None]), (ids[None], dist[None]))
                except AssertionError as exc:  # pragma: no cover - reported below
                    failures.append(f"query {i}: {exc}")
                searched[0] += 1

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        for method in ["gorder", "bfs", "rcm"] * 4:
            index.reorder(method=method)
    finally:
        done.set()
        thread.join()
    assert failures == []
    assert searched[0] > 0


@pytest.mark.parametrize("source", ["built", "loaded"])
def test_reorders_beside_adds_and_removes_keep_every_row_and_vector(source: str, tmp_path: Path) -> None:
    # Writers may run between the order's computation (shared lock) and the moves (exclusive
    # lock): slots added meanwhile must keep their rows, ids, codes and links. A loaded index
    # (rows, codes and links read in place) has its moved copies made under the shared lock; a
    # write in between must void them.
    x = _data(17, 6000)
    ids = np.arange(6000, dtype=np.int64) * 7 + 3
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=64, seed=5, quantization="sq8")
    index.add(x[:1500], ids[:1500], reorder=False, threads=1)
    if source == "loaded":
        index.save(tmp_path / "a.kbi")
        index = kbcore.Index.load(tmp_path / "a.kbi")
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for start in range(1500, 6000, 50):
                index.add(x[start : start + 50], ids[start : start + 50], reorder=False, threads=1)
                if start % 500 == 0:
                    index.remove(ids[start - 40 : start - 30], threads=1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reorders = 0
    while not done.is_set() or reorders == 0:
        index.reorder()
        reorders += 1
    thread.join()
    assert errors == []
    index.reorder()  # and once more with every row in place
    gone = np.concatenate([ids[s - 40 : s - 30] for s in range(1500, 6000, 50) if s % 500 == 0])
    live = np.setdiff1d(ids, gone)
    assert len(index) == len(live)
    assert sorted(index.ids().tolist()) == sorted(live.tolist())
    np.testing.assert_array_equal(index.get_vectors(live), x[np.searchsorted(ids, live)])
    got, _ = index.search(x[np.searchsorted(ids, live[::7])], 1, ef=64, threads=1)
    assert np.mean(got[:, 0] == live[::7]) >= 0.99


def test_a_shard_reorders_only_when_its_index_is_due(reorders: list[int], tmp_path: Path) -> None:
    # What a sharded knowledge base's graph builder calls on each shard (ShardedIndex.reorder).
    from kbcore.distributed.shard import ShardState

    opts = {"shard": 0, "dim": DIM, "metric": "l2", "kind": "hnsw", "index_options": {"M": 8, "ef_construction": 64}}
    state = ShardState(str(tmp_path / "shard"), **opts)
    x = _data(18, 1600)
    none = np.empty(0, np.int64)
    state.apply(x[:600], np.arange(600, dtype=np.int64), None, None, none, defer_graph=True)
    state.build_graph(None, 1)
    assert not state.reorder_due() and not state.reorder_if_due()  # 600 rows: below 1,000
    state.apply(x[600:], np.arange(600, 1600, dtype=np.int64), None, None, none, defer_graph=True)
    assert not state.reorder_due()  # rows still wait for the graph
    state.build_graph(None, 1)
    assert state.reorder_due() and state.reorder_if_due()
    assert reorders == [1600] and not state.reorder_due()
    got, _ = state.index.search(x[::40], 1, ef=64, threads=1)
    np.testing.assert_array_equal(got[:, 0], np.arange(0, 1600, 40))
