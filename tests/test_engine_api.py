"""The engine's public calls that replace private access: stats(), SearchOptions,
prepare()/ingest_prepared(), Index.text_documents(), compiled filters, one score mapping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine, Index
from kbcore.engine import KbStats, PreparedDocument, SearchOptions, is_valid_name, score_from_distance
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError
from kbcore.filters import native_filter
from kbcore.index import KINDS, METRICS, check_params


@pytest.fixture
def kb(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=60, chunk_overlap=0)
    yield kb
    engine.close()


def test_stats_count_segments_tail_and_checkpoint(kb):
    assert kb.stats() == KbStats(
        chunks=0,
        documents=0,
        segments=0,
        tail_rows=0,
        checkpoint_rows=0,
        vector_files=0,
        pending_graph_rows=0,
        text_leg_unsaved=False,
        generation=1,
    )
    kb.ingest(text="Keys rotate every ninety days. " * 6, document_id="a")
    kb.ingest(text="Deploys roll back with shipit. " * 6, document_id="b")
    s = kb.stats()
    assert (s.documents, s.segments, s.vector_files, s.checkpoint_rows) == (2, 2, 2, 0)
    assert s.chunks == len(kb) == s.tail_rows > 2 and s.generation == 3
    kb.checkpoint()
    s = kb.stats()
    assert (s.tail_rows, s.vector_files, s.checkpoint_rows) == (0, 0, len(kb))
    kb.wait_until_indexed()
    assert kb.stats().pending_graph_rows == 0


def test_wait_until_indexed_checks_its_timeout(kb):
    from kbcore.errors import InvalidArgumentError, InvalidTypeError

    kb.ingest(text="linked in the background " * 20, document_id="d")
    for bad, error in (("3", InvalidTypeError), (True, InvalidTypeError), (-1, InvalidArgumentError)):
        with pytest.raises(error, match="timeout"):
            kb.wait_until_indexed(bad)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        kb.wait_until_indexed(float("nan"))  # would never pass its deadline
    assert kb.wait_until_indexed(60.0) and kb.wait_until_indexed(0) and kb.pending_graph_rows == 0


def test_search_options_equal_keyword_arguments(kb):
    for i in range(6):
        kb.ingest(text=f"Document {i} is about zebra{i} and shared words. " * 3, document_id=f"d{i}")
    for kw in (
        {},
        {"deduplicate": True},
        {"search_type": "hybrid", "fusion": "linear"},
        {"search_type": "full_text", "filters": {"document_id": {"$ne": "d1"}}},
    ):
        want = [(h.id, h.score) for h in kb.retrieve("zebra1 shared", 5, **kw)]
        got = [(h.id, h.score) for h in kb.retrieve("zebra1 shared", 5, SearchOptions(**kw))]
        assert got == want and got
    base = SearchOptions(search_type="full_text")
    # a keyword overrides the options object
    assert [h.id for h in kb.retrieve("zebra2", 3, base, deduplicate=True)] == [
        h.id for h in kb.retrieve("zebra2", 3, search_type="full_text", deduplicate=True)
    ]
    keys = kb.retrieve_key("zebra3", 2, base)
    assert keys[0].key == "d3"
    with pytest.raises(InvalidTypeError, match="unknown search option 'dedup'"):
        kb.retrieve("x", 3, dedup=True)
    with pytest.raises(InvalidTypeError, match="SearchOptions"):
        kb.retrieve("x", 3, {"deduplicate": True}, ef=10)
    with pytest.raises(InvalidArgumentError, match="rrf_k"):
        kb.retrieve("x", 3, SearchOptions(rrf_k=-1))


def test_prepare_then_ingest_prepared_equals_ingest(tmp_path):
    engine = Engine(tmp_path)
    one = engine.create_knowledge_base("one", chunk_size=40, chunk_overlap=5)
    two = engine.create_knowledge_base("two", chunk_size=40, chunk_overlap=5, embedder=False, dim=one.dim)
    text = "Incident commanders post status updates every thirty minutes. " * 4
    one.ingest(text=text, document_id="doc", metadata={"team": "ops"})
    prepared = two.prepare(text=text, document_id="doc", metadata={"team": "ops"})
    assert isinstance(prepared, PreparedDocument) and prepared.pipeline == "default"
    assert len(prepared.texts) > 1 and len(two) == 0  # nothing stored yet
    result = two.ingest_prepared(prepared, one.embedder.embed(prepared.texts))
    assert (result.document_id, result.chunks, result.replaced) == ("doc", len(prepared.texts), False)
    q = one.embedder.embed(["status updates"])[0]
    a = [(h.content, h.metadata, round(h.score, 6)) for h in one.retrieve(q, 10)]
    b = [(h.content, h.metadata, round(h.score, 6)) for h in two.retrieve(q, 10)]
    assert a == b and a
    assert two.document_text("doc") == one.document_text("doc")
    again = two.ingest_prepared(
        two.prepare(text="replacement text only", document_id="doc"), np.ones((1, one.dim), np.float32)
    )
    assert again.replaced and [d.chunks for d in two.documents()] == [1]
    with pytest.raises(InvalidArgumentError, match="shape"):
        two.ingest_prepared(prepared, np.ones((1, one.dim)))
    with pytest.raises(InvalidArgumentError, match="dimension"):
        two.ingest_prepared(prepared, np.ones((len(prepared.texts), one.dim + 1)))
    with pytest.raises(InvalidArgumentError, match="NaN"):
        two.ingest_prepared(prepared, np.full((len(prepared.texts), one.dim), np.nan))
    with pytest.raises(InvalidTypeError, match="PreparedDocument"):
        two.ingest_prepared({"texts": []}, np.ones((0, one.dim)))
    with pytest.raises(NotFoundError, match="no pipeline"):
        two.prepare(text="x", pipeline="nope")
    engine.close()


def test_index_text_documents_and_compiled_filters():
    idx = Index(4, "l2", "flat")
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((20, 4)).astype(np.float32)
    idx.add(
        vecs,
        np.arange(20),
        metadata=[{"g": i % 3} for i in range(20)],
        texts=[f"word{i % 2}" if i < 10 else None for i in range(20)],
    )
    assert idx.text_documents() == 10
    where = {"g": 1}
    nf = native_filter(where)
    assert native_filter(nf) is nf
    for q in vecs[:3]:
        ids_w, d_w = idx.search(q, 5, where=where)
        ids_c, d_c = idx.search(q, 5, where=nf)
        np.testing.assert_array_equal(ids_w, ids_c)
        np.testing.assert_array_equal(d_w, d_c)
    t_w = idx.search_text("word1", 10, where=where)
    t_c = idx.search_text("word1", 10, where=nf)
    np.testing.assert_array_equal(t_w[0], t_c[0])


@pytest.mark.parametrize("metric", METRICS)
def test_score_from_distance_scalar_and_array_agree(metric):
    d = np.array([-0.5, 0.0, 0.3, 1.0, 1.7, 2.0, 3.5], np.float32)
    arr = score_from_distance(d, metric)
    scal = [score_from_distance(float(x), metric) for x in d]
    np.testing.assert_allclose(arr, scal, rtol=0, atol=1e-12)
    assert ((arr >= 0) & (arr <= 1)).all()
    if metric == "l2":
        np.testing.assert_allclose(arr, 1 / (1 + np.maximum(d.astype(np.float64), 0)))
    else:
        np.testing.assert_allclose(arr, np.clip(1 - d.astype(np.float64) / 2, 0, 1))


def test_index_parameters_are_checked_without_building_an_index(tmp_path):
    assert KINDS == ("hnsw", "flat") and METRICS == ("cosine", "ip", "l2")
    assert check_params("cosine", "hnsw", 16, 200, 64) == (16, 200, 64)
    for args, match in (
        (("dot", "hnsw", 16, 200, 64), "metric"),
        (("l2", "ivf", 16, 200, 64), "kind"),
        (("l2", "hnsw", 1, 200, 64), "M must be in"),
        (("l2", "hnsw", 16, 0, 64), "ef_construction"),
        (("l2", "hnsw", 16, 200, -1), "ef"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            check_params(*args)
    engine = Engine(tmp_path)
    with pytest.raises(InvalidArgumentError, match="M must be in"):
        engine.create_knowledge_base("bad", M=300)
    with pytest.raises(InvalidArgumentError, match="unknown index"):
        engine.create_knowledge_base("bad", index="ivf")
    assert engine.knowledge_bases() == []


def test_ingest_table_and_fused_dedup_keep_documents_together(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("t", embedder=False, index="flat", dim=4)
    rng = np.random.default_rng(11)
    doc = np.repeat(np.arange(8), 3)
    order = rng.permutation(len(doc))
    table = pa.table({"document_id": [f"d{d}" for d in doc[order]], "text": [f"alpha beta{d}" for d in doc[order]]})
    kb.ingest_table(table, vectors=rng.standard_normal((len(doc), 4)).astype(np.float32))
    hits = kb.retrieve("alpha beta3", 5, search_type="full_text", deduplicate=True)
    assert len({h.document_id for h in hits}) == len(hits) == 5
    assert hits[0].document_id == "d3" and sorted(hits[0].part_ids) == [0, 1, 2]
    engine.close()


def test_a_closed_knowledge_base_does_not_restart_its_graph_builder(tmp_path):
    import threading

    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("g", embedder=False, dim=8)
    rng = np.random.default_rng(5)
    n = 20_000
    kb.ingest_table(
        pa.table({"document_id": [f"d{i // 4}" for i in range(n)], "text": ["t"] * n}),
        vectors=rng.standard_normal((n, 8)).astype(np.float32),
    )
    kb.close()
    kb.wait_until_indexed(timeout=0.2)  # returns at once or after the timeout, starting nothing
    assert not [t for t in threading.enumerate() if t.name == "kbcore-graph-g" and t.is_alive()]
    reopened = Engine(tmp_path)["g"]  # the rows left unlinked were saved as pending
    assert len(reopened) == n and reopened.wait_until_indexed(timeout=120)
    reopened.close()


def test_name_validation_is_one_public_rule():
    assert is_valid_name("docs") and is_valid_name("a.b_c-1") and is_valid_name("x" * 128)
    for bad in ("", "docs\n", "\ndocs", "x" * 129, ".hidden", "a/b", "é", None, 5):
        assert not is_valid_name(bad), bad


def test_ingest_with_a_per_call_embedder(tmp_path):
    """A knowledge base created without an embedder ingests files (a zip's members too) with
    an embedder given per call; a different dimension is refused naming both."""
    import io
    import zipfile

    from kbcore.embedders import HashingEmbedder

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("docs/a.md", "# Keys\n\nRotate the signing keys every 90 days.\n")
        zf.writestr("docs/b.txt", "The cafeteria opens at noon.\n")
    with Engine(tmp_path) as engine:
        kb = engine.create_knowledge_base("ext", embedder=False)
        res = kb.ingest(buf.getvalue(), filename="bundle.zip", document_id="bundle", embedder=HashingEmbedder(32))
        assert sorted(m.document_id for m in res.members) == ["bundle/docs/a.md", "bundle/docs/b.txt"]
        assert kb.dim == 32 and kb.embedder is None
        hit = kb.retrieve(HashingEmbedder(32).embed(["signing keys rotation"])[0], top_k=1)[0]
        assert hit.document_id == "bundle/docs/a.md" and hit.metadata["section"] == "Keys"
        with pytest.raises(InvalidArgumentError, match="64-dimensional.*32-dimensional"):
            kb.ingest(text="more", document_id="c", embedder=HashingEmbedder(64))
        with pytest.raises(InvalidArgumentError, match="has no embedder"):
            kb.ingest(text="more", document_id="c")
