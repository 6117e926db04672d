"""Side-by-side benchmark of filtered search: kbcore against hnswlib, faiss, Qdrant Edge, usearch and numpy
(issues 3 and 28).

Run from the repository root::

    python -m benches.bench_filter [--data DIR] [--n 100000] [--quick] [--json OUT]
                                   [--datasets scifact,synthetic] [--libs kbcore,hnswlib,faiss,numpy]
    python -m benches.bench_filter --libs kbcore-sq8,kbcore-rabitq,hnswlib,faiss,qdrant-edge,qdrant-edge-acorn,numpy

``qdrant-edge`` / ``qdrant-edge-acorn`` (``pip install "qdrant-edge-py>=0.9,<0.10"``): Qdrant's
in-process shard with payload indexes, ``payload_m``, int8 + rescore, and ACORN in the second;
see :class:`QdrantEdgeLib` for the path and its limits. A library that is not installed is
reported as skipped.

Every row gets an int ``bucket`` (uniform in [0, 1000)), a str ``tag`` (skewed) and a locality
field (``cluster`` for synthetic data, ``far_rank`` for SciFact) that makes an anti-correlated
filter: the passing rows lie far from every query. For each filter the exact top-10 among passing
rows is computed with numpy, and each library is measured on one thread over a loop of single 1-D
queries (median of 3). Every library sweeps ef until recall@10 >= 0.95 (kbcore with its automatic
strategy) and is compared at the lowest ef that reaches it; kbcore's default-ef figure is kept too.
The headline ratios then come from ``--rounds`` (default 5) interleaved rounds: every library stays
built, and each round times one whole pass of every library at its operating point, in a rotating
order; the ratio is taken per round (kbcore over the best anchor of that round) and reported as
its median and min-max. See benches/README.md ("Filtered search") for what is measured and how.
"""

from __future__ import annotations

import os
import sys

# Single-thread BLAS for the numpy anchor and the ground truth. Must happen before numpy loads.
_NUMPY_PRELOADED = "numpy" in sys.modules
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benches.datasets import (
    SYNTHETIC_CLUSTERS,
    SYNTHETIC_DIM,
    SYNTHETIC_SEED,
    Dataset,
    load_scifact,
    make_synthetic,
    scifact_dir,
)

K = 10
M = 16
EF_CONSTRUCTION = 200
BUILD_THREADS = 2
TARGET_RECALL = 0.95
DEFAULT_EFS = (16, 32, 64, 128, 256, 512, 1024)
ANCHORS = ("hnswlib", "faiss", "qdrant-edge", "qdrant-edge-acorn", "usearch", "numpy")
# Anchors that search a graph with an ef sweep (usearch has no filtered search, numpy is exact).
GRAPH_ANCHORS = ("hnswlib", "faiss", "qdrant-edge", "qdrant-edge-acorn")
# kbcore variants: name -> quantization (None is the float32 index).
KBCORE_VARIANTS = {"kbcore": None, "kbcore-sq8": "sq8", "kbcore-rabitq": "rabitq"}
ALL_LIBS = tuple(KBCORE_VARIANTS) + ANCHORS
TIE_EPS = 1e-5
ATTR_SEED = 20240603
TAGS = ("t0", "t1", "t2", "t3", "t4")
TAG_P = (0.55, 0.25, 0.12, 0.05, 0.03)  # tag $in ["t3", "t4"] passes ~8 %
ANTI_FRACTIONS = (0.02, 0.10)  # anti-correlated: one below the exact-scan threshold, one above
USEARCH_NOTE = "no filtered search in the Python API"
CPU_PER_WALL_LOW = 0.85  # a single-thread timing below this was descheduled (contended machine)
CPU_PER_WALL_HIGH = 1.3  # above this more than one thread was busy
DEFAULT_ROUNDS = 5
# Anchors whose sequential QPS is below this share of the best anchor's cannot be the best of a
# round; they are left out of the interleaved rounds (numpy at 50 % would take 10 s a pass).
INTERLEAVE_ANCHOR_SHARE = 0.5

# case name -> library -> (a factory of the per-query function at its operating point, its
# inputs). A factory, because hnswlib's ef is a property of the index, set when the function
# is made: each pass makes its function anew.
Live = dict[str, dict[str, tuple[Callable[[], Callable[[Any], Any]], Sequence[Any]]]]


def log(msg: str = "") -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# attributes and filters


@dataclass
class Attributes:
    """Per-row metadata as numpy arrays: what a numpy user would keep next to the vectors."""

    bucket: np.ndarray  # int64 [n], uniform in [0, 1000)
    tag: np.ndarray  # str [n] ('<U2'), drawn from TAGS with TAG_P
    local_name: str  # "cluster" (synthetic) or "far_rank" (SciFact)
    local: np.ndarray  # int64 [n]

    def arrow_table(self) -> Any:
        import pyarrow as pa

        return pa.table(
            {
                "bucket": pa.array(self.bucket, pa.int64()),
                "tag": pa.array(self.tag.tolist(), pa.string()),
                self.local_name: pa.array(self.local, pa.int64()),
            }
        )


@dataclass
class Case:
    """One filter: the kbcore ``where``, the same condition on the numpy arrays, and its truth."""

    name: str
    kind: str  # "selectivity", "string" or "anti-correlated"
    where: dict
    condition: Callable[[Attributes], np.ndarray]  # what the numpy anchor evaluates per query
    mask: np.ndarray = field(repr=False, default=None)  # bool [n]
    gt_ids: np.ndarray = field(repr=False, default=None)  # int64 [nq, K]
    gt_scores: np.ndarray = field(repr=False, default=None)  # float32 [nq, K]

    @property
    def passing(self) -> int:
        return int(self.mask.sum())

    @property
    def fraction(self) -> float:
        return float(self.mask.mean())


