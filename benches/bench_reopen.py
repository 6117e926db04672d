"""Reopen + first query of one kbcore knowledge base, per phase (issue 28).

A server that restarts pays this before its first answer: a fresh ``Engine`` opens the knowledge
base and answers one query. The knowledge base is built once (``--work``, kept between runs,
rebuilt with ``--rebuild``); every timing then runs in its own fresh interpreter, ``--repeats``
times, and the median is printed with ``os.getloadavg()`` before each run.

Phases, timed by calling the functions ``KbState.load`` calls, in its order (``KbState.load``
itself runs the native ``index`` load on a thread beside ``segments``, so its total is not
their sum):

0. ``pyarrow import``: the first load in a process imports pyarrow (kbcore imports it lazily);
   ``total`` includes it, ``reopen again`` does not;
1. ``manifest``: read the manifest, check its CRC-32 and fields (``storage.load_manifest``);
2. ``segments``: map and check every segment's Arrow files, build the per-segment views
   (``storage.read_segments``, ``Segment``);
3. ``index``: the native checkpoint load (``Index.load``): map, check magic, version, size and
   payload checksum, then the structure of every section (rows finite, graph links in range,
   metadata columns, the BM25 section);
4. ``reconcile``: the index's ids against the manifest's live chunks;
5. ``vector query`` and ``full-text query``: the first of each on the opened state.

``total`` is measured in a fresh process of its own, through the public path
(``Engine(path)``, ``get_knowledge_base``, one vector ``retrieve``), before anything else in
that process touches the knowledge base; ``reopen again`` is the same in the same process once
more (what ``bench_engine_peers`` times: the process remembers the Arrow files it checked). The
files are in the page cache, as they are for a server restarting on the same machine.

Data: ``--dataset scifact`` (19,369 chunks x 384, MiniLM, pre-embedded, text) or ``synthetic``
(``--n`` chunks x 384 random unit vectors, one short text per chunk drawn from a 5,000-word
seeded vocabulary, 20 chunks per document), ingested through ``ingest_table(..., vectors=)``
with ``quantization='sq8'`` (as ``bench_engine_peers``); ``--ef-construction`` lowers the graph
build cost of a large synthetic base (it does not change what a reopen reads).

Run from the repository root::

    python -m benches.bench_reopen --dataset scifact
    python -m benches.bench_reopen --dataset synthetic --n 1000000 --work /tmp/kb-1m
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

import numpy as np

DIM = 384
PER_DOC = 20
SEED = 20261205


def _synthetic_table(lo: int, hi: int, rng: np.random.Generator) -> tuple[object, np.ndarray]:
    import pyarrow as pa

    vocab = np.array([f"w{i}" for i in range(5000)])
    words = rng.integers(0, len(vocab), size=(hi - lo, 12))
    texts = [" ".join(row) for row in vocab[words]]
    vecs = rng.standard_normal((hi - lo, DIM), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rows = np.arange(lo, hi)
    table = pa.table(
        {
            "document_id": [f"d{r // PER_DOC}" for r in rows],
            "chunk_index": pa.array(rows % PER_DOC, pa.int64()),
            "text": texts,
        }
    )
    return table, vecs


def build(work: str, dataset: str, n: int, ef_construction: int) -> None:
    """Creates the knowledge base ``kb`` under ``work`` (replacing it)."""
    from kbcore.engine import Engine

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    engine = Engine(work)
    kb = engine.create_knowledge_base(
        "kb", embedder=False, dim=DIM, quantization="sq8", M=16, ef_construction=ef_construction
    )
    t0 = time.perf_counter()
    if dataset == "scifact":
        import pyarrow as pa

        from benches.bench_engine_peers import load

        data = load(None, None, 1)
        table = pa.table(
            {
                "document_id": data.doc_ids,
                "chunk_index": pa.array(data.chunk_index, pa.int64()),
                "text": data.texts,
            }
        )
        for s, e in data.batches:
            kb.ingest_table(table.slice(s, e - s), vectors=data.vectors[s:e], span_columns=None)
    else:
        rng = np.random.default_rng(SEED)
        step = 50_000
        for lo in range(0, n, step):
            table, vecs = _synthetic_table(lo, min(n, lo + step), rng)
            kb.ingest_table(table, vectors=vecs, span_columns=None)
            print(f"  ingested {min(n, lo + step):,} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
    kb.wait_until_indexed()
    engine.close()
    print(f"built {dataset} in {time.perf_counter() - t0:.1f} s", flush=True)


def _open_and_query(work: str, q: np.ndarray) -> float:
    from kbcore.engine import Engine

    t = time.perf_counter()
    engine = Engine(work)
    kb = engine.get_knowledge_base("kb")
    kb.retrieve(q, 10)
    took = time.perf_counter() - t
    engine.close()
    return took


def child(work: str, what: str) -> None:
    """One fresh-process measurement: prints one JSON line of times (seconds)."""
    from kbcore.engine import state, storage
    from kbcore.engine.segments import Segment
    from kbcore.index import Index

    path = os.path.join(work, "kb")
    q = np.random.default_rng(SEED).standard_normal(DIM).astype(np.float32)
    q /= np.linalg.norm(q)
    out: dict[str, float] = {}
    if what == "total":
        out["total"] = _open_and_query(work, q)
        out["reopen again"] = _open_and_query(work, q)
        print("RESULT " + json.dumps(out), flush=True)
        return
    t = time.perf_counter()
    import pyarrow.ipc  # noqa: F401 - what the first load imports (storage.read_arrow)

    out["pyarrow import"] = time.perf_counter() - t
    t = time.perf_counter()
    with storage.reading(path):
        m = storage.load_manifest(path)
        out["manifest"] = time.perf_counter() - t
        t = time.perf_counter()
        segments = tuple(Segment(e, c, d) for e, c, d in storage.read_segments(path, m))
        out["segments"] = time.perf_counter() - t
        t = time.perf_counter()
        storage.check_size(path, m["index"])
        index = Index.load(os.path.join(path, m["index"]["path"]))
        out["index"] = time.perf_counter() - t
        t = time.perf_counter()
        state._reconcile(path, index, segments, m["segments"])
        index.text_documents()
        out["reconcile"] = time.perf_counter() - t
    t = time.perf_counter()
    index.search(q, 10)
    out["vector query"] = time.perf_counter() - t
    t = time.perf_counter()
    index.search_text("w1 w2 protein", 10)
    out["full-text query"] = time.perf_counter() - t
    print("RESULT " + json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=("scifact", "synthetic"), default="scifact")
    ap.add_argument("--n", type=int, default=200_000, help="synthetic chunks")
    ap.add_argument("--work", help="where the knowledge base is kept (default /tmp/kbcore-reopen-<dataset>[-n])")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", choices=("phases", "total"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    suffix = "" if args.dataset == "scifact" else f"-{args.n}"
    work = args.work or f"/tmp/kbcore-reopen-{args.dataset}{suffix}"
    if args.child:
        child(work, args.child)
        return 0
    if args.rebuild or not os.path.exists(os.path.join(work, "kb", "manifest.json")):
        build(work, args.dataset, args.n, args.ef_construction)
    runs: list[dict[str, float]] = []
    for _ in range(args.repeats):
        load = os.getloadavg()[0]
        run: dict[str, float] = {}
        for what in ("total", "phases"):
            cmd = [sys.executable, "-m", "benches.bench_reopen", "--child", what, "--work", work]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
            run.update(json.loads(line[len("RESULT ") :]))
        run["load"] = load
        runs.append(run)
        print("  " + "  ".join(f"{k} {v:.4f}" for k, v in run.items()), flush=True)
    print(f"\n{args.dataset} ({work}), median of {len(runs)} fresh processes:")
    for key in runs[0]:
        print(f"  {key:<16s} {statistics.median(r[key] for r in runs):8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
