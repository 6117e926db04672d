"""Graph quality trials of issue 28: A/B of two builds, and build-parameter sweeps.

Noisy shared machines: every figure is thread CPU time (``time.thread_time``) of one query
per call, interleaved within one process (sweeps) or alternating processes (two builds), and
reported as ratios next to ``os.getloadavg()``.

    # A/B of two builds of the same index file: BASE is a PYTHONPATH holding the other build
    python -m benches.trials.graph_trial save --out /tmp/sf.kbi --quantization sq8
    python -m benches.trials.graph_trial ab --index /tmp/sf.kbi --base-path BASE --rounds 6
    # slot reordering (Index.reorder; `save` keeps the rows' slots as added): an index file
    # and its reordered copy, in alternating processes or interleaved in one process
    python -m benches.trials.graph_trial reorder --index /tmp/sf.kbi --out /tmp/sf-bfs.kbi --method bfs
    python -m benches.trials.graph_trial ab --index /tmp/sf-bfs.kbi --base-index /tmp/sf.kbi --rounds 8 --fresh-copy
    python -m benches.trials.graph_trial pair --index /tmp/sf-bfs.kbi --base-index /tmp/sf.kbi --passes 7
    # time one build (what `ab` runs in each process)
    python -m benches.trials.graph_trial time --index /tmp/sf.kbi --efs 16,32,64
    # alpha-pruning (needs benches/trials/alpha_trial.patch applied) or degree, interleaved
    python -m benches.trials.graph_trial sweep --dataset scifact --M 16 --variants alpha=1.0,1.1,1.2
    python -m benches.trials.graph_trial sweep --dataset synth100k --variants M=16,32
    # the level-0 refinement pass (needs benches/trials/refine_trial.patch): knobs joined by '+'
    python -m benches.trials.graph_trial sweep --variants "trial=base,refine:1+pool:96,refine:1+keep:1+pool:96"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benches import datasets

import kbcore


def load(name: str) -> datasets.Dataset:
    """SciFact or ArguAna chunks, or ``synth100k`` / ``synthN`` (datasets.make_synthetic)."""
    if name == "scifact":
        return datasets.load_scifact()
    if name == "arguana":  # the same folder layout, under $KBCORE_DATA
        ds = datasets.load_scifact(Path(os.environ.get("KBCORE_DATA", datasets.DEFAULT_DATA_ROOT)) / "arguana")
        ds.name = "arguana"
        return ds
    n = 100_000 if name == "synth100k" else int(name.removeprefix("synth"))
    return datasets.make_synthetic(n, 1000)


def build(
    ds: datasets.Dataset, quantization: str | None, m: int, threads: int = 2, order: np.ndarray | None = None
) -> kbcore.Index:
    """An hnsw cosine index of the dataset (ids = row numbers), ef_construction 200, seed 1.

    ``order``: the rows in the order they are added (their slots, and their insertion order).
    The slots stay as added (``reorder=False``): the trials compare slot orders.
    """
    q = {} if quantization is None else {"quantization": quantization}
    index = kbcore.Index(ds.dim, "cosine", "hnsw", M=m, ef_construction=200, seed=1, **q)  # type: ignore[arg-type]
    rows = np.arange(ds.n, dtype=np.int64) if order is None else order.astype(np.int64)
    index.add(np.ascontiguousarray(ds.base[rows]), rows, threads=threads, reorder=False)
    return index


def cluster_order(ds: datasets.Dataset, clusters: int = 1024, seed: int = 3) -> np.ndarray:
    """Rows grouped by their nearest of `clusters` seeded sample rows (a Gorder-lite proxy):
    rows near each other, hence a node's neighbours, get nearby slots."""
    rng = np.random.default_rng(seed)
    centres = ds.base[rng.choice(ds.n, clusters, replace=False)]
    label = np.concatenate([np.argmax(b @ centres.T, axis=1) for b in np.array_split(ds.base, 16)])
    return np.argsort(label, kind="stable")


