"""Structure-aware fuzzing of ``kbcore.Index.load``.

The bit-flip sweep of tests/test_index_persistence.py never gets past the checksum. This
module parses a saved index file into its structural fields (counts, slots, levels, link
targets, flags, metadata and BM25 records, and in quantized files the SQ8 codes: the version 5
code tag (type name, parameters, re-rank depth) or the version 2 section's kind and re-rank
depth, then the quantizer ranges and codes; cpp/index_format.cpp, hnsw_index.cpp,
metadata_store.cpp, bm25_index.cpp, sq8_codes.cpp ``save``), mutates one or a few of them,
RECOMPUTES the payload checksum
(``checksum64`` of cpp/binary_io.cpp, reimplemented below) and loads the result in a child
process. A crafted file must either be rejected with FormatError (by the load, or for the
BM25 leg, checked at its first use, by that first use) or load into an index on
which every operation works (search, filtered and grouped search, text search, metadata,
vectors, remove, add) and which saves back to the same bytes (a version 2 to 5 file: to a
version 6 file that does). Anything else, a crash (the
child dies), another exception at load, or an accepted file that fails later, is a finding.

Bounded run (what tests/test_fuzz_index_load.py does in CI): fixed seeds, a few hundred files.
Long run, for a developer (minutes to hours)::

    python tools/fuzz_index_load.py --files 20000 --seed 1
    python tools/fuzz_index_load.py --atheris -- -runs=100000 -seed=1   # coverage-guided
    KBCORE_FUZZ_LONG=1 python -m pytest tests/test_fuzz_index_load.py   # same, via pytest

With ``--save-findings DIR`` every finding is written to DIR; minimise it and commit it under
tests/data/fuzz/ as a regression file (the tests load every file there).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HEADER_BYTES = 32
MASK = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F


# --------------------------------------------------------------------------------------------
# checksum64 (cpp/binary_io.cpp), bit for bit


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & MASK


def checksum64(data: bytes, seed: int = 0) -> int:
    """The payload checksum of cpp/binary_io.cpp ``checksum64``."""
    n = len(data)
    body = n & ~7
    h = (seed ^ P1) & MASK
    for (w,) in struct.iter_unpack("<Q", data[:body]):
        h ^= (_rotl((w * P2) & MASK, 31) * P1) & MASK
        h = (_rotl(h, 27) * P1 + 0x165667B19E3779F9) & MASK
    tail = data[body:]
    w = int.from_bytes(tail, "little") ^ ((n - body) << 56)
    h ^= (_rotl((w * P2) & MASK, 31) * P1) & MASK
    h = (_rotl(h, 27) * P1 + 0x165667B19E3779F9) & MASK
    h ^= n
    h ^= h >> 33
    h = (h * P2) & MASK
    h ^= h >> 29
    return h


def reseal(file_bytes: bytes | bytearray) -> bytes:
    """The file with its header's payload size and checksum recomputed for its payload."""
    out = bytearray(file_bytes)
    payload = bytes(out[HEADER_BYTES:])
    if struct.unpack_from("<I", out, 8)[0] >= 6:
        # A block checksum (XXH3, cpp/binary_io.h), which this pure-Python tool does not compute;
        # the corpus's seeds are versions 1 to 5.
        raise ValueError("reseal reads versions 1 to 5 (checksum64); version 6 has a block checksum")
    struct.pack_into("<QQ", out, 16, len(payload), checksum64(payload))
    return bytes(out)


# --------------------------------------------------------------------------------------------
# the structural fields of a saved file


