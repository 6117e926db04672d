"""Issue 28 trial: a per-query depth (adaptive ef) for the unfiltered level-0 walk (needs
benches/trials/adaptive_ef_trial.patch applied and built; it reads KBCORE_TRIAL_ADAEF).

The patched walk runs with a list of ``ef1`` until it converges, predicts the query's depth
``ef2 = ceil(c * exp(w . x))`` from the converged list (the 1st, 10th and last distance, the
level-0 hops, a few squares) and, when ef2 > ef1, continues the SAME walk with a list of ef2
(capped by the ``ef`` of the call), re-offering the nodes the short list rejected. ``w`` is a
least-squares fit of log(the smallest ef from which the query's recall@10 stays at its best)
on the features, fitted on the OTHER half of the queries (2-fold cross-validation, seeded
split); ``c`` is the knob swept like ef. Against exact brute force, per curve: mean recall@10,
its 5th percentile over queries, scored nodes (search_stats) and thread CPU time per query
(one query per call), every variant interleaved in one process on one saved index (sq8,
cosine, M 16, ef_construction 200, seed 1), medians of --passes rotated passes; each figure
interpolated at the target mean recall.

    python -m benches.trials.adaptive_ef_trial --dataset scifact --passes 15
    python -m benches.trials.adaptive_ef_trial --dataset synth100k --analyse-only

``--analyse-only`` skips the native rule: it prints the fixed-ef curve, the per-query oracle
(each query at its own cheapest grid ef; the bound of any per-query depth rule) and the
cross-validated rule's cost under the model "a query continued to ef2 costs the fixed walk at
ef2" (search_stats of the fixed walks), as in docs/graph-quality.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from benches.trials.graph_trial import build, load

import kbcore

ENV = "KBCORE_TRIAL_ADAEF"
GRID = [10, 11, 12, 13, 14, 16, 18, 20, 22, 24, 28, 32, 36, 40, 48, 56, 64, 80, 96, 128]


def set_env(v: str | None) -> None:
    if v is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = v


def recall_rows(ids: np.ndarray, gt: np.ndarray) -> np.ndarray:
    return np.array([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(ids, gt[:, :10])])


def features(index: kbcore.Index, queries: np.ndarray, ef1: int) -> np.ndarray:
    """What the native rule sees after the ef1 walk (exact instead of code distances)."""
    set_env(None)
    _, d = index.search(queries, ef1, ef=ef1, threads=1)
    d = np.sort(np.asarray(d, dtype=np.float64), axis=1)
    hops = index.search_stats(queries, 10, ef=ef1)["hops"].astype(np.float64)
    d1, d10, dl = d[:, 0], d[:, 9], d[:, -1]
    return np.column_stack([d1, d10, dl, d10 - d1, dl - d10, np.log(hops + 1), d1 * d1, d10 * d10, (d10 - d1) ** 2])


def ada_features(base: np.ndarray, queries: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Ada-ef-style additions (analysis only; the patch does not compute them): the mean and
    spread of the query's cosine distance to the base rows (1 - q.mu, sqrt(q' Cov q)) and the
    list's 1st, 10th and last distance as z-scores against them."""
    rng = np.random.default_rng(1)
    sample = base[rng.choice(len(base), min(len(base), 20000), replace=False)].astype(np.float64)
    mu = sample.mean(0)
    cov = np.cov(sample.T)
    q = queries.astype(np.float64)
    mean = 1.0 - q @ mu
    spread = np.sqrt(np.einsum("qi,ij,qj->q", q, cov, q))
    z = (x[:, :3] - mean[:, None]) / spread[:, None]
    return np.column_stack([x, z, mean, spread])


def fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on standardised features, returned as raw weights [w0, w1..w9]."""
    mu, sd = x.mean(0), x.std(0) + 1e-12
    a = np.column_stack([np.ones(len(x)), (x - mu) / sd])
    w = np.linalg.lstsq(a, y, rcond=None)[0]
    raw = w[1:] / sd
    return np.concatenate([[w[0] - float(np.sum(raw * mu))], raw])


def depth_label(rec: np.ndarray) -> np.ndarray:
    """log of the smallest grid ef from which each query's recall stays at its best."""
    best = rec.max(1, keepdims=True)
    bad = rec < best - 1e-9
    last_bad = np.where(bad.any(1), bad.shape[1] - 1 - np.argmax(bad[:, ::-1], axis=1), -1)
    return np.log(np.asarray(GRID, dtype=np.float64)[np.minimum(last_bad + 1, len(GRID) - 1)])