def draw_attributes(n: int, seed: int = ATTR_SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    bucket = rng.integers(0, 1000, size=n, dtype=np.int64)
    tag = np.asarray(TAGS)[rng.choice(len(TAGS), size=n, p=TAG_P)]
    return bucket, tag


def synthetic_centres(
    dim: int = SYNTHETIC_DIM, clusters: int = SYNTHETIC_CLUSTERS, seed: int = SYNTHETIC_SEED
) -> np.ndarray:
    """The cluster centres of ``datasets.make_synthetic`` (same seed stream), re-derived here.

    The caller checks that base rows really sit around them before using them.
    """
    centre_seed = np.random.SeedSequence(seed).spawn(3)[0]
    c = np.random.default_rng(centre_seed).standard_normal((clusters, dim), dtype=np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    return c


def nearest_centre(x: np.ndarray, centres: np.ndarray, block: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    labels = np.empty(x.shape[0], dtype=np.int64)
    best = np.empty(x.shape[0], dtype=np.float32)
    for s in range(0, x.shape[0], block):
        sims = x[s : s + block] @ centres.T
        labels[s : s + block] = sims.argmax(axis=1)
        best[s : s + block] = sims.max(axis=1)
    return labels, best


def locality_attribute(ds: Dataset, queries: np.ndarray, info: dict) -> tuple[str, np.ndarray, dict[float, dict]]:
    """The field behind the anti-correlated filters, and for each target fraction its ``where``.

    Synthetic: ``cluster`` = the row's cluster; the filter is ``cluster $in`` the clusters farthest
    from the clusters of the timed queries (smallest max centre cosine to any query cluster),
    taken until the target fraction of rows is reached. SciFact (no clusters): ``far_rank`` = rank
    of the row's cosine to the mean query (0 = least similar); the filter is ``far_rank $lt m``.
    """
    out: dict[float, dict] = {}
    if ds.name.startswith("synthetic"):
        centres = synthetic_centres()
        labels, best = nearest_centre(ds.base, centres)
        fit = float(best.mean())
        info["centre_fit_mean_cosine"] = fit
        if fit > 0.5:  # own centre ~0.7; a random centre would give ~0.15
            q_labels, _ = nearest_centre(queries, centres)
            q_clusters = np.unique(q_labels)
            closeness = (centres @ centres[q_clusters].T).max(axis=1)
            closeness[q_clusters] = np.inf
            order = np.argsort(closeness, kind="stable")
            sizes = np.bincount(labels, minlength=centres.shape[0])
            info["query_clusters"] = int(q_clusters.size)
            for frac in ANTI_FRACTIONS:
                cum = np.cumsum(sizes[order])
                m = int(np.searchsorted(cum, frac * ds.n)) + 1
                chosen = sorted(int(c) for c in order[:m])
                out[frac] = {"where": {"cluster": {"$in": chosen}}, "values": chosen}
            return "cluster", labels, out
        log(
            f"  warning: synthetic centres do not match the data (mean cosine {fit:.2f}); "
            "falling back to far_rank for the anti-correlated filters"
        )
    sims = ds.base @ queries.mean(axis=0)
    far_rank = np.empty(ds.n, dtype=np.int64)
    far_rank[np.argsort(sims, kind="stable")] = np.arange(ds.n)
    for frac in ANTI_FRACTIONS:
        m = max(K, round(frac * ds.n))
        out[frac] = {"where": {"far_rank": {"$lt": m}}, "values": m}
    return "far_rank", far_rank, out


def make_cases(attrs: Attributes, anti: dict[float, dict]) -> list[Case]:
    cases = [
        Case(f"bucket<{t}", "selectivity", {"bucket": {"$lt": t}}, lambda a, t=t: a.bucket < t)
        for t in (500, 100, 10, 1)
    ]
    cases.append(
        Case(
            "tag in [t3,t4]",
            "string",
            {"tag": {"$in": ["t3", "t4"]}},
            lambda a: (a.tag == "t3") | (a.tag == "t4"),
        )
    )
    for frac, spec in anti.items():
        if attrs.local_name == "cluster":
            values = np.asarray(spec["values"], dtype=np.int64)

            def cond(a: Any, v: np.ndarray = values) -> np.ndarray:
                return np.isin(a.local, v)
        else:

            def cond(a: Any, m: Any = spec["values"]) -> np.ndarray:
                return a.local < m

        cases.append(Case(f"anti {frac:.0%}", "anti-correlated", spec["where"], cond))
    for c in cases:
        c.mask = np.ascontiguousarray(c.condition(attrs), dtype=bool)
    return cases


def filtered_truth(scores: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-K among passing rows from the full score matrix [nq, n] (ties: lower row first)."""
    rows = np.flatnonzero(mask)
    sub = scores[:, rows]
    kk = min(K, rows.size)
    part = np.argpartition(-sub, kk - 1, axis=1)[:, :kk]
    ids = rows[part]
    sc = np.take_along_axis(sub, part, axis=1)
    order = np.lexsort((ids, -sc), axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    sc = np.take_along_axis(sc, order, axis=1)
    if kk < K:
        ids = np.pad(ids, ((0, 0), (0, K - kk)), constant_values=-1)
        sc = np.pad(sc, ((0, 0), (0, K - kk)), constant_values=-np.inf)
    return ids.astype(np.int64), sc.astype(np.float32)


def recall(pred: np.ndarray, gt: np.ndarray) -> float:
    """Mean |pred ∩ exact top-K| / K over the queries (the -1 padding never counts)."""
    hits = sum(len((set(p.tolist()) - {-1}) & set(g.tolist())) for p, g in zip(pred, gt))
    return hits / (K * len(pred))


def recall_ties(pred: np.ndarray, case: Case, scores: np.ndarray) -> float:
    """Recall where a hit is any passing id scoring >= the exact K-th score - eps (robust to ties)."""
    safe = np.where(pred >= 0, pred, 0)
    s = np.take_along_axis(scores[: len(pred)], safe, axis=1)
    ok = (pred >= 0) & case.mask[safe] & (s >= case.gt_scores[: len(pred), K - 1 : K] - TIE_EPS)
    return float(sum(len(set(p[o].tolist())) for p, o in zip(pred, ok))) / (K * len(pred))


# ----------------------------------------------------------------------------------------------
# timing


@dataclass
class Budget:
    """Caps on the wall time of one sweep point (the first pass stops early) and of one sweep."""

    point_s: float
    sweep_s: float
    repeat_if_below_s: float  # repeat a point only if its first pass took at most this
    min_queries: int = 50


def time_loop(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    stop_after_s: float | None = None,
    min_queries: int = 50,
) -> tuple[float, float, list]:
    """One timed pass of ``fn`` over ``inputs`` with gc paused; returns (wall s, cpu s, outputs).

    With ``stop_after_s`` the pass ends early once that much time is spent and ``min_queries``
    are done; the outputs then cover a prefix of the inputs (queries are i.i.d., so the recall
    of the prefix estimates the recall of all).
    """
    out: list = [None] * len(inputs)
    done = 0
    limit = float("inf") if stop_after_s is None else stop_after_s
    perf = time.perf_counter
    gc.disable()
    try:
        c0 = time.process_time()
        t0 = perf()
        for i, x in enumerate(inputs):
            out[i] = fn(x)
            done = i + 1
            if perf() - t0 > limit and done >= min_queries:
                break
        wall = perf() - t0
        cpu = time.process_time() - c0
    finally:
        gc.enable()
    return wall, cpu, out[:done]


def measure_point(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    to_ids: Callable[[Any], np.ndarray],
    case: Case,
    scores: np.ndarray,
    repeats: int,
    budget: Budget | None,
    always_repeat: bool = False,
) -> dict:
    """Recall and single-thread QPS of one configuration (median of ``repeats`` passes)."""
    stop = None if budget is None else budget.point_s
    wall, cpu, outs = time_loop(fn, inputs, stop, budget.min_queries if budget else 0)
    done = len(outs)
    ids = np.stack([to_ids(o) for o in outs])
    rec = recall(ids, case.gt_ids[:done])
    walls, cpus = [wall], [cpu]
    qualifies = rec >= TARGET_RECALL
    may_repeat = done == len(inputs) and (budget is None or wall <= budget.repeat_if_below_s)
    if (qualifies or always_repeat) and may_repeat:
        for _ in range(repeats - 1):
            w, c, _ = time_loop(fn, inputs)
            walls.append(w)
            cpus.append(c)
    i = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
    return {
        "recall": rec,
        "recall_ties": recall_ties(ids, case, scores),
        "queries": done,
        "repeats": len(walls),
        "qps": done / walls[i],
        "latency_us": 1e6 * walls[i] / done,
        "walls_s": walls,
        "cpu_per_wall": cpus[i] / walls[i],
        "short_ids": int(np.sum(ids < 0)),
        "empty_results": int(np.sum(np.all(ids < 0, axis=1))),
    }


def cpu_warning(p: dict) -> str:
    """A note when the median pass did not look like one busy thread (contended, or multi-threaded)."""
    r = p["cpu_per_wall"]
    if r < CPU_PER_WALL_LOW:
        return f"  WARNING cpu/wall {r:.2f} (descheduled: another process was using the cores)"
    if r > CPU_PER_WALL_HIGH:
        return f"  WARNING cpu/wall {r:.2f} (more than one thread busy)"
    return ""


def sweep(
    name: str,
    make_fn: Callable[[int], Callable[[Any], Any]],
    inputs: Sequence[Any],
    to_ids: Callable[[Any], np.ndarray],
    case: Case,
    scores: np.ndarray,
    efs: Sequence[int],
    repeats: int,
    budget: Budget,
) -> dict:
    """Ascending ef until recall >= target (the smallest qualifying ef is the answer), or the budget ends."""
    points = []
    t0 = time.perf_counter()
    best = None
    stopped = "swept all ef"
    for ef in efs:
        p = measure_point(make_fn(ef), inputs, to_ids, case, scores, repeats, budget)
        p["ef"] = ef
        points.append(p)
        log(
            f"      {name:<14s} ef={ef:<5d} recall {p['recall']:.4f}  QPS {p['qps']:9.1f}"
            f"  ({p['queries']} q x {p['repeats']})"
            + (f"  short {p['short_ids']}" if p["short_ids"] else "")
            + (f"  empty results {p['empty_results']}" if p["empty_results"] else "")
            + cpu_warning(p)
        )
        if p["recall"] >= TARGET_RECALL:
            best = p
            stopped = "reached target"
            break
        if time.perf_counter() - t0 > budget.sweep_s:
            stopped = f"sweep budget ({budget.sweep_s:.0f} s) spent"
            break
    return {"points": points, "qualifying": best, "stopped": stopped}


# ----------------------------------------------------------------------------------------------
# libraries


class KbcoreLib:
    name = "kbcore"

    def __init__(self, ds: Dataset, attrs: Attributes, quantization: str | None = None) -> None:
        import kbcore
        from kbcore.filters import native_filter

        self.native_filter = native_filter
        table = attrs.arrow_table()
        self.index = kbcore.Index(
            ds.dim, "cosine", "hnsw", M=M, ef_construction=EF_CONSTRUCTION, quantization=quantization
        )
        self.index.add(ds.base, np.arange(ds.n, dtype=np.int64), metadata=table, threads=BUILD_THREADS)

    def warm_up(self, queries: np.ndarray) -> None:
        # Unfiltered searches also calibrate the cost model (evals_per_ef), as in normal use.
        for q in queries:
            self.index.search(q, K, threads=1)

    def auto_fn(self, where: dict, ef: int | None = None) -> Callable[[Any], Any]:
        search = self.index.search
        return lambda q: search(q, K, where=where, ef=ef, threads=1)

    def forced_fn(self, where: dict, ef: int, strategy: str) -> Callable[[Any], Any]:
        native, nf = self.index._native, self.native_filter
        return lambda q2: native.search(q2, K, ef, 1, nf(where), strategy)

    def close(self) -> None:
        self.index = None


class HnswlibLib:
    name = "hnswlib"

    def __init__(self, ds: Dataset) -> None:
        import hnswlib

        self.index = hnswlib.Index(space="cosine", dim=ds.dim)
        self.index.init_index(max_elements=ds.n, M=M, ef_construction=EF_CONSTRUCTION, random_seed=42)
        self.index.set_num_threads(BUILD_THREADS)
        self.index.add_items(ds.base, np.arange(ds.n), num_threads=BUILD_THREADS)

    def warm_up(self, queries: np.ndarray) -> None:
        self.index.set_ef(64)
        for q in queries:
            self.index.knn_query(q, k=K, num_threads=1)

    def make_fn(self, mask: np.ndarray) -> Callable[[int], Callable[[Any], Any]]:
        allowed = mask.tolist()  # a list lookup is the cheapest Python predicate on a label
        knn = self.index.knn_query

        def flt(label: int) -> bool:
            return allowed[label]

        index = self.index

        def at_ef(ef: int) -> Callable[[Any], Any]:
            index.set_ef(ef)

            def one(q: np.ndarray) -> Any:
                try:
                    return knn(q, k=K, num_threads=1, filter=flt)
                except RuntimeError:  # hnswlib raises when it found fewer than k passing rows
                    return None

            return one

        return at_ef

    @staticmethod
    def to_ids(raw: Any) -> np.ndarray:
        if raw is None:
            return np.full(K, -1, dtype=np.int64)
        return raw[0][0].astype(np.int64)

    def close(self) -> None:
        self.index = None


class FaissLib:
    name = "faiss"

    def __init__(self, ds: Dataset) -> None:
        import faiss

        self.faiss = faiss
        faiss.omp_set_num_threads(BUILD_THREADS)
        self.index = faiss.IndexHNSWFlat(ds.dim, M, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = EF_CONSTRUCTION
        self.index.add(ds.base)
        faiss.omp_set_num_threads(1)
        self.n = ds.n

    def warm_up(self, queries2d: Sequence[np.ndarray]) -> None:
        self.index.hnsw.efSearch = 64
        for q in queries2d:
            self.index.search(q, K)

    def make_fn(self, mask: np.ndarray) -> Callable[[int], Callable[[Any], Any]]:
        faiss = self.faiss
        bits = np.packbits(mask, bitorder="little")
        sel = faiss.IDSelectorBitmap(self.n, faiss.swig_ptr(bits))
        search = self.index.search
        keep = (bits, sel)  # the selector reads these bytes: keep them alive with the closures

        def at_ef(ef: int) -> Callable[[Any], Any]:
            faiss.omp_set_num_threads(1)
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef)
            return lambda q2, params=params, keep=keep: search(q2, K, params=params)

        return at_ef

    @staticmethod
    def to_ids(raw: Any) -> np.ndarray:
        return raw[1][0].astype(np.int64)

    def close(self) -> None:
        self.index = None


class QdrantEdgeLib:
    """Qdrant Edge (``qdrant-edge-py`` 0.9, Qdrant's in-process shard): one segment (``default_segment_number=1``),
    HNSW with m = 16, ef_construct = 200, ``payload_m`` = 16 (the extra payload-aware links
    Qdrant builds per indexed field), int8 scalar quantization kept in RAM with rescoring on the
    float32 vectors (``QuantizationSearchParams(rescore=True)``), a payload index on every
    filtered field (integer ``bucket`` and the locality field, keyword ``tag``), one search
    thread (``max_search_threads=1``). Its query planner picks per query between the filtered
    graph walk and a payload-index scan. ``acorn=True`` adds ACORN (``AcornSearchParams``: the
    walk also expands two-hop neighbours when the filter is selective). Fastest documented Python
    path: ``EdgeShard.search(SearchRequest(...))`` per query; the ``Query.Nearest`` objects are
    built outside the timed loop. Limits: points and filters are Python objects (a list of floats
    per vector), the result is a list of ``ScoredPoint``."""

    name = "qdrant-edge"

    def __init__(self, ds: Dataset, attrs: Attributes, acorn: bool = False) -> None:
        import tempfile

        import qdrant_edge as qe

        self.qe = qe
        self.acorn = acorn
        self.name = "qdrant-edge-acorn" if acorn else "qdrant-edge"
        self.dir = tempfile.mkdtemp(prefix="bench-qdrant-edge-")
        config = qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(
                size=ds.dim,
                distance=qe.Distance.Cosine,
                quantization_config=qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, always_ram=True),
            ),
            hnsw_config=qe.HnswIndexConfig(
                m=M,
                ef_construct=EF_CONSTRUCTION,
                full_scan_threshold=10_000,  # Qdrant's default, in KB
                max_indexing_threads=BUILD_THREADS,
                payload_m=M,
            ),
            optimizers=qe.EdgeOptimizersConfig(default_segment_number=1, indexing_threshold=1),
            max_search_threads=1,
        )
        self.shard = qe.EdgeShard.create(os.path.join(self.dir, "shard"), config)
        upd = qe.UpdateOperation
        self.shard.update(upd.create_field_index("bucket", qe.PayloadSchemaType.Integer))
        self.shard.update(upd.create_field_index("tag", qe.PayloadSchemaType.Keyword))
        self.shard.update(upd.create_field_index(attrs.local_name, qe.PayloadSchemaType.Integer))
        bucket, tag, local = attrs.bucket.tolist(), attrs.tag.tolist(), attrs.local.tolist()
        step = 1000
        for b in range(0, ds.n, step):
            rows = range(b, min(ds.n, b + step))
            points = [
                qe.Point(
                    i,
                    ds.base[i].tolist(),
                    {"bucket": bucket[i], "tag": tag[i], attrs.local_name: local[i]},
                )
                for i in rows
            ]
            self.shard.update(upd.upsert_points(points))
        self.shard.optimize()  # builds the HNSW graph and the payload-aware links

    def condition(self, where: dict) -> Any:
        """A Qdrant ``Filter`` for the benchmark's one-field ``where`` ($lt, $in, $eq)."""
        qe = self.qe
        ((key, spec),) = where.items()
        ((op, value),) = spec.items()
        if op == "$lt":
            cond = qe.FieldCondition(key, range=qe.RangeFloat(lt=float(value)))
        elif op == "$in":
            cond = qe.FieldCondition(key, match=qe.MatchAny(any=[v if isinstance(v, str) else int(v) for v in value]))
        elif op == "$eq":
            cond = qe.FieldCondition(key, match=qe.MatchValue(value))
        else:
            raise ValueError(f"no Qdrant translation for {op!r} in {where!r}")
        return qe.Filter(must=[cond])

    def queries(self, queries: np.ndarray) -> list:
        return [self.qe.Query.Nearest(q.tolist()) for q in queries]

    def warm_up(self, queries: Sequence[Any]) -> None:
        params = self.qe.SearchParams(hnsw_ef=64)
        for q in queries:
            self.shard.search(self.qe.SearchRequest(query=q, limit=K, params=params))

    def make_fn(self, where: dict) -> Callable[[int], Callable[[Any], Any]]:
        qe = self.qe
        flt = self.condition(where)
        search, request = self.shard.search, qe.SearchRequest
        quant = qe.QuantizationSearchParams(rescore=True)
        acorn = qe.AcornSearchParams(enable=True) if self.acorn else None

        def at_ef(ef: int) -> Callable[[Any], Any]:
            params = qe.SearchParams(hnsw_ef=ef, quantization=quant, acorn=acorn)
            return lambda q: search(request(query=q, limit=K, filter=flt, params=params))

        return at_ef

    @staticmethod
    def to_ids(raw: Any) -> np.ndarray:
        out = np.full(K, -1, dtype=np.int64)
        ids = [int(p.id) for p in raw[:K]]
        out[: len(ids)] = ids
        return out

    def close(self) -> None:
        import shutil

        if self.shard is not None:
            self.shard.close()
        self.shard = None
        shutil.rmtree(self.dir, ignore_errors=True)


def numpy_fn(
    base: np.ndarray, attrs: Attributes, condition: Callable[[Attributes], np.ndarray]
) -> Callable[[Any], Any]:
    """Brute force as a numpy user writes it: mask, gather the passing rows, matmul, argpartition."""

    def one(q: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(condition(attrs))
        s = base[rows] @ q
        part = np.argpartition(-s, K - 1)[:K] if s.size > K else np.arange(s.size)
        best = part[np.argsort(-s[part], kind="stable")]
        out = np.full(K, -1, dtype=np.int64)
        out[: best.size] = rows[best]
        return out

    return one


def usearch_has_filtered_search() -> tuple[bool, str]:
    """usearch 2.x: ``Index.search`` takes no predicate; the C++ ``filtered_search`` is not bound."""
    try:
        import inspect

        import usearch
        from usearch.index import Index
    except ImportError:
        return False, "usearch not installed"
    params = set(inspect.signature(Index.search).parameters)
    names = {n for n in dir(Index) if "filter" in n.lower() or "predicate" in n.lower()}
    if params & {"filter", "predicate", "filter_fn"} or names:
        return (
            True,
            f"usearch {usearch.__version__}: unexpected filter API {sorted(params | names)}",
        )
    return (
        False,
        f"usearch {usearch.__version__}: {USEARCH_NOTE} (search{sorted(params - {'self'})})",
    )


# ----------------------------------------------------------------------------------------------
# per dataset


def build_timed(make: Callable[[], Any]) -> tuple[Any, float]:
    gc.collect()
    t0 = time.perf_counter()
    obj = make()
    return obj, time.perf_counter() - t0


def bench_kbcore(
    name: str,
    quantization: str | None,
    ds: Dataset,
    attrs: Attributes,
    cases: Sequence[Case],
    queries: np.ndarray,
    scores: np.ndarray,
    res: dict,
    efs: Sequence[int],
    repeats: int,
    budget: Budget,
    live: Live,
    keep: list,
) -> None:
    """One kbcore variant (float32 or quantized) over every case: its default ef, its automatic
    strategy swept over ef (the equal-recall figure), and each strategy forced (analysis). The
    index stays built (in ``keep``) for the interleaved rounds, which time it at the operating
    point registered in ``live``."""
    q1 = list(queries)
    q2 = [row[None, :] for row in queries]
    builds = res["build_s"]
    lib, builds[name] = build_timed(lambda: KbcoreLib(ds, attrs, quantization))
    log(f"  {name} build {builds[name]:.1f} s")
    lib.warm_up(queries)
    native = lib.index._native
    res[f"{name}_default_ef"] = default_ef = lib.index.ef
    res[f"{name}_evals_per_ef"] = float(native.evals_per_ef)
    for c in cases:
        out = res["cases"][c.name]["libs"]
        count = lib.index.count(c.where)
        strategy = native.strategy(c.passing, max(default_ef, K))
        log(f"    {c.name}: count {count} (numpy {c.passing}), auto strategy at ef={default_ef}: {strategy}")
        p = measure_point(
            lib.auto_fn(c.where),
            q1,
            lambda r: np.asarray(r[0], dtype=np.int64),
            c,
            scores,
            repeats,
            None,
            always_repeat=True,
        )
        p.update(ef=default_ef, strategy=strategy, count=count)
        out[f"{name} default ef"] = p
        log(
            f"      {name + ' auto':<14s} ef={default_ef:<5d} recall {p['recall']:.4f}  "
            f"QPS {p['qps']:9.1f}  [{strategy}]" + cpu_warning(p)
        )
        # Equal-recall figure, by the anchors' rule: the automatic strategy swept over ef,
        # the lowest ef reaching the target is kbcore's operating point.
        sw = sweep(
            f"{name} auto",
            lambda ef, w=c.where: lib.auto_fn(w, ef),
            q1,
            lambda r: np.asarray(r[0], dtype=np.int64),
            c,
            scores,
            efs,
            repeats,
            budget,
        )
        out[f"{name} auto sweep"] = sw
        q = sw["qualifying"]
        if q is not None:
            q = dict(q, strategy=native.strategy(c.passing, max(q["ef"], K)), count=count)
            live.setdefault(c.name, {})[name] = (lambda w=c.where, ef=q["ef"]: lib.auto_fn(w, ef), q1)
        out[name] = q if q is not None else p
        for forced in ("exact", "graph", "walk"):
            fp = measure_point(
                lib.forced_fn(c.where, default_ef, forced),
                q2,
                lambda r: np.asarray(r[0][0], dtype=np.int64),
                c,
                scores,
                repeats,
                None,
                always_repeat=True,
            )
            fp["ef"] = default_ef
            out[f"{name}[{forced}]"] = fp
            log(
                f"      {name + ' ' + forced:<14s} ef={default_ef:<5d} recall {fp['recall']:.4f}  "
                f"QPS {fp['qps']:9.1f}" + cpu_warning(fp)
            )
        # The graph traversal alone across ef (one pass per point): where would it reach the target?
        out[f"{name}[graph] sweep"] = sweep(
            f"{name} graph",
            lambda ef, w=c.where: lib.forced_fn(w, ef, "graph"),
            q2,
            lambda r: np.asarray(r[0][0], dtype=np.int64),
            c,
            scores,
            efs,
            1,
            budget,
        )
    if quantization is None:
        res["compile_cost"] = compile_cost(lib, cases, q1, repeats)
    keep.append(lib)


def interleave(live: Live, res: dict, rounds: int) -> None:
    """The interleaved rounds of every case (see the module docstring), into res["cases"][..]["interleaved"]."""
    if rounds <= 0:
        return
    log(f"  interleaved rounds: {rounds} per case, rotating order")
    for case_name, entries in live.items():
        c = res["cases"][case_name]
        seq = {}
        for lib in ANCHORS:
            r = c["libs"].get(lib)
            if r is None or lib not in entries:
                continue
            p = r if "points" not in r else r["qualifying"]
            if p is not None:
                seq[lib] = p["qps"]
        if not seq:
            continue
        top = max(seq.values())
        anchors = [lib for lib, qps in seq.items() if qps >= INTERLEAVE_ANCHOR_SHARE * top]
        variants = [v for v in KBCORE_VARIANTS if v in entries]
        if not variants:
            continue
        order = variants + anchors
        qps: dict[str, list[float]] = {lib: [] for lib in order}
        cpu_wall: dict[str, list[float]] = {lib: [] for lib in order}
        for r in range(rounds):
            for lib in order[r % len(order) :] + order[: r % len(order)]:
                make, inputs = entries[lib]
                wall, cpu, _ = time_loop(make(), inputs)
                qps[lib].append(len(inputs) / wall)
                cpu_wall[lib].append(cpu / wall)
        best_per_round = [max(qps[a][r] for a in anchors) for r in range(rounds)]
        best_lib = max(anchors, key=lambda a: statistics.median(qps[a]))
        ratios = {}
        for v in variants:
            rs = [qps[v][r] / best_per_round[r] for r in range(rounds)]
            ratios[v] = {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "per_round": rs}
        c["interleaved"] = {
            "rounds": rounds,
            "order": order,
            "qps": qps,
            "qps_median": {lib: statistics.median(v) for lib, v in qps.items()},
            "cpu_per_wall_min": {lib: min(v) for lib, v in cpu_wall.items()},
            "best_anchor": best_lib,
            "ratio": ratios,
        }
        log(
            f"    {case_name:<16s} "
            + ", ".join(f"{lib} {statistics.median(qps[lib]):,.0f}" for lib in order)
            + " | "
            + ", ".join(f"{v} {x['median']:.2f}x ({x['min']:.2f}-{x['max']:.2f})" for v, x in ratios.items())
        )


def bench_dataset(
    ds: Dataset, nq: int, libs: Sequence[str], efs: Sequence[int], repeats: int, budget: Budget, rounds: int
) -> dict:
    queries = np.ascontiguousarray(ds.queries[:nq])
    q1 = list(queries)  # 1-D views for the per-query loop
    q2 = [row[None, :] for row in queries]  # [1, d] for faiss and the native binding
    res: dict[str, Any] = {"name": ds.name, "n": ds.n, "dim": ds.dim, "queries": nq, "info": {}}
    t0 = time.perf_counter()
    scores = queries @ ds.base.T  # [nq, n], exact cosine (unit-norm rows)
    bucket, tag = draw_attributes(ds.n)
    local_name, local, anti = locality_attribute(ds, queries, res["info"])
    attrs = Attributes(bucket, tag, local_name, local)
    cases = make_cases(attrs, anti)
    for c in cases:
        c.gt_ids, c.gt_scores = filtered_truth(scores, c.mask)
    log(f"  attributes, filters and ground truth: {time.perf_counter() - t0:.1f} s")
    res["cases"] = {
        c.name: {
            "kind": c.kind,
            "where": c.where,
            "passing": c.passing,
            "fraction": c.fraction,
            "libs": {},
        }
        for c in cases
    }
    for c in cases:
        log(f"    {c.name:<16s} passes {c.passing:>7d} rows ({c.fraction:.3%})")
    builds: dict[str, float] = {}
    res["build_s"] = builds
    live: Live = {}
    keep: list = []  # every library stays built until the interleaved rounds are done

    for name, quantization in KBCORE_VARIANTS.items():
        if name in libs:
            bench_kbcore(name, quantization, ds, attrs, cases, queries, scores, res, efs, repeats, budget, live, keep)

    if "hnswlib" in libs:
        lib, builds["hnswlib"] = build_timed(lambda: HnswlibLib(ds))
        log(f"  hnswlib build {builds['hnswlib']:.1f} s")
        lib.warm_up(queries)
        for c in cases:
            at_ef = lib.make_fn(c.mask)
            sw = res["cases"][c.name]["libs"]["hnswlib"] = sweep(
                "hnswlib", at_ef, q1, lib.to_ids, c, scores, efs, repeats, budget
            )
            if sw["qualifying"] is not None:
                live.setdefault(c.name, {})["hnswlib"] = (lambda f=at_ef, ef=sw["qualifying"]["ef"]: f(ef), q1)
            del at_ef
        keep.append(lib)
        del lib

    if "faiss" in libs:
        lib, builds["faiss"] = build_timed(lambda: FaissLib(ds))
        log(f"  faiss build {builds['faiss']:.1f} s")
        lib.warm_up(q2)
        for c in cases:
            at_ef = lib.make_fn(c.mask)
            sw = res["cases"][c.name]["libs"]["faiss"] = sweep(
                "faiss", at_ef, q2, lib.to_ids, c, scores, efs, repeats, budget
            )
            if sw["qualifying"] is not None:
                live.setdefault(c.name, {})["faiss"] = (lambda f=at_ef, ef=sw["qualifying"]["ef"]: f(ef), q2)
            del at_ef
        keep.append(lib)
        del lib

    for qname in ("qdrant-edge", "qdrant-edge-acorn"):
        if qname not in libs:
            continue
        try:
            import qdrant_edge  # noqa: F401
        except ImportError as exc:  # reported, not silently dropped
            log(f"  {qname} SKIPPED: {exc}")
            res[f"{qname}_skipped"] = str(exc)
            continue
        acorn = qname.endswith("acorn")
        lib, builds[qname] = build_timed(lambda acorn=acorn: QdrantEdgeLib(ds, attrs, acorn=acorn))
        log(f"  {qname} build {builds[qname]:.1f} s (ingest, payload indexes, optimize)")
        qq = lib.queries(queries)
        lib.warm_up(qq)
        for c in cases:
            at_ef = lib.make_fn(c.where)
            sw = res["cases"][c.name]["libs"][qname] = sweep(
                qname, at_ef, qq, lib.to_ids, c, scores, efs, repeats, budget
            )
            if sw["qualifying"] is not None:
                live.setdefault(c.name, {})[qname] = (lambda f=at_ef, ef=sw["qualifying"]["ef"]: f(ef), qq)
            del at_ef
        keep.append(lib)
        del lib

    if "numpy" in libs:
        for c in cases:
            p = measure_point(
                numpy_fn(ds.base, attrs, c.condition),
                q1,
                lambda r: r,
                c,
                scores,
                repeats,
                budget,
                always_repeat=True,
            )
            p["ef"] = "exact"
            res["cases"][c.name]["libs"]["numpy"] = p
            if p["recall"] >= TARGET_RECALL:
                live.setdefault(c.name, {})["numpy"] = (
                    lambda cond=c.condition: numpy_fn(ds.base, attrs, cond),
                    q1,
                )
            log(
                f"      {'numpy ' + c.name:<24s} recall {p['recall']:.4f}  QPS {p['qps']:9.1f}  "
                f"({p['queries']} q x {p['repeats']})" + cpu_warning(p)
            )

    if "usearch" in libs:
        ok, note = usearch_has_filtered_search()
        for c in cases:
            res["cases"][c.name]["libs"]["usearch"] = {"supported": ok, "note": note}
        res["usearch_note"] = note
        log(f"  usearch: {note}")

    interleave(live, res, rounds)
    live.clear()
    for lib in keep:
        lib.close()
    keep.clear()
    del scores
    gc.collect()
    summarise(res)
    return res


def compile_cost(lib: KbcoreLib, cases: Sequence[Case], q1: Sequence[np.ndarray], repeats: int) -> dict:
    """Filter compile + evaluate (``count``) against a whole filtered search, at ~1 % selectivity.

    ``index.count(where)`` runs what ``index.search(q, where=where)`` runs before its scan: the
    cached compile of the ``where`` to the native filter (``native_filter``) and the native
    evaluation a filtered search performs (``Index::count`` calls the same helper as
    ``Index::search``, including the list of passing rows an exact scan reads). The steps are
    timed round-robin (each repeat times every step once), so drift on a shared machine hits
    them alike; medians of at least 5 repeats.
    """
    from kbcore.filters import native_filter

    case = min(cases, key=lambda c: abs(c.fraction - 0.01) if c.kind == "selectivity" else 9.0)
    where = case.where
    index, native = lib.index, lib.index._native
    compiled = native_filter(where)
    n = len(q1)
    steps = {
        "count (compile + evaluate)": lambda _: index.count(where),
        "compile only": lambda _: native_filter(where),
        "native count (evaluate only)": lambda _: native.count(compiled),
        "filtered search (auto)": lib.auto_fn(where),
    }
    out: dict[str, Any] = {"case": case.name, "where": where, "fraction": case.fraction}
    walls: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(max(repeats, 5)):
        for name, fn in steps.items():
            w, _, _ = time_loop(fn, q1)
            walls[name].append(w)
    for name in steps:
        out[f"{name} us"] = 1e6 * statistics.median(walls[name]) / n
    out["fraction_of_search"] = out["count (compile + evaluate) us"] / out["filtered search (auto) us"]
    log(
        f"  compile + evaluate at {case.name}: count {out['count (compile + evaluate) us']:.2f} us "
        f"(compile {out['compile only us']:.2f} us, evaluate {out['native count (evaluate only) us']:.2f} us) "
        f"vs filtered search {out['filtered search (auto) us']:.2f} us = {out['fraction_of_search']:.1%}"
    )
    return out


def summarise(res: dict) -> None:
    """Per case: the best qualifying anchor (highest QPS at recall >= target) and kbcore's ratio to it."""
    for c in res["cases"].values():
        libs = c["libs"]
        best = None
        for name in (*GRAPH_ANCHORS, "numpy"):
            r = libs.get(name)
            if r is None:
                continue
            p = r if "points" not in r else r["qualifying"]
            if p is not None and p["recall"] >= TARGET_RECALL and (best is None or p["qps"] > best[1]):
                best = (name, p["qps"], p["ef"])
        c["best_anchor"] = None if best is None else {"lib": best[0], "qps": best[1], "ef": best[2]}
        inter = c.get("interleaved", {}).get("ratio", {})
        for name in KBCORE_VARIANTS:
            kb = libs.get(name)
            c[f"{name}_ratio_sequential"] = kb["qps"] / best[1] if kb is not None and best is not None else None
            # The headline: the median of the per-round ratios when the rounds ran.
            c[f"{name}_ratio"] = inter[name]["median"] if name in inter else c[f"{name}_ratio_sequential"]


# ----------------------------------------------------------------------------------------------
# report


def _fmt_qps(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def anchor_cell(r: dict | None, nq: int) -> tuple[str, str, str, str]:
    """(recall, QPS, ef, note) of one anchor in one case."""
    if r is None:
        return "", "", "", "not run"
    if "supported" in r:
        return "-", "-", "-", USEARCH_NOTE if not r["supported"] else r["note"]
    if "points" not in r:  # numpy: one exact point
        note = "" if r["repeats"] > 1 and r["queries"] == nq else f"{r['queries']} q x {r['repeats']}"
        return f"{r['recall']:.3f}", _fmt_qps(r["qps"]), "exact", note
    p = r["qualifying"]
    if p is None:
        last = max(r["points"], key=lambda x: x["recall"])
        return (
            f"{last['recall']:.3f}",
            _fmt_qps(last["qps"]),
            str(last["ef"]),
            f"never >= {TARGET_RECALL} (best shown; {r['stopped']})",
        )
    note = []
    if p["queries"] < nq or p["repeats"] == 1:
        note.append(f"{p['queries']} q x {p['repeats']}")
    if p["empty_results"]:
        note.append(f"{p['empty_results']} queries raised or returned nothing")
    return f"{p['recall']:.3f}", _fmt_qps(p["qps"]), str(p["ef"]), "; ".join(note)


def _timed_points(ds: dict) -> list[dict]:
    points = []
    for c in ds["cases"].values():
        for r in c["libs"].values():
            if "points" in r:
                points.extend(r["points"])
            elif "cpu_per_wall" in r:
                points.append(r)
    return points


def report(results: dict) -> list[str]:
    lines: list[str] = []
    flags: list[str] = []
    for ds in results["datasets"]:
        lines.append("")
        lines.append(
            f"## {ds['name']}  (n = {ds['n']:,}, {ds['queries']} queries, d = {ds['dim']}, k = {K}, "
            f"1 search thread, loop of single queries, median of {results['config']['repeats']})"
        )
        lines.append("")
        lines.append("| filter | pass | library | recall@10 | QPS | ef | note |")
        lines.append("| --- | ---: | --- | ---: | ---: | ---: | --- |")
        for name, c in ds["cases"].items():
            libs = c["libs"]
            first = True

            def row(lib: str, cells: tuple[str, str, str, str], name: str = name, c: dict = c) -> None:
                nonlocal first
                head = f"| {name} | {c['fraction']:.2%} |" if first else "| | |"
                first = False
                lines.append(f"{head} {lib} | " + " | ".join(cells) + " |")

            for variant in KBCORE_VARIANTS:
                kb = libs.get(variant)
                if kb is not None:
                    ratio = c[f"{variant}_ratio"]
                    best = c["best_anchor"]
                    seq_ratio = c[f"{variant}_ratio_sequential"]
                    note = f"auto -> {kb['strategy']}; ratio " + (
                        f"{seq_ratio:.2f} vs {best['lib']} (sequential medians)"
                        if seq_ratio is not None
                        else "n/a (no anchor reached the target)"
                    )
                    if kb["recall"] < TARGET_RECALL:
                        note += f" (does not count: recall < {TARGET_RECALL})"
                    row(f"**{variant}**", (f"{kb['recall']:.3f}", _fmt_qps(kb["qps"]), str(kb["ef"]), note))
                    for forced in ("exact", "graph", "walk"):
                        fp = libs.get(f"{variant}[{forced}]")
                        if fp is not None:
                            row(
                                f"{variant} {forced} (forced)",
                                (f"{fp['recall']:.3f}", _fmt_qps(fp["qps"]), str(fp["ef"]), "analysis"),
                            )
                    gs = libs.get(f"{variant}[graph] sweep")
                    if gs is not None:
                        p = gs["qualifying"]
                        last = gs["points"][-1]
                        never = f"never >= {TARGET_RECALL} up to ef {last['ef']} (recall {last['recall']:.3f})"
                        row(
                            f"{variant} graph (forced, ef sweep)",
                            (f"{p['recall']:.3f}", _fmt_qps(p["qps"]), str(p["ef"]), "analysis, 1 pass")
                            if p is not None
                            else ("-", "-", "-", never),
                        )
                    if kb["recall"] < TARGET_RECALL:
                        flags.append(
                            f"{ds['name']} / {name}: {variant} recall {kb['recall']:.4f} < {TARGET_RECALL} "
                            f"(strategy {kb['strategy']}, ef {kb['ef']})"
                        )
                    if ratio is not None and ratio < 1.0:
                        flags.append(
                            f"{ds['name']} / {name}: {variant} ratio {ratio:.2f} < 1.0 "
                            f"({_fmt_qps(kb['qps'])} QPS, {kb['strategy']}) vs {best['lib']} "
                            f"{_fmt_qps(best['qps'])} QPS at ef {best['ef']}"
                        )
            for lib in ANCHORS:
                if lib in libs:
                    row(lib, anchor_cell(libs[lib], ds["queries"]))
        inter_lines = []
        for name, c in ds["cases"].items():
            it = c.get("interleaved")
            if it is None:
                continue
            best = it["best_anchor"]
            for variant, r in it["ratio"].items():
                inter_lines.append(
                    f"| {name} | {c['fraction']:.2%} | {variant} | {_fmt_qps(it['qps_median'][variant])} | "
                    f"{best} {_fmt_qps(it['qps_median'][best])} | "
                    f"**{r['median']:.2f}x** ({r['min']:.2f}-{r['max']:.2f}) | "
                    + ", ".join(f"{a} {_fmt_qps(it['qps_median'][a])}" for a in it["order"] if a not in it["ratio"])
                    + " |"
                )
        if inter_lines:
            rounds = next(c["interleaved"]["rounds"] for c in ds["cases"].values() if "interleaved" in c)
            lines.append("")
            lines.append(
                f"Interleaved: {rounds} rounds, each one whole pass per library at its operating point above, "
                "in a rotating order; QPS medians; the ratio is per round (kbcore over that round's best anchor), "
                "median (min-max)."
            )
            lines.append("")
            lines.append("| filter | pass | kbcore | QPS | best anchor | ratio | anchors timed |")
            lines.append("| --- | ---: | --- | ---: | --- | ---: | --- |")
            lines.extend(inter_lines)
        cc = ds.get("compile_cost")
        if cc is not None:
            lines.append("")
            lines.append(
                f"Filter compile + evaluate at {cc['case']} ({cc['fraction']:.2%}): `count(where)` "
                f"{cc['count (compile + evaluate) us']:.1f} us (compile {cc['compile only us']:.1f} us, "
                f"native evaluate {cc['native count (evaluate only) us']:.1f} us) vs filtered search "
                f"{cc['filtered search (auto) us']:.1f} us: **{cc['fraction_of_search']:.1%}** of the search "
                "(target <= 10%)."
            )
            if cc["fraction_of_search"] > 0.10:
                flags.append(
                    f"{ds['name']}: filter compile + evaluate is {cc['fraction_of_search']:.1%} of a "
                    f"filtered search at {cc['case']} (> 10%)"
                )
        contended = [r for r in _timed_points(ds) if r["cpu_per_wall"] < CPU_PER_WALL_LOW]
        lines.append("")
        lines.append(
            f"Timings with cpu/wall < {CPU_PER_WALL_LOW} (descheduled by another process): "
            f"{len(contended)} of {len(_timed_points(ds))}."
        )
        for variant in KBCORE_VARIANTS:
            if f"{variant}_evals_per_ef" in ds:
                lines.append("")
                lines.append(
                    f"{variant} default ef {ds[f'{variant}_default_ef']}, cost-model evals_per_ef after warm-up "
                    f"{ds[f'{variant}_evals_per_ef']:.2f}"
                )
        lines.append("")
        lines.append("Builds (2 threads): " + ", ".join(f"{k} {v:.1f} s" for k, v in ds["build_s"].items()))
    lines.append("")
    if flags:
        lines.append("Targets (kbcore recall < 0.95, ratio < 1.0, or compile cost > 10%):")
        lines.extend(f"- {f}" for f in flags)
    else:
        lines.append("No case with kbcore recall < 0.95, ratio < 1.0, or compile cost > 10%.")
    results["flags"] = flags
    return lines


# ----------------------------------------------------------------------------------------------
# main


def machine_info() -> dict:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "numpy": np.__version__,
        "numpy_imported_before_blas_pin": _NUMPY_PRELOADED,
        "blas_threads_env": {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from importlib import metadata

    for dist in ("kbcore", "hnswlib", "faiss-cpu", "usearch", "pyarrow"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = "not installed"
    try:
        import kbcore

        info["kbcore_simd"] = kbcore.simd_level()
    except ImportError as e:
        info["kbcore_simd"] = f"unavailable: {e}"
    return info


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.bench_filter", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data",
        default=None,
        help="data root holding scifact/ (default $KBCORE_DATA, else ../shared/data)",
    )
    ap.add_argument(
        "--n",
        type=int,
        default=None,
        help="synthetic base size (default 100000; 20000 with --quick)",
    )
    ap.add_argument(
        "--nq",
        type=int,
        default=None,
        help="timed queries per dataset (default 300; 100 with --quick)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small synthetic base, fewer queries, tight budgets",
    )
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--datasets", default="scifact,synthetic")
    ap.add_argument("--libs", default=",".join(ALL_LIBS))
    ap.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="interleaved rounds per case for the headline ratios (0: sequential medians only)",
    )
    args = ap.parse_args(argv)

    n = args.n or (20_000 if args.quick else 100_000)
    nq = args.nq or (100 if args.quick else 300)
    budget = (
        Budget(point_s=8, sweep_s=20, repeat_if_below_s=3)
        if args.quick
        else Budget(point_s=25, sweep_s=75, repeat_if_below_s=12)
    )
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    unknown = set(libs) - set(ALL_LIBS)
    if unknown:
        ap.error(f"unknown libs {sorted(unknown)}; choose from {ALL_LIBS}")
    efs = [int(e) for e in args.efs.split(",")]
    datasets = [s.strip() for s in args.datasets.split(",") if s.strip()]

    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "config": {
            "n": n,
            "nq": nq,
            "k": K,
            "M": M,
            "ef_construction": EF_CONSTRUCTION,
            "efs": efs,
            "repeats": args.repeats,
            "rounds": args.rounds,
            "target_recall": TARGET_RECALL,
            "libs": libs,
            "budget": budget.__dict__,
            "quick": args.quick,
        },
        "machine": machine_info(),
        "loadavg_start": os.getloadavg(),
        "datasets": [],
    }
    log(
        f"bench_filter: libs {libs}, datasets {datasets}, synthetic n = {n}, {nq} timed queries, "
        f"load average {results['loadavg_start'][0]:.2f}"
    )
    for name in datasets:
        if name == "scifact":
            folder = scifact_dir(args.data)
            if not (folder / "chunk_embeddings.npy").exists():
                log(f"scifact: {folder} has no chunk_embeddings.npy, skipped")
                continue
            ds = load_scifact(args.data)
        elif name == "synthetic":
            ds = make_synthetic(n, max(nq, 1000))
        else:
            ap.error(f"unknown dataset {name!r}")
        log(f"\n{ds.name}: n = {ds.n:,}, d = {ds.dim}")
        results["datasets"].append(bench_dataset(ds, min(nq, ds.nq), libs, efs, args.repeats, budget, args.rounds))
        del ds
        gc.collect()
    results["loadavg_end"] = os.getloadavg()
    results["total_s"] = time.perf_counter() - t_start
    lines = report(results)
    log("\n".join(lines))
    log(
        f"\ntotal {results['total_s'] / 60:.1f} min; load average start {results['loadavg_start'][0]:.2f}, "
        f"end {results['loadavg_end'][0]:.2f}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=_json_default)
        log(f"wrote {args.json}")
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


if __name__ == "__main__":
    sys.exit(main())
