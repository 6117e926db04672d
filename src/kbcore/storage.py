"""On-disk layout of a knowledge base, and the file primitives that make it crash-safe.

A knowledge base is a directory::

    <name>/
      manifest.json                 the only mutable file: replaced atomically (write, fsync, rename)
      .lock                         fcntl lock serialising writers across processes
      seg-<n>.chunks.arrow          Arrow IPC: one row per chunk (id, text, span, metadata columns)
      seg-<n>.docs.arrow            Arrow IPC: one row per document of the segment
      seg-<n>.vectors.npy           float32 [rows, dim]; dropped once an index checkpoint covers it
      index-<generation>.kbi        the native index (kbcore.Index.save), a checkpoint

Files other than the manifest are immutable once written and fsynced, and are named after the
manifest generation that introduced them, so a new state never overwrites a file the current
manifest references. A mutation writes its new files, fsyncs them, then replaces the manifest
(temp file, fsync, ``rename``, fsync of the directory): a crash at any point leaves either the
old or the new manifest, both of which reference only complete files. Files that no manifest
references (left by a crash, or superseded) are deleted by the next writer.

The manifest records each file's size and CRC-32, and its own CRC-32 over its JSON body; a
mismatch raises :class:`~kbcore.errors.FormatError`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .errors import FormatError, StorageError

__all__ = [
    "MANIFEST",
    "LOCK",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "fsync_dir",
    "atomic_write_bytes",
    "write_arrow",
    "read_arrow",
    "write_npy",
    "read_npy",
    "file_entry",
    "check_entry",
    "load_manifest",
    "save_manifest",
    "FileLock",
    "remove_unreferenced",
]

MANIFEST = "manifest.json"
LOCK = ".lock"
FORMAT_NAME = "kbcore-knowledge-base"
FORMAT_VERSION = 1
_CHUNK = 1 << 22

#: File names a knowledge base directory may hold besides the manifest and the lock.
_OWNED = re.compile(r"^(seg-\d+\.(chunks|docs)\.arrow|seg-\d+\.vectors\.npy|index-\d+\.kbi)(\.tmp.*)?$")


def _storage_error(what: str, path: str, exc: OSError) -> StorageError:
    return StorageError(exc.errno or errno.EIO, f"{what} {path!r} failed: {exc.strerror or exc}")


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (creations, renames) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # platforms without directory fds
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    size, crc = _crc_file(os.path.join(dirpath, name))
    return {"path": name, "bytes": size, "crc32": crc}


def check_entry(dirpath: str, entry: dict[str, Any], buf: Any = None) -> None:
    """Raises FormatError if the file is missing, of another size or another CRC-32."""
    path = os.path.join(dirpath, entry["path"])
    if buf is None:
        if not os.path.exists(path):
            raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing")
        size, crc = _crc_file(path)
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
    """Writes ``data`` to ``path`` atomically and durably (temp file, fsync, rename, fsync dir)."""
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _storage_error("writing", path, exc) from exc
    fsync_dir(d)


def write_arrow(dirpath: str, name: str, table: Any) -> dict[str, Any]:
    """Writes a pyarrow Table as an Arrow IPC file, fsynced; returns its manifest entry."""
    import pyarrow as pa

    path = os.path.join(dirpath, name)
    try:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        buf = sink.getvalue()
        with open(path, "wb") as f:
            f.write(buf)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise _storage_error("writing", path, exc) from exc
    return {"path": name, "bytes": buf.size, "crc32": zlib.crc32(memoryview(buf))}


def read_arrow(dirpath: str, entry: dict[str, Any], *, verify: bool = True) -> Any:
    """Reads an Arrow IPC file (memory-mapped, zero-copy) after checking size and CRC-32."""
    import pyarrow as pa

    path = os.path.join(dirpath, entry["path"])
    try:
        source = pa.memory_map(path, "r")
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing") from None
    buf = source.read_buffer()
    if verify:
        check_entry(dirpath, entry, buf)
    try:
        return pa.ipc.open_file(buf).read_all()
    except pa.ArrowInvalid as exc:
        raise FormatError(errno.EIO, f"knowledge base file {path!r} is not valid Arrow: {exc}") from None


def write_npy(dirpath: str, name: str, arr: np.ndarray) -> dict[str, Any]:
    """Writes a numpy array as .npy, fsynced; returns its manifest entry."""
    import io

    path = os.path.join(dirpath, name)
    bio = io.BytesIO()
    np.save(bio, np.ascontiguousarray(arr), allow_pickle=False)
    data = bio.getbuffer()
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise _storage_error("writing", path, exc) from exc
    return {"path": name, "bytes": data.nbytes, "crc32": zlib.crc32(data)}


def read_npy(dirpath: str, entry: dict[str, Any]) -> np.ndarray:
    """Reads a .npy file written by :func:`write_npy` after checking size and CRC-32."""
    import io

    path = os.path.join(dirpath, entry["path"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing") from None
    check_entry(dirpath, entry, data)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        raise FormatError(errno.EIO, f"knowledge base file {path!r} is not a valid .npy: {exc}") from None


def _body_crc(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return zlib.crc32(text.encode("utf-8"))


def load_manifest(dirpath: str) -> dict[str, Any]:
    """The manifest of a knowledge base directory, validated."""
    path = os.path.join(dirpath, MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"{dirpath!r} is not a knowledge base (no {MANIFEST})") from None
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(errno.EIO, f"{path!r} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise FormatError(errno.EIO, f"{path!r} is not a kbcore knowledge base manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise FormatError(
            errno.EIO,
            f"{path!r} has format version {version!r}; this kbcore reads versions up to "
            f"{FORMAT_VERSION}: upgrade kbcore",
        )
    if manifest.get("checksum") != _body_crc(manifest):
        raise FormatError(errno.EIO, f"{path!r} is corrupted (checksum mismatch)")
    return manifest


def save_manifest(dirpath: str, manifest: dict[str, Any]) -> None:
    """Replaces the manifest atomically and durably (adds its checksum)."""
    manifest["format"] = FORMAT_NAME
    manifest["version"] = FORMAT_VERSION
    manifest["checksum"] = _body_crc(manifest)
    data = json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")
    atomic_write_bytes(os.path.join(dirpath, MANIFEST), data)


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
    its manifest is committed.
    """
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


class FileLock:
    """An exclusive inter-process lock on a file (``fcntl.flock``); re-entrant per object.

    The operating system releases it when the process dies, so a killed writer never leaves a
    stale lock behind.
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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _storage_error("opening the lock file", self.path, exc) from exc
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: single-process use only
            pass
        except OSError as exc:
            os.close(fd)
            raise _storage_error("locking", self.path, exc) from exc
        self._fd = fd
        self._depth = 1

    def release(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
