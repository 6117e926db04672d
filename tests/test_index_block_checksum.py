"""Format version 6: the payload of a quantized index file under a block checksum (issue 28).

Version 6 keeps version 5's layout and replaces its payload checksum (checksum64, one serial pass)
by ``block_checksum``: XXH3-64 of each 4 MiB block, then of those hashes, so that a load verifies
the blocks on every core at memory speed (version 7, written now, adds only the codes' alignment).
These tests hold that a saved quantized index is under that checksum, that one flipped byte
anywhere (in any block, any section, the header) is a FormatError naming the file before an
index exists to answer a search, and that
version 5 files (a committed one written by a previous release, and the committed version 6 file
relabelled and resealed as version 5) still load under their checksum64 and answer as before.
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

HEADER = 32  # magic, version, flags, payload length (offset 16), checksum (offset 24)
BLOCK = 4 << 20
DATA_DIR = Path(__file__).parent / "data"
N, DIM = 3000, 384  # 4.6 MB of rows: the payload spans two checksum blocks


def _saved(tmp_path: Path, vectors: str = "memory") -> tuple[kbcore.Index, Path, np.ndarray]:
    rng = np.random.default_rng(20261205)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, "cosine", M=8, ef_construction=16, quantization="sq8", vectors=vectors)
    index.add(data, np.arange(N, dtype=np.int64), texts=[f"w{i % 50} w{i % 7}" for i in range(N)])
    path = tmp_path / f"{vectors}.kbi"
    index.save(path)
    queries = rng.standard_normal((5, DIM)).astype(np.float32)
    return index, path, queries


def test_a_saved_quantized_index_is_version_7_under_the_block_checksum(tmp_path):
    _, path, _ = _saved(tmp_path)
    raw = path.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 7  # version 6's checksum, the codes aligned
    payload = raw[HEADER:]
    assert len(payload) > BLOCK  # more than one block
    (stored,) = struct.unpack_from("<Q", raw, 24)
    assert stored == _core.block_checksum(payload)
    assert stored != _core.checksum64(payload)


def test_the_block_checksum_changes_with_any_byte_and_with_the_length():
    rng = np.random.default_rng(3)
    data = bytearray(rng.integers(0, 256, 2 * BLOCK + 1000, dtype=np.uint8).tobytes())
    base = _core.block_checksum(bytes(data))
    for at in (0, BLOCK - 1, BLOCK, 2 * BLOCK - 1, 2 * BLOCK, len(data) - 1):
        data[at] ^= 0x01
        assert _core.block_checksum(bytes(data)) != base, at
        data[at] ^= 0x01
    assert _core.block_checksum(bytes(data)) == base
    assert _core.block_checksum(bytes(data[:-1])) != base
    assert _core.block_checksum(bytes(data[:BLOCK])) != _core.block_checksum(bytes(data[:BLOCK]) + bytes(8))


def _offsets(raw: bytes) -> dict[str, int]:
    """A byte of each block and each section of a block-checksummed file of _saved's index."""
    ids_at = raw.find(np.arange(N, dtype=np.int64).tobytes())
    assert ids_at > HEADER
    rows_at = -(-(ids_at + 9 * N) // 64) * 64  # after the ids and live flags, at a 64-byte offset
    rows_end = rows_at + N * DIM * 4
    tail = len(raw) - rows_end  # graph, metadata, text, codes
    return {
        "header checksum": 24,
        "parameters (first block)": HEADER,
        "ids": ids_at + 8 * 17,
        "live flags": ids_at + 8 * N + 5,
        "a row in the first block": rows_at + 4 * DIM * 3,
        "the last byte of the first block": HEADER + BLOCK - 1,
        "the first byte of the second block": HEADER + BLOCK,
        "graph": rows_end + tail // 10,
        "metadata and text": rows_end + tail // 3,
        "codes": rows_end + 3 * tail // 4,
        "the last byte (the short last block)": len(raw) - 1,
    }


@pytest.mark.parametrize("vectors", ["memory", "disk"])
def test_a_byte_flipped_anywhere_in_a_block_checksummed_file_is_refused_naming_the_file(tmp_path, vectors):
    _, path, _ = _saved(tmp_path, vectors)
    raw = path.read_bytes()
    crafted = tmp_path / "flipped.kbi"
    for what, at in _offsets(raw).items():
        blob = bytearray(raw)
        blob[at] ^= 0x10
        crafted.write_bytes(bytes(blob))
        with pytest.raises(FormatError, match=r"flipped\.kbi.*checksum mismatch"):
            kbcore.Index.load(crafted)
        with pytest.raises(FormatError, match="checksum mismatch"):
            kbcore.Index.load(crafted, vectors="disk" if vectors == "memory" else "memory")
        assert what


def _relabel_as_version_5(raw: bytes) -> bytearray:
    blob = bytearray(raw)
    struct.pack_into("<I", blob, 8, 5)
    return blob


def test_a_version_6_file_relabelled_and_resealed_as_version_5_loads_and_answers_the_same(tmp_path):
    path = DATA_DIR / "sq8_v6_hnsw_cosine.kbi"  # version 6 (committed): version 5's layout
    index = kbcore.Index.load(path)
    queries = np.random.default_rng(3).standard_normal((5, index.dim)).astype(np.float32)
    blob = _relabel_as_version_5(path.read_bytes())
    struct.pack_into("<Q", blob, 24, _core.checksum64(bytes(blob[HEADER:])))
    old = tmp_path / "v5.kbi"
    old.write_bytes(bytes(blob))
    back = kbcore.Index.load(old)
    for a, b in zip(back.search(queries, 10), index.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.search_text("row9003", 10)[0], index.search_text("row9003", 10)[0])
    # Its block checksum is no version 5 checksum: the version decides which function is compared.
    struct.pack_into("<Q", blob, 24, _core.block_checksum(bytes(blob[HEADER:])))
    old.write_bytes(bytes(blob))
    with pytest.raises(FormatError, match="checksum mismatch"):
        kbcore.Index.load(old)


def test_the_committed_version_5_fixture_loads_answers_exactly_and_saves_as_version_7(tmp_path):
    spec = importlib.util.spec_from_file_location("make_v5_fixture", DATA_DIR / "make_v5_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = DATA_DIR / gen.FILE_NAME
    raw = path.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == gen.FORMAT_VERSION == 5
    (stored,) = struct.unpack_from("<Q", raw, 24)
    assert stored == _core.checksum64(raw[HEADER:])
    data, ids = gen.fixture_rows()
    index = kbcore.Index.load(path)
    assert (index.quantization, index.vectors, index.rerank, len(index)) == ("sq8", "memory", 20, len(ids))
    queries = np.random.default_rng(5).standard_normal((10, gen.DIM)).astype(np.float32)
    got_ids, got_dist = index.search(queries, 10, ef=64)
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    by_id = dict(zip(ids.tolist(), unit))
    for q, row_ids, row_dist in zip(queries, got_ids, got_dist):
        qn = q / np.linalg.norm(q)
        want = np.array([1.0 - float(np.dot(by_id[i], qn)) for i in row_ids], np.float32)
        np.testing.assert_allclose(row_dist, want, rtol=1e-5, atol=1e-5)  # exact, re-ranked distances
    truth = np.argsort(1.0 - unit @ (queries / np.linalg.norm(queries, axis=1, keepdims=True)).T, axis=0)[:10].T
    recall = np.mean([len(set(ids[t].tolist()) & set(g.tolist())) / 10 for t, g in zip(truth, got_ids)])
    assert recall >= 0.9
    hits, _ = index.search_text("row9003", 5)
    assert hits.tolist() == [9003]
    assert gen.text_of(9003) == "row9003 group1"
    index.save(tmp_path / "v7.kbi")
    again_raw = (tmp_path / "v7.kbi").read_bytes()
    assert struct.unpack_from("<I", again_raw, 8)[0] == 7
    again = kbcore.Index.load(tmp_path / "v7.kbi")
    assert again._native._codes_in_place
    for a, b in zip(again.search(queries, 10, ef=64), (got_ids, got_dist)):
        np.testing.assert_array_equal(a, b)