@dataclass(frozen=True)
class FieldAt:
    """One fixed-width little-endian field of a saved file (absolute offset)."""

    name: str
    offset: int
    fmt: str  # struct format without the '<': B, I, Q, q, f


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = HEADER_BYTES
        self.fields: list[FieldAt] = []

    def take(self, name: str, fmt: str) -> int | float:
        (v,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.fields.append(FieldAt(name, self.pos, fmt))
        self.pos += struct.calcsize(fmt)
        return v

    def skip(self, n: int) -> None:
        self.pos += n


def parse_fields(data: bytes) -> list[FieldAt]:
    """Every structural field of a file written by ``Index.save`` (raises on other files)."""
    c = _Cursor(data)
    dim = c.take("config.dim", "Q")
    c.take("config.metric", "B")
    kind = c.take("config.kind", "B")
    c.take("config.ef_search", "Q")
    m = c.take("config.M", "Q")
    c.take("config.ef_construction", "Q")
    c.take("config.seed", "Q")
    (version,) = struct.unpack_from("<I", data, 8)
    if version >= 4:
        c.take("config.vectors", "B")
    if version >= 5:
        # The code tag (Index::kFormatVersionTagged): type name, parameters by name, re-rank depth.
        ln = c.take("tag.name_len", "I")
        c.take("tag.name_byte0", "B")
        c.skip(ln - 1)
        for p in range(c.take("tag.params", "I")):
            ln = c.take(f"tag.param[{p}].name_len", "I")
            c.skip(ln)
            c.take(f"tag.param[{p}].value", "q")
        c.take("sq8.rerank", "Q")
    n = c.take("store.slots", "Q")
    for s in range(n):
        c.take(f"store.id[{s}]", "q")
    for s in range(n):
        c.take(f"store.live[{s}]", "B")
    if version >= 4:
        c.skip(-c.pos % 64)  # zero padding: the rows start at a 64-byte file offset
    for s in range(n):
        c.take(f"store.vector[{s}][0]", "f")
        c.skip(4 * (dim - 1))
    if kind == 0:
        c.take("graph.M", "Q")
        c.take("graph.ef_construction", "Q")
        c.take("graph.seed", "Q")
        c.take("graph.entry", "I")
        c.take("graph.max_level_plus_1", "I")
        c.take("graph.slots", "Q")
        levels = []
        for s in range(n):
            levels.append(c.take(f"graph.level[{s}]", "B"))
        m0 = 2 * m
        for s in range(n):
            c.take(f"graph.links0[{s}].count", "I")
            for j in range(m0):
                c.take(f"graph.links0[{s}][{j}]", "I")
        for s in range(n):
            for lv in range(1, levels[s] + 1):
                c.take(f"graph.upper[{s}][{lv}].count", "I")
                for j in range(m):
                    c.take(f"graph.upper[{s}][{lv}][{j}]", "I")
        for s in range(n):
            c.take(f"graph.pending[{s}]", "B")
    nfields = c.take("meta.fields", "Q")
    for f in range(nfields):
        ln = c.take(f"meta[{f}].name_len", "Q")
        c.skip(ln)
        present = c.take(f"meta[{f}].present", "Q")
        for e in range(present):
            c.take(f"meta[{f}][{e}].slot", "I")
            vk = c.take(f"meta[{f}][{e}].kind", "B")
            if vk == 4:
                ln = c.take(f"meta[{f}][{e}].str_len", "Q")
                if ln:
                    c.take(f"meta[{f}][{e}].str_byte0", "B")
                    c.skip(ln - 1)
            elif vk == 5:
                cnt = c.take(f"meta[{f}][{e}].list_len", "Q")
                for j in range(cnt):
                    ln = c.take(f"meta[{f}][{e}][{j}].str_len", "Q")
                    if ln:
                        c.take(f"meta[{f}][{e}][{j}].str_byte0", "B")
                        c.skip(ln - 1)
            else:
                c.take(f"meta[{f}][{e}].value", "q")
    c.take("bm25.k1", "f")
    c.take("bm25.b", "f")
    nterms = c.take("bm25.terms", "Q")
    for t in range(nterms):
        ln = c.take(f"bm25.term[{t}].len", "Q")
        if ln:
            c.take(f"bm25.term[{t}].byte0", "B")
        c.skip(max(ln - 1, 0))
    docs = c.take("bm25.docs", "Q")
    for d in range(docs):
        c.take(f"bm25.doc[{d}].slot", "I")
        c.take(f"bm25.doc[{d}].len", "I")
        nt = c.take(f"bm25.doc[{d}].terms", "Q")
        for j in range(nt):
            c.take(f"bm25.doc[{d}][{j}].term", "I")
            c.take(f"bm25.doc[{d}][{j}].tf", "I")
    if version >= 2:
        # The SQ8 section (versions 2 to 4 start with its kind and re-rank depth, which version 5
        # holds in its code tag): the first two bytes and the first padding byte of every code
        # row are fields.
        if version < 5:
            c.take("sq8.quantization", "B")
            c.take("sq8.rerank", "Q")
        qdim = c.take("sq8.dim", "Q")
        stride = c.take("sq8.stride", "Q")
        if c.take("sq8.trained", "B"):
            for d in range(qdim):
                c.take(f"sq8.lo[{d}]", "f")
            for d in range(qdim):
                c.take(f"sq8.scale[{d}]", "f")
        codes = c.take("sq8.slots", "Q")
        for s in range(codes):
            row = c.pos
            c.take(f"sq8.code[{s}][0]", "B")
            if qdim > 1:
                c.take(f"sq8.code[{s}][1]", "B")
            c.pos = row + qdim
            if stride > qdim:
                c.take(f"sq8.code[{s}].padding", "B")
            c.pos = row + stride
    if c.pos != len(data):
        raise ValueError(f"parsed {c.pos} of {len(data)} bytes: not a file of this layout")
    return c.fields


# --------------------------------------------------------------------------------------------
# mutations


_LIMITS = {"B": (0, 0xFF), "I": (0, 0xFFFFFFFF), "Q": (0, MASK), "q": (-(1 << 63), (1 << 63) - 1)}


def _candidates(field: FieldAt, value: int | float, ints: list[int], rng: random.Random) -> list:
    if field.fmt == "f":
        return [float("nan"), float("inf"), -float("inf"), 0.0, -value, value * 1e30]
    lo, hi = _LIMITS[field.fmt]
    near = [value - 1, value + 1, value + 2, value * 2, value // 2, 0, 1, 2, hi, hi - 1, -1]
    near += [rng.choice(ints) for _ in range(3)]  # another field's value: a slot, a count, ...
    out = []
    for v in near:
        if field.fmt == "q":
            v = ((v - lo) % (hi - lo + 1)) + lo
        else:
            v %= hi + 1
        if v != value:
            out.append(v)
    return out


def mutate(data: bytes, fields: list[FieldAt], rng: random.Random, *, max_fields: int = 2) -> tuple[bytes, str]:
    """One crafted file: 1..max_fields fields of `data` set to hostile values, resealed."""
    out = bytearray(data)
    ints = [struct.unpack_from("<" + f.fmt, data, f.offset)[0] for f in rng.sample(fields, min(64, len(fields)))]
    ints = [int(v) for v in ints if isinstance(v, int)] or [0]
    what = []
    for _ in range(rng.randint(1, max_fields)):
        field = rng.choice(fields)
        (value,) = struct.unpack_from("<" + field.fmt, out, field.offset)
        new = rng.choice(_candidates(field, value, ints, rng))
        struct.pack_into("<" + field.fmt, out, field.offset, new)
        what.append(f"{field.name}: {value} -> {new}")
    return reseal(out), "; ".join(what)


def crafted(data: bytes, n: int, seed: int) -> Iterator[tuple[bytes, str]]:
    """n crafted variants of a saved file, reproducible from seed."""
    fields = parse_fields(data)
    rng = random.Random(seed)
    for _ in range(n):
        yield mutate(data, fields, rng)


# --------------------------------------------------------------------------------------------
# the files mutated: small real indexes with every structure present


def make_seed_files(folder: Path) -> list[Path]:
    """Saves a few small indexes (graph with upper levels, removals, pending rows, every
    metadata kind, texts) into folder and returns their paths. (The committed corpus also holds
    seed_hnsw_l2_sq8.kbi, an SQ8 index saved as version 2 by an earlier kbcore, and
    seed_hnsw_l2_sq8_v5.kbi, the same index as version 5: a kbcore that writes version 7 cannot
    make that file again, since version 7 adds alignment bytes to the layout.)"""
    import numpy as np

    import kbcore

    rng = np.random.default_rng(20261201)
    paths = []
    for name, kind, metric, defer in (
        ("hnsw_l2", "hnsw", "l2", False),
        ("hnsw_cos_pending", "hnsw", "cosine", True),
        ("flat_ip", "flat", "ip", False),
    ):
        n, dim = 40, 4
        vecs = rng.standard_normal((n, dim)).astype(np.float32)
        quantized = {"quantization": "sq8", "rerank": 7} if "_sq8" in name else {}
        index = kbcore.Index(dim=dim, metric=metric, kind=kind, M=2, ef_construction=8, ef=8, seed=3, **quantized)
        meta = [
            {"doc": f"d{i % 5}", "n": i % 3, "x": float(i) / 7, "ok": i % 2 == 0, "tags": ["a", "é"][: i % 3]}
            for i in range(n)
        ]
        texts = [f"word{i % 4} common text{i % 7}" if i % 3 else None for i in range(n)]
        index.add(vecs[:30], np.arange(30), metadata=meta[:30], texts=texts[:30], threads=1)
        index.remove([3, 11], threads=1)
        index.add(vecs[30:], np.arange(30, n), metadata=meta[30:], texts=texts[30:], defer_graph=defer, threads=1)
        if quantized:
            index.retrain_quantizer(threads=1)  # 40 rows are below the automatic threshold
        path = folder / f"seed_{name}.kbi"
        index.save(path)
        paths.append(path)
    return paths


def committed_old_seeds() -> list[Path]:
    """The corpus's seeds in formats this kbcore no longer writes (SQ8 as versions 2 and 5), when
    the repository's tests/data/fuzz is beside this tool; else none."""
    corpus = Path(__file__).resolve().parents[1] / "tests" / "data" / "fuzz"
    return [p for p in (corpus / "seed_hnsw_l2_sq8.kbi", corpus / "seed_hnsw_l2_sq8_v5.kbi") if p.is_file()]


# --------------------------------------------------------------------------------------------
# the child: loads files, exercises accepted ones, reports one JSON line per file


def exercise(index, path: str | Path) -> None:
    """Every operation on a loaded index; raises if one fails or the index does not save
    back to the bytes of `path`."""
    import numpy as np

    ids = index.ids()
    q = np.ones((2, index.dim), np.float32)
    index.search(q, k=5)
    if not len(ids):
        return
    index.get_vectors(ids)
    meta = index.get_metadata(ids)
    for key in sorted({k for m in meta for k in m}):
        v = next(m[key] for m in meta if key in m)
        if isinstance(v, list):
            if v:
                index.search(q, k=5, where={key: {"$in": v[:1]}})
            continue
        index.search(q, k=5, where={key: v})
        index.count({key: v})
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            index.search_groups(q, k=3, group_by=key, group_size=2)
    index.search_text("word1 common text3", k=5)
    with tempfile.TemporaryDirectory() as d:
        again = Path(d) / "again.kbi"
        index.save(again)
        original = Path(path).read_bytes()
        if 2 <= struct.unpack_from("<I", original, 8)[0] <= 5:
            # An older quantized version saves as the current one, which must then round-trip.
            import kbcore

            original = again.read_bytes()
            kbcore.Index.load(again).save(again)
        if again.read_bytes() != original:
            raise AssertionError("an accepted file does not save back to the same bytes")
    some = ids[: max(1, len(ids) // 3)]
    vecs = index.get_vectors(some)
    index.remove(some, threads=1)
    index.search(q, k=5)
    index.add(vecs, some, threads=1)
    index.build_graph(threads=1)
    index.search(q, k=5)


def first_use_of_lazy_sections(index) -> None:
    """What a loaded index checks only at a section's first use: the BM25 leg's terms and
    term lists (cpp/bm25_index.h ``load_deferred``). Vector search must answer before it (the
    rest of the file was checked at load); the first text call then raises FormatError for a
    bad leg, and again on every later call, never answering from it."""
    import numpy as np

    from kbcore import errors

    index.search(np.ones((1, index.dim), np.float32), k=5)
    try:
        index.text_stats("word1")
    except errors.FormatError:
        try:
            index.text_stats("word1")
        except errors.FormatError:
            raise
        raise AssertionError("a text leg that failed its checks answered on a second call") from None


def check_file(path: str | Path) -> dict:
    """Loads one file and exercises it if accepted: {"result": rejected | accepted |
    bad-error | failed-later, "detail": ...}. A crash ends the process."""
    import kbcore
    from kbcore import errors

    try:
        index = kbcore.Index.load(path)
    except errors.FormatError:
        return {"path": str(path), "result": "rejected"}
    except Exception as e:  # noqa: BLE001 - any other exception is the finding
        return {"path": str(path), "result": "bad-error", "detail": f"{type(e).__name__}: {e}"}
    try:
        first_use_of_lazy_sections(index)
    except errors.FormatError:
        return {"path": str(path), "result": "rejected", "detail": "at the text leg's first use"}
    except Exception as e:  # noqa: BLE001
        return {"path": str(path), "result": "failed-later", "detail": f"{type(e).__name__}: {e}"}
    try:
        exercise(index, path)
    except Exception as e:  # noqa: BLE001
        return {"path": str(path), "result": "failed-later", "detail": f"{type(e).__name__}: {e}"}
    return {"path": str(path), "result": "accepted"}


def child_main() -> None:
    for line in sys.stdin:
        print(json.dumps(check_file(line.strip())), flush=True)


_CHILD = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "import fuzz_index_load; fuzz_index_load.child_main()"
)


def regression_files(seed: bytes) -> dict[str, bytes]:
    """One crafted file per defect found so far (all must be rejected with FormatError),
    made from `seed` (the file of make_seed_files "hnsw_l2"), resealed. Names say the defect."""
    fields = {f.name: f for f in parse_fields(seed)}

    def get(name: str) -> int:
        f = fields[name]
        return struct.unpack_from("<" + f.fmt, seed, f.offset)[0]

    def set_fields(pairs: dict[str, int | float]) -> bytes:
        out = bytearray(seed)
        for name, value in pairs.items():
            f = fields[name]
            struct.pack_into("<" + f.fmt, out, f.offset, value)
        return reseal(out)

    n = get("store.slots")
    levels = [get(f"graph.level[{s}]") for s in range(n)]
    live = [get(f"store.live[{s}]") for s in range(n)]
    up = next(s for s in range(n) if levels[s] >= 1 and get(f"graph.upper[{s}][1].count") >= 1)
    flat = next(s for s in range(n) if levels[s] == 0 and live[s] and s != up)
    l0 = next(s for s in range(n) if live[s] and get(f"graph.links0[{s}].count") >= 2)
    str_entry = next(f"meta[0][{e}]" for e in range(get("meta[0].present")))
    list_str = next(k for k in fields if k.startswith("meta[") and k.endswith("][1].str_byte0"))
    bool_field = next(f for f in range(get("meta.fields")) if get(f"meta[{f}][0].kind") == 3)
    return {
        "upper_link_to_node_without_that_level": set_fields({f"graph.upper[{up}][1][0]": flat}),
        "link_to_itself": set_fields({f"graph.links0[{l0}][0]": l0}),
        "repeated_link": set_fields({f"graph.links0[{l0}][1]": get(f"graph.links0[{l0}][0]")}),
        "huge_level_count": set_fields({"graph.max_level_plus_1": 0x80000000}),
        "metadata_str_not_utf8": set_fields({f"{str_entry}.str_byte0": 0xFF}),
        "metadata_list_str_not_utf8": set_fields({list_str: 0xC3}),
        "metadata_bool_minus_one": set_fields({f"meta[{bool_field}][0].value": -1}),
        "vector_nan": set_fields({"store.vector[5][0]": float("nan")}),
        "vector_inf": set_fields({"store.vector[6][0]": float("inf")}),
        "reserved_id_minus_one": set_fields({"store.id[7]": -1}),
        "bm25_k1_inf": set_fields({"bm25.k1": float("inf")}),
        "bm25_rows_out_of_order": set_fields({"bm25.doc[0].slot": get("bm25.doc[1].slot") + 1}),
        "bm25_term_not_utf8": set_fields({"bm25.term[0].byte0": 0xFF}),
    }


def regression_files_sq8(seed: bytes) -> dict[str, bytes]:
    """Crafted SQ8-section files (all must be rejected with FormatError), made from `seed`
    (the file of make_seed_files "hnsw_l2_sq8"), resealed. Names say the defect."""
    fields = {f.name: f for f in parse_fields(seed)}

    def set_fields(pairs: dict[str, int | float]) -> bytes:
        out = bytearray(seed)
        for name, value in pairs.items():
            f = fields[name]
            struct.pack_into("<" + f.fmt, out, f.offset, value)
        return reseal(out)

    slots = struct.unpack_from("<Q", seed, fields["sq8.slots"].offset)[0]
    return {
        "sq8_code_padding_nonzero": set_fields({"sq8.code[2].padding": 1}),
        "sq8_scale_negative": set_fields({"sq8.scale[1]": -1.0}),
        "sq8_fewer_codes_than_rows": set_fields({"sq8.slots": slots - 1}),
        "sq8_unknown_quantization": set_fields({"sq8.quantization": 2}),
    }


def regression_files_tagged(seed: bytes) -> dict[str, bytes]:
    """Crafted code-tag files (rejected with FormatError), made from `seed` (the file of
    make_seed_files "hnsw_l2_sq8_v5"), resealed. Names say the defect."""
    fields = {f.name: f for f in parse_fields(seed)}
    out = bytearray(seed)
    struct.pack_into("<B", out, fields["tag.name_byte0"].offset, ord("x"))  # "sq8" -> "xq8"
    return {"unknown_code_type": reseal(out)}


def run_files(paths: list[Path], *, timeout: float = 600.0) -> dict[Path, dict]:
    """Loads every file in a child process (restarted after a crash); the result of each."""
    results: dict[Path, dict] = {}
    todo = list(paths)
    while todo:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input="\n".join(map(str, todo)) + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            results[Path(rec["path"])] = rec
        done = sum(1 for p in todo if p in results)
        if done == len(todo):
            break
        crashed = todo[done]  # the first file without an answer killed the child
        results[crashed] = {
            "path": str(crashed),
            "result": "crash",
            "detail": f"exit {proc.returncode}: {proc.stderr[-500:]}",
        }
        todo = todo[done + 1 :]
    return results


def sweep(seed_files: list[Path], files: int, seed: int, work: Path) -> tuple[dict[str, int], list[dict]]:
    """Crafts `files` files (spread over seed_files) and loads them; counts per result and
    the findings (every result other than rejected or accepted)."""
    crafted_paths: list[Path] = []
    what: dict[Path, str] = {}
    per = max(1, files // len(seed_files))
    for i, src in enumerate(seed_files):
        for j, (blob, desc) in enumerate(crafted(src.read_bytes(), per, seed * 1000 + i)):
            p = work / f"{src.stem}_{seed}_{j}.kbi"
            p.write_bytes(blob)
            crafted_paths.append(p)
            what[p] = desc
    results = run_files(crafted_paths)
    counts: dict[str, int] = {}
    findings = []
    for p in crafted_paths:
        rec = results[p]
        counts[rec["result"]] = counts.get(rec["result"], 0) + 1
        if rec["result"] not in ("rejected", "accepted"):
            findings.append({**rec, "mutation": what[p]})
    return counts, findings


def atheris_main(argv: list[str]) -> None:
    """Coverage-guided fuzzing with atheris: each input picks a seed file, fields and values.
    libFuzzer options go after ``--`` (``-runs=N -seed=S`` for a bounded run). A crash, or a
    crafted file that is accepted and then fails, stops the run with the input saved."""
    import atheris

    with atheris.instrument_imports():
        import kbcore  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="kbcore-atheris-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # atheris.Fuzz() ends the process
    seeds = [p.read_bytes() for p in make_seed_files(work) + committed_old_seeds()]
    parsed = [parse_fields(s) for s in seeds]
    target = work / "input.kbi"

    def one_input(raw: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(raw)
        i = fdp.ConsumeIntInRange(0, len(seeds) - 1)
        out = bytearray(seeds[i])
        fields = parsed[i]
        for _ in range(fdp.ConsumeIntInRange(1, 3)):
            field = fields[fdp.ConsumeIntInRange(0, len(fields) - 1)]
            if field.fmt == "f":  # any float32 bit pattern (a Python float may not fit in one)
                (new,) = struct.unpack("<f", fdp.ConsumeBytes(4).ljust(4, b"\0"))
            else:
                lo, hi = _LIMITS[field.fmt]
                if fdp.ConsumeBool():  # near the old value: off-by-one counts and slots
                    (old,) = struct.unpack_from("<" + field.fmt, out, field.offset)
                    new = min(max(old + fdp.ConsumeIntInRange(-3, 3), lo), hi)
                else:
                    new = fdp.ConsumeIntInRange(lo, hi)
            struct.pack_into("<" + field.fmt, out, field.offset, new)
        target.write_bytes(reseal(out))
        rec = check_file(target)
        if rec["result"] not in ("rejected", "accepted"):
            raise AssertionError(f"{rec['result']}: {rec.get('detail', '')}")

    atheris.Setup([sys.argv[0], *argv], one_input)
    atheris.Fuzz()


def main() -> int:
    if "--atheris" in sys.argv:
        rest = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
        atheris_main(rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=int(os.environ.get("KBCORE_FUZZ_FILES", "3000")))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save-findings", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        seeds = make_seed_files(work) + committed_old_seeds()
        counts, findings = sweep(seeds, args.files, args.seed, work)
        print(json.dumps(counts, sort_keys=True))
        for f in findings[:50]:
            print(f"{f['result']}: {f['mutation']} :: {f.get('detail', '')[:300]}")
        if args.save_findings is not None:
            args.save_findings.mkdir(parents=True, exist_ok=True)
            for f in findings:
                src = Path(f["path"])
                (args.save_findings / src.name).write_bytes(src.read_bytes())
                (args.save_findings / (src.stem + ".txt")).write_text(f["mutation"] + "\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
