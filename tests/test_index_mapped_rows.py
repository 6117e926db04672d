"""Rows in memory read in place from the loaded file (issue 28).

``Index.load`` of a quantized file with ``vectors="memory"`` maps the float32 rows where they lie
in the file instead of copying them (the copy, and the kernel zeroing its pages, was most of a 1M
reopen once the checksum was fast); the first write copies them to the heap. These tests hold a
reopened index to the answers of the index that was saved, through every kind of write, to the
bytes it was loaded from when saved unchanged, and show that the mapped rows outlive the file
being replaced by rename or deleted.
"""

from __future__ import annotations

import numpy as np
import pytest

import kbcore

N, DIM = 1500, 32


def _pair(tmp_path, metric: str, quantization: str) -> tuple[kbcore.Index, kbcore.Index, np.ndarray]:
    rng = np.random.default_rng(20261208)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, metric, M=8, ef_construction=32, quantization=quantization, rerank=20)
    index.add(data, np.arange(N, dtype=np.int64), texts=[f"w{i % 13} w{i % 5}" for i in range(N)], threads=1)
    index.save(tmp_path / "a.kbi")
    back = kbcore.Index.load(tmp_path / "a.kbi")
    assert back.vectors == "memory"
    return index, back, rng.standard_normal((8, DIM)).astype(np.float32)


def _same(a: kbcore.Index, b: kbcore.Index, queries: np.ndarray) -> None:
    for x, y in zip(a.search(queries, 10, ef=48), b.search(queries, 10, ef=48)):
        np.testing.assert_array_equal(x, y)
    ids = a.ids()
    np.testing.assert_array_equal(ids, b.ids())
    np.testing.assert_array_equal(a.get_vectors(ids), b.get_vectors(ids))


@pytest.mark.parametrize(("metric", "quantization"), [("cosine", "sq8"), ("l2", "rabitq")])
def test_a_reopened_memory_index_answers_and_changes_like_the_saved_one(tmp_path, metric, quantization):
    index, back, queries = _pair(tmp_path, metric, quantization)
    _same(index, back, queries)
    rng = np.random.default_rng(9)
    fresh = rng.standard_normal((50, DIM)).astype(np.float32)
    replaced = rng.standard_normal((10, DIM)).astype(np.float32)
    for target in (index, back):
        target.remove(list(range(0, 300, 7)), threads=1)  # frees slots, writes no row
        target.add(replaced, np.arange(500, 510, dtype=np.int64), threads=1)  # rewrites rows in place
        target.add(fresh, np.arange(N, N + 50, dtype=np.int64), threads=1)  # reuses slots, grows
    _same(index, back, queries)
    back.save(tmp_path / "y.kbi")  # (not byte-equal to index's: its free-slot order differs)
    _same(index, kbcore.Index.load(tmp_path / "y.kbi"), queries)


def test_a_reopened_memory_index_saves_back_to_the_bytes_it_was_loaded_from(tmp_path):
    _, back, _ = _pair(tmp_path, "cosine", "sq8")
    back.save(tmp_path / "b.kbi")  # reads the mapped rows, writes nothing to them
    assert (tmp_path / "b.kbi").read_bytes() == (tmp_path / "a.kbi").read_bytes()
    back.save(tmp_path / "a.kbi")  # over the file its rows are mapped from (by rename)
    assert (tmp_path / "b.kbi").read_bytes() == (tmp_path / "a.kbi").read_bytes()


def test_mapped_rows_outlive_their_file_being_replaced_or_deleted(tmp_path):
    index, back, queries = _pair(tmp_path, "cosine", "sq8")
    other = kbcore.Index(DIM, "cosine", quantization="sq8")
    other.add(np.ones((3, DIM), np.float32), np.arange(3, dtype=np.int64))
    other.save(tmp_path / "a.kbi")  # replaced by rename: the mapping keeps the old file
    _same(index, back, queries)
    (tmp_path / "a.kbi").unlink()
    _same(index, back, queries)
    back.add(np.full((1, DIM), 0.5, np.float32), np.array([N + 7], dtype=np.int64), threads=1)  # the copy
    index.add(np.full((1, DIM), 0.5, np.float32), np.array([N + 7], dtype=np.int64), threads=1)
    _same(index, back, queries)
