"""Scale-out benchmark: kbcore.distributed.ShardedIndex on 1, 2 and 4 shards vs one Index (issue 17).

Run from the repository root on a quiet machine (needs ``pip install '.[ray]'``)::

    python -m benches.bench_distributed [--data DIR] [--n 1000000] [--shards 1,2,4] [--json OUT]
    python -m benches.bench_distributed --quick          # seconds: a smoke test of the script
    python -m benches.bench_distributed --address auto   # on a running Ray cluster

Data: SciFact chunks (19,369 x 384 from ``$KBCORE_DATA``, grouped by ``doc_id``, with their
text for BM25) and a synthetic clustered set of ``--n`` vectors (384-d, 20 parts per
document). Every shard is a Ray actor on this machine (loopback), so the figures show the
cost of sharding itself, not of a network.

Per data set and shard count: ingest throughput (rows/s, durable: write-ahead log fsync per
batch), single-query latency p50/p99 (one query per call), batch QPS (all queries in one
call), recall@10 against exact brute force, BM25 latency (SciFact), and the scatter-gather
overhead per query with where it goes: the Ray round trip to every shard (a no-op call), the
search inside the slowest shard, and the merge on the driver. The unsharded Index is
measured the same way (direct calls). A small bounded measurement compares the two
durability modes per batch (log append + fsync vs saving the whole index).

``os.getloadavg()`` is recorded before and after; a run that starts above 0.5 is flagged,
as its timings are disturbed by other work.
"""

from __future__ import annotations

import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benches.datasets import exact_top_k, make_synthetic, scifact_dir  # noqa: E402

K = 10


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def load_scifact_chunks(data: str | None, limit: int | None, nq: int | None) -> dict[str, Any]:
    folder = scifact_dir(data)
    base = np.ascontiguousarray(np.load(folder / "chunk_embeddings.npy"), dtype=np.float32)
    queries = np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32)
    docs, texts = [], []
    with gzip.open(folder / "chunks.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            docs.append(str(row["doc_id"]))
            texts.append(row["text"])
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        qtexts = [json.loads(line)["text"] for line in f]
    if limit:
        base, docs, texts = base[:limit], docs[:limit], texts[:limit]
    if nq:
        queries, qtexts = queries[:nq], qtexts[:nq]
    return {"name": "scifact-chunks", "base": base, "queries": queries, "docs": docs, "texts": texts, "qtexts": qtexts}


def load_synthetic(n: int, nq: int) -> dict[str, Any]:
    ds = make_synthetic(n, nq)
    return {
        "name": ds.name,
        "base": ds.base,
        "queries": ds.queries,
        "docs": [f"s{i // 20}" for i in range(n)],
        "texts": None,
        "qtexts": None,
    }


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / K for f, t in zip(found, truth)]))


def bench_single(idx: Any, queries: np.ndarray, *, sharded: bool) -> list[float]:
    """Per-query seconds, one query per call (what a RAG request does)."""
    lat = []
    for q in queries:
        t0 = time.perf_counter()
        if sharded:
            idx.search(q, K)
        else:
            idx.search(q, K, threads=1)
        lat.append(time.perf_counter() - t0)
    return lat


def overhead_breakdown(si: Any, queries: np.ndarray, reps: int) -> dict[str, float]:
    """Where the time of one sharded query goes (medians over ``reps`` queries, microseconds)."""
    import ray

    actors = si.shard_actors()
    rpc, inside, merge, total = [], [], [], []
    for q in queries[:reps]:
        t0 = time.perf_counter()
        ray.get([a.ping.remote() for a in actors])
        rpc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = ray.get([a.call.remote("search_timed", q.reshape(1, -1), K, None, None, 1) for a in actors])
        total.append(time.perf_counter() - t0)
        inside.append(max(g[2] for g in got))
        t0 = time.perf_counter()
        ids = np.concatenate([g[0] for g in got], axis=1)
        dist = np.concatenate([g[1] for g in got], axis=1)
        order = np.lexsort((ids, dist), axis=1)[:, :K]
        np.take_along_axis(ids, order, 1)
        merge.append(time.perf_counter() - t0)
    med = lambda xs: float(np.median(xs)) * 1e6  # noqa: E731
    return {
        "noop_round_trip_us": med(rpc),
        "slowest_shard_search_us": med(inside),
        "merge_us": med(merge),
        "scatter_gather_total_us": med(total),
        "overhead_us": med([t - i for t, i in zip(total, inside)]),
    }


