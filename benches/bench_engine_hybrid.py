"""Hybrid retrieval through the knowledge engine on SciFact: latency and nDCG@10 per search type.

Run from the repository root with kbcore installed::

    python -m benches.bench_engine_hybrid [--data DIR] [--rounds 3] [--index hnsw|flat] [--json OUT]

What it measures (issue 8, engine side):

1. **Latency** of ``kb.retrieve(query_text, top_k=10, search_type=...)`` for ``vector``,
   ``hybrid`` (RRF and linear) and ``full_text``, single thread, medians over ``--rounds`` x 300
   queries with the GC paused, the search types interleaved per query so that machine noise hits
   them alike. Knowledge base A embeds the queries itself: the SciFact chunk texts ingested with
   ``ingest_table`` and vectors from the built-in ``HashingEmbedder`` (the query embedding is part
   of every vector and hybrid retrieve, as a server sees it). Knowledge base B holds the provided
   chunk embeddings, and the query's provided embedding is passed as ``query_vector=`` (no
   embedding cost: the search and fusion alone). Gate: hybrid <= 1.5 x vector, with and without
   ``deduplicate=True``.
2. **nDCG@10 of documents** through the engine with the provided embeddings: document level
   (one row per document: dense 0.6451 exact) and chunk level with ``deduplicate=True`` (dense
   0.6694 exact), for vector, full_text, hybrid RRF and hybrid linear (vector_weight 0.7).
   Gate (issue 8): hybrid RRF >= max(vector, full_text).

Nothing asserts: the script prints PASS/FAIL per gate. Wall-clock timings on a shared 2-core
machine are noisy; compare runs on a quiet machine.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benches.bench_engine import load, ndcg_at_10, parse_scifact_args

TOP_K = 10
MODES = [("vector", "rrf"), ("hybrid", "rrf"), ("hybrid", "linear"), ("full_text", "rrf")]


def _label(mode: tuple[str, str]) -> str:
    return mode[0] if mode[0] != "hybrid" else f"hybrid-{mode[1]}"


def latency(kb, texts: list[str], vectors: np.ndarray | None, *, deduplicate: bool, rounds: int) -> dict:
    """Median retrieve time per search type (us), interleaved per query."""
    times: dict[str, list[float]] = {_label(m): [] for m in MODES}
    for i, t in enumerate(texts[:20]):  # warm-up
        for st, fu in MODES:
            kb.retrieve(
                t,
                TOP_K,
                search_type=st,
                fusion=fu,
                deduplicate=deduplicate,
                query_vector=None if vectors is None else vectors[i],
            )
    gc.disable()
    try:
        for _ in range(rounds):
            for i, t in enumerate(texts):
                qv = None if vectors is None else vectors[i]
                for st, fu in MODES:
                    t0 = time.perf_counter()
                    kb.retrieve(t, TOP_K, search_type=st, fusion=fu, deduplicate=deduplicate, query_vector=qv)
                    times[_label((st, fu))].append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def embed_time(embedder, texts: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        for t in texts:
            t0 = time.perf_counter()
            embedder.embed([t])
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def quality(kb, data: dict, *, deduplicate: bool) -> dict:
    out = {}
    for st, fu in MODES:
        ranked = [
            [
                h.document_id
                for h in kb.retrieve(
                    q["text"], TOP_K, search_type=st, fusion=fu, deduplicate=deduplicate, query_vector=v
                )
            ]
            for q, v in zip(data["queries"], data["Q"])
        ]
        out[_label((st, fu))] = ndcg_at_10(ranked, data["queries"], data["qrels"])
    return out


def run(data: dict, kind: str, rounds: int) -> dict:
    from kbcore.embedders import HashingEmbedder
    from kbcore.engine import Engine

    texts = [q["text"] for q in data["queries"]]
    out: dict = {"index": kind}
    with tempfile.TemporaryDirectory(prefix="kbcore-bench-") as tmp:
        engine = Engine(tmp)
        # A: the built-in embedder over the chunk texts; text queries embedded per retrieve
        emb = HashingEmbedder()
        chunk_texts = data["chunk_table"].column("text").to_pylist()
        t0 = time.perf_counter()
        vecs = emb.embed(chunk_texts)
        t_embed = time.perf_counter() - t0
        kb = engine.create_knowledge_base("hashing", index=kind, embedder=emb)
        t0 = time.perf_counter()
        kb.ingest_table(data["chunk_table"], vectors=vecs)
        t_ingest = time.perf_counter() - t0
        # Ingest returns before HNSW linking ends (it goes on in a background thread, which
        # would compete for the cores and leave rows to the exact scan): time searches after it.
        kb.wait_until_indexed()
        out["hashing_kb"] = {
            "chunks": len(vecs),
            "embed_seconds": t_embed,
            "ingest_seconds": t_ingest,
            "query_embed_us": embed_time(emb, texts, 1),
        }
        for dedup in (False, True):
            out["hashing_kb"]["latency_dedup" if dedup else "latency"] = latency(
                kb, texts, None, deduplicate=dedup, rounds=rounds
            )
        # B: the provided embeddings; the query vector is given
        kbc = engine.create_knowledge_base("chunks", embedder=False, index=kind)
        t0 = time.perf_counter()
        kbc.ingest_table(data["chunk_table"], vectors=data["C"])
        dt = time.perf_counter() - t0
        kbc.wait_until_indexed()
        out["provided_kb"] = {
            "chunks": len(data["C"]),
            "ingest_seconds": dt,
            "ingest_chunks_per_s": len(data["C"]) / dt,
        }
        for dedup in (False, True):
            out["provided_kb"]["latency_dedup" if dedup else "latency"] = latency(
                kbc, texts, data["Q"], deduplicate=dedup, rounds=rounds
            )
        out["ndcg10_chunks_dedup"] = quality(kbc, data, deduplicate=True)
        kbd = engine.create_knowledge_base("docs", embedder=False, index=kind)
        kbd.ingest_table(data["doc_table"], vectors=data["D"])
        kbd.wait_until_indexed()
        out["ndcg10_documents"] = quality(kbd, data, deduplicate=False)
        engine.close()
    return out


def gate(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parsed = parse_scifact_args(
        argv, __doc__.split("\n\n")[0], ("hnsw", "flat"), "hnsw", "rounds of the 300 queries for the latency timing"
    )
    if parsed is None:
        return 2
    args, folder = parsed
    import kbcore

    data = load(folder)
    report = {
        "kbcore": kbcore.__version__,
        "simd": kbcore.simd_level(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    r = run(data, args.index, args.rounds)
    report["run"] = r
    report["loadavg_end"] = os.getloadavg()
    print(f"== index={args.index}, top_k={TOP_K}, median retrieve latency (us), single thread ==")
    h = r["hashing_kb"]
    print(f"A: HashingEmbedder KB ({h['chunks']} chunks); query embedding alone {h['query_embed_us']:.1f} us")
    for name, kb in (("A", r["hashing_kb"]), ("B", r["provided_kb"])):
        for key in ("latency", "latency_dedup"):
            lat = kb[key]
            cells = "  ".join(f"{k} {v:7.1f}" for k, v in lat.items())
            ratio = lat["hybrid-rrf"] / lat["vector"]
            ratio_lin = lat["hybrid-linear"] / lat["vector"]
            dd = "dedup " if key == "latency_dedup" else "plain "
            print(
                f"{name} {dd} {cells}   hybrid/vector {ratio:.2f}x (linear {ratio_lin:.2f}x)  "
                f"{gate(max(ratio, ratio_lin) <= 1.5)}"
            )
    print(
        f"B: provided-embedding KB, pre-embedded ingest with the text leg: "
        f"{r['provided_kb']['ingest_chunks_per_s']:,.0f} chunks/s"
    )
    for key, base in (("ndcg10_documents", 0.6451), ("ndcg10_chunks_dedup", 0.6694)):
        q = r[key]
        cells = "  ".join(f"{k} {v:.4f}" for k, v in q.items())
        print(
            f"nDCG@10 {key[7:]:<13} {cells}  (dense exact {base})  "
            f"{gate(q['hybrid-rrf'] >= max(q['vector'], q['full_text']))}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
