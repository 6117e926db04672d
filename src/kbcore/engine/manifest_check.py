"""The structure of a knowledge base's manifest, checked field by field before it is trusted.

:func:`validate_manifest` is what :func:`kbcore.engine.storage.load_manifest` runs once the magic,
version and checksum have passed: every field the engine reads, with its type, its range and
its consistency with the others, so that a crafted or damaged manifest raises
:class:`~kbcore.errors.FormatError` naming the field instead of failing later. The metric,
index-kind, M and ef rules are the index's own (:mod:`kbcore.index`): a configuration the
index file cannot hold is refused here too.
"""

from __future__ import annotations

import errno
import math
import os
import re
from typing import Any

from ..chunking import CHUNK_UNITS, MAX_SEPARATOR_CHARS, MAX_SEPARATORS
from ..errors import FormatError
from ..fusion import FUSIONS, SEARCH_TYPES
from ..index import DIM_RANGE, EF_RANGE, KINDS, M_RANGE, METRICS, QUANTIZATIONS, RABITQ_BITS, VECTORS
from ..rerankers.http import API_FORMATS

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "validate_manifest"]

FORMAT_NAME = "kbcore-knowledge-base"
FORMAT_VERSION = 1

_INT_MAX = (1 << 63) - 1
_MAX_ROWS = 1 << 40  # chunks or documents in one segment
_MAX_FILE_BYTES = 1 << 50
_MAX_KNOB = (1 << 31) - 1  # chunk sizes
_SEG_NAME = re.compile(r"^seg-(\d{1,18})$")
_INDEX_NAME = re.compile(r"^index-(\d{1,18})\.kbi$")
_PIPELINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MISSING = object()