def time_pass(index: kbcore.Index, queries: np.ndarray, ef: int) -> float:
    """Thread CPU microseconds per query, one query per call."""
    t0 = time.thread_time()
    for q in queries:
        index.search(q, 10, ef=ef)
    return (time.thread_time() - t0) / len(queries) * 1e6


def recall(index: kbcore.Index, ds: datasets.Dataset, ef: int) -> float:
    ids, _ = index.search(ds.queries, 10, ef=ef, threads=1)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ds.gt_ids)]))


def cmd_save(args: argparse.Namespace) -> None:
    ds = load(args.dataset)
    build(ds, args.quantization, args.M).save(args.out)
    print(f"saved {args.dataset} M={args.M} {args.quantization} to {args.out}")


def cmd_time(args: argparse.Namespace) -> None:
    ds = load(args.dataset)
    index = kbcore.Index.load(args.index)
    efs = [int(e) for e in args.efs.split(",")]
    for ef in efs:
        time_pass(index, ds.queries[:50], ef)  # warm
    out = {ef: min(time_pass(index, ds.queries, ef) for _ in range(args.passes)) for ef in efs}
    print(json.dumps({"us": out, "load": os.getloadavg()[0]}))


def cmd_reorder(args: argparse.Namespace) -> None:
    """Reorders the slots of --index by --method (bfs, rcm, gorder: Index.reorder), checks the
    answers, saves it to --out."""
    ds = load(args.dataset)
    index = kbcore.Index.load(args.index)
    efs = [int(e) for e in args.efs.split(",")]
    before = {ef: index.search(ds.queries, 10, ef=ef, threads=1) for ef in efs}
    stats = {ef: index.search_stats(ds.queries, 10, ef=ef) for ef in efs}
    t0 = time.perf_counter()
    index.reorder(method=args.method, threads=1)
    seconds = time.perf_counter() - t0
    for ef in efs:
        ids, dist = index.search(ds.queries, 10, ef=ef, threads=1)
        st = index.search_stats(ds.queries, 10, ef=ef)
        same = int((ids == before[ef][0]).all(axis=1).sum())
        print(
            f"ef {ef}: queries with identical ids {same}/{len(ids)}, max |d| change "
            f"{float(np.abs(dist - before[ef][1]).max()):.2e}, hops equal "
            f"{bool((st['hops'] == stats[ef]['hops']).all())}, scored equal "
            f"{bool((st['scored'] == stats[ef]['scored']).all())}"
        )
    index.save(args.out)
    print(f"reordered {args.method} in {seconds:.3f} s (one thread), saved to {args.out}")


def cmd_ab(args: argparse.Namespace) -> None:
    """Alternates processes of the installed build (B) and of --base-path (A), or, with
    --base-index, processes of the installed build on --base-index (A) and --index (B)."""
    here = Path(__file__).resolve().parents[2]
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for tag in ("A", "B") if r % 2 == 0 else ("B", "A"):
            env = dict(os.environ)
            base = tag == "A" and args.base_index is None
            env["PYTHONPATH"] = (args.base_path + os.pathsep if base else "") + str(here)
            path = args.base_index if tag == "A" and args.base_index is not None else args.index
            with tempfile.TemporaryDirectory() as tmp:
                if args.fresh_copy:
                    # A loaded file is read in place from the page cache, the same pages in
                    # every process: a byte copy written later read up to 10 % faster than its
                    # original, in either arm (docs/graph-quality.md). A fresh copy per process
                    # gives both files new pages every round.
                    path = shutil.copy(path, Path(tmp) / "index.kbi")
                cmd = [sys.executable, "-m", "benches.trials.graph_trial", "time", "--index", str(path)]
                cmd += ["--dataset", args.dataset, "--efs", args.efs, "--passes", str(args.passes)]
                res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
            runs[tag].append(res["us"])
            print(tag, res, flush=True)
    for ef in args.efs.split(","):
        a = statistics.median(x[ef] for x in runs["A"])
        b = statistics.median(x[ef] for x in runs["B"])
        print(f"ef {ef}: A {a:.2f} us, B {b:.2f} us, B/A time {b / a:.3f}")


