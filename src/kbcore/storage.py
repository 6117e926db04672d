"""On-disk layout of a knowledge base, and the file primitives that make it crash-safe.

A knowledge base is a directory::

    <name>/
      manifest.json                 the only mutable file: replaced atomically (write, fsync, rename)
      .lock                         fcntl lock serialising writers across processes
      .read.lock                    fcntl lock: shared while a reader loads, exclusive while a
                                    writer deletes superseded files
      seg-<n>.chunks.arrow          Arrow IPC: one row per chunk (id, text, span, metadata columns)
      seg-<n>.docs.arrow            Arrow IPC: one row per document of the segment
      seg-<n>.vectors.npy           float32 [rows, dim]; dropped once an index checkpoint covers it
      index-<generation>.kbi        the native index (kbcore.Index.save), a checkpoint

Files other than the manifest are immutable once written and fsynced, and are named after the
manifest generation that introduced them, so a new state never overwrites a file the current
manifest references. A mutation writes its new files, fsyncs them, then replaces the manifest
(temp file, fsync, ``rename``, fsync of the directory): a crash at any point leaves either the
old or the new manifest, both of which reference only complete files. Files that no manifest
references (left by a crash, or superseded) are deleted by the next writer, but only while no
reader is loading (:func:`reading`, :func:`remove_unreferenced`): a reader that read a manifest
finds every file it names, whatever a writer in another process commits meanwhile.

The manifest records each file's size and CRC-32, and its own CRC-32 over its JSON body; a
mismatch raises :class:`~kbcore.errors.FormatError`. Behind the checksums, every load checks
structure: the manifest's fields (:func:`validate_manifest`) and each segment's Arrow data,
columns, row counts and id ranges (:func:`read_segments`), so a crafted or damaged directory
raises FormatError rather than crashing the reader. Write and rename failures (ENOSPC, EIO)
raise :class:`~kbcore.errors.StorageError` before the commit point, leaving the previous
manifest committed.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import uuid
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .errors import FormatError, StorageError

__all__ = [
    "MANIFEST",
    "LOCK",
    "READ_LOCK",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "fsync_dir",
    "atomic_write_bytes",
    "write_arrow",
    "read_arrow",
    "read_segments",
    "write_npy",
    "read_npy",
    "file_entry",
    "check_entry",
    "validate_manifest",
    "load_manifest",
    "save_manifest",
    "FileLock",
    "reading",
    "remove_unreferenced",
]

MANIFEST = "manifest.json"
LOCK = ".lock"
READ_LOCK = ".read.lock"
FORMAT_NAME = "kbcore-knowledge-base"
FORMAT_VERSION = 1
_CHUNK = 1 << 22

#: File names a knowledge base directory may hold besides the manifest and the locks.
_OWNED = re.compile(
    r"^((seg-\d+\.(chunks|docs)\.arrow|seg-\d+\.vectors\.npy|index-\d+\.kbi)(\.tmp.*)?"
    r"|manifest\.json\.tmp.+)$"
)


def _storage_error(what: str, path: str, exc: OSError) -> StorageError:
    return StorageError(exc.errno or errno.EIO, f"{what} {path!r} failed: {exc.strerror or exc}")


# -- file primitives ---------------------------------------------------------------------------
# Every byte a commit writes goes through os.open / os.write / os.fsync / os.close / os.replace
# (and the native Index.save), so a test can inject ENOSPC or EIO at any one of those calls.


def _close_quietly(fd: int) -> None:
    """Closes a descriptor whose close cannot lose data (read-only, a lock, or after an error)."""
    try:
        os.close(fd)
    except OSError:
        pass


def fsync_dir(path: str, *, strict: bool = True) -> None:
    """Makes a directory's entries (creations, renames) durable.

    Raises :class:`~kbcore.errors.StorageError` if the operating system reports an I/O error
    (``strict=False`` turns that into a ``RuntimeWarning``: used once a rename has already made
    a commit visible, when failing would misreport it). File systems that cannot fsync a
    directory (EINVAL, ENOTSUP) are accepted silently.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EISDIR):
            return  # platforms without directory fds
        if strict:
            raise _storage_error("opening the directory", path, exc) from exc
        warnings.warn(f"cannot fsync directory {path!r}: {exc}", RuntimeWarning, stacklevel=2)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            if strict:
                raise _storage_error("syncing the directory", path, exc) from exc
            warnings.warn(f"cannot fsync directory {path!r}: {exc}", RuntimeWarning, stacklevel=2)
    finally:
        _close_quietly(fd)


