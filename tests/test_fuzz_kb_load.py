"""Fuzz target: the knowledge-base loader (manifest + segments + vector files) on crafted input.

Every crafted directory has its CRC-32s and the manifest checksum recomputed, so the crafted
content reaches the structural checks behind them. Opening must either succeed, after which
retrieval / listing / counting work, or raise FormatError; never another exception, a crash
(SIGBUS/SIGSEGV), a hang or a huge allocation.

Bounded for CI: a fixed seed (``derandomize``) and KBCORE_FUZZ_EXAMPLES examples per target
(default 150, about 10-20 s in all). A long run::

    KBCORE_FUZZ_EXAMPLES=20000 KBCORE_FUZZ_RANDOM=1 python -m pytest tests/test_fuzz_kb_load.py -q

(KBCORE_FUZZ_RANDOM=1 drops the fixed seed so each run explores new inputs; hypothesis prints
the failing example, which then becomes a test in tests/test_storage_validation.py.)
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import zlib

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz targets need hypothesis (pip install .[test])")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kbcore import Engine  # noqa: E402
from kbcore import engine as engine_mod  # noqa: E402
from kbcore.engine import storage  # noqa: E402
from kbcore.errors import FormatError, KbcoreError  # noqa: E402

EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=not os.environ.get("KBCORE_FUZZ_RANDOM"),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build_base_kb(path: str) -> str:
    """A small knowledge base with every kind of file: an index checkpoint, a segment with a
    vector file, deleted documents, two pipelines, user metadata. Returns the kb directory."""
    eng = Engine(path)
    kb = eng.create_knowledge_base("kb", chunk_size=60, chunk_overlap=5)
    kb.create_pipeline("small", chunk_size=30, chunk_overlap=0)
    kb.ingest_many(
        [
            engine_mod.Document(
                text=" ".join(f"doc {i} sentence {s} words here." for s in range(6)),
                document_id=f"d{i}",
                metadata={"v": i, "tag": f"t{i % 2}"},
            )
            for i in range(3)
        ]
    )  # one segment of three documents
    kb.checkpoint()
    kb.ingest(text="another document about words. " * 4, document_id="e", pipeline="small", metadata={"v": 9})
    kb.ingest(text="a document that is deleted later. " * 3, document_id="gone")
    kb.delete_document("d1")
    kb._builder.retire()
    kb._closed = True  # dropped without close(): keep the vector file and the tail
    eng._forget(kb)
    m = storage.load_manifest(kb.path)
    assert m["index"] and any(s["files"]["vectors"] for s in m["segments"])
    assert any(s["deleted_docs"] for s in m["segments"])
    return kb.path


@pytest.fixture(scope="module")
def base_kb(tmp_path_factory) -> str:
    return build_base_kb(str(tmp_path_factory.mktemp("fuzzbase") / "data"))


def write_crafted(
    base_kb: str, work: str, manifest: dict, files: dict[str, bytes] | None = None, *, fix_sizes: bool = True
) -> str:
    """Copies the base knowledge base to ``work``, replaces files (name -> bytes) and the
    manifest, recomputing every CRC-32 and size (unless ``fix_sizes`` is False) and the
    manifest checksum. Returns the crafted knowledge base directory."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.dirname(base_kb), work)
    d = os.path.join(work, "kb")
    for name, data in (files or {}).items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    if fix_sizes:
        fix_entries(manifest, d)
    manifest.pop("checksum", None)
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    manifest["checksum"] = zlib.crc32(text.encode("utf-8"))
    with open(os.path.join(d, storage.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, sort_keys=True, ensure_ascii=False)
    return d


def fix_entries(manifest: dict, d: str) -> None:
    """Recomputes bytes / crc32 of every well-formed file entry whose file exists."""
    entries = []
    segs = manifest.get("segments")
    if isinstance(segs, list):
        for s in segs:
            if isinstance(s, dict) and isinstance(s.get("files"), dict):
                entries += [e for e in s["files"].values() if isinstance(e, dict)]
    if isinstance(manifest.get("index"), dict):
        entries.append(manifest["index"])
    for e in entries:
        p = e.get("path")
        if isinstance(p, str) and "\x00" not in p and os.path.basename(p) == p and p not in ("", ".", ".."):
            full = os.path.join(d, p)
            if os.path.isfile(full):
                data = _read_bytes(full)
                e["bytes"], e["crc32"] = len(data), zlib.crc32(data)


def open_and_use(kb_dir: str) -> None:
    """Opens the crafted knowledge base: FormatError, or a knowledge base that works."""
    eng = Engine(os.path.dirname(kb_dir))
    try:
        kb = eng.get_knowledge_base("kb")
    except FormatError:
        return
    try:
        try:
            kb.documents()
            len(kb)
            kb.count()
            kb.count({"v": 1})
            if kb.dim:
                kb.retrieve([0.1] * kb.dim, top_k=5)
                kb.retrieve("sentence words", top_k=5, search_type="hybrid")
        except KbcoreError:
            pass
    finally:
        kb._builder.retire()
        kb._closed = True
        eng._forget(kb)


# -- manifest mutations ----------------------------------------------------------------------


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


INTERESTING = st.one_of(
    st.sampled_from(
        [
            -1,
            0,
            1,
            2,
            7,
            255,
            256,
            65536,
            65537,
            2**31,
            2**32,
            2**53,
            2**63 - 1,
            2**63,
            2**64,
            -(2**63),
            10**30,
            1.5,
            -0.0,
            1e308,
            True,
            False,
            None,
            "",
            "x",
            "../manifest.json",
            "../../etc/passwd",
            "/etc/passwd",
            "seg-1",
            "seg-00000001",
            "index-1.kbi",
            "seg-00000002.chunks.arrow",
            ".lock",
            "manifest.json",
            "a/b",
            "cosine",
            "hnsw",
            "flat",
            "hashing",
            "none",
            "default",
            [],
            {},
            [0],
            [-1],
            [0, 0],
            [2**40],
            {"path": "x"},
            {"kind": "hashing", "dim": 2**50},
            {"chunk_size": 0, "chunk_overlap": 0},
        ]
    ),
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.lists(st.integers(-3, 20), max_size=4),
)


@st.composite
def manifest_mutation(draw, base):
    m = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(m) if p and p[0] != "checksum"]
        path = draw(st.sampled_from(paths))
        parent = m
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        key = path[-1]
        if action == "delete":
            if isinstance(parent, dict):
                parent.pop(key, None)
            else:
                parent.pop(key)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "rows", "docs", "vectors", "index", "dim"]))] = copy.deepcopy(
                draw(INTERESTING)
            )
        elif action == "add" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[0] if parent and draw(st.booleans()) else draw(INTERESTING)))
        else:
            parent[key] = copy.deepcopy(draw(INTERESTING))  # a fresh object: no shared or cyclic values
    return m


