"""Code types as plug-ins: the native registry (cpp/code_types.h) is the one list of the code
types and their parameters, and format version 5 tags a file's code type by name, so that a
file of a type this build does not know is refused by name rather than misread."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore import _core
from kbcore.errors import FormatError, InvalidArgumentError
from kbcore.index import QUANTIZATIONS, RABITQ_BITS, RABITQ_DEFAULT_BITS

DATA_DIR = Path(__file__).parent / "data"
HEADER = 32  # magic, version, flags, payload length (offset 16), checksum (offset 24)
PARAMS = 8 + 1 + 1 + 4 * 8  # dim, metric, kind, ef, M, ef_construction, seed
TAG_AT = HEADER + PARAMS + 1  # after the vectors byte: the code tag's name length
DIM = 16

#: Every code type with each setting of its parameters worth a file of its own.
CONFIGS = [
    ("sq8", {}),
    ("rabitq", {"bits": 1}),
    ("rabitq", {"bits": 4}),
    ("rabitq", {"bits": 8}),
]


def _reseal(raw: bytearray) -> bytes:
    """The payload length and checksum recomputed, as BinaryWriter::commit writes them (a block
    checksum from format version 6 on, checksum64 before)."""
    struct.pack_into("<Q", raw, 16, len(raw) - HEADER)
    checksum = _core.block_checksum if struct.unpack_from("<I", raw, 8)[0] >= 6 else _core.checksum64
    struct.pack_into("<Q", raw, 24, checksum(bytes(raw[HEADER:])))
    return bytes(raw)


def _tag(name: str, params: dict[str, int], rerank: int = 0) -> bytes:
    """A version 5 code tag (cpp/index_format.cpp, write_name and Index::save)."""
    out = struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", len(params))
    for key, value in params.items():
        out += struct.pack("<I", len(key)) + key.encode() + struct.pack("<q", value)
    return out + struct.pack("<Q", rerank)


def _built(quantization: str, params: dict[str, int], vectors: str = "memory") -> tuple[kbcore.Index, np.ndarray]:
    rng = np.random.default_rng(20261205)
    data = rng.standard_normal((1100, DIM)).astype(np.float32)  # above the 1,000 rows codes train on
    index = kbcore.Index(DIM, "l2", M=8, ef_construction=32, quantization=quantization, vectors=vectors, **params)
    index.add(data, np.arange(len(data)), threads=1)
    return index, rng.standard_normal((8, DIM)).astype(np.float32)


def test_the_native_registry_is_the_one_list_of_code_types():
    types = _core.code_types()
    assert list(types) == ["sq8", "rabitq"]
    assert types["sq8"] == {} and types["rabitq"] == {"bits": (1, 8, 4)}
    assert tuple(types) == QUANTIZATIONS
    assert (*RABITQ_BITS, RABITQ_DEFAULT_BITS) == types["rabitq"]["bits"]


def test_the_native_constructor_checks_parameters_against_the_registry():
    with pytest.raises(InvalidArgumentError, match="bits does not apply to quantization='sq8'"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="sq8", bits=3)
    with pytest.raises(InvalidArgumentError, match=r"bits must be in \[1, 8\], got 9"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq", bits=9)
    with pytest.raises(InvalidArgumentError, match="unknown quantization 'pq4'.*'sq8', 'rabitq'"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="pq4")
    assert _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq").code_params == {"bits": 4}
    # Parameters by name (a new type's reach the core this way): checked the same way.
    ix = _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq", code_params={"bits": 2})
    assert (ix.bits, ix.code_params) == (2, {"bits": 2})
    with pytest.raises(InvalidArgumentError, match="bits given twice"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq", bits=2, code_params={"bits": 2})
    for bad in ({"bits": True}, {"bits": 2.0}, {3: 4}):
        with pytest.raises(InvalidArgumentError, match="code_params maps parameter names to integers"):
            _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq", code_params=bad)
    with pytest.raises(InvalidArgumentError, match="bits is out of range"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, quantization="rabitq", code_params={"bits": 1 << 70})
    with pytest.raises(InvalidArgumentError, match="bits applies to a quantized index only"):
        _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1, code_params={"bits": 2})
    assert _core.Index(DIM, "l2", "hnsw", 8, 32, 20, 1).code_params == {}


@pytest.mark.parametrize("vectors", ["memory", "disk"])
@pytest.mark.parametrize(("quantization", "params"), CONFIGS, ids=[f"{q}{p.get('bits', '')}" for q, p in CONFIGS])
def test_version_7_round_trips_each_code_type(tmp_path, quantization, params, vectors):
    index, queries = _built(quantization, params, vectors)
    path = tmp_path / "a.kbi"
    index.save(path)
    raw = path.read_bytes()
    assert struct.unpack_from("<I", raw, 8)[0] == 7
    bits = params.get("bits", 0)
    assert raw[TAG_AT:].startswith(_tag(quantization, params))  # the type and parameters by name
    back = kbcore.Index.load(path)
    assert (back.quantization, back.bits, back.vectors, back.quantizer_trained) == (
        quantization,
        bits or None,
        vectors,
        True,
    )
    for a, b in zip(back.search(queries, 10, ef=32), index.search(queries, 10, ef=32)):
        np.testing.assert_array_equal(a, b)
    back.save(tmp_path / "b.kbi")
    assert (tmp_path / "b.kbi").read_bytes() == raw


def _sq8_file(tmp_path: Path) -> bytes:
    index, _ = _built("sq8", {})
    index.save(tmp_path / "sq8.kbi")
    return (tmp_path / "sq8.kbi").read_bytes()


@pytest.mark.parametrize("name", ["pq4", "pq_fastscan", "s"])
def test_a_file_tagged_with_an_unknown_code_type_is_refused_naming_it(tmp_path, name):
    raw = _sq8_file(tmp_path)
    old = _tag("sq8", {})
    assert raw[TAG_AT:].startswith(old)
    crafted = bytearray(raw[:TAG_AT] + _tag(name, {}) + raw[TAG_AT + len(old) :])
    path = tmp_path / "unknown.kbi"
    path.write_bytes(_reseal(crafted))
    with pytest.raises(FormatError, match=f"unknown code type '{name}'.*newer kbcore"):
        kbcore.Index.load(path)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"bits": 9}, r"rabitq section: bits must be in \[1, 8\], got 9"),
        ({"bits": 0}, r"bits must be in \[1, 8\], got 0"),
        ({"bots": 4}, "bots does not apply to quantization='rabitq'"),
    ],
)
def test_a_tag_with_a_bad_parameter_is_refused_naming_it(tmp_path, params, message):
    index, _ = _built("rabitq", {"bits": 4})
    index.save(tmp_path / "r.kbi")
    raw = (tmp_path / "r.kbi").read_bytes()
    old = _tag("rabitq", {"bits": 4})
    assert raw[TAG_AT:].startswith(old)
    crafted = bytearray(raw[:TAG_AT] + _tag("rabitq", params) + raw[TAG_AT + len(old) :])
    path = tmp_path / "bad.kbi"
    path.write_bytes(_reseal(crafted))
    with pytest.raises(FormatError, match=message):
        kbcore.Index.load(path)


def test_a_file_of_an_older_version_loads_and_saves_as_version_7(tmp_path):
    for fixture, (quantization, bits) in {
        "sq8_v2_hnsw_cosine.kbi": ("sq8", None),
        "rabitq_v3_hnsw_l2.kbi": ("rabitq", 3),
    }.items():
        old = kbcore.Index.load(DATA_DIR / fixture)
        assert (old.quantization, old.bits) == (quantization, bits)
        old.save(tmp_path / fixture)
        assert struct.unpack_from("<I", (tmp_path / fixture).read_bytes(), 8)[0] == 7
        new = kbcore.Index.load(tmp_path / fixture)
        assert (new.quantization, new.bits, len(new)) == (quantization, bits, len(old))
        queries = np.random.default_rng(3).standard_normal((6, old.dim)).astype(np.float32)
        for a, b in zip(new.search(queries, 10, ef=40), old.search(queries, 10, ef=40)):
            np.testing.assert_array_equal(a, b)


def test_the_committed_version_4_fixture_loads_on_disk_and_answers_at_exact_distances(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_v4_fixture", DATA_DIR / "make_v4_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = DATA_DIR / gen.FILE_NAME
    assert struct.unpack_from("<I", path.read_bytes(), 8)[0] == gen.FORMAT_VERSION == 4
    data, ids = gen.fixture_rows()
    index = kbcore.Index.load(path)
    assert (index.quantization, index.bits, index.vectors, index.rerank, len(index)) == (
        "rabitq",
        gen.BITS,
        "disk",
        30,
        len(ids),
    )
    queries = np.random.default_rng(4).standard_normal((10, gen.DIM)).astype(np.float32)
    got_ids, got_dist = index.search(queries, 10, ef=64)
    by_id = dict(zip(ids.tolist(), data))
    for q, row_ids, row_dist in zip(queries, got_ids, got_dist):
        want = np.array([1.0 - float(np.dot(by_id[i], q)) for i in row_ids], np.float32)
        np.testing.assert_allclose(row_dist, want, rtol=1e-5, atol=1e-5)  # exact, re-ranked distances
    truth = np.argsort(1.0 - data @ queries.T, axis=0)[:10].T
    recall = np.mean([len(set(ids[t].tolist()) & set(g.tolist())) / 10 for t, g in zip(truth, got_ids)])
    assert recall >= 0.9
    index.save(tmp_path / "v7.kbi")
    assert struct.unpack_from("<I", (tmp_path / "v7.kbi").read_bytes(), 8)[0] == 7
    again = kbcore.Index.load(tmp_path / "v7.kbi")
    assert (again.vectors, again.bits, again.rerank) == ("disk", gen.BITS, 30)
    for a, b in zip(again.search(queries, 10, ef=64), (got_ids, got_dist)):
        np.testing.assert_array_equal(a, b)
