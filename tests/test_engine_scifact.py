"""Knowledge engine on real data: SciFact through pre-embedded ingest reaches the exact baselines.

Skipped when the data set is absent (set KBCORE_DATA, default ../shared/data from the repo root).
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
SCIFACT = ROOT if (ROOT / "chunk_embeddings.npy").exists() else ROOT / "scifact"

pytestmark = pytest.mark.skipif(
    not (SCIFACT / "chunk_embeddings.npy").exists(),
    reason=f"SciFact data not found at {SCIFACT} (set KBCORE_DATA to the folder holding scifact/)",
)


@pytest.fixture(scope="module")
def scifact():
    with gzip.open(SCIFACT / "chunks.jsonl.gz", "rt", encoding="utf-8") as f:
        chunks = [json.loads(line) for line in f]
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f]
    qrels: dict = {}
    for line in (SCIFACT / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    doc_ids = (SCIFACT / "doc_ids.txt").read_text(encoding="utf-8").split()
    return {
        "chunks": pa.table(
            {
                "document_id": [c["doc_id"] for c in chunks],
                "chunk_index": pa.array([c["chunk_index"] for c in chunks], pa.int64()),
                "char_start": pa.array([c["char_start"] for c in chunks], pa.int64()),
                "char_end": pa.array([c["char_end"] for c in chunks], pa.int64()),
                "text": [c["text"] for c in chunks],
            }
        ),
        "docs": pa.table({"document_id": doc_ids, "text": doc_ids}),
        "C": np.load(SCIFACT / "chunk_embeddings.npy"),
        "D": np.load(SCIFACT / "doc_embeddings.npy"),
        "Q": np.load(SCIFACT / "query_embeddings.npy"),
        "queries": queries,
        "qrels": qrels,
        "baseline": json.loads((SCIFACT / "baseline.json").read_text(encoding="utf-8"))["metrics"],
    }


def _ndcg10(ranked, queries, qrels):
    total = 0.0
    for q, docs in zip(queries, ranked):
        rel = qrels.get(q["id"], {})
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:10]))
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(rel.values(), reverse=True)[:10]))
        total += dcg / idcg if idcg else 0.0
    return total / len(queries)


def test_chunk_level_dedup_and_document_level_reach_the_exact_baselines(tmp_path, scifact):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("chunks", embedder=False, index="flat")
    kb.ingest_table(scifact["chunks"], vectors=scifact["C"])
    assert len(kb) == len(scifact["C"])
    ranked = [[h.document_id for h in kb.retrieve(q, top_k=10, deduplicate=True)] for q in scifact["Q"]]
    ndcg = _ndcg10(ranked, scifact["queries"], scifact["qrels"])
    assert abs(ndcg - scifact["baseline"]["chunks_exact_maxp_dedup"]["nDCG@10"]) <= 0.005

    # the dedup ranking is exactly "documents by their best chunk" (max-p), for the first queries
    doc_of = np.array(scifact["chunks"]["document_id"].to_pylist())
    for q, got in zip(scifact["Q"][:20], ranked[:20]):
        order = np.argsort(-(scifact["C"] @ q), kind="stable")
        expect = list(dict.fromkeys(doc_of[order]))[:10]
        assert got == expect

    kbd = engine.create_knowledge_base("docs", embedder=False, index="flat")
    kbd.ingest_table(scifact["docs"], vectors=scifact["D"])
    ranked = [[h.document_id for h in kbd.retrieve(q, top_k=10)] for q in scifact["Q"]]
    ndcg = _ndcg10(ranked, scifact["queries"], scifact["qrels"])
    assert abs(ndcg - scifact["baseline"]["documents_exact"]["nDCG@10"]) <= 0.005


def test_hnsw_knowledge_base_stays_close_to_exact(tmp_path, scifact):
    kb = Engine(tmp_path).create_knowledge_base("chunks", embedder=False, index="hnsw", ef_construction=100, ef=128)
    kb.ingest_table(scifact["chunks"], vectors=scifact["C"])
    ranked = [[h.document_id for h in kb.retrieve(q, top_k=10, deduplicate=True)] for q in scifact["Q"]]
    ndcg = _ndcg10(ranked, scifact["queries"], scifact["qrels"])
    assert abs(ndcg - scifact["baseline"]["chunks_exact_maxp_dedup"]["nDCG@10"]) <= 0.005
    assert kb.document_text(ranked[0][0])  # rebuilt from chunk spans
