"""The BM25 leg of a loaded index is checked at load and built at its first use (issue 28).

``Index.load`` checks the text section's parameters, extent and row slots and keeps its
checksum, but checks its terms and term lists and builds the vocabulary and postings only when
a call first needs them: a text search, text statistics, a write or a save. These tests hold
that first use to the answers of the index before it was saved, show the deferral (memory),
and show that a bad leg (crafted, or bytes changed in place after the load) is a FormatError
naming the file at that first use and at every later one, never a wrong answer nor a write.
"""

from __future__ import annotations

import random
import struct
import sys
import threading

import numpy as np
import pytest

import kbcore
from kbcore import errors

DIM = 16
WORDS = [f"w{i}" for i in range(300)]
QUERIES = ["w1 w2", "w17", "w250 w3 w3 w99", "nothing matches this", "w0 w5 w10 w15 w20"]


def _index(seed: int = 7, n: int = 400, **spec: object) -> tuple[kbcore.Index, list[str]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 30))) for _ in range(n)]
    texts[5] = texts[5] + " zebraterm"  # one term the in-place corruption below can find
    vecs = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    index = kbcore.Index(DIM, M=8, ef_construction=32, **spec)
    index.add(vecs, np.arange(n, dtype=np.int64), texts=texts, metadata=[{"even": i % 2 == 0} for i in range(n)])
    return index, texts


def _answers(index: kbcore.Index) -> list[tuple[list[int], list[float]]]:
    out = []
    for q in QUERIES:
        for where in (None, {"even": True}):
            ids, scores = index.search_text(q, k=15, where=where)
            out.append((ids.tolist(), scores.tolist()))
        out.append(index.text_stats(q))
    return out


def test_first_text_search_after_load_answers_exactly_as_before_save(tmp_path):
    index, _ = _index()
    before = _answers(index)
    index.save(tmp_path / "i.kbi")
    loaded = kbcore.Index.load(tmp_path / "i.kbi")
    assert loaded.text_documents() == index.text_documents()  # known before the build
    assert _answers(loaded) == before


def test_load_defers_building_the_text_postings_until_a_text_search(tmp_path):
    index, texts = _index(n=2000)
    postings = sum(len(set(kbcore.tokenize(t))) for t in texts)
    index.save(tmp_path / "i.kbi")
    loaded = kbcore.Index.load(tmp_path / "i.kbi")
    opened = loaded.memory_usage()
    loaded.search(np.ones(DIM, np.float32), k=5)  # a vector search does not build them
    assert loaded.memory_usage() == opened
    loaded.search_text("w1", k=5)
    # The first text search builds the postings (12 bytes each) and per-row term lists (8)
    # besides the score cache (4) that an index built eagerly also makes then.
    assert loaded.memory_usage() - opened > 12 * postings


def test_concurrent_first_text_searches_build_once_and_agree(tmp_path):
    index, _ = _index(n=3000)
    want = [r.tolist() for r in index.search_text("w1 w2 w3", k=20)]
    index.save(tmp_path / "i.kbi")
    loaded = kbcore.Index.load(tmp_path / "i.kbi")
    got: list = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        got.append([r.tolist() for r in loaded.search_text("w1 w2 w3", k=20)])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4


def test_writes_after_load_build_the_text_leg_first(tmp_path):
    index, texts = _index()
    index.save(tmp_path / "i.kbi")
    loaded = kbcore.Index.load(tmp_path / "i.kbi")
    extra = np.random.default_rng(3).standard_normal((3, DIM)).astype(np.float32)
    for ix in (index, loaded):  # the same writes on the index saved and on the one loaded
        ix.remove(np.arange(0, 40, dtype=np.int64))
        ix.add(extra, np.array([1000, 1001, 7], np.int64), texts=["w1 w1 new", "w2 zebraterm", "w3"])
    assert _answers(loaded) == _answers(index)
    loaded.save(tmp_path / "again.kbi")
    assert _answers(kbcore.Index.load(tmp_path / "again.kbi")) == _answers(index)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="a private mapping shows later in-place writes to its file on Linux only",
)
@pytest.mark.parametrize(
    "spec",
    [
        {},  # format version 1 (checksum64): the section's own checksum, taken at load
        # Version 7 (block checksum), more than one 4 MiB block: the blocks under the section
        # hashed again and compared with the hashes the load's payload checksum took.
        {"quantization": "sq8"},
    ],
)
def test_text_section_rewritten_in_place_after_load_is_a_format_error_naming_the_file(tmp_path, spec):
    index, _ = _index(n=400 if not spec else 40_000, **spec)
    path = tmp_path / "i.kbi"
    index.save(path)
    blob = path.read_bytes()
    assert int.from_bytes(blob[8:12], "little") == (7 if spec else 1)
    assert spec == {} or len(blob) > 2 * (4 << 20)
    at = blob.index(len("zebraterm").to_bytes(8, "little") + b"zebraterm") + 8
    loaded = kbcore.Index.load(path)
    with open(path, "r+b") as f:  # rewritten in place by another program (kbcore renames)
        f.seek(at)
        f.write(b"Z")
    for _ in range(2):  # the failure is not remembered as a built, empty leg
        with pytest.raises(errors.FormatError, match=r"i\.kbi.*BM25 section changed"):
            loaded.search_text("w1", k=5)
    assert len(loaded.search(np.ones(DIM, np.float32), k=5)[0]) == 5  # vectors still answer


