"""The ``kbcore`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import __version__, simd_level
from .index import Index


def _clustered(rng: np.random.Generator, n: int, dim: int, centres: np.ndarray) -> np.ndarray:
    x = centres[rng.integers(0, len(centres), n)] + 0.35 * rng.standard_normal((n, dim))
    x = x.astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth))
    return hits / truth.size


def cmd_index_demo(args: argparse.Namespace) -> int:
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
    print(f"filtered {where} ({len(passing) / n:.0%} of rows pass): "
          f"recall@10 {_recall(found, ftruth):.4f}, {qps:,.0f} QPS")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kbcore", description="kbcore retrieval core")
    parser.add_argument("--version", action="version", version=f"kbcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build an index on synthetic data; print recall and QPS")
    demo.add_argument("--n", type=int, default=20_000, help="number of vectors")
    demo.add_argument("--dim", type=int, default=128, help="dimension")
    demo.add_argument("--queries", type=int, default=300, help="number of queries")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_index_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
