"""Trial (issue 28): seeding filtered graph searches with a sample of passing rows.

Builds seeded clustered unit vectors (as ``filter_far_rows_trial.py``), filters passing whole
clusters none of which holds a query ("anti") and uncorrelated filters of the same sizes, and
prints recall@10 of the automatic plan and of the forced strategy (two-hop below 30 %, the walk
from 30 %) with the seeds on and off (``KBCORE_SEEDS=0``), then the thread CPU time of the
automatic plan with seeds on / off: one process, one thread, alternating passes, medians.

    python benches/trials/filter_seeds_trial.py NOISE DIM ROWS CLUSTERS [PASSES]

``0.15 64 30000 300`` is the set of tests/test_filtered_far_rows.py; ``0.05 384 100000 1000``
the synthetic 100k x 384 set.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import far_rows_set  # benches/trials/, beside this script
import numpy as np

from kbcore.filters import compile_where


def set_seeds(on: bool) -> None:
    if on:
        os.environ.pop("KBCORE_SEEDS", None)
    else:
        os.environ["KBCORE_SEEDS"] = "0"


def main() -> None:
    noise, dim, n, clusters = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    passes = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    index, queries, cases = far_rows_set.build(noise, dim, n, clusters)
    for name, where, mask, truth in cases:
        force = "graph" if mask.mean() < 0.3 else "walk"
        cw = compile_where(where)
        print(f"{name}: passing {mask.mean():.3f}")
        for ef in (16, 32, 64):
            plan = index._native.strategy(int(mask.sum()), ef)
            row = []
            for on in (False, True):
                set_seeds(on)
                forced, _ = index._native.search(queries, 10, ef, 1, cw, force)
                auto, _ = index._native.search(queries, 10, ef, 1, cw, "auto")
                rf = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(forced, truth)])
                ra = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(auto, truth)])
                full = np.mean((auto >= 0).all(axis=1))
                row.append(f"{'on ' if on else 'off'} auto {ra:.3f} (full {full:.2f}) {force} {rf:.3f}")
            times = {False: [], True: []}
            for p in range(passes):
                for on in (False, True) if p % 2 == 0 else (True, False):
                    set_seeds(on)
                    t0 = time.thread_time()
                    index._native.search(queries, 10, ef, 1, cw, "auto")
                    times[on].append(time.thread_time() - t0)
            ratio = statistics.median(times[True]) / statistics.median(times[False])
            print(f"  ef {ef} plan {plan}: " + " | ".join(row) + f" | cpu on/off {ratio:.3f}")
    set_seeds(True)


if __name__ == "__main__":
    main()
