"""What the plugin process has done, per knowledge base, for the console page.

The knowledge engine records every retrieval and every ingest (its duration, whether it
failed, how many results or chunks); the console page (``components/pages/kbcore_console``)
reads a snapshot. Counters live in memory and start again with the plugin process: they
describe this run, and the page says since when. Latency percentiles are over the last
:data:`WINDOW` calls of each kind. Thread-safe: the engine records from its event loop and
from worker threads.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

#: Calls per knowledge base and kind whose durations the percentiles are taken over.
WINDOW = 1000
#: Longest error message kept (the latest per knowledge base).
ERROR_CHARS = 300


def _percentile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (0..1) by the nearest-rank rule, None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class _Kind:
    """Counters of one kind of call (retrieve or ingest) of one knowledge base."""

    __slots__ = ("calls", "errors", "items", "seconds", "last_at")

    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.items = 0  # results returned, or chunks ingested
        self.seconds: deque[float] = deque(maxlen=WINDOW)
        self.last_at: float | None = None

    def add(self, seconds: float, ok: bool, items: int, at: float) -> None:
        self.calls += 1
        self.errors += 0 if ok else 1
        self.items += items
        self.seconds.append(seconds)
        self.last_at = at

    def snapshot(self) -> dict[str, Any]:
        ms = [s * 1000.0 for s in self.seconds]
        p50, p95 = _percentile(ms, 0.5), _percentile(ms, 0.95)
        return {
            "calls": self.calls,
            "errors": self.errors,
            "items": self.items,
            "ms_p50": None if p50 is None else round(p50, 3),
            "ms_p95": None if p95 is None else round(p95, 3),
            "last_at": self.last_at,
        }


class Telemetry:
    """Per knowledge base (LangBot's id): retrieve and ingest counters, the latest error."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kbs: dict[str, dict[str, Any]] = {}
        self.since = time.time()

    def _kb(self, kb_id: str) -> dict[str, Any]:
        kb = self._kbs.get(kb_id)
        if kb is None:
            kb = self._kbs[kb_id] = {"retrieve": _Kind(), "ingest": _Kind(), "last_error": None}
        return kb

    def record(self, kind: str, kb_id: str, seconds: float, *, items: int = 0, error: str | None = None) -> None:
        """One call of ``kind`` ("retrieve" or "ingest") that took ``seconds``; ``error`` is its
        failure's message (None: it succeeded)."""
        if kind not in ("retrieve", "ingest"):
            raise ValueError(f"unknown call kind {kind!r}")
        now = time.time()
        with self._lock:
            kb = self._kb(str(kb_id))
            kb[kind].add(max(0.0, float(seconds)), error is None, int(items), now)
            if error is not None:
                kb["last_error"] = {"kind": kind, "at": now, "message": str(error)[:ERROR_CHARS]}

    def snapshot(self) -> dict[str, Any]:
        """{"since": start time, "knowledge_bases": {kb_id: {"retrieve": ..., "ingest": ...,
        "last_error": ...}}}; times are Unix seconds."""
        with self._lock:
            kbs = {
                kb_id: {
                    "retrieve": kb["retrieve"].snapshot(),
                    "ingest": kb["ingest"].snapshot(),
                    "last_error": kb["last_error"],
                }
                for kb_id, kb in self._kbs.items()
            }
            return {"since": self.since, "knowledge_bases": kbs}

    def forget(self, kb_id: str) -> None:
        """Drops a deleted knowledge base's counters."""
        with self._lock:
            self._kbs.pop(str(kb_id), None)

    def clear(self) -> None:
        """Starts every counter again from now."""
        with self._lock:
            self._kbs.clear()
            self.since = time.time()
