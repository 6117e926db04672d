"""How a sharded index reaches its shards: the Ray actor that hosts one, the bytes a query and
its answer travel as, where the actors are placed, and the scatter/gather of one call over all
of them (retries while a shard restarts, the timeout, partial answers).

The compiled-graph path (:mod:`.compiled`) and the socket path (:mod:`.sockets`) are optional
fast lanes for read-only queries; everything else, and every fallback, goes through
:meth:`ShardCalls.gather`.
"""

from __future__ import annotations

import errno
import os
import pickle
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import KbcoreError, StorageError
from .compiled import CompiledScatter
from .sockets import SocketScatter

__all__ = [
    "ShardUnavailableError",
    "ShardCalls",
    "actor_class",
    "pack_request",
    "unpack_request",
    "unpack_reply",
    "ray_module",
    "spawn",
]

_RETRY_PAUSE = 0.05  # seconds between calls to a shard that is restarting
#: The read-only calls a compiled graph may carry (writes and checkpoints take the actor path).
_COMPILED_METHODS = frozenset({"search", "search_groups", "text_stats", "search_text", "count"})
#: What a shard's socket server answers: those, plus the read-only calls the benchmark and
#: the tests send (``search_timed``, ``size``).
_SOCKET_METHODS = _COMPILED_METHODS | {"search_timed", "size"}
_VECTOR_KINDS = {"search": b"V", "search_timed": b"T"}  # request kinds of an unfiltered vector search
_VECTOR_METHODS = {v: k for k, v in _VECTOR_KINDS.items()}
_VECTOR_HEAD = struct.Struct("<qqqqq")  # rows, dim, k, ef (-1: None), threads
_PICKLED_REQUEST = b"P"  # any other request: a pickle of (method, args)
_SEARCH_REPLY = b"S"  # a search answer: rows, cols (int64), ids int64[rows*cols], dists float32[...]
_SEARCH_HEAD = struct.Struct("<qq")  # a search answer's rows, cols
_PICKLED_REPLY = b"P"  # any other answer: a pickle


class ShardUnavailableError(KbcoreError, ConnectionError):
    """One or more shards did not answer within the timeout (dead, or restarting too slowly).

    ``shards`` lists their numbers; the message names them and the last error of each.
    """

    def __init__(self, shards: Sequence[int], message: str) -> None:
        super().__init__(message)
        self.shards = tuple(shards)


def ray_module() -> Any:
    """The ``ray`` package, or ImportError naming the extra that brings it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("kbcore.distributed needs Ray: pip install 'kbcore[ray]'") from exc
    return ray


_ACTOR_CLASS: Any = None


def actor_class() -> Any:
    """The Ray actor class wrapping a ShardState (built once, on first use)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is not None:
        return _ACTOR_CLASS
    ray = ray_module()

    class ShardActor:
        """Holds one ShardState; Ray re-runs __init__ after a crash, which recovers from disk."""

        def __init__(self, directory: str, options: dict[str, Any]) -> None:
            from .shard import ShardState

            # A shard that cannot open its directory (corrupted, unreadable) stays up and
            # answers every call with that error: restarting it would fail the same way.
            self._error: BaseException | None = None
            self._servers: dict[str, Any] = {}  # "unix" / "tcp" -> its ShardServer
            self._servers_lock = threading.Lock()
            try:
                self._state = ShardState(directory, **options)
            except (KbcoreError, OSError) as exc:
                self._error = exc

        def call(self, method: str, *args: Any) -> Any:
            if self._error is not None:
                raise self._error
            if self._state.broken:  # exiting: answer nothing from memory the disk lacks
                raise StorageError(errno.EIO, f"shard {self._state.shard} is restarting from disk")
            try:
                return getattr(self._state, method)(*args)
            except Exception:
                if self._state.broken:
                    # Memory holds a write the disk lacks: leave, so that Ray restarts this
                    # shard from disk (without the unacknowledged write).
                    threading.Timer(0.2, os._exit, args=(1,)).start()
                raise

        def query(self, request: bytes) -> bytes:
            """``call`` with the method and arguments in one payload (:func:`pack_request`) and the answer
            as bytes (the actor path's ``query.remote`` and the compiled graph both use it)."""
            method, args = unpack_request(request)
            return pack_reply(method, self.call(method, *args))

        def serve_socket(self, driver_node: str) -> dict[str, Any]:
            """Starts (once per family) this shard's socket server and returns how to reach
            it (:meth:`.sockets.ShardServer.describe`): a Unix-domain socket for a driver on
            this node (``driver_node``, a Ray node id), else TCP on this node's IP address."""
            from .sockets import ShardServer

            family = "unix" if driver_node == ray.get_runtime_context().get_node_id() else "tcp"
            with self._servers_lock:
                server = self._servers.get(family)
                if server is None:
                    server = ShardServer(
                        self._socket_answer,
                        _SOCKET_METHODS,
                        decode=unpack_request,
                        family=family,
                        host=ray.util.get_node_ip_address(),
                    )
                    self._servers[family] = server
            return server.describe()

        def _socket_answer(self, method: str, args: tuple[Any, ...]) -> bytes:
            # The same path as an actor call (``query``): errors, a broken shard's exit.
            return pack_reply(method, self.call(method, *args))

        def socket_stats(self) -> dict[str, Any]:
            """Per family: the socket server's :meth:`~.sockets.ShardServer.stats`."""
            with self._servers_lock:
                return {f: s.stats() for f, s in self._servers.items()}

        def stop_socket(self) -> dict[str, Any]:
            """Stops the socket servers (listeners, connections, threads); returns their stats."""
            with self._servers_lock:
                servers, self._servers = self._servers, {}
            return {f: s.stop() for f, s in servers.items()}

        def node(self) -> dict[str, Any]:
            ctx = ray.get_runtime_context()
            return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

        def ping(self) -> bool:
            if self._error is not None:
                raise self._error
            return True

    _ACTOR_CLASS = ray.remote(ShardActor)
    return _ACTOR_CLASS


