"""Knowledge engine: ingest round trips per file type, re-ingest, delete, pipelines, bad input."""

from __future__ import annotations

import importlib.util
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_parsing import _minimal_pdf

from kbcore import Engine
from kbcore.engine import storage
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError
from kbcore.parsing import parse

HAS_PYPDF = importlib.util.find_spec("pypdf") is not None

SAMPLES = {
    "notes.txt": b"Key rotation happens every ninety days.\n\nThe vault tool rotates database passwords too.",
    "guide.md": b"# Deploy guide\n\nRoll back a bad deploy with **shipit rollback**.\n\n- canary first\n- then all",
    "page.html": b"<html><head><title>Oncall</title><script>x=1</script></head><body><p>Pages escalate after "
    b"five minutes.</p><p>Postmortems are blameless.</p></body></html>",
    "faq.jsonl": b'{"title": "Laptops", "text": "Request laptops through the IT portal."}\n'
    b'{"text": "Vacation days carry over until March."}\n',
}
if HAS_PYPDF:
    SAMPLES["manual.pdf"] = _minimal_pdf("Incident commanders post status updates every thirty minutes")


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data")
    yield e
    e.close()


@pytest.fixture
def kb(engine):
    return engine.create_knowledge_base("kb", chunk_size=120, chunk_overlap=20)


def _all_chunks(kb):
    """(document_id, pipeline, chunk_index, text) of every live chunk, read from the segment
    files on disk (the manifest names them; deleted documents are skipped)."""
    out = []
    m = storage.load_manifest(kb.path)
    for entry in m["segments"]:
        chunks = storage.read_arrow(kb.path, entry["files"]["chunks"]).to_pylist()
        counts = storage.read_arrow(kb.path, entry["files"]["docs"]).column("n_chunks").to_pylist()
        doc_of_row = np.repeat(np.arange(len(counts)), counts)
        for row, meta in enumerate(chunks):
            if doc_of_row[row] not in entry["deleted_docs"]:
                out.append((meta["document_id"], meta["pipeline_name"], meta["chunk_index"], meta["__text"]))
    return sorted(out)


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("how", ["path", "bytes"])
def test_round_trip_per_file_type(tmp_path, kb, name, how):
    data = SAMPLES[name]
    if how == "path":
        path = tmp_path / name
        path.write_bytes(data)
        result = kb.ingest(str(path), document_id="d1", metadata={"team": "infra", "tags": ["a", "b"]})
    else:
        result = kb.ingest(data, document_id="d1", filename=name, metadata={"team": "infra", "tags": ["a", "b"]})
    parsed = parse(data, filename=name)
    assert result.document_id == "d1" and result.chunks >= 1 and not result.replaced
    assert result.format == parsed.format
    assert kb.document_text("d1") == parsed.text
    hits = kb.retrieve(parsed.text[:60], top_k=10)
    assert hits and hits[0].document_id == "d1"
    for h in hits:
        assert h.content in parsed.text
        # structured formats add the chunk's heading path (Markdown) or page (PDF)
        structure = {"guide.md": {"section"}, "manual.pdf": {"page"}}.get(name, set())
        assert structure <= set(h.metadata)
        assert h.metadata == {
            "document_id": "d1",
            "file_id": "d1",
            "chunk_index": h.chunk_index,
            "filename": name,
            "pipeline_name": "default",
            "team": "infra",
            "tags": ["a", "b"],
            **{k: h.metadata[k] for k in structure},
        }
        assert 0.0 <= h.score <= 1.0
    assert sorted(h.chunk_index for h in kb.retrieve(parsed.text[:60], top_k=100)) == list(range(result.chunks))


def test_str_content_needs_a_filename_and_ids_default_sensibly(tmp_path, kb):
    r = kb.ingest("Plain words about keys.", filename="k.txt")
    assert r.document_id == "k.txt"
    with pytest.raises(FileNotFoundError, match="pass filename="):
        kb.ingest("Plain words about keys.\nSecond line.")
    p = tmp_path / "x.md"
    p.write_text("# X\n\nbody text")
    assert kb.ingest(str(p)).document_id == str(p)
    r = kb.ingest(text="already extracted text")
    assert len(r.document_id) == 16  # a content hash


