"""nDCG@10 and recall@10 of engine knowledge bases on float32 rows against SQ8 codes (the walk
on codes, candidates re-ranked from the float32 rows), on the shared sets, through the engine.

Run from the repository root with kbcore importable::

    python -m benches.eval_quantization [--data DIR] [--sets scifact arguana ...] [--hashing]

For each set (``benches/eval_hybrid.py``'s: the provided vectors, ``embedder=False``) two
knowledge bases are built with the default HNSW index, ``quantization=None`` and ``"sq8"``, and
every query goes through ``KnowledgeBase.retrieve`` (dense, and hybrid z-score fusion, whose
vector leg reads the same index). Printed per set and layout: nDCG@10 of each mode, and the
recall@10 of the dense retrieve against the exact top 10 of the knowledge base's own rows (the
index's forced exact float32 scan). ``--hashing`` adds SciFact's documents ingested as text
with the built-in ``HashingEmbedder`` (what a new user's knowledge base holds), queries embedded
by it. Also printed: each index's ``memory_usage()`` in bytes.
Relevance labels are only used to score.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benches.datasets import DEFAULT_DATA_ROOT
from benches.eval_hybrid import ALL_SETS, TOP_K, _jsonl, load_set, ndcg_at_10, ranked_lists, set_folder

LAYOUTS: tuple[str | None, ...] = (None, "sq8")
MODES = (("dense", "vector", "rrf", 0.7), ("zscore", "hybrid", "zscore", 0.7))


def _recall(kb, vectors: np.ndarray) -> float:
    """recall@10 of the dense ``kb.retrieve`` of each query vector against the exact top 10."""
    index = kb.index
    hits = 0
    for v in vectors:
        exact, _ = index._native.search(v.reshape(1, -1), TOP_K, 0, 1, None, "exact")
        got = {h.id for h in kb.retrieve(v, TOP_K, search_type="vector")}
        hits += len(got & set(exact[0].tolist()))
    return hits / (TOP_K * len(vectors))


def _index_bytes(kb) -> int:
    """Bytes the knowledge base's index holds in memory (``Index.memory_usage``)."""
    return int(kb.index.memory_usage())


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--sets", nargs="+", default=["scifact", "arguana", "stard", "cmrc2018", "drcd", "jsquad"])
    ap.add_argument("--hashing", action="store_true")
    args = ap.parse_args(argv)
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    print("| set | rows | layout | dense nDCG@10 | zscore nDCG@10 | recall@10 | index memory bytes |")
    print("|---|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="kbcore-quant-") as tmp:
        engine = Engine(tmp)
        for name in args.sets:
            if name not in ALL_SETS:
                raise SystemExit(f"unknown set {name}")
            data = load_set(root, name)
            if data is None:
                print(f"| {name} | skipped: no data under {set_folder(root, name)} |")
                continue
            for layout in LAYOUTS:
                kb = engine.create_knowledge_base(f"{name}-{layout or 'f32'}", embedder=False, quantization=layout)
                kb.ingest_table(data["table"], vectors=data["vectors"])
                kb.wait_until_indexed()
                nd = [
                    ndcg_at_10(ranked_lists(kb, data, st, fu, w), data["queries"], data["qrels"])
                    for _, st, fu, w in MODES
                ]
                rec = _recall(kb, data["Q"])
                print(
                    f"| {name} | {len(data['vectors'])} | {layout or 'float32'} | {nd[0]:.4f} | {nd[1]:.4f} | "
                    f"{rec:.4f} | {_index_bytes(kb)} |",
                    flush=True,
                )
        if args.hashing:
            docs = [
                {"document_id": d["id"], "text": (d.get("title", "") + "\n\n" + d["text"]).strip()}
                for d in _jsonl(root / "scifact" / "documents.jsonl.gz")
            ]
            data = load_set(root, "scifact")
            assert data is not None
            for layout in LAYOUTS:
                kb = engine.create_knowledge_base(f"hashing-{layout or 'f32'}", quantization=layout)
                kb.ingest_many(docs, progress=False)
                kb.wait_until_indexed()
                ranked, vecs = [], []
                for q in data["queries"]:
                    ranked.append([h.document_id for h in kb.retrieve(q["text"], TOP_K, deduplicate=True)])
                    vecs.append(kb.embed_query(q["text"]))
                nd = ndcg_at_10(ranked, data["queries"], data["qrels"])
                rec = _recall(kb, np.stack(vecs))
                rows = len(kb.index)
                print(
                    f"| scifact, hashing embedder, chunks | {rows} | {layout or 'float32'} | {nd:.4f} | - | "
                    f"{rec:.4f} | {_index_bytes(kb)} |",
                    flush=True,
                )
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
