"""A kbcore index sharded over Ray actors, with exact scatter-gather merges.

See ``docs/scale-out.md`` for deployment, the exactness guarantees and the failure model.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from .. import fusion as _fusion
from ..engine.storage import atomic_write_bytes
from ..errors import (
    FormatError,
    InvalidArgumentError,
    InvalidTypeError,
    NotFoundError,
)
from ..index import Index, IndexSpec, as_index_spec
from ..index.arrays import as_ids, as_vectors
from ..index.params import positive
from ..index.params import threads as check_threads
from .compiled import CompiledScatter
from .merge import merge_groups, merge_text, merge_top_k, subset_rows
from .routing import MAX_SHARDS, route, shard_of_key
from .transport import ShardCalls, ShardUnavailableError, pack_request, spawn

__all__ = ["ShardedIndex", "ShardUnavailableError", "PartialResult", "MANIFEST"]

MANIFEST = "sharded-index.json"
_FORMAT_NAME = "kbcore-sharded-index"
_FORMAT_VERSION = 1
_TRANSPORTS = ("actor", "compiled", "socket")


class PartialResult(NamedTuple):
    """What a call with ``allow_partial=True`` returns: ``value`` is what the call returns
    normally, computed over every shard but those in ``missing_shards`` (empty when complete)."""

    value: Any
    missing_shards: tuple[int, ...]


def spec_options(
    spec: IndexSpec | Mapping[str, Any], metric: str, kind: str, index_options: Mapping[str, Any]
) -> tuple[str, str, dict[str, Any]]:
    """(metric, kind, index options) of every shard's :class:`~kbcore.Index` for ``spec``: the
    options hold the fields that differ from their defaults (as the shard manifest always
    recorded them) and ``seed``. Raises InvalidArgumentError when ``metric`` / ``kind`` / an
    index option other than ``seed`` is given beside the spec."""
    if metric != "cosine" or kind != "hnsw" or set(index_options) - {"seed"}:
        raise InvalidArgumentError("pass either spec or metric / kind / index options, not both")
    spec = as_index_spec(spec)
    defaults = IndexSpec().to_dict()
    options = {k: v for k, v in spec.to_dict().items() if k not in ("metric", "kind") and v != defaults[k]}
    return spec.metric, spec.kind, {**options, **index_options}


class ShardedIndex:
    """An index of ``shards`` Ray actors, each a kbcore :class:`~kbcore.Index` on its own
    directory under ``path``, with the ``Index`` API and exact merges.

    Rows go to the shard given by a stable hash of their ``shard_key`` metadata value (rows
    without it: of their id), so every chunk of one document lives on one shard: grouped
    search by that key and :meth:`remove_document` stay shard-local and exact. An upsert that
    moves an id to another shard drops the old copy in the same call.

    Searches go to every shard in parallel; the merged top k is the top k of the union of
    the shards' top k (flat: what one index over the same rows returns, up to ties; HNSW:
    each shard searches its part with the full ``ef``). BM25 scores use corpus-wide
    statistics gathered from every shard first, so they equal those of one index.

    Writes return once every shard they touch has made them durable (``durability="wal"``:
    an fsynced write-ahead log plus checkpoints; ``"save"``: a checkpoint per write). A shard
    actor that dies is restarted by Ray (``max_restarts``) and recovers every acknowledged
    write from its directory. A call that meets a dead shard retries until ``timeout``
    seconds pass, then raises :class:`ShardUnavailableError` naming it; searches with
    ``allow_partial=True`` instead return a :class:`PartialResult` naming the missing shards.

    ``storage="shared"``: ``path`` is on a filesystem every node mounts (NFS, a cluster
    volume); shards spread over the nodes and may restart on any node. ``storage="local"``:
    ``path`` is a node-local directory; each shard is pinned to the node it was created on,
    whose disk holds its data.

    Thread safety: searches may run from many threads at once; writes from one
    ``ShardedIndex`` are serialised. Only one ``ShardedIndex`` may write a ``path`` at a time.
    """

    # About 600 lines: the whole Index API (add, remove, search, search_groups, search_text,
    # search_hybrid, get_metadata, ...), each method its argument checks, one scatter and one
    # merge. How calls reach the shards is transport.py; merges merge.py; a shard's state
    # shard.py; its log wal.py.

    #: The descriptor of the owner lock a knowledge base holds on its shards' directory
    #: (set and released by kbcore.engine.shards; None for a ShardedIndex used on its own).
    _kb_owner_fd: int | None = None

    def __init__(
        self,
        dim: int,
        metric: str = "cosine",
        kind: str = "hnsw",
        *,
        shards: int,
        path: str | os.PathLike[str],
        shard_key: str = "document_id",
        durability: str = "wal",
        checkpoint_bytes: int = 64 << 20,
        storage: str = "shared",
        max_restarts: int = -1,
        timeout: float = 30.0,
        start_timeout: float = 300.0,
        num_cpus: float = 0,
        max_concurrency: int = 4,
        transport: str | None = None,
        compiled_idle: float | None = 10.0,
        mmap: bool = True,
        spec: IndexSpec | Mapping[str, Any] | None = None,
        **index_options: Any,
    ) -> None:
        """Creates a new sharded index in the empty (or absent) directory ``path``.

        ``spec`` (an :class:`~kbcore.index.IndexSpec` or its dict) describes every shard's index
        whole; without it ``metric``, ``kind`` and ``index_options`` (``M``, ``ef_construction``,
        ``ef``, ``quantization``, ``bits``, ``rerank``, ``vectors``) are turned into one. ``seed``
        goes to every shard's :class:`~kbcore.Index`. ``max_restarts`` (-1 = unlimited) and ``num_cpus`` (CPUs
        reserved per shard actor) are Ray actor options; ``max_concurrency`` is the number of
        calls one shard serves at once. ``timeout`` bounds how long a call waits for a shard;
        ``start_timeout`` how long the constructor (and :meth:`load`) waits for every shard
        to start and recover its directory. ``transport`` is how read-only queries reach the
        shards: ``"actor"`` (one Ray actor call per shard) or ``"compiled"`` (a Ray Compiled
        Graph over shared-memory channels, falling back to actor calls whenever it is busy,
        torn down or being rebuilt; see ``docs/scale-out.md``) or ``"socket"`` (each shard
        serves them on its own Unix-domain socket, TCP from another node, with a token; any
        failure falls back to actor calls); default: the environment
        variable ``KBCORE_SHARD_TRANSPORT``, else ``"socket"`` where the platform has Unix-domain
        sockets and ``poll()`` (Linux, macOS), else ``"actor"``. ``compiled_idle``: seconds
        without a query after which the compiled graph is torn down (its shards stop polling
        their channels) and rebuilt on the next query; ``None`` keeps it. ``mmap``: how a shard
        reopens its checkpoint when it restarts (and at :meth:`load`), as
        :meth:`kbcore.Index.load`'s ``mmap``: True reads it in place from the file, False copies
        it into the shard's memory (a slower open, faster searches at scale). Raises
        :class:`~kbcore.errors.InvalidArgumentError` for bad options or a ``path`` that already
        holds an index (use :meth:`load`).
        """
        shards = positive("shards", shards)
        if shards > MAX_SHARDS:
            raise InvalidArgumentError(f"shards must be at most {MAX_SHARDS} (one Ray actor each), got {shards}")
        if spec is not None:
            metric, kind, index_options = spec_options(spec, metric, kind, index_options)
        Index(dim, metric, kind, **index_options)  # type: ignore[arg-type]  # validates the knobs (str checked at run time)
        if not isinstance(shard_key, str) or not shard_key:
            raise InvalidTypeError(f"shard_key must be a non-empty field name, got {shard_key!r}")
        if durability not in ("wal", "save"):
            raise InvalidArgumentError(f"durability must be 'wal' or 'save', got {durability!r}")
        if storage not in ("shared", "local"):
            raise InvalidArgumentError(f"storage must be 'shared' or 'local', got {storage!r}")
        root = os.path.abspath(os.fspath(path))
        if os.path.exists(os.path.join(root, MANIFEST)):
            raise InvalidArgumentError(f"{root!r} already holds a sharded index; open it with ShardedIndex.load")
        if os.path.isdir(root) and any(n.startswith("shard-") for n in os.listdir(root)):
            raise InvalidArgumentError(f"{root!r} holds shard directories but no {MANIFEST}: not an empty directory")
        manifest = {
            "format": _FORMAT_NAME,
            "version": _FORMAT_VERSION,
            "dim": int(dim),
            "metric": metric,
            "kind": kind,
            "shards": shards,
            "shard_key": shard_key,
            "durability": durability,
            "checkpoint_bytes": int(checkpoint_bytes),
            "storage": storage,
            "index_options": dict(index_options),
            "nodes": None,
        }
        self._open(
            root,
            manifest,
            max_restarts=max_restarts,
            timeout=timeout,
            start_timeout=start_timeout,
            num_cpus=num_cpus,
            max_concurrency=max_concurrency,
            transport=transport,
            compiled_idle=compiled_idle,
            mmap=mmap,
            create=True,
        )

    # -- construction ---------------------------------------------------------------------
    def _open(
        self,
        root: str,
        manifest: dict[str, Any],
        *,
        max_restarts: int,
        timeout: float,
        start_timeout: float,
        num_cpus: float,
        max_concurrency: int,
        transport: str | None,
        compiled_idle: float | None,
        mmap: bool,
        create: bool,
    ) -> None:
        self._calls: ShardCalls | None = None
        if type(mmap) is not bool:
            raise InvalidTypeError(f"mmap must be a bool, got {type(mmap).__name__}")
        if transport is None:
            from .sockets import AVAILABLE

            fallback = "socket" if AVAILABLE else "actor"
            transport = os.environ.get("KBCORE_SHARD_TRANSPORT", fallback) or fallback
        if transport not in _TRANSPORTS:
            raise InvalidArgumentError(f"transport must be 'actor', 'compiled' or 'socket', got {transport!r}")
        if compiled_idle is not None and (
            isinstance(compiled_idle, bool) or not isinstance(compiled_idle, (int, float)) or not compiled_idle > 0
        ):
            raise InvalidArgumentError(
                f"compiled_idle must be a positive number of seconds or None, got {compiled_idle!r}"
            )
        if transport == "socket":
            from .sockets import AVAILABLE

            if not AVAILABLE:
                raise InvalidArgumentError(
                    "transport='socket' needs Unix-domain sockets and poll(), which this platform lacks"
                )
        self._transport = transport
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)) or not start_timeout > 0:
            raise InvalidArgumentError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise InvalidArgumentError(f"max_restarts must be an integer >= -1, got {max_restarts!r}")
        self._path = root
        self._manifest = manifest
        self._dim = int(manifest["dim"])
        self._metric = manifest["metric"]
        self._kind = manifest["kind"]
        self._n = int(manifest["shards"])
        self._shard_key = manifest["shard_key"]
        self._write_lock = threading.Lock()
        self._ef = int(manifest["index_options"].get("ef", 64))

        def write_manifest(m: dict[str, Any]) -> None:
            os.makedirs(root, exist_ok=True)
            atomic_write_bytes(os.path.join(root, MANIFEST), json.dumps(m, indent=1).encode())

        actors = spawn(
            root,
            manifest,
            max_restarts=max_restarts,
            num_cpus=num_cpus,
            max_concurrency=max_concurrency,
            mmap=mmap,
            create=create,
            write_manifest=write_manifest,
        )
        self._calls = ShardCalls(actors, root, float(timeout), max_restarts)
        # Every shard has opened (recovered) its directory before the constructor returns.
        try:
            self._scatter_method(lambda i: actors[i].ping.remote(), timeout=start_timeout)
        except BaseException:
            self.close()
            raise
        if transport == "compiled":
            # Built now, so the first query uses it; if that fails, queries take the actor
            # path and the graph is rebuilt in the background.
            self._calls.compiled = CompiledScatter(actors, pack_request("size", ()), idle=compiled_idle)
        elif transport == "socket":
            # Every shard starts its server now; a shard that cannot is reached by actor
            # calls, and its address is fetched again after one of them succeeds.
            self._calls.start_sockets()

    def _scatter_method(
        self,
        submit: Callable[[int], Any],
        shards: Sequence[int] | None = None,
        *,
        allow_partial: bool = False,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """:meth:`ShardCalls.gather`: ``submit(shard)`` on each shard, {shard: result}."""
        return self._live_calls().gather(submit, shards, allow_partial=allow_partial, timeout=timeout)

    def _scatter(
        self,
        method: str,
        args: Callable[[int], tuple[Any, ...]] | tuple[Any, ...],
        shards: Sequence[int] | None = None,
        *,
        allow_partial: bool = False,
    ) -> dict[int, Any]:
        """:meth:`ShardCalls.call`: ShardState.``method`` on each shard, {shard: result}."""
        return self._live_calls().call(method, args, shards, allow_partial=allow_partial)

    def _live_calls(self) -> ShardCalls:
        calls = self._calls
        if calls is None or not calls.actors:
            raise InvalidArgumentError(f"the sharded index at {self._path!r} is closed; open it with ShardedIndex.load")
        return calls

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        max_restarts: int = -1,
        timeout: float = 30.0,
        start_timeout: float = 300.0,
        num_cpus: float = 0,
        max_concurrency: int = 4,
        transport: str | None = None,
        compiled_idle: float | None = 10.0,
        mmap: bool = True,
    ) -> ShardedIndex:
        """Opens the sharded index in ``path``: one actor per shard, each recovering its last
        checkpoint plus its write-ahead log (the options as for the constructor). Raises
        ``FileNotFoundError`` if there is none and
        :class:`~kbcore.errors.FormatError` if its manifest is corrupted or newer."""
        root = os.path.abspath(os.fspath(path))
        mpath = os.path.join(root, MANIFEST)
        if not os.path.exists(mpath):
            raise FileNotFoundError(errno.ENOENT, "No sharded index (no manifest) in", root)
        try:
            with open(mpath, "rb") as f:
                manifest = json.loads(f.read())
            ok = (
                manifest["format"] == _FORMAT_NAME
                and isinstance(manifest["shards"], int)
                and 0 < manifest["shards"] <= MAX_SHARDS
                and isinstance(manifest["dim"], int)
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(errno.EINVAL, f"sharded index manifest {mpath!r} is corrupted") from exc
        if not ok:
            raise FormatError(errno.EINVAL, f"{mpath!r} is not a kbcore sharded index manifest")
        if manifest["version"] != _FORMAT_VERSION:
            raise FormatError(
                errno.EINVAL, f"{mpath!r} has format version {manifest['version']}, this kbcore reads {_FORMAT_VERSION}"
            )
        obj = cls.__new__(cls)
        obj._open(
            root,
            manifest,
            max_restarts=max_restarts,
            timeout=timeout,
            start_timeout=start_timeout,
            num_cpus=num_cpus,
            max_concurrency=max_concurrency,
            transport=transport,
            compiled_idle=compiled_idle,
            mmap=mmap,
            create=False,
        )
        return obj

    @staticmethod
    def _finish(value: Any, missing: Sequence[int], allow_partial: bool) -> Any:
        return PartialResult(value, tuple(missing)) if allow_partial else value

    # -- properties -----------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def metric(self) -> str:
        return self._metric

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def shards(self) -> int:
        return self._n

    @property
    def shard_key(self) -> str:
        return self._shard_key

    @property
    def path(self) -> str:
        return self._path

    @property
    def ef(self) -> int:
        """Default HNSW candidate list size of each shard's search."""
        return self._ef

    @property
    def transport(self) -> str:
        """How read-only queries reach the shards: ``"actor"``, ``"compiled"`` or ``"socket"``."""
        return self._transport

    def transport_stats(self) -> dict[str, Any]:
        """The fast path's state: whether a graph exists now (``"socket"``: every shard's
        address is known), graphs built (``"socket"``: connections opened), calls that fell
        back to actor calls, and its last system error (all zero/None for ``"actor"``);
        ``"socket"`` adds ``reconnects`` (shard addresses fetched again after a failure)."""
        sock = self._calls.socket if self._calls is not None else None
        if sock is not None:
            return {
                "transport": self._transport,
                "ready": sock.ready,
                "builds": sock.connects,
                "fallbacks": sock.fallbacks,
                "last_error": sock.last_error,
                "reconnects": sock.reconnects,
            }
        c = self._calls.compiled if self._calls is not None else None
        if c is None:
            return {"transport": self._transport, "ready": False, "builds": 0, "fallbacks": 0, "last_error": None}
        return {
            "transport": self._transport,
            "ready": c.ready,
            "builds": c.builds,
            "fallbacks": c.fallbacks,
            "last_error": c.last_error,
        }

    def shard_actors(self) -> list[Any]:
        """The Ray actor handles, one per shard (shard i is element i)."""
        return list(self._calls.actors) if self._calls is not None else []

    def shard_nodes(self) -> list[dict[str, Any]]:
        """Where each shard's actor runs now: ``{"node_id", "ip", "pid"}`` per shard."""
        actors = self.shard_actors()
        placed = self._scatter_method(lambda i: actors[i].node.remote())
        return [placed[i] for i in range(self._n)]

    def shard_info(self) -> list[dict[str, Any]]:
        """Per shard: rows, sequence number, log bytes, rows replayed at its last recovery..."""
        got = self._scatter("info", ())
        return [got[i] for i in range(self._n)]

    def shard_of(self, metadata: Mapping[str, Any] | None, id: int) -> int:
        """The shard a row with this metadata and id goes to."""
        return int(route(np.array([id], np.int64), [metadata], self._shard_key, self._n)[0])

    # -- mutation -------------------------------------------------------------------------
    def add(
        self,
        vectors: npt.ArrayLike,
        ids: npt.ArrayLike,
        *,
        metadata: Sequence[Mapping[str, Any] | None] | Any | None = None,
        texts: Sequence[str | None] | None = None,
        defer_graph: bool = False,
        threads: int = 0,
    ) -> None:
        """Adds (upserts) rows as :meth:`kbcore.Index.add` does, each on the shard of its
        ``shard_key`` value; returns once every shard has made its part durable.

        An id already stored on another shard (its key value changed) is removed there in the
        same call. ``defer_graph`` and ``threads`` apply on each shard as in ``Index.add``.
        Raises as ``Index.add`` for bad input (nothing is written), and
        :class:`ShardUnavailableError` if a shard stays unreachable for ``timeout``; the
        call may then have reached the other shards, and repeating it is safe (an upsert).
        """
        arr, _ = as_vectors(vectors, self._dim, "vectors")
        id_arr = as_ids(ids)
        nthreads = check_threads(threads)
        n = arr.shape[0]
        if len(id_arr) != n:
            raise InvalidArgumentError(f"got {n} vectors but {len(id_arr)} ids")
        uniq, counts = np.unique(id_arr, return_counts=True)
        if len(uniq) != n:
            raise InvalidArgumentError(f"duplicate id {int(uniq[counts > 1][0])} in one batch")
        if metadata is not None and type(metadata).__name__ == "RecordBatch":
            import pyarrow as pa

            metadata = pa.Table.from_batches([metadata])
        if metadata is not None and type(metadata).__module__.split(".")[0] != "pyarrow":
            if isinstance(metadata, (str, bytes, Mapping)) or not isinstance(metadata, Sequence):
                raise InvalidTypeError(
                    "metadata must be a list of dicts (one per row) or a pyarrow Table / "
                    f"RecordBatch, got {type(metadata).__name__}"
                )
            if len(metadata) != n:
                raise InvalidArgumentError(f"got {n} vectors but {len(metadata)} metadata rows")
        elif metadata is not None and cast(Any, metadata).num_rows != n:  # a pyarrow Table here
            raise InvalidArgumentError(f"got {n} vectors but {cast(Any, metadata).num_rows} metadata rows")
        if texts is not None:
            if isinstance(texts, str) or not isinstance(texts, Sequence):
                raise InvalidTypeError("texts must be a list of str (or None per row)")
            if len(texts) != n:
                raise InvalidArgumentError(f"got {n} vectors but {len(texts)} texts")
            bad = next((t for t in texts if t is not None and not isinstance(t, str)), None)
            if bad is not None:
                raise InvalidTypeError(f"texts must be str or None, got {type(bad).__name__}")
            texts = list(texts)
        where = route(id_arr, metadata, self._shard_key, self._n)
        parts = {}
        for s in range(self._n):
            idx = np.flatnonzero(where == s)
            parts[s] = (
                arr[idx],
                id_arr[idx],
                subset_rows(metadata, idx) if len(idx) else None,
                [texts[i] for i in idx.tolist()] if texts is not None and len(idx) else None,
                id_arr[where != s] if self._n > 1 else np.empty(0, np.int64),
                bool(defer_graph),
                nthreads,
            )
        with self._write_lock:
            self._scatter("apply", parts.__getitem__)

    def remove(self, ids: npt.ArrayLike, *, threads: int = 0) -> None:
        """Removes ids, wherever they are; durable on return (``threads`` per shard, as for
        :meth:`kbcore.Index.remove`).

        Raises :class:`~kbcore.errors.NotFoundError` (a ``KeyError``) if any id is absent, in
        which case nothing is removed.
        """
        id_arr = np.unique(as_ids(ids))
        nthreads = check_threads(threads)
        if not len(id_arr):
            return
        with self._write_lock:
            held = self._scatter("holds", (id_arr,))
            found = np.zeros(len(id_arr), bool)
            for mask in held.values():
                found |= mask
            if not found.all():
                raise NotFoundError(f"ids not in the index: {id_arr[~found][:10].tolist()}")
            owners = [s for s in range(self._n) if held[s].any()]
            self._scatter("discard", lambda s: (id_arr[held[s]], nthreads), owners)

    def remove_document(self, value: int | str) -> int:
        """Removes every row whose ``shard_key`` equals ``value`` (one shard's work); durable
        on return. Returns how many rows were removed (0 if none)."""
        s = shard_of_key(value, self._n)
        with self._write_lock:
            return int(self._scatter("remove_document", (self._shard_key, value), [s])[s])

    def build_graph(self, max_rows: int | None = None, *, threads: int = 0) -> int:
        """Links rows added with ``defer_graph=True`` on every shard; returns rows still waiting."""
        got = self._scatter("build_graph", (max_rows, check_threads(threads)))
        return int(sum(got.values()))

    @property
    def pending(self) -> int:
        """Rows stored but not yet linked into a shard's graph."""
        return int(sum(self._scatter("pending", ()).values()))

    @property
    def reorder_due(self) -> bool:
        """Whether some shard's index is due for a slot reorder (``Index.reorder_due``)."""
        return any(self._scatter("reorder_due", ()).values())

    def reorder(self) -> int:
        """Reorders the slots of every shard whose index is due (``Index.reorder_due``);
        returns how many did. Each shard's searches run on while its order is computed."""
        return sum(bool(v) for v in self._scatter("reorder_if_due", ()).values())

    def save(self) -> None:
        """Checkpoints every shard (index file written, write-ahead log restarted). Writes are
        durable without it; a checkpoint shortens recovery."""
        with self._write_lock:
            self._scatter("checkpoint", ())

    # -- queries --------------------------------------------------------------------------
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        *,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        threads: int = 0,
        allow_partial: bool = False,
    ) -> Any:
        """The k nearest neighbours over every shard, as :meth:`kbcore.Index.search` returns
        them (``(ids, distances)``, [k] or [q, k], padded with -1 / +inf).

        With ``allow_partial=True`` returns a :class:`PartialResult` whose ``value`` is that
        pair over the shards that answered. Raises :class:`ShardUnavailableError` otherwise
        when a shard does not answer within the timeout.
        """
        arr, one = as_vectors(queries, self._dim, "queries")
        k = positive("k", k)
        ef_value = None if ef is None else positive("ef", ef)
        got = self._scatter("search", (arr, k, where, ef_value, check_threads(threads)), allow_partial=allow_partial)
        ids, dist = merge_top_k([got[s] for s in sorted(got)], k, arr.shape[0])
        value = (ids[0], dist[0]) if one else (ids, dist)
        return self._finish(value, sorted(set(range(self._n)) - got.keys()), allow_partial)

    def search_groups(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        *,
        group_by: str | None = None,
        group_size: int = 1,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        threads: int = 0,
        allow_partial: bool = False,
    ) -> Any:
        """The k best distinct sources per query, as :meth:`kbcore.Index.search_groups`.

        ``group_by`` defaults to the shard key; then every group lives on one shard and the
        merge is exact. Grouping by another field merges same-key groups across shards
        (ranking exact; a group's parts are those its shards met).
        """
        arr, one = as_vectors(queries, self._dim, "queries")
        k = positive("k", k)
        group_size = positive("group_size", group_size)
        group_by = self._shard_key if group_by is None else group_by
        if not isinstance(group_by, str) or not group_by:
            raise InvalidTypeError(f"group_by must be a non-empty field name, got {group_by!r}")
        ef_value = None if ef is None else positive("ef", ef)
        got = self._scatter(
            "search_groups",
            (arr, k, group_by, group_size, where, ef_value, check_threads(threads)),
            allow_partial=allow_partial,
        )
        pages = merge_groups([got[s] for s in sorted(got)], k, group_size, arr.shape[0], group_by != self._shard_key)
        value = pages[0] if one else pages
        return self._finish(value, sorted(set(range(self._n)) - got.keys()), allow_partial)

    def text_stats(self, query: str, *, allow_partial: bool = False) -> Any:
        """Corpus-wide BM25 statistics of ``query``: ``(rows with text, total tokens,
        {term: df})`` summed over every shard (see :meth:`kbcore.Index.text_stats`)."""
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a str, got {type(query).__name__}")
        got = self._scatter("text_stats", (query,), allow_partial=allow_partial)
        docs = sum(g[0] for g in got.values())
        total = sum(g[1] for g in got.values())
        df: dict[str, int] = {}
        for g in got.values():
            for t, c in g[2].items():
                df[t] = df.get(t, 0) + c
        return self._finish((docs, total, df), sorted(set(range(self._n)) - got.keys()), allow_partial)

    def search_text(
        self,
        query: str,
        k: int = 10,
        *,
        where: Mapping[str, Any] | None = None,
        allow_partial: bool = False,
    ) -> Any:
        """BM25 over every shard with corpus-wide statistics: the scores (and so the order)
        of :meth:`kbcore.Index.search_text` on one index of all rows. Two round trips:
        statistics, then the scored search."""
        k = positive("k", k)
        if allow_partial:
            stats, missing = self.text_stats(query, allow_partial=True)
        else:
            stats, missing = self.text_stats(query), ()
        got = self._scatter("search_text", (query, k, where, stats), allow_partial=allow_partial)
        value = merge_text([got[s] for s in sorted(got)], k)
        missing = sorted(set(missing) | (set(range(self._n)) - got.keys()))
        return self._finish(value, missing, allow_partial)

    def search_hybrid(
        self,
        query_vector: npt.ArrayLike,
        query_text: str,
        k: int = 10,
        *,
        window: int | None = None,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        fusion: str = "rrf",
        rrf_k: float = 60,
        vector_weight: float = 0.5,
    ) -> list[tuple[int, float]]:
        """Vector and BM25 legs over every shard (each merged exactly), then fused with
        :mod:`kbcore.fusion` (``"rrf"`` or ``"linear"``): fusion happens after the merge, so
        the result equals fusing one index's legs. ``window`` (default ``2 k``) is each leg's
        depth. Returns ``[(id, fused score)]``, best first, at most k."""
        k = positive("k", k)
        window = 2 * k if window is None else positive("window", window)
        q, _ = as_vectors(query_vector, self._dim, "the query vector")
        ids, dist = self.search(q[0], window, where=where, ef=ef)
        keep = ids >= 0
        sims = (-dist[keep]).tolist() if self._metric == "l2" else (1.0 - dist[keep]).tolist()
        vec_leg = list(zip(ids[keep].tolist(), sims))
        tids, tscores = self.search_text(query_text, window, where=where)
        text_leg = list(zip(tids.tolist(), tscores.tolist()))
        if fusion == "rrf":
            fused = _fusion.rrf([vec_leg, text_leg], k=rrf_k)
        elif fusion == "linear":
            fused = _fusion.linear(vec_leg, text_leg, vector_weight=vector_weight)
        else:
            raise InvalidArgumentError(f"fusion must be 'rrf' or 'linear', got {fusion!r}")
        return fused[:k]

    def get_metadata(self, ids: npt.ArrayLike) -> list[dict[str, Any]]:
        """Stored metadata of each id (from whichever shard holds it). Raises
        :class:`~kbcore.errors.NotFoundError` if an id is on no shard."""
        id_arr = as_ids(ids)
        got = self._scatter("get_metadata", (id_arr,))
        found: dict[int, dict[str, Any]] = {}
        for part in got.values():
            found.update(part)
        missing = [int(i) for i in id_arr if int(i) not in found]
        if missing:
            raise NotFoundError(f"ids not in the index: {missing[:10]}")
        return [found[int(i)] for i in id_arr]

    def get_vectors(self, ids: npt.ArrayLike) -> np.ndarray:
        """Stored vectors of ids as float32 [n, dim]; NotFoundError for an unknown id."""
        id_arr = as_ids(ids)
        got = self._scatter("get_vectors", (id_arr,))
        found: dict[int, np.ndarray] = {}
        for part in got.values():
            found.update(part)
        missing = [int(i) for i in id_arr if int(i) not in found]
        if missing:
            raise NotFoundError(f"ids not in the index: {missing[:10]}")
        out = np.empty((len(id_arr), self._dim), np.float32)
        for j, i in enumerate(id_arr.tolist()):
            out[j] = found[i]
        return out

    def count(self, where: Mapping[str, Any] | None = None) -> int:
        """Rows over every shard whose metadata passes ``where`` (all if None)."""
        if where is None:
            return len(self)
        return int(sum(self._scatter("count", (where,)).values()))

    def ids(self) -> np.ndarray:
        """Every live id (shard by shard)."""
        got = self._scatter("ids", ())
        return np.concatenate([got[s] for s in range(self._n)])

    def memory_usage(self) -> int:
        """Bytes held natively by every shard's index."""
        return int(sum(i["memory_bytes"] for i in self.shard_info()))

    def text_documents(self) -> int:
        """Rows with text in the BM25 indexes of every shard."""
        return int(sum(self._scatter("text_documents", ()).values()))

    def __len__(self) -> int:
        return int(sum(self._scatter("size", ()).values()))

    def __contains__(self, id: object) -> bool:
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)) or not -(2**63) <= id < 2**63:
            return False  # ids are int64: nothing else can be held
        return bool(any(m[0] for m in self._scatter("holds", (np.array([id], np.int64),)).values()))

    def __repr__(self) -> str:
        return (
            f"kbcore.distributed.ShardedIndex(dim={self._dim}, metric={self._metric!r}, "
            f"kind={self._kind!r}, shards={self._n}, shard_key={self._shard_key!r}, "
            f"path={self._path!r})"
        )

    def close(self) -> None:
        """Stops the shard actors (their data stays in ``path``; :meth:`load` reopens it)."""
        calls = getattr(self, "_calls", None)
        if calls is not None:
            calls.close()

    def __enter__(self) -> ShardedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
