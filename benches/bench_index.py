"""Side-by-side benchmark of the kbcore native index against hnswlib, faiss and usearch (issue 2).

Run from the repository root::

    python -m benches.bench_index [--data DIR] [--n 100000] [--quick] [--json OUT] [--plot OUT.png]
                                  [--libs kbcore,hnswlib,faiss,usearch] [--datasets scifact,synthetic]

All libraries are measured in this one process on the same arrays, one index alive at a time.
See benches/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benches.datasets import Dataset, load_scifact, make_synthetic, scifact_dir

K = 10
M = 16
EF_CONSTRUCTION = 200
BUILD_THREADS = 2
DEFAULT_EFS = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
RECALL_TARGETS = (0.95, 0.99)
DEFAULT_EF_MIN_RECALL = 0.95
HNSW_LIBS = ("kbcore", "hnswlib", "faiss", "usearch")
TIE_EPS = 1e-5
CPU_PER_WALL_WARN = 1.3  # a single-thread timing that used more CPU than this was not single-threaded


# ----------------------------------------------------------------------------------------------
# process memory


_LIBC: Any = None
try:
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:
    pass


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def settle_memory() -> int:
    """Collect garbage, give freed heap pages back to the OS, reset the peak; return RSS in bytes."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    return _status_kib("VmHWM") * 1024


# ----------------------------------------------------------------------------------------------
# library adapters: build / set ef / per-query callable / batch search, nothing else


class Adapter:
    """Thin uniform wrapper; the timed loops call the library directly through ``single_fn``."""

    name = ""

    def build(self, x: np.ndarray, threads: int) -> None:
        raise NotImplementedError

    def set_ef(self, ef: int) -> None:
        raise NotImplementedError

    def prepare_single(self, q: np.ndarray) -> list:
        """Per-query inputs in the shape the library accepts for a single query (built outside timing)."""
        return list(q)

    def single_fn(self) -> Callable[[Any], Any]:
        raise NotImplementedError

    def single_ids(self, raw: Any) -> np.ndarray:
        raise NotImplementedError

    def batch(self, q: np.ndarray) -> np.ndarray:
        """Search all queries in one call with one thread; return int64 ids [nq, K]."""
        raise NotImplementedError

    def batch_threads(self, q: np.ndarray, threads: int) -> np.ndarray:
        """Search all queries in one call with ``threads`` threads; return int64 ids [nq, K]."""
        raise NotImplementedError

    def save(self, path: str) -> None:
        """Write the index to the file ``path`` with the library's own persistence."""
        raise NotImplementedError

    def load(self, path: str) -> Any:
        """Read back what :meth:`save` wrote; return the loaded index object."""
        raise NotImplementedError

    def persist(self, folder: Path) -> None:
        """Write the built index into the (empty) ``folder`` for ``--index-cache``; an adapter
        without it raises NotImplementedError and is rebuilt in every process."""
        raise NotImplementedError

    def restore(self, folder: Path, dim: int, n: int) -> None:
        """Make ``self.index`` the index :meth:`persist` wrote into ``folder`` (``dim`` x ``n``)."""
        raise NotImplementedError

    def own_memory(self) -> int | None:
        return None

    def close(self) -> None:
        self.index = None


