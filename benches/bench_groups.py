"""Grouped search benchmark: kbcore ``search_groups`` against over-fetch + dedup (issue 4).

Run from the repository root::

    python -m benches.bench_groups [--data DIR] [--quick] [--json OUT]

SciFact chunks (19,369 x 384, 5,183 documents) are grouped by document: grouped recall@10
against the exact grouped top 10 (each document scored by its best chunk), nDCG@10 of the
returned documents against the data set's exact ``chunks_exact_maxp_dedup`` value, and
single-thread QPS of ``search_groups`` against an ungrouped kbcore ``search`` and against
"hnswlib k=50 over-fetch, then dedup in Python", with the fraction of full pages (10
documents). A synthetic set of 100,000 vectors (5,000 sources x 20 parts) checks the same
recall bar at scale. See benches/README.md ("Grouped search").
"""

from __future__ import annotations

import os
import sys

# Single-thread BLAS for the ground truth: the timings below are single-thread too.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benches.datasets import scifact_dir  # noqa: E402

K = 10
EF = 64
# ef values tried, ascending, for the equal-quality comparison with the over-fetch anchor
EQUAL_RECALL_EFS = (16, 24, 32, 48, 64)
M = 16
EF_CONSTRUCTION = 200
BUILD_THREADS = 2
OVERFETCH_K = 50
REPEATS = 3
RECALL_BAR = 0.95
NDCG_TOLERANCE = 0.005
QPS_VS_UNGROUPED_BAR = 0.7
QPS_VS_OVERFETCH_BAR = 1.5
TIE_EPS = 1e-6
SYN_DIM = 384
SYN_PARTS = 20
SYN_TOPICS = 500
SYN_SEED = 20240604
# Noise norms (relative to unit vectors) at each level of the synthetic hierarchy.
SYN_SOURCE_NOISE = 0.8  # source centre = topic + noise: ~10 sources per topic, cos ~ 0.6 apart
SYN_PART_NOISE = 0.35  # part = source centre + noise: parts of one source have cos ~ 0.9
SYN_QUERY_NOISE = 0.5  # query = source centre + noise: never a stored part


def log(msg: str = "") -> None:
    print(msg, flush=True)


def _normalise(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


# ----------------------------------------------------------------------------------------------
# data and exact grouped ground truth


class GroupedData:
    """Unit-norm base rows with a source code per row, queries, and the exact grouped truth."""

    def __init__(self, name: str, base: np.ndarray, codes: np.ndarray, keys: list[Any], queries: np.ndarray) -> None:
        self.name = name
        self.base = base  # float32 [n, d], unit rows
        self.codes = codes  # int64 [n], dense source code of each row
        self.keys = keys  # group key (as stored in kbcore) of each code
        self.queries = queries  # float32 [nq, d], unit rows
        self.best = exact_source_scores(base, codes, len(keys), queries)  # float32 [nq, n_sources]
        order = np.argsort(-self.best, axis=1, kind="stable")[:, :K]
        self.gt_codes = order  # exact top-K sources per query, best first
        self.kth = np.take_along_axis(self.best, order[:, K - 1 : K], axis=1)[:, 0]
        self.code_of_key = {k: c for c, k in enumerate(keys)}
        self.key_of_row = [keys[c] for c in codes.tolist()]  # the stored group key of each row
        self.reference_ndcg: float | None = None  # the data set's exact grouped nDCG@10


def exact_source_scores(
    base: np.ndarray, codes: np.ndarray, n_sources: int, queries: np.ndarray, block: int = 16384
) -> np.ndarray:
    """Best (max) cosine of each source per query, over blocks of base rows."""
    best = np.full((queries.shape[0], n_sources), -np.inf, dtype=np.float32)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    for start in range(0, len(order), block):
        rows = order[start : start + block]
        c = sorted_codes[start : start + block]
        scores = queries @ base[rows].T
        # runs of equal codes inside the block: reduce each run with max
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        run_max = np.maximum.reduceat(scores, starts, axis=1)
        run_codes = c[starts]
        np.maximum(best[:, run_codes], run_max, out=run_max)
        best[:, run_codes] = run_max
    return best


def load_scifact(data: str | None) -> tuple[GroupedData, dict[str, set[str]], list[str]]:
    folder = scifact_dir(data)
    base = np.ascontiguousarray(np.load(folder / "chunk_embeddings.npy"), dtype=np.float32)
    queries = np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32)
    with gzip.open(folder / "chunks.jsonl.gz", "rt", encoding="utf-8") as fh:
        doc_of_row = [json.loads(line)["doc_id"] for line in fh]
    if len(doc_of_row) != base.shape[0]:
        raise SystemExit(f"chunks.jsonl.gz has {len(doc_of_row)} rows, embeddings {base.shape[0]}")
    keys = sorted(set(doc_of_row))
    code = {k: i for i, k in enumerate(keys)}
    codes = np.array([code[d] for d in doc_of_row], dtype=np.int64)
    qrels: dict[str, set[str]] = {}
    with open(folder / "qrels.tsv", encoding="utf-8") as fh:
        for line in fh.read().splitlines()[1:]:
            q, d, s = line.split("\t")
            if int(s) > 0:
                qrels.setdefault(q, set()).add(d)
    query_ids = (folder / "query_ids.txt").read_text(encoding="utf-8").split()
    baseline = json.loads((folder / "baseline.json").read_text(encoding="utf-8"))
    ds = GroupedData("scifact", base, codes, keys, queries)
    ds.reference_ndcg = float(baseline["metrics"]["chunks_exact_maxp_dedup"]["nDCG@10"])
    return ds, qrels, query_ids


