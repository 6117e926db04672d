"""Where one ``kb.retrieve`` vector query's time goes, down to its floors, and zvec 0.8 beside it
at the same outputs (issue 28).

SciFact chunks pre-embedded (19,369 x 384, cosine), kbcore built as ``bench_engine_peers`` builds
it (``embedder=False``, SQ8, M 16, ef_construction 200) and, when ``zvec`` is installed, zvec
too (HNSW INT8, the same parameters); each searched at the smallest knob whose unfiltered
recall@10 reaches 0.95 (``bench_engine_peers``'s rule). Then, interleaved in one process (every
query runs every variant in a fresh seeded random order), each pass times every variant on
every query by this thread's CPU time and by the wall clock; printed: the median over passes
of each pass's median microseconds per query, and each variant's ratio to ``kb.retrieve``
(the wall clock is the fair one for a library that hands a query to its own threads and
waits: the calling thread's CPU time then counts its waiting, or not). The batch variant is
timed once per pass (its one call by CPU time, divided by the queries). The variants:

- ``native search, batch``: one ``Index.search`` call on every query at once (one thread),
  per query: the graph walk with the call amortised away (the floor of the search);
- ``binding call, 2-row index``: ``Index.search`` on an index of two rows (the walk is two
  distances): the floor of one call through the binding;
- ``Index.search``: one query through the public index API (ids and distances);
- ``kb.retrieve, Python replayed``: ``kb.retrieve`` with the native search answers recorded
  once and replayed: the Python of the call alone (checks, lock, hits with metadata and text);
- ``hits: metadata``, ``hits: text``, ``hits: Hit objects``: the three parts of building ten
  hits (``Index.get_metadata`` of ten ids, ten texts sliced from the segments' Arrow views,
  ten :class:`~kbcore.engine.Hit` objects), timed apart;
- ``kb.retrieve``: the whole call (what ``bench_engine_peers``' ``vector with text`` case times);
- ``kb.search_ids``: the ids-only call (ids and distances; ``bench_engine_peers``' ``vector``
  case); its Python over ``Index.search`` is printed below the table as the median over
  queries of the paired difference (both timed on the same query, same pass);
  ``kb.get_hits of its answer``: the ten hits built from its answer;
- ``zvec ids`` (``Collection.query_internal_ids``: internal ids only, ``bench_engine_peers``'
  zvec ``vector`` path) and ``zvec docs with text`` (``Collection.query`` with
  ``output_fields=["doc_id", "text"]``: what a hit with its text costs there).

Run from the repository root with kbcore importable (zvec optional)::

    python -m benches.bench_retrieve_floor [--passes 7] [--queries 300] [--data DIR]

Read the ratios: absolute microseconds move with the machine's load (``os.getloadavg()`` is
printed).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benches import bench_engine_peers as peers

#: Seed of the order the variants run in, per query.
SEED = 20261205


def _knob(peer: Any, truth: list[list[Any]]) -> int:
    """The smallest knob of ``peer`` whose vector recall reaches ``peers.TARGET`` (else the largest)."""
    nq = len(truth)
    for k in peer.knobs:
        peer.set_knob(k)
        fn = peer.fn("vector")
        if peers.recall([fn(i) for i in range(nq)], truth) >= peers.TARGET:
            return k
    return peer.knobs[-1]


def _build(cls: type, data: peers.Data, truth: list[list[Any]], root: str) -> Any:
    peer = cls(tempfile.mkdtemp(prefix=f"{cls.name}-", dir=root), data)
    for start, end in data.batches:
        peer.ingest_batch(start, end)
    peer.finish_ingest()
    peer.set_knob(_knob(peer, truth))
    return peer


def _kbcore_variants(peer: Any, qs: np.ndarray) -> dict[str, Callable[[int], Any]]:
    from kbcore.engine import Hit, retrieval
    from kbcore.engine.types import new_hit
    from kbcore.index import Index

    kb, ef = peer.kb, peer.knob
    state = kb._cell.state
    index = state.index
    tiny = Index(qs.shape[1], metric="cosine", M=peers.M, quantization="sq8")
    tiny.add(qs[:2], np.arange(2, dtype=np.int64), threads=1)
    batch_us: list[float] = []

    def batch(i: int) -> None:
        # One call for every query, charged once per pass (on the pass's first query).
        if i == 0:
            t0 = time.thread_time_ns()
            index.search(qs, peers.K, ef=ef, threads=1)
            batch_us.append((time.thread_time_ns() - t0) / 1e3 / len(qs))

    answers = [index.search(q, peers.K, ef=ef, threads=1) for q in qs]
    cands = [retrieval._knn_candidates(*a) for a in answers]
    hits = [kb.retrieve(q, peers.K, ef=ef) for q in qs]
    at = [0]
    real_search = Index.search

    def replayed(self: Any, *a: Any, **kw: Any) -> Any:
        return answers[at[0]]

    def python_share(i: int) -> Any:
        at[0] = i
        Index.search = replayed  # type: ignore[method-assign]
        try:
            return kb.retrieve(qs[i], peers.K, ef=ef)
        finally:
            Index.search = real_search  # type: ignore[method-assign]

    ids_answers = [kb.search_ids(q, peers.K, ef=ef) for q in qs]
    segs, mins = state.segments, state.seg_mins

    def texts_sliced(i: int) -> list[str]:
        out = []
        for cid, _, _ in cands[i]:
            seg = segs[retrieval._bisect_right(mins, cid) - 1]
            offsets, data, base = seg.text_views
            j = cid - seg.min_id + base
            out.append(str(data[offsets[j] : offsets[j + 1]], "utf-8"))
        return out

    def hit_objects(i: int) -> list[Hit]:
        return [
            new_hit(h.id, h.document_id, h.content, h.metadata, h.distance, h.score, h.pipeline_name, h.chunk_index, ())
            for h in hits[i]
        ]

    variants: dict[str, Callable[[int], Any]] = {
        "native search, batch": batch,
        "binding call, 2-row index": lambda i: tiny.search(qs[i], peers.K, ef=ef, threads=1),
        "Index.search": lambda i: index.search(qs[i], peers.K, ef=ef, threads=1),
        "kb.retrieve, Python replayed": python_share,
        "hits: metadata": lambda i: index.get_metadata([c[0] for c in cands[i]]),
        "hits: text": texts_sliced,
        "hits: Hit objects": hit_objects,
        "kb.retrieve": lambda i: kb.retrieve(qs[i], peers.K, ef=ef),
        "kb.search_ids": lambda i: kb.search_ids(qs[i], peers.K, ef=ef),
        "kb.get_hits of its answer": lambda i: kb.get_hits(*ids_answers[i]),
    }
    variants["native search, batch"].batch_us = batch_us  # type: ignore[attr-defined]
    return variants


def _zvec_variants(peer: Any, qs: np.ndarray) -> dict[str, Callable[[int], Any]]:
    zv, coll = peer.zv, peer.coll
    param = zv.HnswQueryParam(ef=peer.knob)
    return {
        "zvec ids": peer.fn("vector"),
        "zvec docs with text": lambda i: coll.query(
            zv.Query("v", vector=qs[i], param=param), topk=peers.K, output_fields=["doc_id", "text"]
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as root:
        return _measure(args, root)


def _measure(args: argparse.Namespace, root: str) -> int:
    data = peers.load(args.data, None, args.queries)
    truth = peers.exact(data)["vector"]
    qs = data.queries
    kbcore = _build(peers.Kbcore, data, truth, root)
    variants = _kbcore_variants(kbcore, qs)
    knobs = f"kbcore ef {kbcore.knob}"
    try:
        zvec = _build(peers.Zvec, data, truth, root)
    except ImportError as exc:
        print(f"zvec not measured: {exc}")
    else:
        variants.update(_zvec_variants(zvec, qs))
        knobs += f", zvec ef {zvec.knob}"
    batch_us = variants["native search, batch"].batch_us  # type: ignore[attr-defined]
    for i in range(len(qs)):  # warm up
        for fn in variants.values():
            fn(i)
    batch_us.clear()
    passes: dict[str, list[float]] = {k: [] for k in variants}
    ids_python: list[float] = []  # per pass: median over queries of search_ids - Index.search
    walls: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants.items())
    rng = random.Random(SEED)
    load0 = os.getloadavg()[0]
    gc.disable()
    try:
        for _ in range(args.passes):
            times: dict[str, list[int]] = {k: [] for k in variants}
            wall: dict[str, list[int]] = {k: [] for k in variants}
            for i in range(len(qs)):
                for label, fn in rng.sample(order, len(order)):
                    w0 = time.perf_counter_ns()
                    t0 = time.thread_time_ns()
                    fn(i)
                    times[label].append(time.thread_time_ns() - t0)
                    wall[label].append(time.perf_counter_ns() - w0)
            for label in variants:
                passes[label].append(statistics.median(times[label]) / 1e3)
                walls[label].append(statistics.median(wall[label]) / 1e3)
            pairs = zip(times["kb.search_ids"], times["Index.search"])
            ids_python.append(statistics.median([a - b for a, b in pairs]) / 1e3)
            passes["native search, batch"][-1] = walls["native search, batch"][-1] = batch_us[-1]
    finally:
        gc.enable()
    med = {k: statistics.median(v) for k, v in passes.items()}
    med_wall = {k: statistics.median(v) for k, v in walls.items()}
    whole, whole_wall = med["kb.retrieve"], med_wall["kb.retrieve"]
    print(f"{knobs}; {len(qs)} queries x {args.passes} passes; load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| variant | thread CPU us / query | ÷ kb.retrieve | wall us / query | ÷ kb.retrieve |")
    print("|---|---:|---:|---:|---:|")
    for k, v in med.items():
        w = med_wall[k]
        print(f"| {k} | {v:.1f} | {v / whole:.2f} | {w:.1f} | {w / whole_wall:.2f} |")
    print(
        f"kb.search_ids over Index.search, per query (thread CPU): {statistics.median(ids_python):.1f} us "
        f"(passes {min(ids_python):.1f}-{max(ids_python):.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