class KbcoreHnsw(Adapter):
    name = "kbcore"

    def __init__(self) -> None:
        import kbcore

        self.kbcore = kbcore
        self.index: Any = None
        self.ef = 64

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.kbcore.Index(x.shape[1], metric="cosine", kind="hnsw", M=M, ef_construction=EF_CONSTRUCTION)
        self.index.add(x, np.arange(x.shape[0], dtype=np.int64), threads=threads)

    def set_ef(self, ef: int) -> None:
        self.ef = ef

    def single_fn(self) -> Callable[[Any], Any]:
        search, ef = self.index.search, self.ef
        return lambda q: search(q, k=K, ef=ef, threads=1)

    def single_ids(self, raw: Any) -> np.ndarray:
        return np.asarray(raw[0], dtype=np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(self.index.search(q, k=K, ef=self.ef, threads=1)[0], dtype=np.int64)

    def batch_threads(self, q: np.ndarray, threads: int) -> np.ndarray:
        return np.asarray(self.index.search(q, k=K, ef=self.ef, threads=threads)[0], dtype=np.int64)

    def save(self, path: str) -> None:
        self.index.save(path)  # kbcore fsyncs before its atomic rename

    def load(self, path: str) -> Any:
        return self.kbcore.Index.load(path)

    def persist(self, folder: Path) -> None:
        self.index.save(folder / "index.kbi")

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self.index = self.kbcore.Index.load(folder / "index.kbi")  # reopened as saved

    def own_memory(self) -> int | None:
        fn = getattr(self.index, "memory_usage", None)
        return int(fn()) if callable(fn) else None


class Hnswlib(Adapter):
    name = "hnswlib"

    def __init__(self) -> None:
        import hnswlib

        self.hnswlib = hnswlib
        self.index: Any = None

    def build(self, x: np.ndarray, threads: int) -> None:
        self.index = self.hnswlib.Index(space="cosine", dim=x.shape[1])
        self.index.init_index(max_elements=x.shape[0], M=M, ef_construction=EF_CONSTRUCTION, random_seed=42)
        self.index.set_num_threads(threads)
        self.index.add_items(x, np.arange(x.shape[0]), num_threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def single_fn(self) -> Callable[[Any], Any]:
        knn = self.index.knn_query
        return lambda q: knn(q, k=K, num_threads=1)

    def single_ids(self, raw: Any) -> np.ndarray:
        return raw[0][0].astype(np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return self.index.knn_query(q, k=K, num_threads=1)[0].astype(np.int64)

    def batch_threads(self, q: np.ndarray, threads: int) -> np.ndarray:
        return self.index.knn_query(q, k=K, num_threads=threads)[0].astype(np.int64)

    def save(self, path: str) -> None:
        self.index.save_index(path)

    def load(self, path: str) -> Any:
        index = self.hnswlib.Index(space="cosine", dim=self.index.dim)
        index.load_index(path, max_elements=self.index.get_max_elements())
        return index

    def persist(self, folder: Path) -> None:
        self.index.save_index(str(folder / "index.bin"))

    def restore(self, folder: Path, dim: int, n: int) -> None:
        self.index = self.hnswlib.Index(space="cosine", dim=dim)
        self.index.load_index(str(folder / "index.bin"), max_elements=n)


class FaissHnsw(Adapter):
    name = "faiss"

    def __init__(self) -> None:
        import faiss

        self.faiss = faiss
        self.index: Any = None

    def build(self, x: np.ndarray, threads: int) -> None:
        self.faiss.omp_set_num_threads(threads)
        self.index = self.faiss.IndexHNSWFlat(x.shape[1], M, self.faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = EF_CONSTRUCTION
        self.index.add(x)
        self.faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.faiss.omp_set_num_threads(1)
        self.index.hnsw.efSearch = ef

    def prepare_single(self, q: np.ndarray) -> list:
        return [row[None, :] for row in q]  # faiss only takes 2-D input

    def single_fn(self) -> Callable[[Any], Any]:
        search = self.index.search
        return lambda q: search(q, K)

    def single_ids(self, raw: Any) -> np.ndarray:
        return raw[1][0].astype(np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return self.index.search(q, K)[1].astype(np.int64)

    def batch_threads(self, q: np.ndarray, threads: int) -> np.ndarray:
        self.faiss.omp_set_num_threads(threads)
        try:
            return self.index.search(q, K)[1].astype(np.int64)
        finally:
            self.faiss.omp_set_num_threads(1)

    def save(self, path: str) -> None:
        self.faiss.write_index(self.index, path)

    def load(self, path: str) -> Any:
        return self.faiss.read_index(path)


class Usearch(Adapter):
    name = "usearch"

    def __init__(self) -> None:
        from usearch.index import Index

        self.cls = Index
        self.index: Any = None

    def build(self, x: np.ndarray, threads: int) -> None:
        # dtype must be explicit: usearch 2.26 stores bf16 by default, the others store float32.
        self.index = self.cls(
            ndim=x.shape[1],
            metric="cos",
            dtype="f32",
            connectivity=M,
            expansion_add=EF_CONSTRUCTION,
            expansion_search=64,
        )
        self.index.add(np.arange(x.shape[0], dtype=np.uint64), x, threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.expansion_search = ef

    def single_fn(self) -> Callable[[Any], Any]:
        search = self.index.search
        return lambda q: search(q, K, threads=1)

    def single_ids(self, raw: Any) -> np.ndarray:
        return np.asarray(raw.keys, dtype=np.int64)

    def batch(self, q: np.ndarray) -> np.ndarray:
        return self.batch_threads(q, 1)

    def batch_threads(self, q: np.ndarray, threads: int) -> np.ndarray:
        m = self.index.search(q, K, threads=threads)
        keys = np.asarray(m.keys).astype(np.int64)
        keys[np.arange(K)[None, :] >= np.asarray(m.counts)[:, None]] = -1
        return keys

    def save(self, path: str) -> None:
        self.index.save(path)

    def load(self, path: str) -> Any:
        return self.cls.restore(path)

    def own_memory(self) -> int | None:
        return int(self.index.memory_usage)


ADAPTERS: dict[str, type[Adapter]] = {
    "kbcore": KbcoreHnsw,
    "hnswlib": Hnswlib,
    "faiss": FaissHnsw,
    "usearch": Usearch,
}


# ----------------------------------------------------------------------------------------------
# measurement helpers


def recall_at_k(pred: np.ndarray, ds: Dataset, *, ties: bool = False) -> float:
    """Mean |pred ∩ exact top-k| / k. With ``ties`` a hit is any id scoring >= the exact k-th score - eps."""
    if not ties:
        hits = sum(len(set(p.tolist()) & set(g.tolist())) for p, g in zip(pred, ds.gt_ids))
        return hits / (K * len(pred))
    safe = np.where(pred >= 0, pred, 0)
    scores = np.einsum("qd,qkd->qk", ds.queries, ds.base[safe])
    ok = (pred >= 0) & (scores >= ds.gt_scores[:, K - 1 : K] - TIE_EPS)
    # a duplicate id can only be counted once
    uniq = [len(set(p[o].tolist())) for p, o in zip(pred, ok)]
    return float(sum(uniq)) / (K * len(pred))


class Timing(list):
    """Wall times (s) of the repeats; ``cpu`` holds the matching process CPU times (s)."""

    cpu: list[float]

    @property
    def cpu_per_wall(self) -> float:
        """Process CPU time / wall time of the median run: ~1.0 confirms a single busy thread."""
        i = sorted(range(len(self)), key=self.__getitem__)[len(self) // 2]
        return self.cpu[i] / self[i]


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Timing, Any]:
    """Run ``fn`` ``repeats`` times with gc paused; return the wall/CPU times and the last result."""
    times = Timing()
    times.cpu = []
    out = None
    for _ in range(repeats):
        gc.disable()
        try:
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            times.cpu.append(time.process_time() - c0)
        finally:
            gc.enable()
    return times, out


def qps_at_recall(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """QPS at ``target`` recall on a (recall, qps) curve ordered by increasing ef.

    Linear interpolation between the last point below and the first point at/above the target;
    if the smallest ef already reaches it, that point's QPS (a lower bound); None if never reached.
    """
    for i, (r, q) in enumerate(curve):
        if r >= target:
            if i == 0:
                return q
            r0, q0 = curve[i - 1]
            if r == r0:
                return q
            return q0 + (q - q0) * (target - r0) / (r - r0)
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def log(msg: str = "") -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# per-library benchmark


def build_one(adapter: Adapter, ds: Dataset) -> dict:
    """Build with BUILD_THREADS threads; time it and measure the RSS it adds (indexes built earlier stay alive)."""
    res: dict[str, Any] = {}
    rss0 = settle_memory()
    c0 = time.process_time()
    t0 = time.perf_counter()
    adapter.build(ds.base, BUILD_THREADS)
    res["build_s"] = time.perf_counter() - t0
    res["build_cpu_s"] = time.process_time() - c0  # ~BUILD_THREADS x build_s when the cores were free
    peak = peak_rss_bytes()
    rss1 = settle_memory()
    res["rss_delta_bytes"] = rss1 - rss0
    res["rss_bytes_per_vector"] = (rss1 - rss0) / ds.n
    res["peak_rss_delta_bytes"] = peak - rss0
    own = adapter.own_memory()
    res["own_memory_bytes"] = own
    res["own_bytes_per_vector"] = None if own is None else own / ds.n
    log(
        f"  {adapter.name:8s} build {res['build_s']:.2f} s ({BUILD_THREADS} threads, "
        f"cpu {res['build_cpu_s']:.2f} s = {res['build_cpu_s'] / res['build_s']:.2f} cores busy), "
        f"RSS +{res['rss_bytes_per_vector']:.0f} B/vector (peak +{res['peak_rss_delta_bytes'] / ds.n:.0f}), "
        f"own accounting {fmt(res['own_bytes_per_vector'], '.0f')} B/vector"
    )
    return res


def run_sweep(
    adapters: Sequence[Adapter], ds: Dataset, efs: Sequence[int], repeats: int, mt_threads: int = 0
) -> dict[str, list[dict]]:
    """Time the single-query loop and the batch at every ef for every library.

    With ``mt_threads`` > 1 the batch is also timed with that many search threads (``batch_mt``,
    the all-cores throughput).

    Repeats are interleaved across libraries (the order rotates each round), so a burst of load
    from other processes on a shared machine hits all libraries alike instead of one of them.
    A separate function on purpose: the per-query callables hold references to the indexes and
    must be gone before the indexes are deleted.
    """
    q = ds.queries
    inputs = {a.name: a.prepare_single(q) for a in adapters}
    sweeps: dict[str, list[dict]] = {a.name: [] for a in adapters}
    for ef in efs:
        loop_t: dict[str, Timing] = {}
        batch_t: dict[str, Timing] = {}
        raws: dict[str, Any] = {}
        batch_ids: dict[str, np.ndarray] = {}
        mt_t: dict[str, Timing] = {}
        mt_ids: dict[str, np.ndarray] = {}
        fns = {}
        for a in adapters:
            a.set_ef(ef)
            fns[a.name] = a.single_fn()
            loop_t[a.name] = Timing()
            loop_t[a.name].cpu = []
            batch_t[a.name] = Timing()
            batch_t[a.name].cpu = []
            mt_t[a.name] = Timing()
            mt_t[a.name].cpu = []
        for rep in range(repeats):
            order = list(adapters[rep % len(adapters) :]) + list(adapters[: rep % len(adapters)])
            for a in order:
                a.set_ef(ef)  # faiss: also re-pins OpenMP to one thread
                fn, vin = fns[a.name], inputs[a.name]
                t, raws[a.name] = timed(lambda fn=fn, vin=vin: [fn(v) for v in vin], 1)
                loop_t[a.name].append(t[0])
                loop_t[a.name].cpu.append(t.cpu[0])
                t, batch_ids[a.name] = timed(lambda a=a: a.batch(q), 1)
                batch_t[a.name].append(t[0])
                batch_t[a.name].cpu.append(t.cpu[0])
                if mt_threads > 1:
                    t, mt_ids[a.name] = timed(lambda a=a: a.batch_threads(q, mt_threads), 1)
                    mt_t[a.name].append(t[0])
                    mt_t[a.name].cpu.append(t.cpu[0])
        for a in adapters:
            lt, bt = loop_t[a.name], batch_t[a.name]
            loop_ids = np.stack([a.single_ids(r) for r in raws[a.name]])
            sweeps[a.name].append(
                {
                    "ef": ef,
                    "recall_loop": recall_at_k(loop_ids, ds),
                    "recall_batch": recall_at_k(batch_ids[a.name], ds),
                    "qps_loop": ds.nq / statistics.median(lt),
                    "qps_batch": ds.nq / statistics.median(bt),
                    "latency_us_loop": 1e6 * statistics.median(lt) / ds.nq,
                    "loop_times_s": list(lt),
                    "batch_times_s": list(bt),
                    "cpu_per_wall_loop": lt.cpu_per_wall,
                    "cpu_per_wall_batch": bt.cpu_per_wall,
                }
            )
            if mt_threads > 1:
                mt = mt_t[a.name]
                sweeps[a.name][-1].update(
                    {
                        "recall_batch_mt": recall_at_k(mt_ids[a.name], ds),
                        "qps_batch_mt": ds.nq / statistics.median(mt),
                        "batch_mt_times_s": list(mt),
                        "cpu_per_wall_batch_mt": mt.cpu_per_wall,
                        "batch_mt_threads": mt_threads,
                    }
                )
        log(
            f"    ef {ef:4d} | "
            + " | ".join(
                f"{a.name} {sweeps[a.name][-1]['recall_loop']:.4f} {sweeps[a.name][-1]['qps_loop']:6.0f}"
                f"/{sweeps[a.name][-1]['qps_batch']:.0f}"
                + (f"/{sweeps[a.name][-1]['qps_batch_mt']:.0f}" if mt_threads > 1 else "")
                for a in adapters
            )
        )
        for a in adapters:
            p = sweeps[a.name][-1]
            if p["recall_loop"] != p["recall_batch"]:
                log(f"      note: {a.name} batch recall {p['recall_batch']:.4f} differs from loop recall")
            if max(p["cpu_per_wall_loop"], p["cpu_per_wall_batch"]) > CPU_PER_WALL_WARN:
                log(
                    f"      WARNING: {a.name} cpu/wall {p['cpu_per_wall_loop']:.2f}/{p['cpu_per_wall_batch']:.2f} "
                    "(more than one thread busy in a 1-thread search)"
                )
    return sweeps


def bench_kbcore_default_ef(adapter: KbcoreHnsw, ds: Dataset) -> dict:
    index = adapter.index
    ef = int(index.ef)
    ids = np.asarray(index.search(ds.queries, k=K, threads=1)[0], dtype=np.int64)
    rec = recall_at_k(ids, ds)
    out = {"ef": ef, "recall": rec, "recall_ties": recall_at_k(ids, ds, ties=True), "ok": rec >= DEFAULT_EF_MIN_RECALL}
    log(
        f"    kbcore default ef={ef}: recall@{K} {rec:.4f} "
        f"({'PASS' if out['ok'] else 'FAIL'}, need >= {DEFAULT_EF_MIN_RECALL})"
    )
    return out


def sweep_modes(sweep: Sequence[dict]) -> tuple[str, ...]:
    """The timing modes present in a sweep: loop, batch and (if measured) batch_mt."""
    return ("loop", "batch") + (("batch_mt",) if sweep and "qps_batch_mt" in sweep[0] else ())


def bench_save_load(adapter: Adapter, ds: Dataset) -> dict:
    """Save to a temporary file (fsync included), then load it back; times and file size.

    kbcore's ``save`` fsyncs on its own; the anchors' files get the same explicit fsync, so
    ``save_s`` compares durable writes. ``save_call_s`` is the library call alone. The load
    reads from the page cache (the file was just written): it measures parsing and allocation,
    not the disk.
    """
    import tempfile

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kbcore-bench-save-") as tmp:
        path = os.path.join(tmp, f"{adapter.name}.index")
        settle_memory()
        t0 = time.perf_counter()
        adapter.save(path)
        out["save_call_s"] = time.perf_counter() - t0
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        out["save_s"] = time.perf_counter() - t0
        out["file_bytes"] = os.path.getsize(path)
        out["file_bytes_per_vector"] = out["file_bytes"] / ds.n
        t0 = time.perf_counter()
        loaded = adapter.load(path)
        out["load_s"] = time.perf_counter() - t0
        del loaded
    settle_memory()
    log(
        f"    {adapter.name:8s} save {out['save_s']:.3f} s (call {out['save_call_s']:.3f} s), "
        f"load {out['load_s']:.3f} s, file {out['file_bytes_per_vector']:.0f} B/vector"
    )
    return out


def bench_hnsw_all(
    libs: Sequence[str],
    ds: Dataset,
    efs: Sequence[int],
    repeats: int,
    mt_threads: int = 0,
    save_load: bool = False,
) -> dict:
    """Build every library's index one after the other (all stay alive), then run the interleaved sweep.

    ``mt_threads`` > 1 adds the all-cores batch timing; ``save_load`` adds save/load timings after
    the sweep (one library at a time, the loaded copy is freed at once)."""
    out: dict[str, dict] = {}
    rss_start = settle_memory()
    adapters = []
    for name in libs:
        adapter = ADAPTERS[name]()
        out[name] = build_one(adapter, ds)
        if name == "kbcore":
            out[name]["default_ef"] = bench_kbcore_default_ef(adapter, ds)
        adapters.append(adapter)
    log(
        f"  ef sweep, 1 search thread, median of {repeats} interleaved runs; per library: recall@{K} loop-QPS/batch-QPS"
    )
    sweeps = run_sweep(adapters, ds, efs, repeats, mt_threads)
    for name, sweep in sweeps.items():
        out[name]["sweep"] = sweep
        out[name]["at_recall"] = {
            str(t): {
                mode: qps_at_recall([(p[f"recall_{mode}"], p[f"qps_{mode}"]) for p in sweep], t)
                for mode in sweep_modes(sweep)
            }
            for t in RECALL_TARGETS
        }
    if save_load:
        log("  save / load (temporary file, fsync included in save):")
        for a in adapters:
            out[a.name]["save_load"] = bench_save_load(a, ds)
    for a in adapters:
        a.close()
    del adapters
    left = settle_memory() - rss_start
    for name in out:
        out[name]["rss_after_delete_all_bytes"] = left
    log(f"  RSS left after deleting all HNSW indexes: {left / 2**20:+.1f} MiB")
    return out


def bench_flat(libs: Sequence[str], ds: Dataset, repeats: int) -> dict:
    """Exact search, 1 thread, whole query batch: kbcore flat vs faiss IndexFlatIP, interleaved repeats."""
    import faiss

    out: dict[str, Any] = {}
    x, q = ds.base, ds.queries
    searches: dict[str, Callable[[], np.ndarray]] = {}
    rss0 = settle_memory()
    if "kbcore" in libs:
        import kbcore

        kb_index = kbcore.Index(ds.dim, metric="cosine", kind="flat")
        kb_index.add(x, np.arange(ds.n, dtype=np.int64), threads=BUILD_THREADS)
        searches["kbcore"] = lambda: np.asarray(kb_index.search(q, k=K, threads=1)[0], dtype=np.int64)
        rss1 = settle_memory()
        out["kbcore"] = {"rss_bytes_per_vector": (rss1 - rss0) / ds.n}
        rss0 = rss1
    faiss.omp_set_num_threads(1)
    fa_index = faiss.IndexFlatIP(ds.dim)
    fa_index.add(x)
    searches["faiss"] = lambda: fa_index.search(q, K)[1].astype(np.int64)
    out["faiss"] = {"rss_bytes_per_vector": (settle_memory() - rss0) / ds.n}

    times: dict[str, Timing] = {}
    ids: dict[str, np.ndarray] = {}
    for name in searches:
        times[name] = Timing()
        times[name].cpu = []
    names = list(searches)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t, ids[name] = timed(searches[name], 1)
            times[name].append(t[0])
            times[name].cpu.append(t.cpu[0])
    for name in names:
        med = statistics.median(times[name])
        out[name].update(
            {
                "median_s": med,
                "qps": ds.nq / med,
                "times_s": list(times[name]),
                "cpu_per_wall": times[name].cpu_per_wall,
                "recall": recall_at_k(ids[name], ds),
                "recall_ties": recall_at_k(ids[name], ds, ties=True),
            }
        )
        r = out[name]
        log(
            f"  flat {name:8s} batch {med * 1e3:8.1f} ms ({r['qps']:.0f} QPS, 1 thread, median of {repeats}), "
            f"recall@{K} {r['recall']:.4f} (tie-aware {r['recall_ties']:.4f}), "
            f"RSS +{r['rss_bytes_per_vector']:.0f} B/vector, cpu/wall {r['cpu_per_wall']:.2f}"
        )
    del searches
    if "kbcore" in out:
        kb_res = out["kbcore"]
        kb_res["recall_ok"] = kb_res["recall_ties"] == 1.0
        out["time_ratio_kbcore_over_faiss"] = kb_res["median_s"] / out["faiss"]["median_s"]
        log(
            f"  flat kbcore/faiss time ratio {out['time_ratio_kbcore_over_faiss']:.2f}; "
            f"kbcore flat recall {'PASS' if kb_res['recall_ok'] else 'FAIL'} (== 1.0 up to exact ties)"
        )
    return out


def warm_up(libs: Sequence[str], dim: int) -> None:
    """Build and search a tiny index with every library once, so lazy one-time initialisation
    (thread pools, BLAS buffers, first-touch of code pages) is not charged to the first measurement."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:50].copy()
    for name in libs:
        adapter = ADAPTERS[name]()
        adapter.build(x, BUILD_THREADS)
        adapter.set_ef(32)
        fn = adapter.single_fn()
        for v in adapter.prepare_single(q):
            fn(v)
        adapter.batch(q)
        adapter.close()
    import faiss

    faiss.omp_set_num_threads(1)
    flat = faiss.IndexFlatIP(dim)
    flat.add(x)
    flat.search(q, K)
    del flat
    if "kbcore" in libs:
        import kbcore

        index = kbcore.Index(dim, metric="cosine", kind="flat")
        index.add(x, np.arange(len(x), dtype=np.int64), threads=BUILD_THREADS)
        index.search(q, k=K, threads=1)
        del index
    settle_memory()


def bench_dataset(
    ds: Dataset,
    libs: Sequence[str],
    efs: Sequence[int],
    repeats: int,
    flat_repeats: int,
    mt_threads: int = 0,
    save_load: bool = False,
) -> dict:
    log(f"\n=== {ds.name}: n={ds.n}, nq={ds.nq}, dim={ds.dim}, k={K}, metric=cosine ===")
    if "crosscheck_exact_top100" in ds.info:
        log(f"  ground truth vs exact_top100_chunks.npy: {ds.info['crosscheck_exact_top100']}")
    out: dict[str, Any] = {"n": ds.n, "nq": ds.nq, "dim": ds.dim, "info": ds.info, "libs": {}}
    warm_up(libs, ds.dim)
    out["libs"] = bench_hnsw_all(libs, ds, efs, repeats, mt_threads, save_load)
    settle_memory()
    out["flat"] = bench_flat(libs, ds, flat_repeats)
    out["ratios"] = compute_ratios(out)
    return out


def compute_ratios(res: dict) -> dict:
    libs = res["libs"]
    if "kbcore" not in libs:
        return {}
    kb = libs["kbcore"]
    r: dict[str, Any] = {}
    if "hnswlib" in libs:
        r["build_time_kbcore_over_hnswlib"] = ratio(kb["build_s"], libs["hnswlib"]["build_s"])
        r["build_cpu_kbcore_over_hnswlib"] = ratio(kb["build_cpu_s"], libs["hnswlib"]["build_cpu_s"])
    for other in libs:
        if other == "kbcore":
            continue
        r[f"mem_per_vector_kbcore_over_{other}"] = ratio(
            kb["rss_bytes_per_vector"], libs[other]["rss_bytes_per_vector"]
        )
        for t in RECALL_TARGETS:
            for mode in kb["at_recall"][str(t)]:
                r[f"qps@{t}_{mode}_kbcore_over_{other}"] = ratio(
                    kb["at_recall"][str(t)][mode], libs[other]["at_recall"][str(t)][mode]
                )
    return r


# ----------------------------------------------------------------------------------------------
# report


def summary_table(name: str, res: dict) -> str:
    libs = res["libs"]
    lines = [f"\n## {name}  (n={res['n']}, nq={res['nq']}, dim={res['dim']}, M={M}, efC={EF_CONSTRUCTION}, k={K})"]
    head = (
        f"| {'library':8s} | build s | build cpu s | B/vec RSS | B/vec own | "
        + " | ".join(f"QPS@{t} loop | QPS@{t} batch" for t in RECALL_TARGETS)
        + " | R@10 ef=64 | lat µs ef=64 |"
    )
    lines.append(head)
    lines.append("|" + "|".join("---" for _ in head.split("|")[1:-1]) + "|")
    for lib, r in libs.items():
        at64 = next((p for p in r["sweep"] if p["ef"] == 64), None)
        cells = [
            f"{lib:8s}",
            f"{r['build_s']:.2f}",
            f"{r['build_cpu_s']:.2f}",
            f"{r['rss_bytes_per_vector']:.0f}",
            fmt(r["own_bytes_per_vector"], ".0f"),
        ]
        for t in RECALL_TARGETS:
            for mode in ("loop", "batch"):
                cells.append(fmt(r["at_recall"][str(t)][mode], ".0f"))
        cells.append(fmt(at64["recall_loop"], ".4f") if at64 else "n/a")
        cells.append(fmt(at64["latency_us_loop"], ".0f") if at64 else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    busy = {lib: r["build_cpu_s"] / r["build_s"] for lib, r in libs.items()}
    if min(busy.values(), default=BUILD_THREADS) < 0.8 * BUILD_THREADS:
        lines.append(
            "WARNING: builds got fewer than the 2 cores they asked for (cpu/wall "
            + ", ".join(f"{lib} {v:.2f}" for lib, v in busy.items())
            + "): the machine was busy, build times are inflated"
        )
    flat = res.get("flat", {})
    if flat:
        lines.append("")
        lines.append("| exact flat (1 thread, batch) | ms | QPS | recall@10 | tie-aware |")
        lines.append("|---|---|---|---|---|")
        for lib in ("kbcore", "faiss"):
            if lib in flat:
                f = flat[lib]
                lines.append(
                    f"| {lib} | {f['median_s'] * 1e3:.1f} | {f['qps']:.0f} | {f['recall']:.4f} "
                    f"| {f['recall_ties']:.4f} |"
                )
    if any("save_load" in r for r in libs.values()):
        lines.append("")
        lines.append("| save / load | save s (fsync) | load s | file B/vector |")
        lines.append("|---|---|---|---|")
        for lib, r in libs.items():
            sl = r.get("save_load")
            if sl:
                lines.append(f"| {lib} | {sl['save_s']:.3f} | {sl['load_s']:.3f} | {sl['file_bytes_per_vector']:.0f} |")
    if "kbcore" in libs:
        kb = libs["kbcore"]
        lines.append("")
        d = kb.get("default_ef", {})
        lines.append(
            f"kbcore recall@10 at default ef={d.get('ef')}: {fmt(d.get('recall'), '.4f')} "
            f"({'PASS' if d.get('ok') else 'FAIL'} >= {DEFAULT_EF_MIN_RECALL})"
        )
        rr = res["ratios"]
        lines.append(
            f"build time kbcore/hnswlib: wall {fmt(rr.get('build_time_kbcore_over_hnswlib'), '.2f')}, "
            f"cpu {fmt(rr.get('build_cpu_kbcore_over_hnswlib'), '.2f')}"
        )
        for other in libs:
            if other == "kbcore":
                continue
            parts = [f"mem {fmt(rr.get(f'mem_per_vector_kbcore_over_{other}'), '.2f')}"]
            for t in RECALL_TARGETS:
                for mode in ("loop", "batch"):
                    parts.append(f"QPS@{t} {mode} {fmt(rr.get(f'qps@{t}_{mode}_kbcore_over_{other}'), '.2f')}")
            lines.append(f"kbcore/{other}: " + ", ".join(parts))
        if "time_ratio_kbcore_over_faiss" in flat:
            lines.append(
                f"flat time kbcore/faiss: {flat['time_ratio_kbcore_over_faiss']:.2f}; kbcore flat recall "
                f"{'PASS' if flat['kbcore'].get('recall_ok') else 'FAIL'}"
            )
    return "\n".join(lines)


def machine_info(libs: Sequence[str]) -> dict:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
            fh.seek(0)
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    info["cpu_simd_flags"] = sorted(f for f in flags if f.startswith(("avx", "sse4", "fma")))
                    break
    except OSError:
        pass
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    from importlib import metadata

    for pkg in ("hnswlib", "faiss-cpu", "usearch", "kbcore"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = None
    if "faiss" in libs:
        import faiss

        info["faiss_compile_options"] = faiss.get_compile_options()
    if "usearch" in libs:
        from usearch.index import Index

        info["usearch_hardware_acceleration"] = Index(ndim=384, metric="cos", dtype="f32").hardware_acceleration
    if "kbcore" in libs:
        import kbcore

        info["kbcore_simd_level"] = kbcore.simd_level() if hasattr(kbcore, "simd_level") else None
        if hasattr(kbcore, "available_simd_levels"):
            info["kbcore_available_simd_levels"] = list(kbcore.available_simd_levels())
    return info


def plot_curves(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 4.2 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for col, mode in enumerate(("loop", "batch")):
            ax = axes[row][col]
            for lib, r in results[name]["libs"].items():
                rec = [p[f"recall_{mode}"] for p in r["sweep"]]
                qps = [p[f"qps_{mode}"] for p in r["sweep"]]
                ax.plot(rec, qps, marker="o", ms=3, label=lib)
            for t in RECALL_TARGETS:
                ax.axvline(t, color="grey", lw=0.6, ls=":")
            ax.set_yscale("log")
            ax.set_xlabel("recall@10")
            ax.set_ylabel("QPS (1 thread)")
            ax.set_title(f"{name}: {'single-query loop' if mode == 'loop' else 'one batch'}")
            ax.grid(True, which="both", lw=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", help="data root holding scifact/ (or the scifact folder); default $KBCORE_DATA or ../shared/data"
    )
    p.add_argument("--n", type=int, default=None, help="synthetic base size (default 100000; 20000 with --quick)")
    p.add_argument("--nq", type=int, default=1000, help="synthetic query count (default 1000)")
    p.add_argument("--quick", action="store_true", help="synthetic n=20000 (smoke run)")
    p.add_argument("--json", help="write all results and machine info to this file")
    p.add_argument("--plot", help="write recall/QPS curves to this PNG")
    p.add_argument("--libs", default=",".join(HNSW_LIBS), help="comma list from kbcore,hnswlib,faiss,usearch")
    p.add_argument("--datasets", default="scifact,synthetic", help="comma list from scifact,synthetic")
    p.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)), help="comma list of search ef values")
    p.add_argument("--repeats", type=int, default=3, help="timings per sweep point (median reported)")
    p.add_argument("--flat-repeats", type=int, default=5, help="timings of the exact flat search")
    p.add_argument(
        "--mt-threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="search threads of the all-cores batch timing (default: all usable cores; 0 or 1 skips it)",
    )
    p.add_argument("--no-save-load", action="store_true", help="skip the save/load timings")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    unknown = [lib for lib in libs if lib not in ADAPTERS]
    if unknown:
        raise SystemExit(f"unknown --libs {unknown}; choose from {list(ADAPTERS)}")
    if "kbcore" in libs:
        try:
            import kbcore

            kbcore.Index  # noqa: B018 - the package may exist before the native index does
        except (ImportError, AttributeError) as exc:
            log(f"WARNING: kbcore not usable ({exc!r}); benchmarking the anchors only")
            libs.remove("kbcore")
    efs = [int(e) for e in args.efs.split(",")]
    n = args.n if args.n is not None else (20_000 if args.quick else 100_000)
    wanted = [s.strip() for s in args.datasets.split(",") if s.strip()]

    info = machine_info(libs)
    log(
        f"machine: {info.get('cpu_model')} ({info['affinity_cpus']} cpus), python {info['python']}, "
        f"numpy {info['numpy']}"
    )
    log(
        "versions: "
        + ", ".join(f"{p} {info.get(p)}" for p in ("hnswlib", "faiss-cpu", "usearch", "kbcore"))
        + (f", kbcore simd {info.get('kbcore_simd_level')}" if "kbcore" in libs else "")
    )
    log(f"libraries: {libs}; M={M}, ef_construction={EF_CONSTRUCTION}, build threads={BUILD_THREADS}, search threads=1")

    t_start = time.perf_counter()
    results: dict[str, Any] = {}
    for which in wanted:
        if which == "scifact":
            folder = scifact_dir(args.data)
            if not (folder / "chunk_embeddings.npy").exists():
                log(f"\nskipping scifact: {folder / 'chunk_embeddings.npy'} not found")
                continue
            ds = load_scifact(args.data, K)
        elif which == "synthetic":
            ds = make_synthetic(n, args.nq, k=K)
        else:
            raise SystemExit(f"unknown dataset {which!r}")
        results[ds.name] = bench_dataset(
            ds, libs, efs, args.repeats, args.flat_repeats, args.mt_threads, not args.no_save_load
        )
        del ds
        gc.collect()

    info["loadavg_end"] = os.getloadavg()
    info["total_runtime_s"] = time.perf_counter() - t_start
    log("\n# Summary (QPS = queries/s on 1 thread; loop = one 1-D query per call; batch = one call)")
    for name, res in results.items():
        log(summary_table(name, res))
    log(
        f"\ntotal runtime {info['total_runtime_s']:.0f} s; load average start {info.get('loadavg_start')} "
        f"end {info['loadavg_end']}"
    )

    if args.json:
        config = {
            "k": K,
            "M": M,
            "ef_construction": EF_CONSTRUCTION,
            "build_threads": BUILD_THREADS,
            "search_threads": 1,
            "efs": efs,
            "repeats": args.repeats,
            "flat_repeats": args.flat_repeats,
            "mt_threads": args.mt_threads,
            "save_load": not args.no_save_load,
            "recall_targets": list(RECALL_TARGETS),
            "libs": libs,
        }
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "config": config, "datasets": results}, fh, indent=1)
        log(f"wrote {args.json}")
    if args.plot:
        plot_curves(results, args.plot)
        log(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