def at_recall(rows: list[dict], target: float, field: str) -> float | None:
    """``field`` linearly interpolated at mean recall ``target`` (the first bracket)."""
    for lo, hi in zip(rows, rows[1:]):
        if lo["recall"] < target <= hi["recall"]:
            t = (target - lo["recall"]) / (hi["recall"] - lo["recall"])
            return float(lo[field] + t * (hi[field] - lo[field]))
    return None  # not bracketed (the ef1 walk alone already reaches it, or no c reaches it)


def oracle(rec: np.ndarray, scored: np.ndarray, target: float) -> float | None:
    """Mean scored nodes when each query runs at its own cheapest grid ef (Lagrangian sweep)
    for mean recall ``target``: the bound of any per-query depth rule on this grid."""
    for lam in np.geomspace(1, 1e6, 600):
        j = np.argmin(scored - lam * rec, axis=1)
        pick = np.arange(len(rec))
        if rec[pick, j].mean() >= target:
            return float(scored[pick, j].mean())
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact")
    p.add_argument("--ef1s", default="10,12,16")
    p.add_argument("--cs", default="0.5,0.6,0.7,0.8,0.9,1.0,1.15,1.3,1.5,1.75,2.0,2.5,3.0")
    p.add_argument("--efmax", type=int, default=128)
    p.add_argument("--efs", default="10,11,12,13,14,16,18,20,24,28,32,40,48,56,64")
    p.add_argument("--passes", type=int, default=15)
    p.add_argument("--cache", default="/tmp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--targets", default="0.95,0.99")
    p.add_argument("--out", help="JSON lines of every row")
    p.add_argument("--analyse-only", action="store_true")
    p.add_argument("--ada-features", action="store_true", help="with --analyse-only: add ada_features")
    args = p.parse_args()
    ds = load(args.dataset)
    path = Path(args.cache) / f"adaef-{args.dataset}-sq8.kbi"
    if path.exists():
        index = kbcore.Index.load(str(path))
    else:
        index = build(ds, "sq8", 16)
        index.save(str(path))
    set_env(None)
    qs, gt = ds.queries, ds.gt_ids
    nq = len(qs)
    # Per-query recall and scored nodes of the fixed walk over the grid (labels, oracle).
    rec = np.zeros((nq, len(GRID)))
    scored = np.zeros((nq, len(GRID)))
    for j, ef in enumerate(GRID):
        ids, _ = index.search(qs, 10, ef=ef, threads=1)
        rec[:, j] = recall_rows(ids, gt)
        scored[:, j] = index.search_stats(qs, 10, ef=ef)["scored"]
    perm = np.random.default_rng(args.seed).permutation(nq)
    halves = [np.sort(perm[: nq // 2]), np.sort(perm[nq // 2 :])]
    y = depth_label(rec)
    ef1s = [int(e) for e in args.ef1s.split(",")]
    cs = [float(c) for c in args.cs.split(",")]
    weights: dict[int, list[np.ndarray]] = {}
    xs: dict[int, np.ndarray] = {}
    for ef1 in ef1s:
        x = features(index, qs, ef1)
        if args.ada_features:
            x = ada_features(ds.base, qs, x)
        xs[ef1] = x
        # weights[ef1][h]: fitted on the other half, used on half h
        weights[ef1] = [fit(x[halves[1 - h]], y[halves[1 - h]]) for h in (0, 1)]
    targets = [float(t) for t in args.targets.split(",")]
    if args.analyse_only:
        grid = np.asarray(GRID, dtype=np.float64)
        for t in targets:
            fixed = at_recall([{"recall": r, "s": s} for r, s in zip(rec.mean(0), scored.mean(0))], t, "s")
            o = oracle(rec, scored, t)
            print(f"{args.dataset} recall {t}: fixed scored {fixed}, oracle {o}", flush=True)
            for ef1 in ef1s:
                x = xs[ef1]
                curve = []
                for c in np.geomspace(0.3, 6, 80):
                    pick = np.zeros(nq, dtype=np.int64)
                    for h in (0, 1):
                        w = weights[ef1][h]
                        z = w[0] + x[halves[h]] @ w[1:]
                        want = np.clip(np.ceil(c * np.exp(z)), ef1, grid[-1])
                        pick[halves[h]] = np.searchsorted(grid, want - 1e-9)
                    r = rec[np.arange(nq), pick]
                    curve.append({"recall": r.mean(), "s": scored[np.arange(nq), pick].mean()})
                curve.sort(key=lambda row: row["recall"])
                v = at_recall(curve, t, "s")
                print(f"   ef1 {ef1}: modelled scored {v} ratio {None if not (v and fixed) else round(v / fixed, 3)}")
        return
    variants: list[tuple[str, int, list[str | None]]] = []
    for ef in (int(e) for e in args.efs.split(",")):
        variants.append((f"fixed:{ef}", ef, [None, None]))
    for ef1 in ef1s:
        for c in [1e-6, *cs]:
            envs: list[str | None] = [f"{ef1},{c}," + ",".join(f"{v:.9g}" for v in weights[ef1][h]) for h in (0, 1)]
            variants.append((f"ada:{ef1}:{c:g}", args.efmax, envs))

    def run_pass(v: tuple[str, int, list[str | None]]) -> float:
        t0 = time.thread_time_ns()
        for h in (0, 1):
            set_env(v[2][h])
            for q in qs[halves[h]]:
                index.search(q, 10, ef=v[1])
        set_env(None)
        return (time.thread_time_ns() - t0) / nq / 1e3

    for v in variants:
        run_pass(v)  # warm
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    loads = []
    for r in range(args.passes):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            times[v[0]].append(run_pass(v))
        loads.append(os.getloadavg()[0])
        print(f"pass {r} done, load {loads[-1]:.2f}", flush=True)
    rows = []
    for name, ef, envs in variants:
        ids = np.zeros((nq, 10), dtype=np.int64)
        st = np.zeros(nq)
        hops = np.zeros(nq)
        for h in (0, 1):
            set_env(envs[h])
            i, _ = index.search(qs[halves[h]], 10, ef=ef, threads=1)
            ids[halves[h]] = i
            s = index.search_stats(qs[halves[h]], 10, ef=ef)
            st[halves[h]] = s["scored"]
            hops[halves[h]] = s["hops"]
        set_env(None)
        pr = recall_rows(ids, gt)
        row = {
            "dataset": args.dataset,
            "variant": name,
            "recall": round(float(pr.mean()), 4),
            "p5": round(float(np.percentile(pr, 5)), 3),
            "scored": round(float(st.mean()), 1),
            "hops": round(float(hops.mean()), 1),
            "us": round(statistics.median(times[name]), 2),
            "load": [round(min(loads), 2), round(max(loads), 2)],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    for t in targets:
        fixed = [r for r in rows if r["variant"].startswith("fixed:")]
        base = {f: at_recall(fixed, t, f) for f in ("us", "scored", "p5")}
        print(f"{args.dataset} recall {t}: fixed us {base['us']} scored {base['scored']} p5 {base['p5']}")
        for ef1 in ef1s:
            # The rule's fixed cost: the patched walk that never continues, against fixed:ef1.
            idle = [r for r in rows if r["variant"] == f"ada:{ef1}:1e-06"]
            same = [r for r in rows if r["variant"] == f"fixed:{ef1}"]
            if idle and same:
                print(f"   ef1 {ef1}: stage 1 alone / fixed:{ef1} time {idle[0]['us'] / same[0]['us']:.3f}")
            mine = sorted(
                (r for r in rows if r["variant"].startswith(f"ada:{ef1}:") and not r["variant"].endswith(":1e-06")),
                key=lambda r: float(r["variant"].split(":")[2]),
            )
            vals = {f: at_recall(mine, t, f) for f in ("us", "scored", "p5")}
            if vals["us"] is None or base["us"] is None:
                print(f"   ef1 {ef1}: not bracketed (recall {mine[0]['recall']}..{mine[-1]['recall']})")
                continue
            print(
                f"   ef1 {ef1}: us {vals['us']:.2f} scored {vals['scored']:.0f} p5 {vals['p5']:.3f} "
                f"time ratio {vals['us'] / base['us']:.3f} scored ratio {vals['scored'] / base['scored']:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