def test_reingest_replaces_the_document(kb):
    kb.ingest(text="alpha beta gamma. " * 30, document_id="d", metadata={"v": 1})
    kb.ingest(text="unrelated other document", document_id="other")
    r = kb.ingest(text="delta epsilon. " * 5, document_id="d", metadata={"v": 2})
    assert r.replaced
    chunks = [c for c in _all_chunks(kb) if c[0] == "d"]
    assert len(chunks) == r.chunks and all("delta" in c[3] for c in chunks)
    assert len(kb) == 1 + r.chunks
    hits = kb.retrieve("alpha beta gamma", top_k=50)
    assert all(h.metadata.get("v") in (None, 2) for h in hits)
    assert {h.document_id for h in hits} == {"d", "other"}


def test_delete_frees_vectors_text_and_files(engine, kb):
    kb.ingest(text="first document about keys", document_id="a")
    kb.ingest(text="second document about deploys", document_id="b")
    files_before = set(os.listdir(kb.path))
    assert kb.delete_document("a") == 1
    assert len(kb) == 1 and "a" not in kb and "b" in kb
    assert all(h.document_id == "b" for h in kb.retrieve("first document about keys", top_k=10))
    # the segment that held only "a" is gone from disk
    gone = files_before - set(os.listdir(kb.path))
    assert any(n.endswith(".chunks.arrow") for n in gone)
    with pytest.raises(NotFoundError, match="no document 'a'"):
        kb.delete_document("a")
    assert kb.delete_document("a", missing_ok=True) == 0
    with pytest.raises(KeyError):
        kb.delete_document("a")


def test_delete_inside_a_shared_segment_and_compaction(kb):
    from kbcore.engine import Document

    kb.ingest_many([Document(text=f"document number {i} " * 20, document_id=f"d{i}") for i in range(40)])
    assert kb.stats().segments == 1
    for i in range(30):
        kb.delete_document(f"d{i}")
    assert {d.document_id for d in kb.documents()} == {f"d{i}" for i in range(30, 40)}
    kb.compact()
    stats = kb.stats()
    assert stats.segments == 1 and stats.chunks == len(kb)
    assert storage.load_manifest(kb.path)["segments"][0]["rows"] == len(kb)
    assert {h.document_id for h in kb.retrieve("document number 35", top_k=100)} == {f"d{i}" for i in range(30, 40)}


def test_pipelines_merge_and_dedup_per_pipeline(kb):
    kb.create_pipeline("small", chunk_size=40, chunk_overlap=0)
    assert kb.pipelines["small"] == {"chunk_size": 40, "chunk_overlap": 0}
    text = "Signing keys rotate every ninety days. Passwords rotate every thirty days. " * 3
    a = kb.ingest(text=text, document_id="doc")
    b = kb.ingest(text=text, document_id="doc", pipeline="small")
    assert b.chunks > a.chunks and not b.replaced
    hits = kb.retrieve("signing keys rotate", top_k=100)
    assert {h.pipeline_name for h in hits} == {"default", "small"}
    dedup = kb.retrieve("signing keys rotate", top_k=10, deduplicate=True)
    assert sorted((h.document_id, h.pipeline_name) for h in dedup) == [("doc", "default"), ("doc", "small")]
    small_parts = next(h for h in dedup if h.pipeline_name == "small").part_ids
    assert len(small_parts) == b.chunks  # every chunk of the document met, as chunk indexes
    assert sorted(small_parts) == list(range(b.chunks))
    only = kb.retrieve("signing keys rotate", top_k=100, pipelines=["small"])
    assert only and all(h.pipeline_name == "small" for h in only)
    keys = kb.retrieve_key("signing keys", topk=5, deduplicate=True)
    assert sorted(k.pipeline_name for k in keys) == ["default", "small"]
    assert kb.delete_document("doc", pipeline="small") == b.chunks
    assert {h.pipeline_name for h in kb.retrieve("signing keys rotate", top_k=100)} == {"default"}
    kb.ingest(text=text, document_id="doc2", pipeline="small")
    kb.delete_pipeline("small")
    assert "small" not in kb.pipelines and len(kb) == a.chunks
    with pytest.raises(NotFoundError, match="no pipeline 'small'"):
        kb.ingest(text="x", pipeline="small")
    with pytest.raises(InvalidArgumentError, match="already exists"):
        kb.create_pipeline("default")


