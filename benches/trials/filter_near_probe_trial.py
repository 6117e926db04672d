"""Trial (issue 28): the filtered walk's near probe on filters whose passing rows are far.

Builds seeded clustered unit vectors (as ``filter_far_rows_trial.py``), filters passing whole
clusters none of which holds a query ("anti") and uncorrelated filters of the same sizes (20,
35 and 50 % of rows), and prints per ef the plan, recall@10 of the automatic plan (with the
near probe when the plan is the walk) and of the forced strategy (a forced strategy runs no
probe: two-hop below 30 %, the walk from 30 %), the queries the probe sent to the exact scan
(those whose automatic answer differs from the forced walk's), and, where the plan is the walk,
the thread CPU time of auto / forced: one process, one thread, alternating passes, medians.

    python benches/trials/filter_near_probe_trial.py NOISE DIM ROWS CLUSTERS [PASSES]

``0.15 64 30000 300`` is the set of tests/test_filtered_far_rows.py; ``0.05 384 100000 1000``
a synthetic 100k x 384 set.
"""

from __future__ import annotations

import statistics
import sys
import time

import far_rows_set  # benches/trials/, beside this script
import numpy as np

from kbcore.filters import compile_where


def main() -> None:
    noise, dim, n, clusters = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    passes = int(sys.argv[5]) if len(sys.argv) > 5 else 15
    index, queries, cases = far_rows_set.build(noise, dim, n, clusters)
    for name, where, mask, truth in cases:
        force = "graph" if mask.mean() < 0.3 else "walk"
        cw = compile_where(where)
        print(f"{name}: passing {mask.mean():.3f}")
        for ef in (16, 32, 64):
            plan = index._native.strategy(int(mask.sum()), ef)
            forced, _ = index._native.search(queries, 10, ef, 1, cw, force)
            auto, _ = index._native.search(queries, 10, ef, 1, cw, "auto")
            rf = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(forced, truth)])
            ra = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(auto, truth)])
            full = np.mean((auto >= 0).all(axis=1))
            line = f"  ef {ef} plan {plan}: auto {ra:.3f} (full {full:.2f}), {force} {rf:.3f}"
            if plan == "walk":
                sent = int(np.sum(np.any(auto != forced, axis=1)))
                times: dict[str, list[float]] = {"auto": [], "walk": []}
                for p in range(passes):
                    for mode in ("auto", "walk") if p % 2 == 0 else ("walk", "auto"):
                        t0 = time.thread_time()
                        index._native.search(queries, 10, ef, 1, cw, mode)
                        times[mode].append(time.thread_time() - t0)
                ratio = statistics.median(times["auto"]) / statistics.median(times["walk"])
                line += f", answers differing {sent}/{len(queries)}, cpu auto/walk {ratio:.3f}"
            print(line)


if __name__ == "__main__":
    main()