def _write_file(path: str, data: Any, *, exclusive: bool = False) -> None:
    """Writes ``data`` (bytes-like) to ``path`` and fsyncs it; OSError -> StorageError."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    flags |= getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise _storage_error("creating", path, exc) from exc
    try:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            n = os.write(fd, view[done : done + _CHUNK])
            if n <= 0:  # pragma: no cover - a file system that accepts nothing without errno
                raise OSError(errno.EIO, "write returned 0")
            done += n
        os.fsync(fd)
    except OSError as exc:
        _close_quietly(fd)
        raise _storage_error("writing", path, exc) from exc
    try:
        os.close(fd)
    except OSError as exc:  # NFS and friends report deferred write errors at close
        raise _storage_error("writing", path, exc) from exc


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing") from None
    except IsADirectoryError:
        raise FormatError(errno.EISDIR, f"knowledge base file {path!r} is a directory") from None
    except OSError as exc:
        raise _storage_error("reading", path, exc) from exc


def _crc_file(path: str) -> tuple[int, int]:
    # One reused buffer: a fresh 4 MiB bytes object per block costs page faults for each.
    crc = 0
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, crc


def file_entry(dirpath: str, name: str) -> dict[str, Any]:
    """``{"path", "bytes", "crc32"}`` of a file already written in ``dirpath``."""
    path = os.path.join(dirpath, name)
    try:
        size, crc = _crc_file(path)
    except OSError as exc:
        raise _storage_error("reading", path, exc) from exc
    return {"path": name, "bytes": size, "crc32": crc}


def check_entry(dirpath: str, entry: dict[str, Any], buf: Any = None) -> None:
    """Raises FormatError if the file is missing, of another size or another CRC-32."""
    path = os.path.join(dirpath, entry["path"])
    if buf is None:
        if not os.path.isfile(path):
            raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing")
        try:
            size, crc = _crc_file(path)
        except OSError as exc:
            raise _storage_error("reading", path, exc) from exc
    else:
        mv = memoryview(buf)
        size = mv.nbytes
        crc = zlib.crc32(mv)
    if size != entry["bytes"] or crc != entry["crc32"]:
        raise FormatError(
            errno.EIO,
            f"knowledge base file {path!r} is corrupted: {size} bytes / crc32 {crc:#010x}, "
            f"the manifest says {entry['bytes']} bytes / crc32 {entry['crc32']:#010x}",
        )


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically and durably (temp file, fsync, rename, fsync dir).

    Raises :class:`~kbcore.errors.StorageError` (errno kept: ENOSPC, EIO, ...) when the file
    could not be written or renamed; ``path`` is then untouched. Once the rename succeeded the
    new content is what every reader sees, so a failing directory fsync after it only warns.
    """
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f"{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        _write_file(tmp, data, exclusive=True)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise _storage_error("renaming into", path, exc) from exc
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d, strict=False)


