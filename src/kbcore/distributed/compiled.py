"""The compiled scatter path: one Ray Compiled Graph that sends a request to every shard.

A compiled graph (``ray.dag`` InputNode -> ``shard.query`` on every actor -> MultiOutputNode,
``experimental_compile()``) replaces the per-call task submission, scheduling and object
store of an actor call with pre-allocated shared-memory channels: the driver writes the
request once, each shard's execution loop reads it, answers into its own channel, and the
driver reads the answers. It is an *accelerator* of the ordinary actor-call path, never a
replacement:

- one execution at a time (``CompiledDAG.execute`` is not thread-safe): a caller that finds
  the graph busy, torn down or being rebuilt gets ``None`` from :meth:`CompiledScatter.call`
  and uses the actor path;
- an error raised by a shard's own code (bad filter, storage error) is re-raised as the
  actor path raises it, and the graph stays usable;
- any system error (an actor died or restarts, a channel closed, a timeout) tears the graph
  down and returns ``None`` so that the caller repeats the call on the actor path, which
  owns the retry, the timeout naming the shard, and ``allow_partial``. A background thread
  compiles a new graph once every shard answers a ping again;
- while a graph exists every shard's execution loop polls its input channel (Ray's
  shared-memory reader busy-waits with ``sched_yield``): an idle shard costs CPU. The graph
  is therefore torn down after ``idle`` seconds without a call and rebuilt in the background
  on the next call (which meanwhile uses the actor path).

Thread safety: :meth:`CompiledScatter.call` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["CompiledScatter"]

_log = logging.getLogger(__name__)
_REBUILD_PAUSE = 1.0  # seconds between attempts to rebuild a torn-down graph
_PING_TIMEOUT = 10.0  # seconds a rebuild waits for every shard to answer a ping


class _ShardError(Exception):
    """Carries an error raised by a shard's own code out of the compiled read."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class CompiledScatter:
    """A compiled graph over ``actors`` (each with ``query(bytes) -> bytes`` and ``ping()``),
    kept alive while calls flow and rebuilt after failures.

    ``probe`` is a cheap request every new graph executes once before it serves calls: it
    checks the graph end to end and registers the driver on every channel (Ray 2.60 aborts
    the driver process if a graph that never ran is torn down after one of its actors died).
    ``idle`` is the number of seconds without a call after which the graph is torn down
    (``None``: never). ``build`` compiles at once (the caller waits); else the first call
    starts a background build.
    """

    def __init__(self, actors: list[Any], probe: bytes, *, idle: float | None = 10.0, build: bool = True) -> None:
        self._actors = list(actors)
        self._probe = probe
        self._idle = idle
        self._graph: Any = None
        self._use = threading.Lock()  # held for one execute + read
        self._state = threading.Condition()  # guards the fields below
        self._want = False  # a call found no graph: build one
        self._dead: list[Any] = []  # graphs discarded by a call, torn down by the thread
        self._closed = False
        self._last_call = time.monotonic()
        self.builds = 0  # graphs compiled so far (for tests and the benchmark)
        self.fallbacks = 0  # calls that met no usable graph
        self.last_error: str | None = None
        if build:
            self._build()
        self._thread = threading.Thread(target=self._run, name="kbcore-compiled-scatter", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether a compiled graph exists now."""
        return self._graph is not None

    # -- the query path -------------------------------------------------------------------
    def call(self, request: bytes, timeout: float) -> list[bytes] | None:
        """Sends ``request`` to every shard through the graph and returns their answers in
        shard order, or ``None`` if the caller must use the actor path (no graph, graph busy,
        or a system error, which also tears the graph down). Re-raises a shard's own error
        as the actor path would (``RayTaskError`` unwrapped by the caller)."""
        self._last_call = time.monotonic()
        if not self._use.acquire(blocking=False):
            self.fallbacks += 1
            return None
        try:
            graph = self._graph
            if graph is None:
                self._request_build()
                self.fallbacks += 1
                return None
            try:
                return self._execute(graph, request, timeout)
            except _ShardError as exc:
                raise exc.error from None
            except Exception as exc:  # noqa: BLE001 - any system error: the actor path decides
                self.last_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                self._discard(graph)
                self.fallbacks += 1
                return None
        finally:
            self._use.release()

    @staticmethod
    def _execute(graph: Any, request: bytes, timeout: float) -> list[bytes]:
        from ray.exceptions import RayTaskError

        refs = graph.execute(request)
        deadline = time.monotonic() + timeout
        out: list[bytes] = []
        shard_error: BaseException | None = None
        for ref in refs:  # read every answer, so the channels are free for the next call
            try:
                out.append(ref.get(timeout=max(deadline - time.monotonic(), 0.0)))
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if not isinstance(cause, Exception) or _is_system_error(cause):
                    raise
                shard_error = shard_error or exc
                out.append(b"")
        if shard_error is not None:
            raise _ShardError(shard_error)
        return out

    # -- building and tearing down ---------------------------------------------------------
    def _request_build(self) -> None:
        with self._state:
            self._want = True
            self._state.notify_all()

    def _discard(self, graph: Any) -> None:
        """Forgets ``graph`` (the caller holds ``_use``); the background thread tears it down."""
        if self._graph is graph:
            self._graph = None
        with self._state:
            self._dead.append(graph)
            self._want = True
            self._state.notify_all()

    def _teardown(self, graph: Any) -> None:
        try:
            graph.teardown()
        except Exception as exc:  # noqa: BLE001 - a graph whose actor died tears down with errors
            _log.debug("compiled graph teardown: %s", exc)

    def _build(self) -> bool:
        import ray
        from ray.dag import InputNode, MultiOutputNode

        try:
            ray.get([a.ping.remote() for a in self._actors], timeout=_PING_TIMEOUT)
            with InputNode() as inp:
                dag = MultiOutputNode([a.query.bind(inp) for a in self._actors])
            graph = dag.experimental_compile()
        except Exception as exc:  # noqa: BLE001 - a shard is down or restarting: retry later
            self.last_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            return False
        try:
            self._execute(graph, self._probe, _PING_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            self.last_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            self._teardown(graph)
            return False
        with self._use:
            if self._closed:
                self._teardown(graph)
                return False
            self._graph = graph
        self.builds += 1
        self._last_call = time.monotonic()
        return True

    def _run(self) -> None:
        import ray

        while True:
            if not ray.is_initialized():
                return  # Ray was shut down under us: nothing to build on (and no auto-init)
            with self._state:
                tick = _REBUILD_PAUSE if self._idle is None else min(_REBUILD_PAUSE, self._idle / 2)
                self._state.wait(timeout=tick)
                if self._closed:
                    return
                dead, self._dead = self._dead, []
                want, self._want = self._want, False
            for graph in dead:
                self._teardown(graph)
            idle_for = time.monotonic() - self._last_call
            if self._graph is not None and self._idle is not None and idle_for > self._idle:
                with self._use:  # no call is using it
                    graph, self._graph = self._graph, None
                if graph is not None:
                    self._teardown(graph)
                continue
            if want and self._graph is None and not self._build():
                with self._state:
                    self._want = True  # keep trying (after the pause)

    def close(self) -> None:
        """Tears the graph down and stops the background thread (the actors keep running)."""
        with self._state:
            self._closed = True
            dead, self._dead = self._dead, []
            self._state.notify_all()
        self._thread.join(timeout=60)
        with self._use:
            graph, self._graph = self._graph, None
        for g in [*dead, graph]:
            if g is not None:
                self._teardown(g)


def _is_system_error(exc: BaseException) -> bool:
    from ray.exceptions import RayError

    return isinstance(exc, RayError)
