"""A shard's write-ahead log: every acknowledged write since the last index checkpoint.

A log file is a header (magic ``KBWAL``, format version) followed by records. Each record is
framed as (format 2)::

    u32 magic "KBWR" | u32 header bytes | u64 payload bytes | u32 CRC-32 of header+payload
    | u32 CRC-32 of the 20 frame bytes before it
    header: UTF-8 JSON {"seq", "op", "n", "dim", "discard", "meta", "meta_bytes", "texts"}
    payload: vectors float32 [n, dim] | ids int64 [n] | discard ids int64 [discard] | metadata

(little-endian). ``op`` is ``"add"`` (rows plus ids to drop, see
:meth:`kbcore.distributed.shard.ShardState.apply`) or ``"remove"``. Metadata is JSON (a list of
row dicts) or Arrow IPC stream bytes (a Table). Nothing is unpickled.

A record is acknowledged only after it is written and fsynced. A crash in the middle of an
append leaves a prefix of its record at the end of the file (a torn tail). That write was never
acknowledged, so :func:`read_log` drops it and :class:`WalWriter` truncates it away, but only
when it is provably a torn tail:

- the file ends inside the 24-byte frame, and those bytes start like a frame; or
- the frame's own checksum holds (so its lengths are the ones written) and the record it
  declares runs past the end of the file; or
- everything from the record on is zero bytes (a file extended before its data reached disk);

and, in every case, no complete record with valid checksums starts anywhere after it. Any
other damage (a frame or payload failing its checksum, a bad magic, a valid record after a
damaged one) raises :class:`~kbcore.errors.FormatError` naming the file and the byte offset,
and nothing is truncated: acknowledged records are never discarded silently.

Format 1 logs (no frame checksum, written by older kbcore) are still read and appended to in
format 1; their torn-tail rule is the same except that a damaged length cannot be told from a
torn record when the damaged record is the last one. New logs are format 2.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FormatError, StorageError

__all__ = ["WalRecord", "WalWriter", "read_log", "encode_record"]

_FILE_MAGIC = b"KBWAL\x00\x00\x00"
_FILE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_FILE_HEADER = struct.Struct("<8sI")
_REC_MAGIC = b"KBWR"
_FRAME_V1 = struct.Struct("<4sIQI")
_FRAME = struct.Struct("<4sIQII")  # format 2: the last field is the CRC-32 of the 20 before it
_FRAME_CHECKED = 20
_MAX_HEADER = 1 << 28


@dataclass
class WalRecord:
    """One logged write."""

    seq: int
    op: str  # "add" or "remove"
    vectors: np.ndarray  # float32 [n, dim] (empty for remove)
    ids: np.ndarray  # int64 [n]
    discard: np.ndarray  # int64: ids to drop from this shard (add only)
    metadata: Any  # None, list of dicts, or a pyarrow Table
    texts: list[str | None] | None


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"metadata value of type {type(value).__name__} cannot be logged")


def encode_record(rec: WalRecord, version: int = _FILE_VERSION) -> bytes:
    """The framed bytes of one record, in log format ``version`` (1 or 2)."""
    meta_kind = "none"
    meta_bytes = b""
    if rec.metadata is not None:
        if type(rec.metadata).__module__.split(".")[0] == "pyarrow":
            import pyarrow as pa

            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, rec.metadata.schema) as w:
                w.write_table(rec.metadata)
            meta_bytes = sink.getvalue().to_pybytes()
            meta_kind = "arrow"
        else:
            meta_bytes = json.dumps(list(rec.metadata), default=_json_default).encode()
            meta_kind = "json"
    vectors = np.ascontiguousarray(rec.vectors, dtype="<f4")
    ids = np.ascontiguousarray(rec.ids, dtype="<i8")
    discard = np.ascontiguousarray(rec.discard, dtype="<i8")
    header = json.dumps(
        {
            "seq": int(rec.seq),
            "op": rec.op,
            "n": int(ids.shape[0]),
            "dim": int(vectors.shape[1]) if vectors.ndim == 2 else 0,
            "discard": int(discard.shape[0]),
            "meta": meta_kind,
            "meta_bytes": len(meta_bytes),
            "texts": rec.texts,
        }
    ).encode()
    payload = b"".join((vectors.tobytes(), ids.tobytes(), discard.tobytes(), meta_bytes))
    crc = zlib.crc32(payload, zlib.crc32(header))
    if version == 1:
        return _FRAME_V1.pack(_REC_MAGIC, len(header), len(payload), crc) + header + payload
    frame = _FRAME_V1.pack(_REC_MAGIC, len(header), len(payload), crc)
    return frame + struct.pack("<I", zlib.crc32(frame)) + header + payload


def _decode(header: bytes, payload: bytes, path: str) -> WalRecord:
    try:
        h = json.loads(header)
        n, dim, nd, mb = int(h["n"]), int(h["dim"]), int(h["discard"]), int(h["meta_bytes"])
        op, seq, meta_kind, texts = h["op"], int(h["seq"]), h["meta"], h["texts"]
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: bad record header") from exc
    if min(n, dim, nd, mb) < 0 or op not in ("add", "remove") or n * dim * 4 + n * 8 + nd * 8 + mb != len(payload):
        raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record sizes disagree")
    if texts is not None and (
        not isinstance(texts, list) or len(texts) != n or not all(t is None or isinstance(t, str) for t in texts)
    ):
        raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record texts disagree")
    at = 0
    vectors = np.frombuffer(payload, "<f4", n * dim, at).reshape(n, dim).astype(np.float32)
    at += n * dim * 4
    ids = np.frombuffer(payload, "<i8", n, at).astype(np.int64)
    at += n * 8
    discard = np.frombuffer(payload, "<i8", nd, at).astype(np.int64)
    at += nd * 8
    metadata: Any = None
    if meta_kind == "json":
        try:
            metadata = json.loads(payload[at:])
        except (ValueError, RecursionError) as exc:
            raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record metadata is not JSON") from exc
        if not isinstance(metadata, list) or len(metadata) != n or not all(isinstance(m, dict) for m in metadata):
            raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record metadata disagrees")
    elif meta_kind == "arrow":
        import pyarrow as pa

        try:  # validated in full before any native use (offsets, lengths, UTF-8)
            metadata = pa.ipc.open_stream(pa.py_buffer(payload[at:])).read_all()
            metadata.validate(full=True)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, OverflowError) as exc:
            raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record metadata is not valid Arrow") from exc
        if metadata.num_rows != n:
            raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: record metadata disagrees")
    elif meta_kind != "none":
        raise FormatError(errno.EINVAL, f"write-ahead log {path!r}: unknown metadata kind")
    return WalRecord(seq, op, vectors, ids, discard, metadata, texts)


def _frame_at(data: bytes, at: int, version: int) -> tuple[int, int, int] | None:
    """``(header bytes, payload bytes, body CRC)`` of the frame at ``at`` if its magic (and, in
    format 2, its own checksum) holds and it fits in ``data``; else None."""
    frame = _FRAME if version >= 2 else _FRAME_V1
    if len(data) - at < frame.size or data[at : at + 4] != _REC_MAGIC:
        return None
    if version >= 2:
        _, hlen, plen, crc, fcrc = _FRAME.unpack_from(data, at)
        if zlib.crc32(data[at : at + _FRAME_CHECKED]) != fcrc:
            return None
    else:
        _, hlen, plen, crc = _FRAME_V1.unpack_from(data, at)
    return hlen, plen, crc


def _valid_record_after(data: bytes, at: int, version: int) -> int | None:
    """The offset of the first complete record with valid checksums starting after ``at``."""
    frame = _FRAME if version >= 2 else _FRAME_V1
    pos = data.find(_REC_MAGIC, at + 1)
    while pos >= 0:
        got = _frame_at(data, pos, version)
        if got is not None:
            hlen, plen, crc = got
            body = pos + frame.size
            fits = hlen <= _MAX_HEADER and body + hlen + plen <= len(data)
            if fits and zlib.crc32(data[body : body + hlen + plen]) == crc:
                return pos
        pos = data.find(_REC_MAGIC, pos + 1)
    return None


def read_log(path: str) -> tuple[list[WalRecord], int]:
    """The records of a log and the byte length of its valid prefix (header + whole records).

    Raises :class:`FileNotFoundError` if it does not exist and
    :class:`~kbcore.errors.FormatError` (naming the file and the byte offset) if it is not a
    log, of a newer version, or has a damaged record anywhere but a provably torn tail (see
    the module documentation).
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _FILE_HEADER.size:
        raise FormatError(errno.EINVAL, f"{path!r} is not a kbcore write-ahead log (too short)")
    magic, version = _FILE_HEADER.unpack_from(data, 0)
    if magic != _FILE_MAGIC:
        raise FormatError(errno.EINVAL, f"{path!r} is not a kbcore write-ahead log")
    if version not in _READABLE_VERSIONS:
        raise FormatError(
            errno.EINVAL, f"write-ahead log {path!r} has format {version}, this kbcore reads {_FILE_VERSION}"
        )
    frame = _FRAME if version >= 2 else _FRAME_V1

    def damaged(at: int, what: str) -> FormatError:
        return FormatError(errno.EIO, f"write-ahead log {path!r}: record at byte {at} {what}")

    def torn_tail(at: int) -> None:
        # Dropped only if no valid record follows: otherwise acknowledged records would go too.
        later = _valid_record_after(data, at, version)
        if later is not None:
            raise damaged(at, f"is damaged and a valid record follows at byte {later}")

    records: list[WalRecord] = []
    at = _FILE_HEADER.size
    while at < len(data):
        if data[at] == 0 and data.count(0, at) == len(data) - at:
            break  # a zero-filled tail left by a crash
        if len(data) - at < frame.size:
            if not _REC_MAGIC.startswith(data[at : at + 4]):
                raise damaged(at, "is corrupted (bad magic)")
            torn_tail(at)
            break  # torn frame at the end
        if data[at : at + 4] != _REC_MAGIC:
            raise damaged(at, "is corrupted (bad magic)")
        got = _frame_at(data, at, version)
        if got is None:
            raise damaged(at, "has a damaged frame (its lengths fail their checksum)")
        hlen, plen, crc = got
        if hlen > _MAX_HEADER:
            raise damaged(at, "is too large")
        end = at + frame.size + hlen + plen
        if end > len(data):
            torn_tail(at)
            break  # torn record at the end: never acknowledged
        header = data[at + frame.size : at + frame.size + hlen]
        payload = data[at + frame.size + hlen : end]
        if zlib.crc32(payload, zlib.crc32(header)) != crc:
            if version == 1 and end == len(data):
                torn_tail(at)
                break  # format 1: the last record, partly written
            raise damaged(at, "fails its checksum")
        records.append(_decode(header, payload, path))
        at = end
    return records, at


