"""Probe (issue 28, not a product change): would walking the graph on PCA-reduced SQ8 codes
(LeanVec's idea: a smaller vector for the traversal, the full one for the re-rank) beat the
full-dimension SQ8 walk at equal recall on real embeddings?

For each reduced dimension d (PCA of the chunk vectors, centred basis, rows projected
uncentred) it builds an ordinary kbcore SQ8 index over the projected rows (metric ip, M 16,
ef_construction 200, seed 1, ``rerank=R``), asks it for the R best by a one-query-per-call
walk, and re-ranks those R on the full 384-d rows in numpy (recall only: that re-rank is not
timed). QPS is thread CPU time of the walk on the reduced index (its own R-row re-rank on the
d-dim rows included); a native version would re-rank R full rows instead, which costs more.
The full-dimension SQ8 index at k 10 is the reference. One process, best of 5 passes.

Its ~1.2x did not survive the native trial (``pca_walk_trial.py``, docs/graph-quality.md):
the query projection it leaves untimed costs more than the walk saves unless done in int8.

    python -m benches.trials.pca_walk_probe --dataset scifact      # or arguana
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from benches.trials.graph_trial import load

import kbcore


def qps(index: kbcore.Index, queries: np.ndarray, k: int, ef: int, passes: int = 5) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.thread_time()
        for q in queries:
            index.search(q[None], k, ef=ef)
        best = min(best, time.thread_time() - t0)
    return len(queries) / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact", choices=("scifact", "arguana"))
    p.add_argument("--dims", default="128,160,192")
    args = p.parse_args()
    ds = load(args.dataset)
    x, q, gt = ds.base, ds.queries, ds.gt_ids

    def recall(ids: np.ndarray) -> float:
        return float(np.mean([len(set(gt[i]) & set(ids[i][:10])) / 10 for i in range(len(q))]))

    print("load", os.getloadavg())
    full = kbcore.Index(x.shape[1], "cosine", M=16, ef_construction=200, seed=1, quantization="sq8")
    full.add(x, np.arange(len(x)))
    for ef in (10, 12, 16, 20, 24, 32, 48):
        ids, _ = full.search(q, 10, ef=ef)
        print(f"full sq8 ef {ef} recall {recall(ids):.3f} qps {qps(full, q, 10, ef):.0f}")
    mu = x.mean(0)
    _, vecs = np.linalg.eigh(np.cov((x - mu).T))
    basis = vecs[:, ::-1].astype(np.float32)
    for d in map(int, args.dims.split(",")):
        xp, qp = np.ascontiguousarray(x @ basis[:, :d]), np.ascontiguousarray(q @ basis[:, :d])
        for r in (16, 24, 32):
            idx = kbcore.Index(d, "ip", M=16, ef_construction=200, seed=1, quantization="sq8", rerank=r)
            idx.add(xp, np.arange(len(x)))
            for ef in (r, int(r * 1.5), r * 2):
                ids, _ = idx.search(qp, r, ef=ef)
                rr = np.array([ids[i][np.argsort(-(x[ids[i]] @ q[i]))] for i in range(len(q))])
                print(f"pca {d} R {r} ef {ef} recall {recall(rr):.3f} qps {qps(idx, qp, r, ef):.0f}")
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
