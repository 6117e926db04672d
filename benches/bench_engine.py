"""The knowledge engine on SciFact: retrieval quality, per-retrieve overhead and ingest speed.

Run from the repository root with kbcore installed::

    python -m benches.bench_engine [--data DIR] [--index hnsw|flat|both] [--json OUT]

What it measures (issue 5):

1. **nDCG@10** of documents through the engine with the provided embeddings (pre-embedded
   ingest): chunk-level with ``deduplicate=True`` (one hit per document, ranked by its best
   chunk) against the exact baseline 0.6694, and document-level (one vector per document)
   against 0.6451. Gate: within 0.005.
2. **Engine overhead** per ``retrieve`` beyond the native search it wraps, single thread,
   top_k=10: (a) the median per-query difference between ``kb.retrieve(q)`` and the bare native
   call (``Index.search_groups`` for dedup, ``Index.search`` without) timed back to back; (b)
   the median time of ``kb.retrieve(q)`` with the native search replaced by its cached answer
   (the engine alone, immune to the noise of the search itself). Gate on (b): <= 0.3 ms.
3. **Pre-embedded ingest**: ``ingest_table`` of the 19,369 chunks (vectors, text, document ids,
   spans) into an empty knowledge base, durable on return. Gate: >= 50,000 chunks/s. The time
   inside the native ``Index.add`` (the HNSW graph build) is reported separately.
4. **Text ingest** with the built-in HashingEmbedder: ``ingest_many`` of the 5,183 document
   texts (parse, chunk 500/50, embed, index, store). Gate: >= 2,000 chunks/s on 2 cores.
5. **Durable ingest in ~1k-row batches** (issue 28): the pre-embedded chunks through
   ``ingest_table``, one commit per batch (documents never split), the median commit; and
   **reopen + first query**: ``Engine(path)[name]`` and one ``retrieve``, median of 5 in this
   process (warm page cache).

Nothing asserts: the script prints PASS/FAIL per gate. Wall-clock timings on a shared 2-core
machine are noisy; compare runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benches.common import ndcg_at_10 as common_ndcg_at_10
from benches.common import read_scifact
from benches.datasets import scifact_dir

BASELINE_CHUNKS = 0.6694
BASELINE_DOCS = 0.6451


def load(folder: Path) -> dict:
    import pyarrow as pa

    docs, chunks, queries, qrels = read_scifact(folder)
    chunk_table = pa.table(
        {
            "document_id": [c["doc_id"] for c in chunks],
            "chunk_index": pa.array([c["chunk_index"] for c in chunks], pa.int64()),
            "char_start": pa.array([c["char_start"] for c in chunks], pa.int64()),
            "char_end": pa.array([c["char_end"] for c in chunks], pa.int64()),
            "text": [c["text"] for c in chunks],
        }
    )
    doc_table = pa.table(
        {
            "document_id": [d["id"] for d in docs],
            "text": [(d["title"] + " " + d["text"]).strip() for d in docs],
            "structured": [bool(d["metadata"]["structured"]) for d in docs],
        }
    )
    return {
        "docs": docs,
        "queries": queries,
        "qrels": qrels,
        "chunk_table": chunk_table,
        "doc_table": doc_table,
        "C": np.load(folder / "chunk_embeddings.npy"),
        "D": np.load(folder / "doc_embeddings.npy"),
        "Q": np.load(folder / "query_embeddings.npy"),
    }


def ndcg_at_10(ranked: list[list[str]], queries: list[dict], qrels: dict) -> float:
    """Mean nDCG@10 of the rankings of these query records (benches.common.ndcg_at_10)."""
    return common_ndcg_at_10(ranked, [q["id"] for q in queries], qrels)


def overhead(kb, Q: np.ndarray, *, deduplicate: bool, rounds: int) -> dict:
    """Median per-query (retrieve - native search) time, microseconds."""
    index = kb.index
    diffs, eng, nat = [], [], []
    gc.disable()
    try:
        for _ in range(rounds):
            for q in Q:
                if deduplicate:
                    t0 = time.perf_counter()
                    index.search_groups(q, 10, group_by="_group", threads=1)
                    t1 = time.perf_counter()
                else:
                    t0 = time.perf_counter()
                    index.search(q, 10, threads=1)
                    t1 = time.perf_counter()
                kb.retrieve(q, top_k=10, deduplicate=deduplicate)
                t2 = time.perf_counter()
                nat.append(t1 - t0)
                eng.append(t2 - t1)
                diffs.append((t2 - t1) - (t1 - t0))
    finally:
        gc.enable()
    return {
        "median_overhead_us": statistics.median(diffs) * 1e6,
        "median_native_us": statistics.median(nat) * 1e6,
        "median_retrieve_us": statistics.median(eng) * 1e6,
    }


def engine_only(kb, Q: np.ndarray, *, deduplicate: bool, rounds: int) -> float:
    """Median time of retrieve with the native search replaced by its cached answer (us): the
    engine's own work per retrieve (query checks, locking, hit building, text and metadata)."""
    from kbcore.engine import retrieval

    cached = [retrieval.vector_candidates(kb.index, q, 10, None, deduplicate, None) for q in Q]
    real = retrieval.vector_candidates
    current = [0]
    retrieval.vector_candidates = lambda *a: cached[current[0]]
    times = []
    gc.disable()
    try:
        for _ in range(rounds):
            for i, q in enumerate(Q):
                current[0] = i
                t0 = time.perf_counter()
                kb.retrieve(q, top_k=10, deduplicate=deduplicate)
                times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
        retrieval.vector_candidates = real
    return statistics.median(times) * 1e6


