"""Per-call overhead of one-query search (issue 28): where the time outside the graph walk goes.

On SciFact chunks (19,369 x 384, 300 queries, cosine), kbcore sq8 and SymphonyQG (``rabitqlib``,
when installed) are each built once and searched at the smallest ef of ``DEFAULT_EFS`` whose
batch answer reaches recall@10 ``--target``; then, interleaved in one process (in a fresh seeded
random order every pass, so a burst of outside load lands on every variant), each pass times ``--repeat``
sweeps over all queries for every variant, by this thread's CPU time (``--wall``: wall clock):

- ``batch``: one ``Index.search`` call on the [300, 384] array, one thread, per query;
- ``native-batch``: the same through ``_core.Index.search`` (no Python layer);
- ``search_one``: ``_core.Index.search_one`` per query (the binding, no Python layer);
- ``Index.search``: the public call per query (what a RAG request runs);
- ``symqg`` / ``symqg-batch``: SymphonyQG's ``search(q[None], ...)`` per query and its
  ``search_batch`` per query;
- ``floor: ...``: the kbcore calls on an index of two rows (the walk is a few distances): the
  cost of the call itself.

Printed: the median over passes of microseconds per query, each variant's ratio to ``batch``
and the per-call overhead (one-query minus batch per query; for the floor rows, minus the
floor's batch; for SymphonyQG, minus its own batch), with ``os.getloadavg()`` before and
after. Ratios within the process are what to read on a shared machine.

Run from the repository root::

    python -m benches.bench_call_overhead [--passes 15] [--target 0.95] [--data DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benches.datasets import load_scifact

K = 10
M = 16
EF_CONSTRUCTION = 200
BUILD_THREADS = 2
DEFAULT_EFS = (10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean recall@K of rows of ids against the exact top K."""
    return float(np.mean([len(set(a[:K].tolist()) & set(b[:K].tolist())) / K for a, b in zip(found, truth)]))


def first_ef(run: Callable[[int], np.ndarray], truth: np.ndarray, efs: tuple[int, ...], target: float) -> int:
    """The smallest ef of `efs` whose batch answer reaches `target` recall (the largest if none)."""
    for ef in efs:
        if recall(run(ef), truth) >= target:
            return ef
    return efs[-1]


# CPU time of this thread (user + system): on a shared machine a wall clock also counts the
# time other processes hold the core; --wall switches to time.perf_counter.
CLOCK: Callable[[], float] = time.thread_time


def sweep(fn: Callable[[Any], Any], items: list[Any], repeat: int = 1) -> float:
    """Seconds for one call of fn per item, per repeat (the mean of `repeat` sweeps)."""
    t0 = CLOCK()
    for _ in range(repeat):
        for item in items:
            fn(item)
    return (CLOCK() - t0) / repeat


