"""Scale-out benchmark: kbcore.distributed.ShardedIndex on 1, 2 and 4 shards vs one Index (issue 17).

Run from the repository root on a quiet machine (needs ``pip install '.[ray]'``)::

    python -m benches.bench_distributed [--data DIR] [--shards 0,1,2,4] [--json OUT]   # SciFact
    python -m benches.bench_distributed --n 1000000 [--no-scifact]   # opt-in: 1M x 384 synthetic
    python -m benches.bench_distributed --quick          # seconds: a smoke test of the script
    python -m benches.bench_distributed --address auto   # on a running Ray cluster

``--help`` ends with a time and memory estimate.

Data: SciFact chunks (19,369 x 384 from ``$KBCORE_DATA``, grouped by ``doc_id``, with their
text for BM25) and a synthetic clustered set of ``--n`` vectors (384-d, 20 parts per
document). Every shard is a Ray actor on this machine (loopback), so the figures show the
cost of sharding itself, not of a network.

Per data set and shard count: ingest throughput (rows/s, durable: write-ahead log fsync per
batch), single-query latency p50/p99 (one query per call), batch QPS (all queries in one
call), recall@10 against exact brute force, BM25 latency (SciFact), and the scatter-gather
overhead per query with where it goes, for each query path (``--transports``): Ray actor
calls (``transport="actor"``), a Ray Compiled Graph (``transport="compiled"``) and a socket
per shard (``transport="socket"``), one after the other on the same shards: ``submit`` (the
request handed to every shard), ``wait`` (until every answer is back), ``decode_merge``
(answers decoded, N k candidates merged), the slowest shard's own search time, and
``overhead`` = total - that search; for the actor and socket paths also a no-op round trip
to every shard. The unsharded Index (shard count 0) is measured the same
way (direct calls). A small bounded measurement compares the two
durability modes per batch (log append + fsync vs saving the whole index).

``os.getloadavg()`` is recorded before and after the whole script and each run (shard
count); a run that starts above 0.5 is flagged with a warning, as its timings are disturbed
by other work.
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
_TIME_ESTIMATE = """\
time estimate (2 cores, AVX-512; extrapolated, not measured: a 20,000-row run on a loaded
machine ingested ~5,000 rows/s at ef_construction 40, and HNSW inserts slow down with log n):
  SciFact (19,369 rows, ef_construction 200), shards 0,1,2,4, the three transports: ~4-6 min.
  --n 1000000 (1M x 384, ef_construction 40): generation + exact ground truth ~1 min, then
  per shard count one build of 1M rows (~4-6 min each on 2 threads, the shards building in
  parallel) + queries (~1 min): ~20-25 min for --shards 0,1,2,4 on top of SciFact.
  Memory: ~1.5 GB of base vectors in the driver + ~1.8 GB per built index (one alive at a
  time); the shards' logs go under --path (~1.6 GB per run, deleted after it).
