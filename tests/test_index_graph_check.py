"""The graph check of Index.load on the hardware's threads (issue 28).

From 64K slots the links are checked in blocks of 4,096 nodes on every core. A crafted file must
still be refused naming its defect, and with two defects the one a serial pass meets first (the
first block's), whichever thread finishes first.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import kbcore
from kbcore import _core
from kbcore.errors import FormatError

HEADER = 32
N, DIM, M = 70_000, 2, 2  # 18 blocks of 4,096 slots
M0 = 2 * M  # links per node on level 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[bytes, int]:
    """The bytes of a saved unquantized graph index (version 1) and the offset of its level-0 links."""
    rng = np.random.default_rng(21)
    index = kbcore.Index(DIM, "l2", M=M, ef_construction=8, seed=5)
    index.add(rng.standard_normal((N, DIM)).astype(np.float32), np.arange(N, dtype=np.int64), threads=2)
    path = tmp_path_factory.mktemp("graph") / "g.kbi"
    index.save(path)
    raw = path.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 1
    params = 8 + 1 + 1 + 4 * 8  # dim, metric, kind, ef, M, ef_construction, seed
    graph = HEADER + params + 8 + N * (8 + 1 + 4 * DIM)  # slots, ids, live flags, rows
    assert struct.unpack_from("<QQ", raw, graph) == (M, 8)
    levels_at = graph + 3 * 8 + 4 + 4 + 8  # M, ef_construction, seed, entry, level count, slots
    return raw, levels_at + N


def _with(raw: bytes, links0: int, edits: dict[int, tuple[int, int]], tmp_path) -> str:
    blob = bytearray(raw)
    for node, (j, value) in edits.items():
        at = links0 + node * (1 + M0) * 4
        assert struct.unpack_from("<I", blob, at)[0] >= 1  # a linked node
        struct.pack_into("<I", blob, at + 4 * j, value)
    struct.pack_into("<Q", blob, 24, _core.checksum64(bytes(blob[HEADER:])))
    path = tmp_path / "crafted.kbi"
    path.write_bytes(bytes(blob))
    return str(path)


def test_the_unchanged_file_loads(saved, tmp_path):
    raw, links0 = saved
    assert len(kbcore.Index.load(_with(raw, links0, {}, tmp_path))) == N


def test_a_defect_in_a_late_block_is_refused_naming_it(saved, tmp_path):
    raw, links0 = saved
    late = 69_000
    with pytest.raises(FormatError, match="node links to itself"):
        kbcore.Index.load(_with(raw, links0, {late: (1, late)}, tmp_path))


def test_of_two_defects_the_first_blocks_is_reported(saved, tmp_path):
    raw, links0 = saved
    for _ in range(5):
        path = _with(raw, links0, {100: (0, M0 + 1), 69_000: (1, 69_000)}, tmp_path)
        with pytest.raises(FormatError, match="link count exceeds capacity"):
            kbcore.Index.load(path)