def pack_request(method: str, args: tuple[Any, ...]) -> bytes:
    """One bytes payload for a call: Ray passes bytes without its per-argument serialisation.

    An unfiltered vector search (the common query) is a 41-byte header plus the raw float32
    queries, no pickle: ``V`` (``T`` for ``search_timed``), then rows, dim, k, ef (-1: the
    default) and threads as int64. Anything else is ``P`` + a pickle of (method, args)."""
    if method in _VECTOR_KINDS and len(args) == 5 and args[2] is None:
        q, k, _, ef, threads = args
        if (
            isinstance(q, np.ndarray)
            and q.dtype == np.float32
            and q.ndim == 2
            and q.flags.c_contiguous
            and type(k) is int
            and type(threads) is int
            and (ef is None or type(ef) is int)
        ):
            head = _VECTOR_HEAD.pack(q.shape[0], q.shape[1], k, -1 if ef is None else ef, threads)
            return b"".join((_VECTOR_KINDS[method], head, q.data))
    return _PICKLED_REQUEST + pickle.dumps((method, args), protocol=5)


def unpack_request(payload: bytes | memoryview) -> tuple[str, tuple[Any, ...]]:
    """The inverse of :func:`pack_request`: (method, args). A vector search's queries are a
    read-only view of ``payload``. Raises ``ValueError`` (or pickle's errors) for a payload
    that is not a request."""
    kind = bytes(payload[:1])
    if kind in _VECTOR_METHODS:
        rows, dim, k, ef, threads = _VECTOR_HEAD.unpack_from(payload, 1)
        if rows < 0 or dim <= 0 or len(payload) != 1 + _VECTOR_HEAD.size + 4 * rows * dim:
            raise ValueError(f"a search request of {len(payload)} bytes does not hold {rows} x {dim} float32")
        q = np.frombuffer(payload, np.float32, rows * dim, offset=1 + _VECTOR_HEAD.size).reshape(rows, dim)
        return _VECTOR_METHODS[kind], (q, k, None, None if ef == -1 else ef, threads)
    if kind != _PICKLED_REQUEST:
        raise ValueError(f"unknown request kind {kind!r}")
    method, args = pickle.loads(memoryview(payload)[1:])
    return method, args


def pack_reply(method: str, result: Any) -> bytes:
    """A shard's answer as bytes; a search answer as raw little arrays (no pickle)."""
    if method == "search":
        ids, dist = result
        ids = np.ascontiguousarray(ids, np.int64)
        dist = np.ascontiguousarray(dist, np.float32)
        head = _SEARCH_HEAD.pack(*ids.shape)
        return b"".join((_SEARCH_REPLY, head, ids.data, dist.data))
    return _PICKLED_REPLY + pickle.dumps(result, protocol=5)


def unpack_reply(payload: bytes) -> Any:
    """The inverse of :func:`pack_reply` (driver side; the shard is trusted, as Ray's own pickles are)."""
    if payload[:1] == _SEARCH_REPLY:
        rows, cols = _SEARCH_HEAD.unpack_from(payload, 1)
        n = rows * cols
        ids = np.frombuffer(payload, np.int64, n, offset=17).reshape(rows, cols)
        dist = np.frombuffer(payload, np.float32, n, offset=17 + 8 * n).reshape(rows, cols)
        return ids, dist
    return pickle.loads(memoryview(payload)[1:])


