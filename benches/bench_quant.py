"""Quantized graph search side by side (issue 13): kbcore float32, SQ8 and RaBitQ (``kbcore-rabitq``:
4 bits; ``-rabitq1/2/8``: other bit counts; ``-disk``: rows in a mapped file) against hnswlib,
faiss IndexHNSWFlat, IndexHNSWSQ (8-bit) alone and under a float32 refine stage
(``faiss-sq8-refine``) and an IVF over 4-bit PQ fast-scan codes with a refine stage
(``faiss-ivfpq-fs``, nprobe swept with ef), usearch (f32, i8) and zvec (fp32, INT8 alone and
with its float32 refiner, ``zvec-int8-refine``), and the issue-28 anchors: faiss HNSW over 4-bit
RaBitQ codes with a refine stage (``faiss-hnsw-rabitq-refine``), SymphonyQG through ``rabitqlib``
(``symqg`` raw, ``symqg-8`` 8-bit codes, ``symqg-tuned`` degree 64 / build beam 400), VSAG HGraph
through ``pyvsag`` (``vsag-sq8``, ``vsag-rabitq``, both re-ranked on float32) and Glass through
``pyglass-portable`` (``glass-sq8u``, ``glass-sq4u``, re-ranked on float32). Each adapter's
docstring says what it runs, through which call, and its limits. For figures a rerun agrees
with, run it through ``benches/fresh.py`` (one fresh process per library and repeat).

Run from the repository root on a quiet machine::

    python -m benches.bench_quant [--data DIR] [--datasets scifact,synthetic] [--n 100000]
                                  [--passes 5] [--libs kbcore,kbcore-sq8,...] [--json OUT]
    python -m benches.bench_quant --datasets synthetic --n 1000000     # opt-in, large

Every library: M = 16, ef_construction = 200, built with 2 threads, searched with one thread,
one query per call. One timing is one pass over the whole query set at one ef; each (ef,
library) is timed ``--passes`` times (>= 5), passes interleaved across libraries with the order
rotating each pass, so a burst of outside load hits every library alike. QPS at recall@10 0.95
and 0.99 is interpolated over the ef grid per pass; the report gives medians, and for each
library's ratio to ``--reference`` (kbcore-sq8) the median and min-max over passes. Memory per vector is the RSS
a build adds (indexes built earlier stay alive). ``os.getloadavg()`` is printed before and
after, with a warning when the 1-minute load at the start is above 0.5. ``kbcore-nohp`` and
``kbcore-sq8-nohp`` are the same builds with the huge-page switch off (``_core.set_huge_pages``),
for an interleaved A/B of the page size in one process. ``kbcore-sq8-heap`` and
``kbcore-rabitq-heap`` reopen the same ``--index-cache`` build with ``Index.load(mmap=False)``
(copied into memory) where ``kbcore-sq8`` / ``kbcore-rabitq`` read it in place from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benches.bench_index import (
    EF_CONSTRUCTION,
    Adapter,
    FaissHnsw,
    Hnswlib,
    K,
    KbcoreHnsw,
    M,
    Usearch,
    fmt,
    log,
    peak_rss_bytes,
    qps_at_recall,
    recall_at_k,
    settle_memory,
)
from benches.datasets import DEFAULT_DATA_ROOT, Dataset, load_scifact, make_synthetic

BUILD_THREADS = 2
DEFAULT_EFS = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256)
TARGETS = (0.95, 0.99)
REFERENCE = "kbcore-sq8"
LOAD_WARN = 0.5
# faiss's refine stage re-ranks k_factor * k candidates exactly (faiss-sq8-refine, faiss-ivfpq-fs).
REFINE_K_FACTOR = 4


class KbcoreSq8(KbcoreHnsw):
    name = "kbcore-sq8"
    m = M
    ef_construction = EF_CONSTRUCTION

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.kbcore.Index(
            x.shape[1], metric="cosine", kind="hnsw", M=self.m, ef_construction=self.ef_construction, quantization="sq8"
        )
        self.index.add(x, np.arange(x.shape[0], dtype=np.int64), threads=threads)


class KbcoreSq8Tuned(KbcoreSq8):
    """kbcore sq8 at the setting of the tuned SymphonyQG anchor (``symqg-tuned``): M = 32, so a
    level-0 degree of 64, and ef_construction 400. The twin of ``symqg-tuned`` at equal degree and
    build beam; not the default (M = 32 loses on the synthetic clusters, docs/graph-quality.md)."""

    name = "kbcore-sq8-tuned"
    m = 32
    ef_construction = 400


class KbcoreSq8Disk(KbcoreHnsw):
    """kbcore sq8 with the float32 rows in a memory-mapped file (vectors="disk")."""

    name = "kbcore-sq8-disk"

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.kbcore.Index(
            x.shape[1],
            metric="cosine",
            kind="hnsw",
            M=M,
            ef_construction=EF_CONSTRUCTION,
            quantization="sq8",
            vectors="disk",
        )
        self.index.add(x, np.arange(x.shape[0], dtype=np.int64), threads=threads)


class KbcoreRabitq(KbcoreHnsw):
    """kbcore on RaBitQ codes of ``bits`` bits per dimension (the error bound limits the re-rank)."""

    name = "kbcore-rabitq"
    bits = 4
    vectors = "memory"

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.kbcore.Index(
            x.shape[1],
            metric="cosine",
            kind="hnsw",
            M=M,
            ef_construction=EF_CONSTRUCTION,
            quantization="rabitq",
            bits=self.bits,
            vectors=self.vectors,
        )
        self.index.add(x, np.arange(x.shape[0], dtype=np.int64), threads=threads)


class KbcoreRabitq1(KbcoreRabitq):
    name = "kbcore-rabitq1"
    bits = 1


class KbcoreRabitq2(KbcoreRabitq):
    name = "kbcore-rabitq2"
    bits = 2


class KbcoreRabitq8(KbcoreRabitq):
    name = "kbcore-rabitq8"
    bits = 8


class KbcoreRabitqDisk(KbcoreRabitq):
    name = "kbcore-rabitq-disk"
    vectors = "disk"


def _without_huge_pages(build: Callable[[], None]) -> None:
    """Runs a kbcore build with the huge-page switch off (cpp/aligned.h), then restores it:
    the arrays allocated meanwhile keep 4 KiB pages, so "-nohp" libraries A/B the page size
    against their huge-page twins in one process."""
    from kbcore import _core

    was = _core.huge_pages()
    _core.set_huge_pages(False)
    try:
        build()
    finally:
        _core.set_huge_pages(was)


class KbcoreSq8Heap(KbcoreSq8):
    """kbcore sq8 reopened with ``Index.load(mmap=False)``: rows, codes and links copied into the
    process's memory (2 MiB pages where the kernel grants them) instead of read in place from the
    mapped file. It reuses kbcore-sq8's ``--index-cache`` build; built in the process (no cache)
    it is kbcore-sq8."""

    name = "kbcore-sq8-heap"
    cache_as = "kbcore-sq8"

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self.index = self.kbcore.Index.load(folder / "index.kbi", mmap=False)


class KbcoreRabitqHeap(KbcoreRabitq):
    """kbcore RaBitQ reopened with ``Index.load(mmap=False)`` (as kbcore-sq8-heap)."""

    name = "kbcore-rabitq-heap"
    cache_as = "kbcore-rabitq"

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self.index = self.kbcore.Index.load(folder / "index.kbi", mmap=False)


class KbcoreNoHp(KbcoreHnsw):
    """kbcore float32 with its large arrays on 4 KiB pages (huge pages off while building)."""

    name = "kbcore-nohp"

    def build(self, x: np.ndarray, threads: int) -> None:
        _without_huge_pages(lambda: KbcoreHnsw.build(self, x, threads))

    def restore(self, folder: Path, dim: int, n: int) -> None:
        raise NotImplementedError("a reopened index would not keep the page-size switch")


class KbcoreSq8NoHp(KbcoreSq8):
    """kbcore sq8 with its large arrays on 4 KiB pages (huge pages off while building)."""

    name = "kbcore-sq8-nohp"

    def build(self, x: np.ndarray, threads: int) -> None:
        _without_huge_pages(lambda: KbcoreSq8.build(self, x, threads))

    def restore(self, folder: Path, dim: int, n: int) -> None:
        raise NotImplementedError("a reopened index would not keep the page-size switch")


class FaissHnswSq8(FaissHnsw):
    name = "faiss-sq8"

    def trained_graph(self, x: np.ndarray) -> Any:
        """An empty IndexHNSWSQ (8-bit) with the quantizer trained on x."""
        faiss = self.faiss
        index = faiss.IndexHNSWSQ(x.shape[1], faiss.ScalarQuantizer.QT_8bit, M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = EF_CONSTRUCTION
        index.train(x)
        return index

    def build(self, x: np.ndarray, threads: int) -> None:
        self.faiss.omp_set_num_threads(threads)
        self.index = self.trained_graph(x)
        self.index.add(x)
        self.faiss.omp_set_num_threads(1)


class FaissHnswSq8Refine(FaissHnswSq8):
    """faiss IndexHNSWSQ (8-bit) under an IndexRefineFlat: the graph walk on 8-bit codes, then the
    best ``REFINE_K_FACTOR * k`` candidates re-ranked with exact float32 distances (faiss's own
    form of kbcore's sq8 + re-rank)."""

    name = "faiss-sq8-refine"

    def build(self, x: np.ndarray, threads: int) -> None:
        self.faiss.omp_set_num_threads(threads)
        self.base = self.trained_graph(x)
        self.index = self.faiss.IndexRefineFlat(self.base)  # self.base stays referenced: faiss borrows it
        self.index.k_factor = REFINE_K_FACTOR
        self.index.add(x)
        self.faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.faiss.omp_set_num_threads(1)
        self.base.hnsw.efSearch = ef


class FaissIvfPqFastScan(FaissHnsw):
    """faiss's fast-scan form: an IVF over 4-bit PQ codes scanned with SIMD lookup tables
    (``IVF{nlist},PQ{d/2}x4fs``, two dimensions per sub-quantizer), under an IndexRefineFlat.
    Not a graph: nlist = 4 sqrt(n), and the sweep's ef sets ``nprobe = max(1, ef // 4)`` (2 to 64
    lists over the default grid: clustered synthetic data reaches recall 0.95 within two lists,
    SciFact needs about 64)."""

    name = "faiss-ivfpq-fs"

    def build(self, x: np.ndarray, threads: int) -> None:
        faiss = self.faiss
        faiss.omp_set_num_threads(threads)
        n, d = x.shape
        nlist = max(16, int(4 * np.sqrt(n)))
        self.index = faiss.index_factory(d, f"IVF{nlist},PQ{d // 2}x4fs,RFlat", faiss.METRIC_INNER_PRODUCT)
        self.index.train(x)
        self.index.add(x)
        self.index.k_factor = REFINE_K_FACTOR
        self.ivf = faiss.extract_index_ivf(self.index)
        faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.faiss.omp_set_num_threads(1)
        self.ivf.nprobe = max(1, ef // 4)


class UsearchI8(Usearch):
    name = "usearch-i8"

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.cls(
            ndim=x.shape[1],
            metric="cos",
            dtype="i8",
            connectivity=M,
            expansion_add=EF_CONSTRUCTION,
            expansion_search=64,
        )
        self.index.add(np.arange(x.shape[0], dtype=np.uint64), x, threads=threads)


class Zvec(Adapter):
    """zvec 0.8: a collection with one HNSW vector field, built, optimised, then reopened
    read-only and searched with ``query_internal_ids`` (the fastest Python path: internal ids
    in a NumPy array, mapped back to row numbers outside the timed loop)."""

    name = "zvec"
    quantize = "UNDEFINED"

    def __init__(self) -> None:
        import zvec

        self.zvec = zvec
        self.index: Any = None
        self.dir = tempfile.mkdtemp(prefix="bench-zvec-")
        self.ef = 64
        self.rows = np.zeros(0, dtype=np.int64)  # internal id -> row number

    def build(self, x: np.ndarray, threads: int) -> None:
        zv = self.zvec
        from zvec.typing import DataType, MetricType, QuantizeType

        path = os.path.join(self.dir, "c")
        params = zv.HnswIndexParam(
            metric_type=MetricType.COSINE,
            m=M,
            ef_construction=EF_CONSTRUCTION,
            quantize_type=getattr(QuantizeType, self.quantize),
        )
        schema = zv.CollectionSchema(
            name="bench", vectors=zv.VectorSchema("v", DataType.VECTOR_FP32, x.shape[1], index_param=params)
        )
        coll = zv.create_and_open(path, schema)
        step = 1024  # zvec 0.8 caps one write batch at 1024 docs
        for b in range(0, x.shape[0], step):
            coll.insert([zv.Doc(id=str(i), vectors={"v": x[i]}) for i in range(b, min(x.shape[0], b + step))])
        coll.optimize(option=zv.OptimizeOption(concurrency=threads))
        coll.flush()
        del coll
        self._open(path, x.shape[0])

    def _open(self, path: str, n: int) -> None:
        self.index = self.zvec.open(path, self.zvec.CollectionOption(read_only=True))
        keys = self.index.resolve_internal_ids(np.arange(n, dtype=np.int64))
        self.rows = np.array([-1 if k is None else int(k) for k in keys], dtype=np.int64)

    def persist(self, folder: Path) -> None:
        shutil.copytree(os.path.join(self.dir, "c"), folder / "c")

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self._open(str(folder / "c"), n)  # read-only, as after a build

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def single_fn(self) -> Callable[[Any], Any]:
        zv, search, ef = self.zvec, self.index.query_internal_ids, self.ef
        param = zv.HnswQueryParam(ef=ef)
        return lambda q: search(zv.Query("v", vector=q, param=param), topk=K)

    def single_ids(self, raw: Any) -> np.ndarray:
        ids = np.asarray(raw, dtype=np.int64)[:K]
        out = np.where((ids >= 0) & (ids < len(self.rows)), self.rows[np.clip(ids, 0, max(len(self.rows) - 1, 0))], -1)
        return np.concatenate([out, np.full(K - len(out), -1, dtype=np.int64)])

    def close(self) -> None:
        self.index = None
        shutil.rmtree(self.dir, ignore_errors=True)


class ZvecInt8(Zvec):
    name = "zvec-int8"
    quantize = "INT8"


class ZvecInt8Refine(ZvecInt8):
    """zvec INT8 with its refiner: the graph walk on int8 codes, the candidates re-scored with
    the float32 vectors zvec keeps beside them (``HnswQueryParam(is_using_refiner=True)``)."""

    name = "zvec-int8-refine"

    def single_fn(self) -> Callable[[Any], Any]:
        zv, search, ef = self.zvec, self.index.query_internal_ids, self.ef
        param = zv.HnswQueryParam(ef=ef, is_using_refiner=True)
        return lambda q: search(zv.Query("v", vector=q, param=param), topk=K)


class FaissHnswRabitqRefine(FaissHnsw):
    """faiss HNSW over 4-bit RaBitQ codes under an IndexRefineFlat (``HNSW16,RaBitQ4,RFlat``):
    the walk estimates distances from the codes, then the best ``REFINE_K_FACTOR * k`` are
    re-ranked on float32. Limits: faiss's IndexHNSWRaBitQ takes only the L2 metric (on unit
    vectors the L2 order is the cosine order); the query is not quantised (``qb`` left at its
    default); the refine stage keeps a float32 copy beside the codes."""

    name = "faiss-hnsw-rabitq-refine"

    def build(self, x: np.ndarray, threads: int) -> None:
        faiss = self.faiss
        faiss.omp_set_num_threads(threads)
        self.index = faiss.index_factory(x.shape[1], f"HNSW{M},RaBitQ4,RFlat", faiss.METRIC_L2)
        self.base = faiss.downcast_index(self.index.base_index)
        self.base.hnsw.efConstruction = EF_CONSTRUCTION
        self.index.train(x)
        self.index.add(x)
        self.index.k_factor = REFINE_K_FACTOR
        faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.faiss.omp_set_num_threads(1)
        self.base.hnsw.efSearch = ef


class SymphonyQG(Adapter):
    """SymphonyQG (Gao et al., SIGMOD 2025) through ``rabitqlib`` 0.7 (``rabitqlib.SymqgIndex``):
    a graph whose neighbour lists carry 1-bit RaBitQ codes scored 32 at a time with FastScan;
    each visited vertex is then scored on its stored vector (raw float32 with
    ``quantization_bits=0``, or 4/8-bit codes). Degree 32 (``max_degree``, a multiple of 32) is
    the level-0 degree of an M = 16 HNSW graph; build beam ``ef_construction`` = 200, 2 build
    threads, PiPNN initialisation (the library default). Metric ``ip`` on the unit vectors.
    Fastest documented Python path: ``search(q[None], k, ef, 1)`` per query (2-D input only),
    ``search_batch(Q, k, ef, 1)`` for the batch pass. Limits: no updates after the build (a
    change rebuilds), no filter, ``ef >= k``."""

    name = "symqg"
    degree = 32
    ef_construction = EF_CONSTRUCTION
    bits = 0

    def __init__(self) -> None:
        import rabitqlib

        self.lib = rabitqlib
        self.index: Any = None
        self.ef = 64

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.lib.SymqgIndex(
            dim=x.shape[1], max_degree=self.degree, metric="ip", quantization_bits=self.bits
        )
        self.index.build(x, ef_construction=self.ef_construction, num_threads=threads)

    def set_ef(self, ef: int) -> None:
        self.ef = max(ef, K)

    def persist(self, folder: Path) -> None:
        self.index.save(str(folder / "index.symqg"))

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self.index = self.lib.SymqgIndex.load(str(folder / "index.symqg"))

    def prepare_single(self, q: np.ndarray) -> list:
        return [row[None, :] for row in q]

    def single_fn(self) -> Callable[[Any], Any]:
        search, ef = self.index.search, self.ef
        return lambda q: search(q, K, ef, 1)

    def single_ids(self, raw: Any) -> np.ndarray:
        return np.asarray(raw[0][0], dtype=np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.search_batch(q, K, self.ef, 1)[0], dtype=np.int64)


class SymphonyQG8(SymphonyQG):
    """SymphonyQG with 8-bit codes for the visited vertices (``quantization_bits=8``): the
    neighbour estimate stays 1-bit FastScan, the re-rank of each visited vertex reads 8-bit codes
    instead of float32 (no float32 copy kept)."""

    name = "symqg-8"
    bits = 8


class SymphonyQGTuned(SymphonyQG):
    """SymphonyQG raw at its tuned setting: degree 64 and build beam 400 (a larger graph, a slower
    build; the issue-28 "tuned" anchor)."""

    name = "symqg-tuned"
    degree = 64
    ef_construction = 400


class VsagHGraph(Adapter):
    """VSAG HGraph through ``pyvsag`` 0.18 (``pyvsag.Index("hgraph", json)``): a hierarchical
    graph walked on ``base_quantization_type`` codes, re-ranked on float32 (``use_reorder`` with
    ``precise_quantization_type="fp32"``). ``max_degree`` 32 (the bottom graph's degree, = 2M),
    ``ef_construction`` 200, ``build_thread_count`` 2, metric ``ip`` on the unit vectors. Fastest
    documented Python path: ``knn_search(q, k, '{"hgraph": {"ef_search": ef}}')``, one query per
    call, the JSON string built outside the timed loop. Limits: no batch search in the Python
    binding (no batch pass), parameters as JSON strings."""

    name = "vsag-sq8"
    base_quantization = "sq8"

    def __init__(self) -> None:
        import pyvsag

        self.lib = pyvsag
        self.index: Any = None
        self.params = json.dumps({"hgraph": {"ef_search": 64}})

    def build(self, x: np.ndarray, threads: int) -> None:
        cfg = {
            "dtype": "float32",
            "metric_type": "ip",
            "dim": int(x.shape[1]),
            "index_param": {
                "base_quantization_type": self.base_quantization,
                "use_reorder": True,
                "precise_quantization_type": "fp32",
                "max_degree": 2 * M,
                "ef_construction": EF_CONSTRUCTION,
                "build_thread_count": threads,
            },
        }
        self.index = self.lib.Index("hgraph", json.dumps(cfg))
        self.index.build(np.ascontiguousarray(x).ravel(), np.arange(x.shape[0], dtype=np.int64), x.shape[0], x.shape[1])

    def set_ef(self, ef: int) -> None:
        self.params = json.dumps({"hgraph": {"ef_search": ef}})

    def single_fn(self) -> Callable[[Any], Any]:
        search, params = self.index.knn_search, self.params
        return lambda q: search(q, K, params)

    def single_ids(self, raw: Any) -> np.ndarray:
        ids = np.asarray(raw[0], dtype=np.int64)[:K]
        return np.concatenate([ids, np.full(K - len(ids), -1, dtype=np.int64)])


class VsagHGraphRabitq(VsagHGraph):
    """VSAG HGraph walked on RaBitQ codes, re-ranked on float32."""

    name = "vsag-rabitq"
    base_quantization = "rabitq"


class Glass(Adapter):
    """Glass (zilliztech/pyglass) through ``pyglass-portable`` 2.1 (an AVX2 build of the same
    source; import name ``glass``): an HNSW graph (``R`` = 32 = 2M level-0 degree, ``L`` = 200)
    searched on ``quant`` codes and re-ranked on ``refine_quant`` (float32), after the
    ``Searcher.optimize`` step its README documents (it tunes prefetch depth by timing). Fastest
    documented Python path: ``Searcher.search(q, k)`` per query, ``batch_search(Q, k, 1)`` for
    the batch pass. Limits: no filter, no updates, the AVX2 build (the upstream wheel is AVX-512
    only); ``optimize`` times itself on the machine, so it too is subject to load."""

    name = "glass-sq8u"
    quant = "SQ8U"
    refine = "FP32"

    def __init__(self) -> None:
        import glass

        self.lib = glass
        self.index: Any = None

    def build(self, x: np.ndarray, threads: int) -> None:
        glass = self.lib
        glass.set_num_threads(threads)
        graph = glass.Index("HNSW", "IP", self.quant, R=2 * M, L=EF_CONSTRUCTION).build(x)
        self.data = np.ascontiguousarray(x)
        self.index = glass.Searcher(graph, self.data, "IP", self.quant, self.refine)
        self.index.set_ef(64)
        self.index.optimize(1)
        glass.set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def single_fn(self) -> Callable[[Any], Any]:
        search = self.index.search
        return lambda q: search(q, K)

    def single_ids(self, raw: Any) -> np.ndarray:
        return np.asarray(raw[0], dtype=np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.batch_search(q, K, 1)[0], dtype=np.int64)


class GlassSq4u(Glass):
    """Glass on 4-bit uniform codes (SQ4U), re-ranked on float32."""

    name = "glass-sq4u"
    quant = "SQ4U"


#: The A/B variants (huge pages off, other RaBitQ bit counts) run only when named in --libs.
AB_VARIANTS = (
    "kbcore-nohp",
    "kbcore-sq8-nohp",
    "kbcore-sq8-heap",
    "kbcore-rabitq-heap",
    "kbcore-rabitq1",
    "kbcore-rabitq2",
    "kbcore-rabitq8",
)
ADAPTERS: dict[str, type[Adapter]] = {
    "kbcore": KbcoreHnsw,
    "kbcore-sq8": KbcoreSq8,
    "kbcore-sq8-disk": KbcoreSq8Disk,
    "kbcore-sq8-tuned": KbcoreSq8Tuned,
    "kbcore-nohp": KbcoreNoHp,
    "kbcore-sq8-nohp": KbcoreSq8NoHp,
    "kbcore-sq8-heap": KbcoreSq8Heap,
    "kbcore-rabitq-heap": KbcoreRabitqHeap,
    "kbcore-rabitq": KbcoreRabitq,
    "kbcore-rabitq1": KbcoreRabitq1,
    "kbcore-rabitq2": KbcoreRabitq2,
    "kbcore-rabitq8": KbcoreRabitq8,
    "kbcore-rabitq-disk": KbcoreRabitqDisk,
    "hnswlib": Hnswlib,
    "faiss": FaissHnsw,
    "faiss-sq8": FaissHnswSq8,
    "faiss-sq8-refine": FaissHnswSq8Refine,
    "faiss-ivfpq-fs": FaissIvfPqFastScan,
    "faiss-hnsw-rabitq-refine": FaissHnswRabitqRefine,
    "symqg": SymphonyQG,
    "symqg-8": SymphonyQG8,
    "symqg-tuned": SymphonyQGTuned,
    "vsag-sq8": VsagHGraph,
    "vsag-rabitq": VsagHGraphRabitq,
    "glass-sq8u": Glass,
    "glass-sq4u": GlassSq4u,
    "usearch": Usearch,
    "usearch-i8": UsearchI8,
    "zvec": Zvec,
    "zvec-int8": ZvecInt8,
    "zvec-int8-refine": ZvecInt8Refine,
}
DEFAULT_LIBS = tuple(name for name in ADAPTERS if name not in AB_VARIANTS)


def cache_folder(cache: Path, name: str, ds: Dataset) -> Path:
    """The ``--index-cache`` folder of one library's index of ``ds``: named by the library, the
    data set's size and a digest of its rows (every 997th row and the last), the build settings
    and the library's version, so a changed data set or setting never reuses a stale index."""
    import hashlib
    from importlib import metadata

    # A variant that only reopens another library's build differently shares its folder.
    name = getattr(ADAPTERS.get(name), "cache_as", name)
    dist = {"kbcore": "kbcore", "symqg": "rabitqlib", "zvec": "zvec", "hnswlib": "hnswlib"}
    version = "?"
    for prefix, package in dist.items():
        if name.startswith(prefix):
            try:
                version = metadata.version(package)
            except metadata.PackageNotFoundError:
                pass
    if name.startswith("kbcore"):
        # Index.add reorders the slots of a large build (REORDER_MIN_ROWS): an index saved by a
        # kbcore without that step, or with another threshold, is not reused.
        from kbcore.index import _index

        version += f" reorder{getattr(_index, 'REORDER_MIN_ROWS', None)}"
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(ds.base[::997]).tobytes())
    h.update(np.ascontiguousarray(ds.base[-1:]).tobytes())
    h.update(f"{name} {ds.n} {ds.dim} M{M} efc{EF_CONSTRUCTION} t{BUILD_THREADS} {version}".encode())
    return cache / f"{name}-{ds.name}-{ds.n}x{ds.dim}-{h.hexdigest()[:16]}"


def _restore(adapter: Adapter, folder: Path, ds: Dataset) -> dict | None:
    """Loads a cached index into ``adapter``; None when there is none (or the adapter has no
    cache support). The build figures are the ones measured when it was built."""
    meta = folder / "build.json"
    if not meta.is_file():
        return None
    rss0 = settle_memory()
    t0 = time.perf_counter()
    try:
        adapter.restore(folder, ds.dim, ds.n)
    except NotImplementedError:
        return None
    info = json.loads(meta.read_text())
    info["restored_from"] = str(folder)
    info["restore_s"] = time.perf_counter() - t0
    info["restored_rss_bytes_per_vector"] = (settle_memory() - rss0) / ds.n
    return info


def _persist(adapter: Adapter, folder: Path, info: dict) -> None:
    """Writes the built index beside its build figures; a partial folder is never reused (the
    figures are written last, and the folder is renamed into place)."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        adapter.persist(tmp)
    except NotImplementedError:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    (tmp / "build.json").write_text(json.dumps(info))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def build_all(names: Sequence[str], ds: Dataset, cache: Path | None = None) -> tuple[list[Adapter], dict[str, dict]]:
    """Builds each library's index (or, with ``cache``, reopens the one an earlier process built
    and saved there: ``--index-cache``)."""
    adapters: list[Adapter] = []
    info: dict[str, dict] = {}
    for name in names:
        try:
            adapter = ADAPTERS[name]()
        except ImportError as exc:  # a library not installed is reported, not silently dropped
            log(f"  {name:15s} SKIPPED: {exc}")
            info[name] = {"skipped": str(exc)}
            continue
        folder = cache_folder(cache, name, ds) if cache is not None else None
        if folder is not None:
            restored = _restore(adapter, folder, ds)
            if restored is not None:
                info[name] = restored
                log(
                    f"  {name:15s} reopened from {folder.name} in {restored['restore_s']:.2f} s "
                    f"(built in {restored['build_s']:.2f} s)"
                )
                adapters.append(adapter)
                continue
        rss0 = settle_memory()
        t0 = time.perf_counter()
        adapter.build(ds.base, BUILD_THREADS)
        build_s = time.perf_counter() - t0
        peak = peak_rss_bytes()
        rss1 = settle_memory()
        info[name] = {
            "build_s": build_s,
            "rss_bytes_per_vector": (rss1 - rss0) / ds.n,
            "peak_rss_bytes_per_vector": (peak - rss0) / ds.n,
        }
        log(
            f"  {name:15s} build {build_s:7.2f} s ({BUILD_THREADS} threads)  "
            f"RSS +{info[name]['rss_bytes_per_vector']:.0f} B/vector"
        )
        if folder is not None:
            _persist(adapter, folder, info[name])
        adapters.append(adapter)
    return adapters, info


def has_batch(adapter: Adapter) -> bool:
    """Whether the adapter implements the one-call, one-thread batch search."""
    return type(adapter).batch is not Adapter.batch


def sweep(
    adapters: Sequence[Adapter], ds: Dataset, efs: Sequence[int], passes: int, batch: bool = False
) -> dict[str, dict]:
    """Per library: recall per ef, and per pass the wall time of one pass over the queries. With
    ``batch``, each pass also times one batch call over all queries on one thread
    (``batch_times``) for every library that has a batch API: the engine cost without the
    per-call binding overhead."""
    inputs = {a.name: a.prepare_single(ds.queries) for a in adapters}
    out: dict[str, dict] = {
        a.name: {"efs": list(efs), "recall": [], "times": [[] for _ in range(passes)]} for a in adapters
    }
    batched = [a for a in adapters if batch and has_batch(a)]
    for a in batched:
        out[a.name]["batch_recall"] = []
        out[a.name]["batch_times"] = [[] for _ in range(passes)]
    for ef in efs:
        fns: dict[str, Callable[[Any], Any]] = {}
        for a in adapters:
            a.set_ef(ef)
            fns[a.name] = a.single_fn()
            # Recall from an untimed pass (also the warm-up of this ef).
            ids = np.stack([a.single_ids(fns[a.name](q)) for q in inputs[a.name]])
            out[a.name]["recall"].append(recall_at_k(ids, ds))
        for p in range(passes):
            order = list(adapters[p % len(adapters) :]) + list(adapters[: p % len(adapters)])
            for a in order:
                fn, qs = fns[a.name], inputs[a.name]
                t0 = time.perf_counter()
                for q in qs:
                    fn(q)
                out[a.name]["times"][p].append(time.perf_counter() - t0)
        for a in batched:
            out[a.name]["batch_recall"].append(recall_at_k(a.batch(ds.queries), ds))  # also the warm-up
        for p in range(passes):
            order = batched[p % len(batched) :] + batched[: p % len(batched)] if batched else []
            for a in order:
                t0 = time.perf_counter()
                a.batch(ds.queries)
                out[a.name]["batch_times"][p].append(time.perf_counter() - t0)
        log(f"  ef {ef:4d}  " + "  ".join(f"{a.name} {out[a.name]['recall'][-1]:.3f}" for a in adapters))
        del fns
    return out


def summarise(res: dict[str, dict], nq: int, reference: str = REFERENCE) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, r in res.items():
        per_pass = {t: [] for t in TARGETS}
        for times in r["times"]:
            curve = [(rec, nq / t) for rec, t in zip(r["recall"], times)]
            for t in TARGETS:
                per_pass[t].append(qps_at_recall(curve, t))
        summary[name] = {
            "qps_per_pass": {str(t): v for t, v in per_pass.items()},
            "qps_median": {str(t): _median(v) for t, v in per_pass.items()},
        }
        if "batch_times" in r:
            batch_pass = {t: [] for t in TARGETS}
            for times in r["batch_times"]:
                curve = [(rec, nq / t) for rec, t in zip(r["batch_recall"], times)]
                for t in TARGETS:
                    batch_pass[t].append(qps_at_recall(curve, t))
            summary[name]["batch_qps_median"] = {str(t): _median(v) for t, v in batch_pass.items()}
    ref = summary.get(reference)
    if ref is not None:
        for s in summary.values():
            s["reference"] = reference
            s["ratio_of_reference"] = {}
            for t in map(str, TARGETS):
                ratios = [a / b for a, b in zip(ref["qps_per_pass"][t], s["qps_per_pass"][t]) if a is not None and b]
                s["ratio_of_reference"][t] = (
                    {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)} if ratios else None
                )
    return summary


def _median(v: Sequence[float | None]) -> float | None:
    vals = [x for x in v if x is not None]
    return statistics.median(vals) if vals else None


def table(name: str, summary: dict[str, Any], info: dict[str, dict], reference: str = REFERENCE) -> str:
    lines = [
        f"\n{name}: QPS at recall@10 (median over passes); {reference} / library (median, min-max)",
        f"{'library':18s} {'@0.95':>9s} {'@0.99':>9s} {'ref/x @0.95':>22s} {'ref/x @0.99':>22s}"
        f" {'B/vector':>9s} {'build s':>8s}",
    ]
    for lib, s in summary.items():
        cells = []
        for t in map(str, TARGETS):
            r = s.get("ratio_of_reference", {}).get(t)
            cells.append("n/a" if r is None else f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
        lines.append(
            f"{lib:18s} {fmt(s['qps_median']['0.95'], '.0f'):>9s} {fmt(s['qps_median']['0.99'], '.0f'):>9s}"
            f" {cells[0]:>22s} {cells[1]:>22s} {info[lib]['rss_bytes_per_vector']:9.0f}"
            f" {info[lib]['build_s']:8.2f}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="folder holding scifact/ (default $KBCORE_DATA)")
    p.add_argument("--datasets", default="scifact,synthetic", help="scifact, arguana, synthetic")
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="synthetic base size (default 100000; 1000000: the opt-in large run); for a real set, its prefix",
    )
    p.add_argument("--nq", type=int, default=None, help="synthetic queries (default 1000); for a real set, a prefix")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)))
    p.add_argument(
        "--libs",
        default=",".join(DEFAULT_LIBS),
        help=f"default: every library but the A/B variants; known: {','.join(ADAPTERS)}",
    )
    p.add_argument("--json", default=None)
    p.add_argument(
        "--batch",
        action="store_true",
        help="also time one batch call over all queries on one thread per pass (libraries with a batch API)",
    )
    p.add_argument(
        "--index-cache",
        default=None,
        help="folder of built indexes: each library's index is saved there after its build and "
        "reopened by later processes on the same data and settings (large runs through benches.fresh)",
    )
    p.add_argument("--reference", default=REFERENCE, help="the library every ratio is taken against")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 passes: checks the script runs (seconds)")
    p.add_argument(
        "--recall-only",
        action="store_true",
        help="no timed passes: recall@10 per ef and library only (safe on a busy machine)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    libs = [x for x in args.libs.split(",") if x]
    unknown = [x for x in libs if x not in ADAPTERS]
    if unknown:
        raise SystemExit(f"unknown libraries {unknown}; known: {list(ADAPTERS)}")
    efs = [int(x) for x in args.efs.split(",")]
    passes = args.passes
    if args.smoke:
        passes, efs = 2, efs[:3]
    if args.recall_only:
        passes = 0
    elif passes < 5:
        log(f"WARNING: --passes {passes} < 5: ratios will not be reported with a meaningful spread")
    load0 = os.getloadavg()
    log(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    if load0[0] > LOAD_WARN:
        log(f"WARNING: 1-minute load {load0[0]:.2f} > {LOAD_WARN}: the machine is not quiet, timings are suspect")
    results: dict[str, Any] = {
        "libs": libs,
        "efs": efs,
        "passes": passes,
        "M": M,
        "ef_construction": EF_CONSTRUCTION,
        "build_threads": BUILD_THREADS,
        "load_start": load0,
        "datasets": {},
    }
    for dname in [x for x in args.datasets.split(",") if x]:
        if dname in ("scifact", "arguana"):
            ds = load_real(dname, args.data)
            if args.smoke:
                ds = _shrink(ds, 3000, 50)
            elif args.n is not None or args.nq is not None:  # a prefix (the smoke runs of benches.fresh)
                ds = _shrink(ds, min(args.n or ds.n, ds.n), min(args.nq or ds.nq, ds.nq))
        elif dname == "synthetic":
            ds = make_synthetic(2000 if args.smoke else args.n or 100_000, 50 if args.smoke else args.nq or 1000)
        else:
            raise SystemExit(f"unknown dataset {dname!r}")
        log(f"\n== {ds.name}: {ds.n} x {ds.dim}, {ds.nq} queries")
        adapters, info = build_all(libs, ds, Path(args.index_cache) if args.index_cache else None)
        res = sweep(adapters, ds, efs, passes, batch=args.batch)
        summary = summarise(res, ds.nq, args.reference) if passes else {}
        if passes:
            log(table(ds.name, summary, {a.name: info[a.name] for a in adapters}, args.reference))
        results["datasets"][ds.name] = {
            "n": ds.n,
            "dim": ds.dim,
            "nq": ds.nq,
            "build": info,
            "sweep": res,
            "summary": summary,
        }
        for a in adapters:
            a.close()
        del adapters
        settle_memory()
    load1 = os.getloadavg()
    results["load_end"] = load1
    log(f"\nload average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


def load_real(name: str, data: str | None) -> Dataset:
    """SciFact or ArguAna chunks (the same folder layout): ``data`` is the root holding both
    folders (default ``$KBCORE_DATA``), or for SciFact the folder itself."""
    if name == "scifact":
        return load_scifact(data)
    root = Path(data) if data else Path(os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    ds = load_scifact(root / name)
    ds.name = name
    return ds


def _shrink(ds: Dataset, n: int, nq: int) -> Dataset:
    """A prefix of the base with exact ground truth recomputed (smoke runs only)."""
    from benches.datasets import exact_top_k

    base = np.ascontiguousarray(ds.base[:n])
    queries = np.ascontiguousarray(ds.queries[:nq])
    gt_ids, gt_scores = exact_top_k(base, queries, K)
    return Dataset(ds.name, base, queries, gt_ids, gt_scores, dict(ds.info))


if __name__ == "__main__":
    sys.exit(main())