class WalWriter:
    """Appends records to one log file, each made durable (fsync) before :meth:`append` returns."""

    def __init__(self, path: str, *, valid_length: int | None = None) -> None:
        """Opens ``path`` for appending, creating it (with a header, fsynced) when absent.
        ``valid_length`` (from :func:`read_log`, which raised instead if anything but a torn
        tail was wrong) truncates a torn tail first; without it nothing is truncated."""
        self.path = path
        try:
            new = not os.path.exists(path)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self.version = _FILE_VERSION
            if new:
                os.write(self._fd, _FILE_HEADER.pack(_FILE_MAGIC, _FILE_VERSION))
                os.fsync(self._fd)
                from ..engine.storage import fsync_dir

                fsync_dir(os.path.dirname(path) or ".")
            else:
                head = os.pread(self._fd, _FILE_HEADER.size, 0)
                if len(head) == _FILE_HEADER.size and head[:8] == _FILE_MAGIC:
                    self.version = _FILE_HEADER.unpack(head)[1]  # keep appending in its format
            if not new and valid_length is not None and os.fstat(self._fd).st_size != valid_length:
                os.ftruncate(self._fd, valid_length)
                os.fsync(self._fd)
            self.bytes = os.lseek(self._fd, 0, os.SEEK_END)
        except OSError as exc:
            raise StorageError(exc.errno or errno.EIO, f"opening write-ahead log {path!r} failed: {exc}") from exc

    def append(self, rec: WalRecord) -> None:
        """Writes one record and fsyncs it; raises StorageError if the OS refuses."""
        data = encode_record(rec, self.version)
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        except OSError as exc:
            raise StorageError(
                exc.errno or errno.EIO, f"appending to write-ahead log {self.path!r} failed: {exc}"
            ) from exc
        self.bytes += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def iter_new(records: list[WalRecord], after_seq: int) -> Iterator[WalRecord]:
    """Records with a sequence number above ``after_seq`` (those a checkpoint lacks)."""
    return (r for r in records if r.seq > after_seq)
