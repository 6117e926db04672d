"""vectors="disk": the float32 rows of a quantized index in a memory-mapped temporary file,
dropped from the resident set after every change; answers must equal the in-memory index's."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_distances_are_true, make_clustered, recall_at_k

import kbcore

DIM = 64
PARAMS = dict(M=8, ef_construction=64, seed=5)


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_disk_rows_give_the_in_memory_answers_through_changes_and_reloading(tmp_path, metric, quantization):
    data, queries = make_clustered(91, 3000, DIM, n_queries=30)
    ids = np.arange(len(data), dtype=np.int64)
    mem = kbcore.Index(DIM, metric, **PARAMS, quantization=quantization)
    disk = kbcore.Index(DIM, metric, **PARAMS, quantization=quantization, vectors="disk")
    assert (mem.vectors, disk.vectors) == ("memory", "disk")
    for ix in (mem, disk):
        ix.add(data[:2000], ids[:2000], threads=1)
        ix.remove(ids[:300], threads=1)
        ix.add(data[2000:], ids[2000:], threads=1, defer_graph=True)
        ix.build_graph(threads=1)  # parallel linking is not deterministic
    for a, b in zip(mem.search(queries, 10), disk.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(disk.get_vectors(ids[300:400]), mem.get_vectors(ids[300:400]))
    path = tmp_path / "d.kbi"
    disk.save(path)
    mem.save(tmp_path / "m.kbi")
    # Where rows live is persisted (format version 7's vectors byte, as 5's); converted to memory,
    # the file is the in-memory index's byte for byte.
    assert path.read_bytes()[8] == 7 and (tmp_path / "m.kbi").read_bytes()[8] == 7
    kbcore.Index.load(path, vectors="memory").save(tmp_path / "c.kbi")
    assert (tmp_path / "c.kbi").read_bytes() == (tmp_path / "m.kbi").read_bytes()
    back = kbcore.Index.load(path)
    assert back.vectors == "disk"
    got = back.search(queries, 10)
    for a, b in zip(got, mem.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
    live = np.arange(300, len(data))
    assert_distances_are_true(*got, data[live], ids[live], queries, metric)
    assert recall_at_k(got[0], data[live], ids[live], queries, 10, metric) >= 0.9


_RSS_PROBE = """
import sys, numpy as np, kbcore
def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
dim, n = 256, 20000  # 20 MB of float32 rows
data = np.random.default_rng(3).standard_normal((n, dim)).astype(np.float32)
ids = np.arange(n, dtype=np.int64)
kw = dict(vectors="disk") if sys.argv[1] == "disk" else dict()
before = anon_kib()
ix = kbcore.Index(dim, "l2", M=8, ef_construction=32, quantization=sys.argv[2], **kw)
ix.add(data, ids, threads=1)
print(anon_kib() - before)
"""


def _anon_growth_kib(vectors: str, quantization: str) -> int:
    res = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, vectors, quantization], capture_output=True, text=True, check=True
    )
    return int(res.stdout)


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_disk_rows_leave_the_resident_set_after_a_build(quantization):
    # Each build in a fresh interpreter: in one process, memory freed by the first build (or
    # held by a sanitizer's quarantine) would be reused by the second and hide its growth.
    disk_kib, mem_kib = _anon_growth_kib("disk", quantization), _anon_growth_kib("memory", quantization)
    rows_kib = 20000 * 256 * 4 // 1024
    # The in-memory index holds the rows; the disk one holds codes and graph only.
    assert mem_kib - disk_kib >= 0.8 * rows_kib, (mem_kib, disk_kib, rows_kib)


@pytest.mark.parametrize("kw", [dict(vectors="disk"), dict(vectors="ssd", quantization="sq8")])
def test_bad_vectors_arguments_raise_value_errors(kw):
    with pytest.raises(ValueError, match="vectors"):
        kbcore.Index(DIM, "l2", **kw)


def test_loading_a_float32_file_with_disk_rows_is_refused(tmp_path):
    ix = kbcore.Index(DIM, "l2")
    ix.add(np.ones((3, DIM), np.float32), [1, 2, 3])
    ix.save(tmp_path / "f.kbi")
    with pytest.raises(ValueError, match="quantiz"):
        kbcore.Index.load(tmp_path / "f.kbi", vectors="disk")
    with pytest.raises(ValueError, match="vectors"):
        kbcore.Index.load(tmp_path / "f.kbi", vectors="tape")
