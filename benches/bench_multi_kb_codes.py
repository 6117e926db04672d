"""Issue 26's knowledge bases on float32 rows against SQ8 codes: walk work, recall and the
cost of one and of several knowledge bases' retrieve, measured interleaved in one process.

Run from the repository root with kbcore importable::

    python -m benches.bench_multi_kb_codes [--data DIR] [--kbs 4] [--queries 300] [--passes 5]

SciFact's documents (title + text) are split round-robin into ``--kbs`` knowledge bases, as
``benches/bench_multi_kb.py`` builds them (built-in ``HashingEmbedder``, default engine
settings), once per index layout: ``quantization=None`` (float32 rows) and ``"sq8"`` (the walk
on 8-bit codes, the candidates re-ranked exactly from the float32 rows). For each layout:

- per knowledge base, the median distances a walk scores (``Index.search_stats``) and the
  recall@10 of its ``retrieve`` (text queries) against the exact top 10 of its own rows (the
  index's forced exact float32 scan of the same query vector);
- thread CPU time per query (the search pool at one thread, so that the caller's thread does
  all the work and thread CPU time counts all of it), each variant in a seeded random order per
  query, ``--passes`` passes, medians: one part's native search, one part's ``retrieve(text)``,
  ``Engine.retrieve`` of every part (text).

Prints the figures and the ratios; on a shared machine read the ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from benches.datasets import DEFAULT_DATA_ROOT
from benches.eval_hybrid import _jsonl

TOP_K = 10
SEED = 20261205
LAYOUTS: tuple[str | None, ...] = (None, "sq8")


def _recall(kb, queries: list[str]) -> float:
    """recall@10 of ``kb.retrieve`` against the exact top 10 of its rows."""
    index = kb.index
    hits = 0
    for q in queries:
        vec = kb.embed_query(q).reshape(1, -1)
        exact, _ = index._native.search(vec, TOP_K, 0, 1, None, "exact")
        got = {h.id for h in kb.retrieve(q, TOP_K)}
        hits += len(got & set(exact[0].tolist()))
    return hits / (TOP_K * len(queries))


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine
    from kbcore.index import set_search_threads

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--kbs", type=int, default=4)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)
    set_search_threads(1)
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    docs = [
        {"document_id": d["id"], "text": (d.get("title", "") + "\n\n" + d["text"]).strip()}
        for d in _jsonl(root / "scifact" / "documents.jsonl.gz")
    ]
    queries = [q["text"] for q in _jsonl(root / "scifact" / "queries.jsonl")][: args.queries]
    names = [f"kb{i}" for i in range(args.kbs)]
    variants: dict[str, Callable[[int], object]] = {}
    with tempfile.TemporaryDirectory(prefix="kbcore-codes-") as tmp:
        engines = []
        for layout in LAYOUTS:
            tag = layout or "float32"
            engine = Engine(Path(tmp) / tag)
            engines.append(engine)
            for i, name in enumerate(names):
                engine.create_knowledge_base(name, quantization=layout).ingest_many(docs[i :: args.kbs], progress=False)
            for name in names:
                engine[name].wait_until_indexed()
            one = engine[names[0]]
            index = one.index
            vectors = [one.embed_query(q) for q in queries]
            scored = [float(np.median(engine[n].index.search_stats(np.stack(vectors))["scored"])) for n in names]
            recall = [_recall(engine[n], queries) for n in names]
            print(
                f"{tag}: rows {[len(engine[n].index) for n in names]}, "
                f"plan {index._native.unfiltered_strategy(0)}, scored (median) {scored}, "
                f"recall@10 {[round(r, 4) for r in recall]}",
                flush=True,
            )
            variants[f"{tag}: one part, native search"] = lambda j, ix=index, vs=vectors: ix.search(vs[j], TOP_K)
            variants[f"{tag}: one part, retrieve(text)"] = lambda j, kb=one: kb.retrieve(queries[j], TOP_K)
            variants[f"{tag}: {args.kbs} parts, Engine.retrieve(text)"] = lambda j, e=engine: e.retrieve(
                names, queries[j], TOP_K
            )
        for j in range(min(20, len(queries))):  # warm up
            for fn in variants.values():
                fn(j)
        times: dict[str, list[float]] = {k: [] for k in variants}
        order = list(variants.items())
        rng = random.Random(SEED)
        passes: list[dict[str, float]] = []
        for _ in range(args.passes):
            per: dict[str, list[float]] = {k: [] for k in variants}
            for j in range(len(queries)):
                for label, fn in rng.sample(order, len(order)):
                    t0 = time.thread_time()
                    fn(j)
                    per[label].append(time.thread_time() - t0)
            passes.append({k: statistics.median(v) * 1e6 for k, v in per.items()})
            for k, v in per.items():
                times[k].extend(v)
        for engine in engines:
            engine.close()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; search threads 1; thread CPU")
    print("| variant | median us / query (passes) |")
    print("|---|---:|")
    for k in variants:
        print(f"| {k} | {statistics.median(p[k] for p in passes):.1f} ({', '.join(f'{p[k]:.0f}' for p in passes)}) |")
    for tag in ("float32", *(layout for layout in LAYOUTS if layout)):
        ratio = [
            p[f"{tag}: {args.kbs} parts, Engine.retrieve(text)"] / p[f"{tag}: one part, retrieve(text)"] for p in passes
        ]
        spread = f"passes {min(ratio):.2f}-{max(ratio):.2f}"
        print(f"{tag}: {args.kbs} parts / one part = {statistics.median(ratio):.2f}x ({spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
