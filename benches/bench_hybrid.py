"""Hybrid search on SciFact: native BM25 against bm25s, RRF / linear fusion, speed.

Run from the repository root with kbcore and bm25s installed (``pip install ".[bench]"``)::

    python -m benches.bench_hybrid [--data DIR] [--repeats 3] [--json OUT]

What it measures (issue 8), documents = ``title + " " + text``, 300 BEIR test queries:

a. **BM25 alone**, nDCG@10: kbcore ``Index.search_text`` against bm25s (``method="lucene"``,
   k1 = 1.2, b = 0.75) fed the very same tokens (``kbcore.tokenize`` of every document and
   query; query terms de-duplicated, as kbcore counts a repeated query term once). Gate: the
   two nDCG@10 agree within 0.01. The per-query score agreement is printed too (bm25s's Lucene
   variant drops the constant (k1 + 1) factor, so its scores are kbcore's / 2.2). bm25s with its
   own tokenizer and English stop words is reported for orientation (BEIR BM25: 0.665).
b. **Hybrid**, nDCG@10: RRF (k = 60, 1-based ranks) of the dense leg (``Index.search`` over the
   document embeddings, flat and HNSW) and the BM25 leg, each over a window of
   max(4 x top_k, 50) candidates. Gate: >= max(dense-only, BM25-only). Linear fusion of min-max
   normalised scores (vector_weight 0.7, and a small sweep) is reported alongside, and the same
   fusions over chunks (deduplicated to documents after fusion) for orientation.
c. **BM25 speed**: single-query QPS, one query per call on one thread: kbcore ``search_text``
   (tokenization included) against bm25s ``retrieve`` (pre-tokenized queries, ``n_threads=0``).
   Gate: ratio >= 1.0. Index build throughput in documents/s from raw text, tokenization
   included: kbcore ``Index.add(..., texts=...)`` (a flat index, so the vector part is a copy)
   against bm25s (``bm25s.tokenize`` + ``index``, and ``kbcore.tokenize`` + ``index``; the faster
   one is the bar). Gate: ratio >= 1.0.
d. **Hybrid latency** at top_k = 10 against dense-only latency, both legs through kbcore:
   ``search`` (window) + ``search_text`` (window) + RRF in Python, against one ``search(k=10)``.
   Gate: <= 1.5x. The parts are timed separately, and a variant that runs the text leg on a
   worker thread while the dense leg runs (both release the GIL) is reported for orientation.

Timings are medians of ``--repeats`` runs with the GC paused. Nothing asserts: the script
prints PASS/FAIL per gate. On a shared 2-core machine wall-clock numbers are noisy.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benches.common import ndcg_at_10, read_scifact
from benches.datasets import scifact_dir

TOP_K = 10
WINDOW = max(4 * TOP_K, 50)
RRF_K = 60
DENSE_BASELINE = 0.6451  # baseline.json: documents, exact cosine
BEIR_BM25 = 0.665


# ----------------------------------------------------------------------------------------
# data and metric


def load(folder: Path) -> dict:
    docs, chunks, queries, qrels = read_scifact(folder)
    return {
        "doc_ids": [d["id"] for d in docs],
        "doc_texts": [d["title"] + " " + d["text"] for d in docs],
        "chunks": chunks,
        "query_ids": [q["id"] for q in queries],
        "query_texts": [q["text"] for q in queries],
        "qrels": qrels,
        "doc_emb": np.ascontiguousarray(np.load(folder / "doc_embeddings.npy"), dtype=np.float32),
        "chunk_emb": np.ascontiguousarray(np.load(folder / "chunk_embeddings.npy"), dtype=np.float32),
        "query_emb": np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32),
    }


def dedup_keep_order(keys: Sequence[str], n: int) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for key in keys:
        if key not in seen:
            seen.add(key)
            out.append(key)
            if len(out) == n:
                break
    return out


# ----------------------------------------------------------------------------------------
# timing


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    """Median wall seconds of ``repeats`` calls (GC paused), all runs, the last result."""
    runs = []
    out = None
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            out = fn()
            runs.append(time.perf_counter() - t0)
        finally:
            gc.enable()
    return statistics.median(runs), runs, out


def log(msg: str = "") -> None:
    print(msg, flush=True)


def gate(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ----------------------------------------------------------------------------------------
# kbcore legs


def build_kbcore(vectors: np.ndarray, texts: list[str] | None, kind: str, threads: int = 0):
    import kbcore

    index = kbcore.Index(dim=vectors.shape[1], metric="cosine", kind=kind, M=16, ef_construction=200)
    index.add(vectors, np.arange(len(vectors), dtype=np.int64), texts=texts, threads=threads)
    return index


def dense_leg(index, qvec: np.ndarray, k: int) -> list[tuple[int, float]]:
    ids, dist = index.search(qvec, k=k, threads=1)
    ids_l = ids.tolist()
    sims = (1.0 - dist).tolist()  # cosine similarity, higher is better
    if ids_l and ids_l[-1] == -1:
        return [(i, s) for i, s in zip(ids_l, sims) if i != -1]
    return list(zip(ids_l, sims))


def text_leg(index, query: str, k: int) -> list[tuple[int, float]]:
    ids, scores = index.search_text(query, k)
    return list(zip(ids.tolist(), scores.tolist()))


def hybrid_rrf(index, qvec: np.ndarray, query: str, top_k: int = TOP_K) -> list[tuple[int, float]]:
    """What a hybrid retrieve does natively plus in Python: two windowed legs, RRF, [0, 1]."""
    from kbcore.fusion import normalize_rrf, rrf

    window = max(4 * top_k, 50)
    legs = [dense_leg(index, qvec, window), text_leg(index, query, window)]
    return normalize_rrf(rrf(legs, k=RRF_K)[:top_k], 2, k=RRF_K)


# ----------------------------------------------------------------------------------------
# (a) BM25 quality


def bench_bm25_quality(data: dict, kb_index, results: dict) -> None:
    import bm25s

    import kbcore

    doc_ids, qids, qrels = data["doc_ids"], data["query_ids"], data["qrels"]
    qtexts = data["query_texts"]

    kb_ranked = []
    kb_scores = []
    for q in qtexts:
        ids, scores = kb_index.search_text(q, TOP_K)
        kb_ranked.append([doc_ids[i] for i in ids.tolist()])
        kb_scores.append((ids, scores))
    nd_kb = ndcg_at_10(kb_ranked, qids, qrels)

    corpus_tokens = [kbcore.tokenize(t) for t in data["doc_texts"]]
    retr = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retr.index(corpus_tokens, show_progress=False)
    q_tokens = [list(dict.fromkeys(kbcore.tokenize(q))) for q in qtexts]
    bm_ranked = []
    max_rel_diff = 0.0
    same_top10 = 0
    for (kb_ids, kb_sc), toks in zip(kb_scores, q_tokens):
        idx, sc = retr.retrieve([toks], k=TOP_K, show_progress=False, n_threads=0)
        idx, sc = idx[0], sc[0]
        keep = sc > 0  # bm25s returns zero-score rows when fewer than k match
        idx, sc = idx[keep], sc[keep]
        bm_ranked.append([doc_ids[i] for i in idx.tolist()])
        # compare kbcore's scores to bm25s's full score vector for the same documents
        full = retr.get_scores(toks) if toks else np.zeros(len(doc_ids))
        if len(kb_ids):
            ref = full[kb_ids] * 2.2  # bm25s lucene omits the (k1 + 1) factor
            max_rel_diff = max(max_rel_diff, float(np.max(np.abs(kb_sc - ref) / np.maximum(ref, 1e-9))))
        same_top10 += set(kb_ids.tolist()) == set(idx.tolist())
    nd_bm = ndcg_at_10(bm_ranked, qids, qrels)

    # bm25s with its own tokenizer (regex \w\w+, lower-case) and English stop words
    own_corpus = bm25s.tokenize(data["doc_texts"], stopwords="en", show_progress=False)
    own = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    own.index(own_corpus, show_progress=False)
    own_q = bm25s.tokenize(qtexts, stopwords="en", show_progress=False)
    idx, sc = own.retrieve(own_q, k=TOP_K, show_progress=False, n_threads=0)
    own_ranked = [[doc_ids[i] for i, s in zip(r, srow) if s > 0] for r, srow in zip(idx.tolist(), sc.tolist())]
    nd_own = ndcg_at_10(own_ranked, qids, qrels)

    diff = abs(nd_kb - nd_bm)
    results["bm25"] = {
        "kbcore_ndcg10": nd_kb,
        "bm25s_same_tokens_ndcg10": nd_bm,
        "abs_diff": diff,
        "gate_within_0.01": diff <= 0.01,
        "max_rel_score_diff_vs_bm25s": max_rel_diff,
        "queries_with_identical_top10_sets": same_top10,
        "bm25s_own_tokenizer_en_stopwords_ndcg10": nd_own,
        "beir_bm25_reference": BEIR_BM25,
    }
    log("(a) BM25 alone over documents, nDCG@10")
    log(f"    kbcore search_text                       {nd_kb:.4f}")
    log(f"    bm25s lucene, same kbcore tokens         {nd_bm:.4f}   |diff| {diff:.4f}  [{gate(diff <= 0.01)} <= 0.01]")
    log(
        f"    score agreement: max rel diff {max_rel_diff:.2e}; identical top-10 sets "
        f"{same_top10}/{len(qtexts)} queries"
    )
    log(f"    bm25s own tokenizer + English stop words {nd_own:.4f}   (BEIR BM25 {BEIR_BM25})")


# ----------------------------------------------------------------------------------------
# (b) hybrid quality


def bench_hybrid_quality(data: dict, indexes: dict, results: dict) -> None:
    from kbcore.fusion import linear, rrf

    doc_ids, qids, qrels = data["doc_ids"], data["query_ids"], data["qrels"]
    qtexts, qemb = data["query_texts"], data["query_emb"]
    nd_bm25 = results["bm25"]["kbcore_ndcg10"]
    out: dict = {"window": WINDOW, "rrf_k": RRF_K}
    log(f"(b) hybrid over documents, nDCG@10 (window {WINDOW} per leg, RRF k = {RRF_K})")
    text_legs = [text_leg(indexes["flat"], q, WINDOW) for q in qtexts]
    for kind, index in indexes.items():
        dense = [dense_leg(index, qemb[i], WINDOW) for i in range(len(qtexts))]
        nd_dense = ndcg_at_10([[doc_ids[i] for i, _ in leg[:TOP_K]] for leg in dense], qids, qrels)
        fused_rrf = [rrf([d, t], k=RRF_K) for d, t in zip(dense, text_legs)]
        nd_rrf = ndcg_at_10([[doc_ids[i] for i, _ in f[:TOP_K]] for f in fused_rrf], qids, qrels)
        linear_scores = {}
        for w in (0.3, 0.5, 0.7, 0.8, 0.9):
            fused = [linear(d, t, vector_weight=w) for d, t in zip(dense, text_legs)]
            linear_scores[w] = ndcg_at_10([[doc_ids[i] for i, _ in f[:TOP_K]] for f in fused], qids, qrels)
        bar = max(nd_dense, nd_bm25, DENSE_BASELINE)
        out[kind] = {
            "dense_ndcg10": nd_dense,
            "bm25_ndcg10": nd_bm25,
            "rrf_ndcg10": nd_rrf,
            "linear_ndcg10": {str(w): v for w, v in linear_scores.items()},
            "gate_rrf_ge_max": nd_rrf >= bar,
        }
        lin = "  ".join(f"w={w}: {v:.4f}" for w, v in linear_scores.items())
        log(
            f"    [{kind}] dense {nd_dense:.4f}  BM25 {nd_bm25:.4f}  RRF {nd_rrf:.4f}  "
            f"[{gate(nd_rrf >= bar)} >= {bar:.4f}]"
        )
        log(f"    [{kind}] linear (vector_weight) {lin}")
    results["hybrid"] = out


def bench_hybrid_chunks(data: dict, results: dict) -> None:
    """Chunk-level fusion, deduplicated to documents after fusion (orientation only)."""
    from kbcore.fusion import linear, rrf

    chunks = data["chunks"]
    chunk_doc = [c["doc_id"] for c in chunks]
    qids, qrels, qtexts, qemb = data["query_ids"], data["qrels"], data["query_texts"], data["query_emb"]
    index = build_kbcore(data["chunk_emb"], [c["text"] for c in chunks], "flat")
    window = 4 * WINDOW  # chunks: ~3.7 per document, so a wider window still yields 10 documents
    dense = [dense_leg(index, qemb[i], window) for i in range(len(qtexts))]
    text = [text_leg(index, q, window) for q in qtexts]

    def ranked(legs: list[list[tuple[int, float]]]) -> list[list[str]]:
        return [dedup_keep_order([chunk_doc[i] for i, _ in leg], TOP_K) for leg in legs]

    res = {
        "window": window,
        "dense_maxp_ndcg10": ndcg_at_10(ranked(dense), qids, qrels),
        "bm25_maxp_ndcg10": ndcg_at_10(ranked(text), qids, qrels),
        "rrf_ndcg10": ndcg_at_10(ranked([rrf([d, t], k=RRF_K) for d, t in zip(dense, text)]), qids, qrels),
        "linear_0.7_ndcg10": ndcg_at_10(ranked([linear(d, t, 0.7) for d, t in zip(dense, text)]), qids, qrels),
    }
    results["hybrid_chunks"] = res
    log(
        f"    [chunks, flat, window {window}, dedup after fusion] dense {res['dense_maxp_ndcg10']:.4f}  "
        f"BM25 {res['bm25_maxp_ndcg10']:.4f}  RRF {res['rrf_ndcg10']:.4f}  "
        f"linear 0.7 {res['linear_0.7_ndcg10']:.4f}  (exact dense chunks baseline 0.6694)"
    )


# ----------------------------------------------------------------------------------------
# (c) BM25 speed


def bench_bm25_speed(data: dict, kb_index, repeats: int, results: dict) -> None:
    import bm25s

    import kbcore

    qtexts = data["query_texts"]
    texts = data["doc_texts"]
    n_docs, nq = len(texts), len(qtexts)

    def kb_queries() -> None:
        search = kb_index.search_text
        for q in qtexts:
            search(q, TOP_K)

    corpus_tokens = [kbcore.tokenize(t) for t in texts]
    retr = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    retr.index(corpus_tokens, show_progress=False)
    q_tokens = [list(dict.fromkeys(kbcore.tokenize(q))) for q in qtexts]

    def bm_queries() -> None:
        retrieve = retr.retrieve
        for toks in q_tokens:
            retrieve([toks], k=TOP_K, show_progress=False, n_threads=0)

    kb_queries()  # warm caches and the thread-local accumulator
    bm_queries()
    t_kb, runs_kb, _ = timed(kb_queries, repeats)
    t_bm, runs_bm, _ = timed(bm_queries, repeats)
    qps_kb, qps_bm = nq / t_kb, nq / t_bm

    # build throughput from raw text, tokenization included
    vecs = data["doc_emb"]
    ids = np.arange(n_docs, dtype=np.int64)

    def kb_build() -> None:
        index = kbcore.Index(dim=vecs.shape[1], metric="cosine", kind="flat")
        index.add(vecs, ids, texts=texts, threads=1)

    def kb_build_vectors_only() -> None:
        index = kbcore.Index(dim=vecs.shape[1], metric="cosine", kind="flat")
        index.add(vecs, ids, threads=1)

    def bm_build_own() -> None:
        toks = bm25s.tokenize(texts, stopwords="en", show_progress=False)
        bm25s.BM25(method="lucene", k1=1.2, b=0.75).index(toks, show_progress=False)

    def bm_build_kbtokens() -> None:
        toks = [kbcore.tokenize(t) for t in texts]
        bm25s.BM25(method="lucene", k1=1.2, b=0.75).index(toks, show_progress=False)

    t_kb_build, runs_kb_build, _ = timed(kb_build, repeats)
    t_kb_vec, _, _ = timed(kb_build_vectors_only, repeats)
    t_bm_own, runs_bm_own, _ = timed(bm_build_own, repeats)
    t_bm_kbt, runs_bm_kbt, _ = timed(bm_build_kbtokens, repeats)
    t_bm_best = min(t_bm_own, t_bm_kbt)
    build_ratio = t_bm_best / t_kb_build
    qps_ratio = qps_kb / qps_bm
    results["bm25_speed"] = {
        "queries": nq,
        "kbcore_qps": qps_kb,
        "bm25s_qps": qps_bm,
        "qps_ratio": qps_ratio,
        "gate_qps_ratio_ge_1": qps_ratio >= 1.0,
        "kbcore_query_runs_s": runs_kb,
        "bm25s_query_runs_s": runs_bm,
        "docs": n_docs,
        "kbcore_build_docs_per_s": n_docs / t_kb_build,
        "kbcore_vectors_only_add_s": t_kb_vec,
        "bm25s_build_own_tokenizer_docs_per_s": n_docs / t_bm_own,
        "bm25s_build_kbcore_tokens_docs_per_s": n_docs / t_bm_kbt,
        "build_ratio_vs_faster_bm25s": build_ratio,
        "gate_build_ratio_ge_1": build_ratio >= 1.0,
        "kbcore_build_runs_s": runs_kb_build,
        "bm25s_build_own_runs_s": runs_bm_own,
        "bm25s_build_kbtokens_runs_s": runs_bm_kbt,
    }
    log("(c) BM25 speed (one thread)")
    log(
        f"    single-query QPS: kbcore {qps_kb:,.0f}  bm25s {qps_bm:,.0f}  ratio {qps_ratio:.1f}x  "
        f"[{gate(qps_ratio >= 1.0)} >= 1.0]"
    )
    log(
        f"    build docs/s: kbcore {n_docs / t_kb_build:,.0f} (vectors-only add {t_kb_vec * 1e3:.1f} ms)  "
        f"bm25s own tokenizer {n_docs / t_bm_own:,.0f}  bm25s + kbcore.tokenize {n_docs / t_bm_kbt:,.0f}  "
        f"ratio vs faster {build_ratio:.1f}x  [{gate(build_ratio >= 1.0)} >= 1.0]"
    )


# ----------------------------------------------------------------------------------------
# (d) hybrid latency


def bench_latency(data: dict, indexes: dict, repeats: int, results: dict) -> None:
    from kbcore.fusion import normalize_rrf, rrf

    qtexts, qemb = data["query_texts"], data["query_emb"]
    rows = [qemb[i] for i in range(len(qtexts))]  # 1-D views made before the timer
    nq = len(qtexts)
    out: dict = {}
    log(f"(d) latency per query at top_k = {TOP_K}, one thread (mean over {nq} queries)")
    for kind, index in indexes.items():

        def dense_only(index=index) -> None:
            search = index.search
            for v in rows:
                search(v, k=TOP_K, threads=1)

        def hybrid(index=index) -> None:
            for v, q in zip(rows, qtexts):
                hybrid_rrf(index, v, q, TOP_K)

        def text_only(index=index) -> None:
            search_text = index.search_text
            for q in qtexts:
                search_text(q, WINDOW)

        fixed_legs = [[dense_leg(index, v, WINDOW), text_leg(index, q, WINDOW)] for v, q in zip(rows, qtexts)]

        def dense_window(index=index) -> None:
            search = index.search
            for v in rows:
                search(v, k=WINDOW, threads=1)

        def fusion_only(fixed_legs=fixed_legs) -> None:
            for legs in fixed_legs:
                normalize_rrf(rrf(legs, k=RRF_K)[:TOP_K], 2, k=RRF_K)

        def hybrid_two_threads(index=index) -> None:
            # Both native calls release the GIL: the text leg runs on a worker meanwhile.
            submit = pool.submit
            for v, q in zip(rows, qtexts):
                fut = submit(text_leg, index, q, WINDOW)
                legs = [dense_leg(index, v, WINDOW), fut.result()]
                normalize_rrf(rrf(legs, k=RRF_K)[:TOP_K], 2, k=RRF_K)

        timings = {}
        with ThreadPoolExecutor(max_workers=1) as pool:
            for name, fn in (
                ("dense", dense_only),
                ("hybrid", hybrid),
                ("dense_window", dense_window),
                ("text_window", text_only),
                ("fusion", fusion_only),
                ("hybrid_two_threads", hybrid_two_threads),
            ):
                fn()  # warm up
                timings[name] = timed(fn, repeats)
        us = {name: t[0] / nq * 1e6 for name, t in timings.items()}
        ratio = us["hybrid"] / us["dense"]
        out[kind] = {
            "dense_us": us["dense"],
            "hybrid_rrf_us": us["hybrid"],
            "dense_window_us": us["dense_window"],
            "text_window_us": us["text_window"],
            "fusion_us": us["fusion"],
            "hybrid_rrf_two_threads_us": us["hybrid_two_threads"],
            "ratio": ratio,
            "ratio_two_threads": us["hybrid_two_threads"] / us["dense"],
            "gate_ratio_le_1.5": ratio <= 1.5,
            "runs_s": {name: t[1] for name, t in timings.items()},
        }
        log(
            f"    [{kind}] dense search(k={TOP_K}) {us['dense']:.0f} us   hybrid RRF {us['hybrid']:.0f} us  "
            f"ratio {ratio:.2f}x  [{gate(ratio <= 1.5)} <= 1.5]"
        )
        log(
            f"    [{kind}]   parts: search(k={WINDOW}) {us['dense_window']:.0f} us + search_text(k={WINDOW}) "
            f"{us['text_window']:.0f} us + RRF in Python {us['fusion']:.0f} us; legs on two threads "
            f"{us['hybrid_two_threads']:.0f} us ({us['hybrid_two_threads'] / us['dense']:.2f}x)"
        )
    results["latency"] = out


# ----------------------------------------------------------------------------------------


def machine_info() -> dict:
    import bm25s

    import kbcore

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kbcore": kbcore.__version__,
        "simd_level": kbcore.simd_level(),
        "bm25s": getattr(bm25s, "__version__", "?"),
        "numpy": np.__version__,
        "loadavg_start": os.getloadavg(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--data", help="data root holding scifact/ (or the scifact folder); default $KBCORE_DATA, else ../shared/data"
    )
    p.add_argument("--repeats", type=int, default=3, help="timing repetitions (median)")
    p.add_argument("--no-chunks", action="store_true", help="skip the chunk-level fusion run")
    p.add_argument("--json", help="write every number to this file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    folder = scifact_dir(args.data)
    if not (folder / "documents.jsonl.gz").exists():
        log(f"SciFact not found under {folder}; pass --data or set KBCORE_DATA")
        return 2
    t_start = time.perf_counter()
    info = machine_info()
    log(
        f"kbcore {info['kbcore']} ({info['simd_level']}), bm25s {info['bm25s']}, {info['cpu']}, "
        f"{info['cores']} cores, load {info['loadavg_start'][0]:.2f}"
    )
    data = load(folder)
    log(
        f"SciFact: {len(data['doc_ids'])} documents, {len(data['chunks'])} chunks, "
        f"{len(data['query_ids'])} queries; top_k {TOP_K}, window {WINDOW}"
    )
    results: dict = {"machine": info, "repeats": args.repeats}

    indexes = {
        "flat": build_kbcore(data["doc_emb"], data["doc_texts"], "flat"),
        "hnsw": build_kbcore(data["doc_emb"], data["doc_texts"], "hnsw", threads=2),
    }
    bench_bm25_quality(data, indexes["flat"], results)
    bench_hybrid_quality(data, indexes, results)
    if not args.no_chunks:
        bench_hybrid_chunks(data, results)
    bench_bm25_speed(data, indexes["flat"], args.repeats, results)
    bench_latency(data, indexes, args.repeats, results)

    info["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - t_start
    gates = {
        "bm25 nDCG@10 within 0.01 of bm25s": results["bm25"]["gate_within_0.01"],
        "hybrid RRF nDCG@10 >= max(dense, BM25) [flat]": results["hybrid"]["flat"]["gate_rrf_ge_max"],
        "hybrid RRF nDCG@10 >= max(dense, BM25) [hnsw]": results["hybrid"]["hnsw"]["gate_rrf_ge_max"],
        "BM25 QPS >= 1.0x bm25s": results["bm25_speed"]["gate_qps_ratio_ge_1"],
        "BM25 build >= 1.0x bm25s": results["bm25_speed"]["gate_build_ratio_ge_1"],
        "hybrid latency <= 1.5x dense [flat]": results["latency"]["flat"]["gate_ratio_le_1.5"],
        "hybrid latency <= 1.5x dense [hnsw]": results["latency"]["hnsw"]["gate_ratio_le_1.5"],
    }
    results["gates"] = gates
    log("gates:")
    for name, ok in gates.items():
        log(f"    {gate(ok)}  {name}")
    log(f"done in {results['seconds']:.0f} s (load {info['loadavg_end'][0]:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
