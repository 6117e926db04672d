"""Unfiltered search: the graph walk against the exact scan of the same index, per query.

Run from the repository root with kbcore importable::

    python -m benches.bench_unfiltered_plan [--data DIR] [--queries 200] [--sizes 1000,5000,20000]

For SciFact's chunks embedded by the built-in ``HashingEmbedder`` (nearly orthogonal vectors:
what a new user's knowledge base holds) and by MiniLM (the stored embeddings, for contrast),
float32 and sq8, and each size n (the first n chunks), an HNSW index (M 16, ef 64) is built
and each query (SciFact's, embedded the same way) is searched on one thread with
``strategy="graph"`` (the walk) and ``strategy="exact"`` (the scan of every row, on the codes
when quantized), interleaved per query. Prints ``Index.search_stats`` (level-0 hops and
distances scored by the walk, medians), the median thread CPU time per query of each plan,
their ratio, the walk's recall@10 against the scan, and the plan ``strategy="auto"`` takes
after the queries (the walk's measured ``evals_per_ef`` feeds the rule, docs/index.md).
Thread CPU time does not count time waiting for a core, so the ratio holds on a loaded
machine; the absolute figures still vary with its caches.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benches.datasets import DEFAULT_DATA_ROOT

K = 10
EF = 64


def _texts(path: Path, key: str = "text") -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)[key] for line in f if line.strip()]


def _one(label: str, data: np.ndarray, queries: np.ndarray, quantization: str | None) -> None:
    from kbcore.index import Index

    index = Index(data.shape[1], quantization=quantization, ef=EF)
    index.add(data, np.arange(data.shape[0], dtype=np.int64))
    native = index._native
    stats = index.search_stats(queries, K, ef=EF)
    walk_t: list[float] = []
    scan_t: list[float] = []
    hits = 0
    for q in queries:
        q2 = q.reshape(1, -1)
        runs = (("graph", walk_t), ("exact", scan_t))
        for name, sink in runs if len(walk_t) % 2 == 0 else runs[::-1]:
            t0 = time.thread_time_ns()
            ids, _ = native.search(q2, K, EF, 1, None, name)
            sink.append((time.thread_time_ns() - t0) / 1e3)
            if name == "graph":
                walk_ids = ids
            else:
                scan_ids = ids
        hits += len(set(walk_ids[0].tolist()) & set(scan_ids[0].tolist()))
    chosen = native.unfiltered_strategy(EF)
    walk, scan = statistics.median(walk_t), statistics.median(scan_t)
    print(
        f"{label:<16} {quantization or 'float32':<8} {data.shape[0]:>6} "
        f"{int(np.median(stats['hops'])):>6} {int(np.median(stats['scored'])):>7} "
        f"{index._native.evals_per_ef:>7.1f} {walk:>8.1f} {scan:>8.1f} {scan / walk:>6.2f} "
        f"{hits / (K * len(queries)):>6.3f} {chosen:>7}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--embedders", default="hashing,minilm")
    ap.add_argument("--quantizations", default="none,sq8")
    args = ap.parse_args(argv)
    from kbcore.embedders.hashing import HashingEmbedder

    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT)) / "scifact"
    sizes = [int(s) for s in args.sizes.split(",")]
    sets: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if "hashing" in args.embedders:
        emb = HashingEmbedder()
        chunks = _texts(root / "chunks.jsonl.gz")[: max(sizes)]
        queries = _texts(root / "queries.jsonl")[: args.queries]
        sets["hashing"] = (emb.embed(chunks).astype(np.float32), emb.embed(queries).astype(np.float32))
    if "minilm" in args.embedders:
        sets["minilm"] = (
            np.load(root / "chunk_embeddings.npy").astype(np.float32)[: max(sizes)],
            np.load(root / "query_embeddings.npy").astype(np.float32)[: args.queries],
        )
    print("embedder         codes         n   hops  scored evals/ef  walk_us  scan_us   scan/walk recall  auto")
    for label, (data, queries) in sets.items():
        for quant in args.quantizations.split(","):
            for n in sizes:
                _one(label, np.ascontiguousarray(data[:n]), queries, None if quant == "none" else quant)


if __name__ == "__main__":
    main()
