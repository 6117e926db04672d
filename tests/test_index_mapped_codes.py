"""Codes and graph links read in place from the loaded file (issue 28).

Format version 7 aligns the SQ8 and RaBitQ code rows and the graph's level-0 link lists to a
64-byte file offset, so that ``Index.load`` of a mapped file reads them where they lie instead of
copying them (the copy, and the kernel zeroing its fresh pages, was most of what a 1M reopen
still spent); the first write copies them to the heap. These tests hold that a reopened index
reads both in place, that it answers like the index that was saved, and like a brute-force
oracle, through every kind of write and a save, that its codes outlive the file being replaced
or deleted, that a nonzero alignment byte is refused, and that a committed version 6 file
(unaligned) still loads, with both copied, and answers the same.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore import _core
from kbcore.errors import FormatError

N, DIM = 1500, 40  # 40 dimensions: the SQ8 code rows are padded (stride 64)
DATA_DIR = Path(__file__).parent / "data"


def _oracle(data: np.ndarray, ids: np.ndarray, queries: np.ndarray, metric: str, k: int) -> np.ndarray:
    if metric == "l2":
        dist = ((queries[:, None, :] - data[None, :, :]) ** 2).sum(-1)
    elif metric == "ip":
        dist = -(queries @ data.T)
    else:
        unit = data / np.linalg.norm(data, axis=1, keepdims=True)
        dist = 1.0 - (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ unit.T
    return ids[np.argsort(dist, axis=1, kind="stable")[:, :k]]


def _recall(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g.tolist()) & set(w.tolist())) / len(w) for g, w in zip(got, want)]))


def _same(a: kbcore.Index, b: kbcore.Index, queries: np.ndarray) -> None:
    for x, y in zip(a.search(queries, 10, ef=64), b.search(queries, 10, ef=64)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.ids(), b.ids())


@pytest.mark.parametrize(("metric", "quantization"), [("l2", "sq8"), ("cosine", "sq8"), ("ip", "rabitq")])
def test_a_reopened_index_reads_its_codes_in_place_and_writes_like_the_saved_one(tmp_path, metric, quantization):
    rng = np.random.default_rng(20261209)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    queries = rng.standard_normal((12, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, metric, M=8, ef_construction=48, quantization=quantization, rerank=30)
    index.add(data, np.arange(N, dtype=np.int64), threads=1)
    index.save(tmp_path / "a.kbi")
    back = kbcore.Index.load(tmp_path / "a.kbi")
    assert back._native._codes_in_place and not index._native._codes_in_place
    assert back._native._links_in_place and not index._native._links_in_place
    _same(index, back, queries)
    back.save(tmp_path / "b.kbi")  # reads the codes in place, writes nothing to them
    assert back._native._codes_in_place
    assert (tmp_path / "b.kbi").read_bytes() == (tmp_path / "a.kbi").read_bytes()

    fresh = rng.standard_normal((60, DIM)).astype(np.float32)
    replaced = rng.standard_normal((10, DIM)).astype(np.float32)
    removed = list(range(0, 400, 9))
    for target in (index, back):
        target.remove(removed, threads=1)  # frees slots, writes no code
        target.add(replaced, np.arange(500, 510, dtype=np.int64), threads=1)  # re-encodes in place
        target.add(fresh, np.arange(N, N + 60, dtype=np.int64), threads=1)  # reuses slots, grows
    assert not back._native._codes_in_place  # the first write copied them
    assert not back._native._links_in_place
    _same(index, back, queries)
    back.save(tmp_path / "c.kbi")
    again = kbcore.Index.load(tmp_path / "c.kbi")
    assert again._native._codes_in_place and again._native._links_in_place
    _same(index, again, queries)

    # And against brute force over the rows the writes left.
    rows = data.copy()
    rows[500:510] = replaced
    keep = np.ones(N, bool)
    keep[removed] = False
    live = np.concatenate([rows[keep], fresh])
    live_ids = np.concatenate([np.arange(N)[keep], np.arange(N, N + 60)]).astype(np.int64)
    got, _ = again.search(queries, 10, ef=64)
    assert _recall(got, _oracle(live, live_ids, queries, metric, 10)) >= 0.9


@pytest.mark.parametrize(
    ("quantization", "vectors"),
    [("sq8", "memory"), ("rabitq", "memory"), (None, "memory"), ("sq8", "disk"), ("rabitq", "disk")],
)
def test_load_with_mmap_false_copies_what_it_would_read_in_place(tmp_path, quantization, vectors):
    rng = np.random.default_rng(31)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    queries = rng.standard_normal((12, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=48, quantization=quantization, vectors=vectors)
    index.add(data, np.arange(N, dtype=np.int64), threads=1)
    index.save(tmp_path / "a.kbi")
    copied = kbcore.Index.load(tmp_path / "a.kbi", mmap=False)
    assert not copied._native._links_in_place and not copied._native._codes_in_place
    assert not copied.in_place and not index.in_place
    assert copied.vectors == vectors  # rows kept on disk stay in the file
    _same(index, copied, queries)
    np.testing.assert_array_equal(copied.get_vectors(np.arange(N)), data)
    (tmp_path / "a.kbi").unlink()  # nothing read in place is needed any more
    _same(index, copied, queries)
    copied.add(data[:5] + 1.0, np.arange(N, N + 5, dtype=np.int64), threads=1)
    assert len(copied) == N + 5
    copied.save(tmp_path / "b.kbi")
    with pytest.raises(TypeError, match="mmap must be a bool"):
        kbcore.Index.load(tmp_path / "b.kbi", mmap=0)  # type: ignore[arg-type]


def test_codes_read_in_place_outlive_the_file_being_replaced_or_deleted(tmp_path):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    queries = rng.standard_normal((6, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=32, quantization="sq8")
    index.add(data, np.arange(N, dtype=np.int64), threads=1)
    path = tmp_path / "a.kbi"
    index.save(path)
    back = kbcore.Index.load(path)
    assert back._native._codes_in_place and back.in_place
    other = kbcore.Index(DIM, "l2", M=8, ef_construction=32, quantization="sq8")
    other.add(data[::-1].copy() + 1.0, np.arange(N, dtype=np.int64), threads=1)
    other.save(path)  # replaced by rename: the old mapping still reads the old bytes
    _same(index, back, queries)
    path.unlink()
    _same(index, back, queries)


def _codes_offset(raw: bytes) -> int:
    """File offset of the SQ8 code rows of a version 7 file with N slots of stride 64."""
    return len(raw) - N * 64


def test_a_nonzero_alignment_byte_before_the_codes_is_refused(tmp_path):
    rng = np.random.default_rng(11)
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=32, quantization="sq8")
    index.add(rng.standard_normal((N, DIM)).astype(np.float32), np.arange(N, dtype=np.int64), threads=1)
    index.save(tmp_path / "a.kbi")
    raw = bytearray((tmp_path / "a.kbi").read_bytes())
    start = _codes_offset(raw)
    assert start % 64 == 0
    # The code count (u64) ends where the alignment bytes begin; they run up to the codes.
    count_end = next(e for e in range(start, start - 72, -1) if struct.unpack_from("<Q", raw, e - 8)[0] == N)
    if count_end == start:
        pytest.skip("the code count ends on a 64-byte offset: no alignment bytes in this file")
    raw[start - 1] = 1
    struct.pack_into("<Q", raw, 24, _core.block_checksum(bytes(raw[32:])))
    (tmp_path / "bad.kbi").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="padding"):
        kbcore.Index.load(tmp_path / "bad.kbi")


def test_the_committed_version_6_fixture_loads_with_codes_copied_and_answers_the_same(tmp_path):
    spec = importlib.util.spec_from_file_location("make_v6_fixture", DATA_DIR / "make_v6_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = DATA_DIR / gen.FILE_NAME
    assert struct.unpack_from("<I", path.read_bytes(), 8)[0] == gen.FORMAT_VERSION == 6
    data, ids = gen.fixture_rows()
    index = kbcore.Index.load(path)
    assert not index._native._codes_in_place  # unaligned in version 6: copied
    assert not index._native._links_in_place
    queries = np.random.default_rng(5).standard_normal((10, gen.DIM)).astype(np.float32)
    got_ids, got_dist = index.search(queries, 10, ef=64)
    assert _recall(got_ids, _oracle(data, ids, queries, "cosine", 10)) >= 0.9
    index.save(tmp_path / "v7.kbi")
    assert struct.unpack_from("<I", (tmp_path / "v7.kbi").read_bytes(), 8)[0] == 7
    again = kbcore.Index.load(tmp_path / "v7.kbi")
    assert again._native._codes_in_place and again._native._links_in_place
    for a, b in zip(again.search(queries, 10, ef=64), (got_ids, got_dist)):
        np.testing.assert_array_equal(a, b)
