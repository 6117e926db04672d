"""One query against several indexes in one native call (``kbcore.index.search_many``, the
persistent search pool) and ``Engine.retrieve`` over several knowledge bases on it: the same
answers as one search per index / the serial path, on pools of 1, 2 and 4 threads, and a
failing search raising a clear error on the caller, never a hang."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from chunk_tables import chunk_table

from kbcore import Engine
from kbcore.engine import KnowledgeBase
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError
from kbcore.index import Index, Search, search_many, search_threads, set_search_threads, wake_search_pool

DIM = 8
TOPICS = ["rockets", "volcanoes", "glaciers", "orchids", "bridges", "compilers", "sonnets", "tides"]


@pytest.fixture
def pool_sizes():
    """Each test leaves the process's search pool at its default size."""
    yield (1, 2, 4)
    set_search_threads(0)


def _index(seed: int, n: int = 400) -> Index:
    rng = np.random.default_rng(seed)
    index = Index(DIM, metric="l2", kind="hnsw", M=8, ef_construction=64)
    meta = [{"doc": int(i % 23), "team": ("a", "b")[i % 2]} for i in range(n)]
    index.add(rng.standard_normal((n, DIM)).astype(np.float32), np.arange(n) + 10_000 * seed, metadata=meta)
    return index


def test_search_many_equals_one_search_per_index(pool_sizes):
    indexes = [_index(s, 300 + 40 * s) for s in range(4)]
    rng = np.random.default_rng(3)
    for threads in pool_sizes:
        set_search_threads(threads)
        assert search_threads() == threads
        for _ in range(5):
            q = rng.standard_normal(DIM).astype(np.float32)
            searches = [Search(ix, q, 7, where={"team": "b"} if i % 2 else None, ef=32) for i, ix in enumerate(indexes)]
            searches += [Search(ix, q, 5, group_by="doc", group_size=2) for ix in indexes]
            got = search_many(searches)
            for s, result in zip(searches, got):
                if s.group_by is None:
                    ids, dist = s.index.search(q, s.k, where=s.where, ef=s.ef, threads=1)
                    assert np.array_equal(result[0], ids) and np.array_equal(result[1], dist)
                else:
                    want = s.index.search_groups(q, s.k, group_by="doc", group_size=2, threads=1)
                    assert result == want and len(result) == 5


def test_search_many_raises_the_failing_searchs_error(pool_sizes):
    indexes = [_index(s) for s in range(3)]
    q = np.random.default_rng(4).standard_normal(DIM).astype(np.float32)
    bad = q.copy()
    bad[2] = np.nan
    for threads in pool_sizes:
        set_search_threads(threads)
        with pytest.raises(InvalidArgumentError):
            search_many([Search(indexes[0], q, 3), Search(indexes[1], bad, 3), Search(indexes[2], q, 3)])
        with pytest.raises(InvalidArgumentError, match="dimension"):
            search_many([Search(indexes[0], q, 3), Search(indexes[1], q[:4], 3)])
        with pytest.raises(InvalidArgumentError, match="k"):
            search_many([Search(indexes[0], q, 0)])
        with pytest.raises(InvalidTypeError, match="Index"):
            search_many([Search(object(), q, 3)])  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="Search"):
            search_many([(indexes[0], q, 3)])  # type: ignore[list-item]
        # the pool serves after a failure
        assert len(search_many([Search(ix, q, 3) for ix in indexes])) == 3
    with pytest.raises(InvalidArgumentError, match="threads"):
        set_search_threads(-1)


def test_wake_search_pool_is_a_hint_that_keeps_the_answers(pool_sizes):
    indexes = [_index(s) for s in range(4)]
    q = np.random.default_rng(5).standard_normal(DIM).astype(np.float32)
    want = [ix.search(q, 6, threads=1) for ix in indexes]
    for threads in (*pool_sizes, 0):
        set_search_threads(threads)
        for tasks in (0, 1, 4, 100):
            wake_search_pool(tasks)
            got = search_many([Search(ix, q, 6) for ix in indexes])
            assert all(np.array_equal(g[0], w[0]) and np.array_equal(g[1], w[1]) for g, w in zip(got, want))
    with pytest.raises(InvalidArgumentError, match="tasks must be positive"):
        wake_search_pool(-1)
    with pytest.raises(InvalidTypeError, match="tasks must be an integer"):
        wake_search_pool("4")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="tasks must be an integer"):
        wake_search_pool(True)


def test_engine_retrieve_wakes_the_pool_for_its_vector_searches(tmp_path, monkeypatch):
    from kbcore.engine import multi

    engine = _engine(tmp_path)
    woken: list[int] = []
    monkeypatch.setattr(multi, "expect_searches", woken.append)
    q = np.random.default_rng(6).standard_normal(DIM).astype(np.float32)
    engine.retrieve(["k0", "k1", "k2", "k3"], q, 5)
    engine.retrieve(["k0", "k1"], "rockets", 5, search_type="full_text")
    engine.retrieve(["k0"], q, 5)
    assert woken == [4, 0]  # four vector searches; none; one knowledge base: no call
    engine.close()


