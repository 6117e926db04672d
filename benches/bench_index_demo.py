"""A quick synthetic index benchmark (was ``kbcore bench-index``): builds an HNSW index on seeded
clustered vectors and prints recall@10 against exact search and single-thread QPS per ``ef``,
then one filtered search.

    python -m benches.bench_index_demo [--n 20000] [--dim 128] [--queries 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from kbcore import Index, __version__, simd_level


def _clustered(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray) -> np.ndarray:
    x = centres[rng.integers(0, len(centres), n)] + 0.35 * rng.standard_normal((n, dim))
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth))
    return hits / truth.size


def run(args: argparse.Namespace) -> int:
    """Builds an HNSW index on seeded synthetic data and prints recall and QPS."""
    rng = np.random.default_rng(args.seed)
    n, dim, nq, k = args.n, args.dim, args.queries, 10
    centres = rng.standard_normal((max(n // 100, 10), dim)).astype(np.float32)
    base = _clustered(rng, n, dim, centres)
    queries = _clustered(rng, nq, dim, centres)
    tags = rng.integers(0, 100, n)
    print(f"kbcore {__version__} | SIMD {simd_level()} | {n:,} x {dim} synthetic vectors, {nq} queries")

    t0 = time.perf_counter()
    index = Index(dim, "cosine", "hnsw", M=16, ef_construction=200)
    index.add(base, np.arange(n), metadata=[{"tag": int(t)} for t in tags])
    build = time.perf_counter() - t0
    print(f"build: {build:.2f} s ({n / build:,.0f} vectors/s, all cores)")

    truth = np.argsort(-(queries @ base.T), axis=1)[:, :k]
    print(f"{'ef':>5} {'recall@10':>10} {'QPS (1 thread)':>15}")
    for ef in (16, 32, 64, 128):
        t0 = time.perf_counter()
        found = np.stack([index.search(q, k, ef=ef, threads=1)[0] for q in queries])
        qps = nq / (time.perf_counter() - t0)
        print(f"{ef:>5} {_recall(found, truth):>10.4f} {qps:>15,.0f}")

    where = {"tag": {"$lt": 5}}
    passing = np.flatnonzero(tags < 5)
    ftruth = passing[np.argsort(-(queries @ base[passing].T), axis=1)[:, :k]]
    t0 = time.perf_counter()
    found = np.stack([index.search(q, k, where=where, threads=1)[0] for q in queries])
    qps = nq / (time.perf_counter() - t0)
    print(
        f"filtered {where} ({len(passing) / n:.0%} of rows pass): "
        f"recall@10 {_recall(found, ftruth):.4f}, {qps:,.0f} QPS"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20_000, help="number of vectors")
    p.add_argument("--dim", type=int, default=128, help="dimension")
    p.add_argument("--queries", type=int, default=300, help="number of queries")
    p.add_argument("--seed", type=int, default=0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
