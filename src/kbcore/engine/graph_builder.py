"""The background graph builder: links rows stored with ``defer_graph=True`` into the HNSW graph
in small batches, each holding the native write lock briefly, while searches continue (rows
not yet linked are searched exactly, so results never miss them). Once every row is linked it
renumbers the slots for locality when the index has doubled past 100k rows
(``Index.reorder_due``).

Knows only the index (through a callable that returns the current one), not segments or the
manifest. Every running builder is stopped at interpreter exit, so that no native build is in
flight while Python shuts down (the graph state is saved as pending).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..index import Index

#: Rows linked per native call: bounds how long a search may wait for the write lock.
BATCH_ROWS = 128


class GraphBuilder:
    """One knowledge base's builder thread (started on demand, stopped on close/delete)."""

    def __init__(self, name: str, current_index: Callable[[], Index | None]) -> None:
        self._name = name
        self._current_index = current_index
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._retired = False
        #: serialises start / stop / retire: a thread is created and started, or stopped and
        #: joined, as one step (a stop never sees a thread that is created but not started)
        self._lifecycle = threading.Lock()
        #: the builder linked rows since the index was last saved (checkpoint it at close)
        self.unsaved = False
        #: slot reorders this builder ran (Index.reorder_due), for tests and stats
        self.reorders = 0

    def start(self) -> None:
        """Starts the thread if there are rows to link and it is not running (never after
        :meth:`retire`)."""
        with self._lifecycle:
            if self._retired:
                return
            index = self._current_index()
            if index is None or index.kind != "hnsw" or index.pending == 0:
                return
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            _LIVE.add(self)
            thread = threading.Thread(target=self._run, name=f"kbcore-graph-{self._name}", daemon=True)
            thread.start()
            self._thread = thread

    def stop(self) -> None:
        """Stops the thread after its current batch and waits for it."""
        with self._lifecycle:
            self._stop_locked()

    def _stop_locked(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join()  # the thread never takes _lifecycle: no deadlock
            self._thread = None

    def retire(self) -> None:
        """Stops the thread for good (the knowledge base is closed or deleted); no
        :meth:`start` after it (even one that was already waiting) starts a thread."""
        with self._lifecycle:
            self._retired = True
            self._stop_locked()

    def mark_saved(self) -> None:
        """The index is about to be saved with every link made so far."""
        self.unsaved = False

    def wait(self, timeout: float | None, pending: Callable[[], int]) -> bool:
        """Waits until ``pending()`` is 0 and a reorder that follows the linking has ended;
        False if ``timeout`` seconds passed first or the builder is retired with rows left
        unlinked."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending():
            thread = self._thread
            if thread is None or not thread.is_alive():
                self.start()
                thread = self._thread
                if thread is None:  # nothing to link with (retired: closed or deleted)
                    return pending() == 0
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(timeout=0.05 if remaining is None else min(0.05, remaining))
            if deadline is not None and time.monotonic() >= deadline:
                return pending() == 0
        # Every row is linked; the thread may still be reordering the slots (it ends then).
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            return not thread.is_alive()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            index = self._current_index()
            if index is None:
                return
            if index.pending == 0:
                # Every row is linked: renumber the slots for locality when the index has grown
                # enough (Index.reorder_due: from 100k rows, at each doubling). The order is
                # computed while searches run; they wait only while the rows move.
                done = reorder_if_due(index)
                if done:
                    self.unsaved = True
                    self.reorders += done
                return
            index.build_graph(BATCH_ROWS)
            self.unsaved = True  # saved at the next checkpoint or close, so reopening does not relink


def reorder_if_due(index: Any) -> int:
    """Renumbers the slots of ``index`` where they are due (``Index.reorder_due``); returns
    how many indexes were reordered. A sharded knowledge base's ``ShardedIndex.reorder()``
    reorders each due shard in one call to the shards and counts them, so it is called as is
    (asking its ``reorder_due`` first would ask every shard twice)."""
    if not isinstance(index, Index):
        return int(index.reorder())
    if not index.reorder_due:
        return 0
    index.reorder()
    return 1


_LIVE: weakref.WeakSet[GraphBuilder] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for builder in list(_LIVE):
        builder.stop()
