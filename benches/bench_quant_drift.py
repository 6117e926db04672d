"""How much recall a quantized index (SQ8, RaBitQ) loses when its codes were trained on data
that then drifts.

Run from the repository root (recall only, no timing: safe on a busy machine)::

    python -m benches.bench_quant_drift [--data DIR] [--n 100000] [--efs 16,32,64,128,256] [--json OUT]

The codes of ``quantization="sq8"`` are trained once, from the rows stored when the index first
holds 1,000 of them (docs/quantization.md). Later rows are encoded with those per-dimension
ranges and clip where they fall outside. Three ways to fill the same index are compared at each
ef, recall@10 against the exact top-10:

- ``all``: every row in one ``add``, so training samples the whole set (the best case);
- ``prefix``: the first 1,000 rows first (training sees only them), then the rest;
- ``prefix+retrain``: as ``prefix``, then ``retrain_quantizer()``;

and the float32 index as the reference. The same three runs are made for ``quantization="rabitq"``
(4 bits), whose training keeps only a centroid (the rotation is fixed by the seed and every
row keeps its own norm and scale, so nothing clips): a drift moves the centroid away from the
data, which only enlarges the residual norms the codes quantize. The prefix is the worst realistic case on the data we
have: on SciFact, the first 1,000 chunks in file order (a few hundred abstracts); on the seeded
synthetic set, 1,000 rows drawn from 2 % of the clusters (a knowledge base whose first documents
are all on one topic). The fraction of code values that clip is reported for each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benches.datasets import Dataset, load_scifact, make_synthetic, scifact_dir

K = 10
M = 16
EF_CONSTRUCTION = 200
PREFIX = 1000  # the row count at which an SQ8 index trains its codes


def recall(pred: np.ndarray, gt: np.ndarray) -> float:
    hits = sum(len(set(p.tolist()) & set(g.tolist())) for p, g in zip(pred, gt))
    return hits / gt.size


def clip_fraction(train: np.ndarray, rows: np.ndarray) -> float:
    """Fraction of the values of ``rows`` outside the per-dimension [min, max] of ``train``."""
    lo, hi = train.min(axis=0), train.max(axis=0)
    return float(np.mean((rows < lo) | (rows > hi)))


def build(ds: Dataset, order: np.ndarray, quantization: str | None, mode: str) -> Any:
    import kbcore

    ix = kbcore.Index(ds.dim, "cosine", "hnsw", M=M, ef_construction=EF_CONSTRUCTION, quantization=quantization)
    ids = order.astype(np.int64)
    base = ds.base[order]
    if mode == "all":
        ix.add(base, ids, threads=2)
    else:
        ix.add(base[:PREFIX], ids[:PREFIX], threads=2)
        ix.add(base[PREFIX:], ids[PREFIX:], threads=2)
        if mode == "prefix+retrain":
            ix.retrain_quantizer()
    return ix


def measure(ds: Dataset, order: np.ndarray, efs: Sequence[int]) -> dict:
    out: dict[str, Any] = {
        "n": ds.n,
        "clip_fraction_prefix": clip_fraction(ds.base[order[:PREFIX]], ds.base[order[PREFIX:]]),
        "recall": {},
    }
    runs = [("float32", None, "all"), ("sq8 all", "sq8", "all"), ("sq8 prefix", "sq8", "prefix")]
    runs.append(("sq8 prefix+retrain", "sq8", "prefix+retrain"))
    runs += [("rabitq all", "rabitq", "all"), ("rabitq prefix", "rabitq", "prefix")]
    runs.append(("rabitq prefix+retrain", "rabitq", "prefix+retrain"))
    for name, quant, mode in runs:
        t0 = time.perf_counter()
        ix = build(ds, order, quant, mode)
        row = {}
        for ef in efs:
            ids, _ = ix.search(ds.queries, K, ef=ef, threads=2)
            row[ef] = recall(np.asarray(ids), ds.gt_ids)
        out["recall"][name] = row
        print(
            f"  {name:<20s} "
            + "  ".join(f"ef {ef}: {r:.4f}" for ef, r in row.items())
            + f"   ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        del ix
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.bench_quant_drift", description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="folder holding scifact/ (default $KBCORE_DATA)")
    ap.add_argument("--n", type=int, default=100_000, help="synthetic base size")
    ap.add_argument("--efs", default="16,32,64,128,256")
    ap.add_argument("--datasets", default="scifact,synthetic")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    efs = [int(e) for e in args.efs.split(",")]
    results: dict[str, Any] = {"loadavg_start": os.getloadavg(), "efs": efs, "datasets": {}}
    for name in [s.strip() for s in args.datasets.split(",") if s.strip()]:
        if name == "scifact":
            if not (scifact_dir(args.data) / "chunk_embeddings.npy").exists():
                print(f"scifact: no chunk_embeddings.npy under {scifact_dir(args.data)}, skipped")
                continue
            ds = load_scifact(args.data)
            order = np.arange(ds.n)  # file order: the first 1,000 chunks come from a few hundred abstracts
            label = "SciFact chunks, first 1,000 in file order"
        elif name == "synthetic":
            ds = make_synthetic(args.n, 1000)
            # Rows whose nearest centre is among the first 2 % of clusters go first.
            rng = np.random.default_rng(7)
            centres = ds.base[rng.choice(ds.n, 20, replace=False)]
            near = np.argsort(-(ds.base @ centres.T).max(axis=1), kind="stable")
            order = np.concatenate([near[:PREFIX], np.sort(near[PREFIX:])])
            label = f"synthetic {ds.n:,} x {ds.dim}, first 1,000 rows nearest 20 base points"
        else:
            ap.error(f"unknown dataset {name!r}")
        print(
            f"\n== {label}: clip fraction of later rows "
            f"{clip_fraction(ds.base[order[:PREFIX]], ds.base[order[PREFIX:]]):.2%}",
            flush=True,
        )
        results["datasets"][name] = dict(measure(ds, order, efs), label=label)
    results["loadavg_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
