"""Helpers shared by the benchmark scripts: reading the SciFact folder and scoring a ranking.

Only what several scripts did the same way lives here; a change here changes every script that
imports it, so a helper moves here only when it computes exactly what each copy computed.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def read_scifact(folder: Path) -> tuple[list[dict], list[dict], list[dict], dict[str, dict[str, int]]]:
    """The SciFact folder's (documents, chunks, queries, qrels): the JSON-lines records as
    written by the data preparation, and qrels as ``{query id: {document id: grade}}``."""
    with gzip.open(folder / "documents.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    with gzip.open(folder / "chunks.jsonl.gz", "rt", encoding="utf-8") as f:
        chunks = [json.loads(line) for line in f]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f]
    qrels: dict[str, dict[str, int]] = {}
    for line in (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    return docs, chunks, queries, qrels


def ndcg_at_10(ranked: Sequence[Sequence[str]], query_ids: Sequence[str], qrels: dict[str, Any]) -> float:
    """Mean nDCG@10 over the queries (BEIR / pytrec_eval: gain = qrel, discount log2(rank + 1),
    ideal DCG from all judged relevant documents)."""
    total = 0.0
    for qid, docs in zip(query_ids, ranked):
        rel = qrels.get(qid, {})
        dcg = sum(rel.get(d, 0) / math.log2(r + 2) for r, d in enumerate(docs[:10]))
        ideal = sorted(rel.values(), reverse=True)[:10]
        idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
        total += dcg / idcg if idcg > 0 else 0.0
    return total / len(query_ids)
