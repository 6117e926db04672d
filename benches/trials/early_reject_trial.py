"""Early rejection by partial distances in the SQ8 walk (issue 28 trial, with
benches/trials/early_reject_trial.patch applied and built).

The index is built on randomly rotated rows (a seeded orthogonal matrix; cosine is unchanged),
as ADSampling (Gao & Long, SIGMOD 2023) requires; the queries are rotated in Python, outside
the timing. One build, one index file: the arms differ only in the environment
(KBCORE_H52_HEAD / _EPS / _PF, read once per process), processes alternate.

    python -m benches.trials.early_reject_trial save --dataset scifact
    python -m benches.trials.early_reject_trial ab --dataset scifact --efs 10,12,16,24,32,48 \\
        --arms off:,h128:KBCORE_H52_HEAD=128 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from benches.trials.graph_trial import build, load

import kbcore


def rotated(name: str):
    ds = load(name)
    rng = np.random.default_rng(52)
    rot, _ = np.linalg.qr(rng.standard_normal((ds.dim, ds.dim)))
    rot = rot.astype(np.float32)
    ds.base = np.ascontiguousarray(ds.base @ rot)
    ds.base /= np.linalg.norm(ds.base, axis=1, keepdims=True)
    ds.queries = np.ascontiguousarray(ds.queries @ rot)
    ds.queries /= np.linalg.norm(ds.queries, axis=1, keepdims=True)
    return ds


def path(name: str) -> str:
    return f"/tmp/h52/{name}-rot.kbi"


def cmd_save(args: argparse.Namespace) -> None:
    ds = rotated(args.dataset)
    build(ds, "sq8", 16).save(path(args.dataset))


def cmd_time(args: argparse.Namespace) -> None:
    ds = rotated(args.dataset)
    index = kbcore.Index.load(path(args.dataset))
    efs = [int(e) for e in args.efs.split(",")]
    out = {}
    for ef in efs:
        for q in ds.queries[:50]:
            index.search(q, 10, ef=ef)
        best = float("inf")
        for _ in range(args.passes):
            t0 = time.thread_time()
            for q in ds.queries:
                index.search(q, 10, ef=ef)
            best = min(best, (time.thread_time() - t0) / ds.nq * 1e6)
        ids, _ = index.search(ds.queries, 10, ef=ef, threads=1)
        rec = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ds.gt_ids)]))
        st = index.search_stats(ds.queries, 10, ef=ef)
        out[ef] = {"us": best, "recall": rec, "scored": float(st["scored"].mean())}
    print(json.dumps({"res": out, "load": os.getloadavg()[0]}))


def at_recall(rows: list[tuple[float, float]], target: float) -> float | None:
    for (r0, u0), (r1, u1) in zip(rows, rows[1:]):
        if r0 < target <= r1:
            return u0 + (target - r0) / (r1 - r0) * (u1 - u0)
    return None


def cmd_ab(args: argparse.Namespace) -> None:
    arms = {}
    for a in args.arms.split(","):
        tag, _, env = a.partition(":")
        arms[tag] = dict(kv.split("=", 1) for kv in env.split(";") if kv)
    runs: dict[str, list[dict]] = {t: [] for t in arms}
    tags = list(arms)
    loads = []
    for r in range(args.rounds):
        for tag in tags[r % len(tags) :] + tags[: r % len(tags)]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("KBCORE_H52_")}
            env.update(arms[tag])
            cmd = [sys.executable, "-m", "benches.trials.early_reject_trial", "time", "--dataset", args.dataset]
            cmd += ["--efs", args.efs, "--passes", str(args.passes)]
            res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
            runs[tag].append(res["res"])
            loads.append(res["load"])
            print(tag, json.dumps(res), flush=True)
    print(f"load {min(loads):.2f}-{max(loads):.2f}")
    curves = {}
    for tag in tags:
        rows = []
        for ef in args.efs.split(","):
            us = statistics.median(x[ef]["us"] for x in runs[tag])
            rec = runs[tag][0][ef]["recall"]
            sc = runs[tag][0][ef]["scored"]
            rows.append((rec, us))
            print(f"{tag} ef {ef}: recall {rec:.4f} scored {sc:.0f} us {us:.2f}")
        curves[tag] = rows
    for target in (0.95, 0.99):
        base = at_recall(curves[tags[0]], target)
        for tag in tags:
            v = at_recall(curves[tag], target)
            if v is None or base is None:
                print(f"recall {target}: {tag} not bracketed")
            else:
                print(f"recall {target}: {tag} us {v:.2f} QPS ratio to {tags[0]} {base / v:.3f}")


def set_arm(env: dict[str, str]) -> None:
    for k in [k for k in os.environ if k.startswith("KBCORE_H52_")]:
        del os.environ[k]
    os.environ.update(env)


def cmd_inproc(args: argparse.Namespace) -> None:
    """The arms interleaved within one process (the build re-reads the switches per search):
    per ef, --passes rotated passes of every arm, median thread CPU us per query."""
    ds = rotated(args.dataset)
    index = kbcore.Index.load(path(args.dataset))
    arms = {}
    for a in args.arms.split(","):
        tag, _, env = a.partition(":")
        arms[tag] = dict(kv.split("=", 1) for kv in env.split(";") if kv)
    tags = list(arms)
    efs = [int(e) for e in args.efs.split(",")]
    curves: dict[str, list[tuple[float, float]]] = {t: [] for t in tags}
    loads = []
    for ef in efs:
        times: dict[str, list[float]] = {t: [] for t in tags}
        for t in tags:
            set_arm(arms[t])
            for q in ds.queries[:50]:
                index.search(q, 10, ef=ef)
        for p in range(args.passes):
            for t in tags[p % len(tags) :] + tags[: p % len(tags)]:
                set_arm(arms[t])
                t0 = time.thread_time()
                for q in ds.queries:
                    index.search(q, 10, ef=ef)
                times[t].append((time.thread_time() - t0) / ds.nq * 1e6)
        loads.append(os.getloadavg()[0])
        for t in tags:
            set_arm(arms[t])
            ids = np.stack([index.search(q, 10, ef=ef)[0] for q in ds.queries])
            rec = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ds.gt_ids)]))
            us = statistics.median(times[t])
            curves[t].append((rec, us))
            print(
                json.dumps(
                    {
                        "arm": t,
                        "ef": ef,
                        "recall": round(rec, 4),
                        "us": round(us, 2),
                        "ratio_to_first": round(statistics.median(times[tags[0]]) / us, 3),
                        "load": round(loads[-1], 2),
                    }
                ),
                flush=True,
            )
    print(f"load {min(loads):.2f}-{max(loads):.2f}")
    for target in (0.95, 0.99):
        base = at_recall(curves[tags[0]], target)
        for t in tags:
            v = at_recall(curves[t], target)
            if v is None or base is None:
                print(f"recall {target}: {t} not bracketed")
            else:
                print(f"recall {target}: {t} us {v:.2f} QPS ratio to {tags[0]} {base / v:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["save", "time", "ab", "inproc"])
    p.add_argument("--dataset", default="scifact")
    p.add_argument("--efs", default="10,12,16,24,32,48,64")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--arms", default="off:,h128:KBCORE_H52_HEAD=128")
    args = p.parse_args()
    {"save": cmd_save, "time": cmd_time, "ab": cmd_ab, "inproc": cmd_inproc}[args.cmd](args)


if __name__ == "__main__":
    main()
