"""Instruction-count proxies of the engine's hot paths on SciFact (direction only, not timings).

Runs one fixed loop (``kb.retrieve`` of pre-computed query vectors, or one pre-embedded
``ingest_table``) inside ``functools.reduce``, so that valgrind's callgrind counts exactly the
loop's instructions (``--toggle-collect=functools_reduce``). Counts do not depend on the
machine's load, so two builds can be compared on a busy machine; the figures are proxies,
never timings. Run from the repository root::

    python -m benches.bench_engine_proxy build /tmp/kb        # once per build: the hnsw knowledge base
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce \\
        python -m benches.bench_engine_proxy plain /tmp/kb --n 1000
    grep summary: callgrind.out.*

Modes: ``plain`` / ``dedup`` (``retrieve(q, top_k=10, deduplicate=...)``), ``engine_plain`` /
``engine_dedup`` (the same with the native search replaced by its cached answer: the engine's
own work), ``hybrid`` (text + vector, RRF, deduplicated: the native collapse of a fused list),
``ingest`` (``ingest_table`` of the 19,369 chunks into a new flat knowledge base). The native
``Index.add`` runs on threads whose split varies between runs; compare ingest counts outside
``kbcore::Index::add`` (``callgrind_annotate --inclusive=yes``).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable

import numpy as np

from benches.bench_engine import load
from benches.datasets import scifact_dir


def _measured(fn: Callable[[], None]) -> None:
    """Runs fn inside functools.reduce: what callgrind's --toggle-collect counts."""
    functools.reduce(lambda _a, _b: fn(), [None], None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["build", "plain", "dedup", "engine_plain", "engine_dedup", "hybrid", "ingest"])
    ap.add_argument("kb", nargs="?", default=None, help="the knowledge base directory (build writes it)")
    ap.add_argument("--n", type=int, default=1000, help="retrieve calls in the measured loop")
    ap.add_argument("--data", default=None, help="data root holding scifact/")
    args = ap.parse_args(argv)
    folder = scifact_dir(args.data)
    if not (folder / "chunk_embeddings.npy").exists():
        print(f"SciFact not found at {folder}; pass --data or set KBCORE_DATA", file=sys.stderr)
        return 2
    from kbcore.engine import Engine

    if args.mode in ("build", "ingest"):
        data = load(folder)
        root = args.kb if args.mode == "build" else tempfile.mkdtemp(prefix="kbcore-proxy-")
        engine = Engine(root)
        kb = engine.create_knowledge_base("chunks", embedder=False, index="hnsw" if args.mode == "build" else "flat")
        if args.mode == "build":
            kb.ingest_table(data["chunk_table"], vectors=data["C"])
            kb.wait_until_indexed()
        else:
            warm = engine.create_knowledge_base("warm", embedder=False, index="flat")
            warm.ingest_table(data["chunk_table"].slice(0, 200), vectors=data["C"][:200])
            _measured(lambda: kb.ingest_table(data["chunk_table"], vectors=data["C"]))
        engine.close()
        if args.mode == "ingest":
            shutil.rmtree(root, ignore_errors=True)
        return 0

    Q = np.load(folder / "query_embeddings.npy")
    engine = Engine(args.kb)
    kb = engine.get_knowledge_base("chunks")
    kb.wait_until_indexed()
    dedup = args.mode.endswith("dedup")
    if args.mode == "hybrid":
        lines = (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()
        texts = [json.loads(line)["text"] for line in lines]
        pairs = [(texts[i % len(Q)], Q[i % len(Q)]) for i in range(args.n)]

        def loop() -> None:
            for t, q in pairs:
                kb.retrieve(t, top_k=10, search_type="hybrid", query_vector=q, deduplicate=True)

    else:
        current = [0]
        if args.mode.startswith("engine"):
            from kbcore.engine import retrieval

            cached = [retrieval.vector_candidates(kb.index, q, 10, None, dedup, None) for q in Q]
            retrieval.vector_candidates = lambda *a: cached[current[0]]  # type: ignore[assignment]
        queries = [(i % len(Q), Q[i % len(Q)]) for i in range(args.n)]

        def loop() -> None:
            for i, q in queries:
                current[0] = i
                kb.retrieve(q, top_k=10, deduplicate=dedup)

    for q in Q[:50]:  # warm the code paths outside the count
        kb.retrieve(q, top_k=10, deduplicate=dedup)
    _measured(loop)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
