"""Which shard a row lives on: a stable hash of its shard-key value (or of its id).

The hash is BLAKE2b of a typed byte string, so it is the same in every process, on every
machine and in every Python version (unlike the salted built-in ``hash``). Integer and string
key values hash differently (``5`` and ``"5"`` are different documents, as in filters).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["shard_of_key", "shard_of_id", "route", "MAX_SHARDS"]

#: The most shards one index may have: each is a Ray actor (a process); far more than a
#: cluster runs, and a bound so that a mistyped count is refused instead of starting them.
MAX_SHARDS = 1024


def _bucket(data: bytes, shards: int) -> int:
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "little") % shards


def shard_of_key(value: int | str, shards: int) -> int:
    """The shard of a row whose shard-key metadata value is ``value`` (int or str)."""
    if isinstance(value, str):
        return _bucket(b"s:" + value.encode("utf-8", "surrogatepass"), shards)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return _bucket(b"i:%d" % int(value), shards)
    raise InvalidTypeError(f"shard key values must be int or str, got {type(value).__name__} ({value!r})")


def shard_of_id(row_id: int, shards: int) -> int:
    """The shard of a row without a shard-key value: by its id."""
    return _bucket(b"id:%d" % int(row_id), shards)


def _key_values(metadata: Any, key: str, n: int) -> list[Any]:
    if metadata is None:
        return [None] * n
    if type(metadata).__module__.split(".")[0] == "pyarrow":
        if key not in metadata.column_names:
            return [None] * n
        return metadata.column(key).to_pylist()
    out: list[Any] = []
    for row in metadata:
        if row is None:
            out.append(None)
        elif isinstance(row, Mapping):
            out.append(row.get(key))
        else:
            raise InvalidTypeError(f"metadata rows must be dicts or None, got {type(row).__name__}")
    return out


def route(ids: np.ndarray, metadata: Any, key: str, shards: int) -> np.ndarray:
    """The shard of each row (int64 [n]): by ``metadata[key]`` when the row has it, else by id.

    Raises :class:`~kbcore.errors.InvalidTypeError` if a key value is neither int nor str.
    Key values repeat (many chunks per document), so each distinct value is hashed once.
    """
    n = len(ids)
    if shards == 1:
        return np.zeros(n, dtype=np.int64)
    if (
        metadata is not None
        and not isinstance(metadata, Sequence)
        and type(metadata).__module__.split(".")[0] != "pyarrow"
    ):
        raise InvalidTypeError(
            "metadata must be a list of dicts (one per row) or a pyarrow Table / RecordBatch, "
            f"got {type(metadata).__name__}"
        )
    values = _key_values(metadata, key, n)
    if len(values) != n:
        raise InvalidArgumentError(f"got {n} ids but {len(values)} metadata rows")
    out = np.empty(n, dtype=np.int64)
    memo: dict[tuple[type, Any], int] = {}
    for i, v in enumerate(values):
        if v is None:
            out[i] = shard_of_id(int(ids[i]), shards)
            continue
        tag = (type(v), v)
        s = memo.get(tag)
        if s is None:
            s = memo[tag] = shard_of_key(v, shards)
        out[i] = s
    return out
