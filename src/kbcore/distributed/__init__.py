"""Scale-out: a kbcore index sharded over Ray actors (``pip install 'kbcore[ray]'``).

:class:`ShardedIndex` has the :class:`kbcore.Index` API; rows are routed by a stable hash of
a metadata key (``document_id`` by default), searches scatter to every shard and merge
exactly, and every acknowledged write survives a shard's crash. See ``docs/scale-out.md``.

Importing this package does not import Ray; creating a :class:`ShardedIndex` does.
"""

from .routing import MAX_SHARDS, shard_of_id, shard_of_key
from .sharded_index import MANIFEST, PartialResult, ShardedIndex, ShardUnavailableError

__all__ = [
    "ShardedIndex",
    "ShardUnavailableError",
    "PartialResult",
    "MANIFEST",
    "shard_of_key",
    "shard_of_id",
    "MAX_SHARDS",
]