def test_ingest_table_pre_embedded(tmp_path, engine):
    rng = np.random.default_rng(1)
    n, dim = 60, 8
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    doc = [f"d{i % 7}" for i in range(n)]  # rows of one document are not adjacent
    table = pa.table(
        {
            "document_id": doc,
            "text": [f"chunk {i}" for i in range(n)],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), dim),
            "year": pa.array(rng.integers(2000, 2025, n)),
            "lang": ["en", "de"] * (n // 2),
        }
    )
    kb = engine.create_knowledge_base("vec", embedder=False, index="flat")
    assert kb.dim is None
    assert kb.ingest_table(table) == 7
    assert kb.dim == dim and len(kb) == n
    q = rng.standard_normal(dim).astype(np.float32)
    hits = kb.retrieve(q, top_k=5)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    order = np.argsort(1 - unit @ (q / np.linalg.norm(q)), kind="stable")[:5]
    assert [h.content for h in hits] == [f"chunk {i}" for i in order]
    h = hits[0]
    i = int(order[0])
    assert h.metadata["year"] == int(table["year"][i].as_py()) and h.metadata["lang"] == table["lang"][i].as_py()
    assert h.chunk_index == [j for j in range(n) if doc[j] == doc[i]].index(i)  # rank in row order
    # filters on table metadata; a text query needs an embedder
    assert all(x.metadata["lang"] == "de" for x in kb.retrieve(q, top_k=20, filters={"lang": "de"}))
    with pytest.raises(InvalidArgumentError, match="has no embedder"):
        kb.retrieve("text query")
    with pytest.raises(InvalidArgumentError, match="has no embedder"):
        kb.ingest(text="text")
    # re-ingest of a document through a Parquet file with vectors= replaces it
    path = tmp_path / "d0.parquet"
    pq.write_table(pa.table({"document_id": ["d0", "d0"], "text": ["new a", "new b"]}), path)
    kb.ingest_table(str(path), vectors=np.ones((2, dim), np.float32))
    assert sorted(c.content for c in kb.retrieve(np.ones(dim), top_k=n) if c.document_id == "d0") == ["new a", "new b"]
    with pytest.raises(InvalidArgumentError, match="dimension 3"):
        kb.ingest_table(pa.table({"document_id": ["x"], "text": ["t"]}), vectors=np.ones((1, 3)))
    with pytest.raises(InvalidArgumentError, match="no vector column"):
        kb.ingest_table(pa.table({"document_id": ["x"], "text": ["t"]}))
    with pytest.raises(InvalidArgumentError, match="reserved"):
        kb.ingest_table(pa.table({"document_id": ["x"], "text": ["t"], "file_id": ["f"]}), vectors=np.ones((1, dim)))
    with pytest.raises(InvalidArgumentError, match="NaN"):
        kb.ingest_table(pa.table({"document_id": ["x"], "text": ["t"]}), vectors=np.full((1, dim), np.nan))