def _table(seed: int, n_docs: int = 9, per_doc: int = 5) -> tuple[pa.Table, np.ndarray]:
    return chunk_table(n_docs, per_doc, seed, DIM, TOPICS)


def _engine(tmp_path, kinds=("hnsw", "flat", "hnsw", "hnsw")) -> Engine:
    engine = Engine(tmp_path / "m")
    for i, kind in enumerate(kinds):
        kb = engine.create_knowledge_base(f"k{i}", embedder=False, index=kind)
        table, vecs = _table(20 + i)
        kb.ingest_table(table, vectors=vecs)
        kb.wait_until_indexed()
    return engine


def _serial(monkeypatch, engine, names, query, top_k, **kw):
    """``Engine.retrieve`` on the path before the batched search: each knowledge base's own
    ``_shortlist`` call, one after the other."""
    with monkeypatch.context() as m:
        m.setattr(KnowledgeBase, "_vector_search", lambda *a: None)
        return engine.retrieve(names, query, top_k, **kw)


def _rows(hits):
    return [(h.id, h.document_id, h.content, h.metadata, h.distance, h.score, h.part_ids) for h in hits]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"deduplicate": True},
        {"filters": {"team": "b"}, "score_threshold": 0.3},
        {"ef": 16},
        {"pipelines": "default"},
    ],
)
def test_engine_retrieve_over_the_pool_equals_the_serial_path(tmp_path, monkeypatch, pool_sizes, kw):
    engine = _engine(tmp_path)
    names = ["k0", "k1", "k2", "k3"]
    calls = []
    original = KnowledgeBase._vector_search

    def counting(self, *a):
        calls.append(self.name)
        return original(self, *a)

    rng = np.random.default_rng(8)
    queries = [rng.standard_normal(DIM).astype(np.float32) for _ in range(6)]
    for threads in pool_sizes:
        set_search_threads(threads)
        for q in queries:
            want = _serial(monkeypatch, engine, names, q, 8, **kw)
            with monkeypatch.context() as m:
                m.setattr(KnowledgeBase, "_vector_search", counting)
                got = engine.retrieve(names, q, 8, **kw)
            assert _rows(got) == _rows(want) and len(got) > 0
    assert len(calls) == len(names) * len(queries) * len(pool_sizes)  # the batched path ran
    engine.close()


def test_engine_retrieve_over_the_pool_with_parent_child_and_mixed_search_types(tmp_path, monkeypatch, pool_sizes):
    engine = Engine(tmp_path / "pc")
    for name, extra in (("p0", {"index_type": "parent_child"}), ("p1", {}), ("p2", {"index_type": "parent_child"})):
        kb = engine.create_knowledge_base(name, parent_chunk_size=300, child_chunk_size=60, **extra)
        for s in range(3):
            words = np.random.default_rng(100 * len(name) + s + 7 * int(name[1])).integers(0, 8, 120)
            kb.ingest(text=" ".join(TOPICS[int(w)] for w in words), document_id=f"{name}-{s}")
        kb.wait_until_indexed()
    names = ["p0", "p1", "p2"]
    for threads in pool_sizes:
        set_search_threads(threads)
        for query in ("rockets volcanoes", "orchids tides", "compilers"):
            for kw in ({}, {"deduplicate": True}, {"search_type": "hybrid"}, {"filters": {"document_id": "p1-1"}}):
                want = _serial(monkeypatch, engine, names, query, 5, **kw)
                got = engine.retrieve(names, query, 5, **kw)
                assert _rows(got) == _rows(want) and len(got) > 0
    engine.close()


def test_engine_retrieve_failure_in_one_search_is_a_clear_error(tmp_path, pool_sizes):
    engine = _engine(tmp_path, ("hnsw", "hnsw"))
    other = engine.create_knowledge_base("wide", embedder=False, index="hnsw")
    table, _ = _table(5)
    other.ingest_table(table, vectors=np.ones((len(table), DIM * 2), np.float32))
    q = np.random.default_rng(9).standard_normal(DIM).astype(np.float32)
    for threads in pool_sizes:
        set_search_threads(threads)
        with pytest.raises(InvalidArgumentError, match="dimension"):
            engine.retrieve(["k0", "wide", "k1"], q, 5)
        with pytest.raises(NotFoundError):
            engine.retrieve(["k0", "k1"], q, 5, pipelines=["nope"])
        bad = q.copy()
        bad[0] = np.inf
        with pytest.raises(InvalidArgumentError):
            engine.retrieve(["k0", "k1"], bad, 5)
        assert len(engine.retrieve(["k0", "k1"], q, 5)) == 5  # and it still answers
    engine.close()
