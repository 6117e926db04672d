"""Sharded knowledge bases: the index of a knowledge base created with ``shards=N`` is a
:class:`kbcore.distributed.ShardedIndex` (N Ray actors) stored in ``<kb>/shards/``.

The rule that keeps a sharded knowledge base crash-safe
--------------------------------------------------------

**The manifest is the truth; the shards are re-synced from it.** A knowledge base's chunks
and documents are its segment files plus ``manifest.json`` (committed atomically, last). The
shards keep their own durable state (a write-ahead log and checkpoints per shard, written
before each of their calls returns), which can therefore be *ahead* of the manifest after a
crash, never trusted over it:

1. Every open (:meth:`KbState.load <kbcore.engine.state.KbState.load>`, with the knowledge
   base's writer lock held) reconciles the shards with the manifest: rows in the shards that
   the manifest does not list as live are removed; live rows the shards lack are re-added
   from the segments' vector files (a :class:`~kbcore.errors.FormatError` if a segment no
   longer has one). Both steps are durable on the shards before the open returns.
2. So that step 1 never needs a vector that is gone, a commit never removes a row the
   manifest still lists as live from the shards before that manifest is replaced: ingest
   adds the new rows (durable on the shards), then commits the manifest, then removes the
   replaced rows; delete commits the manifest first, then removes. A crash at any point
   leaves the shards holding a superset of the manifest's live rows, which step 1 trims.
3. A checkpoint of a sharded knowledge base is ``ShardedIndex.save()`` (every shard saves
   its index) followed by the manifest's ``shard_checkpoint`` entry (rows covered); it drops
   the segments' vector files as an index checkpoint does, the shards then being the durable
   copy of those vectors. There is no ``index-<gen>.kbi`` file.
4. A knowledge base without a dimension yet (vectors-only, before its first ingest) has no
   committed row: a ``shards/`` directory found then is left over from an ingest that did
   not commit, and is removed before the index is created again.

Ray: if Ray is already initialised in this process it is used as is; otherwise
``ray.init(address="auto")`` joins the cluster named by ``RAY_ADDRESS`` or started on this
machine with ``ray start``; if none is reachable, ``ray.init()`` starts a local instance
(whose shard actors stop with the process; the data stays in ``shards/``). Without Ray
installed, opening or creating a sharded knowledge base raises ``ImportError`` naming
``pip install "kbcore[ray]"``.

One owner at a time: the open knowledge base owns its shard actors and holds an exclusive
lock on ``shards/.owner.lock`` while they run, so a second open (another process, or another
:class:`Engine` in this one) raises :class:`~kbcore.errors.InvalidArgumentError` instead of
starting a second set of actors on the same directories. Close the knowledge base (or stop
``kbcore serve``) first; the operating system releases the lock of a process that dies.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ..errors import FormatError, InvalidArgumentError, InvalidTypeError, StorageError

#: the sub-directory of a knowledge base that holds its shards
SHARDS_DIR = "shards"
OWNER_LOCK = ".owner.lock"

_INSTALL = 'pip install "kbcore[ray]"'


def check_shards(value: Any) -> int | None:
    """``shards=`` of :meth:`Engine.create_knowledge_base`: None or an integer in [1,
    :data:`kbcore.distributed.MAX_SHARDS`]."""
    from ..distributed.routing import MAX_SHARDS

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"shards must be None or an integer, got {type(value).__name__}")
    if value < 1:
        raise InvalidArgumentError(f"shards must be at least 1, got {value}")
    if value > MAX_SHARDS:
        raise InvalidArgumentError(f"shards must be at most {MAX_SHARDS} (one Ray actor each), got {value}")
    return value


def require_ray(name: str, shards: int) -> Any:
    """The ``ray`` module; ImportError naming the extra to install when it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"knowledge base {name!r} is sharded (shards={shards}) and needs Ray: {_INSTALL}") from exc
    return ray


def connect(name: str, shards: int) -> None:
    """Makes sure this process is connected to Ray (the rule in the module docstring)."""
    ray = require_ray(name, shards)
    if ray.is_initialized():
        return
    try:
        ray.init(address="auto", log_to_driver=False)
    except ConnectionError:
        ray.init(include_dashboard=False, log_to_driver=False)


def is_sharded(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("shards"))


def open_index(kb_path: str, cfg: dict[str, Any], dim: int, *, fresh: bool = False, mmap: bool = True) -> Any:
    """The ShardedIndex of a knowledge base of configuration ``cfg``: loaded from
    ``<kb>/shards`` when it holds one, else created there. ``fresh``: the knowledge base has
    no committed row, so a leftover directory is removed first (rule 4). FormatError if the
    stored shards do not match the configuration."""
    from ..distributed import MANIFEST, ShardedIndex
    from ..index import IndexSpec

    try:
        n = check_shards(cfg["shards"])
    except (InvalidArgumentError, InvalidTypeError) as exc:
        raise FormatError(5, f"the manifest of {kb_path!r} is unusable: {exc}") from exc
    assert n is not None
    connect(os.path.basename(kb_path), n)
    root = os.path.join(kb_path, SHARDS_DIR)
    fd = _own(kb_path)
    try:
        if fresh or not os.path.exists(os.path.join(root, MANIFEST)):
            for name in os.listdir(root):  # nothing committed lives there (rule 4)
                entry = os.path.join(root, name)
                if name == OWNER_LOCK:
                    continue
                if os.path.isdir(entry) and not os.path.islink(entry):
                    shutil.rmtree(entry)
                else:
                    os.unlink(entry)
            index = ShardedIndex(
                dim,
                shards=n,
                path=root,
                spec=IndexSpec.from_config(cfg),
                mmap=mmap,
            )
        else:
            index = ShardedIndex.load(root, mmap=mmap)
            got = (index.dim, index.metric, index.kind, index.shards)
            want = (dim, cfg["metric"], cfg["index"], n)
            if got != want:
                index.close()
                raise FormatError(
                    5,
                    f"the shards in {root!r} hold (dim, metric, kind, shards) = {got}, "
                    f"the knowledge base's manifest says {want}",
                )
    except BaseException:
        os.close(fd)
        raise
    index._kb_owner_fd = fd  # released by close_index
    return index


def close_index(index: Any) -> None:
    """Stops a knowledge base's shard actors (their files stay) and releases its ownership."""
    try:
        index.close()
    finally:
        fd = getattr(index, "_kb_owner_fd", None)
        if fd is not None:
            index._kb_owner_fd = None
            os.close(fd)


def _own(kb_path: str) -> int:
    """Takes ``shards/.owner.lock`` without waiting; InvalidArgumentError if it is held."""
    import fcntl

    root = os.path.join(kb_path, SHARDS_DIR)
    path = os.path.join(root, OWNER_LOCK)
    try:
        os.makedirs(root, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageError(exc.errno, f"cannot open {path!r}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise InvalidArgumentError(
            f"knowledge base {os.path.basename(kb_path)!r} is sharded and already open (its shard "
            "actors run for another process or Engine); close it there first"
        ) from None
    return fd


def discard(index: Any, ids: Any) -> None:
    """Removes those of ``ids`` the index holds (a rollback after a partial sharded add)."""
    import numpy as np

    ids = np.asarray(ids, np.int64)
    present = ids[np.isin(ids, index.ids())]
    if len(present):
        index.remove(present)
