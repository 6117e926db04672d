"""nDCG@10 of BM25, dense and every hybrid fusion on the shared sets, through the engine.

Run from the repository root with kbcore importable::

    python -m benches.eval_hybrid [--data DIR] [--sets stard scifact ...] [--json OUT]

For each set a knowledge base is built with the engine (``embedder=False``, exact ``flat``
index, the provided embeddings, the texts for BM25), and every query goes through
``KnowledgeBase.retrieve(text, 10, search_type=..., fusion=..., query_vector=...)``: the real
path, candidate windows, tie rules and dedup included (``--index hnsw``: the default HNSW index
instead). Sets (``$KBCORE_DATA`` or
``../shared/data``):

- ``scifact``, ``arguana``: one row per document (title + text), all-MiniLM-L6-v2 vectors;
- ``scifact-chunks``, ``arguana-chunks``: the provided chunks, ``deduplicate=True`` (one
  result per document, the peers' comparison);
- ``stard``, ``cmrc2018``, ``drcd``, ``jsquad`` (``cjk/``): one row per document, e5-small.

ArguAna excludes the query's own document from its results (the BEIR rule; ``top_k`` 11 then
the self hit dropped). Relevance labels are only used to score, never to choose a setting.
Prints a Markdown table; a set whose files are absent is reported as skipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benches.datasets import DEFAULT_DATA_ROOT

TOP_K = 10
CJK_SETS = ("stard", "cmrc2018", "drcd", "jsquad")
ALL_SETS = ("scifact", "scifact-chunks", "arguana", "arguana-chunks", *CJK_SETS)
#: (column label, search_type, fusion, vector_weight)
MODES: list[tuple[str, str, str, float]] = [
    ("bm25", "full_text", "rrf", 0.7),
    ("dense", "vector", "rrf", 0.7),
    ("zscore", "hybrid", "zscore", 0.7),
    ("rrf", "hybrid", "rrf", 0.7),
    ("linear 0.5", "hybrid", "linear", 0.5),
    ("linear 0.3", "hybrid", "linear", 0.3),
    ("linear 0.7", "hybrid", "linear", 0.7),
]


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        q, d, s = line.split("\t")
        out.setdefault(q, {})[d] = int(s)
    return out


def set_folder(root: Path, name: str) -> Path:
    base = name.removesuffix("-chunks")
    return root / "cjk" / base if base in CJK_SETS else root / base


def load_set(root: Path, name: str) -> dict | None:
    """The table to ingest, its vectors, the queries (with vectors) and qrels; None if absent."""
    import pyarrow as pa

    folder = set_folder(root, name)
    if not (folder / "query_embeddings.npy").exists():
        return None
    queries = _jsonl(folder / "queries.jsonl")
    qids = (folder / "query_ids.txt").read_text(encoding="utf-8").split()
    if qids != [q["id"] for q in queries]:
        raise SystemExit(f"{folder}: query_ids.txt does not follow queries.jsonl")
    chunks = name.endswith("-chunks")
    if chunks:
        rows = _jsonl(folder / "chunks.jsonl.gz")
        table = pa.table(
            {
                "document_id": [c["doc_id"] for c in rows],
                "chunk_index": pa.array([c["chunk_index"] for c in rows], pa.int64()),
                "text": [c["text"] for c in rows],
            }
        )
        vectors = np.load(folder / "chunk_embeddings.npy")
    else:
        docs = _jsonl(folder / "documents.jsonl.gz")
        dids = (folder / "doc_ids.txt").read_text(encoding="utf-8").split()
        if dids != [d["id"] for d in docs]:
            raise SystemExit(f"{folder}: doc_ids.txt does not follow documents.jsonl.gz")
        table = pa.table(
            {
                "document_id": dids,
                "chunk_index": pa.array([0] * len(dids), pa.int64()),
                "text": [(d.get("title", "") + " " + d["text"]).strip() for d in docs],
            }
        )
        vectors = np.load(folder / "doc_embeddings.npy")
    return {
        "name": name,
        "table": table,
        "vectors": np.ascontiguousarray(vectors, dtype=np.float32),
        "queries": queries,
        "Q": np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32),
        "qrels": _qrels(folder / "qrels.tsv"),
        "dedup": chunks,
        "exclude_self": name.startswith("arguana"),
    }


def ndcg_at_10(ranked: Sequence[Sequence[str]], queries: Sequence[dict], qrels: dict) -> float:
    """Mean nDCG@10 over ``queries`` (binary or graded gains from ``qrels``)."""
    total = 0.0
    for q, docs in zip(queries, ranked):
        rel = qrels.get(q["id"], {})
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(docs[:TOP_K]))
        ideal = sorted(rel.values(), reverse=True)[:TOP_K]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        total += dcg / idcg if idcg else 0.0
    return total / len(queries)


def build_kb(engine, data: dict, index: str = "flat"):
    """A vectors-only knowledge base holding ``data``'s rows (texts for BM25)."""
    kb = engine.create_knowledge_base(data["name"], embedder=False, index=index)
    kb.ingest_table(data["table"], vectors=data["vectors"])
    kb.wait_until_indexed()
    return kb


def ranked_lists(kb, data: dict, search_type: str, fusion: str, weight: float) -> list[list[str]]:
    """Document ids of the top 10 per query through ``kb.retrieve``."""
    k = TOP_K + 1 if data["exclude_self"] else TOP_K
    out = []
    for q, v in zip(data["queries"], data["Q"]):
        hits = kb.retrieve(
            q["text"],
            k,
            search_type=search_type,
            fusion=fusion,
            vector_weight=weight,
            deduplicate=data["dedup"],
            query_vector=v,
        )
        docs = [h.document_id for h in hits]
        if data["exclude_self"]:
            docs = [d for d in docs if d != q["id"]]
        out.append(docs[:TOP_K])
    return out


def evaluate(engine, data: dict, modes: Sequence[tuple[str, str, str, float]], index: str = "flat") -> dict[str, float]:
    """nDCG@10 per mode label over ``data``'s queries."""
    kb = build_kb(engine, data, index)
    return {
        label: ndcg_at_10(ranked_lists(kb, data, st, fu, w), data["queries"], data["qrels"])
        for label, st, fu, w in modes
    }


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine
    from kbcore.fusion import DEFAULT_FUSION

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="data root (default $KBCORE_DATA, else ../shared/data)")
    ap.add_argument("--sets", nargs="+", default=list(ALL_SETS), choices=ALL_SETS)
    ap.add_argument("--index", default="flat", choices=("flat", "hnsw"), help="index kind (default: exact flat)")
    ap.add_argument("--json", default=None, help="write every number to this file")
    args = ap.parse_args(argv)
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    modes = MODES
    labels = [m[0] for m in modes]
    print("| set | " + " | ".join(labels) + f" | best leg | default ({DEFAULT_FUSION}) - best leg |")
    print("|---|" + "---:|" * (len(labels) + 2))
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kbcore-eval-") as tmp:
        engine = Engine(tmp)
        for name in args.sets:
            data = load_set(root, name)
            if data is None:
                print(f"| {name} | skipped: no data under {set_folder(root, name)} |")
                continue
            t0 = time.perf_counter()
            res = evaluate(engine, data, modes, args.index)
            res["seconds"] = time.perf_counter() - t0
            report[name] = res
            best = max(res["bm25"], res["dense"])
            default = res[DEFAULT_FUSION]
            cells = " | ".join(f"{res[x]:.4f}" for x in labels)
            print(f"| {name} | {cells} | {best:.4f} | {default - best:+.4f} |", flush=True)
        engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
