"""Hybrid search never does worse than its better leg on the shared real sets (issue 26).

A fresh knowledge base (the default fusion, z-score) over SciFact (documents, and chunks with
one result per document) and the four CJK sets (e5-small vectors, BM25 over character
bigrams): nDCG@10 of the default hybrid is at least that of BM25 alone and of the dense leg
alone, and above both where the legs are close (SciFact, STARD). The labels only score; no
setting depends on them. Each set is skipped, saying where it looked, when its files are absent
(set KBCORE_DATA to the folder holding scifact/ and cjk/). ``benches/eval_hybrid.py`` prints
the full table (every fusion, ArguAna too).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine

ROOT = Path(os.environ.get("KBCORE_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))

#: set -> (folder, chunks with dedup?, legs close enough that hybrid must beat both)
SETS = {
    "scifact": ("scifact", False, True),
    "scifact-chunks": ("scifact", True, True),
    "stard": ("cjk/stard", False, True),
    "cmrc2018": ("cjk/cmrc2018", False, False),
    "drcd": ("cjk/drcd", False, False),
    "jsquad": ("cjk/jsquad", False, False),
}


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _load(folder: Path, chunks: bool) -> tuple[pa.Table, np.ndarray]:
    if chunks:
        rows = _jsonl(folder / "chunks.jsonl.gz")
        table = pa.table(
            {
                "document_id": [c["doc_id"] for c in rows],
                "chunk_index": pa.array([c["chunk_index"] for c in rows], pa.int64()),
                "text": [c["text"] for c in rows],
            }
        )
        return table, np.load(folder / "chunk_embeddings.npy")
    docs = _jsonl(folder / "documents.jsonl.gz")
    table = pa.table(
        {"document_id": [d["id"] for d in docs], "text": [(d["title"] + " " + d["text"]).strip() for d in docs]}
    )
    return table, np.load(folder / "doc_embeddings.npy")


def _ndcg10(ranked: list[list[str]], query_ids: list[str], qrels: dict) -> float:
    total = 0.0
    for qid, docs in zip(query_ids, ranked):
        rel = qrels.get(qid, {})
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(rel), 10)))
        total += dcg / idcg if idcg else 0.0
    return total / len(query_ids)


@pytest.mark.parametrize("name", list(SETS))
def test_default_hybrid_is_at_least_its_better_leg(tmp_path, name):
    sub, chunks, close = SETS[name]
    folder = ROOT / sub
    if not (folder / "query_embeddings.npy").exists():
        pytest.skip(f"{name} not found at {folder} (set KBCORE_DATA to the folder holding scifact/ and cjk/)")
    table, vectors = _load(folder, chunks)
    queries = _jsonl(folder / "queries.jsonl")
    qvecs = np.load(folder / "query_embeddings.npy")
    qrels: dict = {}
    for line in (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat")
    kb.ingest_table(table, vectors=np.ascontiguousarray(vectors, dtype=np.float32))
    assert kb.search_defaults["fusion"] == "zscore"
    got = {}
    for st in ("vector", "full_text", "hybrid"):
        ranked = [
            [h.document_id for h in kb.retrieve(q["text"], 10, search_type=st, deduplicate=chunks, query_vector=v)]
            for q, v in zip(queries, qvecs)
        ]
        got[st] = _ndcg10(ranked, [q["id"] for q in queries], qrels)
    engine.close()
    better = max(got["vector"], got["full_text"])
    assert got["hybrid"] >= better, got
    if close:
        assert got["hybrid"] >= better + 0.01, got