def make_synthetic(n: int, nq: int, seed: int = SYN_SEED) -> GroupedData:
    """Three-level clusters: topics -> sources (centres) -> SYN_PARTS parts per source.

    Sources are cluster centres, parts are centre + small noise (all L2-normalised); a query is a
    fresh draw around a random source centre, so its source has 20 near parts that would flood
    an ungrouped top-50. Rows are stored in a shuffled order.
    """
    rng = np.random.default_rng(seed)
    d = SYN_DIM
    n_sources = n // SYN_PARTS
    topics = _normalise(rng.standard_normal((SYN_TOPICS, d), dtype=np.float32))
    topic_of = rng.integers(0, SYN_TOPICS, n_sources)
    scale = np.float32(SYN_SOURCE_NOISE / np.sqrt(d))
    centres = topics[topic_of] + rng.standard_normal((n_sources, d), dtype=np.float32) * scale
    centres = _normalise(centres)
    codes = rng.permutation(np.repeat(np.arange(n_sources), SYN_PARTS))
    base = np.empty((len(codes), d), dtype=np.float32)
    for start in range(0, len(codes), 16384):
        c = codes[start : start + 16384]
        noise = rng.standard_normal((len(c), d), dtype=np.float32) * np.float32(SYN_PART_NOISE / d**0.5)
        base[start : start + len(c)] = _normalise(centres[c] + noise)
    qsrc = rng.integers(0, n_sources, nq)
    scale = np.float32(SYN_QUERY_NOISE / np.sqrt(d))
    queries = centres[qsrc] + rng.standard_normal((nq, d), dtype=np.float32) * scale
    queries = _normalise(queries)
    return GroupedData(f"synthetic-{len(codes)}", base, codes.astype(np.int64), list(range(n_sources)), queries)


# ----------------------------------------------------------------------------------------------
# metrics


def grouped_recall(ds: GroupedData, pages: Sequence[Sequence[int]]) -> float:
    """|returned sources whose exact best score reaches the exact 10th| / 10 (tie-aware)."""
    hits = 0
    for qi, page in enumerate(pages):
        codes = np.asarray(page[:K], dtype=np.int64)
        if len(codes):
            hits += int(np.sum(ds.best[qi, codes] >= ds.kth[qi] - TIE_EPS))
    return hits / (K * len(pages))


