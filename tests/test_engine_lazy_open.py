"""Opening a knowledge base decodes the segments' columns lazily (text, spans, chunk index,
optional columns): nothing a hit, a write or a corruption check needs may be lost by that."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine
from kbcore.errors import FormatError

DIM = 16
SEED = 38


def _table(docs: list[str], per_doc: int) -> tuple[pa.Table, list[str]]:
    texts = [f"{d} chunk {c} word{d}x{c}" for d in docs for c in range(per_doc)]
    table = pa.table(
        {
            "document_id": [d for d in docs for _ in range(per_doc)],
            "chunk_index": pa.array([c for _ in docs for c in range(per_doc)], pa.int64()),
            "text": texts,
        }
    )
    return table, texts


def _vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _top(kb, q: np.ndarray) -> tuple[str, int, str]:
    hit = kb.retrieve(q, 1)[0]
    return hit.document_id, hit.chunk_index, hit.content


def test_lazy_columns_are_right_after_a_write_that_follows_a_reopen(tmp_path):
    """Reopen, write (ingest a segment, delete a document) before any query has decoded a
    column, then query: every hit's text and chunk index come from the right segment row, in
    the old segments (one of them renewed by the delete) and in the new one."""
    rng = np.random.default_rng(SEED)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    old_docs = [["a", "b"], ["c", "d"]]
    vecs: dict[tuple[str, int], np.ndarray] = {}
    for docs in old_docs:
        table, _ = _table(docs, 3)
        v = _vectors(rng, table.num_rows)
        kb.ingest_table(table, vectors=v, span_columns=None)
        vecs.update({(d, c): v[i] for i, (d, c) in enumerate((d, c) for d in docs for c in range(3))})
    engine.close()

    engine = Engine(tmp_path)
    kb = engine.get_knowledge_base("kb")
    table, _ = _table(["e"], 4)
    v = _vectors(rng, 4)
    kb.ingest_table(table, vectors=v, span_columns=None)
    vecs.update({("e", c): v[c] for c in range(4)})
    kb.delete_document("c")
    for (d, c), q in vecs.items():
        if d == "c":
            continue
        assert _top(kb, q) == (d, c, f"{d} chunk {c} word{d}x{c}")
    assert all(h.document_id != "c" for h in kb.retrieve(vecs["c", 1], 20))
    assert [info.document_id for info in kb.documents()] == ["a", "b", "d", "e"]
    engine.close()


def test_a_corrupted_segment_is_reported_before_any_answer_uses_it(tmp_path):
    """A byte of a chunk's text changed on disk (still valid UTF-8, so only the manifest's
    CRC-32 can tell) is reported when the knowledge base is opened, in a process that already
    checked the file before, not left for the lazily decoded text column to return."""
    rng = np.random.default_rng(SEED)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    table, _ = _table(["a", "b"], 3)
    kb.ingest_table(table, vectors=_vectors(rng, table.num_rows), span_columns=None)
    engine.close()
    Engine(tmp_path).get_knowledge_base("kb").close()  # checked in full, remembered
    path = os.path.join(tmp_path, "kb")
    seg = next(n for n in sorted(os.listdir(path)) if n.endswith(".chunks.arrow"))
    target = os.path.join(path, seg)
    with open(target, "rb") as f:
        data = f.read()
    pos = data.index(b"wordbx1")
    with open(target, "r+b") as f:
        f.seek(pos)
        f.write(b"W")  # 'wordbx1' -> 'Wordbx1': same length, valid UTF-8
    with pytest.raises(FormatError, match="corrupted"):
        Engine(tmp_path).get_knowledge_base("kb")


def _flip_byte(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def _checkpointed_kb(tmp_path) -> tuple[str, str, str]:
    """A closed knowledge base with an index checkpoint and one segment: (kb dir, index file,
    chunks file)."""
    import json

    rng = np.random.default_rng(SEED)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM)
    table, _ = _table(["a", "b", "c"], 5)
    kb.ingest_table(table, vectors=_vectors(rng, table.num_rows), span_columns=None)
    kb.compact()  # rewrites the segment and checkpoints the index
    engine.close()
    path = os.path.join(tmp_path, "kb")
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    assert m.get("index"), "compact() wrote no index checkpoint"
    chunks = m["segments"][0]["files"]["chunks"]["path"]
    return path, os.path.join(path, m["index"]["path"]), os.path.join(path, chunks)


def test_an_open_loading_the_index_beside_the_segments_reports_the_failing_file(tmp_path):
    """KbState.load runs Index.load on a thread while the segments are checked: a damaged
    index alone is the index's FormatError; a damaged segment is the segment's, even when the
    index is damaged too; no loading thread outlives the open."""
    import threading

    path, index_file, chunks_file = _checkpointed_kb(tmp_path)
    before = threading.active_count()
    _flip_byte(index_file, os.path.getsize(index_file) // 2)
    with pytest.raises(FormatError, match=os.path.basename(index_file)):
        Engine(tmp_path).get_knowledge_base("kb")
    _flip_byte(chunks_file, os.path.getsize(chunks_file) // 2)
    with pytest.raises(FormatError, match=os.path.basename(chunks_file)):
        Engine(tmp_path).get_knowledge_base("kb")
    assert threading.active_count() == before
