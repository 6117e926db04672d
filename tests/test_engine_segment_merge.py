"""Small segments merged as they accumulate (issue 28: fewer files for a reopen to map and
check): the size-tiered policy, the answers of a merged knowledge base against one that never
merges (before and after reopening, with and without the segments' vector files), deletes
and replacements across merged segments, and a writer killed inside a merge."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbcore import Engine
from kbcore.engine import manifest as policy
from kbcore.engine import storage

DIM = 8
DOCS_PER_BATCH = 3
CHUNKS_PER_DOC = 4
BATCHES = 30  # under MAX_SEGMENTS: without merging, one segment per batch


def _batch(b: int, version: int = 1) -> tuple[pa.Table, np.ndarray]:
    """Batch ``b``: DOCS_PER_BATCH documents of CHUNKS_PER_DOC chunks, seeded vectors."""
    rng = np.random.default_rng(1000 * version + b)
    rows = DOCS_PER_BATCH * CHUNKS_PER_DOC
    docs = [f"d{b}-{i // CHUNKS_PER_DOC}" for i in range(rows)]
    table = pa.table(
        {
            "document_id": docs,
            "chunk_index": pa.array([i % CHUNKS_PER_DOC for i in range(rows)], pa.int64()),
            "text": [f"{d} v{version} word{(b * 7 + i) % 11} term{i % 5}" for i, d in enumerate(docs)],
        }
    )
    vecs = rng.standard_normal((rows, DIM)).astype(np.float32)
    return table, vecs


def _fill(kb, batches: range) -> None:
    for b in batches:
        table, vecs = _batch(b)
        kb.ingest_table(table, vectors=vecs, span_columns=None)


def _create(root, name: str):
    return Engine(root).create_knowledge_base(name, embedder=False, dim=DIM, index="flat")


def _answers(kb) -> list:
    rng = np.random.default_rng(7)
    out = []
    for q in rng.standard_normal((5, DIM)).astype(np.float32):
        out.append([(h.id, h.document_id, h.chunk_index, h.content) for h in kb.retrieve(q, 10)])
    for text in ("word3 term1", "d4-1 v1", "term4"):
        hits = kb.retrieve(text, 10, search_type="full_text")
        out.append([(h.id, h.document_id, h.chunk_index, h.content, round(h.score, 5)) for h in hits])
    out.append(sorted((d.document_id, d.chunks) for d in kb.documents()))
    return out


def _files(path: str) -> set[str]:
    return {f for f in os.listdir(path) if f.startswith("seg-")}


# -- the policy --------------------------------------------------------------------------------


def _simulate(batch_rows: list[int]) -> list[int]:
    rows: list[int] = []
    for n in batch_rows:
        rows.append(n)
        start = policy.merge_start(rows)
        if start is not None:
            rows[start:] = [sum(rows[start:])]
    return rows


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=60))
def test_merge_start_picks_a_trailing_run_of_alike_segments(rows):
    start = policy.merge_start(rows)
    if start is None:
        return
    run = rows[start:]
    assert len(run) >= policy.MERGE_FACTOR
    assert sum(run) <= policy.MERGE_MAX_ROWS


@pytest.mark.parametrize("batch", [1, 25, 1000, 1003])
def test_equal_batches_keep_a_logarithmic_number_of_segments(batch):
    n = 500
    rows = _simulate([batch] * n)
    assert sum(rows) == batch * n
    tiers = math.ceil(math.log(n, policy.MERGE_FACTOR)) + 1
    assert len(rows) <= (policy.MERGE_FACTOR - 1) * tiers
    assert rows == sorted(rows, reverse=True)  # older segments are the larger ones


# -- the engine ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ckpt_rows", [4096, 24], ids=["vector-files", "checkpointed"])
def test_merged_knowledge_base_answers_as_one_that_never_merges(tmp_path, monkeypatch, ckpt_rows):
    monkeypatch.setattr(policy, "CKPT_MIN_ROWS", ckpt_rows)
    factor = policy.MERGE_FACTOR
    merged = _create(tmp_path / "a", "kb")
    _fill(merged, range(BATCHES))
    monkeypatch.setattr(policy, "MERGE_FACTOR", 10**9)
    plain = _create(tmp_path / "b", "kb")
    _fill(plain, range(BATCHES))
    assert plain.stats().segments == BATCHES
    expected = _answers(plain)
    assert _answers(merged) == expected
    if ckpt_rows == 4096:  # no checkpoint yet: segments with vector files are never merged
        assert merged.stats().segments == BATCHES
    monkeypatch.setattr(policy, "MERGE_FACTOR", factor)
    merged.checkpoint()  # covers every segment: the small ones merge
    bound = (policy.MERGE_FACTOR - 1) * (math.ceil(math.log(BATCHES, policy.MERGE_FACTOR)) + 1)
    assert merged.stats().segments <= bound
    path = str(tmp_path / "a" / "kb")
    m = storage.load_manifest(path)
    assert _files(path) == {f["path"] for s in m["segments"] for f in s["files"].values() if f is not None}
    assert _answers(merged) == expected

    # deletes and a replacement land in merged segments; compare again, then reopened
    monkeypatch.setattr(policy, "MERGE_FACTOR", 10**9)
    plain.checkpoint()
    monkeypatch.setattr(policy, "MERGE_FACTOR", factor)
    for kb in (merged, plain):
        for doc in ("d0-1", "d5-0", "d17-2"):
            kb.delete_document(doc)
        table, vecs = _batch(2, version=2)
        kb.ingest_table(table, vectors=vecs, span_columns=None)  # replaces d2-*
    expected = _answers(plain)
    assert _answers(merged) == expected
    merged.close()
    assert _answers(Engine(tmp_path / "a")["kb"]) == expected


CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from test_engine_segment_merge import _batch
    from kbcore import Engine
    from kbcore.engine import commit

    def crash(at):
        if at == "segments-merged":
            os._exit(17)

    commit.fault_hook = crash
    kb = Engine({root!r})["kb"]
    table, vecs = _batch({b})
    kb.ingest_table(table, vectors=vecs, span_columns=None)
    kb.checkpoint()  # every segment covered: the merge starts
    os._exit(0)  # no merge reached
    """
)


