"""One shard: a kbcore :class:`~kbcore.Index` persisted under its own directory.

:class:`ShardState` is plain Python (no Ray); :mod:`kbcore.distributed.sharded_index` runs one
per Ray actor. Its directory holds::

    state.json            {"format", "seq", "snapshot", "wal"}: replaced atomically
    index-<seq>.kbi       the last checkpoint (kbcore.Index.save), covering writes <= seq
    wal-<seq>.log         the writes after it (see kbcore.distributed.wal), in "wal" mode

Durability modes (``durability=``):

- ``"wal"``: a write is applied to the index, then appended to the log and fsynced, then
  acknowledged. When the log exceeds ``checkpoint_bytes`` the index is saved and the log
  restarted. Recovery loads the checkpoint and replays the log.
- ``"save"``: every write saves the whole index before it is acknowledged (no log).

A write is applied before it is logged so that the index validates it (a bad batch changes
nothing and is never logged). If logging then fails, the in-memory index holds a write the
disk lacks: the shard marks itself broken and refuses every later call with
:class:`~kbcore.errors.StorageError`; the actor process exits so that Ray restarts it from
disk, without the unacknowledged write.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engine.storage import atomic_write_bytes, fsync_dir
from ..errors import FormatError, InvalidArgumentError, InvalidTypeError, StorageError
from ..index import Index
from .wal import WalRecord, WalWriter, read_log

__all__ = ["ShardState", "STATE_FILE"]

STATE_FILE = "state.json"
_FORMAT = 1


def _index_file(seq: int) -> str:
    return f"index-{seq:016d}.kbi"


def _wal_file(seq: int) -> str:
    return f"wal-{seq:016d}.log"


class ShardState:
    """A shard's index, its write-ahead log and its recovery.

    Thread safety: reads run concurrently; writes (and checkpoints) are serialised by a lock.
    """

    def __init__(
        self,
        directory: str,
        *,
        shard: int,
        dim: int,
        metric: str,
        kind: str,
        index_options: Mapping[str, Any],
        durability: str = "wal",
        checkpoint_bytes: int = 64 << 20,
        mmap: bool = True,
    ) -> None:
        """Opens (recovering) or creates the shard stored in ``directory``; ``mmap`` is how
        it reopens its checkpoint (:meth:`kbcore.Index.load`).

        Raises :class:`~kbcore.errors.FormatError` if its files are corrupted and
        :class:`~kbcore.errors.StorageError` if the OS refuses a read or write.
        """
        if durability not in ("wal", "save"):
            raise InvalidArgumentError(f"durability must be 'wal' or 'save', got {durability!r}")
        self.shard = shard
        self.directory = directory
        self.durability = durability
        self.checkpoint_bytes = int(checkpoint_bytes)
        self._mmap = bool(mmap)
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.replayed = 0
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StorageError(exc.errno or errno.EIO, f"creating shard directory {directory!r} failed: {exc}") from exc
        state_path = os.path.join(directory, STATE_FILE)
        self._wal: WalWriter | None = None
        self._snapshot: str | None = None
        self._wal_name: str | None = None
        self.seq = 0
        if os.path.exists(state_path):
            self._recover(state_path)
        else:
            self.index = Index(dim, metric, kind, **dict(index_options))  # type: ignore[arg-type]
            self._checkpoint_locked()  # an empty checkpoint: state.json always names an index
        if self.index.dim != dim or self.index.metric != metric or self.index.kind != kind:
            raise FormatError(
                errno.EINVAL,
                f"shard {shard} in {directory!r} holds a {self.index.kind}/{self.index.metric} index "
                f"of dimension {self.index.dim}, expected {kind}/{metric} of dimension {dim}",
            )
        self._remove_unreferenced()

    # -- persistence ----------------------------------------------------------------------
    def _write_state(self) -> None:
        body = {"format": _FORMAT, "seq": self.seq, "snapshot": self._snapshot, "wal": self._wal_name}
        atomic_write_bytes(os.path.join(self.directory, STATE_FILE), json.dumps(body).encode())

    def _recover(self, state_path: str) -> None:
        try:
            with open(state_path, "rb") as f:
                state = json.loads(f.read())
            fmt, seq, snapshot, wal = state["format"], int(state["seq"]), state["snapshot"], state["wal"]
            if not isinstance(snapshot, str) or not (wal is None or isinstance(wal, str)):
                raise TypeError("file names")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FormatError(errno.EINVAL, f"shard state {state_path!r} is unreadable or corrupted") from exc
        if fmt != _FORMAT:
            raise FormatError(errno.EINVAL, f"shard state {state_path!r} has format {fmt}, expected {_FORMAT}")
        self._snapshot, self._wal_name, self.seq = snapshot, wal, seq
        self.index = Index.load(os.path.join(self.directory, snapshot), mmap=self._mmap)
        valid = 0
        if wal is not None:
            path = os.path.join(self.directory, wal)
            try:
                records, valid = read_log(path)
            except FormatError as exc:  # nothing is truncated: the operator decides
                raise FormatError(exc.errno or errno.EIO, f"shard {self.shard}: {exc.strerror or exc}") from exc
            for rec in records:
                if rec.seq <= self.seq:
                    continue
                try:
                    self._apply_record(rec)
                except (InvalidArgumentError, InvalidTypeError, ValueError, TypeError) as exc:
                    raise FormatError(
                        errno.EIO,
                        f"shard {self.shard}: record {rec.seq} of write-ahead log {path!r} cannot be replayed: {exc}",
                    ) from exc
                self.seq = rec.seq
                self.replayed += 1
        if self.durability == "wal" and wal is not None:
            # Keep appending to the same log (records carry their sequence numbers); a torn
            # tail (an unacknowledged write) is cut off first.
            self._wal = WalWriter(os.path.join(self.directory, wal), valid_length=valid)
        else:
            # The mode changed ("wal" <-> "save"): a checkpoint starts or drops the log.
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        """Saves the index as a checkpoint of ``self.seq`` and restarts the log."""
        old = (self._snapshot, self._wal_name)
        snapshot = _index_file(self.seq)
        self.index.save(os.path.join(self.directory, snapshot))
        wal_name: str | None = None
        new_wal: WalWriter | None = None
        if self.durability == "wal":
            wal_name = _wal_file(self.seq)
            if wal_name != old[1]:
                path = os.path.join(self.directory, wal_name)
                if os.path.exists(path):  # left by a crash before its state was written
                    os.unlink(path)
                new_wal = WalWriter(path)
            # else: the current log began at this very seq and holds no newer record: keep it.
        self._snapshot, self._wal_name = snapshot, wal_name
        self._write_state()
        if self.durability != "wal" or new_wal is not None:
            if self._wal is not None:
                self._wal.close()
            self._wal = new_wal
        for name in old:
            if name is not None and name not in (self._snapshot, self._wal_name):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
        fsync_dir(self.directory)

    def _remove_unreferenced(self) -> None:
        keep = {STATE_FILE, self._snapshot, self._wal_name}
        for name in os.listdir(self.directory):
            if name in keep:
                continue
            if name.startswith(("index-", "wal-", STATE_FILE)):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass

    def _apply_record(self, rec: WalRecord, defer_graph: bool = False, threads: int = 0) -> int:
        removed = 0
        if rec.op == "remove" or len(rec.discard):
            drop = rec.ids if rec.op == "remove" else rec.discard
            present = [int(i) for i in drop if int(i) in self.index]
            if present:
                self.index.remove(present, threads=threads)
            removed = len(present)
        if rec.op == "add" and len(rec.ids):
            self.index.add(
                rec.vectors,
                rec.ids,
                metadata=rec.metadata,
                texts=rec.texts,
                defer_graph=defer_graph and self.index.kind == "hnsw",
                threads=threads,
            )
        return removed

    def _write(self, rec: WalRecord, defer_graph: bool = False, threads: int = 0) -> int:
        with self._lock:
            if self._broken is not None:
                raise StorageError(errno.EIO, self._broken)
            rec.seq = self.seq + 1
            if len(rec.discard):  # log only the ids this shard really drops
                rec.discard = np.array([i for i in rec.discard.tolist() if i in self.index], np.int64)
            if rec.op == "add" and not len(rec.ids) and not len(rec.discard):
                return 0  # nothing to change, nothing to log
            removed = self._apply_record(rec, defer_graph, threads)
            if rec.op == "remove" and not removed:
                return 0
            self.seq = rec.seq
            try:
                if self.durability == "wal":
                    assert self._wal is not None
                    self._wal.append(rec)
                    if self._wal.bytes > self.checkpoint_bytes:
                        self._checkpoint_locked()
                else:
                    self._checkpoint_locked()
            except (OSError, StorageError) as exc:
                self._broken = (
                    f"shard {self.shard} could not make a write durable ({exc}); it must be restarted from disk"
                )
                raise StorageError(errno.EIO, self._broken) from exc
            return removed

    # -- the operations a ShardedIndex sends ---------------------------------------------
    @property
    def broken(self) -> bool:
        return self._broken is not None

    def apply(
        self,
        vectors: np.ndarray,
        ids: np.ndarray,
        metadata: Any,
        texts: list[str | None] | None,
        discard: np.ndarray,
        defer_graph: bool = False,
        threads: int = 0,
    ) -> int:
        """Drops the ``discard`` ids this shard holds (rows now routed to another shard), then
        adds (upserts) the rows; durable on return. Returns how many ids were dropped.
        ``defer_graph`` and ``threads`` as for :meth:`kbcore.Index.add` (a replay links rows
        at once)."""
        return self._write(WalRecord(0, "add", vectors, ids, discard, metadata, texts), defer_graph, threads)

    def discard(self, ids: np.ndarray, threads: int = 0) -> int:
        """Removes those of ``ids`` that this shard holds; durable on return. Returns the count."""
        return self._write(
            WalRecord(
                0, "remove", np.empty((0, 0), np.float32), np.asarray(ids, np.int64), np.empty(0, np.int64), None, None
            ),
            threads=threads,
        )

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """A bool mask: which ids this shard holds."""
        return np.fromiter((int(i) in self.index for i in ids), bool, len(ids))

    def checkpoint(self) -> int:
        """Saves the index and restarts the log; returns the sequence number it covers."""
        with self._lock:
            if self._broken is not None:
                raise StorageError(errno.EIO, self._broken)
            self._checkpoint_locked()
            return self.seq

    def search(
        self, queries: np.ndarray, k: int, where: Any, ef: int | None, threads: int
    ) -> tuple[np.ndarray, np.ndarray]:
        ids, dist = self.index.search(queries, k, where=where, ef=ef, threads=threads)
        return ids, dist

    def search_timed(
        self, queries: np.ndarray, k: int, where: Any, ef: int | None, threads: int
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """:meth:`search` plus the seconds it took inside this process (for benchmarks)."""
        t0 = time.perf_counter()
        ids, dist = self.index.search(queries, k, where=where, ef=ef, threads=threads)
        return ids, dist, time.perf_counter() - t0

    def search_groups(
        self, queries: np.ndarray, k: int, group_by: str, group_size: int, where: Any, ef: int | None, threads: int
    ) -> Any:
        return self.index.search_groups(
            queries, k, group_by=group_by, group_size=group_size, where=where, ef=ef, threads=threads
        )

    def text_stats(self, query: str) -> tuple[int, int, dict[str, int]]:
        return self.index.text_stats(query)

    def search_text(self, query: str, k: int, where: Any, stats: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search_text(query, k, where=where, stats=stats)

    def get_metadata(self, ids: np.ndarray) -> dict[int, dict[str, Any]]:
        """Metadata of those of ``ids`` this shard holds, by id."""
        held = [int(i) for i in ids if int(i) in self.index]
        return dict(zip(held, self.index.get_metadata(held))) if held else {}

    def document_ids(self, key: str, value: Any) -> np.ndarray:
        """Ids of the rows whose metadata ``key`` equals ``value`` (exact, via the filter)."""
        where = {key: value}
        n = self.index.count(where)
        if n == 0:
            return np.empty(0, np.int64)
        # A filtered search returns k rows when at least k pass: with k = the passing count it
        # returns exactly the passing rows (any valid query vector will do).
        ids, _ = self.index.search(
            np.ones(self.index.dim, np.float32), n, where=where, ef=max(n, self.index.ef), threads=1
        )
        return ids[ids >= 0]

    def remove_document(self, key: str, value: Any) -> int:
        """Removes every row whose ``key`` equals ``value``; durable on return. Returns the count."""
        ids = self.document_ids(key, value)
        return self.discard(ids) if len(ids) else 0

    def build_graph(self, max_rows: int | None, threads: int) -> int:
        return self.index.build_graph(max_rows, threads=threads) if self.index.kind == "hnsw" else 0

    def pending(self) -> int:
        return self.index.pending if self.index.kind == "hnsw" else 0

    def reorder_due(self) -> bool:
        return self.index.kind == "hnsw" and self.index.reorder_due

    def reorder_if_due(self) -> bool:
        """Renumbers this shard's slots for locality when its index has doubled past
        ``REORDER_MIN_ROWS`` (Index.reorder_due); whether it did."""
        if not self.reorder_due():
            return False
        self.index.reorder()
        return True

    def get_vectors(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        """Stored vectors of those of ``ids`` this shard holds, by id."""
        held = [int(i) for i in ids if int(i) in self.index]
        return dict(zip(held, self.index.get_vectors(held))) if held else {}

    def count(self, where: Any) -> int:
        return self.index.count(where)

    def size(self) -> int:
        return len(self.index)

    def text_documents(self) -> int:
        return self.index.text_documents()

    def ids(self) -> np.ndarray:
        return self.index.ids()

    def info(self) -> dict[str, Any]:
        """Size, sequence number, log bytes and how many records the last recovery replayed."""
        return {
            "shard": self.shard,
            "rows": len(self.index),
            "seq": self.seq,
            "wal_bytes": 0 if self._wal is None else self._wal.bytes,
            "replayed": self.replayed,
            "directory": self.directory,
            "pid": os.getpid(),
            "durability": self.durability,
            "memory_bytes": self.index.memory_usage(),
            # the graph links read in place from the checkpoint file (mmap=True, reopened)
            "in_place": self.index.in_place,
        }