def main(argv: list[str] | None = None) -> None:
    """Builds the indexes, times every variant interleaved and prints the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="SciFact folder or its parent (default $KBCORE_DATA)")
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--repeat", type=int, default=3, help="sweeps over the queries per timed unit")
    ap.add_argument("--wall", action="store_true", help="time by the wall clock instead of thread CPU time")
    ap.add_argument("--no-symqg", action="store_true", help="skip SymphonyQG even if rabitqlib is installed")
    args = ap.parse_args(argv)
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    reps = args.repeat

    import kbcore

    ds = load_scifact(args.data, K)
    x, q, truth = ds.base, ds.queries, ds.gt_ids
    nq = q.shape[0]
    index = kbcore.Index(
        x.shape[1], metric="cosine", kind="hnsw", M=M, ef_construction=EF_CONSTRUCTION, quantization="sq8"
    )
    index.add(x, np.arange(x.shape[0], dtype=np.int64), threads=BUILD_THREADS)
    ef = first_ef(lambda e: index.search(q, k=K, ef=e, threads=1)[0], truth, DEFAULT_EFS, args.target)
    native = index._native
    rows = [np.ascontiguousarray(r) for r in q]
    variants: dict[str, Callable[[], float]] = {
        "batch": lambda: sweep(lambda a: index.search(a, k=K, ef=ef, threads=1), [q], reps),
        "native-batch": lambda: sweep(lambda a: native.search(a, K, ef, 1, None), [q], reps),
        "search_one": lambda: sweep(lambda r: native.search_one(r, K, ef, None), rows, reps),
        "Index.search": lambda: sweep(lambda r: index.search(r, k=K, ef=ef, threads=1), rows, reps),
    }
    # The floor: the same calls on an index of two rows, where the walk is a few distances, so
    # what is left is the cost of a call itself (argument checks, result arrays, GIL, set-up).
    tiny = kbcore.Index(x.shape[1], metric="cosine", kind="hnsw", M=M, quantization="sq8")
    tiny.add(x[:2], np.arange(2, dtype=np.int64), threads=1)
    tiny_native = tiny._native
    variants["floor: native-batch"] = lambda: sweep(lambda a: tiny_native.search(a, K, ef, 1, None), [q], reps)
    variants["floor: search_one"] = lambda: sweep(lambda r: tiny_native.search_one(r, K, ef, None), rows, reps)
    variants["floor: Index.search"] = lambda: sweep(lambda r: tiny.search(r, k=K, ef=ef, threads=1), rows, reps)
    notes = [f"kbcore {kbcore.__version__} sq8 ef={ef} recall@{K}={recall(index.search(q, k=K, ef=ef)[0], truth):.3f}"]
    if not args.no_symqg:
        try:
            import rabitqlib
        except ImportError:
            notes.append("SymphonyQG skipped: rabitqlib is not installed")
        else:
            sq = rabitqlib.SymqgIndex(dim=x.shape[1], max_degree=2 * M, metric="ip", quantization_bits=0)
            sq.build(x, ef_construction=EF_CONSTRUCTION, num_threads=BUILD_THREADS)
            sef = first_ef(
                lambda e: np.asarray(sq.search_batch(q, K, max(e, K), 1)[0]), truth, DEFAULT_EFS, args.target
            )
            sef = max(sef, K)
            srows = [r[None, :] for r in q]
            variants["symqg"] = lambda: sweep(lambda r: sq.search(r, K, sef, 1), srows, reps)
            variants["symqg-batch"] = lambda: sweep(lambda a: sq.search_batch(a, K, sef, 1), [q], reps)
            got = np.asarray(sq.search_batch(q, K, sef, 1)[0])
            notes.append(f"SymphonyQG (rabitqlib) raw ef={sef} recall@{K}={recall(got, truth):.3f}")

    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for run in variants.values():  # warm-up pass
        run()
    # A fresh order each pass: a rotation would keep each variant behind the same predecessor
    # (whose cache footprint it inherits) in every pass.
    shuffle = random.Random(28)
    load_before = os.getloadavg()
    for _ in range(args.passes):
        order = list(names)
        shuffle.shuffle(order)
        for n in order:
            times[n].append(variants[n]() / nq * 1e6)
    load_after = os.getloadavg()

    for line in notes:
        print(line)
    clock = "wall clock" if args.wall else "thread CPU time"
    load = f"load before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    print(f"{args.passes} passes x {reps} sweeps x {nq} queries, {clock}; {load}")
    base = statistics.median(times["batch"])
    print("| variant | us/query (median) | min-max | / batch | per-call overhead us |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        med = statistics.median(times[n])
        ref = base
        if n == "symqg":
            ref = statistics.median(times["symqg-batch"])
        elif n.startswith("floor"):
            ref = statistics.median(times["floor: native-batch"])
        print(f"| {n} | {med:.2f} | {min(times[n]):.2f}-{max(times[n]):.2f} | {med / base:.2f} | {med - ref:+.2f} |")


if __name__ == "__main__":
    main()
