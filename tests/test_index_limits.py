"""The limits of docs/index.md ("Limits"): one set of parameter ranges shared by the
constructor, the knowledge-base manifest, save and load; every search bounded by the rows that
exist; BM25 terms that are not UTF-8 refused on load (issue 30, items 10, 11 and 13)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore import _core, errors
from kbcore.engine.manifest_check import validate_manifest
from kbcore.index import EF_RANGE, check_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import fuzz_index_load as fuzz  # noqa: E402

MAX = 2**30


def test_the_shared_limit_is_the_native_one():
    assert EF_RANGE == (1, MAX) == (1, _core.MAX_EF)


# --------------------------------------------------------------------------------------------
# item 10: a parameter the constructor accepts is one the file format and the loader accept


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"ef": MAX + 1}, "ef"),
        ({"ef_construction": MAX + 1}, "ef_construction"),
        ({"ef": 2**31}, "ef"),
        ({"ef_construction": 2**31}, "ef_construction"),
        ({"ef_construction": 2**64}, "ef_construction"),
        ({"quantization": "sq8", "rerank": MAX + 1}, "rerank"),
    ],
)
def test_constructor_refuses_parameters_the_loader_would_refuse(kwargs, name):
    with pytest.raises(errors.InvalidArgumentError, match=rf"{name} must be in \[1, {MAX}\]"):
        kbcore.Index(8, **kwargs)


@pytest.mark.parametrize("param", ["ef", "ef_construction"])
def test_check_params_refuses_what_the_index_file_cannot_hold(param):
    values = {"M": 16, "ef_construction": 200, "ef": 64, param: MAX + 1}
    with pytest.raises(errors.InvalidArgumentError, match=param):
        check_params("cosine", "hnsw", **values)
    values[param] = MAX
    check_params("cosine", "hnsw", **values)


def test_native_constructor_refuses_what_the_loader_refuses():
    # The binding itself (what the Python checks stand in front of).
    with pytest.raises(errors.InvalidArgumentError, match="ef_construction must be in"):
        _core.Index(8, "l2", "hnsw", 16, MAX + 1, 64, 42)
    with pytest.raises(errors.InvalidArgumentError, match="ef must be in"):
        _core.Index(8, "l2", "hnsw", 16, 200, MAX + 1, 42)


def test_setting_ef_beyond_the_limit_raises_and_keeps_the_old_value():
    index = kbcore.Index(8)
    with pytest.raises(errors.InvalidArgumentError, match="ef must be in"):
        index.ef = MAX + 1
    assert index.ef == 64


@pytest.mark.parametrize("quantization", [None, "sq8"])
def test_an_index_at_the_limits_saves_and_loads(tmp_path, quantization):
    rng = np.random.default_rng(3)
    rerank = MAX if quantization else None
    index = kbcore.Index(8, "l2", ef=MAX, ef_construction=MAX, quantization=quantization, rerank=rerank)
    data = rng.standard_normal((40, 8)).astype(np.float32)
    index.add(data, np.arange(40), threads=1)
    index.save(tmp_path / "a.kbi")
    loaded = kbcore.Index.load(tmp_path / "a.kbi")
    assert (loaded.ef, loaded.ef_construction, loaded.rerank) == (MAX, MAX, rerank)
    ids, _ = loaded.search(data[:3], k=1)
    assert ids[:, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("field", ["ef", "ef_construction"])
def test_manifest_refuses_an_ef_the_index_cannot_hold(field):

    m = _minimal_manifest()
    validate_manifest(m)
    m["config"][field] = MAX + 1
    with pytest.raises(errors.FormatError, match=f"config.{field}"):
        validate_manifest(m)


@pytest.mark.parametrize("param", ["ef", "ef_construction"])
def test_knowledge_base_at_the_limit_reopens_and_beyond_it_is_refused_up_front(tmp_path, param):
    from kbcore import Engine

    engine = Engine(tmp_path / "e")
    for bad in (MAX + 1, 2**31):
        with pytest.raises(errors.InvalidArgumentError, match=param):
            engine.create_knowledge_base("bad", embedder=False, **{param: bad})
        assert "bad" not in engine.knowledge_bases()
    kb = engine.create_knowledge_base("kb", embedder=False, metric="l2", **{param: MAX})
    vecs = np.random.default_rng(2).standard_normal((20, 8)).astype(np.float32)
    pa = pytest.importorskip("pyarrow", reason="ingest_table takes an Arrow table")
    kb.ingest_table(pa.table({"document_id": [f"d{i}" for i in range(20)], "text": ["x"] * 20}), vectors=vecs)
    engine.close()
    again = Engine(tmp_path / "e").get_knowledge_base("kb")  # used to raise FormatError at 2^30 + 1
    assert [h.document_id for h in again.retrieve(vecs[4], top_k=1)] == ["d4"]


def _minimal_manifest() -> dict:
    return {
        "format": "kbcore-knowledge-base",
        "version": 1,
        "checksum": 0,
        "generation": 1,
        "name": "kb",
        "config": {
            "metric": "cosine",
            "index": "hnsw",
            "M": 16,
            "ef_construction": 200,
            "ef": 64,
            "chunk_size": 512,
            "chunk_overlap": 64,
        },
        "pipelines": {"default": {"chunk_size": 512, "chunk_overlap": 64}},
        "next_id": 0,
        "next_group": 0,
        "segments": [],
    }


# --------------------------------------------------------------------------------------------
# item 11: every size bounded by the rows that exist

# Runs `body` in a child whose address space is capped at what it uses after the setup plus
# 1 GiB: an allocation sized by k, ef or the re-rank depth (8-12 GiB at these values) fails
# there (MemoryError), one sized by the rows does not.
_CHILD = """
import resource, sys
import numpy as np
import kbcore