def _state(kb):
    return (len(kb), kb.stats().generation, sorted(os.listdir(kb.path)))


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda kb, p: kb.ingest(str(p / "missing.txt")), FileNotFoundError, "No such file"),
        (lambda kb, p: kb.ingest(b"", filename="e.txt"), InvalidArgumentError, "is empty"),
        (lambda kb, p: kb.ingest(b"\x80\x81\xfe", filename="bin.txt"), InvalidArgumentError, "not valid UTF-8"),
        (lambda kb, p: kb.ingest(b"data", filename="sheet.ods"), InvalidArgumentError, "unsupported file type"),
        (lambda kb, p: kb.ingest(text="   "), InvalidArgumentError, "empty"),
        (lambda kb, p: kb.ingest(text="ok", metadata={"file_id": "x"}), InvalidArgumentError, "reserved"),
        (lambda kb, p: kb.ingest(text="ok", metadata={"nested": {"a": 1}}), InvalidTypeError, "values must be"),
        (lambda kb, p: kb.ingest(text="ok", metadata={"x": float("nan")}), InvalidArgumentError, "NaN"),
        (lambda kb, p: kb.ingest(text="ok", document_id=""), InvalidArgumentError, "document_id"),
        (lambda kb, p: kb.ingest(text="ok", pipeline="nope"), NotFoundError, "no pipeline"),
        (lambda kb, p: kb.ingest(str(p)), InvalidArgumentError, "is a directory"),
        (
            lambda kb, p: kb.ingest_many(
                [{"text": "good one", "document_id": "g"}, {"source": b"", "filename": "e.md"}]
            ),
            InvalidArgumentError,
            "is empty",
        ),
        (
            lambda kb, p: kb.ingest_many([{"text": "a", "document_id": "x"}, {"text": "b", "document_id": "x"}]),
            InvalidArgumentError,
            "appears twice",
        ),
    ],
)
def test_bad_input_raises_and_stores_nothing(tmp_path, kb, call, exc, match):
    kb.ingest(text="existing document", document_id="keep")
    before = _state(kb)
    with pytest.raises(exc, match=match):
        call(kb, tmp_path)
    assert _state(kb) == before


def test_knowledge_base_names_and_lookup_errors(engine):
    engine.create_knowledge_base("docs")
    with pytest.raises(InvalidArgumentError, match="already exists"):
        engine.create_knowledge_base("docs")
    assert engine.create_knowledge_base("docs", exist_ok=True) is engine["docs"]
    with pytest.raises(NotFoundError, match="no knowledge base named 'nope'"):
        engine.get_knowledge_base("nope")
    with pytest.raises(KeyError):
        engine["nope"]
    with pytest.raises(NotFoundError):
        engine.delete_knowledge_base("nope")
    for bad in ("", "../x", "a/b", ".hidden", "x" * 200, "docs2\n", "a\nb"):
        with pytest.raises(InvalidArgumentError, match="not valid"):
            engine.create_knowledge_base(bad)
    with pytest.raises(InvalidArgumentError, match="chunk_overlap"):
        engine.create_knowledge_base("c", chunk_size=10, chunk_overlap=10)
    with pytest.raises(InvalidArgumentError, match="metric"):
        engine.create_knowledge_base("c", metric="dot")
    assert engine.knowledge_bases() == ["docs"]


def test_delete_knowledge_base_removes_it(tmp_path, engine):
    kb = engine.create_knowledge_base("gone")
    kb.ingest(text="some text", document_id="a")
    path = kb.path
    engine.delete_knowledge_base("gone")
    assert not os.path.exists(path) and "gone" not in engine.knowledge_bases()
    with pytest.raises(InvalidArgumentError, match="closed"):
        kb.retrieve("some text")
    assert "gone" not in Engine(engine.path).knowledge_bases()


def test_names_with_a_trailing_newline_are_rejected_everywhere(engine):
    kb = engine.create_knowledge_base("docs")
    with pytest.raises(InvalidArgumentError, match="not valid"):
        engine.create_knowledge_base("fresh\n")
    with pytest.raises(InvalidArgumentError, match="not valid"):
        kb.create_pipeline("p\n")
    with pytest.raises(NotFoundError):
        engine.get_knowledge_base("docs\n")
    with pytest.raises(NotFoundError):
        engine.delete_knowledge_base("docs\n")
    assert engine.knowledge_bases() == ["docs"] and list(kb.pipelines) == ["default"]


