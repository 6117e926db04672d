"""Trial (issue 28, not a product change): walk the SQ8 graph on PCA-reduced codes, re-rank
the best R candidates on the full float32 rows, natively (LeanVec's idea).

Needs a build with ``benches/trials/pca_walk_trial.patch`` applied (it adds the trial-only
``Index._native._trial_set_projection(matrix, threads)`` and ``_trial_set_rerank(r)``): the
SQ8 codes then hold d' = matrix rows dimensions; ``encode`` and ``prepare`` project their
full-dimension input first (a d' x dim float32 matrix-vector product on the float kernels);
the graph, built on the float32 rows, is unchanged; the existing exact re-rank of the best R
candidates reads the full rows.

One process. The base SQ8 index (M 16, ef_construction 200, seed 1, cosine, default re-rank
depth) is built once, saved and loaded again once per reduced dimension, so that every
variant walks the same graph and only the codes differ. PCA: eigenvectors of the covariance
of the (unit) rows, the d' leading ones as the projection (rows projected uncentred, so inner
products are those of the projected vectors). Checks first that an identity projection
returns the base index's answers exactly. Then, per run, every (variant, ef) is timed in an
interleaved order: thread CPU time of one query per ``search`` call, best of ``--passes``
passes. Recall@10 against the exact top 10 (brute force on the float32 rows). QPS at recall
0.95 and 0.99 is interpolated (linearly in recall between the two grid points around the
target) on each variant's points in ascending ef.

    PYTHONPATH=src:. python -m benches.trials.pca_walk_trial --dataset scifact   # or arguana
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from benches.trials.graph_trial import load

import kbcore

DEFAULT_EFS = "10,12,16,20,24,32,40,48,64,80,96,128"
TARGETS = (0.95, 0.99)


def recall_at_10(ids: np.ndarray, gt: np.ndarray) -> float:
    return float(np.mean([len(set(gt[i, :10].tolist()) & set(ids[i, :10].tolist())) / 10 for i in range(len(gt))]))


def time_pass(index: kbcore.Index, queries: np.ndarray, ef: int) -> float:
    """Thread CPU microseconds per query, one query per call."""
    t0 = time.thread_time_ns()
    for q in queries:
        index.search(q, 10, ef=ef)
    return (time.thread_time_ns() - t0) / len(queries) / 1e3


def at_recall(points: list[tuple[float, float]], target: float) -> float | None:
    """QPS at `target` recall on (recall, qps) points in ascending ef (None: not reached)."""
    for (r0, q0), (r1, q1) in zip(points, points[1:], strict=False):
        if r0 < target <= r1:
            return q0 + (q1 - q0) * (target - r0) / (r1 - r0)
    if points and points[0][0] >= target:
        return points[0][1]
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact", choices=("scifact", "arguana", "synth20000"))
    p.add_argument("--dims", default="128,160,192")
    p.add_argument("--reranks", default="16,24,32")
    p.add_argument("--efs", default=DEFAULT_EFS, help="the ef grid (16 and 48 must be in it)")
    p.add_argument("--q8-only", action="store_true", help="only the int8 query projection (no float32 one)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    reranks = [int(r) for r in args.reranks.split(",")]
    efs = [int(e) for e in args.efs.split(",")]
    kinds_q = ("-q8",) if args.q8_only else ("", "-q8")
    out: dict = {"dataset": args.dataset, "load": [os.getloadavg()]}
    print("load", os.getloadavg(), flush=True)

    ds = load(args.dataset)
    x, queries, gt = ds.base, np.ascontiguousarray(ds.queries, dtype=np.float32), ds.gt_ids
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    n, dim = x.shape
    print(f"{args.dataset}: {n} x {dim}, {len(queries)} queries", flush=True)

    base = kbcore.Index(dim, "cosine", M=16, ef_construction=200, seed=1, quantization="sq8")
    t0 = time.perf_counter()
    base.add(x, np.arange(n, dtype=np.int64), threads=2)
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    base.retrain_quantizer(threads=1)
    out["base_train_encode_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    mu = xn.mean(0)
    _, vecs = np.linalg.eigh(np.cov((xn - mu).T))
    basis = np.ascontiguousarray(vecs[:, ::-1].T, dtype=np.float32)  # rows: components, leading first
    out["pca_s"] = time.perf_counter() - t0

    variants: dict[str, kbcore.Index] = {"base": base}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "base.kbi"
        base.save(path)
        ident = kbcore.Index.load(path)
        ident._native._trial_set_projection(np.eye(dim, dtype=np.float32), 1)
        ids_b, _ = base.search(queries, 10, ef=32)
        ids_i, _ = ident.search(queries, 10, ef=32)
        assert np.array_equal(ids_b, ids_i), "an identity projection changed the answers"
        print("identity projection: answers identical to the base index", flush=True)
        variants["identity"] = ident
        ident8 = kbcore.Index.load(path)
        ident8._native._trial_set_projection(np.eye(dim, dtype=np.float32), 1, int8_query=True)
        variants["identity-q8"] = ident8
        out["project_train_encode_s"] = {}
        for d in dims:
            for q8 in [k == "-q8" for k in kinds_q]:
                idx = kbcore.Index.load(path)
                t0 = time.perf_counter()
                idx._native._trial_set_projection(np.ascontiguousarray(basis[:d]), 1, int8_query=q8)
                out["project_train_encode_s"][f"{d}{'q8' if q8 else ''}"] = time.perf_counter() - t0
                variants[f"pca{d}{'-q8' if q8 else ''}"] = idx

    # (name, index name, rerank or None); "-q8": the query projected with the int8 kernels
    configs: list[tuple[str, str, int | None]] = [
        ("base", "base", None),
        ("identity", "identity", None),
        ("identity-q8", "identity-q8", None),
    ]
    configs += [(f"pca{d}{s} R{r}", f"pca{d}{s}", r) for s in kinds_q for d in dims for r in reranks]

    def set_rerank(idx_name: str, r: int | None) -> None:
        variants[idx_name]._native._trial_set_rerank(0 if r is None else r)

    recall: dict[tuple[str, int], float] = {}
    scored: dict[tuple[str, int], float] = {}
    for name, idx_name, r in configs:
        set_rerank(idx_name, r)
        for ef in efs:
            ids, _ = variants[idx_name].search(queries, 10, ef=ef)
            recall[name, ef] = recall_at_10(ids, gt)
            scored[name, ef] = float(variants[idx_name].search_stats(queries, 10, ef=ef)["scored"].mean())
    out["recall"] = {f"{k[0]} ef{k[1]}": v for k, v in recall.items()}
    out["scored"] = {f"{k[0]} ef{k[1]}": v for k, v in scored.items()}

    runs = []
    for run in range(args.runs):
        us: dict[tuple[str, int], float] = {}
        for ef in efs:  # interleaved: every variant at this ef, then the next ef
            for name, idx_name, r in configs:
                if name.startswith("identity") and ef not in (16, 48):
                    continue
                set_rerank(idx_name, r)
                us[name, ef] = min(time_pass(variants[idx_name], queries, ef) for _ in range(args.passes))
        load_now = os.getloadavg()
        out["load"].append(load_now)
        print(f"run {run} load {load_now}", flush=True)
        res: dict = {"us": {f"{k[0]} ef{k[1]}": v for k, v in us.items()}, "at": {}}
        for name, _, _ in configs:
            if name.startswith("identity"):
                continue
            pts = [(recall[name, ef], 1e6 / us[name, ef]) for ef in efs]
            res["at"][name] = {t: at_recall(pts, t) for t in TARGETS}
        # The best reduced variant per d' at each target (the envelope over R).
        kinds = [f"pca{d}{s}" for s in kinds_q for d in dims]
        for kind in kinds:
            for t in TARGETS:
                vals = [v for r in reranks if (v := res["at"][f"{kind} R{r}"][t]) is not None]
                res["at"].setdefault(f"{kind} best", {})[t] = max(vals) if vals else None
        for t in TARGETS:
            b = res["at"]["base"][t]
            line = f"  recall {t}: base {b:.0f} QPS" if b else f"  recall {t}: base not reached"
            for kind in kinds:
                v = res["at"][f"{kind} best"][t]
                line += f" | {kind} " + (f"{v:.0f} ({v / b:.2f}x)" if v and b else "-")
            print(line, flush=True)
        res["prep_us_identity_minus_base"] = {
            f"{name} ef{ef}": us[name, ef] - us["base", ef] for name in ("identity", "identity-q8") for ef in (16, 48)
        }
        print("  identity projection minus base, us/query:", res["prep_us_identity_minus_base"], flush=True)
        runs.append(res)
    out["runs"] = runs

    print(f"\n{'variant':14s} " + " ".join(f"ef{ef:>3d}" for ef in efs))
    for name, _, _ in configs:
        print(f"{name:14s} recall " + " ".join(f"{recall[name, ef]:.3f}" for ef in efs))
        print(f"{'':14s} scored " + " ".join(f"{scored[name, ef]:5.0f}" for ef in efs))
        for i, res in enumerate(runs):
            us_row = [res["us"].get(f"{name} ef{ef}") for ef in efs]
            print(f"{'':14s} us r{i}  " + " ".join("    -" if v is None else f"{v:5.1f}" for v in us_row))
    print(
        "build (add, 2 threads) s",
        round(out["build_s"], 2),
        "| base train+encode s",
        round(out["base_train_encode_s"], 3),
        "| PCA s",
        round(out["pca_s"], 3),
        "| project+train+encode s",
        {k: round(v, 3) for k, v in out["project_train_encode_s"].items()},
    )
    print("load", os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
