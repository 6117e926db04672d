"""The native search pool's overlap of several knowledge bases' walks, with and without waking
its workers while the query is embedded (``kbcore.index.wake_search_pool``).

Run from the repository root with kbcore importable::

    python -m benches.bench_multi_kb_pool [--data DIR] [--kbs 4] [--queries 300] [--rounds 3]

SciFact's documents are split round-robin into ``--kbs`` knowledge bases as
``benches/bench_multi_kb.py`` builds them (built-in hashing embedder, the engine's default
index). Per query, in a seeded random order, each variant embeds the query (the work a call
does before its searches, untimed: it is the gap during which a worker falls asleep or, woken,
polls), then times (wall clock) only its native searches of the query vector: one part's
search, the ``--kbs`` searches as one ``search_many`` call on the pool (its workers asleep
since the previous call, as in a query loop with work between calls), the same after
``wake_search_pool`` was called before the embedding, and the same on the caller's thread only
(``threads=1``). ``--search-threads N`` sets the pool's size (0: the default, which takes only
the idle cores of the moment). Prints medians and the load average: on a loaded machine the
default pool runs the searches on the caller (all variants alike).
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
SEED = 20261206


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine
    from kbcore.index import Search, search_many, search_threads, set_search_threads, wake_search_pool

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--kbs", type=int, default=4)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search-threads", type=int, default=0, help="search pool size (0: the default)")
    args = ap.parse_args(argv)
    set_search_threads(args.search_threads)
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    docs = [
        {"document_id": d["id"], "text": (d.get("title", "") + "\n\n" + d["text"]).strip()}
        for d in _jsonl(root / "scifact" / "documents.jsonl.gz")
    ]
    queries = [q["text"] for q in _jsonl(root / "scifact" / "queries.jsonl")][: args.queries]
    with tempfile.TemporaryDirectory(prefix="kbcore-pool-") as tmp:
        engine = Engine(tmp)
        kbs = []
        for i in range(args.kbs):
            kb = engine.create_knowledge_base(f"kb{i}")
            kb.ingest_many(docs[i :: args.kbs], progress=False)
            kb.wait_until_indexed()
            kbs.append(kb)
        indexes = [kb.index for kb in kbs]
        vectors = [kbs[0].embed_query(q) for q in queries]
        n = len(indexes)

        def many(v, threads: int = 0):
            return search_many([Search(ix, v, TOP_K) for ix in indexes], threads=threads)

        variants = {
            "one part's search": (False, lambda v: search_many([Search(indexes[0], v, TOP_K)], threads=1)),
            f"{n} searches, pool": (False, many),
            f"{n} searches, pool woken before the embedding": (True, many),
            f"{n} searches, caller's thread only": (False, lambda v: many(v, 1)),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        order = list(variants.items())
        rng = random.Random(SEED)
        load_start = os.getloadavg()[0]
        for _ in range(args.rounds):
            for q, v in zip(queries, vectors):
                for label, (wake, fn) in rng.sample(order, len(order)):
                    if wake:
                        wake_search_pool(n)
                    kbs[0].embed_query(q)  # the caller's own work before its searches
                    t0 = time.perf_counter()
                    fn(v)
                    times[label].append(time.perf_counter() - t0)
                    time.sleep(0.001)  # a pause longer than a worker's poll: it falls asleep
        engine.close()
    print(
        f"search threads: {search_threads()}; load average {load_start:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print("| native searches after the embedding | median us | p90 us |")
    print("|---|---:|---:|")
    for k, v in times.items():
        v = sorted(v)
        print(f"| {k} | {statistics.median(v) * 1e6:.1f} | {v[len(v) * 9 // 10] * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
