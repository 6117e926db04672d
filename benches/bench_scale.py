"""One quantized HNSW index at scale (issue 28): build N x 384 synthetic rows (default 10M) with
the float32 rows on disk, then QPS at recall@10 0.95 and 0.99, build time and resident memory,
in the building process and again in a fresh process that only reopens and queries.

Run from the repository root on a quiet machine (nothing else running: it uses every core to
build, and the query passes are timed)::

    python -m benches.bench_scale --work /big/scale10m [--n 10000000] [--quantization sq8]
                                  [--ef-construction 200] [--json OUT]
    python -m benches.bench_scale --work /big/scale10m --phase reopen   # only the fresh reopen
    python -m benches.bench_scale --work /big/scale10m --phase reopen --rerank 128   # re-rank deeper

The rows are the seeded synthetic set of ``benches.datasets.make_synthetic`` (the 1M base is
a prefix of the 10M one), generated one 16,384-row block at a time, so the base never has to
be in memory: the exact top-10 of the 1,000 queries is accumulated block by block while the
index is built (that time is not counted as build time). The index is built with
``vectors="disk"`` (its rows in a mapped file under ``--work``), saved to ``--work/index.kbi``
(with ``gt.npz``), then searched one query per call on one thread over the ef grid: ``--passes``
passes over all the queries at every ef, QPS at recall interpolated per pass (median and
min-max). The fresh process opens the saved file as saved (rows read in place) and reports the
open time and ``RssAnon`` / ``RssFile`` per vector (what the index holds, and the clean file
pages re-ranks fault in). Needs about 2 x 4 x N x dim bytes of free disk under ``--work``
(the row file while building, then the saved index) and memory for the codes and the graph
(about 600 B per row with SQ8). ``os.getloadavg()`` is printed at every phase.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import kbcore
from benches.bench_index import _status_kib, qps_at_recall, settle_memory
from benches.datasets import SYNTHETIC_DIM, TopK, synthetic_blocks, synthetic_queries

K = 10
TARGETS = (0.95, 0.99)
DEFAULT_EFS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def memory() -> dict[str, int]:
    """Anonymous and file-backed resident bytes of this process (Linux /proc/self/status)."""
    return {"rss_anon": _status_kib("RssAnon") * 1024, "rss_file": _status_kib("RssFile") * 1024}


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    hits = sum(len(set(p.tolist()) & set(g.tolist())) for p, g in zip(ids, gt))
    return hits / (K * len(ids))


def sweep(index: kbcore.Index, queries: np.ndarray, gt: np.ndarray, efs: Sequence[int], passes: int) -> dict:
    """Recall per ef (untimed pass, also the warm-up), then ``passes`` timed passes over the grid."""
    out: dict[str, Any] = {"efs": list(efs), "recall": [], "times": [[] for _ in range(passes)]}
    for ef in efs:
        ids = np.stack([index.search(q, K, ef=ef)[0] for q in queries])
        out["recall"].append(recall(ids, gt))
        log(f"  ef {ef:4d}  recall@10 {out['recall'][-1]:.4f}")
        if out["recall"][-1] >= 0.999:
            out["efs"] = out["efs"][: len(out["recall"])]
            break
    for p in range(passes):
        for ef in out["efs"]:
            t0 = time.perf_counter()
            for q in queries:
                index.search(q, K, ef=ef)
            out["times"][p].append(time.perf_counter() - t0)
    nq = len(queries)
    out["qps_at"] = {}
    for t in TARGETS:
        per_pass = [qps_at_recall([(r, nq / s) for r, s in zip(out["recall"], times)], t) for times in out["times"]]
        vals = [v for v in per_pass if v is not None]
        out["qps_at"][str(t)] = (
            {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None
        )
    for target in map(str, TARGETS):
        q = out["qps_at"][target]
        log(
            f"  QPS at recall {target}: "
            + ("not reached" if q is None else f"{q['median']:.0f} ({q['min']:.0f}-{q['max']:.0f})")
        )
    return out


def build(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    os.environ["TMPDIR"] = str(work)  # the row file of vectors="disk" lives under --work
    queries = synthetic_queries(args.nq)
    top = TopK(queries, K)
    index = kbcore.Index(
        SYNTHETIC_DIM,
        "cosine",
        M=args.M,
        ef_construction=args.ef_construction,
        seed=1,
        quantization=args.quantization,
        vectors="disk",
    )
    res: dict[str, Any] = {"load_before": os.getloadavg(), "memory_before": memory()}
    build_s = gt_s = 0.0
    buf: list[np.ndarray] = []
    buf_start = 0
    done = 0

    def flush() -> None:
        nonlocal build_s, done, buf, buf_start
        rows = np.concatenate(buf)
        t0 = time.perf_counter()
        index.add(rows, np.arange(buf_start, buf_start + len(rows), dtype=np.int64), threads=args.threads)
        dt = time.perf_counter() - t0
        build_s += dt
        done += len(rows)
        eta = build_s / done * (args.n - done)
        mem = memory()
        log(
            f"{done:>10,} rows  {len(rows) / dt:7.0f} rows/s  build {build_s:7.0f} s  eta {eta:6.0f} s"
            f"  anon {mem['rss_anon'] / done:5.0f} B/row  load {os.getloadavg()[0]:.2f}"
        )
        buf, buf_start = [], done

    for start, block in synthetic_blocks(args.n):
        t0 = time.perf_counter()
        top.add(block, start)
        gt_s += time.perf_counter() - t0
        buf.append(block)
        if sum(len(b) for b in buf) >= args.batch:
            flush()
    if buf:
        flush()
    if index.pending:
        t0 = time.perf_counter()
        index.build_graph(threads=args.threads)
        build_s += time.perf_counter() - t0
    settle_memory()
    mem = memory()
    res.update(
        n=len(index),
        build_s=build_s,
        ground_truth_s=gt_s,
        memory_after_build=mem,
        anon_per_row_after_build=(mem["rss_anon"] - res["memory_before"]["rss_anon"]) / len(index),
        memory_usage=index.memory_usage(),
    )
    np.savez(work / "gt.npz", ids=top.ids, scores=top.scores)
    log(f"built {len(index):,} rows in {build_s:.0f} s; anon {res['anon_per_row_after_build']:.0f} B/row")
    t0 = time.perf_counter()
    index.save(work / "index.kbi")
    res["save_s"] = time.perf_counter() - t0
    res["file_bytes"] = (work / "index.kbi").stat().st_size
    log(f"saved in {res['save_s']:.0f} s, {res['file_bytes'] / 1e9:.2f} GB")
    if not args.no_query:
        log(f"queries in the building process (load {os.getloadavg()[0]:.2f})")
        res["search"] = sweep(index, queries, top.ids, args.efs, args.passes)
        res["memory_after_queries"] = memory()
    res["load_after"] = os.getloadavg()
    return res


def reopen(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """In this (fresh) process: open the saved index as saved, then the query sweep."""
    gt = np.load(work / "gt.npz")["ids"]
    queries = synthetic_queries(len(gt))
    res: dict[str, Any] = {"load_before": os.getloadavg()}
    mem0 = memory()
    t0 = time.perf_counter()
    index = kbcore.Index.load(work / "index.kbi")
    res["open_s"] = time.perf_counter() - t0
    ids, _ = index.search(queries[0], K)
    res["open_and_first_query_s"] = time.perf_counter() - t0
    if args.rerank is not None:
        index.rerank = args.rerank
    res["rerank"] = index.rerank
    mem1 = memory()
    n = len(index)
    res["n"] = n
    res["anon_per_row_after_open"] = (mem1["rss_anon"] - mem0["rss_anon"]) / n
    log(f"opened {n:,} rows in {res['open_s']:.2f} s; anon {res['anon_per_row_after_open']:.0f} B/row")
    res["search"] = sweep(index, queries, gt, args.efs, args.passes)
    mem2 = memory()
    res["anon_per_row_after_queries"] = (mem2["rss_anon"] - mem0["rss_anon"]) / n
    res["file_per_row_after_queries"] = (mem2["rss_file"] - mem0["rss_file"]) / n
    log(
        f"after the queries: anon {res['anon_per_row_after_queries']:.0f} B/row,"
        f" file pages {res['file_per_row_after_queries']:.0f} B/row"
    )
    res["load_after"] = os.getloadavg()
    return res


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="folder for the row file, index.kbi and gt.npz (a real disk)")
    p.add_argument("--n", type=int, default=10_000_000, help="rows (default 10,000,000)")
    p.add_argument("--nq", type=int, default=1000, help="queries (default 1,000)")
    p.add_argument("--quantization", default="sq8", choices=("sq8", "rabitq"))
    p.add_argument("--M", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--threads", type=int, default=0, help="build threads (0: every core)")
    p.add_argument("--batch", type=int, default=262_144, help="rows per Index.add call")
    p.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)), help="ef grid, comma-separated")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--phase", default="all", choices=("all", "build", "reopen"))
    p.add_argument(
        "--rerank", type=int, default=None, help="re-rank depth set on the reopened index (default: the index's own)"
    )
    p.add_argument("--no-query", action="store_true", help="build and save only (the fresh process queries)")
    p.add_argument("--json", default=None, help="write the figures here (keep it out of the source tree)")
    args = p.parse_args(argv)
    args.efs = [int(e) for e in args.efs.split(",")]
    if args.n <= 0 or args.nq <= 0 or args.passes <= 0 or args.batch <= 0:
        p.error("--n, --nq, --passes and --batch must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path("/proc/self/status").exists():
        raise SystemExit("reads RssAnon from /proc/self/status: Linux only")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.phase == "reopen":
        log(f"kbcore {kbcore.__version__}, reopening {work / 'index.kbi'}, load {os.getloadavg()}")
    else:
        log(
            f"kbcore {kbcore.__version__}, n {args.n:,}, {args.quantization}, M {args.M}, "
            f"ef_construction {args.ef_construction}, load {os.getloadavg()}"
        )
    out: dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}}
    if args.phase in ("all", "build"):
        free = shutil.disk_usage(work).free
        need = 2 * 4 * SYNTHETIC_DIM * args.n
        if free < need:
            raise SystemExit(f"--work {work} has {free / 1e9:.1f} GB free; the build needs about {need / 1e9:.1f} GB")
        out["build"] = build(args, work)
    if args.phase in ("all", "reopen"):
        if args.phase == "all":  # a fresh interpreter: nothing of the build is in this process
            cmd = [sys.executable, "-m", "benches.bench_scale", "--work", str(work), "--phase", "reopen",
                   "--efs", ",".join(map(str, args.efs)), "--passes", str(args.passes)]  # fmt: skip
            sub_json = work / "reopen.json"
            subprocess.run([*cmd, "--json", str(sub_json)], check=True)
            out["reopen"] = json.loads(sub_json.read_text())["reopen"]
        else:
            out["reopen"] = reopen(args, work)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