def cap_memory():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    limit = pages * resource.getpagesize() + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

rng = np.random.default_rng(0)
"""


def _run_capped(body: str) -> str:
    code = _CHILD + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("quantization", [None, "sq8", "rabitq"])
def test_huge_ef_k_and_rerank_depth_search_with_memory_bounded_by_the_rows(quantization):
    out = _run_capped(
        f"""
        q = {quantization!r}
        data = rng.standard_normal((1200, 8)).astype(np.float32)
        index = kbcore.Index(8, "l2", quantization=q, rerank=2**30 if q else None)
        index.add(data, np.arange(1200), texts=["row %d" % i for i in range(1200)], threads=1)
        index.add(data[:30] + 1.0, np.arange(5000, 5030), metadata=[{{"doc": i % 7}} for i in range(30)],
                  defer_graph=True, threads=1)
        cap_memory()
        ids, _ = index.search(data[5], k=3, ef=10**9)
        assert ids[0] == 5, ids
        ids, _ = index.search(data[:2], k=5000, ef=2**30)
        assert (ids[:, :1230] >= 0).all() and (ids[:, 1230:] == -1).all()
        ids, _ = index.search(data[5], k=3, ef=10**9, where={{"doc": 3}})
        assert len(ids) == 3 and (ids >= 5000).all(), ids
        groups = index.search_groups(data[5], k=10**9, group_by="doc", ef=10**9)
        assert len(groups) == 7
        t_ids, _ = index.search_text("row", k=10**9)
        assert len(t_ids) == 1200
        print("bounded")
        """
    )
    assert out.strip() == "bounded"


def test_search_k_beyond_the_limit_raises_before_allocating():
    index = kbcore.Index(8)
    index.add(np.eye(8, dtype=np.float32), np.arange(8))
    q = np.ones(8, dtype=np.float32)
    for call in (
        lambda: index.search(q, k=MAX + 1),
        lambda: index.search(q[None, :], k=MAX + 1),
        lambda: index.search(q, k=2**70),
        lambda: index.search(q, k=3, ef=MAX + 1),
        lambda: index.search_groups(q, k=MAX + 1),
        lambda: index.search_text("x", k=MAX + 1),
        lambda: index._native.search_one(q, MAX + 1, 0, None),
    ):
        with pytest.raises(errors.InvalidArgumentError, match=r"(k|ef) must be"):
            call()


def test_a_crafted_file_with_a_huge_rerank_depth_searches_bounded(tmp_path):
    # The largest depth load accepts (the file is written by save, as a crafted one would be).
    path = tmp_path / "deep.kbi"
    data = np.random.default_rng(1).standard_normal((1100, 8)).astype(np.float32)
    index = kbcore.Index(8, "l2", quantization="sq8", rerank=MAX)
    index.add(data, np.arange(1100), threads=1)
    index.save(path)
    out = _run_capped(
        f"""
        index = kbcore.Index.load({str(path)!r})
        data = np.random.default_rng(1).standard_normal((1100, 8)).astype(np.float32)
        cap_memory()
        ids, _ = index.search(data[7], k=2)
        assert ids[0] == 7, ids
        print("bounded")
        """
    )
    assert out.strip() == "bounded"


# --------------------------------------------------------------------------------------------
# item 13: BM25 terms are UTF-8, on load and on add


def test_a_bm25_term_that_is_not_utf8_is_refused_at_the_text_legs_first_use(tmp_path):
    # Index.load leaves the BM25 leg's terms to its first use (cpp/bm25_index.h load_deferred).
    index = kbcore.Index(4, "l2")
    index.add(np.eye(4, dtype=np.float32), np.arange(4), texts=["zqxjterm one", "two", None, "three"])
    good = tmp_path / "good.kbi"
    index.save(good)
    blob = good.read_bytes()
    assert blob.count(b"zqxjterm") == 1
    for bad_term in (b"zqxj\xffrm", b"zqxj\xed\xa0\x80", b"zqxj\xc0\xafm"):  # stray byte, surrogate, overlong
        bad = tmp_path / "bad.kbi"
        bad.write_bytes(fuzz.reseal(blob.replace(b"zqxjterm", bad_term.ljust(8, b"m"))))
        loaded = kbcore.Index.load(bad)
        assert loaded.search(np.eye(4, dtype=np.float32)[1], k=1)[0].tolist() == [1]  # vectors answer
        for _ in range(2):
            with pytest.raises(errors.FormatError, match="bad.kbi.*BM25 term is not valid UTF-8"):
                loaded.search_text("two", k=2)
    assert kbcore.Index.load(good).text_documents() == 3


def test_add_never_stores_a_term_that_is_not_utf8(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="the Arrow texts path needs pyarrow")
    raw = [b"caf\xc3\xa9 ok\xffbad \xed\xa0\x80sur \xc0\xafover", b"plain words"]
    offsets = np.array([0, len(raw[0]), len(raw[0]) + len(raw[1])], dtype=np.int32)
    texts = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])
    index = kbcore.Index(4, "l2")
    index.add(np.eye(4, dtype=np.float32)[:2], [1, 2], texts=texts)
    index.save(tmp_path / "a.kbi")
    loaded = kbcore.Index.load(tmp_path / "a.kbi")  # every term stored is UTF-8
    assert loaded.search_text("café", k=5)[0].tolist() == [1]
    assert loaded.search_text("bad", k=5)[0].tolist() == [1]  # the stray byte separated two words
    # A str with a lone surrogate has no UTF-8 form: refused, naming the row; nothing added.
    with pytest.raises(errors.InvalidArgumentError, match=r"texts\[1\] is not valid Unicode"):
        index.add(np.eye(4, dtype=np.float32)[2:], [3, 4], texts=["fine", "a\udcffb"])
    assert len(index) == 2


@pytest.mark.parametrize("search_type", ["vector", "hybrid", "full_text"])
@pytest.mark.parametrize("deduplicate", [False, True])
def test_retrieve_with_a_huge_top_k_answers_every_row_with_bounded_memory(tmp_path, search_type, deduplicate):
    out = _run_capped(
        f"""
        import pyarrow as pa
        from kbcore import Engine
        engine = Engine({str(tmp_path / "e")!r})
        kb = engine.create_knowledge_base("kb", embedder=False, index="hnsw", metric="cosine")
        vecs = rng.standard_normal((30, 16)).astype(np.float32)
        table = pa.table({{"document_id": ["d%d" % i for i in range(30)], "text": ["row %d" % i for i in range(30)]}})
        kb.ingest_table(table, vectors=vecs)
        cap_memory()
        query = "row" if {search_type!r} != "vector" else vecs[0]
        hits = kb.retrieve(query, top_k=10**9, search_type={search_type!r}, query_vector=vecs[0]
                           if {search_type!r} == "hybrid" else None, deduplicate={deduplicate!r})
        assert len(hits) == 30, len(hits)
        hits = kb.retrieve(vecs[0], top_k=10**12, ef=10**9)
        assert len(hits) == 30, len(hits)
        print("bounded")
        """
    )
    assert out.strip() == "bounded"


# --------------------------------------------------------------------------------------------
# beyond the list: `threads` is a size taken from the user too


def test_more_threads_than_the_system_grants_never_crashes():
    # A thread the system refuses (here: no address space left for its stack) used to leave
    # joinable threads behind an exception: std::terminate, the process aborted (SIGABRT).
    out = _run_capped(
        """
        data = rng.standard_normal((3000, 8)).astype(np.float32)
        flat = kbcore.Index(8, "l2", kind="flat")
        flat.add(data, np.arange(3000), threads=1)
        hnsw = kbcore.Index(8, "l2", M=8, ef_construction=32)
        import resource
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        limit = pages * resource.getpagesize() + (400 << 20)  # room for a few 8 MiB stacks only
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        ids, _ = flat.search(data[:2000], k=1, threads=2000)
        assert (ids[:, 0] == np.arange(2000)).all()
        hnsw.add(data, np.arange(3000), texts=["t %d" % i for i in range(3000)], threads=10**6)
        ids, _ = hnsw.search(data[:500], k=1, threads=500)
        assert (ids[:, 0] == np.arange(500)).mean() > 0.95
        print("ok")
        """
    )
    assert out.strip() == "ok"