def cmd_pair(args: argparse.Namespace) -> None:
    """Times --base-index (A) and --index (B) in one process: a fresh byte copy of each (the
    page-cache trap of docs/graph-quality.md), wall time of one pass over every query per
    timing, one query per call, the two passes of each ef back to back in alternating order
    (so a change of the machine's speed hits both), recall@10 against the exact top 10."""
    ds = load(args.dataset)
    efs = [int(e) for e in args.efs.split(",")]
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        index = {
            tag: kbcore.Index.load(shutil.copy(path, Path(tmp) / f"{tag}.kbi"))
            for tag, path in (("A", args.base_index), ("B", args.index))
        }
        print(json.dumps({"load_before": os.getloadavg()}), flush=True)
        for ef in efs:
            for one in index.values():
                wall_pass(one, ds.queries[:100], ef)  # warm
        times: dict[str, dict[int, list[float]]] = {tag: {ef: [] for ef in efs} for tag in index}
        for p in range(args.passes):
            for ef in efs:
                for tag in ("A", "B") if p % 2 == 0 else ("B", "A"):
                    times[tag][ef].append(wall_pass(index[tag], ds.queries, ef))
        for ef in efs:
            a, b = (statistics.median(times[tag][ef]) for tag in ("A", "B"))
            per_pass = [y / x for x, y in zip(times["A"][ef], times["B"][ef])]
            print(
                json.dumps(
                    {
                        "ef": ef,
                        "recall_A": recall(index["A"], ds, ef),
                        "recall_B": recall(index["B"], ds, ef),
                        "us_A": round(a, 2),
                        "us_B": round(b, 2),
                        "B/A": round(b / a, 3),
                        "B/A_per_pass": [round(min(per_pass), 3), round(max(per_pass), 3)],
                    }
                ),
                flush=True,
            )
        print(json.dumps({"load_after": os.getloadavg()}), flush=True)


def wall_pass(index: kbcore.Index, queries: np.ndarray, ef: int) -> float:
    """Wall microseconds per query over one pass, one query per call."""
    t0 = time.perf_counter()
    for q in queries:
        index.search(q, 10, ef=ef)
    return (time.perf_counter() - t0) / len(queries) * 1e6


# Sweep keys set from environment variables read by a trial build (the refinement pass of
# issue 28, benches/trials/refine_trial.patch; docs/graph-quality.md lists the knobs).
TRIAL_ENV = {
    "refine": "KBCORE_TRIAL_REFINE",
    "fill": "KBCORE_TRIAL_FILL",
    "pool": "KBCORE_TRIAL_REFINE_POOL",
    "hop2": "KBCORE_TRIAL_REFINE_HOP2",
    "keep": "KBCORE_TRIAL_REFINE_KEEP",
    "rev": "KBCORE_TRIAL_REFINE_REV",
    "flat": "KBCORE_TRIAL_FLAT",
}