def test_delete_knowledge_base_stops_its_graph_builder(engine):
    kb = engine.create_knowledge_base("busy", embedder=False, dim=8)
    rng = np.random.default_rng(7)
    n = 20_000  # enough rows that linking them outlasts the ingest call
    table = pa.table({"document_id": [f"d{i // 4}" for i in range(n)], "text": ["t"] * n})
    kb.ingest_table(table, vectors=rng.standard_normal((n, 8)).astype(np.float32))
    builders = [t for t in threading.enumerate() if t.name == "kbcore-graph-busy"]
    assert builders and kb.pending_graph_rows > 0, "the builder should still be linking"
    engine.delete_knowledge_base("busy")
    assert not any(t.is_alive() for t in builders)


def test_progress_bar_is_shown_on_request_and_silent_otherwise(kb, capsys):
    from kbcore.engine import Document

    docs = [Document(text=f"document {i} about things", document_id=f"p{i}") for i in range(5)]
    kb.ingest_many(docs, progress=True)
    assert "ingest kb" in capsys.readouterr().err  # tqdm writes to stderr
    kb.ingest_many(docs)  # stderr is not a terminal here: no bar
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "bad",
    [[[np.nan, 0.0]], [[0.0, np.inf]], [[-np.inf, 1.0]], [[np.inf, 0.0], [-np.inf, 0.0]]],
    ids=["nan", "inf", "-inf", "inf-inf"],
)
def test_pre_embedded_vectors_with_a_non_finite_value_raise_and_store_nothing(engine, bad):
    kb = engine.create_knowledge_base("finite", embedder=False)
    rows = len(bad)
    table = pa.table({"document_id": [f"d{i}" for i in range(rows)], "text": ["t"] * rows})
    with pytest.raises(InvalidArgumentError, match="NaN or infinite"):
        kb.ingest_table(table, vectors=np.array(bad, dtype=np.float32))
    assert kb.stats().chunks == 0
    big = np.full((2, 2), np.finfo(np.float32).max, dtype=np.float32)  # finite, but a float32 sum overflows
    table = pa.table({"document_id": ["a", "b"], "text": ["t", "u"]})
    kb.ingest_table(table, vectors=big)
    assert kb.stats().chunks == 2


def test_index_add_names_a_text_of_the_wrong_type():
    from kbcore import Index

    index = Index(2, metric="l2", kind="flat")
    with pytest.raises(InvalidTypeError, match="texts must be str or None, got bytes"):
        index.add(np.ones((2, 2), np.float32), [1, 2], texts=["ok", b"no"])
    assert len(index) == 0
    index.add(np.ones((2, 2), np.float32), [1, 2], texts=["ok", None])
    assert index.text_documents() == 1


@pytest.mark.parametrize("typ", ["string", "large_string", "chunked"])
def test_index_add_reads_an_arrow_text_array_like_the_list_of_its_values(typ):
    from kbcore import Index

    values = ["skip", "alpha beta", None, "beta gamma ünï", "", "gamma alpha alpha"]
    if typ == "chunked":
        texts = pa.chunked_array([values[:3], values[3:]], type=pa.large_string())
        rows = values
    else:
        texts = pa.array(values, type=getattr(pa, typ)()).slice(1)  # an offset into the buffers
        rows = values[1:]
    n = len(rows)
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((n, 4)).astype(np.float32)
    fast, slow = Index(4, metric="l2", kind="flat"), Index(4, metric="l2", kind="flat")
    fast.add(vecs, np.arange(n), texts=texts)
    slow.add(vecs, np.arange(n), texts=rows)
    assert fast.text_documents() == slow.text_documents() == sum(t is not None for t in rows)
    for q in ("alpha", "beta", "gamma alpha", "ünï"):
        got, want = fast.search_text(q, 10), slow.search_text(q, 10)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_index_add_rejects_arrow_texts_of_another_type_or_length():
    from kbcore import Index

    index = Index(2, metric="l2", kind="flat")
    with pytest.raises(InvalidTypeError, match="texts must be strings"):
        index.add(np.ones((2, 2), np.float32), [1, 2], texts=pa.array([1, 2]))
    with pytest.raises(InvalidArgumentError, match="2 vectors but 3 texts"):
        index.add(np.ones((2, 2), np.float32), [1, 2], texts=pa.array(["a", "b", "c"]))
    bad = (np.array([0, 5, 2], np.int64), np.zeros(4, np.uint8), None)  # decreasing, past the end
    with pytest.raises(InvalidArgumentError, match="offsets are out of range"):
        index._native.add(np.ones((2, 2), np.float32), np.array([1, 2], np.int64), 1, [], bad, False)
    assert len(index) == 0


