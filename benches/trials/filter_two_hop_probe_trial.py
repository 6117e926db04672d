"""Trial (issue 28): the two-hop traversal's near probe on filters whose passing rows are far.

Builds the seeded clustered set of ``far_rows_set.py`` with filters of 15, 20, 25 and 29 % of
rows ("anti": whole clusters farthest from every query cluster; "uncorr": uniform), and prints
per ef the plan, recall@10 of the automatic plan (full pages), of the forced two-hop traversal
(a forced strategy runs no probe), the queries whose automatic answer differs from the forced
traversal's (those the probe sent to the exact scan, and on main those of the old probe), and
the thread CPU time of auto / forced traversal: one process, one thread, alternating passes,
medians.

    python benches/trials/filter_two_hop_probe_trial.py NOISE DIM ROWS CLUSTERS [PASSES]

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

EFS = (10, 16, 24, 32, 48, 64)


def main() -> None:
    noise, dim, n, clusters = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    passes = int(sys.argv[5]) if len(sys.argv) > 5 else 7
    index, queries, cases = far_rows_set.build(noise, dim, n, clusters, (0.15, 0.2, 0.25, 0.29))
    for name, where, mask, truth in cases:
        cw = compile_where(where)
        print(f"{name}: passing {mask.mean():.3f}", flush=True)
        for ef in EFS:
            plan = index._native.strategy(int(mask.sum()), ef)
            auto, _ = index._native.search(queries, 10, ef, 1, cw, "auto")
            forced, _ = index._native.search(queries, 10, ef, 1, cw, "graph")
            ra = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(auto, truth)])
            rf = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(forced, truth)])
            full = np.mean((auto >= 0).all(axis=1))
            line = f"  ef {ef:3d} plan {plan}: auto {ra:.3f} (full {full:.2f}), graph {rf:.3f}"
            if plan == "graph":
                sent = int(np.sum(np.any(auto != forced, axis=1)))
                times: dict[str, list[float]] = {"auto": [], "graph": []}
                for p in range(passes):
                    for mode in ("auto", "graph") if p % 2 == 0 else ("graph", "auto"):
                        t0 = time.thread_time()
                        index._native.search(queries, 10, ef, 1, cw, mode)
                        times[mode].append(time.thread_time() - t0)
                ratio = statistics.median(times["auto"]) / statistics.median(times["graph"])
                us = 1e6 * statistics.median(times["graph"]) / len(queries)
                line += f", differing {sent}/{len(queries)}, cpu auto/graph {ratio:.3f} (graph {us:.0f} us/q)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
