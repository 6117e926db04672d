"""Issue 28 trial: patience-based termination of the level-0 walk (needs
benches/trials/patience_trial.patch applied and built; it reads KBCORE_TRIAL_PATIENCE).

Rules (``mode,P,w,tol``): a hop is *stale* when at most ``tol`` nodes entered the best ``w``
of the candidate list (mode 1, Teofili & Lin, ECIR 2025), and, in mode 2, only once every
one of the best ``w`` has been expanded; ``P`` stale hops in a row end the walk. ``off``
is today's walk (run until no entry of the ef best is open).

One index per dataset (SQ8, cosine, M 16, ef_construction 200, seed 1, cached under --cache),
every variant interleaved per ef within one process, thread CPU time of one query per call,
median of --passes rotated passes. Per variant: the recall@10 curve over ef (mean and 5th
percentile of per-query recall against exact brute force), hops and scored nodes, and the
time per query interpolated at recall 0.95 and 0.99, with its ratio to ``off``.

    python -m benches.trials.patience_trial --dataset scifact \
        --variants off,1:16:20:0,2:8:20:0 --efs 16,24,32,48,64,96,128,192,256 --passes 5
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

ENV = "KBCORE_TRIAL_PATIENCE"


def set_variant(v: str) -> None:
    if v == "off":
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = v.replace(":", ",")


def time_pass(index: kbcore.Index, queries: np.ndarray, ef: int) -> float:
    """Thread CPU microseconds per query, one query per call."""
    t0 = time.thread_time_ns()
    for q in queries:
        index.search(q, 10, ef=ef)
    return (time.thread_time_ns() - t0) / len(queries) / 1e3


def per_query_recall(index: kbcore.Index, queries: np.ndarray, gt: np.ndarray, ef: int) -> np.ndarray:
    ids, _ = index.search(queries, 10, ef=ef, threads=1)
    return np.array([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(ids, gt[:, :10])])


def at_recall(rows: list[dict], target: float, field: str) -> float | None:
    """``field`` linearly interpolated at mean recall ``target`` between the efs around it
    (the first bracket along ascending ef)."""
    for lo, hi in zip(rows, rows[1:]):
        if lo["recall"] < target <= hi["recall"]:
            t = (target - lo["recall"]) / (hi["recall"] - lo["recall"])
            return float(lo[field] + t * (hi[field] - lo[field]))
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact")
    p.add_argument("--variants", default="off,1:16:20:0,2:8:20:0")
    p.add_argument("--efs", default="16,24,32,48,64,96,128,192,256")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--cache", default="/tmp")
    p.add_argument("--out", help="JSON lines of every row")
    p.add_argument("--targets", default="0.95,0.99", help="mean recall@10 targets")
    args = p.parse_args()
    ds = load(args.dataset)
    path = Path(args.cache) / f"patience-{args.dataset}-sq8.kbi"
    if path.exists():
        index = kbcore.Index.load(str(path))
    else:
        t0 = time.perf_counter()
        index = build(ds, "sq8", 16)
        index.save(str(path))
        print(f"built {args.dataset} in {time.perf_counter() - t0:.1f} s", flush=True)
    variants = args.variants.split(",")
    efs = [int(e) for e in args.efs.split(",")]
    rows: list[dict] = []
    for ef in efs:
        times: dict[str, list[float]] = {v: [] for v in variants}
        for v in variants:
            set_variant(v)
            time_pass(index, ds.queries[:50], ef)  # warm
        for r in range(args.passes):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                set_variant(v)
                times[v].append(time_pass(index, ds.queries, ef))
        for v in variants:
            set_variant(v)
            rec = per_query_recall(index, ds.queries, ds.gt_ids, ef)
            st = index.search_stats(ds.queries, 10, ef=ef)
            row = {
                "dataset": args.dataset,
                "variant": v,
                "ef": ef,
                "recall": round(float(rec.mean()), 4),
                "p5": round(float(np.percentile(rec, 5)), 3),
                "hops": round(float(st["hops"].mean()), 1),
                "scored": round(float(st["scored"].mean()), 1),
                "us": round(statistics.median(times[v]), 2),
                "load": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    set_variant("off")
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    for target in (float(t) for t in args.targets.split(",")):
        base = None
        for v in variants:
            mine = [r for r in rows if r["variant"] == v]
            vals = {f: at_recall(mine, target, f) for f in ("us", "hops", "scored", "p5", "ef")}
            if vals["us"] is None:
                print(f"recall {target}: {v} not bracketed by the efs (max {max(r['recall'] for r in mine)})")
                continue
            if v == "off":
                base = vals["us"]
            ratio = f"{base / vals['us']:.3f}" if base else "n/a"
            print(
                f"{args.dataset} recall {target}: {v:>10} ef {vals['ef']:.0f} us {vals['us']:.2f} "
                f"hops {vals['hops']:.1f} scored {vals['scored']:.0f} p5 {vals['p5']:.3f} "
                f"QPS ratio to off {ratio}",
                flush=True,
            )


if __name__ == "__main__":
    main()