def test_graph_builder_reorders_a_sharded_index_in_one_call_and_counts_its_shards():
    # A sharded knowledge base's index reorders its due shards itself (ShardedIndex.reorder,
    # one call to the shards): the builder calls it once, never asks reorder_due first, and
    # counts the shards it reordered. A stand-in with that interface.
    from kbcore.engine.graph_builder import GraphBuilder

    class Sharded:
        kind = "hnsw"

        def __init__(self) -> None:
            self.pending = 2
            self.calls: list[str] = []

        def build_graph(self, max_rows: int) -> int:
            self.calls.append("build_graph")
            self.pending = 0
            return 0

        @property
        def reorder_due(self) -> bool:
            raise AssertionError("the builder asked reorder_due of a sharded index")

        def reorder(self) -> int:
            self.calls.append("reorder")
            return 2  # two shards were due

    index = Sharded()
    builder = GraphBuilder("sharded", lambda: index)
    builder.start()
    assert builder.wait(30, lambda: index.pending)
    assert index.calls == ["build_graph", "reorder"]
    assert builder.reorders == 2 and builder.unsaved


def test_graph_builder_reorders_a_grown_index_and_the_reopened_kb_keeps_it(tmp_path, monkeypatch):
    from kbcore.index import _index

    monkeypatch.setattr(_index, "REORDER_MIN_ROWS", 1500)  # 100,000 in production
    rng = np.random.default_rng(21)
    n, dim = 2000, 16
    centres = rng.standard_normal((30, dim)).astype(np.float32)
    vecs = (centres[rng.integers(0, 30, n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)
    table = pa.table({"document_id": [f"d{i}" for i in range(n)], "text": [f"chunk {i}" for i in range(n)]})
    engine = Engine(tmp_path / "data")
    kb = engine.create_knowledge_base("grown", embedder=False, dim=dim, index="hnsw")
    kb.ingest_table(table.slice(0, 1000), vectors=vecs[:1000])
    assert kb.wait_until_indexed(timeout=60)
    assert kb._builder.reorders == 0  # 1,000 rows: below the threshold
    stored = kb.index.ids()
    np.testing.assert_array_equal(stored, np.sort(stored))  # rows in the order they came
    kb.ingest_table(table.slice(1000), vectors=vecs[1000:])
    assert kb.wait_until_indexed(timeout=60)
    assert kb._builder.reorders == 1  # 2,000 rows: linked, then reordered once
    order = kb.index.ids()
    assert not np.array_equal(order, np.sort(order))
    probe = range(0, n, 37)

    def top_texts(k):
        return [[h.content for h in k.retrieve(vecs[i], top_k=1)] for i in probe]

    assert top_texts(kb) == [[f"chunk {i}"] for i in probe]
    engine.close()  # the reordered index is checkpointed at close
    again = Engine(tmp_path / "data")
    try:
        reopened = again.get_knowledge_base("grown")
        np.testing.assert_array_equal(reopened.index.ids(), order)
        assert top_texts(reopened) == [[f"chunk {i}"] for i in probe]
        assert reopened.wait_until_indexed(timeout=60) and reopened._builder.reorders == 0
    finally:
        again.close()
