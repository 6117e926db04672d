"""Compaction of segments whose tables differ in schema: a metadata column that is an int in
one batch and a string in the next. Each value keeps the type it was ingested with, a manual
compaction succeeds, and an ingest past MAX_SEGMENTS segments that compaction could not
reduce neither fails nor rewrites every segment on each commit."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kbcore import Engine
from kbcore.engine import manifest as policy

DIM = 8


def _batch(b: int) -> tuple[pa.Table, np.ndarray]:
    """Batch ``b`` of three one-chunk documents; ``year`` is an int in even batches and a
    string in odd ones."""
    year = pa.array([2000 + 3 * b + i for i in range(3)]) if b % 2 == 0 else pa.array([f"y{b}-{i}" for i in range(3)])
    docs = [f"d{b}-{i}" for i in range(3)]
    table = pa.table({"document_id": docs, "text": [f"w{b} t{i}" for i in range(3)], "year": year})
    return table, np.random.default_rng(b).standard_normal((3, DIM)).astype(np.float32)


def _expected(batches: range) -> dict[str, object]:
    out: dict[str, object] = {}
    for b in batches:
        table, _ = _batch(b)
        for d, y in zip(table["document_id"].to_pylist(), table["year"].to_pylist()):
            out[d] = y
    return out


def _years(kb, n: int) -> dict[str, object]:
    q = np.ones(DIM, np.float32)
    return {h.document_id: h.metadata["year"] for h in kb.retrieve(q, n)}


def test_compact_keeps_each_batch_s_column_type(tmp_path) -> None:
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    for b in range(6):
        kb.ingest_table(_batch(b)[0], vectors=_batch(b)[1])
    kb.delete_document("d1-0")
    kb.compact()
    want = _expected(range(6))
    del want["d1-0"]
    got = _years(kb, 100)
    assert got == want
    assert all(type(got[d]) is type(want[d]) for d in want)
    # one segment per batch is what compaction has to keep here: alternating schemas
    assert len(kb._cell.state.segments) == 6
    kb.close()
    reopened = Engine(tmp_path).get_knowledge_base("kb")
    assert _years(reopened, 100) == want
    reopened.close()


def test_alike_runs_compact_into_one_segment_each(tmp_path) -> None:
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    order = [0, 2, 4, 1, 3, 6]  # ints, ints, ints, strings, strings, ints: three runs
    for b in order:
        kb.ingest_table(_batch(b)[0], vectors=_batch(b)[1])
    kb.compact()
    assert len(kb._cell.state.segments) == 3
    want = {d: y for b in order for d, y in _expected(range(b, b + 1)).items()}
    assert _years(kb, 100) == want
    kb.close()


def test_ingest_past_max_segments_with_alternating_schemas(tmp_path, recwarn) -> None:
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    n = policy.MAX_SEGMENTS + 6
    for b in range(n):
        kb.ingest_table(_batch(b)[0], vectors=_batch(b)[1])
    assert not [w for w in recwarn if "compaction failed" in str(w.message)]
    assert _years(kb, 3 * n) == _expected(range(n))
    kb.close()


def test_a_column_missing_from_some_batches_still_compacts_into_one_segment(tmp_path) -> None:
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    for b in (0, 2, 4):
        table, vecs = _batch(b)
        kb.ingest_table(table.drop_columns(["year"]) if b == 2 else table, vectors=vecs)
    kb.compact()
    assert len(kb._cell.state.segments) == 1
    want = {d: (None if d.startswith("d2-") else y) for b in (0, 2, 4) for d, y in _expected(range(b, b + 1)).items()}
    got = {h.document_id: h.metadata.get("year") for h in kb.retrieve(np.ones(DIM, np.float32), 100)}
    assert got == want
    kb.close()