class _AddTimer:
    """Accumulates the time spent in the native Index.add during ingest."""

    def __init__(self) -> None:
        from kbcore.index import Index

        self.cls = Index
        self.orig = Index.add
        self.seconds = 0.0

    def __enter__(self) -> _AddTimer:
        orig = self.orig

        def timed(index, *a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(index, *a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0

        self.cls.add = timed
        return self

    def __exit__(self, *exc) -> None:
        self.cls.add = self.orig


def _document_batches(doc_ids: list[str], rows: int) -> list[tuple[int, int]]:
    """(start, stop) row ranges of about ``rows`` rows that never split a document (a document
    ingested in two batches would be replaced by the second)."""
    out, start = [], 0
    for i in range(1, len(doc_ids) + 1):
        if i == len(doc_ids) or (i - start >= rows and doc_ids[i] != doc_ids[i - 1]):
            out.append((start, i))
            start = i
    return out


def durable_batches(engine, data: dict, kind: str, rows: int = 1000) -> dict:
    """Pre-embedded chunks through ``ingest_table`` in ~``rows``-row batches, each one commit
    (durable on return: its files and manifest fsynced); the median commit time."""
    table, C = data["chunk_table"], data["C"]
    kb = engine.create_knowledge_base("batched", embedder=False, index=kind)
    times = []
    for start, stop in _document_batches(table.column("document_id").to_pylist(), rows):
        t0 = time.perf_counter()
        kb.ingest_table(table.slice(start, stop - start), vectors=C[start:stop])
        times.append((time.perf_counter() - t0, stop - start))
    med = statistics.median(t for t, _ in times)
    total = sum(t for t, _ in times)
    n = sum(r for _, r in times)
    return {
        "batches": len(times),
        "rows": n,
        "median_commit_ms": med * 1e3,
        "rows_per_s": n / total,
        "median_batch_rows_per_s": statistics.median(r / t for t, r in times),
    }


def reopen_first_query(path: str, name: str, q: np.ndarray, repeats: int = 5) -> dict:
    """``Engine(path)[name]`` plus its first ``retrieve``, ``repeats`` times in this process
    (warm page cache); the median and every time."""
    from kbcore.engine import Engine

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine = Engine(path)
        engine[name].retrieve(q, top_k=10)
        times.append(time.perf_counter() - t0)
        engine.close()
    return {"median_s": statistics.median(times), "times_s": times}


def run(data: dict, kind: str, rounds: int) -> dict:
    from kbcore.engine import Document, Engine

    out: dict = {"index": kind}
    Q, C, D = data["Q"], data["C"], data["D"]
    with tempfile.TemporaryDirectory(prefix="kbcore-bench-") as tmp:
        engine = Engine(tmp)
        # 1 + 3: pre-embedded chunks
        kb = engine.create_knowledge_base("chunks", embedder=False, index=kind)
        with _AddTimer() as add:
            t0 = time.perf_counter()
            kb.ingest_table(data["chunk_table"], vectors=C)
            dt = time.perf_counter() - t0
        # Ingest returns once chunks are durable and searchable; HNSW linking goes on in the
        # background. Quality is measured once the graph holds every chunk.
        t1 = time.perf_counter()
        kb.wait_until_indexed()
        out["preembedded_ingest"] = {
            "chunks": len(C),
            "seconds": dt,
            "chunks_per_s": len(C) / dt,
            "native_add_seconds": add.seconds,
            "engine_chunks_per_s": len(C) / max(dt - add.seconds, 1e-9),
            "background_graph_seconds": time.perf_counter() - t1,
        }
        ranked = [[h.document_id for h in kb.retrieve(q, top_k=10, deduplicate=True)] for q in Q]
        out["ndcg10_chunks_dedup"] = ndcg_at_10(ranked, data["queries"], data["qrels"])
        # 2: overhead
        out["overhead_dedup"] = overhead(kb, Q, deduplicate=True, rounds=rounds)
        out["overhead_plain"] = overhead(kb, Q, deduplicate=False, rounds=rounds)
        out["overhead_dedup"]["engine_only_us"] = engine_only(kb, Q, deduplicate=True, rounds=rounds)
        out["overhead_plain"]["engine_only_us"] = engine_only(kb, Q, deduplicate=False, rounds=rounds)
        # reopen check: the same answers after a restart
        engine.close()
        out["reopen"] = reopen_first_query(tmp, "chunks", Q[0])
        engine = Engine(tmp)
        kb = engine.get_knowledge_base("chunks")
        kb.wait_until_indexed()
        again = [[h.document_id for h in kb.retrieve(q, top_k=10, deduplicate=True)] for q in Q[:50]]
        out["reopen_same_results"] = again == ranked[:50]

        # 1: document level
        kbd = engine.create_knowledge_base("docs", embedder=False, index=kind)
        t0 = time.perf_counter()
        kbd.ingest_table(data["doc_table"], vectors=D)
        out["preembedded_ingest_docs"] = {"rows": len(D), "seconds": time.perf_counter() - t0}
        kbd.wait_until_indexed()
        ranked = [[h.document_id for h in kbd.retrieve(q, top_k=10)] for q in Q]
        out["ndcg10_documents"] = ndcg_at_10(ranked, data["queries"], data["qrels"])

        # 4: text ingest with the built-in embedder
        kbt = engine.create_knowledge_base("text", index=kind, chunk_size=500, chunk_overlap=50)
        docs = [
            Document(
                text=(d["title"] + " " + d["text"]).strip(),
                document_id=d["id"],
                metadata={"structured": bool(d["metadata"]["structured"])},
            )
            for d in data["docs"]
        ]
        with _AddTimer() as add:
            t0 = time.perf_counter()
            results = kbt.ingest_many(docs, progress=False)
            dt = time.perf_counter() - t0
        n = sum(r.chunks for r in results)
        t1 = time.perf_counter()
        kbt.wait_until_indexed()
        out["text_ingest"] = {
            "documents": len(docs),
            "chunks": n,
            "seconds": dt,
            "chunks_per_s": n / dt,
            "native_add_seconds": add.seconds,
            "background_graph_seconds": time.perf_counter() - t1,
        }
        # durable ingest in 1k-row batches (one commit each)
        out["durable_batches"] = durable_batches(engine, data, kind)
        engine.close()
    return out


def parse_scifact_args(
    argv: list[str] | None, description: str, index_choices: tuple[str, ...], index_default: str, rounds_help: str
) -> tuple[argparse.Namespace, Path] | None:
    """The command line shared by the engine benchmarks; None (after a message) without SciFact."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", default=None, help="data root holding scifact/ (default $KBCORE_DATA or ../shared/data)")
    ap.add_argument("--index", default=index_default, choices=index_choices)
    ap.add_argument("--rounds", type=int, default=3, help=rounds_help)
    ap.add_argument("--json", default=None, help="write every number to this file")
    args = ap.parse_args(argv)
    folder = scifact_dir(args.data)
    if not (folder / "chunk_embeddings.npy").exists():
        print(f"SciFact not found at {folder}; pass --data or set KBCORE_DATA", file=sys.stderr)
        return None
    return args, folder


def main(argv: list[str] | None = None) -> int:
    parsed = parse_scifact_args(
        argv,
        __doc__.split("\n\n")[0],
        ("hnsw", "flat", "both"),
        "both",
        "rounds of the 300 queries for the overhead timing",
    )
    if parsed is None:
        return 2
    args, folder = parsed
    import kbcore

    data = load(folder)
    kinds = ("hnsw", "flat") if args.index == "both" else (args.index,)
    report = {
        "kbcore": kbcore.__version__,
        "simd": kbcore.simd_level(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "runs": [],
    }
    for kind in kinds:
        r = run(data, kind, args.rounds)
        report["runs"].append(r)
        gate = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
        print(f"\n== index={kind} ==")
        v = r["ndcg10_chunks_dedup"]
        print(
            f"nDCG@10 chunks+dedup   {v:.4f}  (exact {BASELINE_CHUNKS}, diff {v - BASELINE_CHUNKS:+.4f})  "
            f"{gate(abs(v - BASELINE_CHUNKS) <= 0.005)}"
        )
        v = r["ndcg10_documents"]
        print(
            f"nDCG@10 documents      {v:.4f}  (exact {BASELINE_DOCS}, diff {v - BASELINE_DOCS:+.4f})  "
            f"{gate(abs(v - BASELINE_DOCS) <= 0.005)}"
        )
        for key in ("overhead_dedup", "overhead_plain"):
            o = r[key]
            print(
                f"{key:<22} {o['median_overhead_us']:7.1f} us paired difference "
                f"(native {o['median_native_us']:.1f} us, "
                f"retrieve {o['median_retrieve_us']:.1f} us); engine alone {o['engine_only_us']:.1f} us  "
                f"{gate(o['engine_only_us'] <= 300)}"
            )
        p = r["preembedded_ingest"]
        print(
            f"pre-embedded ingest    {p['chunks_per_s']:>9,.0f} chunks/s ({p['chunks']} in {p['seconds']:.3f} s, "
            f"native add {p['native_add_seconds']:.3f} s; engine alone {p['engine_chunks_per_s']:,.0f} chunks/s)  "
            f"{gate(p['chunks_per_s'] >= 50_000)}"
        )
        t = r["text_ingest"]
        print(
            f"text ingest (hashing)  {t['chunks_per_s']:>9,.0f} chunks/s ({t['chunks']} in {t['seconds']:.2f} s, "
            f"native add {t['native_add_seconds']:.2f} s)  "
            f"{gate(t['chunks_per_s'] >= 2_000)}"
        )
        print(f"reopen gives the same results: {r['reopen_same_results']}")
        ro = r["reopen"]
        print(f"reopen + first query   {ro['median_s'] * 1e3:7.1f} ms median of {len(ro['times_s'])}")
        b = r["durable_batches"]
        print(
            f"durable 1k-row commits {b['median_commit_ms']:7.1f} ms median "
            f"({b['median_batch_rows_per_s']:,.0f} rows/s per commit, {b['rows_per_s']:,.0f} rows/s over "
            f"{b['batches']} commits incl. checkpoints)"
        )
    report["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
