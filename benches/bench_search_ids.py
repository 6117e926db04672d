"""The Python of ``kb.search_ids`` over the native ``Index.search`` it calls (issue 28).

SciFact chunks, kbcore built as ``bench_engine_peers`` builds it (SQ8, M 16, ef_construction
200, at the ef reaching recall@10 0.95). In one process, interleaved per query in a seeded
random order, by this thread's CPU time, medians over passes of each pass's median:

- ``Index.search`` and ``kb.search_ids`` on the same query (real walks): the difference of
  their medians, and the median over queries of the paired difference;
- with ``--with-retrieve``, ``kb.retrieve`` interleaved too: its Python evicts the objects
  the small path touches, as a real caller's other work does (the difference grows);
- the same two with the native answers replayed (``Index.search`` swapped for a function
  returning the recorded answer, outside the timed region): ``kb.search_ids`` minus the
  replayed call is its Python with warm caches.

Run from the repository root::

    python -m benches.bench_search_ids [--passes 41] [--queries 300] [--data DIR] [--with-retrieve]

Read the ratios and differences: absolute microseconds move with the load (printed).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benches import bench_engine_peers as peers
from benches.bench_retrieve_floor import _build

SEED = 20261206


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--passes", type=int, default=41)
    ap.add_argument("--with-retrieve", action="store_true", help="interleave kb.retrieve too (caches colder)")
    args = ap.parse_args(argv)
    from kbcore.index import Index

    data = peers.load(args.data, None, args.queries)
    peer = _build(peers.Kbcore, data, peers.exact(data)["vector"])
    kb, ef, qs, k = peer.kb, peer.knob, data.queries, peers.K
    index = kb.index
    answers = [index.search(q, k, ef=ef, threads=1) for q in qs]
    at = [0]
    real = Index.search

    def replay(self: Any, *a: Any, **kw: Any) -> Any:
        return answers[at[0]]

    variants: dict[str, Callable[[int], Any]] = {
        "Index.search": lambda i: index.search(qs[i], k, ef=ef, threads=1),
        "kb.search_ids": lambda i: kb.search_ids(qs[i], k, ef=ef),
    }
    if args.with_retrieve:  # the other calls of a real loop: they evict the small path's objects
        variants["kb.retrieve"] = lambda i: kb.retrieve(qs[i], k, ef=ef)
    replayed = {
        "Index.search, replayed": variants["Index.search"],
        "kb.search_ids, replayed": variants["kb.search_ids"],
    }
    every = {**variants, **replayed}
    for i in range(len(qs)):  # warm up
        for fn in variants.values():
            fn(i)
    order = list(every.items())
    rng = random.Random(SEED)
    med: dict[str, list[float]] = {label: [] for label in every}
    paired: list[float] = []
    load0 = os.getloadavg()
    gc.disable()
    try:
        for _ in range(args.passes):
            times: dict[str, list[int]] = {label: [] for label in every}
            for i in range(len(qs)):
                at[0] = i
                for label, fn in rng.sample(order, len(order)):
                    if label in replayed:
                        Index.search = replay  # type: ignore[method-assign]
                    t0 = time.thread_time_ns()
                    fn(i)
                    dt = time.thread_time_ns() - t0
                    Index.search = real  # type: ignore[method-assign]
                    times[label].append(dt)
            for label in every:
                med[label].append(statistics.median(times[label]) / 1e3)
            pairs = zip(times["kb.search_ids"], times["Index.search"])
            paired.append(statistics.median([a - b for a, b in pairs]) / 1e3)
    finally:
        Index.search = real  # type: ignore[method-assign]
        gc.enable()
    load1 = os.getloadavg()
    m = {label: statistics.median(v) for label, v in med.items()}
    print(f"kbcore ef {ef}; {len(qs)} queries x {args.passes} passes; load {load0[0]:.2f} -> {load1[0]:.2f}")
    print("| variant | thread CPU us / query (median of passes) | passes |")
    print("|---|---:|---|")
    for label, v in med.items():
        print(f"| {label} | {m[label]:.2f} | {min(v):.2f}-{max(v):.2f} |")
    print(f"real walks: search_ids - Index.search = {m['kb.search_ids'] - m['Index.search']:.2f} us (medians)")
    lo, hi = min(paired), max(paired)
    print(f"real walks: paired per query = {statistics.median(paired):.2f} us (passes {lo:.2f}-{hi:.2f})")
    warm = m["kb.search_ids, replayed"] - m["Index.search, replayed"]
    print(f"replayed: search_ids - the replayed call = {warm:.2f} us (the Python, warm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
