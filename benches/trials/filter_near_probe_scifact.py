"""Trial (issue 28): the cost of the filtered walk's near probe on SciFact chunks.

Uncorrelated filters (a seeded uniform field, 10-50 % passing): for each fraction and ef the
cost model answers with the walk, the queries whose automatic answer (with the near probe)
differs from the forced walk's (which runs no probe) and the thread CPU time auto / forced walk:
one process, one thread, alternating passes, medians.

    KBCORE_DATA=/work/shared/data python benches/trials/filter_near_probe_scifact.py [PASSES]
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
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    d = Path(os.environ.get("KBCORE_DATA", "../shared/data")) / "scifact"
    x = np.load(d / "chunk_embeddings.npy").astype(np.float32)
    q = np.load(d / "query_embeddings.npy").astype(np.float32)[:300]
    r = np.random.default_rng(11).random(len(x))
    index = kbcore.Index(x.shape[1], "cosine", "hnsw", M=16, ef_construction=100)
    index.add(x, np.arange(len(x), dtype=np.int64), metadata=pa.table({"r": r}), threads=2)
    for v in q:  # calibrates the cost model, as in normal use
        index.search(v, 10, threads=1)
    print(f"rows {len(x)}, queries {len(q)}")
    for frac in (0.1, 0.2, 0.3, 0.4, 0.5):
        cw = compile_where({"r": {"$lt": frac}})
        for ef in (16, 32, 64):
            plan = index._native.strategy(int((r < frac).sum()), ef)
            if plan != "walk":
                print(f"{frac:.0%} ef {ef}: plan {plan} (no probe)")
                continue
            auto, _ = index._native.search(q, 10, ef, 1, cw, "auto")
            walk, _ = index._native.search(q, 10, ef, 1, cw, "walk")
            times: dict[str, list[float]] = {"auto": [], "walk": []}
            for p in range(passes):
                for mode in ("auto", "walk") if p % 2 == 0 else ("walk", "auto"):
                    t0 = time.thread_time()
                    index._native.search(q, 10, ef, 1, cw, mode)
                    times[mode].append(time.thread_time() - t0)
            ratio = statistics.median(times["auto"]) / statistics.median(times["walk"])
            differing = int(np.any(auto != walk, axis=1).sum())
            print(f"{frac:.0%} ef {ef}: plan walk, answers differing {differing}, cpu auto/walk {ratio:.3f}")


if __name__ == "__main__":
    main()
