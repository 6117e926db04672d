"""How long searches wait while an index reorders its slots (issue 28).

``Index.reorder`` computes the new slot order under the shared lock, where searches keep
running, and takes the exclusive lock only to move the rows, links, codes, metadata and text.
This benchmark builds one SQ8 index of synthetic rows (``benches.datasets``' clustered set,
cosine, M 16, ef_construction 200, built without the automatic reorder), then runs one thread
of single-query searches in a loop while the main thread reorders. It reports:

- the reorder's wall time;
- the searches' latency before the reorder (p50, p99, max) and during it (p50, max): the
  longest search during the reorder is how long searches were made to wait;
- how many searches completed during the reorder.

Run from the repository root::

    python -m benches.bench_reorder_online --n 300000 [--method gorder] [--save DIR]

``--save DIR`` keeps the built index (and reuses it on the next run with the same ``--n``).
The 1-minute load is printed before and after; measure with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benches.datasets import SYNTHETIC_DIM, synthetic_blocks, synthetic_queries


def _build(n: int, save: Path | None) -> object:
    from kbcore.index import Index

    path = None if save is None else save / f"reorder-online-{n}.kbi"
    if path is not None and path.exists():
        return Index.load(path)
    index = Index(SYNTHETIC_DIM, "cosine", quantization="sq8", M=16, ef_construction=200)
    for start, block in synthetic_blocks(n):
        ids = np.arange(start, start + block.shape[0], dtype=np.int64)
        index.add(block, ids, reorder=False)
    if path is not None:
        save.mkdir(parents=True, exist_ok=True)
        index.save(path)
    return index


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300_000, help="rows (synthetic, 384 dimensions)")
    ap.add_argument("--method", default="gorder", help="gorder, bfs or rcm")
    ap.add_argument("--ef", type=int, default=64)
    ap.add_argument("--before", type=float, default=2.0, help="seconds of searches before the reorder")
    ap.add_argument("--save", type=Path, default=None, help="keep (and reuse) the built index here")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    index = _build(args.n, args.save)
    print(f"index of {len(index):,} rows ready in {time.perf_counter() - t:.1f} s", flush=True)
    queries = synthetic_queries(1000)
    load_before = os.getloadavg()

    samples: list[tuple[float, float]] = []  # (end time, latency) of each search
    stop = threading.Event()

    def searcher() -> None:
        i = 0
        while not stop.is_set():
            q = queries[i % len(queries)]
            t0 = time.perf_counter()
            index.search(q, 10, ef=args.ef)
            t1 = time.perf_counter()
            samples.append((t1, t1 - t0))
            i += 1

    thread = threading.Thread(target=searcher, name="searcher")
    thread.start()
    time.sleep(args.before)
    r0 = time.perf_counter()
    index.reorder(method=args.method, threads=0)
    r1 = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    thread.join()
    load_after = os.getloadavg()

    before = [lat for end, lat in samples if end < r0]
    # a search overlaps the reorder if it ended after the reorder began and began before it ended
    during = [lat for end, lat in samples if end > r0 and end - lat < r1]
    ms = 1e3
    print(f"load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print(f"reorder ({args.method}) of {len(index):,} rows: {r1 - r0:.2f} s")
    print(
        f"searches before: {len(before):,}, p50 {statistics.median(before) * ms:.3f} ms, "
        f"p99 {_pct(before, 0.99) * ms:.3f} ms, max {max(before) * ms:.3f} ms"
    )
    if during:
        print(
            f"searches during: {len(during):,}, p50 {statistics.median(during) * ms:.3f} ms, "
            f"max {max(during) * ms:.1f} ms (the longest wait for the reorder's exclusive step)"
        )
    else:
        print("searches during: none completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