def bench_durability(dim: int, preload: int, batch: int, batches: int, rng: np.random.Generator) -> dict[str, Any]:
    """Seconds per durable batch: log append + fsync ("wal") vs a whole-index save ("save")."""
    from kbcore.distributed.shard import ShardState

    out: dict[str, Any] = {"preload_rows": preload, "batch_rows": batch, "batches": batches}
    base = rng.standard_normal((preload + batch * batches, dim)).astype(np.float32)
    ids = np.arange(len(base), dtype=np.int64)
    for mode in ("wal", "save"):
        d = tempfile.mkdtemp(prefix="kbdur")
        try:
            s = ShardState(
                d,
                shard=0,
                dim=dim,
                metric="cosine",
                kind="flat",
                index_options={},
                durability="wal",
                checkpoint_bytes=1 << 40,
            )
            if preload:
                s.apply(base[:preload], ids[:preload], None, None, np.empty(0, np.int64))
            s.checkpoint()
            s.durability = mode  # the same index, now made durable the other way per batch
            times = []
            for b in range(batches):
                lo = preload + b * batch
                t0 = time.perf_counter()
                s.apply(base[lo : lo + batch], ids[lo : lo + batch], None, None, np.empty(0, np.int64))
                times.append(time.perf_counter() - t0)
            out[f"{mode}_ms_per_batch"] = float(np.median(times)) * 1e3
        finally:
            shutil.rmtree(d, ignore_errors=True)
    out["cheaper"] = "wal" if out["wal_ms_per_batch"] <= out["save_ms_per_batch"] else "save"
    return out


