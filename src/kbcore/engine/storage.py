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
import functools
import json
import os
import re
import stat
import threading
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import FormatError, StorageError
from .columns import to_numpy
from .manifest_check import FORMAT_NAME, FORMAT_VERSION, validate_manifest

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


def _open_written(path: str, data: Any, *, exclusive: bool = False) -> int:
    """Creates ``path`` with ``data`` (bytes-like), not synced; returns the open descriptor."""
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
    except OSError as exc:
        _close_quietly(fd)
        raise _storage_error("writing", path, exc) from exc
    return fd


def _run_together(jobs: list[tuple[str, Callable[[], None]]]) -> list[tuple[str, BaseException | None]]:
    """Runs every job at once: the first on the calling thread, the others on short-lived
    threads (a few tens of microseconds each against milliseconds of fsync), all joined before
    returning, so no thread outlives a commit. Returns each job's exception (None if it ran)."""
    outcome: list[BaseException | None] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            jobs[i][1]()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, which raises it
            outcome[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name="kbcore-fsync") for i in range(1, len(jobs))]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    return [(p, exc) for (p, _), exc in zip(jobs, outcome)]


def write_files(files: list[tuple[str, Any]], *, sync_dir: str | None = None) -> None:
    """Creates each ``(path, bytes)`` file (replacing any), then makes them durable together:
    their fsyncs, and ``sync_dir``'s (the directory holding their names) when given, run
    concurrently, so that the file system commits them in one journal transaction instead of
    one each (ext4: ~10 ms per transaction on a VM disk, whatever the number of files).

    Returns once every file and the directory are durable. Raises
    :class:`~kbcore.errors.StorageError` naming the first file that failed; the files are then
    left for the caller to remove.
    """
    fds: list[tuple[str, int]] = []
    try:
        for path, data in files:
            fds.append((path, _open_written(path, data)))
        jobs: list[tuple[str, Callable[[], None]]] = [(p, functools.partial(os.fsync, fd)) for p, fd in fds]
        if sync_dir is not None:
            jobs.append((sync_dir, functools.partial(fsync_dir, sync_dir)))
        if len(jobs) == 1:
            jobs[0][1]()
        elif jobs:
            for p, exc in _run_together(jobs):  # all done before any fd closes
                if isinstance(exc, StorageError):
                    raise exc
                if isinstance(exc, OSError):
                    raise _storage_error("syncing", p, exc) from exc
                if exc is not None:
                    raise exc
    finally:
        errors = []
        for path, fd in fds:
            try:
                os.close(fd)
            except OSError as exc:  # NFS and friends report deferred write errors at close
                errors.append(_storage_error("writing", path, exc))
    if errors:
        raise errors[0]


def _write_file(path: str, data: Any, *, exclusive: bool = False) -> None:
    """Writes ``data`` (bytes-like) to ``path`` and fsyncs it; OSError -> StorageError."""
    fd = _open_written(path, data, exclusive=exclusive)
    try:
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


