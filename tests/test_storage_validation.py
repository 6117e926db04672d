"""Structural validation behind the checksums: crafted manifests and segment files whose CRC-32s
and manifest checksum were recomputed must raise FormatError naming the problem, never another
exception, a crash or a silently wrong knowledge base. Each case is a regression test of a
defect a prober or the fuzz targets (test_fuzz_kb_load.py) found."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_fuzz_kb_load import _read_bytes, _read_json, build_base_kb, write_crafted

from kbcore import Engine
from kbcore.engine import storage
from kbcore.errors import FormatError


@pytest.fixture(scope="module")
def base_kb(tmp_path_factory) -> str:
    return build_base_kb(str(tmp_path_factory.mktemp("validbase") / "data"))


@pytest.fixture
def base_manifest(base_kb) -> dict:
    return _read_json(os.path.join(base_kb, storage.MANIFEST))


def _open(kb_dir: str):
    return Engine(os.path.dirname(kb_dir)).get_knowledge_base("kb")


def _seg_with_deleted(m: dict) -> dict:
    return next(s for s in m["segments"] if s["deleted_docs"])


def _set(m: dict, path: str, value) -> dict:
    m = copy.deepcopy(m)
    keys = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
    obj = m
    for k in keys[:-1]:
        obj = obj[k]
    obj[keys[-1]] = value
    return m


# -- the manifest --------------------------------------------------------------------------

BAD_MANIFESTS = [
    # (field path, value, field the error must name) -- each crashed or was accepted before
    ("segments", {"seg-1": {}}, "segments"),  # AttributeError before
    ("segments.0", "seg-00000003", "segments[0]"),  # TypeError before
    ("segments.0.files", [], "segments[0].files"),
    ("segments.0.files.chunks.path", "../../outside.arrow", "segments[0].files.chunks.path"),
    ("segments.0.files.chunks.path", "/etc/passwd", "segments[0].files.chunks.path"),
    ("segments.0.files.docs.path", "seg-00000099.docs.arrow", "segments[0].files.docs.path"),
    ("segments.0.files.chunks.bytes", -5, "segments[0].files.chunks.bytes"),
    ("segments.0.files.chunks.crc32", 2**40, "segments[0].files.chunks.crc32"),
    ("segments.0.rows", 2**60, "segments[0].rows"),
    ("segments.0.rows", "9", "segments[0].rows"),
    ("segments.0.name", "seg-99999999", "segments[0].name"),  # after the generation
    ("segments.0.name", "../seg-1", "segments[0].name"),
    ("segments.0.deleted_docs", [-1], "segments[0].deleted_docs[0]"),  # accepted silently before
    ("segments.0.deleted_docs", [2**40], "segments[0].deleted_docs[0]"),  # IndexError before
    ("segments.0.deleted_docs", [1, 1], "segments[0].deleted_docs"),
    ("segments.0.deleted_docs", "1", "segments[0].deleted_docs"),
    ("next_id", 3, "next_id"),  # rewound: new ids would collide
    ("next_id", -1, "next_id"),
    ("next_id", 2**64, "next_id"),  # OverflowError before
    ("next_group", "x", "next_group"),
    ("generation", 0, "generation"),
    ("generation", 2.5, "generation"),
    ("version", 0, "version"),
    ("config", None, "config"),
    ("config.dim", 2**55, "config.dim"),  # MemoryError (128 PiB) before
    ("config.dim", 0, "config.dim"),
    ("config.M", 1, "config.M"),
    ("config.M", 100_000, "config.M"),  # above the native kMaxM
    ("config.quantization", "pq4", "config.quantization"),  # InvalidArgumentError (ValueError) before
    ("config.metric", "hamming", "config.metric"),
    ("config.ef", 2**62, "config.ef"),
    ("config.chunk_overlap", 60, "config.chunk_overlap"),
    ("config.vector_weight", 7, "config.vector_weight"),
    ("config.search_type", "psychic", "config.search_type"),
    ("config.shards", "2", "config.shards"),  # int("2") took it before
    ("config.shards", 0, "config.shards"),
    ("embedder.dim", 2**50, "embedder.dim"),
    ("embedder.char_ngrams", [0, 99], "embedder.char_ngrams[0]"),
    ("embedder", [], "embedder"),
    ("pipelines", {}, "pipelines"),
    ("pipelines.small", {"chunk_size": 0, "chunk_overlap": 0}, "pipelines.small.chunk_size"),
    ("index.path", "../index-00000001.kbi", "index.path"),
    ("index.path", "index-99999999.kbi", "index.path"),
    ("index.rows", -2, "index.rows"),
    ("index", [1, 2], "index"),
]


@pytest.mark.parametrize("path,value,field", BAD_MANIFESTS, ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD_MANIFESTS])
def test_crafted_manifest_with_a_valid_checksum_raises_format_error_naming_the_field(
    base_kb, base_manifest, tmp_path, path, value, field
):
    m = base_manifest
    if path.startswith("segments.0") and path != "segments.0":
        i = m["segments"].index(_seg_with_deleted(m))
        path = path.replace("segments.0", f"segments.{i}", 1)
        field = field.replace("segments[0]", f"segments[{i}]", 1)
    d = write_crafted(
        base_kb, str(tmp_path / "w"), _set(m, path, value), fix_sizes=not path.endswith((".bytes", ".crc32"))
    )
    with pytest.raises(FormatError) as e:
        _open(d)
    assert f"field {field!r}" in str(e.value)


def test_a_shard_count_past_the_limit_is_refused_before_any_shard_starts(tmp_path):
    # one Ray actor per shard: a count the manifest check lets through (an int >= 1) but no
    # cluster runs is a FormatError when the shards would open, before Ray is needed
    from kbcore.engine.shards import open_index

    for n in (1025, 5000):
        with pytest.raises(FormatError, match="shards must be at most 1024"):
            open_index(str(tmp_path), {"shards": n, "metric": "cosine", "index": "flat"}, 8)
    assert os.listdir(tmp_path) == []


def test_missing_top_level_field_is_named(base_kb, base_manifest, tmp_path):
    for key in ("segments", "config", "next_id", "pipelines", "generation"):
        m = copy.deepcopy(base_manifest)
        del m[key]
        d = write_crafted(base_kb, str(tmp_path / key), m)
        with pytest.raises(FormatError, match=f"field '{key}' is missing"):
            _open(d)


def test_segment_id_ranges_must_be_disjoint(base_kb, base_manifest, tmp_path):
    """Two manifest entries naming the same segment under two names (the same ids twice)."""
    m = copy.deepcopy(base_manifest)
    seg = copy.deepcopy(m["segments"][-1])
    gen = m["generation"] + 1
    m["generation"] = gen
    files = {}
    for kind in ("chunks", "docs", "vectors"):
        if seg["files"].get(kind):
            ext = "npy" if kind == "vectors" else "arrow"
            new = f"seg-{gen:08d}.{kind}.{ext}"
            files[new] = _read_bytes(os.path.join(base_kb, seg["files"][kind]["path"]))
            seg["files"][kind] = {"path": new, "bytes": 0, "crc32": 0}
    seg["name"] = f"seg-{gen:08d}"
    m["segments"].append(seg)
    m["next_id"] += seg["rows"]
    d = write_crafted(base_kb, str(tmp_path / "w"), m, files)
    with pytest.raises(FormatError, match="share chunk ids"):
        _open(d)


def test_manifest_that_is_not_json_or_too_deep_or_nan_raises_format_error(base_kb, tmp_path):
    for name, body in [
        ("deep", b"[" * 100000 + b"]" * 100000),
        ("nan", b'{"format": NaN}'),
        ("bytes", b"\xff\xfe garbage"),
        ("list", b"[1, 2]"),
    ]:
        d = write_crafted(base_kb, str(tmp_path / name), _read_json(os.path.join(base_kb, storage.MANIFEST)))
        with open(os.path.join(d, storage.MANIFEST), "wb") as f:
            f.write(body)
        with pytest.raises(FormatError):
            _open(d)


def test_valid_manifest_still_opens_and_validator_accepts_what_the_engine_writes(base_kb, tmp_path):
    kb = _open(write_crafted(base_kb, str(tmp_path / "w"), _read_json(os.path.join(base_kb, storage.MANIFEST))))
    assert storage.validate_manifest(kb._cell.state.manifest) is kb._cell.state.manifest
    kb.ingest(text="one more document to check the writer's manifest. " * 3, document_id="z")
    kb.compact()
    storage.validate_manifest(storage.load_manifest(kb.path))
    kb.close()


# -- segment files ----------------------------------------------------------------------------


def _arrow(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _table(base_kb: str, name: str):
    import pyarrow as pa

    return pa.ipc.open_file(pa.py_buffer(_read_bytes(os.path.join(base_kb, name)))).read_all()


def _chunks_name(m: dict) -> str:
    return _seg_with_deleted(m)["files"]["chunks"]["path"]


def _docs_name(m: dict) -> str:
    return _seg_with_deleted(m)["files"]["docs"]["path"]


def test_text_offsets_past_the_data_raise_format_error_not_a_crash(base_kb, base_manifest, tmp_path):
    """A chunks file whose string offsets point past its data buffer, CRC recomputed: read
    through a memory map without validation this crashed the process (SIGSEGV/SIGBUS in
    pyarrow). Run in a child process so that a crash fails the test instead of killing it."""
    import pyarrow as pa

    name = _chunks_name(base_manifest)
    raw = bytearray(_read_bytes(os.path.join(base_kb, name)))
    buf = pa.py_buffer(bytes(raw))
    batch = pa.ipc.open_file(buf).get_batch(0)
    offsets = batch.column(batch.schema.get_field_index("__text")).buffers()[1]
    pos = offsets.address - buf.address  # the offsets buffer is a slice of the file
    width = 8 if pa.types.is_large_string(batch.schema.field("__text").type) else 4
    last = pos + (batch.num_rows) * width
    raw[last : last + width] = (1 << (8 * width - 2)).to_bytes(width, "little")
    d = write_crafted(base_kb, str(tmp_path / "w"), copy.deepcopy(base_manifest), {name: bytes(raw)})
    code = textwrap.dedent(f"""
        from kbcore import Engine
        from kbcore.errors import FormatError
        try:
            kb = Engine({os.path.dirname(d)!r}).get_knowledge_base("kb")
            kb.retrieve("sentence words", top_k=50)
            print("opened", [h.content[:5] for h in kb.retrieve("sentence words", top_k=50)])
        except FormatError as e:
            print("FormatError", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the loader crashed (exit {r.returncode}): {r.stderr[-2000:]}"
    assert r.stdout.startswith("FormatError") and "not valid Arrow" in r.stdout, r.stdout


def _replace_column(table, col, array):
    return table.set_column(table.column_names.index(col), col, array)


CHUNK_CASES = {
    "ids_not_increasing": lambda t, pa: _replace_column(
        t, "__id", pa.array(t.column("__id").to_pylist()[::-1], pa.int64())
    ),
    "ids_beyond_next_id": lambda t, pa: _replace_column(
        t, "__id", pa.array([x + 10**6 for x in t.column("__id").to_pylist()], pa.int64())
    ),
    "negative_ids": lambda t, pa: _replace_column(
        t, "__id", pa.array([x - 10**6 for x in t.column("__id").to_pylist()], pa.int64())
    ),
    "id_as_string": lambda t, pa: _replace_column(t, "__id", t.column("__id").cast(pa.string())),
    "id_nulls": lambda t, pa: _replace_column(t, "__id", pa.nulls(t.num_rows, pa.int64())),
    "no_text_column": lambda t, pa: t.drop_columns(["__text"]),
    "text_as_int": lambda t, pa: _replace_column(t, "__text", pa.array(range(t.num_rows), pa.int64())),
    "group_beyond_next_group": lambda t, pa: _replace_column(t, "_group", pa.array([10**9] * t.num_rows, pa.int64())),
    "one_row_less": lambda t, pa: t.slice(0, t.num_rows - 1),
}


@pytest.mark.parametrize("case", sorted(CHUNK_CASES))
def test_crafted_chunks_table_raises_format_error(base_kb, base_manifest, tmp_path, case):
    import pyarrow as pa

    name = _chunks_name(base_manifest)
    crafted = _arrow(CHUNK_CASES[case](_table(base_kb, name), pa))
    d = write_crafted(base_kb, str(tmp_path / "w"), copy.deepcopy(base_manifest), {name: crafted})
    with pytest.raises(FormatError, match=os.path.basename(name)):
        _open(d)


DOC_CASES = {
    "counts_do_not_add_up": lambda t, pa: _replace_column(t, "n_chunks", pa.array([1] * t.num_rows, pa.int64())),
    "negative_count": lambda t, pa: _replace_column(
        t, "n_chunks", pa.array([-1] + t.column("n_chunks").to_pylist()[1:], pa.int64())
    ),
    "metadata_not_json": lambda t, pa: _replace_column(t, "metadata", pa.array(["{oops"] * t.num_rows, pa.string())),
    "metadata_null": lambda t, pa: _replace_column(t, "metadata", pa.nulls(t.num_rows, pa.string())),
    "no_document_id": lambda t, pa: t.drop_columns(["document_id"]),
    "extra_row": lambda t, pa: pa.concat_tables([t, t.slice(0, 1)]),
}


@pytest.mark.parametrize("case", sorted(DOC_CASES))
def test_crafted_docs_table_raises_format_error(base_kb, base_manifest, tmp_path, case):
    import pyarrow as pa

    name = _docs_name(base_manifest)
    crafted = _arrow(DOC_CASES[case](_table(base_kb, name), pa))
    d = write_crafted(base_kb, str(tmp_path / "w"), copy.deepcopy(base_manifest), {name: crafted})
    with pytest.raises(FormatError, match=os.path.basename(name)):
        # a document's metadata is checked where it is read (opening parses no JSON)
        _open(d).documents()


def _vectors_entry(m: dict) -> dict:
    return next(s["files"]["vectors"] for s in m["segments"] if s["files"].get("vectors"))


@pytest.mark.parametrize("case", ["nan", "wrong_shape", "float64", "bad_header"])
def test_crafted_vector_file_raises_format_error(base_kb, base_manifest, tmp_path, case):
    import io

    name = _vectors_entry(base_manifest)["path"]
    arr = np.load(os.path.join(base_kb, name))
    if case == "nan":
        arr = arr.copy()
        arr[0, 0] = np.nan
    elif case == "wrong_shape":
        arr = arr[:, :-1]
    elif case == "float64":
        arr = arr.astype(np.float64)
    bio = io.BytesIO()
    np.save(bio, arr)
    data = bio.getvalue()
    if case == "bad_header":
        data = data.replace(b"'descr'", b"'descr\x00")  # numpy's parser raised SyntaxError
    d = write_crafted(base_kb, str(tmp_path / "w"), copy.deepcopy(base_manifest), {name: data})
    with pytest.raises(FormatError, match=os.path.basename(name)):
        _open(d)