def run_dataset(ds: dict[str, Any], shard_counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import kbcore
    from kbcore.distributed import ShardedIndex

    base, queries = ds["base"], ds["queries"]
    n, dim = base.shape
    ids = np.arange(n, dtype=np.int64)
    meta = [{"document_id": d} for d in ds["docs"]]
    texts = ds["texts"]
    truth, _ = exact_top_k(
        base / np.linalg.norm(base, axis=1, keepdims=True), queries / np.linalg.norm(queries, axis=1, keepdims=True), K
    )
    opts = {"M": args.M, "ef_construction": args.ef_construction, "ef": args.ef}
    batch = args.batch
    res: dict[str, Any] = {
        "n": n,
        "dim": dim,
        "queries": len(queries),
        "batch_rows": batch,
        "kind": args.kind,
        **opts,
        "runs": [],
    }

    # The unsharded baseline, the same batches.
    one = kbcore.Index(dim, "cosine", args.kind, **opts)
    t0 = time.perf_counter()
    for lo in range(0, n, batch):
        one.add(
            base[lo : lo + batch],
            ids[lo : lo + batch],
            metadata=meta[lo : lo + batch],
            texts=None if texts is None else texts[lo : lo + batch],
        )
    ingest = time.perf_counter() - t0
    lat = bench_single(one, queries, sharded=False)
    t0 = time.perf_counter()
    found, _ = one.search(queries, K, threads=0)
    batch_s = time.perf_counter() - t0
    row = {
        "shards": 0,
        "label": "kbcore.Index (unsharded, in process)",
        "ingest_rows_per_s": n / ingest,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "batch_qps": len(queries) / batch_s,
        "recall_at_10": recall_at_k(found, truth),
    }
    if ds["qtexts"]:
        tl = []
        for qt in ds["qtexts"]:
            t0 = time.perf_counter()
            one.search_text(qt, K)
            tl.append(time.perf_counter() - t0)
        row["bm25_p50_ms"] = _pct(tl, 50) * 1e3
    res["runs"].append(row)
    print(f"  unsharded: {row}", flush=True)
    del one
    gc.collect()

    for shards in shard_counts:
        root = tempfile.mkdtemp(prefix="kbshard", dir=args.path)
        try:
            si = ShardedIndex(dim, "cosine", args.kind, shards=shards, path=os.path.join(root, "kb"), **opts)
            t0 = time.perf_counter()
            for lo in range(0, n, batch):
                si.add(
                    base[lo : lo + batch],
                    ids[lo : lo + batch],
                    metadata=meta[lo : lo + batch],
                    texts=None if texts is None else texts[lo : lo + batch],
                )
            ingest = time.perf_counter() - t0
            bench_single(si, queries[: min(20, len(queries))], sharded=True)  # warm up
            lat = bench_single(si, queries, sharded=True)
            t0 = time.perf_counter()
            found, _ = si.search(queries, K)
            batch_s = time.perf_counter() - t0
            row = {
                "shards": shards,
                "label": f"ShardedIndex, {shards} shard actor(s)",
                "ingest_rows_per_s": n / ingest,
                "p50_ms": _pct(lat, 50) * 1e3,
                "p99_ms": _pct(lat, 99) * 1e3,
                "batch_qps": len(queries) / batch_s,
                "recall_at_10": recall_at_k(found, truth),
                "rows_per_shard": [i["rows"] for i in si.shard_info()],
                "breakdown": overhead_breakdown(si, queries, min(args.breakdown_reps, len(queries))),
            }
            if ds["qtexts"]:
                tl = []
                for qt in ds["qtexts"]:
                    t0 = time.perf_counter()
                    si.search_text(qt, K)
                    tl.append(time.perf_counter() - t0)
                row["bm25_p50_ms"] = _pct(tl, 50) * 1e3
            res["runs"].append(row)
            print(f"  {shards} shard(s): {row}", flush=True)
            si.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        gc.collect()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="SciFact folder or its parent (default $KBCORE_DATA)")
    ap.add_argument("--n", type=int, default=1_000_000, help="synthetic vectors (default 1,000,000)")
    ap.add_argument("--nq", type=int, default=1000, help="synthetic queries")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--kind", default="hnsw", choices=("hnsw", "flat"))
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--ef", type=int, default=64)
    ap.add_argument("--batch", type=int, default=10_000, help="rows per add() call")
    ap.add_argument("--breakdown-reps", type=int, default=200)
    ap.add_argument("--no-scifact", action="store_true")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that the script runs")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument(
        "--path",
        default=None,
        help="where shard directories go (on a cluster: storage every node mounts); default /tmp",
    )
    ap.add_argument(
        "--address", default=None, help="an existing Ray cluster (e.g. auto); default: a local instance on loopback"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.nq, args.batch, args.breakdown_reps = 3000, 30, 1000, 20
        args.shards = "1,2"
        args.ef_construction = 40
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    if args.address is None:
        # A machine-local instance: loopback only, no auth token (read when Ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray

    load_before = os.getloadavg()
    if load_before[0] > 0.5:
        print(f"WARNING: load average {load_before[0]:.2f} > 0.5 at the start: timings are disturbed", flush=True)
    started = time.time()
    if args.address is None:
        ray.init(include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address, log_to_driver=False)
    results: dict[str, Any] = {
        "benchmark": "bench_distributed",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "ray": ray.__version__,
        "quick": bool(args.quick),
        "loadavg_before": list(load_before),
        "datasets": [],
    }
    try:
        rng = np.random.default_rng(17)
        results["durability"] = [
            bench_durability(384, preload, b, 3 if args.quick else 5, rng)
            for preload, b in ([(2000, 100)] if args.quick else [(20_000, 100), (20_000, 1000), (100_000, 1000)])
        ]
        print(f"durability per batch: {results['durability']}", flush=True)
        if not args.no_scifact:
            folder = scifact_dir(args.data)
            if (folder / "chunk_embeddings.npy").exists():
                ds = load_scifact_chunks(args.data, 2000 if args.quick else None, 30 if args.quick else None)
                print(f"{ds['name']}: {len(ds['base'])} x {ds['base'].shape[1]}", flush=True)
                results["datasets"].append({"name": ds["name"], **run_dataset(ds, shard_counts, args)})
            else:
                print(f"SciFact not found under {folder}; skipped", flush=True)
        if not args.no_synthetic:
            ds = load_synthetic(args.n, args.nq)
            print(f"{ds['name']}: {len(ds['base'])} x {ds['base'].shape[1]}", flush=True)
            results["datasets"].append({"name": ds["name"], **run_dataset(ds, shard_counts, args)})
    finally:
        ray.shutdown()
    results["loadavg_after"] = list(os.getloadavg())
    results["seconds"] = time.time() - started
    results["started_above_0_5"] = load_before[0] > 0.5
    print(
        f"load average before {load_before[0]:.2f}, after {results['loadavg_after'][0]:.2f}"
        + (" (started above 0.5: rerun on a quiet machine)" if load_before[0] > 0.5 else "")
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
