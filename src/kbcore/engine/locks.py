"""The reader/writer lock that orders searches against index mutations.

Lock order (see :mod:`kbcore.engine.commit`): the knowledge base's thread ``RLock`` ->
its ``FileLock`` -> :meth:`RWLock.write` -> the native index's own lock.
"""

from __future__ import annotations

import threading
from types import TracebackType


class RWLock:
    """Many readers or one writer; waiting writers go first. Not reentrant.

    ``with lock.read():`` and ``with lock.write():``; both return prebuilt context managers,
    so taking the lock costs no allocation (a search takes it once per call).
    """

    __slots__ = ("_cond", "_mutex", "_read", "_readers", "_waiting", "_write", "_writer")

    def __init__(self) -> None:
        #: the condition's own lock: readers take it directly (Condition.__enter__ is a Python
        #: call around the same acquire), and notify only when a writer waits
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer = False
        self._waiting = 0
        self._read = _ReadHold(self)
        self._write = _WriteHold(self)

    def read(self) -> _ReadHold:
        return self._read

    def write(self) -> _WriteHold:
        return self._write

    def _acquire_write(self) -> None:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True

    def _release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


class _ReadHold:
    __slots__ = ("_lock",)

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:  # _acquire_read, inline: a search takes it once per call
        lock = self._lock
        with lock._mutex:
            while lock._writer or lock._waiting:
                lock._cond.wait()
            lock._readers += 1

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        lock = self._lock
        with lock._mutex:
            lock._readers -= 1
            # Only writers wait for readers (readers wait for writers, which notify on release);
            # a waiting writer counted itself in _waiting under this lock before it waited.
            if not lock._readers and lock._waiting:
                lock._cond.notify_all()


class _WriteHold:
    __slots__ = ("_lock",)

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire_write()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._lock._release_write()
