"""Trial (issue 28): the two-hop traversal's near probe on SciFact chunks, uncorrelated filters.

A seeded uniform field passing 15-29 % of the chunks: for each fraction and ef where the cost
model answers with the two-hop traversal, the queries whose automatic answer (with the near
probe) differs from the forced traversal's (which runs no probe: those are the probe's false
fallbacks to the exact scan) and the thread CPU time auto / forced traversal: one process, one
thread, alternating passes, medians. ``sq8`` as the second argument builds a quantized index.

    KBCORE_DATA=/work/shared/data python benches/trials/filter_two_hop_probe_scifact.py [PASSES] [sq8]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import kbcore
from kbcore.filters import compile_where


def main() -> None:
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    quantization = sys.argv[2] if len(sys.argv) > 2 else None
    d = Path(os.environ.get("KBCORE_DATA", "../shared/data")) / "scifact"
    x = np.load(d / "chunk_embeddings.npy").astype(np.float32)
    q = np.load(d / "query_embeddings.npy").astype(np.float32)[:300]
    r = np.random.default_rng(11).random(len(x))
    extra = {"quantization": quantization} if quantization else {}
    index = kbcore.Index(x.shape[1], "cosine", "hnsw", M=16, ef_construction=100, **extra)
    index.add(x, np.arange(len(x), dtype=np.int64), metadata=pa.table({"r": r}), threads=2)
    for v in q:  # calibrates the cost model, as in normal use
        index.search(v, 10, threads=1)
    print(f"rows {len(x)}, queries {len(q)}, {quantization or 'float32'}")
    for frac in (0.15, 0.2, 0.25, 0.29):
        cw = compile_where({"r": {"$lt": frac}})
        for ef in (10, 16, 24, 32, 48):
            plan = index._native.strategy(int((r < frac).sum()), ef)
            if plan != "graph":
                print(f"{frac:.0%} ef {ef}: plan {plan} (no two-hop probe)")
                continue
            auto, _ = index._native.search(q, 10, ef, 1, cw, "auto")
            graph, _ = index._native.search(q, 10, ef, 1, cw, "graph")
            times: dict[str, list[float]] = {"auto": [], "graph": []}
            for p in range(passes):
                for mode in ("auto", "graph") if p % 2 == 0 else ("graph", "auto"):
                    t0 = time.thread_time()
                    index._native.search(q, 10, ef, 1, cw, mode)
                    times[mode].append(time.thread_time() - t0)
            ratio = statistics.median(times["auto"]) / statistics.median(times["graph"])
            differing = int(np.any(auto != graph, axis=1).sum())
            print(
                f"{frac:.0%} ef {ef}: plan graph, answers differing {differing}, cpu auto/graph {ratio:.3f}", flush=True
            )


if __name__ == "__main__":
    main()