def test_committed_v1_bm25_fixture_loads_lazily_and_answers_as_built():
    import json
    from pathlib import Path

    data = Path(__file__).parent / "data"
    sys.path.insert(0, str(data))
    try:
        import make_bm25_fixture as fixture
    finally:
        sys.path.remove(str(data))
    built = fixture.build(json.loads((data / "bm25_rows.json").read_text(encoding="utf-8")), threads=1)
    loaded = kbcore.Index.load(data / "bm25_rows_v1.kbi")
    assert loaded.text_documents() == built.text_documents() > 0
    for q in ["café gamma", "大阪 x", "co-op Beta 42", "absent"]:
        assert [x.tolist() for x in loaded.search_text(q, k=50)] == [x.tolist() for x in built.search_text(q, k=50)]


def _large_index_file(tmp_path) -> tuple:
    """An index file above the size from which the payload checksum runs on a second thread
    (4 MiB), and the payload offset of its float32 rows."""
    n, dim = 3000, 384
    vecs = np.random.default_rng(11).standard_normal((n, dim)).astype(np.float32)
    index = kbcore.Index(dim, "l2", M=4, ef_construction=8)
    index.add(vecs, np.arange(n, dtype=np.int64), texts=["w1 w2"] * n)
    path = tmp_path / "big.kbi"
    index.save(path)
    blob = bytearray(path.read_bytes())
    assert len(blob) > 4 << 20
    return path, blob, blob.index(vecs[:4].tobytes())


@pytest.mark.parametrize("damage", ["nan row", "quiet byte"])
def test_a_damaged_large_file_reports_the_checksum_whatever_the_sections_say(tmp_path, damage):
    path, blob, rows = _large_index_file(tmp_path)
    if damage == "nan row":  # a structure check would refuse it too, first
        blob[rows : rows + 4] = np.array([np.nan], np.float32).tobytes()
    else:  # the low byte of a mantissa: every structure check passes
        blob[rows + 4000] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(errors.FormatError, match=r"big\.kbi.*checksum mismatch"):
        kbcore.Index.load(path)


def test_reopened_knowledge_base_answers_full_text_as_before_and_vector_search_skips_the_build(tmp_path):
    from kbcore.engine import Engine

    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_size=200, chunk_overlap=0)
    rng = random.Random(3)
    for i in range(30):
        kb.ingest(text=" ".join(rng.choice(WORDS) for _ in range(120)), document_id=f"d{i}")
    kb.wait_until_indexed()
    queries = ["w1 w2", "w17 w250", "w3"]

    def answers(k, mode):
        return [[(h.id, round(h.score, 6)) for h in k.retrieve(q, top_k=8, search_type=mode)] for q in queries]

    before = {mode: answers(kb, mode) for mode in ("full_text", "hybrid")}
    kb.checkpoint()  # so that the reopen loads the index file instead of replaying the rows
    kb.close()
    kb2 = Engine(tmp_path).get_knowledge_base("kb")
    # White box: the loaded checkpoint's memory shows whether its postings were built.
    state = kb2._cell.state
    postings = sum(len(set(kbcore.tokenize(seg.text_of(r)))) for seg in state.segments for r in range(seg.rows))
    opened = state.index.memory_usage()
    assert kb2.retrieve("w1 w2", top_k=5)  # a vector search
    assert state.index.memory_usage() == opened
    assert {mode: answers(kb2, mode) for mode in ("full_text", "hybrid")} == before
    assert state.index.memory_usage() - opened > 12 * postings  # see the Index-level test
    kb2.close()


def _reseal(blob: bytearray) -> bytes:
    """The file with its payload checksum recomputed (header: magic, version, flags, payload
    bytes, checksum; cpp/binary_io.h), as a crafted file would have it."""
    from kbcore import _core

    checksum = _core.block_checksum if int.from_bytes(blob[8:12], "little") >= 6 else _core.checksum64
    blob[24:32] = checksum(bytes(blob[32:])).to_bytes(8, "little")
    return bytes(blob)


