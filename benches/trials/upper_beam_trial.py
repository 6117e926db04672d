"""Issue 28: the descent's beam at level 1 against the greedy descent, interleaved in one process.

Reopens (or builds once and saves) ``bench_quant``'s index of the data set through
``--index-cache`` and times the same index under each beam setting: ``kbcore._core.
_set_upper_beam(divisor, 0)`` before each timing, divisor 0 being the greedy descent (Malkov &
Yashunin's ef = 1 on every upper level) and d a beam of ef // d at level 1 (docs/graph-quality.md,
"A beam at level 1 of the descent"). The floor of 50,000 slots is set to 0 here so that every
data set shows what the beam does. Per setting and ef: recall@10 against exact brute force and
the mean scored nodes (``Index.search_stats``); then ``--passes`` passes, each timing every
setting at every ef (one query per call, one thread, one pass over the query set per timing);
per setting, the median time at each ef, interpolated at recall 0.95 and 0.99, and its ratio to
the greedy descent.

    python -m benches.trials.upper_beam_trial --dataset scifact --index-cache DIR
    python -m benches.trials.upper_beam_trial --dataset synthetic --n 1000000 --index-cache DIR --passes 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benches.bench_quant import build_all, load_real
from benches.datasets import make_synthetic

from kbcore import _core

K = 10


def recall(ids: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a.tolist()) & set(b[:K].tolist())) / K for a, b in zip(ids, truth)]))


def at_recall(points: list[tuple[float, float]], target: float) -> float | None:
    """The cost at ``target`` recall, interpolated linearly between the grid's points (recall,
    cost) in ef order; the first point's cost when it already reaches the target; None when
    no point does."""
    if points and points[0][0] >= target:
        return points[0][1]
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if r0 < target <= r1:
            return c0 + (c1 - c0) * (target - r0) / (r1 - r0)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="scifact", help="scifact, arguana or synthetic")
    p.add_argument("--n", type=int, default=100_000, help="synthetic rows (default 100000)")
    p.add_argument("--nq", type=int, default=1000, help="synthetic queries (default 1000)")
    p.add_argument("--data", default=None, help="folder holding scifact/ and arguana/ (default $KBCORE_DATA)")
    p.add_argument("--lib", default="kbcore-sq8", help="kbcore-sq8 (default), kbcore-rabitq or kbcore")
    p.add_argument("--index-cache", required=True, help="bench_quant's --index-cache folder")
    p.add_argument("--divisors", default="0,8,4", help="beam settings; 0 = greedy, the reference (first)")
    p.add_argument("--efs", default="10,16,24,32,48,64,96,128,192,256,384")
    p.add_argument("--passes", type=int, default=5)
    args = p.parse_args(argv)
    if not args.lib.startswith("kbcore"):
        p.error("--lib must be a kbcore variant")
    divisors = [int(x) for x in args.divisors.split(",")]
    efs = [int(x) for x in args.efs.split(",")]
    print(f"load at start: {os.getloadavg()}", flush=True)
    ds = make_synthetic(args.n, args.nq) if args.dataset == "synthetic" else load_real(args.dataset, args.data)
    adapters, _ = build_all([args.lib], ds, Path(args.index_cache))
    index = adapters[0].index
    queries = [np.ascontiguousarray(q) for q in ds.queries]
    before = _core._upper_beam()
    rec: dict[tuple[int, int], float] = {}
    scored: dict[tuple[int, int], float] = {}
    times: dict[tuple[int, int], list[float]] = {}
    try:
        for d in divisors:
            _core._set_upper_beam(d, 0)
            for ef in efs:
                rec[d, ef] = recall(index.search(ds.queries, K, ef=ef)[0], ds.gt_ids)
                scored[d, ef] = float(index.search_stats(ds.queries, K, ef=ef)["scored"].mean())
                times[d, ef] = []
        search = index.search
        for _ in range(args.passes):
            for d in divisors:
                _core._set_upper_beam(d, 0)
                for ef in efs:
                    t0 = time.perf_counter()
                    for q in queries:
                        search(q, K, ef=ef)
                    times[d, ef].append((time.perf_counter() - t0) / len(queries))
    finally:
        _core._set_upper_beam(*before)
    print(f"{ds.name}, {args.lib}: {ds.n} rows, {ds.nq} queries, {args.passes} passes; load at end: {os.getloadavg()}")
    ref = divisors[0]
    for d in divisors:
        label = "greedy" if d == 0 else f"ef/{d}"
        cells = []
        for target in (0.95, 0.99):
            t = at_recall([(rec[d, ef], statistics.median(times[d, ef])) for ef in efs], target)
            s = at_recall([(rec[d, ef], scored[d, ef]) for ef in efs], target)
            t_ref = at_recall([(rec[ref, ef], statistics.median(times[ref, ef])) for ef in efs], target)
            if t is None or s is None:
                cells.append(f"@{target}: not reached")
            else:
                ratio = f", QPS x{t_ref / t:.3f} of {'greedy' if ref == 0 else ref}" if t_ref else ""
                cells.append(f"@{target}: {t * 1e6:7.1f} us, {s:6.0f} scored{ratio}")
        print(f"  {label:7s} " + " | ".join(cells))
        print("          recall " + " ".join(f"{ef}:{rec[d, ef]:.3f}" for ef in efs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