def write_arrow(dirpath: str, name: str, table: Any) -> dict[str, Any]:
    """Writes a pyarrow Table as an Arrow IPC file, fsynced; returns its manifest entry."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    buf = sink.getvalue()
    _write_file(os.path.join(dirpath, name), buf)
    return {"path": name, "bytes": buf.size, "crc32": zlib.crc32(memoryview(buf))}


def read_arrow(dirpath: str, entry: dict[str, Any], *, verify: bool = True) -> Any:
    """Reads an Arrow IPC file into memory, checks its size and CRC-32, then its structure
    (``Table.validate(full=True)``: offsets, lengths, UTF-8) and returns the Table.

    The file is read, not memory-mapped: a mapping turns a file truncated or rewritten by
    someone else into SIGBUS at the first touch of a lost page, and a validated copy cannot
    change under the reader. Raises FormatError (missing, corrupted, not Arrow, invalid).
    """
    import pyarrow as pa

    path = os.path.join(dirpath, entry["path"])
    data = _read_file(path)
    if verify:
        check_entry(dirpath, entry, data)
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        table.validate(full=True)
    except (
        pa.ArrowException,
        OSError,
        ValueError,
        TypeError,
        IndexError,
        OverflowError,
        MemoryError,
    ) as exc:  # pyarrow reports a bad footer or message as a plain OSError
        raise FormatError(errno.EIO, f"knowledge base file {path!r} is not valid Arrow: {exc}") from None
    return table


def write_npy(dirpath: str, name: str, arr: np.ndarray) -> dict[str, Any]:
    """Writes a numpy array as .npy, fsynced; returns its manifest entry."""
    import io

    bio = io.BytesIO()
    np.save(bio, np.ascontiguousarray(arr), allow_pickle=False)
    data = bio.getbuffer()
    _write_file(os.path.join(dirpath, name), data)
    return {"path": name, "bytes": data.nbytes, "crc32": zlib.crc32(data)}


def read_npy(dirpath: str, entry: dict[str, Any], *, rows: int | None = None, dim: int | None = None) -> np.ndarray:
    """Reads a .npy file written by :func:`write_npy` after checking size and CRC-32; with
    ``rows`` / ``dim``, also that it is a finite float32 matrix of that shape. Raises
    FormatError."""
    import io

    path = os.path.join(dirpath, entry["path"])
    data = _read_file(path)
    check_entry(dirpath, entry, data)
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy's header parser raises SyntaxError, TokenError, ...
        raise FormatError(
            errno.EIO, f"knowledge base file {path!r} is not a valid .npy: {type(exc).__name__}: {exc}"
        ) from None
    if rows is not None or dim is not None:
        want = (
            rows if rows is not None else arr.shape[0] if arr.ndim == 2 else -1,
            dim if dim is not None else arr.shape[1] if arr.ndim == 2 else -1,
        )
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.shape != want:
            raise FormatError(
                errno.EIO,
                f"knowledge base file {path!r} holds {getattr(arr, 'dtype', '?')} "
                f"{getattr(arr, 'shape', '?')}, expected float32 {want}",
            )
        if not np.isfinite(arr).all():
            raise FormatError(errno.EIO, f"knowledge base file {path!r} holds NaN or infinite values")
    return arr


# -- manifest ----------------------------------------------------------------------------------

_INT_MAX = (1 << 63) - 1
_MAX_ROWS = 1 << 40  # chunks or documents in one segment
_MAX_FILE_BYTES = 1 << 50
_MAX_DIM = 65536  # as the native index
_MAX_KNOB = (1 << 31) - 1  # ef, ef_construction, chunk sizes
_METRICS = ("cosine", "ip", "l2")
_KINDS = ("hnsw", "flat")
# Copies of the engine's choices (the engine imports this module, not the other way round).
_SEARCH_TYPES = ("vector", "full_text", "hybrid")
_FUSIONS = ("rrf", "linear")
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


def validate_manifest(m: Any, where: str = "manifest") -> dict[str, Any]:
    """Checks a manifest's structure; returns it or raises FormatError naming the field.

    Types and ranges of every field the engine reads, and their consistency: file entries name
    this segment's (or index's) own files, never a path outside the directory; segment and
    index generations are at most the manifest's; the stored rows fit below ``next_id``;
    deleted-document indexes are sorted, distinct and within the segment. Id ranges of the
    segments are checked against the data by :func:`read_segments`. Unknown extra fields are
    accepted (written by a newer kbcore of the same format version).
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

    cfg = c.dict_(c.get(m, "config", "config"), "config")
    c.choice(c.get(cfg, "metric", "config.metric"), "config.metric", _METRICS)
    c.choice(c.get(cfg, "index", "config.index"), "config.index", _KINDS)
    c.int_(c.get(cfg, "M", "config.M"), "config.M", 2, 256)
    c.int_(c.get(cfg, "ef_construction", "config.ef_construction"), "config.ef_construction", 1, _MAX_KNOB)
    c.int_(c.get(cfg, "ef", "config.ef"), "config.ef", 1, _MAX_KNOB)
    dim = c.get(cfg, "dim", "config.dim", optional=True)
    dim = None if dim is _MISSING else dim
    if dim is not None:
        c.int_(dim, "config.dim", 1, _MAX_DIM)
    _chunking(c, cfg, "config")
    for key, choices in (("search_type", _SEARCH_TYPES), ("fusion", _FUSIONS)):
        v = c.get(cfg, key, f"config.{key}", optional=True)
        if v is not _MISSING:
            c.choice(v, f"config.{key}", choices)
    v = c.get(cfg, "vector_weight", "config.vector_weight", optional=True)
    if v is not _MISSING:
        c.num(v, "config.vector_weight", 0.0, 1.0)

    emb = c.get(m, "embedder", "embedder", optional=True)
    if emb is not _MISSING and emb is not None:
        _embedder(c, emb, dim)

    pipes = c.dict_(c.get(m, "pipelines", "pipelines"), "pipelines")
    if "default" not in pipes:
        raise c.fail("pipelines", "has no 'default' pipeline")
    for name, p in pipes.items():
        if not _PIPELINE_NAME.match(name):
            raise c.fail("pipelines", f"has an invalid pipeline name {name!r}")
        _chunking(c, p, f"pipelines.{name}")

    next_id = c.int_(c.get(m, "next_id", "next_id"), "next_id")
    c.int_(c.get(m, "next_group", "next_group"), "next_group")

    segs = c.get(m, "segments", "segments")
    if not isinstance(segs, list):
        raise c.fail("segments", f"must be a list, got {_kind(segs)}")
    seen: set[str] = set()
    total = 0
    for i, seg in enumerate(segs):
        f = f"segments[{i}]"
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
        total += rows
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
    if total > next_id:
        raise c.fail("next_id", f"is {next_id}, below the {total} chunks the segments hold")
    if total and dim is None:
        raise c.fail("config.dim", "is null although the segments hold chunks")

    idx = c.get(m, "index", "index", optional=True)
    if idx is not _MISSING and idx is not None:
        c.entry(idx, "index", _INDEX_NAME)
        ig = int(_INDEX_NAME.match(idx["path"]).group(1))  # type: ignore[union-attr]
        if ig > gen:
            raise c.fail("index.path", f"names generation {ig}, after the manifest's {gen}")
        r = c.get(idx, "rows", "index.rows", optional=True)
        if r is not _MISSING:
            c.int_(r, "index.rows", 0, next_id)
        if dim is None:
            raise c.fail("config.dim", "is null although there is an index checkpoint")
    return m


