"""The index's input conversions: vectors to C-contiguous float32 rows, ids to int64 (the
hot path, kept cheap). Package-internal: :mod:`kbcore.index` and :mod:`kbcore.distributed`
use them so a sharded index checks its input exactly as an :class:`~kbcore.index.Index` does."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["as_vectors", "as_ids"]


def as_vectors(x: npt.ArrayLike, dim: int, what: str) -> tuple[np.ndarray, bool]:
    """Converts to C-contiguous float32 [n, dim]; returns (array, was_1d). Hot path: keep cheap."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":  # float, signed and unsigned int; not bool/str/object
        raise InvalidTypeError(f"{what} must be a numeric (float) array, got dtype {arr.dtype}")
    one = arr.ndim == 1
    if one:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise InvalidArgumentError(f"{what} must be a 1-D vector or a 2-D array [n, dim], got {arr.ndim} dimensions")
    if arr.shape[1] != dim:
        raise InvalidArgumentError(f"{what} have dimension {arr.shape[1]}, the index has dimension {dim}")
    if arr.dtype == np.float32 and arr.flags.c_contiguous:
        return arr, one
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is reported natively
        return np.ascontiguousarray(arr, dtype=np.float32), one


def as_ids(x: npt.ArrayLike, what: str = "ids") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.int64 and arr.ndim == 1 and arr.flags.c_contiguous:
        return arr  # hot path: what the engine passes (ids of a result list)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":  # signed or unsigned int (not bool)
        raise InvalidTypeError(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what} must be a 1-D sequence, got {arr.ndim} dimensions")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidArgumentError(f"{what} must fit in int64")
    return np.ascontiguousarray(arr, dtype=np.int64)