@FUZZ
@given(data=st.data())
def test_fuzz_crafted_manifest_loads_or_raises_format_error(base_kb, tmp_path_factory, data):
    base = _read_json(os.path.join(base_kb, storage.MANIFEST))
    m = data.draw(manifest_mutation(base))
    work = str(tmp_path_factory.getbasetemp() / "fuzz-manifest")
    open_and_use(write_crafted(base_kb, work, m))


# -- segment file mutations -------------------------------------------------------------------


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not b:
            break
        kind = draw(st.sampled_from(["byte", "word", "qword", "truncate", "zero"]))
        i = draw(st.integers(0, len(b) - 1))
        if kind == "byte":
            b[i] = draw(st.integers(0, 255))
        elif kind == "word":
            b[i : i + 4] = draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000])).to_bytes(4, "little")
        elif kind == "qword":
            b[i : i + 8] = draw(st.sampled_from([0, 2**40, 2**63 - 1, 2**64 - 1, 2**57])).to_bytes(8, "little")
        elif kind == "truncate":
            del b[i:]
        else:
            b[i : i + draw(st.integers(1, 64))] = bytes(min(64, len(b) - i))
    return bytes(b)


def _segment_files(base_kb: str) -> list[str]:
    return sorted(n for n in os.listdir(base_kb) if n.startswith("seg-"))