def _embedder(c: _Check, emb: Any, dim: int | None) -> None:
    e = c.dict_(emb, "embedder")
    kind = c.get(e, "kind", "embedder.kind", optional=True)
    if kind is not _MISSING:
        c.str_(kind, "embedder.kind")
    if kind == "none":
        return
    edim = c.get(e, "dim", "embedder.dim", optional=kind != "hashing")
    if edim is not _MISSING:
        c.int_(edim, "embedder.dim", 1, _MAX_DIM)
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


def _body_crc(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return zlib.crc32(text.encode("utf-8"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_manifest(dirpath: str) -> dict[str, Any]:
    """The manifest of a knowledge base directory: magic, version and checksum checked, then
    its structure (:func:`validate_manifest`). Raises FormatError (naming the bad field)."""
    path = os.path.join(dirpath, MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_MANIFEST + 1)
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"{dirpath!r} is not a knowledge base (no {MANIFEST})") from None
    except IsADirectoryError:
        raise FormatError(errno.EISDIR, f"{path!r} is a directory, not a manifest") from None
    except OSError as exc:
        raise _storage_error("reading", path, exc) from exc
    if len(raw) > _MAX_MANIFEST:
        raise FormatError(errno.EIO, f"{path!r} is larger than {_MAX_MANIFEST} bytes: not a manifest")
    try:
        manifest = json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(errno.EIO, f"{path!r} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise FormatError(errno.EIO, f"{path!r} is not a kbcore knowledge base manifest")
    version = manifest.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise FormatError(
            errno.EIO,
            f"{path!r} has format version {version!r}; this kbcore reads versions up to "
            f"{FORMAT_VERSION}: upgrade kbcore",
        )
    try:
        crc = _body_crc(manifest)
    except (ValueError, TypeError, RecursionError) as exc:
        raise FormatError(errno.EIO, f"{path!r} is corrupted: {exc}") from None
    if manifest.get("checksum") != crc:
        raise FormatError(errno.EIO, f"{path!r} is corrupted (checksum mismatch)")
    return validate_manifest(manifest, repr(path))


#: A manifest lists a few hundred bytes per segment; no real one comes near this.
_MAX_MANIFEST = 64 << 20


def save_manifest(dirpath: str, manifest: dict[str, Any]) -> None:
    """Replaces the manifest atomically and durably (adds its checksum).

    Raises :class:`~kbcore.errors.StorageError` if it could not be written: the previous
    manifest is then still the committed one.
    """
    manifest["format"] = FORMAT_NAME
    manifest["version"] = FORMAT_VERSION
    manifest["checksum"] = _body_crc(manifest)
    data = json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")
    atomic_write_bytes(os.path.join(dirpath, MANIFEST), data)


# -- segments ----------------------------------------------------------------------------------


def _is_int64(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_int64(t))


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_float(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_floating(t))


#: column -> (type test, nulls allowed); the columns the engine reads from each segment table.
_CHUNK_COLUMNS = {
    "__id": (_is_int64, False),
    "__text": (_is_text, False),
    "__start": (_is_int64, False),
    "__end": (_is_int64, False),
    "chunk_index": (_is_int64, False),
    "_group": (_is_int64, False),
    "document_id": (_is_text, False),
    "pipeline_name": (_is_text, False),
}
_DOC_COLUMNS = {
    "document_id": (_is_text, False),
    "pipeline_name": (_is_text, False),
    "n_chunks": (_is_int64, False),
    "text": (_is_text, True),
    "filename": (_is_text, True),
    "format": (_is_text, True),
    "metadata": (_is_text, False),
    "ingested_at": (_is_float, False),
}


def _check_schema(table: Any, columns: dict[str, Any], path: str) -> None:
    names = set(table.column_names)
    if len(names) != len(table.column_names):
        raise FormatError(errno.EIO, f"knowledge base file {path!r} repeats a column name")
    for col, (test, nullable) in columns.items():
        if col not in names:
            raise FormatError(errno.EIO, f"knowledge base file {path!r} has no column {col!r}")
        c = table.column(col)
        if not test(c.type):
            raise FormatError(errno.EIO, f"knowledge base file {path!r}: column {col!r} has type {c.type}")
        if not nullable and c.null_count:
            raise FormatError(errno.EIO, f"knowledge base file {path!r}: column {col!r} has nulls")


def _int_column(table: Any, col: str) -> np.ndarray:
    return np.asarray(table.column(col).to_numpy(), dtype=np.int64)


def read_segments(dirpath: str, manifest: dict[str, Any]) -> list[tuple[dict[str, Any], Any, Any]]:
    """Reads and checks every segment of a validated manifest: ``[(entry, chunks, docs)]``.

    Beyond :func:`read_arrow`: the columns the engine reads exist with their types and without
    nulls; row counts match the manifest; every document's chunk count is >= 0 and they add up
    to the chunk rows; chunk ids are strictly increasing within a segment, >= 0, below
    ``next_id`` and the segments' id ranges are disjoint; chunk groups are below ``next_group``.
    Raises FormatError naming the file and the problem.
    """
    next_id = manifest["next_id"]
    next_group = manifest["next_group"]
    out = []
    ranges = []
    for entry in manifest["segments"]:
        chunks = read_arrow(dirpath, entry["files"]["chunks"])
        docs = read_arrow(dirpath, entry["files"]["docs"])
        cpath = os.path.join(dirpath, entry["files"]["chunks"]["path"])
        dpath = os.path.join(dirpath, entry["files"]["docs"]["path"])
        _check_schema(chunks, _CHUNK_COLUMNS, cpath)
        _check_schema(docs, _DOC_COLUMNS, dpath)
        if chunks.num_rows != entry["rows"]:
            raise FormatError(
                errno.EIO,
                f"knowledge base file {cpath!r} has {chunks.num_rows} rows, the manifest says {entry['rows']}",
            )
        if docs.num_rows != entry["docs"]:
            raise FormatError(
                errno.EIO, f"knowledge base file {dpath!r} has {docs.num_rows} rows, the manifest says {entry['docs']}"
            )
        counts = _int_column(docs, "n_chunks")
        if (counts < 0).any() or int(counts.sum()) != chunks.num_rows:
            raise FormatError(
                errno.EIO,
                f"knowledge base file {dpath!r}: the documents' chunk counts "
                f"do not add up to the segment's {chunks.num_rows} chunks",
            )
        for j, text in enumerate(docs.column("metadata").to_pylist()):
            try:
                ok = isinstance(json.loads(text), dict)
            except (ValueError, RecursionError):
                ok = False
            if not ok:
                raise FormatError(
                    errno.EIO, f"knowledge base file {dpath!r}: document {j}'s metadata is not a JSON object"
                )
        ids = _int_column(chunks, "__id")
        if len(ids):
            if ids[0] < 0 or ids[-1] >= next_id or (len(ids) > 1 and not (ids[1:] > ids[:-1]).all()):
                raise FormatError(
                    errno.EIO,
                    f"knowledge base file {cpath!r}: chunk ids must increase strictly within [0, next_id={next_id})",
                )
            ranges.append((int(ids[0]), int(ids[-1]), cpath))
        groups = _int_column(chunks, "_group")
        if len(groups) and (groups.min() < 0 or groups.max() >= next_group):
            raise FormatError(
                errno.EIO, f"knowledge base file {cpath!r}: chunk groups must be in [0, next_group={next_group})"
            )
        out.append((entry, chunks, docs))
    ranges.sort()
    for (_, hi, a), (lo, _, b) in zip(ranges, ranges[1:]):
        if lo <= hi:
            raise FormatError(errno.EIO, f"knowledge base files {a!r} and {b!r} share chunk ids")
    return out


# -- locks and collection ----------------------------------------------------------------------


def _flock_module() -> Any:
    try:
        import fcntl
    except ImportError:  # not POSIX: single-process use only
        return None
    return fcntl


@contextmanager
def reading(dirpath: str) -> Iterator[None]:
    """Holds the directory's reader lock (shared ``flock`` on ``.read.lock``) for a load.

    A writer deletes superseded files only while it holds this lock exclusively, and skips the
    deletion when a reader holds it (:func:`remove_unreferenced`), so a load that read a
    manifest finds every file it names. Readers never wait for a commit, only for a deletion
    pass in progress (a few unlink calls). Raises StorageError if the lock cannot be taken; a
    directory where the lock file cannot be created (read-only) has no writer to exclude.
    """
    fcntl = _flock_module()
    path = os.path.join(dirpath, READ_LOCK)
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                fd = None  # missing directory (the load reports it) or read-only without the file
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except OSError as exc:
                raise _storage_error("locking", path, exc) from exc
        yield
    finally:
        if fd is not None:
            _close_quietly(fd)  # drops the lock


def referenced_files(manifest: dict[str, Any]) -> set[str]:
    """Every file name a manifest references."""
    names: set[str] = set()
    for seg in manifest.get("segments", []):
        for entry in seg["files"].values():
            if entry:
                names.add(entry["path"])
    if manifest.get("index"):
        names.add(manifest["index"]["path"])
    return names


def remove_unreferenced(dirpath: str, manifest: dict[str, Any]) -> int:
    """Deletes the knowledge base files the manifest does not reference; returns the count.

    Call only while holding the writer lock: another writer's new files are unreferenced until
    its manifest is committed. Takes the reader lock exclusively without waiting; while a
    reader is loading (it may be reading a superseded manifest's files) nothing is deleted and
    0 is returned: the next writer's pass collects the files.
    """
    fcntl = _flock_module()
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(os.path.join(dirpath, READ_LOCK), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            _close_quietly(fd)
            return 0  # a reader is loading
    try:
        keep = referenced_files(manifest)
        removed = 0
        try:
            names = os.listdir(dirpath)
        except OSError:
            return 0
        for name in names:
            if name in keep or not _OWNED.match(name):
                continue
            try:
                os.unlink(os.path.join(dirpath, name))
                removed += 1
            except OSError:
                pass
        return removed
    finally:
        if fd is not None:
            _close_quietly(fd)


class FileLock:
    """An exclusive inter-process lock on a file (``fcntl.flock``); re-entrant per object.

    The operating system releases it when the process dies, so a killed writer never leaves a
    stale lock behind. ``acquire`` waits for the holder (a commit in another process).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._depth = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        if self._depth:
            self._depth += 1
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise _storage_error("opening the lock file", self.path, exc) from exc
        fcntl = _flock_module()
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                _close_quietly(fd)
                raise _storage_error("locking", self.path, exc) from exc
        self._fd = fd
        self._depth = 1

    def release(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            _close_quietly(self._fd)  # closing the descriptor drops the flock
            self._fd = None