def check_size(dirpath: str, entry: dict[str, Any]) -> None:
    """Raises FormatError if the file is missing or not of the manifest's size (no read: for
    files whose reader verifies their content itself, such as the native index's checksum)."""
    path = os.path.join(dirpath, entry["path"])
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing") from None
    except OSError as exc:
        raise _storage_error("reading", path, exc) from exc
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(errno.EIO, f"knowledge base file {path!r} is not a regular file")
    if st.st_size != entry["bytes"]:
        raise FormatError(
            errno.EIO,
            f"knowledge base file {path!r} is corrupted: {st.st_size} bytes, the manifest says {entry['bytes']} bytes",
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


def arrow_bytes(table: Any) -> Any:
    """A pyarrow Table as the bytes of an Arrow IPC file (a pyarrow Buffer)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def npy_bytes(arr: np.ndarray) -> Any:
    """A numpy array as the bytes of a .npy file (a memoryview)."""
    import io

    bio = io.BytesIO()
    np.save(bio, np.ascontiguousarray(arr), allow_pickle=False)
    return bio.getbuffer()


def entry_of(name: str, data: Any) -> dict[str, Any]:
    """The manifest entry (``{"path", "bytes", "crc32"}``) of a file ``name`` holding ``data``."""
    view = memoryview(data)
    return {"path": name, "bytes": view.nbytes, "crc32": zlib.crc32(view)}


def write_arrow(dirpath: str, name: str, table: Any) -> dict[str, Any]:
    """Writes a pyarrow Table as an Arrow IPC file, fsynced; returns its manifest entry."""
    buf = arrow_bytes(table)
    _write_file(os.path.join(dirpath, name), buf)
    return entry_of(name, buf)


def _map_file(path: str) -> tuple[Any, os.stat_result]:
    """A read-only memory map of ``path`` as a pyarrow Buffer, and the file's stat taken
    through the mapped descriptor (FormatError if missing)."""
    import pyarrow as pa

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(errno.EISDIR, f"knowledge base file {path!r} is not a regular file")
            if st.st_size == 0:
                return pa.py_buffer(b""), st
            with pa.memory_map(path, "r") as mm:
                st2 = os.stat(path)
                if (st2.st_ino, st2.st_dev) != (st.st_ino, st.st_dev):  # replaced meanwhile:
                    st = os.stat_result((0,) * 10)  # no identity, so checked in full, not cached
                return mm.read_buffer(), st  # the mapping lives as long as the buffer
    except IsADirectoryError:
        raise FormatError(errno.EISDIR, f"knowledge base file {path!r} is a directory") from None
    except FileNotFoundError:
        raise FormatError(errno.ENOENT, f"knowledge base file {path!r} is missing") from None
    except OSError as exc:
        if isinstance(exc, FormatError):
            raise
        raise _storage_error("reading", path, exc) from exc


def read_arrow(dirpath: str, entry: dict[str, Any], *, verify: bool = True) -> Any:
    """Maps an Arrow IPC file, checks its size and CRC-32, then its structure
    (``Table.validate(full=True)``: offsets, lengths, UTF-8) and returns the Table, whose
    columns point into the mapping (file-backed pages, no anonymous memory).

    Every byte is checked before a column is used. The files of a knowledge base are immutable
    (new ones are renamed in, old ones unlinked, neither touches a mapping); like the index
    checkpoint's mapping (docs/quantization.md), a file truncated in place by someone else
    would turn into SIGBUS. Raises FormatError (missing, corrupted, not Arrow, invalid).
    """
    import pyarrow as pa

    path = os.path.join(dirpath, entry["path"])
    data, st = _map_file(path)
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry["bytes"], entry["crc32"])
    checked = verify and st.st_ino != 0 and _checked_before(key)
    if verify and not checked:
        check_entry(dirpath, entry, data)
    try:
        table = pa.ipc.open_file(data).read_all()
        if not checked:
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
    if verify and not checked and st.st_ino != 0:
        _remember_checked(key)
    return table


#: Arrow files this process checked in full (CRC-32 against the manifest, validate(full=True)),
#: by identity: path, device, inode, size, mtime, ctime and the manifest's size and CRC-32. A
#: reopen or refresh in the same process maps them again without re-reading every byte; a file
#: replaced or rewritten (another inode or times) or named by another manifest entry is checked
#: again. Bounded (least recently used out).
_CHECKED: dict[tuple[Any, ...], None] = {}
_CHECKED_MAX = 4096
_CHECKED_LOCK = threading.Lock()


def _checked_before(key: tuple[Any, ...]) -> bool:
    with _CHECKED_LOCK:
        if key not in _CHECKED:
            return False
        _CHECKED[key] = _CHECKED.pop(key)  # most recently used last
        return True


def _remember_checked(key: tuple[Any, ...]) -> None:
    with _CHECKED_LOCK:
        _CHECKED[key] = None
        while len(_CHECKED) > _CHECKED_MAX:
            del _CHECKED[next(iter(_CHECKED))]


def write_npy(dirpath: str, name: str, arr: np.ndarray) -> dict[str, Any]:
    """Writes a numpy array as .npy, fsynced; returns its manifest entry."""
    data = npy_bytes(arr)
    _write_file(os.path.join(dirpath, name), data)
    return entry_of(name, data)


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


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The file content of ``manifest`` (adds its format, version and checksum to it)."""
    manifest["format"] = FORMAT_NAME
    manifest["version"] = FORMAT_VERSION
    manifest["checksum"] = _body_crc(manifest)
    return json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")


def save_manifest(dirpath: str, manifest: dict[str, Any]) -> None:
    """Replaces the manifest atomically and durably (adds its checksum).

    Raises :class:`~kbcore.errors.StorageError` if it could not be written: the previous
    manifest is then still the committed one.
    """
    atomic_write_bytes(os.path.join(dirpath, MANIFEST), manifest_bytes(manifest))


def manifest_temp_name() -> str:
    """A fresh name for a manifest written before it is installed (collected if left behind)."""
    return f"{MANIFEST}.tmp-{uuid.uuid4().hex[:12]}"


def install_manifest(dirpath: str, temp_name: str) -> None:
    """The commit point of a manifest already written durably as ``temp_name`` (see
    :func:`write_files`): renames it over the manifest, then fsyncs the directory (a failure
    there only warns: the new state is already what every reader sees). Raises
    :class:`~kbcore.errors.StorageError` if the rename fails (the old manifest stays)."""
    path = os.path.join(dirpath, MANIFEST)
    try:
        os.replace(os.path.join(dirpath, temp_name), path)
    except OSError as exc:
        raise _storage_error("renaming into", path, exc) from exc
    fsync_dir(dirpath, strict=False)


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
#: Chunk columns that only some segments have (checked when present).
_OPTIONAL_CHUNK_COLUMNS = {
    "__content": (_is_text, True),
    "__steps": (_is_text, True),
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


def _check_schema(table: Any, columns: dict[str, Any], path: str, optional: dict[str, Any] | None = None) -> None:
    names = set(table.column_names)
    if len(names) != len(table.column_names):
        raise FormatError(errno.EIO, f"knowledge base file {path!r} repeats a column name")
    checks = list(columns.items()) + [kv for kv in (optional or {}).items() if kv[0] in names]
    for col, (test, nullable) in checks:
        if col not in names:
            raise FormatError(errno.EIO, f"knowledge base file {path!r} has no column {col!r}")
        c = table.column(col)
        if not test(c.type):
            raise FormatError(errno.EIO, f"knowledge base file {path!r}: column {col!r} has type {c.type}")
        if not nullable and c.null_count:
            raise FormatError(errno.EIO, f"knowledge base file {path!r}: column {col!r} has nulls")


def _int_column(table: Any, col: str) -> np.ndarray:
    return to_numpy(table.column(col), np.int64)


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
        _check_schema(chunks, _CHUNK_COLUMNS, cpath, _OPTIONAL_CHUNK_COLUMNS)
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
        # A document's metadata (a JSON object) is parsed and checked where it is read
        # (segments.document_infos): FormatError naming this file at that first use.
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