def cmd_sweep(args: argparse.Namespace) -> None:
    """Builds one index per variant, then interleaves their searches per ef within one process.

    Variants: ``alpha=1.0,1.1,1.2`` (KBCORE_TRIAL_ALPHA, benches/trials/alpha_trial.patch),
    ``M=16,32``, or ``order=added,cluster`` (rows added in dataset order or in
    cluster_order), ``refine=0,1`` and the other TRIAL_ENV keys, or ``trial=base,refine:1+pool:96``
    (several knobs per variant). Per variant and ef: recall@10, mean hops and scored nodes (search_stats)
    and the median thread CPU us per query over --passes rotated passes.
    """
    ds = load(args.dataset)
    key, _, values = args.variants.partition("=")
    variants = values.split(",")
    efs = [int(e) for e in args.efs.split(",")]
    indexes = {}
    for v in variants:
        t0 = time.perf_counter()
        c0 = time.process_time()
        if key in TRIAL_ENV:
            os.environ[TRIAL_ENV[key]] = v
            indexes[v] = build(ds, args.quantization, args.M)
            os.environ.pop(TRIAL_ENV[key])
        elif key == "trial":  # knobs joined by "+": refine:1+keep:1+pool:96, or base
            knobs = [kv.split(":") for kv in v.split("+") if kv != "base"]
            for name, value in knobs:
                os.environ[TRIAL_ENV[name]] = value
            indexes[v] = build(ds, args.quantization, args.M)
            for name, _ in knobs:
                os.environ.pop(TRIAL_ENV[name])
        elif key == "alpha":
            os.environ["KBCORE_TRIAL_ALPHA"] = v
            indexes[v] = build(ds, args.quantization, args.M)
        elif key == "order":
            order = None if v == "added" else cluster_order(ds)
            indexes[v] = build(ds, args.quantization, args.M, order=order)
        else:
            os.environ.pop("KBCORE_TRIAL_ALPHA", None)
            indexes[v] = build(ds, args.quantization, int(v))
        print(
            f"built {key}={v} in {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU, "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    os.environ.pop("KBCORE_TRIAL_ALPHA", None)
    rows = []
    for ef in efs:
        times: dict[str, list[float]] = {v: [] for v in variants}
        for v in variants:
            time_pass(indexes[v], ds.queries[:50], ef)
        for p in range(args.passes):
            order = variants[p % len(variants) :] + variants[: p % len(variants)]
            for v in order:
                times[v].append(time_pass(indexes[v], ds.queries, ef))
        for v in variants:
            st = indexes[v].search_stats(ds.queries, 10, ef=ef)
            row = {
                "dataset": args.dataset,
                key: v,
                "ef": ef,
                "recall": round(recall(indexes[v], ds, ef), 4),
                "hops": float(st["hops"].mean()),
                "scored": float(st["scored"].mean()),
                "us": round(statistics.median(times[v]), 2),
                "load": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    summarise(rows, key, variants)


def at_recall(rows: list[dict], target: float, field: str) -> float | None:
    """``field`` linearly interpolated at recall ``target`` between the two efs around it."""
    for lo, hi in zip(rows, rows[1:]):
        if lo["recall"] < target <= hi["recall"]:
            t = (target - lo["recall"]) / (hi["recall"] - lo["recall"])
            return lo[field] + t * (hi[field] - lo[field])
    return None


def summarise(rows: list[dict], key: str, variants: list[str]) -> None:
    """Per target recall: each variant's us, hops and scored, and its time ratio to the first."""
    for target in (0.95, 0.98, 0.99):
        base = None
        for v in variants:
            mine = [r for r in rows if r[key] == v]
            vals = {f: at_recall(mine, target, f) for f in ("us", "hops", "scored")}
            if vals["us"] is None:
                print(f"recall {target}: {key}={v} not bracketed by the efs")
                continue
            base = base or vals["us"]
            print(
                f"recall {target}: {key}={v} us {vals['us']:.2f} hops {vals['hops']:.1f} "
                f"scored {vals['scored']:.0f} QPS ratio to first {base / vals['us']:.3f}",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("save", "time", "ab", "sweep", "reorder", "pair"):
        s = sub.add_parser(name)
        s.add_argument("--dataset", default="scifact")
        s.add_argument("--efs", default="16,32,64")
        s.add_argument("--passes", type=int, default=3)
        s.add_argument("--index")
        s.add_argument("--out")
        s.add_argument("--quantization", default="sq8")
        s.add_argument("--M", type=int, default=16)
        s.add_argument("--base-path")
        s.add_argument("--base-index")
        s.add_argument("--fresh-copy", action="store_true", help="ab: time a fresh copy of the file per process")
        s.add_argument("--method", default="bfs")
        s.add_argument("--rounds", type=int, default=6)
        s.add_argument("--variants", default="alpha=1.0,1.1,1.2")
        s.add_argument("--tmp", default=None, help="pair: folder for the fresh copies (default $TMPDIR)")
    args = p.parse_args()
    {"save": cmd_save, "time": cmd_time, "ab": cmd_ab, "sweep": cmd_sweep, "reorder": cmd_reorder, "pair": cmd_pair}[
        args.cmd
    ](args)


if __name__ == "__main__":
    main()
