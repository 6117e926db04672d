"""KnowledgeBase.search_ids (the ids-only vector path) and get_hits against retrieve: the same
rows, order and distances on random knowledge bases, the same errors, a consistent snapshot
under a concurrent writer."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError

DIM = 12


def _table(
    rng: np.random.Generator, first_doc: int, n_docs: int, pipeline_tag: str = ""
) -> tuple[pa.Table, np.ndarray]:
    counts = rng.integers(1, 5, n_docs)
    doc = np.repeat(np.arange(first_doc, first_doc + n_docs), counts)
    n = len(doc)
    table = pa.table(
        {
            "document_id": [f"{pipeline_tag}d{d}" for d in doc],
            "text": [f"text {pipeline_tag}{d}-{i}" for i, d in enumerate(doc)],
            "bucket": rng.integers(0, 10, n),
        }
    )
    return table, rng.standard_normal((n, DIM)).astype(np.float32)


def _random_kb(tmp_path, seed: int, index: str, quantization: str | None, metric: str):
    """A knowledge base of several segments (four ingests), two pipelines, some documents deleted."""
    rng = np.random.default_rng(seed)
    engine = Engine(tmp_path / f"e{seed}")
    kw = {"M": 8, "ef_construction": 40} if index == "hnsw" else {}
    kb = engine.create_knowledge_base(
        "kb", embedder=False, dim=DIM, index=index, metric=metric, quantization=quantization, **kw
    )
    kb.create_pipeline("other")
    for b in range(4):
        table, vecs = _table(rng, 30 * b, 30)
        kb.ingest_table(table, vectors=vecs, metadata_columns=["bucket"], span_columns=None)
    table, vecs = _table(rng, 0, 20, "o")
    kb.ingest_table(table, vectors=vecs, metadata_columns=["bucket"], span_columns=None, pipeline="other")
    for d in rng.choice(120, 15, replace=False):
        kb.delete_document(f"d{d}")
    kb.wait_until_indexed()
    return engine, kb


def _assert_same(kb, q, top_k, *, parts: bool = False, **opts):
    ids, dist = kb.search_ids(q, top_k, **opts)
    hits = kb.retrieve(q, top_k, **opts)
    assert ids.dtype == np.int64 and dist.dtype == np.float32
    assert ids.shape == dist.shape == (len(hits),)
    assert ids.tolist() == [h.id for h in hits]
    assert dist.tolist() == [h.distance for h in hits]  # bit for bit: the same float32 values
    if parts:  # a parent-child hit's part_ids (the children met) come from the search only
        assert any(h.part_ids for h in hits)
        hits = [replace(h, part_ids=()) for h in hits]
    assert kb.get_hits(ids, dist) == hits
    return ids


@pytest.mark.parametrize(
    ("index", "quantization", "metric"),
    [("flat", None, "cosine"), ("hnsw", None, "l2"), ("hnsw", "sq8", "cosine"), ("hnsw", "sq8", "ip")],
)
def test_search_ids_matches_retrieve_rows_order_and_distances(tmp_path, index, quantization, metric):
    engine, kb = _random_kb(tmp_path, 3, index, quantization, metric)
    assert kb.stats().segments >= 2
    rng = np.random.default_rng(7)
    n = len(kb)
    seen_short = False
    for i in range(25):
        q = rng.standard_normal(DIM).astype(np.float32)
        for top_k in (1, 10, n + 5):
            _assert_same(kb, q, top_k)
            _assert_same(kb, q, top_k, ef=16 + i)
        got = _assert_same(kb, q, 10, filters={"bucket": {"$lt": 3}})
        seen_short |= len(_assert_same(kb, q, 50, filters={"bucket": 0}, pipelines="other")) < 50
        assert len(got) == 10
        _assert_same(kb, q, 8, pipelines=["default"], filters={"bucket": {"$gte": 5}})
    assert seen_short  # the padding of a filter passing fewer rows than top_k was met and trimmed
    # A top_k beyond the native bound is cut to the row count first, as retrieve does.
    assert len(_assert_same(kb, q, 2**40)) == n
    # A float64 list query and a [1, dim] query are what retrieve accepts too.
    q = rng.standard_normal(DIM)
    _assert_same(kb, q.tolist(), 5)
    _assert_same(kb, q[None, :], 5)
    engine.close()


def test_search_ids_of_an_empty_knowledge_base_is_two_empty_arrays(tmp_path):
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    q = np.ones(DIM, np.float32)
    assert kb.retrieve(q, 5) == []
    ids, dist = kb.search_ids(q, 5)
    assert ids.dtype == np.int64 and dist.dtype == np.float32 and ids.shape == dist.shape == (0,)
    undimensioned = engine.create_knowledge_base("nodim", embedder=False)
    ids, dist = undimensioned.search_ids(q, 5)
    assert len(ids) == len(dist) == 0 and undimensioned.retrieve(q, 5) == []
    assert kb.get_hits([]) == []
    table, vecs = _table(np.random.default_rng(0), 0, 3)
    kb.ingest_table(table, vectors=vecs, span_columns=None)
    for d in range(3):
        kb.delete_document(f"d{d}")
    ids, dist = kb.search_ids(q, 5)
    assert len(ids) == 0 and kb.retrieve(q, 5) == []
    engine.close()


def _error(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize(
    ("query", "opts", "top_k"),
    [
        (np.ones(DIM + 1, np.float32), {}, 5),  # wrong dimension
        (np.full(DIM, np.nan, np.float32), {}, 5),  # NaN
        (np.array(["a"] * DIM), {}, 5),  # not numeric
        (np.ones((2, DIM), np.float32), {}, 5),  # two queries
        (b"bytes", {}, 5),
        (np.ones(DIM, np.float32), {}, 0),  # top_k below 1
        (np.ones(DIM, np.float32), {}, True),  # top_k not an int
        (np.ones(DIM, np.float32), {}, 2.5),
        (np.ones(DIM, np.float32), {"ef": 0}, 5),
        (np.ones(DIM, np.float32), {"ef": "wide"}, 5),
        (np.ones(DIM, np.float32), {"filters": {"bucket": {"$near": 3}}}, 5),
        (np.ones(DIM, np.float32), {"pipelines": "missing"}, 5),
    ],
)
def test_search_ids_raises_what_retrieve_raises(tmp_path, query, opts, top_k):
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    table, vecs = _table(np.random.default_rng(0), 0, 10)
    kb.ingest_table(table, vectors=vecs, metadata_columns=["bucket"], span_columns=None)
    expected = _error(lambda: kb.retrieve(query, top_k, **opts))
    assert issubclass(expected[0], (ValueError, TypeError, KeyError))
    assert _error(lambda: kb.search_ids(query, top_k, **opts)) == expected
    engine.close()


def test_search_ids_refuses_what_it_does_not_do(tmp_path):
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    q = np.ones(DIM, np.float32)
    for name, value in [
        ("deduplicate", True),
        ("score_threshold", 0.5),
        ("rerank", True),
        ("context_window", 1),
        ("search_type", "hybrid"),
        ("query_vector", q),
    ]:
        with pytest.raises(InvalidArgumentError, match=f"search_ids does not do .*{name}="):
            kb.search_ids(q, 5, **{name: value})
    with pytest.raises(InvalidTypeError, match="unknown option 'limit'"):
        kb.search_ids(q, 5, limit=3)
    with pytest.raises(InvalidTypeError, match="embed_query"):
        kb.search_ids("a text query", 5)
    kb.close()
    with pytest.raises(InvalidArgumentError, match="is closed"):
        kb.search_ids(q, 5)
    with pytest.raises(InvalidArgumentError, match="is closed"):
        kb.get_hits([0])
    engine.close()


def test_get_hits_rejects_unknown_ids_and_bad_distances(tmp_path):
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM, metric="l2")
    table, vecs = _table(np.random.default_rng(1), 0, 6)
    kb.ingest_table(table, vectors=vecs, span_columns=None)
    ids, dist = kb.search_ids(vecs[0], 4)
    gone = kb.get_hits(ids[:1])[0].document_id
    plain = kb.get_hits(ids)
    assert [h.id for h in plain] == ids.tolist()
    assert all(math.isnan(h.distance) and math.isnan(h.score) for h in plain)
    assert [h.content for h in plain] == [h.content for h in kb.get_hits(ids, dist)]
    kb.delete_document(gone)
    with pytest.raises(NotFoundError, match=f"no chunk {ids[0]}"):
        kb.get_hits(ids, dist)
    assert issubclass(NotFoundError, KeyError)
    with pytest.raises(NotFoundError):
        kb.get_hits([10**12])
    with pytest.raises(InvalidArgumentError, match="one per id"):
        kb.get_hits(ids[1:], dist)
    with pytest.raises(InvalidTypeError, match="integers"):
        kb.get_hits([1.5])
    with pytest.raises(InvalidTypeError, match="sequence of chunk ids"):
        kb.get_hits(3)
    engine.close()


def test_search_ids_of_a_parent_child_knowledge_base_is_the_best_chunk_per_parent(tmp_path):
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base(
        "pc", index="flat", index_type="parent_child", parent_chunk_size=400, child_chunk_size=80
    )
    rng = np.random.default_rng(4)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]
    for d in range(4):
        kb.ingest(text="\n\n".join(" ".join(rng.choice(words, 40)) for _ in range(6)), document_id=f"doc{d}")
    for query in ("alpha beta", "omega sigma theta", "kappa"):
        q = kb.embed_query(query)
        ids = _assert_same(kb, q, 6, parts=True)
        assert len(ids) == 6 and len(ids) < len(kb)
    engine.close()


def test_search_ids_sees_one_committed_snapshot_under_a_concurrent_writer(tmp_path):
    """A writer replaces a document over and over (each replace adds the new chunks to the
    index, commits, then removes the old ones, under the write lock); every reader answer must
    be the exact top-k of one committed state: the document's three chunks, then the base's
    best five (flat index: exact search). A read without the lock can meet the index between
    the add and the remove (six chunks of the document) and fails this."""
    engine = Engine(tmp_path / "e")
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM, index="flat", metric="l2")
    rng = np.random.default_rng(11)
    base, base_vecs = _table(rng, 0, 40)
    kb.ingest_table(base, vectors=base_vecs, span_columns=None)
    q = rng.standard_normal(DIM).astype(np.float32)
    without = kb.search_ids(q, 8)[0].tolist()
    # Two versions of the replaced document, both right at the query: its chunks lead the answer.
    versions = [(q + 0.01 * rng.standard_normal((3, DIM))).astype(np.float32) for _ in range(2)]
    hot = pa.table({"document_id": ["hot"] * 3, "text": ["hot 0", "hot 1", "hot 2"]})
    kb.ingest_table(hot, vectors=versions[0], span_columns=None)
    stop = threading.Event()
    errors: list[BaseException] = []
    answers: list[list[int]] = []

    def write() -> None:
        try:
            for r in range(20):
                kb.ingest_table(hot, vectors=versions[(r + 1) % 2], span_columns=None)
        except BaseException as exc:  # noqa: BLE001 - reported on the main thread
            errors.append(exc)
        finally:
            stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                answers.append(kb.search_ids(q, 8)[0].tolist())
        except BaseException as exc:  # noqa: BLE001 - reported on the main thread
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writer = threading.Thread(target=write)
    for t in readers:
        t.start()
    writer.start()
    writer.join(120)
    for t in readers:
        t.join(120)
    assert not errors, errors
    for got in answers:
        assert len(set(got[:3]) - set(without)) == 3 and got[3:] == without[:5], got
    assert len({tuple(got[:3]) for got in answers}) >= 2, f"{len(answers)} answers met one state only"
    final = kb.search_ids(q, 8)[0]
    assert final.tolist() == [h.id for h in kb.retrieve(q, 8)]
    engine.close()