"""


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
    """The seeded clustered set of ``benches.datasets`` (generated block by block into one
    float32 array, L2-normalised, with exact ground truth): one copy of the base in memory;
    metadata is made per batch at ingest (see :func:`_batch_meta`)."""
    ds = make_synthetic(n, nq, k=K)
    return {
        "name": ds.name,
        "base": ds.base,
        "queries": ds.queries,
        "truth": ds.gt_ids,
        "docs": None,  # document of row i: f"s{i // 20}"
        "texts": None,
        "qtexts": None,
    }


def _batch_meta(ds: dict[str, Any], lo: int, hi: int) -> list[dict[str, str]]:
    if ds["docs"] is not None:
        return [{"document_id": d} for d in ds["docs"][lo:hi]]
    return [{"document_id": f"s{i // 20}"} for i in range(lo, hi)]


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


def _merge(got: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    ids = np.concatenate([g[0] for g in got], axis=1)
    dist = np.concatenate([g[1] for g in got], axis=1)
    order = np.lexsort((ids, dist), axis=1)[:, :K]
    return np.take_along_axis(ids, order, 1)


def overhead_breakdown(si: Any, queries: np.ndarray, reps: int, transport: str) -> dict[str, float]:
    """Where the time of one sharded query goes on ``transport`` (medians over ``reps``
    queries, microseconds), the way ``ShardedIndex.search`` sends it: one pickled request,
    raw-bytes answers. ``submit``: the request written to every shard (actor calls
    submitted / the graph's input channel written / a frame written to every socket);
    ``wait``: until every answer is back; ``decode_merge``: answers decoded and the N k
    candidates merged. The shards' own search time comes from a second, timed call of the
    same query (``search_timed``), and ``overhead`` = total - slowest shard search."""
    import ray

    from kbcore.distributed.sockets import NOOP
    from kbcore.distributed.transport import pack_request, unpack_reply

    actors = si.shard_actors()
    compiled = si._calls.compiled if transport == "compiled" else None
    sock = si._calls.socket if transport == "socket" else None
    if transport == "compiled" and (compiled is None or not compiled.ready):
        return {"error": f"no compiled graph: {si.transport_stats()}"}
    if transport == "socket" and (sock is None or not sock.ready):
        return {"error": f"no socket addresses: {si.transport_stats()}"}
    submit, wait, merge, total, inside, noop = [], [], [], [], [], []
    for q in queries[:reps]:
        q2 = q.reshape(1, -1)
        req = pack_request("search", (q2, K, None, None, 1))
        timed = pack_request("search_timed", (q2, K, None, None, 1))
        if sock is not None:
            t0 = time.perf_counter()
            if sock.call(b"", 30, kind=NOOP) is None:
                return {"error": f"the socket path fell back: {si.transport_stats()}"}
            noop.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            conns = sock.begin(req)
            t1 = time.perf_counter()
            raw = sock.finish(conns, 30) if conns is not None else None
            t2 = time.perf_counter()
            if raw is None:
                return {"error": f"the socket path fell back: {si.transport_stats()}"}
            _merge([unpack_reply(r) for r in raw])
            t3 = time.perf_counter()
            timed_raw = sock.call(timed, 30)
            if timed_raw is None:
                return {"error": f"the socket path fell back: {si.transport_stats()}"}
            inside.append(max(unpack_reply(r)[2] for r in timed_raw))
        elif compiled is None:
            t0 = time.perf_counter()
            ray.get([a.ping.remote() for a in actors])
            noop.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            refs = [a.query.remote(req) for a in actors]
            t1 = time.perf_counter()
            raw = ray.get(refs)
            t2 = time.perf_counter()
            _merge([unpack_reply(r) for r in raw])
            t3 = time.perf_counter()
            inside.append(max(unpack_reply(r)[2] for r in ray.get([a.query.remote(timed) for a in actors])))
        else:
            with compiled._use:  # the graph runs one execution at a time
                graph = compiled._graph
                t0 = time.perf_counter()
                refs = graph.execute(req)
                t1 = time.perf_counter()
                raw = [r.get() for r in refs]
                t2 = time.perf_counter()
                _merge([unpack_reply(r) for r in raw])
                t3 = time.perf_counter()
                inside.append(max(unpack_reply(r.get())[2] for r in graph.execute(timed)))
        submit.append(t1 - t0)
        wait.append(t2 - t1)
        merge.append(t3 - t2)
        total.append(t3 - t0)
    med = lambda xs: float(np.median(xs)) * 1e6 if xs else float("nan")  # noqa: E731
    return {
        "submit_us": med(submit),
        "wait_us": med(wait),
        "decode_merge_us": med(merge),
        "scatter_gather_total_us": med(total),
        "slowest_shard_search_us": med(inside),
        "overhead_us": med(total) - med(inside),
        # a ping to every shard: ray.get of actor calls ("actor"), a no-op frame ("socket");
        # not measured for "compiled"
        "noop_round_trip_us": med(noop),
    }


def use_transport(si: Any, transport: str) -> float:
    """Switches ``si``'s read-only queries to ``transport`` (the others' state torn down
    first: a compiled graph's shards poll their channels, which would disturb the others);
    returns the seconds it took to set up."""
    from kbcore.distributed.compiled import CompiledScatter
    from kbcore.distributed.transport import pack_request

    calls = si._calls
    if calls.compiled is not None:
        calls.compiled.close()
        calls.compiled = None
    if calls.socket is not None:
        calls.socket.close()
        calls.socket = None
    t0 = time.perf_counter()
    if transport == "compiled":
        calls.compiled = CompiledScatter(si.shard_actors(), pack_request("size", ()), idle=None)
    elif transport == "socket":
        calls.start_sockets()
    si._transport = transport
    return time.perf_counter() - t0


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


def _load_row(before: tuple[float, float, float]) -> dict[str, Any]:
    after = os.getloadavg()
    if before[0] > 0.5:
        print(f"    WARNING: load average {before[0]:.2f} > 0.5 at the start of this run", flush=True)
    return {"loadavg_before": list(before), "loadavg_after": list(after), "started_above_0_5": before[0] > 0.5}


def _ingest(idx: Any, ds: dict[str, Any], batch: int, label: str) -> float:
    """Adds every row in batches of ``batch`` (routed per batch when sharded); seconds."""
    base, texts = ds["base"], ds["texts"]
    n = len(base)
    ids = np.arange(n, dtype=np.int64)
    step = max(n // 10, batch)
    t0 = time.perf_counter()
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        idx.add(
            base[lo:hi], ids[lo:hi], metadata=_batch_meta(ds, lo, hi), texts=None if texts is None else texts[lo:hi]
        )
        if n >= 100_000 and hi % step < batch and hi < n:
            print(f"    {label}: {hi:,} / {n:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return time.perf_counter() - t0


def _query_figures(idx: Any, ds: dict[str, Any], truth: np.ndarray, *, sharded: bool) -> dict[str, Any]:
    queries = ds["queries"]
    if sharded:
        bench_single(idx, queries[: min(20, len(queries))], sharded=True)  # warm up
    lat = bench_single(idx, queries, sharded=sharded)
    t0 = time.perf_counter()
    found, _ = idx.search(queries, K) if sharded else idx.search(queries, K, threads=0)
    batch_s = time.perf_counter() - t0
    row: dict[str, Any] = {
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
        "batch_qps": len(queries) / batch_s,
        "recall_at_10": recall_at_k(found, truth),
    }
    if ds["qtexts"]:
        tl = []
        for qt in ds["qtexts"]:
            t0 = time.perf_counter()
            idx.search_text(qt, K)
            tl.append(time.perf_counter() - t0)
        row["bm25_p50_ms"] = _pct(tl, 50) * 1e3
    return row


def idle_cpu(si: Any, seconds: float = 2.0) -> list[float] | None:
    """CPU share (1.0 = one core) each shard process uses while no query runs, from
    /proc/<pid>/stat over ``seconds`` (shards on this machine only; None elsewhere)."""
    pids = [n["pid"] for n in si.shard_nodes()]
    tick = os.sysconf("SC_CLK_TCK")

    def used() -> list[int] | None:
        try:
            out = []
            for p in pids:
                with open(f"/proc/{p}/stat", encoding="ascii") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out.append(int(fields[11]) + int(fields[12]))  # utime + stime
            return out
        except (OSError, ValueError, IndexError):
            return None

    a = used()
    time.sleep(seconds)
    b = used()
    if a is None or b is None:
        return None
    return [(y - x) / tick / seconds for x, y in zip(a, b)]


def run_dataset(ds: dict[str, Any], shard_counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One data set: the unsharded Index (shard count 0) and a ShardedIndex per shard count,
    each queried over every transport in ``args.transports``."""
    import kbcore
    from kbcore.distributed import ShardedIndex

    base, queries = ds["base"], ds["queries"]
    n, dim = base.shape
    truth = ds.get("truth")
    if truth is None:
        truth, _ = exact_top_k(
            base / np.linalg.norm(base, axis=1, keepdims=True),
            queries / np.linalg.norm(queries, axis=1, keepdims=True),
            K,
        )
    opts = {"M": args.M, "ef_construction": ds["ef_construction"], "ef": args.ef}
    batch = args.batch
    res: dict[str, Any] = {
        "n": n,
        "dim": dim,
        "queries": len(queries),
        "batch_rows": batch,
        "kind": args.kind,
        "checkpoint_bytes": args.checkpoint_mb << 20,
        **opts,
        "runs": [],
    }
    print(f"  M={args.M} ef_construction={ds['ef_construction']} ef={args.ef}, batches of {batch:,}", flush=True)

    for shards in shard_counts:
        before = os.getloadavg()
        if shards == 0:  # the unsharded baseline, the same batches, in this process
            one = kbcore.Index(dim, "cosine", args.kind, **opts)
            ingest = _ingest(one, ds, batch, "unsharded")
            row = {
                "shards": 0,
                "label": "kbcore.Index (unsharded, in process)",
                "ingest_rows_per_s": n / ingest,
                **_query_figures(one, ds, truth, sharded=False),
            }
            row.update(_load_row(before))
            res["runs"].append(row)
            print(f"  unsharded: {row}", flush=True)
            del one
            gc.collect()
            continue
        root = tempfile.mkdtemp(prefix="kbshard", dir=args.path)
        try:
            si = ShardedIndex(
                dim,
                "cosine",
                args.kind,
                shards=shards,
                path=os.path.join(root, "kb"),
                checkpoint_bytes=args.checkpoint_mb << 20,
                transport="actor",
                **opts,
            )
            ingest = _ingest(si, ds, batch, f"{shards} shard(s)")
            row = {
                "shards": shards,
                "label": f"ShardedIndex, {shards} shard actor(s)",
                "ingest_rows_per_s": n / ingest,
                "rows_per_shard": [i["rows"] for i in si.shard_info()],
                "transports": {},
            }
            reps = min(args.breakdown_reps, len(queries))
            for transport in args.transports:
                setup_s = use_transport(si, transport)
                fig: dict[str, Any] = {"idle_cpu_per_shard": idle_cpu(si)}
                fig.update(_query_figures(si, ds, truth, sharded=True))
                fig["breakdown"] = overhead_breakdown(si, queries, reps, transport)
                if transport == "compiled":
                    fig["compile_s"] = setup_s
                if transport != "actor":
                    fig["setup_s"] = setup_s
                    fig["transport_stats"] = si.transport_stats()
                row["transports"][transport] = fig
                print(f"    {shards} shard(s), {transport}: {fig}", flush=True)
            row.update(_load_row(before))
            res["runs"].append(row)
            print(f"  {shards} shard(s): ingest {row['ingest_rows_per_s']:,.0f} rows/s", flush=True)
            si.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        gc.collect()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=_TIME_ESTIMATE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--data", default=None, help="SciFact folder or its parent (default $KBCORE_DATA)")
    ap.add_argument(
        "--n",
        type=int,
        default=0,
        help="synthetic vectors, opt-in (e.g. 1000000; default 0: no synthetic set). See the time estimate below.",
    )
    ap.add_argument("--nq", type=int, default=1000, help="synthetic queries")
    ap.add_argument(
        "--shards",
        default="0,1,2,4",
        help="comma-separated shard counts to run; 0 is the unsharded in-process Index (default 0,1,2,4)",
    )
    ap.add_argument(
        "--transports",
        default="actor,compiled,socket",
        help="query paths to measure per shard count, in this order: actor (Ray actor calls), compiled (Ray "
        "Compiled Graph), socket (a socket per shard)",
    )
    ap.add_argument("--kind", default="hnsw", choices=("hnsw", "flat"))
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200, help="HNSW build width for SciFact (default 200)")
    ap.add_argument(
        "--synthetic-ef-construction",
        type=int,
        default=40,
        help="HNSW build width for the synthetic set (default 40, lower than SciFact's so that 1M rows x 4 builds "
        "fit the time estimate; stated in the output)",
    )
    ap.add_argument("--ef", type=int, default=64)
    ap.add_argument("--batch", type=int, default=10_000, help="rows per add() call")
    ap.add_argument(
        "--checkpoint-mb",
        type=int,
        default=1024,
        help="shard checkpoint_bytes in MiB (default 1024: at 1M rows a shard checkpoints a few times, not per 64 MiB)",
    )
    ap.add_argument("--breakdown-reps", type=int, default=200)
    ap.add_argument("--no-scifact", action="store_true")
    ap.add_argument("--no-synthetic", action="store_true", help="skip the synthetic set even with --n")
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
        args.shards = "0,1,2"
        args.ef_construction = args.synthetic_ef_construction = 40
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    if not shard_counts or any(c < 0 for c in shard_counts):
        ap.error(f"--shards must list counts >= 0, got {args.shards!r}")
    args.transports = [t for t in args.transports.split(",") if t]
    if not args.transports or set(args.transports) - {"actor", "compiled", "socket"}:
        ap.error(f"--transports must be a list of actor, compiled, socket; got {args.transports!r}")
    if args.n < 0:
        ap.error("--n must be >= 0")
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
                ds["ef_construction"] = args.ef_construction
                print(f"{ds['name']}: {len(ds['base'])} x {ds['base'].shape[1]}", flush=True)
                results["datasets"].append({"name": ds["name"], **run_dataset(ds, shard_counts, args)})
            else:
                print(f"SciFact not found under {folder}; skipped", flush=True)
        if args.n and not args.no_synthetic:
            t0 = time.perf_counter()
            ds = load_synthetic(args.n, args.nq)
            ds["ef_construction"] = args.synthetic_ef_construction
            print(f"generated {ds['name']} with exact ground truth in {time.perf_counter() - t0:.0f} s", flush=True)
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