@FUZZ
@given(data=st.data())
def test_fuzz_damaged_segment_file_with_matching_crc_raises_format_error(base_kb, tmp_path_factory, data):
    base = _read_json(os.path.join(base_kb, storage.MANIFEST))
    name = data.draw(st.sampled_from(_segment_files(base_kb)))
    crafted = data.draw(byte_mutation(_read_bytes(os.path.join(base_kb, name))))
    work = str(tmp_path_factory.getbasetemp() / "fuzz-segment")
    open_and_use(write_crafted(base_kb, work, copy.deepcopy(base), {name: crafted}))


def _table_bytes(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


@st.composite
def table_mutation(draw, table):
    """A well-formed Arrow file whose content is wrong: a column dropped, retyped, nulled,
    reordered or its values replaced."""
    import pyarrow as pa

    col = draw(st.sampled_from(table.column_names))
    i = table.column_names.index(col)
    kind = draw(st.sampled_from(["drop", "string", "int32", "nulls", "values", "reverse", "dup", "slice"]))
    if kind == "drop":
        return table.remove_column(i)
    if kind == "string":
        return table.set_column(
            i,
            col,
            table.column(col).cast(pa.string())
            if not pa.types.is_string(table.column(col).type)
            else pa.array([1] * table.num_rows),
        )
    if kind == "int32":
        return table.set_column(i, col, pa.array([draw(st.integers(-5, 5))] * table.num_rows, pa.int32()))
    if kind == "nulls":
        return table.set_column(i, col, pa.nulls(table.num_rows, table.column(col).type))
    if kind == "values":
        vals = draw(
            st.lists(
                st.sampled_from([-1, 0, 1, 3, 2**31, 2**62, -(2**63)]), min_size=table.num_rows, max_size=table.num_rows
            )
        )
        return table.set_column(i, col, pa.array(vals, pa.int64()))
    if kind == "reverse":
        return table.take(pa.array(list(range(table.num_rows))[::-1]))
    if kind == "dup":
        return pa.concat_tables([table, table.slice(0, 1)])
    return table.slice(0, max(table.num_rows - 1, 0))


@FUZZ
@given(data=st.data())
def test_fuzz_crafted_segment_table_loads_or_raises_format_error(base_kb, tmp_path_factory, data):
    import pyarrow as pa

    base = _read_json(os.path.join(base_kb, storage.MANIFEST))
    name = data.draw(st.sampled_from([n for n in _segment_files(base_kb) if n.endswith(".arrow")]))
    table = pa.ipc.open_file(pa.py_buffer(_read_bytes(os.path.join(base_kb, name)))).read_all()
    crafted = _table_bytes(data.draw(table_mutation(table)))
    work = str(tmp_path_factory.getbasetemp() / "fuzz-table")
    open_and_use(write_crafted(base_kb, work, copy.deepcopy(base), {name: crafted}))


def test_the_base_knowledge_base_itself_opens_and_answers(base_kb, tmp_path):
    """The fuzz targets start from a valid directory (else they would test nothing)."""
    base = _read_json(os.path.join(base_kb, storage.MANIFEST))
    work = write_crafted(base_kb, str(tmp_path / "w"), base)
    kb = Engine(os.path.dirname(work)).get_knowledge_base("kb")
    assert {i.document_id for i in kb.documents()} == {"d0", "d2", "e", "gone"}
    assert kb.retrieve("sentence words", top_k=3)
    kb.close()