@pytest.mark.integration  # another process
def test_a_writer_killed_inside_a_merge_leaves_the_committed_batches(tmp_path):
    first = policy.MERGE_FACTOR - 1
    kb = _create(tmp_path, "kb")
    _fill(kb, range(first))
    assert kb.stats().segments == first
    kb.close()
    code = CHILD.format(tests=os.path.dirname(__file__), root=str(tmp_path), b=first)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    path = str(tmp_path / "kb")
    stray = _files(path)  # the merge's segment was written, its manifest not installed
    reopened = Engine(tmp_path)["kb"]
    assert reopened.stats().segments == first + 1  # the batch committed, the merge not
    plain_root = tmp_path / "plain"
    plain = Engine(plain_root).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    old = policy.MERGE_FACTOR
    try:
        policy.MERGE_FACTOR = 10**9
        _fill(plain, range(first + 2))
    finally:
        policy.MERGE_FACTOR = old
    _fill(reopened, range(first + 1, first + 2))  # the next commit merges and collects the strays
    assert reopened.stats().segments < first + 2
    m = storage.load_manifest(path)
    live = {f["path"] for s in m["segments"] for f in s["files"].values() if f is not None}
    assert _files(path) == live
    assert stray - live  # there were stray files, and they are gone
    assert _answers(reopened) == _answers(plain)


def test_segments_whose_columns_differ_in_type_are_not_merged_together(tmp_path):
    """A metadata column of strings in some batches and of integers in others: such tables do
    not concatenate, so a merge takes only the newest segments of one schema."""
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, index="flat")
    rng = np.random.default_rng(3)
    runs = 3
    kinds = {}
    for r in range(runs):  # runs of MERGE_FACTOR batches of one type, each then checkpointed
        for j in range(policy.MERGE_FACTOR):
            b = r * policy.MERGE_FACTOR + j
            kinds[b] = r % 2
            bucket = [b, b + 1] if r % 2 else [f"s{b}", f"t{b}"]
            table = pa.table({"document_id": [f"x{b}-0", f"x{b}-1"], "text": ["alpha beta", "gamma"], "bucket": bucket})
            kb.ingest_table(table, vectors=rng.standard_normal((2, DIM)).astype(np.float32), span_columns=None)
        kb.checkpoint()  # every segment covered: the run merges, and never with the one before
    assert kb.stats().segments == runs
    ids = sorted(f"x{b}-{i}" for b in kinds for i in range(2))
    assert sorted(d.document_id for d in kb.documents()) == ids
    kb.close()
    reopened = Engine(tmp_path)["kb"]
    assert reopened.stats().segments == runs
    assert sorted(d.document_id for d in reopened.documents()) == ids
    hits = reopened.retrieve(rng.standard_normal(DIM).astype(np.float32), len(ids))
    assert len(hits) == len(ids)
    for h in hits:
        b = int(h.document_id[1:].split("-")[0])
        assert isinstance(h.metadata["bucket"], int if kinds[b] else str), h