def ndcg_at_10(ranked_docs: Sequence[Sequence[str]], qrels: dict[str, set[str]], query_ids: Sequence[str]) -> float:
    """BEIR nDCG@10: binary gains from qrels, 1/log2(rank+1), ideal from all relevant docs."""
    total = 0.0
    for qid, docs in zip(query_ids, ranked_docs):
        rel = qrels.get(qid, set())
        dcg = sum(1.0 / np.log2(r + 2) for r, d in enumerate(docs[:K]) if d in rel)
        idcg = sum(1.0 / np.log2(r + 2) for r in range(min(len(rel), K)))
        total += dcg / idcg if idcg > 0 else 0.0
    return total / len(query_ids)


# ----------------------------------------------------------------------------------------------
# timing


def time_loop(fn: Callable[[Any], Any], inputs: Sequence[Any]) -> tuple[float, float, list]:
    """One pass of fn over inputs with gc paused: (wall s, cpu s, outputs)."""
    out: list = [None] * len(inputs)
    gc.disable()
    try:
        c0 = time.process_time()
        t0 = time.perf_counter()
        for i, x in enumerate(inputs):
            out[i] = fn(x)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        gc.enable()
    return wall, cpu, out


def time_interleaved(
    fns: dict[str, Callable[[Any], Any]], inputs: Sequence[Any], repeats: int
) -> tuple[dict[str, dict], dict[str, list]]:
    """Each repetition times every fn once, in turn, so load changes hit them alike.

    Returns per fn: median QPS, latency, all walls and the cpu/wall ratio of the median pass,
    and QPS from the median CPU time (the better estimate when other processes share the
    cores); and the outputs of the last pass.
    """
    walls: dict[str, list[float]] = {name: [] for name in fns}
    cpus: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, list] = {}
    for fn in fns.values():  # warm-up: caches, lazy allocations, the kbcore cost model
        for x in inputs[:20]:
            fn(x)
    for _ in range(repeats):
        for name, fn in fns.items():
            w, c, o = time_loop(fn, inputs)
            walls[name].append(w)
            cpus[name].append(c)
            outs[name] = o
    res = {}
    for name in fns:
        i = sorted(range(repeats), key=walls[name].__getitem__)[repeats // 2]
        res[name] = {
            "qps": len(inputs) / walls[name][i],
            "cpu_qps": len(inputs) / statistics.median(cpus[name]),
            "latency_us": 1e6 * walls[name][i] / len(inputs),
            "walls_s": walls[name],
            "cpu_per_wall": cpus[name][i] / walls[name][i],
        }
    return res, outs


def build_kbcore(ds: GroupedData) -> tuple[Any, float]:
    import pyarrow as pa

    import kbcore

    table = pa.table({"document_id": pa.array(ds.key_of_row)})
    gc.collect()
    t0 = time.perf_counter()
    index = kbcore.Index(ds.base.shape[1], metric="cosine", kind="hnsw", M=M, ef_construction=EF_CONSTRUCTION, ef=EF)
    index.add(ds.base, np.arange(ds.base.shape[0], dtype=np.int64), metadata=table, threads=BUILD_THREADS)
    return index, time.perf_counter() - t0


def build_hnswlib(ds: GroupedData) -> tuple[Any, float]:
    import hnswlib

    gc.collect()
    t0 = time.perf_counter()
    index = hnswlib.Index(space="cosine", dim=ds.base.shape[1])
    index.init_index(max_elements=ds.base.shape[0], M=M, ef_construction=EF_CONSTRUCTION, random_seed=1)
    index.set_num_threads(BUILD_THREADS)
    index.add_items(ds.base, np.arange(ds.base.shape[0]), num_threads=BUILD_THREADS)
    index.set_ef(max(EF, OVERFETCH_K))
    return index, time.perf_counter() - t0


def overfetch_fn(index: Any, key_of_row: Sequence[Any]) -> Callable[[np.ndarray], list]:
    """What a hnswlib user writes today: top-50 chunks, then the first 10 distinct sources.

    Returns [(key, best row, distance, rows of that key among the 50)], like a kbcore Group.
    """

    def one(q: np.ndarray) -> list:
        labels, dist = index.knn_query(q, k=OVERFETCH_K, num_threads=1)
        groups: dict[Any, list] = {}
        for row, d in zip(labels[0].tolist(), dist[0].tolist()):
            key = key_of_row[row]
            g = groups.get(key)
            if g is None:
                if len(groups) < K:
                    groups[key] = [key, row, d, [row]]
            else:
                g[3].append(row)
        return list(groups.values())

    return one


# ----------------------------------------------------------------------------------------------
# the runs


def log_timing(timing: dict[str, dict], nq: int, repeats: int) -> None:
    log(f"  single thread, loop of {nq} 1-D queries, k={K}, ef={EF}, median of {repeats}:")
    for name, r in timing.items():
        log(
            f"    {name:<28} {r['qps']:8.0f} QPS  {r['latency_us']:7.1f} us/query  "
            f"(from CPU time {r['cpu_qps']:6.0f} QPS){cpu_note(r)}"
        )


def ratios(timing: dict[str, dict], a: str, b: str) -> tuple[float, float]:
    """QPS of a over QPS of b: from wall time (the headline) and from CPU time."""
    return timing[a]["qps"] / timing[b]["qps"], timing[a]["cpu_qps"] / timing[b]["cpu_qps"]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def cpu_note(r: dict) -> str:
    c = r["cpu_per_wall"]
    return "" if 0.85 <= c <= 1.3 else f"  (cpu/wall {c:.2f}: contended timing)"


def run_scifact(data: str | None, repeats: int) -> dict:
    log("== SciFact chunks, grouped by document ==")
    t0 = time.perf_counter()
    ds, qrels, query_ids = load_scifact(data)
    n_docs = len(ds.keys)
    log(
        f"  {ds.base.shape[0]:,} chunks of {n_docs:,} documents, {ds.queries.shape[0]} queries, "
        f"exact grouped truth in {time.perf_counter() - t0:.1f} s"
    )
    exact_docs = [[ds.keys[c] for c in row] for row in ds.gt_codes]
    exact_ndcg = ndcg_at_10(exact_docs, qrels, query_ids)
    ref = ds.reference_ndcg
    log(f"  exact grouped nDCG@10 (numpy) {exact_ndcg:.4f}; README chunks_exact_maxp_dedup {ref:.4f}")

    kb, kb_build = build_kbcore(ds)
    log(f"  kbcore build {kb_build:.1f} s ({BUILD_THREADS} threads)")
    hn, hn_build = build_hnswlib(ds)
    log(f"  hnswlib build {hn_build:.1f} s ({BUILD_THREADS} threads)")

    qs = [np.ascontiguousarray(q) for q in ds.queries]
    fns = {
        "kbcore search_groups": lambda q: kb.search_groups(q, K, ef=EF, threads=1),
        "kbcore search (ungrouped)": lambda q: kb.search(q, K, ef=EF, threads=1),
        f"hnswlib k={OVERFETCH_K} + dedup": overfetch_fn(hn, ds.key_of_row),
    }
    timing, outs = time_interleaved(fns, qs, repeats)

    kb_pages = [[g.key for g in groups] for groups in outs["kbcore search_groups"]]
    of_pages = [[g[0] for g in groups] for groups in outs[f"hnswlib k={OVERFETCH_K} + dedup"]]
    code = ds.code_of_key
    res: dict[str, Any] = {
        "n": int(ds.base.shape[0]),
        "sources": n_docs,
        "queries": len(qs),
        "build_s": {"kbcore": kb_build, "hnswlib": hn_build},
        "timing": timing,
        "exact_ndcg10": exact_ndcg,
        "reference_ndcg10": ref,
    }
    res["kbcore_recall"] = grouped_recall(ds, [[code[k] for k in p] for p in kb_pages])
    res["overfetch_recall"] = grouped_recall(ds, [[code[k] for k in p] for p in of_pages])
    res["kbcore_ndcg10"] = ndcg_at_10(kb_pages, qrels, query_ids)
    res["overfetch_ndcg10"] = ndcg_at_10(of_pages, qrels, query_ids)
    res["kbcore_full_pages"] = float(np.mean([len(p) == K for p in kb_pages]))
    res["overfetch_full_pages"] = float(np.mean([len(p) == K for p in of_pages]))
    res["overfetch_mean_page"] = float(np.mean([len(p) for p in of_pages]))
    names = list(fns)
    res["qps_ratio_vs_ungrouped"], res["cpu_qps_ratio_vs_ungrouped"] = ratios(timing, names[0], names[1])
    res["qps_ratio_vs_overfetch"], res["cpu_qps_ratio_vs_overfetch"] = ratios(timing, names[0], names[2])
    # Equal quality: the lowest ef at which search_groups is at least as good as the
    # over-fetch anchor (grouped recall and nDCG@10), timed side by side with it.
    eq = None
    for ef in EQUAL_RECALL_EFS:
        pages = [[g.key for g in kb.search_groups(q, K, ef=ef, threads=1)] for q in qs]
        rec = grouped_recall(ds, [[code[k] for k in p] for p in pages])
        nd = ndcg_at_10(pages, qrels, query_ids)
        log(f"  search_groups ef={ef}: grouped recall {rec:.4f}, nDCG@10 {nd:.4f}")
        if rec >= res["overfetch_recall"] and nd >= res["overfetch_ndcg10"] and rec >= RECALL_BAR:
            eq = {"ef": ef, "recall": rec, "ndcg10": nd}
            break
    if eq is not None:
        eq_fns = {
            f"kbcore search_groups ef={eq['ef']}": lambda q, e=eq["ef"]: kb.search_groups(q, K, ef=e, threads=1),
            names[2]: fns[names[2]],
        }
        eq_timing, _ = time_interleaved(eq_fns, qs, repeats)
        eq["timing"] = eq_timing
        eq["qps_ratio"], eq["cpu_qps_ratio"] = ratios(eq_timing, *list(eq_fns))
    res["equal_quality"] = eq
    res["passes"] = {
        "recall": res["kbcore_recall"] >= RECALL_BAR,
        "ndcg": abs(res["kbcore_ndcg10"] - ref) <= NDCG_TOLERANCE,
        "qps_vs_ungrouped": res["qps_ratio_vs_ungrouped"] >= QPS_VS_UNGROUPED_BAR,
        "qps_vs_overfetch": eq is not None and eq["qps_ratio"] >= QPS_VS_OVERFETCH_BAR,
        "full_pages": res["kbcore_full_pages"] == 1.0,
    }

    log_timing(timing, len(qs), repeats)
    p = res["passes"]
    log(
        f"  grouped recall@10 vs exact grouped truth: kbcore {res['kbcore_recall']:.4f}  "
        f"[{verdict(p['recall'])} >= {RECALL_BAR}]; over-fetch {res['overfetch_recall']:.4f}"
    )
    log(
        f"  nDCG@10 of documents: kbcore {res['kbcore_ndcg10']:.4f} vs README {ref:.4f} "
        f"(diff {res['kbcore_ndcg10'] - ref:+.4f})  [{verdict(p['ndcg'])} within {NDCG_TOLERANCE}]; "
        f"over-fetch {res['overfetch_ndcg10']:.4f}; exact numpy {exact_ndcg:.4f}"
    )
    log(
        f"  QPS search_groups / ungrouped search: {res['qps_ratio_vs_ungrouped']:.2f} "
        f"(CPU time {res['cpu_qps_ratio_vs_ungrouped']:.2f})  "
        f"[{verdict(p['qps_vs_ungrouped'])} >= {QPS_VS_UNGROUPED_BAR}]"
    )
    log(
        f"  QPS search_groups / hnswlib over-fetch + dedup, both at ef={EF}: "
        f"{res['qps_ratio_vs_overfetch']:.2f} (CPU time {res['cpu_qps_ratio_vs_overfetch']:.2f})"
    )
    if eq is None:
        log(
            f"  at equal quality: search_groups never matched the over-fetch's recall and nDCG "
            f"below ef={EQUAL_RECALL_EFS[-1]}  [{verdict(p['qps_vs_overfetch'])}]"
        )
    else:
        log(
            f"  QPS at equal quality, search_groups ef={eq['ef']} (recall {eq['recall']:.4f}, "
            f"nDCG {eq['ndcg10']:.4f}) / over-fetch (recall {res['overfetch_recall']:.4f}, nDCG "
            f"{res['overfetch_ndcg10']:.4f}): {eq['qps_ratio']:.2f} (CPU time {eq['cpu_qps_ratio']:.2f})  "
            f"[{verdict(p['qps_vs_overfetch'])} >= {QPS_VS_OVERFETCH_BAR}]"
        )
    fewer = res["overfetch_full_pages"] < res["kbcore_full_pages"]
    log(
        f"  full pages ({K} documents): kbcore {100 * res['kbcore_full_pages']:.1f} %  "
        f"[{verdict(p['full_pages'])} = 100 %]; over-fetch {100 * res['overfetch_full_pages']:.1f} % "
        f"(mean {res['overfetch_mean_page']:.2f} documents; fills fewer pages: {'yes' if fewer else 'no'})"
    )
    kb = hn = None  # free both indexes (the timing lambdas above close over these names)
    gc.collect()
    return res


def run_synthetic(n: int, nq: int, repeats: int, with_hnswlib: bool) -> dict:
    log(f"== synthetic: {n:,} vectors, {n // SYN_PARTS:,} sources x {SYN_PARTS} parts, d={SYN_DIM} ==")
    t0 = time.perf_counter()
    ds = make_synthetic(n, nq)
    log(f"  data and exact grouped truth in {time.perf_counter() - t0:.1f} s")
    kb, kb_build = build_kbcore(ds)
    log(f"  kbcore build {kb_build:.1f} s ({BUILD_THREADS} threads)")
    qs = [np.ascontiguousarray(q) for q in ds.queries]
    fns: dict[str, Callable[[Any], Any]] = {
        "kbcore search_groups": lambda q: kb.search_groups(q, K, ef=EF, threads=1),
        "kbcore search (ungrouped)": lambda q: kb.search(q, K, ef=EF, threads=1),
    }
    res: dict[str, Any] = {"n": n, "sources": len(ds.keys), "queries": nq, "build_s": {"kbcore": kb_build}}
    hn = None
    if with_hnswlib:
        hn, hn_build = build_hnswlib(ds)
        res["build_s"]["hnswlib"] = hn_build
        log(f"  hnswlib build {hn_build:.1f} s ({BUILD_THREADS} threads)")
        fns[f"hnswlib k={OVERFETCH_K} + dedup"] = overfetch_fn(hn, ds.key_of_row)
    timing, outs = time_interleaved(fns, qs, repeats)
    res["timing"] = timing
    kb_pages = [[g.key for g in groups] for groups in outs["kbcore search_groups"]]
    res["kbcore_recall"] = grouped_recall(ds, kb_pages)
    res["kbcore_full_pages"] = float(np.mean([len(p) == K for p in kb_pages]))
    names = list(fns)
    res["qps_ratio_vs_ungrouped"], res["cpu_qps_ratio_vs_ungrouped"] = ratios(timing, names[0], names[1])
    # For reference: an ungrouped kbcore search deep enough for K whole sources, deduplicated.
    deep = K * SYN_PARTS
    ung_pages = []
    for q in qs:
        ids, _ = kb.search(q, deep, ef=deep, threads=1)
        ung_pages.append(list(dict.fromkeys(ds.codes[ids[ids >= 0]].tolist()))[:K])
    res["deep_overfetch_recall"] = grouped_recall(ds, ung_pages)
    for ef in (128, 256):
        pages = [[g.key for g in kb.search_groups(q, K, ef=ef, threads=1)] for q in qs]
        res[f"kbcore_recall_ef{ef}"] = grouped_recall(ds, pages)
    if hn is not None:
        of_pages = [[g[0] for g in groups] for groups in outs[f"hnswlib k={OVERFETCH_K} + dedup"]]
        res["overfetch_recall"] = grouped_recall(ds, of_pages)
        res["overfetch_full_pages"] = float(np.mean([len(p) == K for p in of_pages]))
        res["overfetch_mean_page"] = float(np.mean([len(p) for p in of_pages]))
        res["qps_ratio_vs_overfetch"], res["cpu_qps_ratio_vs_overfetch"] = ratios(timing, names[0], names[2])
    res["passes"] = {"recall": res["kbcore_recall"] >= RECALL_BAR, "full_pages": res["kbcore_full_pages"] == 1.0}

    log_timing(timing, nq, repeats)
    p = res["passes"]
    log(
        f"  grouped recall@10 vs exact grouped truth: kbcore {res['kbcore_recall']:.4f}  "
        f"[{verdict(p['recall'])} >= {RECALL_BAR}]  (search_groups ef=128 "
        f"{res['kbcore_recall_ef128']:.4f}, ef=256 {res['kbcore_recall_ef256']:.4f}; kbcore search "
        f"k=ef={K * SYN_PARTS} deduplicated {res['deep_overfetch_recall']:.4f})"
    )
    log(
        f"  QPS search_groups / ungrouped search: {res['qps_ratio_vs_ungrouped']:.2f} "
        f"(CPU time {res['cpu_qps_ratio_vs_ungrouped']:.2f})"
    )
    if hn is not None:
        log(
            f"  QPS search_groups / hnswlib over-fetch + dedup: {res['qps_ratio_vs_overfetch']:.2f} "
            f"(CPU time {res['cpu_qps_ratio_vs_overfetch']:.2f})"
        )
        log(
            f"  over-fetch: grouped recall@10 {res['overfetch_recall']:.4f}, full pages "
            f"{100 * res['overfetch_full_pages']:.1f} % (mean {res['overfetch_mean_page']:.2f} sources)"
        )
    log(
        f"  full pages ({K} sources): kbcore {100 * res['kbcore_full_pages']:.1f} %  "
        f"[{verdict(p['full_pages'])} = 100 %]"
    )
    return res


def machine_info() -> dict:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from importlib import metadata

    for dist in ("kbcore", "hnswlib", "numpy"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = "not installed"
    import kbcore

    info["kbcore_simd"] = kbcore.simd_level()
    info["loadavg_start"] = os.getloadavg()
    return info


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.bench_groups", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data", default=None, help="data root holding scifact/ (default $KBCORE_DATA, else ../shared/data)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: synthetic 20,000 vectors and 200 queries, no hnswlib on synthetic",
    )
    ap.add_argument("--n", type=int, default=None, help="synthetic base size (default 100000)")
    ap.add_argument("--nq", type=int, default=None, help="synthetic queries (default 1000)")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--json", default=None, help="write every number here")
    args = ap.parse_args(argv)
    n = args.n or (20_000 if args.quick else 100_000)
    nq = args.nq or (200 if args.quick else 1000)
    t0 = time.perf_counter()
    info = machine_info()
    log(
        f"kbcore {info['kbcore']} ({info['kbcore_simd']}), hnswlib {info['hnswlib']}, "
        f"{info.get('cpu', '?')}, {info['cpus']} cpus, load {info['loadavg_start'][0]:.2f}"
    )
    results: dict[str, Any] = {"machine": info, "k": K, "ef": EF, "M": M, "ef_construction": EF_CONSTRUCTION}
    if (scifact_dir(args.data) / "chunk_embeddings.npy").exists():
        results["scifact"] = run_scifact(args.data, args.repeats)
    else:
        log(f"SciFact not found under {scifact_dir(args.data)}: skipped")
    results["synthetic"] = run_synthetic(n, nq, args.repeats, with_hnswlib=not args.quick)
    info["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - t0
    passes = {
        f"{ds}.{k}": v for ds in ("scifact", "synthetic") if ds in results for k, v in results[ds]["passes"].items()
    }
    failed = [k for k, v in passes.items() if not v]
    log(
        f"== {len(passes) - len(failed)}/{len(passes)} bars met"
        + (f"; missed: {', '.join(failed)}" if failed else "")
        + f"; {results['seconds']:.0f} s, load {info['loadavg_end'][0]:.2f} at the end =="
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
