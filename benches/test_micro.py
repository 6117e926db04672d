"""Micro-benchmarks of kbcore's hot paths (pytest-benchmark).

Run from the repository root::

    python -m pytest benches --benchmark-only
    python -m pytest benches --benchmark-only --benchmark-json micro.json   # keep the numbers

These live outside pytest's default ``testpaths`` (``tests``), so a plain ``python -m pytest``
never collects them. Every benchmark is single-threaded and seeded:

- distance kernels per SIMD level: a flat (exact) search of one query over 1,024 x 384
  vectors, for each level this CPU can run (``kbcore.set_simd_level``), per metric;
- one HNSW search (k = 10, ef = 64) over 20,000 x 384 clustered vectors;
- filter evaluation: ``Index.count(where)`` (compile + native evaluation over every row);
- grouped search: ``Index.search_groups`` with k = 10 sources of 20 parts each;
- BM25: ``Index.search_text`` over 20,000 synthetic Zipf-distributed texts.

The SIMD level is restored after every test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")
kbcore = pytest.importorskip("kbcore")

DIM = 384
K = 10
EF = 64
N_SOURCES = 1_000
PARTS = 20  # rows per source: the grouped search must look past 9 siblings per hit
N = N_SOURCES * PARTS
N_FLAT = 1_024  # 1.5 MiB of float32 rows: near-cache, so the kernel dominates, not DRAM
N_QUERIES = 256
VOCAB = 20_000
SEED = 20240607


@pytest.fixture(autouse=True)
def restore_simd_level() -> Iterator[None]:
    """Every test leaves the SIMD level as it found it."""
    level = kbcore.simd_level()
    yield
    kbcore.set_simd_level(level)


@dataclass
class Corpus:
    base: np.ndarray  # float32 [N, DIM], unit rows, PARTS rows per source around its centre
    queries: np.ndarray  # float32 [N_QUERIES, DIM], unit rows near random source centres
    texts: list[str]
    query_texts: list[str]
    index: object  # kbcore.Index (hnsw) with metadata "source", "bucket", "tag" and texts


def _unit(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _zipf_words(rng: np.random.Generator, count: int, length: int) -> list[str]:
    """``count`` texts of ``length`` words drawn from a Zipf(1.1) vocabulary of VOCAB words."""
    ranks = np.minimum(rng.zipf(1.1, size=(count, length)), VOCAB) - 1
    return [" ".join(f"w{r}" for r in row) for row in ranks.tolist()]


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    import pyarrow as pa

    rng = np.random.default_rng(SEED)
    centres = _unit(rng.standard_normal((N_SOURCES, DIM), dtype=np.float32))
    source = np.repeat(np.arange(N_SOURCES, dtype=np.int64), PARTS)
    noise = rng.standard_normal((N, DIM), dtype=np.float32) * np.float32(0.35 / np.sqrt(DIM))
    base = _unit(centres[source] + noise)
    pick = rng.integers(N_SOURCES, size=N_QUERIES)
    qnoise = rng.standard_normal((N_QUERIES, DIM), dtype=np.float32) * np.float32(0.5 / np.sqrt(DIM))
    queries = _unit(centres[pick] + qnoise)
    texts = _zipf_words(rng, N, 60)
    query_texts = _zipf_words(rng, N_QUERIES, 4)
    metadata = pa.table(
        {
            "source": pa.array(source),
            "bucket": pa.array(rng.integers(0, 1000, size=N, dtype=np.int64)),
            "tag": pa.array(
                np.asarray(["t0", "t1", "t2", "t3", "t4"])[
                    rng.choice(5, size=N, p=[0.55, 0.25, 0.12, 0.05, 0.03])
                ].tolist()
            ),
        }
    )
    index = kbcore.Index(DIM, metric="cosine", kind="hnsw", M=16, ef_construction=200, ef=EF)
    index.add(base, np.arange(N, dtype=np.int64), metadata=metadata, texts=texts, threads=0)
    return Corpus(base, queries, texts, query_texts, index)


def _cycle(items) -> Iterator:
    """Successive queries, so no call is flattered by a cache warmed on the same query."""
    return itertools.cycle(list(items))


# ----------------------------------------------------------------------------------------------
# distance kernels per SIMD level


@pytest.fixture(scope="module")
def flat_indexes() -> dict[str, tuple[object, np.ndarray]]:
    rng = np.random.default_rng(SEED + 1)
    x = rng.standard_normal((N_FLAT, DIM), dtype=np.float32)
    q = rng.standard_normal((64, DIM), dtype=np.float32)
    out = {}
    for metric in ("cosine", "ip", "l2"):
        index = kbcore.Index(DIM, metric=metric, kind="flat")
        index.add(x, np.arange(N_FLAT, dtype=np.int64), threads=1)
        out[metric] = (index, q)
    return out


@pytest.mark.benchmark(group="distance kernels: flat search, 1,024 x 384, k=10, 1 thread")
@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
@pytest.mark.parametrize("level", kbcore.available_simd_levels())
def test_flat_search_per_simd_level(benchmark, flat_indexes, level: str, metric: str) -> None:
    index, q = flat_indexes[metric]
    expected = index.search(q[0], k=K, threads=1)[0]
    kbcore.set_simd_level(level)
    assert kbcore.simd_level() == level
    queries = _cycle(q)
    benchmark.extra_info.update(simd_level=level, metric=metric, rows=N_FLAT, dim=DIM)
    benchmark(lambda: index.search(next(queries), k=K, threads=1))
    # Every kernel must find the same neighbours (exact search; ties are vanishingly unlikely).
    np.testing.assert_array_equal(index.search(q[0], k=K, threads=1)[0], expected)


# ----------------------------------------------------------------------------------------------
# single-query HNSW search, filters, groups, BM25


@pytest.mark.benchmark(group="hnsw search: 20,000 x 384, k=10, 1 thread")
@pytest.mark.parametrize("ef", [32, 64, 128])
def test_hnsw_single_query_search(benchmark, corpus: Corpus, ef: int) -> None:
    queries = _cycle(corpus.queries)
    search = corpus.index.search
    benchmark.extra_info.update(simd_level=kbcore.simd_level(), ef=ef, rows=N)
    ids, _ = benchmark(lambda: search(next(queries), k=K, ef=ef, threads=1))
    assert ids.shape == (K,) and (ids >= 0).all()


FILTERS = {
    "int range 10%": {"bucket": {"$lt": 100}},
    "int range 1%": {"bucket": {"$lt": 10}},
    "str in 8%": {"tag": {"$in": ["t3", "t4"]}},
    "and of two": {"$and": [{"bucket": {"$gte": 100}}, {"tag": {"$ne": "t0"}}]},
}


@pytest.mark.benchmark(group="filter evaluation: Index.count(where) over 20,000 rows")
@pytest.mark.parametrize("name", list(FILTERS))
def test_filter_count(benchmark, corpus: Corpus, name: str) -> None:
    where = FILTERS[name]
    benchmark.extra_info.update(where=where, rows=N)
    n = benchmark(lambda: corpus.index.count(where))
    assert 0 < n < N


@pytest.mark.benchmark(group="filtered hnsw search: 20,000 x 384, k=10, 1 thread")
@pytest.mark.parametrize("name", ["int range 10%", "int range 1%"])
def test_filtered_search(benchmark, corpus: Corpus, name: str) -> None:
    where = FILTERS[name]
    queries = _cycle(corpus.queries)
    search = corpus.index.search
    benchmark.extra_info.update(where=where)
    ids, _ = benchmark(lambda: search(next(queries), k=K, where=where, threads=1))
    assert (ids >= 0).all()


@pytest.mark.benchmark(group="grouped search: 1,000 sources x 20 parts, k=10, 1 thread")
def test_search_groups(benchmark, corpus: Corpus) -> None:
    queries = _cycle(corpus.queries)
    search_groups = corpus.index.search_groups
    benchmark.extra_info.update(sources=N_SOURCES, parts=PARTS, ef=EF)
    groups = benchmark(lambda: search_groups(next(queries), K, group_by="source", threads=1))
    assert len({g.key for g in groups}) == K


@pytest.mark.benchmark(group="bm25: search_text over 20,000 texts, k=10")
def test_search_text(benchmark, corpus: Corpus) -> None:
    queries = _cycle(corpus.query_texts)
    search_text = corpus.index.search_text
    benchmark.extra_info.update(docs=N, vocabulary=VOCAB)
    ids, _scores = benchmark(lambda: search_text(next(queries), K))
    assert len(ids) > 0


@pytest.mark.benchmark(group="bm25: search_text over 20,000 texts, k=10")
def test_tokenize(benchmark, corpus: Corpus) -> None:
    texts = _cycle(corpus.texts[:N_QUERIES])
    tokens = benchmark(lambda: kbcore.tokenize(next(texts)))
    assert tokens