@pytest.mark.parametrize("spec", [{}, {"quantization": "sq8", "vectors": "disk"}])
def test_rows_checked_in_parallel_blocks_still_refuse_a_bad_row_of_a_resealed_file(tmp_path, spec):
    n, dim = 3000, 384  # 4.6 MB of rows: checked on several threads
    vecs = np.random.default_rng(12).standard_normal((n, dim)).astype(np.float32)
    index = kbcore.Index(dim, "l2", M=4, ef_construction=8, **spec)
    index.add(vecs, np.arange(n, dtype=np.int64))
    path = tmp_path / "rows.kbi"
    index.save(path)
    blob = bytearray(path.read_bytes())
    at = blob.index(vecs[:4].tobytes()) + 2345 * dim * 4 + 17 * 4
    blob[at : at + 4] = np.array([np.inf], np.float32).tobytes()
    path.write_bytes(_reseal(blob))
    with pytest.raises(errors.FormatError, match=r"rows\.kbi.*vector of id 2345 contains NaN or infinity"):
        kbcore.Index.load(path)


def test_sq8_codes_checked_in_parallel_blocks_still_refuse_a_bad_code_row(tmp_path):
    n, dim = 20000, 250  # 5 MB of codes, rows padded to 256 bytes: checked on several threads
    vecs = np.random.default_rng(13).standard_normal((n, dim)).astype(np.float32)
    index = kbcore.Index(dim, "l2", M=4, ef_construction=8, quantization="sq8")
    index.add(vecs, np.arange(n, dtype=np.int64), defer_graph=True)
    path = tmp_path / "codes.kbi"
    index.save(path)
    blob = bytearray(path.read_bytes())
    stride = 256
    assert blob[-(n - 17000) * stride + dim] == 0  # the codes are the file's last section
    blob[-(n - 17000) * stride + dim] = 1  # a padding byte of code row 17000
    path.write_bytes(_reseal(blob))
    with pytest.raises(errors.FormatError, match=r"codes\.kbi.*nonzero padding byte in a code row"):
        kbcore.Index.load(path)


def _fuzz_tool():
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"
    if not (tools / "fuzz_index_load.py").is_file():
        pytest.skip("tools/fuzz_index_load.py (the file crafter) is not beside the tests")
    sys.path.insert(0, str(tools))
    import fuzz_index_load

    return fuzz_index_load


def _crafted(tmp_path, defect: str):
    """A version 1 file (checksum64, which the tool recomputes) whose BM25 leg carries one
    defect that Index.load leaves to the leg's first use."""
    fuzz = _fuzz_tool()
    index, _ = _index(n=60)
    seed = tmp_path / "seed.kbi"
    index.save(seed)  # unquantized: format version 1
    blob = bytearray(seed.read_bytes())
    fields = {f.name: f for f in fuzz.parse_fields(bytes(blob))}

    def get(name: str) -> int:
        return struct.unpack_from("<" + fields[name].fmt, blob, fields[name].offset)[0]

    def put(name: str, value: int) -> None:
        struct.pack_into("<" + fields[name].fmt, blob, fields[name].offset, value)

    if defect == "not valid UTF-8":
        put("bm25.term[0].byte0", 0xFF)
    elif defect == "repeated BM25 term":  # term 1 spelled as term 0 (both 'w' + digits)
        assert get("bm25.term[0].len") == get("bm25.term[1].len") or pytest.fail("seed terms differ in length")
        at0, at1 = fields["bm25.term[0].byte0"].offset, fields["bm25.term[1].byte0"].offset
        n = get("bm25.term[0].len")
        blob[at1 : at1 + n] = blob[at0 : at0 + n]
    elif defect == "document length disagrees":
        put("bm25.doc[0].len", get("bm25.doc[0].len") + 1)
    elif defect == "invalid BM25 term list":
        put("bm25.doc[0][0].tf", 0)
    path = tmp_path / "bad.kbi"
    path.write_bytes(fuzz.reseal(blob))
    return index, path


@pytest.mark.parametrize(
    "defect", ["not valid UTF-8", "repeated BM25 term", "document length disagrees", "invalid BM25 term list"]
)
def test_text_leg_checked_at_first_use_refuses_a_bad_leg_and_changes_nothing(tmp_path, defect):
    index, path = _crafted(tmp_path, defect)
    loaded = kbcore.Index.load(path)  # the vectors, graph and metadata were checked: they answer
    q = np.random.default_rng(1).standard_normal(DIM).astype(np.float32)
    want = [r.tolist() for r in index.search(q, k=10)]
    assert [r.tolist() for r in loaded.search(q, k=10)] == want
    for call in (
        lambda: loaded.search_text("w1", k=5),
        lambda: loaded.text_stats("w1"),
        lambda: loaded.search_text("w1", k=5),  # refused again, not remembered as an empty leg
        lambda: loaded.add(np.ones((1, DIM), np.float32), np.array([999], np.int64), texts=["w1"]),
        lambda: loaded.remove(np.array([0], np.int64)),
        lambda: loaded.save(tmp_path / "again.kbi"),
    ):
        with pytest.raises(errors.FormatError, match=rf"bad\.kbi.*{defect}"):
            call()
    assert len(loaded) == len(index)  # the refused writes changed nothing
    assert [r.tolist() for r in loaded.search(q, k=10)] == want
    assert not (tmp_path / "again.kbi").exists()