class _Check:
    """Raises FormatError naming the manifest field that is wrong."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, problem: str) -> FormatError:
        return FormatError(errno.EIO, f"{self.where} is invalid: field {field!r} {problem}")

    def get(self, obj: dict[str, Any], key: str, field: str, *, optional: bool = False) -> Any:
        value = obj.get(key, _MISSING)
        if value is _MISSING and not optional:
            raise self.fail(field, "is missing")
        return value

    def dict_(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"must be an object, got {_kind(value)}")
        return value

    def int_(self, value: Any, field: str, lo: int = 0, hi: int = _INT_MAX) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            raise self.fail(field, f"must be in [{lo}, {hi}], got {value}")
        return value

    def num(self, value: Any, field: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(field, f"must be a number, got {_kind(value)}")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise self.fail(field, f"must be a finite number in [{lo}, {hi}], got {value!r}")
        return float(value)

    def str_(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, got {_kind(value)}")
        return value

    def choice(self, value: Any, field: str, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.fail(field, f"must be one of {choices}, got {value!r}")
        return value

    def entry(self, value: Any, field: str, expect: str | re.Pattern[str]) -> dict[str, Any]:
        e = self.dict_(value, field)
        p = self.str_(self.get(e, "path", f"{field}.path"), f"{field}.path")
        ok = p == expect if isinstance(expect, str) else expect.match(p) is not None
        if not ok or os.path.basename(p) != p or p in (".", ".."):
            want = expect if isinstance(expect, str) else expect.pattern
            raise self.fail(f"{field}.path", f"must name a file of the knowledge base ({want!r}), got {p!r}")
        self.int_(self.get(e, "bytes", f"{field}.bytes"), f"{field}.bytes", 0, _MAX_FILE_BYTES)
        self.int_(self.get(e, "crc32", f"{field}.crc32"), f"{field}.crc32", 0, 0xFFFFFFFF)
        return e


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _chunking(c: _Check, obj: Any, field: str) -> None:
    d = c.dict_(obj, field)
    size = c.int_(c.get(d, "chunk_size", f"{field}.chunk_size"), f"{field}.chunk_size", 1, _MAX_KNOB)
    c.int_(c.get(d, "chunk_overlap", f"{field}.chunk_overlap"), f"{field}.chunk_overlap", 0, size - 1)
    unit = c.get(d, "chunk_unit", f"{field}.chunk_unit", optional=True)  # absent: "chars" (older manifests)
    if unit is not _MISSING:
        c.choice(unit, f"{field}.chunk_unit", CHUNK_UNITS)
    seps = c.get(d, "separators", f"{field}.separators", optional=True)  # absent: none
    if seps is not _MISSING:
        if not isinstance(seps, list) or len(seps) > MAX_SEPARATORS:
            raise c.fail(f"{field}.separators", f"must be a list of at most {MAX_SEPARATORS} strings")
        for i, sep in enumerate(seps):
            if not isinstance(sep, str) or not 1 <= len(sep) <= MAX_SEPARATOR_CHARS:
                raise c.fail(f"{field}.separators[{i}]", f"must be a string of 1 to {MAX_SEPARATOR_CHARS} characters")
        if len(set(seps)) != len(seps):
            raise c.fail(f"{field}.separators", "must be distinct")


def validate_manifest(m: Any, where: str = "manifest") -> dict[str, Any]:
    """Checks a manifest's structure; returns it or raises FormatError naming the field.

    Types and ranges of every field the engine reads, and their consistency: file entries name
    this segment's (or index's) own files, never a path outside the directory; segment and
    index generations are at most the manifest's; the stored rows fit below ``next_id``;
    deleted-document indexes are sorted, distinct and within the segment. Id ranges of the
    segments are checked against the data by :func:`kbcore.engine.storage.read_segments`. Unknown
    extra fields are accepted (written by a newer kbcore of the same format version).
    """
    c = _Check(where)
    c.dict_(m, "(top level)")
    if m.get("format") != FORMAT_NAME:
        raise c.fail("format", f"must be {FORMAT_NAME!r}, got {m.get('format')!r}")
    c.int_(c.get(m, "version", "version"), "version", 1, FORMAT_VERSION)
    c.int_(c.get(m, "checksum", "checksum"), "checksum", 0, 0xFFFFFFFF)
    gen = c.int_(c.get(m, "generation", "generation"), "generation", 1)
    c.str_(c.get(m, "name", "name"), "name")
    v = c.get(m, "created_at", "created_at", optional=True)
    if v is not _MISSING and v is not None:
        c.num(v, "created_at")
    dim = _config(c, c.dict_(c.get(m, "config", "config"), "config"))
    emb = c.get(m, "embedder", "embedder", optional=True)
    if emb is not _MISSING and emb is not None:
        _embedder(c, emb, dim)
    rr = c.get(m, "reranker", "reranker", optional=True)
    if rr is not _MISSING and rr is not None:
        _reranker(c, rr)
    _pipelines(c, c.dict_(c.get(m, "pipelines", "pipelines"), "pipelines"))
    next_id = c.int_(c.get(m, "next_id", "next_id"), "next_id")
    c.int_(c.get(m, "next_group", "next_group"), "next_group")
    segs = c.get(m, "segments", "segments")
    if not isinstance(segs, list):
        raise c.fail("segments", f"must be a list, got {_kind(segs)}")
    seen: set[str] = set()
    total = sum(_segment(c, seg, f"segments[{i}]", gen, seen) for i, seg in enumerate(segs))
    if total > next_id:
        raise c.fail("next_id", f"is {next_id}, below the {total} chunks the segments hold")
    if total and dim is None:
        raise c.fail("config.dim", "is null although the segments hold chunks")
    idx = c.get(m, "index", "index", optional=True)
    if idx is not _MISSING and idx is not None:
        _index_entry(c, idx, gen, next_id, dim)
    return m


def _config(c: _Check, cfg: dict[str, Any]) -> int | None:
    """The ``config`` object; returns its ``dim`` (None before the first vector)."""
    c.choice(c.get(cfg, "metric", "config.metric"), "config.metric", METRICS)
    kind = c.choice(c.get(cfg, "index", "config.index"), "config.index", KINDS)
    q = c.get(cfg, "quantization", "config.quantization", optional=True)
    if q is not _MISSING and q is not None:
        c.choice(q, "config.quantization", QUANTIZATIONS)
        if kind != "hnsw":
            raise c.fail("config.quantization", f"is {q!r}, but quantization needs an hnsw index, not {kind!r}")
    vectors = c.get(cfg, "vectors", "config.vectors", optional=True)
    if vectors is not _MISSING and vectors is not None:
        c.choice(vectors, "config.vectors", VECTORS)
        if vectors == "disk" and (q is _MISSING or q is None):
            raise c.fail("config.vectors", "is 'disk', but disk-resident rows need quantization 'sq8' or 'rabitq'")
    rerank = c.get(cfg, "rerank", "config.rerank", optional=True)
    if rerank is not _MISSING and rerank is not None:
        c.int_(rerank, "config.rerank", *EF_RANGE)
        if q is _MISSING or q is None:
            raise c.fail("config.rerank", "is set, but rerank needs quantization 'sq8' or 'rabitq'")
    bits = c.get(cfg, "bits", "config.bits", optional=True)
    if bits is not _MISSING and bits is not None:
        c.int_(bits, "config.bits", *RABITQ_BITS)
        if q != "rabitq":
            raise c.fail("config.bits", f"is {bits!r}, but bits needs quantization 'rabitq', not {q!r}")
    c.int_(c.get(cfg, "M", "config.M"), "config.M", *M_RANGE)
    c.int_(c.get(cfg, "ef_construction", "config.ef_construction"), "config.ef_construction", *EF_RANGE)
    c.int_(c.get(cfg, "ef", "config.ef"), "config.ef", *EF_RANGE)
    shards = c.get(cfg, "shards", "config.shards", optional=True)
    if shards is not _MISSING and shards is not None:
        c.int_(shards, "config.shards", 1)  # the upper bound when the shards open (engine.shards)
    dim = c.get(cfg, "dim", "config.dim", optional=True)
    dim = None if dim is _MISSING else dim
    if dim is not None:
        c.int_(dim, "config.dim", *DIM_RANGE)
    _chunking(c, cfg, "config")
    for key, choices in (("search_type", SEARCH_TYPES), ("fusion", FUSIONS)):
        v = c.get(cfg, key, f"config.{key}", optional=True)
        if v is not _MISSING:
            c.choice(v, f"config.{key}", choices)
    v = c.get(cfg, "vector_weight", "config.vector_weight", optional=True)
    if v is not _MISSING:
        c.num(v, "config.vector_weight", 0.0, 1.0)
    _chunking_mode(c, cfg)
    return dim


#: A knowledge base's chunking modes (absent: ``"chunk"``, as before parent-child existed).
INDEX_TYPES = ("chunk", "parent_child")


def _chunking_mode(c: _Check, cfg: dict[str, Any]) -> None:
    """``index_type``, ``parent_chunk_size`` (parent-child only, above ``chunk_size``, the
    children's size) and ``context_window`` (the default of retrieve)."""
    v = c.get(cfg, "context_window", "config.context_window", optional=True)
    if v is not _MISSING:
        c.int_(v, "config.context_window", 0, _MAX_KNOB)
    kind = c.get(cfg, "index_type", "config.index_type", optional=True)
    kind = "chunk" if kind is _MISSING else c.choice(kind, "config.index_type", INDEX_TYPES)
    parent = c.get(cfg, "parent_chunk_size", "config.parent_chunk_size", optional=True)
    if kind == "chunk":
        if parent is not _MISSING:
            raise c.fail("config.parent_chunk_size", "is set, but index_type is 'chunk' (parent_child only)")
        return
    if parent is _MISSING:
        raise c.fail("config.parent_chunk_size", "is missing (index_type 'parent_child' needs it)")
    child = cfg["chunk_size"]
    c.int_(parent, "config.parent_chunk_size", child + 1, _MAX_KNOB)
    if cfg.get("shards") is not None:
        raise c.fail("config.index_type", "is 'parent_child', which a sharded knowledge base does not support")


def _pipelines(c: _Check, pipes: dict[str, Any]) -> None:
    if "default" not in pipes:
        raise c.fail("pipelines", "has no 'default' pipeline")
    for name, p in pipes.items():
        if not _PIPELINE_NAME.match(name):
            raise c.fail("pipelines", f"has an invalid pipeline name {name!r}")
        _chunking(c, p, f"pipelines.{name}")
        steps = c.get(p, "steps", f"pipelines.{name}.steps", optional=True)
        if steps is not _MISSING:
            _steps(c, steps, f"pipelines.{name}.steps")


def _steps(c: _Check, steps: Any, field: str) -> None:
    """A pipeline's ``steps``: 1-10 of {"name", "intermediate"}, names unique, "parse" only
    first, "chunk" exactly once and before every user step."""
    if not isinstance(steps, list) or not 1 <= len(steps) <= 10:
        raise c.fail(field, f"must be a list of 1 to 10 steps, got {steps!r:.80}")
    seen: list[str] = []
    for i, step in enumerate(steps):
        f = f"{field}[{i}]"
        c.dict_(step, f)
        name = c.str_(c.get(step, "name", f"{f}.name"), f"{f}.name")
        if not _PIPELINE_NAME.match(name) or name in seen:
            raise c.fail(f"{f}.name", f"must be a valid, unique step name, got {name!r}")
        if not isinstance(c.get(step, "intermediate", f"{f}.intermediate"), bool):
            raise c.fail(f"{f}.intermediate", "must be true or false")
        if (name == "parse" and i != 0) or (name not in ("parse", "chunk") and "chunk" not in seen):
            raise c.fail(f"{f}.name", f"is {name!r} out of order (parse first, user steps after chunk)")
        seen.append(name)
    if "chunk" not in seen:
        raise c.fail(field, "has no 'chunk' step")


def _segment(c: _Check, seg: Any, f: str, gen: int, seen: set[str]) -> int:
    """One entry of ``segments`` (``f`` names it); returns its row count."""
    c.dict_(seg, f)
    name = c.str_(c.get(seg, "name", f"{f}.name"), f"{f}.name")
    mm = _SEG_NAME.match(name)
    if mm is None:
        raise c.fail(f"{f}.name", f"must be 'seg-<generation>', got {name!r}")
    if int(mm.group(1)) > gen:
        raise c.fail(f"{f}.name", f"names generation {int(mm.group(1))}, after the manifest's {gen}")
    if name in seen:
        raise c.fail(f"{f}.name", f"repeats segment {name!r}")
    seen.add(name)
    rows = c.int_(c.get(seg, "rows", f"{f}.rows"), f"{f}.rows", 0, _MAX_ROWS)
    ndocs = c.int_(c.get(seg, "docs", f"{f}.docs"), f"{f}.docs", 0, _MAX_ROWS)
    deleted = c.get(seg, "deleted_docs", f"{f}.deleted_docs", optional=True)
    if deleted is not _MISSING:
        if not isinstance(deleted, list):
            raise c.fail(f"{f}.deleted_docs", f"must be a list, got {_kind(deleted)}")
        prev = -1
        for j, d in enumerate(deleted):
            c.int_(d, f"{f}.deleted_docs[{j}]", 0, max(ndocs - 1, 0))
            if d >= ndocs:
                raise c.fail(f"{f}.deleted_docs[{j}]", f"is {d}, the segment has {ndocs} documents")
            if d <= prev:
                raise c.fail(f"{f}.deleted_docs", "must be sorted and without repeats")
            prev = d
    files = c.dict_(c.get(seg, "files", f"{f}.files"), f"{f}.files")
    c.entry(c.get(files, "chunks", f"{f}.files.chunks"), f"{f}.files.chunks", f"{name}.chunks.arrow")
    c.entry(c.get(files, "docs", f"{f}.files.docs"), f"{f}.files.docs", f"{name}.docs.arrow")
    vec = c.get(files, "vectors", f"{f}.files.vectors", optional=True)
    if vec is not _MISSING and vec is not None:
        c.entry(vec, f"{f}.files.vectors", f"{name}.vectors.npy")
    return rows


def _index_entry(c: _Check, idx: Any, gen: int, next_id: int, dim: int | None) -> None:
    c.entry(idx, "index", _INDEX_NAME)
    ig = int(_INDEX_NAME.match(idx["path"]).group(1))  # type: ignore[union-attr]
    if ig > gen:
        raise c.fail("index.path", f"names generation {ig}, after the manifest's {gen}")
    r = c.get(idx, "rows", "index.rows", optional=True)
    if r is not _MISSING:
        c.int_(r, "index.rows", 0, next_id)
    if dim is None:
        raise c.fail("config.dim", "is null although there is an index checkpoint")


def _embedder(c: _Check, emb: Any, dim: int | None) -> None:
    e = c.dict_(emb, "embedder")
    kind = c.get(e, "kind", "embedder.kind", optional=True)
    if kind is not _MISSING:
        c.str_(kind, "embedder.kind")
    if kind == "none":
        return
    edim = c.get(e, "dim", "embedder.dim", optional=kind != "hashing")
    if edim is not _MISSING:
        c.int_(edim, "embedder.dim", *DIM_RANGE)
        if dim is not None and edim != dim:
            raise c.fail("embedder.dim", f"is {edim}, config.dim is {dim}")
    if kind == "hashing":
        ng = c.get(e, "char_ngrams", "embedder.char_ngrams", optional=True)
        if ng is not _MISSING:
            if not isinstance(ng, list) or len(ng) != 2:
                raise c.fail("embedder.char_ngrams", f"must be [lo, hi], got {ng!r}")
            lo = c.int_(ng[0], "embedder.char_ngrams[0]", 1, 16)
            c.int_(ng[1], "embedder.char_ngrams[1]", lo, 16)
        weights = []
        for key in ("word_weight", "char_weight"):
            w = c.get(e, key, f"embedder.{key}", optional=True)
            weights.append(1.0 if w is _MISSING else c.num(w, f"embedder.{key}", 0.0, 1e30))
        if not any(weights):
            raise c.fail("embedder", "has word_weight and char_weight both 0")
        s = c.get(e, "seed", "embedder.seed", optional=True)
        if s is not _MISSING:
            c.int_(s, "embedder.seed", -_INT_MAX, _INT_MAX)
    elif kind == "sentence-transformers":
        c.str_(c.get(e, "model", "embedder.model"), "embedder.model")
        n = c.get(e, "normalize", "embedder.normalize", optional=True)
        if n is not _MISSING and not isinstance(n, bool):
            raise c.fail("embedder.normalize", f"must be true or false, got {n!r}")


def _reranker(c: _Check, rr: Any) -> None:
    """The default reranker's spec (optional; manifests before rerankers have none). Kinds
    other than ``http`` / ``cross-encoder`` are only checked for a ``kind`` (a registered
    kind, or ``custom``, says what it needs when it is rebuilt)."""
    r = c.dict_(rr, "reranker")
    kind = c.str_(c.get(r, "kind", "reranker.kind"), "reranker.kind")
    if not kind:
        raise c.fail("reranker.kind", "is empty")
    if kind == "http":
        c.choice(c.get(r, "api_format", "reranker.api_format"), "reranker.api_format", API_FORMATS)
        for key in ("model", "base_url", "api_key_env"):
            v = c.get(r, key, f"reranker.{key}", optional=True)
            if v is not _MISSING and v is not None:
                c.str_(v, f"reranker.{key}")
    elif kind == "cross-encoder":
        c.str_(c.get(r, "model", "reranker.model"), "reranker.model")
    for key in ("batch_size", "max_retries", "max_length"):
        v = c.get(r, key, f"reranker.{key}", optional=True)
        if v is not _MISSING and v is not None:
            c.int_(v, f"reranker.{key}", 0 if key == "max_retries" else 1, _MAX_KNOB)
    for key in ("timeout", "deadline"):
        v = c.get(r, key, f"reranker.{key}", optional=True)
        if v is not _MISSING and v is not None:
            c.num(v, f"reranker.{key}", 1e-6, 1e9)
