"""Trial (issue 28, not kept): anti-correlated 20 % filters and a distance-aware probe.

Builds seeded clustered unit vectors, a filter passing whole clusters none of which holds a
query (the clusters least similar to every query cluster, as ``benches/bench_filter.py`` builds
its ``anti`` filters) and an uncorrelated filter of the same size, and prints per ef the plan
the cost model picks, recall@10 of the automatic plan and of the forced two-hop traversal
against the exact oracle. With ``filter_distance_probe_trial.patch`` applied and
``KBCORE_H37_DEBUG=1`` it also prints, per query the traversal answered, the traversal's
recall and the two probe ratios (docs/filter-ir.md, "Known limit").

    python benches/trials/filter_far_rows_trial.py NOISE DIM ROWS

With ``0.15 64 30000`` it builds the set of tests/test_filtered_far_rows.py; ``0.05 384 30000``
is closer to the 384-d synthetic set of benches/bench_filter.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa

import kbcore
from kbcore.filters import compile_where


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def main() -> None:
    noise, dim, n = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    clusters, query_clusters, nq, frac = 300, 20, 200, 0.2
    rng = np.random.default_rng(7)
    centres = unit(rng.standard_normal((clusters, dim)))
    labels = rng.integers(0, clusters, n)
    data = unit(centres[labels] + noise * rng.standard_normal((n, dim)))
    qc = rng.choice(clusters, query_clusters, replace=False)
    queries = unit(centres[rng.choice(qc, nq)] + noise * rng.standard_normal((nq, dim)))
    close = (centres @ centres[qc].T).max(axis=1)
    close[qc] = np.inf
    order = np.argsort(close, kind="stable")
    sizes = np.bincount(labels, minlength=clusters)
    far = sorted(int(c) for c in order[: int(np.searchsorted(np.cumsum(sizes[order]), frac * n)) + 1])
    uniform = rng.random(n)
    index = kbcore.Index(dim, "cosine", "hnsw", M=16, ef_construction=100)
    meta = pa.table({"cluster": labels.astype(np.int64), "r": uniform})
    index.add(data, np.arange(n, dtype=np.int64), metadata=meta, threads=1)
    for q in queries:  # calibrates the cost model, as in normal use
        index.search(q, 10, threads=1)
    debug = bool(os.environ.get("KBCORE_H37_DEBUG"))
    cases = [
        ("anti", {"cluster": {"$in": far}}, np.isin(labels, far)),
        ("uncorr", {"r": {"$lt": frac}}, uniform < frac),
    ]
    for name, where, mask in cases:
        ids = np.flatnonzero(mask)
        sims = queries @ data[mask].T
        truth = ids[np.argsort(-sims, axis=1)[:, :10]]
        best_all = (queries @ data.T).max(axis=1).mean()
        print(f"{name}: passing {mask.mean():.3f}, best passing cos {sims.max(axis=1).mean():.2f}, best {best_all:.2f}")
        for ef in (16, 32, 64):
            plan = index._native.strategy(int(mask.sum()), ef)
            graph, _ = index._native.search(queries, 10, ef, 1, compile_where(where), "graph")
            per_query = np.array([len(set(g) & set(t)) / 10 for g, t in zip(graph, truth)])
            if debug:
                r, w = os.pipe()
                saved = os.dup(2)
                os.dup2(w, 2)
            auto, _ = index._native.search(queries, 10, ef, 1, compile_where(where), "auto")
            if debug:
                os.dup2(saved, 2)
                os.close(w)
                for line in os.read(r, 1 << 20).decode().splitlines():
                    _, _, qi, best, near_all, near_pass = line.split()
                    ratios = f"{float(best) / float(near_all):.2f} {float(near_pass) / float(near_all):.2f}"
                    print(f"    q{qi} traversal recall {per_query[int(qi)]:.1f} post/pre ratio {ratios}")
                os.close(r)
            rec = np.mean([len(set(a) & set(t)) / 10 for a, t in zip(auto, truth)])
            full = np.mean((auto >= 0).all(axis=1))
            print(f"  ef {ef}: plan {plan}, auto recall@10 {rec:.3f} full {full:.2f}, graph {per_query.mean():.3f}")


if __name__ == "__main__":
    main()
