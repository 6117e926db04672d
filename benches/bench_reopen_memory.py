"""Anonymous memory of a reopened knowledge base with disk-resident vectors (issue 28).

A knowledge base built with ``quantization=...`` and ``vectors="disk"`` keeps its float32 rows
in its index checkpoint, which a reopen maps and reads in place (docs/quantization.md). This
script measures what a server that restarts holds: in a fresh process that only opens the
knowledge base and queries it, the anonymous memory (``RssAnon`` from /proc/self/status) the
open and the queries add, per vector; next to it, hnswlib's RSS per vector for the same data
(M = 16, ef_construction = 200) built in its own fresh process, and, for reference, the same
knowledge base reopened with ``Engine(path, vectors="memory")``.

Run from the repository root (Linux; hnswlib from ``pip install hnswlib``)::

    python -m benches.bench_reopen_memory [--n 100000] [--quantization sq8,rabitq] [--work DIR]

The data is benches.datasets.make_synthetic (seeded, 384 dimensions, unit-norm rows, cosine).
RSS is not a timing: a busy machine changes the build time, not the memory figures; the load
average is printed anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

M, EF_CONSTRUCTION, BUILD_THREADS = 16, 200, 2


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _settle() -> None:
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        ctypes.CDLL(name).malloc_trim(0)


def _emit(obj: dict) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


# -- children: each runs in its own fresh interpreter ---------------------------------------------
def child_build_kb(work: str, quantization: str, n: int, per_doc: int) -> None:
    """Builds knowledge base ``quantization`` (rows on disk) from the synthetic base and closes it."""
    import pyarrow as pa

    from benches.datasets import make_synthetic
    from kbcore.engine import Engine

    ds = make_synthetic(n, 1000)
    np.save(os.path.join(work, quantization + ".queries.npy"), ds.queries)
    np.save(os.path.join(work, quantization + ".gt.npy"), ds.gt_ids)
    engine = Engine(work)
    kb = engine.create_knowledge_base(
        quantization,
        embedder=False,
        dim=ds.dim,
        metric="cosine",
        M=M,
        ef_construction=EF_CONSTRUCTION,
        quantization=quantization,
        vectors="disk",
    )
    t0 = time.perf_counter()
    table = pa.table({"document_id": [f"d{i // per_doc}" for i in range(ds.n)], "text": [""] * ds.n})
    kb.ingest_table(table, vectors=ds.base)
    kb.wait_until_indexed()
    kb.checkpoint()
    build_s = time.perf_counter() - t0
    kb.close()
    engine.close()
    _emit({"build_s": build_s})


def child_open_kb(work: str, name: str, vectors: str | None) -> None:
    """Opens knowledge base ``name`` and runs every query once; reports RssAnon growth."""
    queries = np.load(os.path.join(work, name + ".queries.npy"))
    gt = np.load(os.path.join(work, name + ".gt.npy"))
    import kbcore  # noqa: F401  (the native module's own memory is not the knowledge base's)
    from kbcore.engine import Engine

    # pyarrow (the engine imports it at the first open) costs a fixed few MiB whatever the
    # size of the knowledge base: measured and reported apart, not spread over the vectors.
    _settle()
    lib0 = _status_kib("RssAnon")
    import pyarrow.ipc  # noqa: F401

    _settle()
    anon0, rss0 = _status_kib("RssAnon"), _status_kib("VmRSS")
    t0 = time.perf_counter()
    kb = Engine(work, vectors=vectors)[name]
    open_s = time.perf_counter() - t0
    hits = [[h.id for h in kb.retrieve(q, 10)] for q in queries]
    _settle()
    anon1, rss1 = _status_kib("RssAnon"), _status_kib("VmRSS")
    recall = float(np.mean([len(set(h) & set(g.tolist())) / 10 for h, g in zip(hits, gt)]))
    _emit(
        {
            "n": len(kb),
            "vectors": kb.vectors,
            "open_s": open_s,
            "recall_at_10": recall,
            "anon_bytes_per_vector": (anon1 - anon0) * 1024 / len(kb),
            "rss_bytes_per_vector": (rss1 - rss0) * 1024 / len(kb),
            "anon_total_mib": anon1 / 1024,
            "pyarrow_import_anon_mib": (anon0 - lib0) / 1024,
        }
    )


def child_open_index(work: str, name: str) -> None:
    """Loads only the knowledge base's index checkpoint (kbcore.Index.load, as saved) and
    searches it with every query; reports RssAnon growth (the native part of a reopen)."""
    queries = np.load(os.path.join(work, name + ".queries.npy"))
    import kbcore

    with open(os.path.join(work, name, "manifest.json")) as fh:
        ckpt = os.path.join(work, name, json.load(fh)["index"]["path"])
    _settle()
    anon0 = _status_kib("RssAnon")
    index = kbcore.Index.load(ckpt)
    for q in queries:
        index.search(q, 10)
    _settle()
    anon1 = _status_kib("RssAnon")
    _emit({"n": len(index), "vectors": index.vectors, "anon_bytes_per_vector": (anon1 - anon0) * 1024 / len(index)})


def child_hnswlib(n: int) -> None:
    """hnswlib built on the same data; reports the RSS the build adds per vector."""
    import hnswlib

    from benches.datasets import make_synthetic

    ds = make_synthetic(n, 1000)
    _settle()
    rss0 = _status_kib("VmRSS")
    t0 = time.perf_counter()
    index = hnswlib.Index(space="cosine", dim=ds.dim)
    index.init_index(max_elements=ds.n, M=M, ef_construction=EF_CONSTRUCTION, random_seed=100)
    index.add_items(ds.base, np.arange(ds.n), num_threads=BUILD_THREADS)
    build_s = time.perf_counter() - t0
    _settle()
    rss1 = _status_kib("VmRSS")
    _emit({"build_s": build_s, "rss_bytes_per_vector": (rss1 - rss0) * 1024 / ds.n})


# -- parent ----------------------------------------------------------------------------------------
def _run(*args: str) -> dict:
    cmd = [sys.executable, "-m", "benches.bench_reopen_memory", "--child", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--quantization", default="sq8,rabitq")
    ap.add_argument("--chunks-per-doc", type=int, default=1, help="chunks of one document (1: every row its own)")
    ap.add_argument("--work", default=None, help="directory for the knowledge bases (default: a temp dir)")
    ap.add_argument(
        "--hnswlib-rss", type=float, default=None, help="hnswlib's B/vector from an earlier run (skips its build)"
    )
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "build-kb":
            child_build_kb(rest[0], rest[1], int(rest[2]), int(rest[3]))
        elif kind == "open-index":
            child_open_index(rest[0], rest[1])
        elif kind == "open-kb":
            child_open_kb(rest[0], rest[1], None if rest[2] == "saved" else rest[2])
        elif kind == "hnswlib":
            child_hnswlib(int(rest[0]))
        return
    if not sys.platform.startswith("linux"):
        raise SystemExit("reads RssAnon from /proc/self/status: Linux only")
    print(
        f"load average before: {os.getloadavg()}; {args.n} x 384, {args.chunks_per_doc} chunk(s) per document",
        flush=True,
    )
    work = args.work or tempfile.mkdtemp(prefix="kbcore-reopen-")
    try:
        if args.hnswlib_rss is not None:
            hn = {"rss_bytes_per_vector": args.hnswlib_rss, "build_s": float("nan")}
        else:
            hn = _run("hnswlib", str(args.n))
        print(
            f"hnswlib M={M} efC={EF_CONSTRUCTION}: RSS {hn['rss_bytes_per_vector']:.0f} B/vector "
            f"(build {hn['build_s']:.0f} s)",
            flush=True,
        )
        for q in [x for x in args.quantization.split(",") if x]:
            built = _run("build-kb", work, q, str(args.n), str(args.chunks_per_doc))
            native = _run("open-index", work, q)
            print(
                f"kbcore {q:6s} index checkpoint alone (Index.load): RssAnon +{native['anon_bytes_per_vector']:.0f} "
                f"B/vector = {native['anon_bytes_per_vector'] / hn['rss_bytes_per_vector']:.2f}x hnswlib; "
                f"vectors={native['vectors']}",
                flush=True,
            )
            disk = _run("open-kb", work, q, "saved")
            mem = _run("open-kb", work, q, "memory")
            for label, r in (("as saved (disk)", disk), ("override memory", mem)):
                print(
                    f"kbcore {q:6s} reopened {label:16s}: RssAnon +{r['anon_bytes_per_vector']:.0f} B/vector "
                    f"= {r['anon_bytes_per_vector'] / hn['rss_bytes_per_vector']:.2f}x hnswlib; "
                    f"RSS +{r['rss_bytes_per_vector']:.0f} B/vector; vectors={r['vectors']}, n={r['n']}, "
                    f"open {r['open_s']:.2f} s, recall@10 {r['recall_at_10']:.3f} (ef 64) "
                    f"[build {built['build_s']:.0f} s; importing pyarrow, not counted: "
                    f"+{r['pyarrow_import_anon_mib']:.1f} MiB]",
                    flush=True,
                )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
