"""Retrieval quality of the default chunking through the engine's real ingest path.

For SciFact and ArguAna (``$KBCORE_DATA`` or ../shared/data), every document goes through
``KnowledgeBase.ingest_many`` as text (``(title + " " + text).strip()``, the shared sets'
document string) with the default pipeline (500 / 50 characters), the default embedder and a
flat index; then each query is answered with BM25 (``search_type="full_text"``) and with the
vector search, one hit per document (dedup), and nDCG@10 is computed against the qrels
(ArguAna: the query's own document excluded, as in its baseline). It also prints a SHA-256 of
every chunk's (document id, start, end, text), so two versions of the code can be compared
chunk for chunk. Run it on two checkouts to compare:

    PYTHONPATH=src python benches/chunking_quality.py [scifact arguana]
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from kbcore import Engine
from kbcore.engine import Document

ROOT = Path(os.environ.get("KBCORE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def ndcg_at_10(ranked: list[str], relevant: set[str]) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:10]) if d in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), 10)))
    return dcg / ideal if ideal else 0.0


def run(name: str) -> None:
    base = ROOT / name
    baseline = json.loads((base / "baseline.json").read_text())
    exclude_self = bool(baseline.get("exclude_self"))
    with gzip.open(base / "documents.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    queries = [json.loads(line) for line in (base / "queries.jsonl").read_text().splitlines() if line.strip()]
    qrels: dict[str, set[str]] = {}
    for line in (base / "qrels.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        if int(s) > 0:
            qrels.setdefault(q, set()).add(d)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(tmp)
        kb = engine.create_knowledge_base(name, index="flat")
        items = [Document(text=(d["title"] + " " + d["text"]).strip(), document_id=d["id"]) for d in docs]
        t = time.perf_counter()
        kb.ingest_many(items, progress=False)
        ingest_s = time.perf_counter() - t
        digest = hashlib.sha256()
        for d in docs:
            prepared = kb.prepare(text=(d["title"] + " " + d["text"]).strip(), document_id=d["id"])
            for c in prepared.chunks:
                digest.update(f"{d['id']}\0{c.start}\0{c.end}\0{c.text}\0".encode())
        scores: dict[str, list[float]] = {"full_text": [], "vector": []}
        for q in queries:
            if q["id"] not in qrels:
                continue
            for search_type in scores:
                hits = kb.retrieve(q["text"], top_k=11, search_type=search_type, deduplicate=True)
                ranked = [h.document_id for h in hits if not (exclude_self and h.document_id == q["id"])]
                scores[search_type].append(ndcg_at_10(ranked, qrels[q["id"]]))
        chunks = len(kb)
        engine.close()
    out = {k: round(sum(v) / len(v), 4) for k, v in scores.items()}
    print(
        json.dumps(
            {
                "dataset": name,
                "documents": len(docs),
                "chunks": chunks,
                "queries": len(scores["full_text"]),
                "nDCG@10": out,
                "chunks_sha256": digest.hexdigest(),
                "ingest_s": round(ingest_s, 1),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    for name in sys.argv[1:] or ["scifact", "arguana"]:
        run(name)