def unwrap(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _node_for(shard: int, nodes: list[dict[str, Any]]) -> str:
    ray = ray_module()
    want = nodes[shard]
    alive = [n for n in ray.nodes() if n.get("Alive")]
    for n in alive:
        if n["NodeID"] == want["node_id"]:
            return n["NodeID"]
    same_ip = [n for n in alive if n["NodeManagerAddress"] == want["ip"]]
    if len(same_ip) == 1:
        return same_ip[0]["NodeID"]
    raise ShardUnavailableError(
        [shard],
        f"shard {shard} lives on the local disk of node {want['ip']} "
        f"({want['node_id'][:12]}), which is not (uniquely) in the cluster",
    )


def spawn(
    root: str,
    manifest: dict[str, Any],
    *,
    max_restarts: int,
    num_cpus: float,
    max_concurrency: int,
    create: bool,
    write_manifest: Callable[[dict[str, Any]], None],
    mmap: bool = True,
) -> list[Any]:
    """Starts one actor per shard of ``manifest`` and returns their handles (shard i first..).

    Placement: with ``storage="local"`` each shard is pinned to the node recorded for it (its
    data is on that node's disk); otherwise round-robin over the live nodes with CPUs, as a
    soft preference. A new index (``create``) records the placement and is written by
    ``write_manifest`` before any actor starts. ``mmap``: how each shard reopens its
    checkpoint (:meth:`kbcore.Index.load`); not stored, an option of this open.
    """
    ray = ray_module()
    if not ray.is_initialized():
        ray.init()

    n = int(manifest["shards"])
    nodes = manifest.get("nodes")
    local = manifest["storage"] == "local"
    if local and nodes is not None:
        placement = nodes  # each shard's data is on that node's disk
    else:
        # Round-robin over the live nodes that have CPUs (a head kept free with
        # --num-cpus 0 gets no shard). "local" records this placement for good; "shared"
        # uses it as a preference (soft), so a restart may land on another node.
        alive = [x for x in ray.nodes() if x.get("Alive")]
        with_cpus = [x for x in alive if x.get("Resources", {}).get("CPU", 0) > 0]
        alive = sorted(with_cpus or alive, key=lambda x: x["NodeID"])
        placement = [
            {"node_id": alive[i % len(alive)]["NodeID"], "ip": alive[i % len(alive)]["NodeManagerAddress"]}
            for i in range(n)
        ]
        if local:
            nodes = placement
    if create:
        manifest["nodes"] = nodes
        write_manifest(manifest)
    cls = actor_class()
    actors: list[Any] = []
    try:
        for i in range(n):
            actors.append(
                _start_shard(cls, root, i, manifest, placement, local, max_restarts, num_cpus, max_concurrency, mmap)
            )
    except BaseException:
        for a in actors:  # do not leave the shards started so far running
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        raise
    return actors


def _start_shard(
    cls: Any,
    root: str,
    i: int,
    manifest: dict[str, Any],
    placement: list[dict[str, Any]],
    local: bool,
    max_restarts: int,
    num_cpus: float,
    max_concurrency: int,
    mmap: bool = True,
) -> Any:
    """Starts the actor of shard ``i`` on its node (see :func:`spawn`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {
        "max_restarts": max_restarts,
        "max_task_retries": 0,
        "num_cpus": num_cpus,
        "max_concurrency": max_concurrency,
    }
    if local:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(_node_for(i, placement), soft=False)
    else:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(placement[i]["node_id"], soft=True)
    shard_options = {
        "shard": i,
        "dim": int(manifest["dim"]),
        "metric": manifest["metric"],
        "kind": manifest["kind"],
        "index_options": manifest["index_options"],
        "durability": manifest["durability"],
        "checkpoint_bytes": manifest["checkpoint_bytes"],
        "mmap": mmap,
    }
    return cls.options(**options).remote(shard_dir(root, i), shard_options)


def shard_dir(root: str, i: int) -> str:
    """The directory of shard ``i`` under the index's ``root``."""
    return os.path.join(root, f"shard-{i:04d}")


class ShardCalls:
    """One call to every shard (or some), in parallel, with the failure rules of
    ``docs/scale-out.md``: a dead or restarting shard is retried until ``timeout``, then
    :class:`ShardUnavailableError` names it (or, with ``allow_partial``, the answers of the
    others are returned); a shard's own error is re-raised as is."""

    def __init__(self, actors: list[Any], path: str, timeout: float, max_restarts: int) -> None:
        self.actors = actors
        self.n = len(actors)
        self.path = path
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.compiled: CompiledScatter | None = None
        self.socket: SocketScatter | None = None

    def start_sockets(self) -> SocketScatter:
        """Connects the socket path (``transport="socket"``): every shard starts its server."""
        ray = ray_module()
        node = ray.get_runtime_context().get_node_id()

        def fetch(shards: list[int]) -> dict[int, dict[str, Any]]:
            refs = {i: self.actors[i].serve_socket.remote(node) for i in shards}
            deadline = time.monotonic() + self.timeout
            out: dict[int, dict[str, Any]] = {}
            for i, ref in refs.items():
                try:
                    out[i] = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001))
                except Exception:  # noqa: BLE001 - down or restarting: the actor path decides
                    pass
            return out

        self.socket = SocketScatter(self.n, fetch, timeout=self.timeout)
        return self.socket

    def gather(
        self,
        submit: Callable[[int], Any],
        shards: Sequence[int] | None = None,
        *,
        allow_partial: bool = False,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """Runs ``submit(shard)`` (which returns a Ray object ref) on each shard in parallel and returns
        {shard: result}.

        A shard whose actor is dead or restarting is called again (after a short pause)
        until the timeout; then :class:`ShardUnavailableError`, or, with ``allow_partial``,
        the results without it. An error raised by the shard itself is re-raised as is.
        """
        ray = ray_module()
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        todo = list(range(self.n)) if shards is None else list(shards)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        refs = {i: submit(i) for i in todo}
        try:  # the common case: every shard answers
            values = ray.get([refs[i] for i in todo], timeout=timeout)
            return dict(zip(todo, values))
        except (RayActorError, ActorUnavailableError, GetTimeoutError):
            pass
        except Exception as exc:  # noqa: BLE001 - a shard's own error (RayTaskError)
            raise unwrap(exc) from None
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        pending = {refs[i]: i for i in todo}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=remaining)
            if not ready:
                break
            for ref in ready:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except (RayActorError, ActorUnavailableError) as exc:
                    errors[i] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                    if self.max_restarts != 0 and time.monotonic() + _RETRY_PAUSE < deadline:
                        time.sleep(_RETRY_PAUSE)
                        pending[submit(i)] = i
                except Exception as exc:  # noqa: BLE001
                    raise unwrap(exc) from None
        missing = sorted(set(todo) - results.keys())
        if missing and not allow_partial:
            detail = "; ".join(f"shard {i}: {errors.get(i, 'no answer')}" for i in missing)
            raise ShardUnavailableError(
                missing,
                f"shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                f"of {self.path!r} did not answer within {timeout:g} s ({detail})",
            )
        return results

    def call(
        self,
        method: str,
        args: Callable[[int], tuple[Any, ...]] | tuple[Any, ...],
        shards: Sequence[int] | None = None,
        *,
        allow_partial: bool = False,
    ) -> dict[int, Any]:
        """Calls ShardState.``method`` on each shard: with ``args``, or ``args(shard)``.

        The same ``args`` for every shard travel as one payload per call (:func:`pack_request`;
        and, for a
        read-only query to every shard with ``transport="compiled"``, through the compiled
        graph when it is free); per-shard ``args`` (writes, large arrays) as Ray arguments.
        """
        if callable(args):
            make = args
            return self.gather(
                lambda i: self.actors[i].call.remote(method, *make(i)), shards, allow_partial=allow_partial
            )
        request = pack_request(method, args)
        sock = self.socket
        if sock is not None and shards is None and method in _COMPILED_METHODS:
            answers = sock.call(request, self.timeout)  # a shard's own error propagates
            if answers is not None:
                return {i: unpack_reply(a) for i, a in enumerate(answers)}
        compiled = self.compiled
        if compiled is not None and shards is None and method in _COMPILED_METHODS:
            try:
                answers = compiled.call(request, self.timeout)
            except Exception as exc:  # noqa: BLE001 - a shard's own error, as the actor path raises it
                raise unwrap(exc) from None
            if answers is not None:
                return {i: unpack_reply(a) for i, a in enumerate(answers)}
        got = self.gather(lambda i: self.actors[i].query.remote(request), shards, allow_partial=allow_partial)
        if sock is not None:
            sock.refresh(got)  # reconnect shards that answered here but lost their socket
        return {i: unpack_reply(a) for i, a in got.items()}

    def close(self) -> None:
        """Stops the compiled graph (first, so that no execution loop is left waiting), the
        socket path (the driver's connections, then every shard's server) and the actors."""
        ray = ray_module()
        compiled, self.compiled = self.compiled, None
        if compiled is not None:
            compiled.close()
        sock, self.socket = self.socket, None
        if sock is not None:
            sock.close()
            try:  # bounded: a dead shard's server is gone with its process
                ray.get([a.stop_socket.remote() for a in self.actors], timeout=5)
            except Exception:  # noqa: BLE001 - a shard is dead or restarting
                pass
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
